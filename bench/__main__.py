"""``make bench``: every benchmark, each printing its table."""

from __future__ import annotations

from bench import (
    agent_footprint,
    aggregator_scale,
    detection,
    faults,
    node_objects,
    path,
    race,
    scale,
    seed,
    witness_cost,
    witness_cut,
)

if __name__ == "__main__":
    agent_footprint.run()
    aggregator_scale.run()
    node_objects.run()  # 5000 nodes on a real kube-apiserver: about a minute
    detection.run()
    # make demo's two acts five times, a model of dependency-watchdog's rule beside them: about
    # 25 minutes.
    race.main([])
    # Five real cuts with each aggregator, today's and the one before the witness: about 12 minutes.
    witness_cut.run()
    path.run()
    faults.run()
    # One aggregator, 1, 50, 100 and 250 targets: 10 minutes healthy, then every shoot cut at
    # once and healed, three times (about 65 minutes).
    seed.main([])
    # 5000 kubelet leases at kubelet's 500 writes/s: a LIST, a watch, the sample's GETs (about
    # 4 minutes; node_objects above has the Nodes).
    witness_cost.main(["--no-node-objects"])
    # 100, 1000 and 5000 simulated nodes against real API servers: about 15 minutes.
    scale.main([])
