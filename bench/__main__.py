"""``make bench``: every benchmark, each printing its table."""

from __future__ import annotations

from bench import agent_footprint, aggregator_scale, detection, faults, path, scale, witness_cut

if __name__ == "__main__":
    agent_footprint.run()
    aggregator_scale.run()
    detection.run()
    # Five real cuts with each aggregator, today's and the one before the witness: about 12 minutes.
    witness_cut.run()
    path.run()
    faults.run()
    # 100, 1000 and 5000 simulated nodes against real API servers: about 15 minutes.
    scale.main([])
