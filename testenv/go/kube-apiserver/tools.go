//go:build tools

// Package tools pins the kube-apiserver main package so `go mod tidy` keeps
// every module it needs.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
