"""Detection and recovery times with the aggregator's defaults, on the demo's scenario."""

from __future__ import annotations

from bench.table import print_table
from demo import scenario


def run() -> None:
    times = scenario.run(out=None, unprotected=False)  # the protected act alone
    print_table(
        "Outage to protection, aggregator defaults (lease 8s, confirm 4s, recovery 10s; node grace 0s)",
        ["interval", "seconds"],
        [
            ["last renewal -> MCM and CA at 0 (level 0)", f"{times['last_renewal_to_mcm_down_s']:.1f}"],
            ["last renewal -> KCM at 0 (level 1)", f"{times['last_renewal_to_kcm_down_s']:.1f}"],
            ["load balancer cut -> KCM at 0", f"{times['cut_to_all_down_s']:.1f}"],
            ["path healed -> all restored (KCM, MCM +30s, CA)", f"{times['heal_to_all_up_s']:.1f}"],
        ],
    )


if __name__ == "__main__":
    run()
