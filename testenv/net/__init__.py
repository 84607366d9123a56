"""The network between a node and KAPI: namespaces, DNS, proxies, faults, a webhook."""
