"""kgroup's images without a registry: `python -m kgroup_devcluster.images build|load|list`.

The images are built from the project's own Dockerfiles in ``docker/`` (the files a kind or
cloud user builds with Docker) by Debian's buildah (vfs storage, chroot isolation, never
pulling), and each is written as a ``docker-archive`` into a cache outside the clone
(``~/.cache/kgroup/images/``, ``KGROUP_CACHE`` moves ``~/.cache/kgroup``). ``load`` imports
an archive into a containerd (the real node's) with ``ctr``.

The cache is keyed by content: an image's key hashes its Dockerfile, every build-context
file its COPY/ADD lines name (minus what ``.dockerignore`` leaves out, as Docker would) and
the base image's rootfs. A warm run with unchanged sources finds every archive by its key
and builds nothing; a changed file rebuilds exactly the images that copy it.

The base image (the Dockerfiles' ``FROM python:3.11-slim-bookworm``) cannot be pulled here:
it is made by ``debootstrap --variant=minbase`` of Debian bookworm with python3, pip and
the CA certificates, shaped like the official slim image (no docs/man pages, pip allowed to
install system-wide), tarred once per recipe and imported into buildah's storage under the
official name. It is a stand-in for local builds; a Docker user gets the real one.

Trap: pip inside a build reaches the package index through TLS with a CA the host trusts
in its system store only, so builds mount the host's CA bundle read-only over the image's
(a build-time volume: nothing of it lands in an image).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("KGROUP_CACHE", Path.home() / ".cache" / "kgroup")) / "images"
# The host's CA bundle, mounted over the base's during each RUN so pip trusts what the host
# trusts. Only the file: the JRE's postinst writes /etc/ssl/certs/java/cacerts, so the
# directory must stay the image's own (mounting all of /etc/ssl/certs read-only broke it).
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
KEEP_ARCHIVES = 3  # per image: the newest archives kept (by last use; worktrees share them)


@dataclass(frozen=True)
class Image:
    """One deployable image: its name here, its Dockerfile and its repository."""

    name: str
    dockerfile: str  # relative to the repository root (the build context)
    repository: str

    def tag(self, version: str) -> str:
        return f"{self.repository}:{version}"


IMAGES = (
    Image("operator", "docker/operator.Dockerfile", "ghcr.io/kgroup/kgroup-operator"),
    Image("sidecar", "docker/sidecar.Dockerfile", "ghcr.io/kgroup/kgroup-sidecar"),
    Image("worker", "docker/pyspark-worker.Dockerfile", "ghcr.io/kgroup/kgroup-pyspark-worker"),
)


@dataclass(frozen=True)
class BaseRecipe:
    """How the stand-in for the official base image is made; its hash keys the rootfs."""

    ref: str = "docker.io/library/python:3.11-slim-bookworm"
    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    packages: tuple[str, ...] = ("python3", "python3-pip", "python-is-python3",
                                 "ca-certificates")
    revision: int = 2  # bump when _shape_rootfs changes

    def key(self) -> str:
        return _sha256(json.dumps(self.__dict__, sort_keys=True).encode())[:16]


BASE = BaseRecipe()

# Like debian:bookworm-slim's /etc/dpkg/dpkg.cfg.d/docker: later apt installs (the worker's
# JRE) leave docs, man pages and translations out, as they would on the official image.
_DPKG_EXCLUDES = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
"""
# Like debian:bookworm-slim's /etc/apt/apt.conf.d/docker-*: apt keeps no .deb files or
# package caches after an install and fetches no translations (without this, the worker's
# JRE install left 130 MB of /var/cache/apt in its layer).
_APT_CONF = {
    "docker-clean": (
        'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb '
        '/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
        'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb '
        '/var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };\n'
        'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n'),
    "docker-no-languages": 'Acquire::Languages "none";\n',
    "docker-gzip-indexes": 'Acquire::GzipIndexes "true";\n',
}
_APT_SOURCES = """\
Types: deb
URIs: {mirror}
Suites: {suite} {suite}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {mirror}-security
Suites: {suite}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


class ImageError(RuntimeError):
    """A build or load step failed; the message says which and why."""


# --- pure: what a Dockerfile copies, what .dockerignore leaves out, the key ---------------

def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _instructions(dockerfile: str) -> Iterator[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line: comments dropped, ``\\`` joined."""
    logical = ""
    for raw in dockerfile.splitlines():
        line = raw.strip()
        if not logical and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        word, _, rest = logical.partition(" ")
        yield word.upper(), rest.strip()
        logical = ""


