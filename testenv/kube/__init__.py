"""Kubernetes for real, and stand-ins only where a test control plane lacks a controller: etcd
and kube-apiserver (controlplane), kube-controller-manager behind the seed's Deployment (kcm),
the real kubelet as a hollow node (hollow) and a node's kubelet identity (kubelet_identity),
lease drivers and a deployment controller (standins), a workload for KCM to act on (workload),
the three controllers the aggregator scales (controllers); for the benchmarks, kube-apiserver's
audit log of one user (audit), its request counts and latencies from /metrics (kapi_metrics) and
a seed's Deployments watched (deployment_watch).

May import: core, image, base.
"""
