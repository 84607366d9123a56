"""``make bench``: every benchmark, each printing its table."""

from __future__ import annotations

from bench import agent_footprint, aggregator_scale, detection, faults, path, scale, witness_cost

if __name__ == "__main__":
    agent_footprint.run()
    aggregator_scale.run()
    detection.run()
    path.run()
    faults.run()
    # 5000 kubelet leases at kubelet's 500 writes/s: a LIST, a watch, the sample's GETs, and
    # 5000 Nodes full and metadata-only (about 7 minutes).
    witness_cost.main([])
    # 100, 1000 and 5000 simulated nodes against real API servers: about 15 minutes.
    scale.main([])