def copied_sources(dockerfile: str) -> list[str]:
    """The build-context paths (files, directories or globs) the COPY/ADD lines name.

    ``COPY --from=<stage>`` copies from another stage, not the context, so it is skipped.
    """
    sources: list[str] = []
    for word, args in _instructions(dockerfile):
        if word not in ("COPY", "ADD"):
            continue
        parts = json.loads(args) if args.startswith("[") else shlex.split(args)
        flags = [p for p in parts if p.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue
        paths = [p for p in parts if not p.startswith("--")][:-1]  # the last is the dest
        for p in paths:
            if "://" in p:
                raise ImageError(f"ADD of a URL cannot be keyed by content: {p}")
            sources.append(os.path.normpath(p.removeprefix("./")))
    return sources


def base_images(dockerfile: str) -> list[str]:
    """The images named by FROM lines that are not earlier stages."""
    stages: set[str] = set()
    bases: list[str] = []
    for word, args in _instructions(dockerfile):
        if word != "FROM":
            continue
        parts = [p for p in args.split() if not p.startswith("--")]
        if parts[0] not in stages:
            bases.append(parts[0])
        if len(parts) == 3 and parts[1].upper() == "AS":
            stages.add(parts[2])
    return bases


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus ``**``) as an anchored regex."""
    out = ""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if pattern.startswith("/", i):  # `**/x` also matches `x` at the root
                out = out[:-2] + "(?:.*/)?"
                i += 1
            continue
        out += {"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c))
        i += 1
    return re.compile(out + r"\Z")


def ignore_rules(dockerignore: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(is_exception, regex) per non-comment line of a .dockerignore, in order."""
    rules: list[tuple[bool, re.Pattern[str]]] = []
    for raw in dockerignore.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
        rules.append((negate, _pattern_regex(pattern)))
    return rules


