"""The names a shoot's nodes reach KAPI by, in the tests as in Gardener: the external name and
the kubelet's (Gardener's internal domain), each forwarded to KAPI by a load balancer of its own.
The control plane's serving certificate carries both."""

EXTERNAL_NAMES = ("api.shoot.dwd.test", "api.internal.shoot.dwd.test")
