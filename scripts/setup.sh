#!/usr/bin/env bash
# Install everything kgroup needs from the project's own files:
#   - Debian packages when missing (redis-server; containerd, runc and friends for the
#     real node; buildah and debootstrap for `make images`),
#   - the virtualenv at .venv/ with the package and all its extras (dev, operator, sidecar,
#     pipeline), pinned by constraints.txt (pip's cache lives outside the clone, so a second
#     run is quick).
# The Kubernetes binaries are built by scripts/build-tools.sh (make tools).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }

# Debian packages, each installed only when missing (dpkg's own record, so a second run
# costs nothing): redis-server for the pipeline; the real node's runtime (containerd,
# runc, CNI plugins, static busybox for its test image, gcc + libc6-dev for the static
# pause binary); buildah and debootstrap build the images from docker/; prometheus (its
# server and promtool) checks the operator's and sidecars' /metrics in the e2e tests.
packages=(redis-server containerd runc containernetworking-plugins busybox-static gcc
          libc6-dev buildah debootstrap prometheus)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # policy-rc.d 101: no package starts its service (a system redis on 6379, a system
  # containerd on /run/containerd): kgroup runs its own, on its own ports and sockets.
  # An existing policy-rc.d (container images ship one) is left as it is.
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    own_policy=1
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [ "$own_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
  (service redis-server stop || true) >/dev/null 2>&1
fi
# Debian's prometheus package runs a server on 0.0.0.0:9090 as a service: never here (the
# tests start their own on 127.0.0.1 with their own config). policy-rc.d kept it from
# starting at install; stop one that runs anyway and keep it from starting at boot, under
# systemd (systemctl) or SysV init (update-rc.d), whichever this machine has.
if dpkg-query -W -f='${Status}' prometheus 2>/dev/null | grep -q 'install ok installed'; then
  if [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  else
    (service prometheus stop || true) >/dev/null 2>&1
    update-rc.d prometheus disable >/dev/null 2>&1 || true
  fi
fi

if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
log "pip install -e .[dev,operator,sidecar,pipeline] (constraints.txt)"
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c constraints.txt -e '.[dev,operator,sidecar,pipeline]'
touch .venv/.kgroup-installed
log "ready: .venv"