def is_ignored(path: str, rules: Sequence[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last matching line wins; a line matching a parent directory
    also excludes what is below it."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for negate, regex in rules:
        if any(regex.match(p) for p in prefixes):
            ignored = not negate
    return ignored


def select_context(dockerfile: str, dockerignore: str, paths: Iterable[str]) -> list[str]:
    """Which of the context's files (relative paths) the Dockerfile's COPY/ADD lines copy."""
    sources = copied_sources(dockerfile)
    rules = ignore_rules(dockerignore)

    def copied(path: str) -> bool:
        return any(path == s or path.startswith(s + "/") or re.fullmatch(
            _pattern_regex(s), path) is not None for s in sources)

    return sorted(p for p in paths if copied(p) and not is_ignored(p, rules))


def image_key(dockerfile: str, files: Mapping[str, str], base: str) -> str:
    """The cache key: a hash of the Dockerfile, each copied file's path and content digest,
    and the base image's digest."""
    h = hashlib.sha256()
    h.update(b"dockerfile\0" + dockerfile.encode() + b"\0base\0" + base.encode())
    for path in sorted(files):
        h.update(f"\0file\0{path}\0{files[path]}".encode())
    return h.hexdigest()[:16]


# --- the context on disk --------------------------------------------------------------

def _context_paths(root: Path) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames if d not in (".git", ".venv", ".state")]
        for name in filenames:
            yield name if rel == "." else f"{rel}/{name}"


def _file_digest(path: Path) -> str:
    mode = "x" if os.access(path, os.X_OK) else "-"
    return mode + _sha256(path.read_bytes())


def key_for(image: Image, base_digest: str, root: Path = REPO) -> str:
    dockerfile = (root / image.dockerfile).read_text()
    ignore_file = root / ".dockerignore"
    dockerignore = ignore_file.read_text() if ignore_file.exists() else ""
    files = select_context(dockerfile, dockerignore, _context_paths(root))
    return image_key(dockerfile, {p: _file_digest(root / p) for p in files}, base_digest)


def project_version(root: Path = REPO) -> str:
    with (root / "pyproject.toml").open("rb") as f:
        version: str = tomllib.load(f)["project"]["version"]
    return version


# --- buildah ----------------------------------------------------------------------------

def _say(msg: str) -> None:
    print(f"[images] {msg}", file=sys.stderr, flush=True)


def _run(argv: Sequence[str], *, quiet: bool = False) -> str:
    proc = subprocess.run(list(argv), text=True, capture_output=quiet, check=False)
    if proc.returncode != 0:
        detail = (proc.stderr or "").strip()[-2000:] if quiet else "see the output above"
        raise ImageError(f"{shlex.join(argv)} exited {proc.returncode}: {detail}")
    return proc.stdout or ""


def buildah_argv(*args: str) -> list[str]:
    """buildah on kgroup's own storage (vfs, under the cache): never /var/lib/containers."""
    return ["buildah", "--root", str(CACHE / "storage"), "--runroot", str(CACHE / "run"),
            "--storage-driver", "vfs", *args]


def buildah(*args: str, quiet: bool = True) -> str:
    return _run(buildah_argv(*args), quiet=quiet)


def image_labels(ref: str) -> dict[str, str] | None:
    """The labels of an image in the storage, or None when there is no such image."""
    proc = subprocess.run(buildah_argv("inspect", "--type", "image", ref),
                          text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        return None
    labels: dict[str, str] | None = json.loads(proc.stdout)["OCIv1"]["config"].get("Labels")
    return labels or {}


@contextlib.contextmanager
def cache_lock() -> Iterator[None]:
    """One builder at a time across worktrees (they share the cache and the storage)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "images.lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _umount_below(path: Path) -> None:
    """debootstrap mounts /proc and /sys in its target; a failed run may leave them."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    targets = [m.split()[1] for m in mounts if m.split()[1].startswith(str(path) + "/")]
    for target in sorted(targets, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], check=False)


def _shape_rootfs(rootfs: Path, recipe: BaseRecipe) -> None:
    """Make the debootstrap tree look like the official slim image where builds notice."""
    (rootfs / "usr/lib/python3.11/EXTERNALLY-MANAGED").unlink(missing_ok=True)
    (rootfs / "etc/dpkg/dpkg.cfg.d/docker").write_text(_DPKG_EXCLUDES)
    for name, text in _APT_CONF.items():
        (rootfs / "etc/apt/apt.conf.d" / name).write_text(text)
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(
        _APT_SOURCES.format(mirror=recipe.mirror, suite=recipe.suite))
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin",
                    "var/lib/apt/lists/*_*", "var/log/*.log", "var/log/apt/*"):
        for p in rootfs.glob(pattern):
            p.unlink()
    for d in ("usr/share/man", "usr/share/info", "usr/share/groff", "usr/share/lintian",
              "usr/share/locale"):
        shutil.rmtree(rootfs / d, ignore_errors=True)
        (rootfs / d).mkdir()
    for doc in (rootfs / "usr/share/doc").iterdir():
        if doc.is_dir():
            for p in doc.iterdir():
                if p.name != "copyright":
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def base_rootfs(recipe: BaseRecipe = BASE) -> tuple[Path, str]:
    """The base rootfs tarball for the recipe (made once) and its sha256."""
    base_dir = CACHE / "base"
    tarball = base_dir / f"rootfs-{recipe.key()}.tar"
    digest_file = tarball.with_suffix(".sha256")
    if tarball.exists() and digest_file.exists():
        return tarball, digest_file.read_text().strip()
    base_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=base_dir))
    try:
        started = time.monotonic()
        _say(f"debootstrap {recipe.suite} ({', '.join(recipe.packages)}): about 2-3 min")
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(recipe.packages)}",
              recipe.suite, str(work / "rootfs"), recipe.mirror], quiet=True)
        _umount_below(work)
        _shape_rootfs(work / "rootfs", recipe)
        _run(["tar", "--numeric-owner", "--xattrs", "-C", str(work / "rootfs"), "-cf",
              str(work / "rootfs.tar"), "."], quiet=True)
        h = hashlib.sha256()
        with (work / "rootfs.tar").open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        (work / "rootfs.tar").rename(tarball)
        digest_file.write_text(h.hexdigest() + "\n")
        _say(f"base rootfs made in {time.monotonic() - started:.0f} s: {tarball}")
    finally:
        _umount_below(work)
        shutil.rmtree(work, ignore_errors=True)
    return tarball, digest_file.read_text().strip()


