"""The aggregator's one HTTP boundary: the asyncio Kubernetes API client (client), where a KAPI
is and the credentials for it, from a kubeconfig or the pod's own (endpoint), and the rate the
client is held to (ratelimit). Everything that reaches a KAPI, the seed's or a shoot's, goes
through here.

May import: core.
"""
