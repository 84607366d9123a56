"""The write budget, detection and start-up cost at 100, 1000 and 5000 nodes, measured.

``python -m bench.scale [--nodes 100,1000,5000] [--no-budget-at 5000] [--out FILE]``

Per size: a fresh shoot control plane (a real kube-apiserver + etcd) beside one seed
control plane, the REAL aggregator as its own process at its defaults (``DEFAULTS`` in
bench/scale/scenarios.py, read from its settings' fields) except DWD_NODE_GRACE=0s: a node
younger than the default grace is no candidate, and every run here creates its nodes minutes
before. The dependents are testenv/worlds/shoot_world.py's (no initial delays, MCM 500 ms after KCM on the
way up). The agents are testenv/worlds/agent_fleet.py's simulated ones (its docstring says how they
differ from real ones).

Every write and request rate is read from kube-apiserver's own /metrics
(apiserver_request_total, apiserver_request_duration_seconds); the aggregator's share is
the API server's count minus the simulator's own (and the benchmark's, which reads
nothing from the shoot API server during a window), so it may be off by the few requests
in flight at either end. CPU is from /proc/<pid>/stat over the window, in % of one core,
on this 2-core machine where the simulator, the aggregator, kube-apiserver and etcd all
run. Tables are printed; the raw numbers go to --out (JSON). The runner is runner.py, the
world and its phases scenarios.py, the sampling error on paper model.py, the tables
tables.py.
"""

from bench.scale.runner import main

__all__ = ["main"]