def ensure_base(recipe: BaseRecipe = BASE) -> str:
    """The base image in buildah's storage under the official name; returns its rootfs
    digest (what the images' keys hash)."""
    tarball, digest = base_rootfs(recipe)
    labels = image_labels(recipe.ref)
    if labels is not None and labels.get("dev.kgroup.base-digest") == digest:
        return digest
    _say(f"importing the base image as {recipe.ref}")
    started = time.monotonic()
    container = buildah("from", "--pull=never", "scratch").strip()
    try:
        buildah("add", container, str(tarball), "/")
        buildah("config", "--env", "LANG=C.UTF-8", "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--cmd", "python3", "--label", f"dev.kgroup.base-digest={digest}",
                "--label", f"dev.kgroup.base-recipe={recipe.key()}", container)
        buildah("commit", "--rm", container, recipe.ref)
        _say(f"base image imported in {time.monotonic() - started:.0f} s")
    except BaseException:
        subprocess.run(buildah_argv("rm", container), capture_output=True, check=False)
        raise
    return digest


# --- the images ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Built:
    """An image's archive in the cache, with what was measured making it."""

    image: Image
    tag: str
    key: str
    archive: Path
    image_id: str
    size: int  # bytes of the archive (uncompressed layers)
    built: bool  # False: found in the cache
    seconds: float


def _archive_config_name(tar: tarfile.TarFile, archive: Path) -> str:
    member = tar.extractfile("manifest.json")
    if member is None:
        raise ImageError(f"{archive}: no manifest.json")
    config: str = json.load(member)[0]["Config"]
    return config


def archive_image_id(archive: Path) -> str:
    """The config digest a docker-archive's manifest names (what containerd will show)."""
    with tarfile.open(archive) as tar:
        config = _archive_config_name(tar, archive)
    return "sha256:" + config.removeprefix("sha256:").removesuffix(".json")


