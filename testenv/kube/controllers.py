"""The three controllers a shoot's control plane runs and the aggregator scales, with the
replicas every test and bench starts them at."""

from __future__ import annotations

KCM, MCM, CA = "kube-controller-manager", "machine-controller-manager", "cluster-autoscaler"

# Different counts, so a controller restored to another's replicas is told apart.
CONTROLLERS = {KCM: 3, MCM: 2, CA: 1}
DOWN = dict.fromkeys(CONTROLLERS, 0)
