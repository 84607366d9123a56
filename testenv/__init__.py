"""The one harness of the tests, the benchmarks and the demo (docs/harness.md): a real
kube-apiserver and etcd, built from the Go module proxy and started like envtest, the programs
as processes, and stand-ins for what a test control plane lacks."""
