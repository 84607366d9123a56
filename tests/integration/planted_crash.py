"""The aggregator with a bug planted in every target: its ``run`` raises at once. Nothing a shoot
or a seed answers makes a target crash (a target that cannot reach its shoot is built blind and
says why); a bug would, and DwdLeaseTargetFailing is how it is seen
(tests/integration/test_service.py runs this as ``python -m tests.integration.planted_crash``)."""

from __future__ import annotations

from aggregator import __main__ as aggregator
from aggregator.target import Target


async def _crash(self: Target) -> None:
    raise RuntimeError("a bug planted by the test")


Target.run = _crash  # type: ignore[method-assign]  # the planted bug, in this process only

if __name__ == "__main__":
    aggregator.main()
