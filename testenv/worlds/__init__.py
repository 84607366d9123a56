"""What a test, the demo or a benchmark starts, put together from the other rooms: a shoot and
its seed with the aggregator (shoot_world), real agents (agents), nodes in network namespaces
(networld), the whole chain at default timings (chain); for the benchmarks, a seed of Gardener
targets (targets) and hollow kubelets each behind its own load balancer (hollow_world).

May import: core, image, base, kube, net, gardener.
"""
