//go:build tools

// Package toolchain pins kwok, the fake kubelet that e2e/cluster builds.
package toolchain

import _ "sigs.k8s.io/kwok/cmd/kwok"
