//go:build tools

// Package toolchain pins the etcd server that e2e/cluster builds.
package toolchain

import _ "go.etcd.io/etcd/server/v3"
