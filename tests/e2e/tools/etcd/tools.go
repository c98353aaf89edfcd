//go:build tools

// Package tools pins the binaries built by tests/e2e/build-tools.sh.
package tools

import _ "go.etcd.io/etcd/server/v3"