def archive_labels(archive: Path) -> dict[str, str]:
    """The labels in a docker-archive's image config: what the node gets, whatever the
    builder's storage tags now (worktrees share that storage and retag it as they build)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile(_archive_config_name(tar, archive))
        if member is None:
            raise ImageError(f"{archive}: no image config")
        labels: dict[str, str] = json.load(member).get("config", {}).get("Labels") or {}
    return labels


def archive_files(archive: Path) -> dict[str, int]:
    """The regular files of a docker-archive's final filesystem (path -> bytes): its
    layers applied in order, whiteouts (``.wh.`` entries) removing what earlier layers
    put there."""
    files: dict[str, int] = {}
    with tarfile.open(archive) as tar:
        manifest = tar.extractfile("manifest.json")
        if manifest is None:
            raise ImageError(f"{archive}: no manifest.json")
        for layer_name in json.load(manifest)[0]["Layers"]:
            layer_file = tar.extractfile(layer_name)
            if layer_file is None:
                raise ImageError(f"{archive}: no layer {layer_name}")
            with tarfile.open(fileobj=layer_file) as layer:
                for m in layer:
                    path = os.path.normpath(m.name.removeprefix("./"))
                    head, base = os.path.split(path)
                    if base == ".wh..wh..opq":
                        files = {k: v for k, v in files.items()
                                 if not k.startswith(head + "/")}
                    elif base.startswith(".wh."):
                        gone = os.path.join(head, base.removeprefix(".wh."))
                        files = {k: v for k, v in files.items()
                                 if k != gone and not k.startswith(gone + "/")}
                    elif m.isfile():
                        files[path] = m.size
    return files


def project_files(files: Mapping[str, int]) -> dict[str, int]:
    """The installed files of this project's packages (``*-packages/kgroup*/``)."""
    return {p: n for p, n in files.items()
            if re.search(r"/(site|dist)-packages/kgroup[a-z_]*/", p) is not None}


def _archive(image: Image, key: str, archives: Path | None = None) -> Path:
    return (archives or CACHE / "archives") / f"{image.name}-{key}.tar"


def _prune_archives(image: Image) -> None:
    archives = sorted((CACHE / "archives").glob(f"{image.name}-*.tar"),
                      key=lambda p: p.stat().st_mtime, reverse=True)
    for old in archives[KEEP_ARCHIVES:]:
        old.unlink(missing_ok=True)
        old.with_suffix(".json").unlink(missing_ok=True)


def build(image: Image, base_digest: str, *, root: Path = REPO, version: str | None = None,
          archives: Path | None = None) -> Built:
    """The image's archive for the sources under ``root``: from the cache, or built and
    written. ``version``: the tag (default: the project's version); ``archives``: a cache
    directory of their own for archives of another tag (not pruned: kept until deleted)."""
    started = time.monotonic()
    tag = image.tag(version or project_version(root))
    for base in base_images((root / image.dockerfile).read_text()):
        if f"docker.io/library/{base}" != BASE.ref:
            raise ImageError(f"{image.dockerfile}: FROM {base} is not the local base "
                             f"{BASE.ref}; nothing can be pulled here")
    key = key_for(image, base_digest, root)
    archive = _archive(image, key, archives)
    meta_file = archive.with_suffix(".json")
    if archive.exists() and meta_file.exists():
        meta = json.loads(meta_file.read_text())
        os.utime(archive)  # last use, for pruning
        return Built(image, tag, key, archive, meta["image_id"], archive.stat().st_size,
                     False, time.monotonic() - started)
    _say(f"building {tag} from {image.dockerfile} (key {key})")
    buildah("build", "--isolation", "chroot", "--pull=never", "--layers=false",
            "--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro",
            "--label", f"dev.kgroup.image-key={key}",
            "-f", str(root / image.dockerfile), "-t", tag, str(root), quiet=False)
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".tar.partial")
    partial.unlink(missing_ok=True)
    buildah("push", "--quiet", tag, f"docker-archive:{partial}:{tag}")
    image_id = archive_image_id(partial)
    partial.rename(archive)
    seconds = time.monotonic() - started
    meta_file.write_text(json.dumps({"tag": tag, "key": key, "image_id": image_id,
                                     "build_seconds": round(seconds, 1)}) + "\n")
    # Untagged leftovers of earlier builds of this tag take gigabytes in vfs storage.
    if archives is not None:  # another tag: its archive is its one copy (no rebuild reuses it)
        subprocess.run(buildah_argv("rmi", tag), capture_output=True, check=False)
    subprocess.run(buildah_argv("rmi", "--prune"), capture_output=True, check=False)
    if archives is None:
        _prune_archives(image)
    _say(f"built {tag} in {seconds:.0f} s: {archive.stat().st_size / 1e6:.0f} MB")
    return Built(image, tag, key, archive, image_id, archive.stat().st_size, True, seconds)


