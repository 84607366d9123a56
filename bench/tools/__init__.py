"""What the benchmarks share: the simulated agents (fleet), kube-apiserver's request counts
(kapi_metrics), processes' CPU and RSS (sampling), statistics (stats) and the tables (table)."""
