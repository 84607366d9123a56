"""What the benchmarks share and the harness has no use for: processes' CPU and RSS (sampling),
statistics (stats) and the tables (table). The simulated agents and kube-apiserver's request
counts are the harness's (testenv/worlds/agent_fleet.py, testenv/kube/kapi_metrics.py)."""
