#!/usr/bin/env bash
# Build the local control plane's binaries from their Go modules (pinned in
# e2e/toolchain/*/go.mod) into a cache outside the clone. A tool already in the cache
# is not rebuilt, so a warm run takes well under a second.
#
#   scripts/build-tools.sh   # builds what is missing, prints the bin dir
#
# Versions are pinned here and in the go.mod files; the cache directory is keyed by them.
set -euo pipefail

K8S_VERSION=v1.35.4
ETCD_VERSION=v3.6.5
KWOK_VERSION=v0.7.0
HELM_VERSION=v3.19.0

here=$(cd "$(dirname "$0")" && pwd)
toolchain=$(cd "$here/../e2e/toolchain" && pwd)
cache=${KGROUP_CACHE:-$HOME/.cache/kgroup}
bin="$cache/bin/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION"
mkdir -p "$bin"
# One build at a time: a second caller waits here, then finds the binaries cached.
exec 9>"$cache/bin/.build.lock"
flock 9
export GOFLAGS=-buildvcs=false
export CGO_ENABLED=0

log() { printf '[build-tools] %s\n' "$*" >&2; }

need() {  # need NAME...: true when any of the named binaries is missing
  local n
  for n in "$@"; do [ -x "$bin/$n" ] || return 0; done
  return 1
}

build() {  # build MODULE_DIR LDFLAGS PACKAGE...
  local dir=$1 ldflags=$2; shift 2
  local start=$SECONDS
  log "go build $* (in e2e/toolchain/$(basename "$dir"))"
  (cd "$dir" && go build -trimpath -ldflags "-s -w $ldflags" -o "$bin/" "$@")
  log "built $(printf '%s ' "$@" | sed 's#[^ ]*/##g')in $((SECONDS - start)) s"
}

minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
vflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  vflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  vflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
if need kube-apiserver kube-controller-manager kube-scheduler kubectl; then
  build "$toolchain/kubernetes" "$vflags" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
fi
if need kubelet; then
  # The real node's kubelet (make cluster-up starts it beside the kwok nodes); built
  # apart from the control plane so a cache from before it keeps its other binaries.
  build "$toolchain/kubernetes" "$vflags" k8s.io/kubernetes/cmd/kubelet
fi
if need etcd; then
  build "$toolchain/etcd" "" go.etcd.io/etcd/server/v3
  # go names the binary after the package path minus its major-version suffix: "server".
  mv "$bin/server" "$bin/etcd"
fi
if need kwok; then
  build "$toolchain/kwok" "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
fi
if need helm; then
  build "$toolchain/helm" "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" helm.sh/helm/v3/cmd/helm
fi
echo "$bin"
