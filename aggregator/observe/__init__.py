"""What is read: list+watch and the observed state (watcher), the kubelets' leases (kubelets),
the seed's Machines (machines), both read right before a write (evidence), the dependents'
replicas and our marks on them (replicas, seeddependents), and the sources of shoots (sources).

Reads only: nothing here writes to a cluster.

May import: core, model, kube, ops.
"""
