"""The network between a node and KAPI, and what a test breaks on it: network namespaces
(netns), a DNS server (dns), the names nodes reach KAPI by (names), TCP proxies standing in for
load balancers (tcpproxy), a seed that fails chosen requests (faultproxy), a broken admission
webhook (webhook), servers that mean harm (hostile_server).

May import: core, image, base, kube.
"""
