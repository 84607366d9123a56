//go:build tools

// Package tools pins the kube-apiserver and kube-controller-manager main
// packages so `go mod tidy` keeps every module they need.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
