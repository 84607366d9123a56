"""What things are: the API objects the aggregator reads, parsed once into typed views
(objects), what was observed of a shoot on our clock (observed), what a verdict says (verdict),
its settings (settings) and their retry delays (backoff), its record on a dependent (records),
dependency-watchdog's dependents and its node rules (dependents, candidates), which nodes a
verdict stands for and which leases it counts (eligibility), which shoots get a target
(lifecycle), a shoot's own settings from its Extension's providerConfig (protection).

Data and pure functions of it: no I/O, no clock.

May import: core.
"""