def build_all(names: Sequence[str] = (), *, root: Path = REPO) -> list[Built]:
    chosen = [i for i in IMAGES if not names or i.name in names]
    if names and len(chosen) != len(set(names)):
        raise ImageError(f"unknown image in {list(names)}; known: "
                         f"{[i.name for i in IMAGES]}")
    with cache_lock():
        digest = ensure_base()
        return [build(image, digest, root=root) for image in chosen]


# --- containerd -----------------------------------------------------------------------

def _ctr(address: str, namespace: str, *args: str) -> str:
    return _run(["ctr", "--address", address, "--namespace", namespace, *args], quiet=True)


def loaded_image_id(address: str, tag: str, namespace: str = "k8s.io") -> str | None:
    """The config digest (image ID) of ``tag`` in containerd, or None when absent."""
    for line in _ctr(address, namespace, "images", "ls").splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == tag:
            manifest = json.loads(_ctr(address, namespace, "content", "get", fields[2]))
            config: str = manifest["config"]["digest"]
            return config
    return None


def load(built: Built, address: str, namespace: str = "k8s.io") -> bool:
    """Import the archive into the containerd at ``address`` unless that exact image is
    there already; returns whether it imported."""
    if loaded_image_id(address, built.tag, namespace) == built.image_id:
        return False
    _ctr(address, namespace, "images", "import", str(built.archive))
    loaded = loaded_image_id(address, built.tag, namespace)
    if loaded != built.image_id:
        raise ImageError(f"{built.tag}: containerd has {loaded} after the import, "
                         f"expected {built.image_id}")
    return True


def ensure_on_node(state_dir: Path | None = None) -> list[Built]:
    """Build what changed and load every image into the real node's containerd (the
    cluster of `state_dir`, default this checkout's): what the real-node tests, the demo
    and the benchmark call before they install the chart."""
    from .node import containerd_address  # the node module is the socket's one owner

    address = str(containerd_address(state_dir))
    rows = build_all()
    for b in rows:
        load(b, address)
    return rows


def _node_address() -> str | None:
    """The running real node's containerd socket, if this checkout's cluster has one."""
    from .node import containerd_address

    sock = containerd_address()
    return str(sock) if sock.is_socket() else None


# --- CLI ------------------------------------------------------------------------------------

def _table(rows: Sequence[Built], loaded: Mapping[str, bool] | None = None) -> None:
    for b in rows:
        what = "built" if b.built else "cached"
        line = (f"{b.image.name:<9} {b.tag:<46} key {b.key}  {b.size / 1e6:7.0f} MB  "
                f"{what} in {b.seconds:.1f} s")
        if loaded is not None:
            line += "  loaded" if loaded[b.image.name] else "  already in containerd"
        print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kgroup_devcluster.images",
                                     description=__doc__.split("\n")[0] if __doc__ else "")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_build = sub.add_parser("build", help="build what changed; print each image's archive")
    p_build.add_argument("names", nargs="*", help="operator, sidecar, worker (default: all)")
    p_load = sub.add_parser("load", help="build, then import into a containerd")
    p_load.add_argument("names", nargs="*")
    p_load.add_argument("--address", default=os.environ.get("KGROUP_CONTAINERD_ADDRESS"),
                        help="containerd socket (default: $KGROUP_CONTAINERD_ADDRESS, else "
                        "the real node of this checkout's cluster when it is up)")
    p_load.add_argument("--namespace", default="k8s.io")
    args = parser.parse_args(argv)
    try:
        rows = build_all(args.names)
        if args.cmd == "build":
            _table(rows)
            return 0
        address = args.address or _node_address()
        if not address:
            _table(rows)
            _say("no real node up (make cluster-up) and no --address: built only")
            return 0
        loaded = {b.image.name: load(b, address, args.namespace) for b in rows}
        _table(rows, loaded)
        return 0
    except ImageError as exc:
        print(f"[images] error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
