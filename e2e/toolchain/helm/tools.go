//go:build tools

// Package toolchain pins the helm CLI that e2e/cluster builds.
package toolchain

import _ "helm.sh/helm/v3/cmd/helm"
