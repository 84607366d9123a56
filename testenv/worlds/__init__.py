"""What a test, the demo or a benchmark starts: a shoot, agents, nodes, the chain."""
