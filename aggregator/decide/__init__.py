"""The decision, pure: the verdict (decider), where the phase goes on it (phases), the stale
fraction a sample stands for (estimate), the second witness's rule on the kubelets' leases
(witness), since when the view is trusted (trust).

No I/O and no clock reads, so every rule is testable to the millisecond
(tests/unit/test_layers.py checks that nothing here reaches I/O).

May import: core, model.
"""
