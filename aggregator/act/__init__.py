"""What is written: the dependents' replicas, level by level (scaler), the leases of the
nodes (provisioner) paced within the write budget (budget, pacer), the checks a scale-down
passes right before it (interlocks), and the records of gone targets restored (orphans).

Every write here is made under a leadership scope (lead) and every scale-down after the
interlocks.

May import: core, model, kube, decide, observe, lead, ops.
"""
