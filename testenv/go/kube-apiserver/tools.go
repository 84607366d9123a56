//go:build tools

// Package tools pins the kube-apiserver, kube-controller-manager and kubemark main
// packages so `go mod tidy` keeps every module they need.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubemark"
)
