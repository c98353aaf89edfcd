//go:build tools

// Package tools pins the binaries built by tests/e2e/build-tools.sh.
package tools

import _ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
