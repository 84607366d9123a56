"""What a test, the demo or a benchmark starts, put together from the other rooms: the one way
to start an aggregator (aggregators) and an agent for a node (agents, with the node-bound
tokens of the integration tests' agents), a shoot and its seed with its aggregators
(shoot_world), nodes in network namespaces
(networld), the whole chain at default timings (chain); for the benchmarks, a seed of Gardener
targets (targets), hollow kubelets each behind its own load balancer (hollow_world) and N
simulated agents in one process (agent_fleet).

May import: core, image, base, kube, net, gardener.
"""
