//go:build tools

// Package tools pins the binaries built by tests/e2e/build-tools.sh.
package tools

import (
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller"
)
