"""The aggregator as Gardener's extension controller for its seed (docs/design.md, "The extension
controller"): the Extension objects of our type read into views and what they ask for (contract),
the shoots they turn on, with their providerConfig over the seed's settings (source), the shoot
part delivered into each (delivery), what each Extension tells of its shoot's protection and the
heartbeat (health), when an operation is taken up again unasked (retries), and the contract's
writes: finalizer, operation annotation, status, the shoot part, and on deletion our marks handed
back (reconciler).

Writes only under the leader's scope (lead), as every write of the aggregator.

May import: core, model, kube, observe, lead, act.
"""
