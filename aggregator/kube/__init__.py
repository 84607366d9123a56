"""The aggregator's one HTTP boundary: the asyncio Kubernetes API client (client) and the rate
it is held to (ratelimit). Everything that reaches a KAPI, the seed's or a shoot's, goes
through here.

May import: core.
"""
