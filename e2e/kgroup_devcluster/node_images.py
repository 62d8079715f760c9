"""The real node's own images (pause, busybox), written without a registry or a builder,
and `import_image` to load any image archive into the node's containerd.

Rule: an image here is one layer of files taken from this machine (a static binary and
its symlinks), written as a docker-archive tar (`manifest.json` + config + layer), the
same format `buildah push ... docker-archive:` writes. Archives are cached outside the
clone (`~/.cache/kgroup/images/node/`, `KGROUP_CACHE` moves it), named by a hash of their
inputs, so a warm `cluster-up` reuses them; the tar is deterministic (sorted entries,
mtime 0, uid 0).

Why: no registry is reachable, so the node's sandbox image (`pause`, built from
Kubernetes' own `build/pause/linux/pause.c` in the pinned module) and a small image with
a shell for tests (Debian's static busybox) must be made here. Both are a binary plus
symlinks: a Dockerfile and a builder would add minutes and nothing else.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

K8S_MODULE = "k8s.io/kubernetes@v1.35.4"
PAUSE_VERSION = "3.10.1"  # TAG in build/pause/Makefile of that module
PAUSE_IMAGE = f"localhost/kgroup/pause:{PAUSE_VERSION}"
BUSYBOX_IMAGE = "localhost/kgroup/busybox:1.35"
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static (scripts/setup.sh installs it)
CTR = "/usr/bin/ctr"
NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin (so the kubelet) uses
_FORMAT = "1"  # bump when the archive layout below changes: it is part of every key


class ImageError(RuntimeError):
    """An image could not be built or imported; the message says why."""


def cache_dir() -> Path:
    root = Path(os.environ.get("KGROUP_CACHE", Path.home() / ".cache" / "kgroup"))
    return root / "images" / "node"


@dataclass(frozen=True)
class Entry:
    """One file of a layer: a regular file copied from `source`, or a symlink."""

    path: str  # inside the image, without a leading slash
    mode: int = 0o755
    source: Path | None = None
    link: str | None = None


def _layer(entries: list[Entry]) -> bytes:
    """A deterministic uncompressed tar of `entries` (parent directories added)."""
    dirs = sorted({str(Path(e.path).parent) for e in entries} - {"."})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for e in sorted(entries, key=lambda e: e.path):
            info = tarfile.TarInfo(e.path)
            info.mode = e.mode
            if e.link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, e.link
                tar.addfile(info)
            else:
                assert e.source is not None
                data = e.source.read_bytes()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_archive(path: Path, *, name: str, entries: list[Entry],
                  entrypoint: list[str], cmd: list[str] | None = None) -> None:
    """Write a one-layer docker-archive image tagged `name` to `path` (atomically)."""
    layer = _layer(entries)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd, "Env": ["PATH=/bin"],
                   "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "kgroup_devcluster.node_images"}],
    }, sort_keys=True).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name],
                            "Layers": [layer_name]}]).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member, data in ((config_name, config), (layer_name, layer),
                             ("manifest.json", manifest)):
            info = tarfile.TarInfo(member)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(path)


def _key(*parts: bytes) -> str:
    h = hashlib.sha256(_FORMAT.encode())
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:16]


def _pause_source() -> Path:
    gomodcache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True,
                                check=True).stdout.strip()
    src = Path(gomodcache) / K8S_MODULE / "build" / "pause" / "linux" / "pause.c"
    if not src.is_file():
        raise ImageError(f"{src} is missing: run scripts/build-tools.sh (it downloads "
                         f"{K8S_MODULE} into the Go module cache)")
    return src


def pause_archive() -> Path:
    """The pause image's archive: pause.c compiled statically (as its Makefile does)."""
    src = _pause_source()
    cc = shutil.which("gcc")
    if cc is None:
        raise ImageError("gcc is missing: run scripts/setup.sh (it installs gcc, libc6-dev)")
    cc_version = subprocess.run([cc, "--version"], capture_output=True, check=True).stdout
    out = cache_dir() / f"pause-{_key(src.read_bytes(), cc_version)}.tar"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(prefix="kgroup-pause-") as tmp:
        binary = Path(tmp) / "pause"
        subprocess.run([cc, "-Os", "-Wall", "-Werror", "-static",
                        f"-DVERSION=v{PAUSE_VERSION}-kgroup", "-o", str(binary), str(src)],
                       check=True, capture_output=True)
        subprocess.run(["strip", str(binary)], check=True, capture_output=True)
        write_archive(out, name=PAUSE_IMAGE, entries=[Entry("pause", source=binary)],
                      entrypoint=["/pause"])
    return out


def busybox_archive() -> Path:
    """A FROM-scratch image holding Debian's static busybox and a link per applet."""
    if not BUSYBOX.is_file():
        raise ImageError(f"{BUSYBOX} is missing: run scripts/setup.sh "
                         f"(it installs busybox-static)")
    binary = BUSYBOX.read_bytes()
    out = cache_dir() / f"busybox-{_key(binary)}.tar"
    if out.exists():
        return out
    listing = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    entries = [Entry("bin/busybox", source=BUSYBOX)]
    entries += [Entry(f"bin/{applet}", link="busybox", mode=0o777)
                for applet in listing if applet != "busybox"]
    write_archive(out, name=BUSYBOX_IMAGE, entries=entries, entrypoint=[], cmd=["/bin/sh"])
    return out


def _ctr(address: Path, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CTR, "--address", str(address), "--namespace", NAMESPACE, *args],
                          capture_output=True, text=True, check=False, timeout=timeout)


def image_names(address: Path) -> set[str]:
    """The image names containerd at `address` holds in the kubelet's namespace."""
    out = _ctr(address, "images", "list", "--quiet", timeout=30.0)
    if out.returncode != 0:
        raise ImageError(f"ctr images list: {out.stderr.strip()}")
    return set(out.stdout.split())


def import_image(archive: Path, address: Path) -> None:
    """Load a docker-archive or OCI-archive tar into the node's containerd (the kubelet's
    namespace, unpacked for its snapshotter), so pods with `imagePullPolicy: Never` or
    `IfNotPresent` run it. Importing the same archive again is harmless and quick.
    """
    out = _ctr(address, "images", "import", str(archive))
    if out.returncode != 0:
        raise ImageError(f"ctr images import {archive}: {out.stderr.strip()}")


def ensure_base_images(address: Path) -> list[str]:
    """Build (or reuse) and import the node's own images; returns the names imported now."""
    present = image_names(address)
    imported = []
    for name, archive in ((PAUSE_IMAGE, pause_archive), (BUSYBOX_IMAGE, busybox_archive)):
        if name not in present:
            import_image(archive(), address)
            imported.append(name)
    return imported
