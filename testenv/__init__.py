"""A real kube-apiserver and etcd for tests, built from the Go module proxy and started like envtest."""
