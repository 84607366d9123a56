//go:build tools

// Package tools pins kustomize's main package so `go mod tidy` keeps every
// module it needs.
package tools

import _ "sigs.k8s.io/kustomize/kustomize/v5"
