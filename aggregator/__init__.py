"""The seed-side aggregator: watches the leases of a shoot, decides on a quorum, scales the controllers.

Its wings, each a package whose docstring says what belongs there and what it may import
(tests/unit/test_layers.py holds them to it): model, kube, decide, lead, ops, observe, act.
Here, the composition root: the program (__main__), the Fleet of targets (fleet), one
shoot's parts wired from the settings (shoot), the Target that runs them (target) and its
Reporter (report). No wing imports the root.
"""
