//go:build tools

// Package tools pins etcd's main package so `go mod tidy` keeps every module
// it needs.
package tools

import _ "go.etcd.io/etcd/server/v3"
