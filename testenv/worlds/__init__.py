"""What a test, the demo or a benchmark starts, put together from the other rooms: a shoot and
its seed with the aggregator (shoot_world), real agents (agents), nodes in network namespaces
(networld), and the whole chain at default timings (chain).

May import: core, image, base, kube, net, gardener.
"""
