#!/usr/bin/env bash
# Install everything kgroup needs from the project's own files:
#   - Debian packages (redis-server; buildah and debootstrap for `make images`) when missing,
#   - the virtualenv at .venv/ with the package and all its extras (dev, operator, sidecar,
#     pipeline), pinned by constraints.txt (pip's cache lives outside the clone, so a second
#     run is quick).
# The Kubernetes binaries are built by scripts/build-tools.sh (make tools).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }

if ! command -v redis-server >/dev/null 2>&1; then
  log "installing Debian package redis-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  # Debian starts a system redis on 6379 after install; kgroup runs its own on other ports.
  (service redis-server stop || true) >/dev/null 2>&1
fi

# `make images` (e2e/kgroup_devcluster/images.py) builds the images with buildah, makes
# their base image with debootstrap and loads them with containerd's ctr (its test runs
# them in a containerd of its own, with runc).
missing=()
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v containerd >/dev/null 2>&1 || missing+=(containerd)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
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
