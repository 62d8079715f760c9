"""The previous release, built from its own files: `python -m kgroup_devcluster.previous
build|load`.

The previous release is the commit ``PREVIOUS`` (34ed52a, 2026-11-26 13:59 UTC): the last
commit of main before the work that numbered releases began (its next commits, from
2026-11-27 20:14, brought the version checks, the CHANGELOG and ``[0.1.0]``). It writes the
Lease format of 0.1.0 (fencing token, holder uid, assignment mark with its uid) and had no
sidecar injector: its workers carry the sidecar written out, as examples/ did then.

Its tree is exported once with ``git archive`` into ``~/.cache/kgroup/previous/<commit>/``
(``KGROUP_CACHE`` moves ``~/.cache/kgroup``) and its three images are built by
:mod:`.images` from that tree's own ``docker/`` files and context. Its pyproject and
Chart.yaml already said 0.1.0, as this tree's do, so its images are tagged with the
commit instead (``ghcr.io/kgroup/kgroup-sidecar:34ed52a``): both releases' images then sit
side by side in the real node's containerd, and the chart of each picks its own through
``operator.image.tag`` / the workers' image fields. Their archives are kept apart from the
current ones (``previous/<commit>/archives``), never pruned by a build of this tree.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .images import CACHE, IMAGES, Built, ImageError, build, cache_lock, ensure_base, load

PREVIOUS = "34ed52a6b874af53779b4158e8a3edec4349bc57"
REPO = Path(__file__).resolve().parents[2]
ROOT = CACHE.parent / "previous"


def commit() -> str:
    """The commit to upgrade from: ``PREVIOUS``, or ``$KGROUP_PREVIOUS`` (any commit of this
    clone, e.g. an older one to see what an upgrade that skips a release does)."""
    ref = os.environ.get("KGROUP_PREVIOUS") or PREVIOUS
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ImageError(f"no commit {ref} in {REPO}: {out.stderr.strip()}")
    return out.stdout.strip()


def tag(commit: str = PREVIOUS) -> str:
    """The previous release's image tag: the commit, abbreviated as git log shows it."""
    return commit[:7]


def tree(commit: str = PREVIOUS) -> Path:
    """The commit's files (``git archive`` of this clone), exported once."""
    out = ROOT / commit / "tree"
    if (out / ".exported").exists():
        return out
    (ROOT / commit).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tree-", dir=ROOT / commit))
    try:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            raise ImageError(f"git archive {commit}: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive.stdout, check=True)
        (work / ".exported").write_text(commit + "\n")
        shutil.rmtree(out, ignore_errors=True)
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def build_all(commit: str = PREVIOUS) -> list[Built]:
    """The commit's operator, sidecar and worker images, built from its own Dockerfiles."""
    root = tree(commit)
    with cache_lock():
        digest = ensure_base()
        return [build(image, digest, root=root, version=tag(commit),
                      archives=ROOT / commit / "archives") for image in IMAGES]


def ensure_on_node(state_dir: Path | None = None, commit: str = PREVIOUS) -> list[Built]:
    """Build what is missing and load the previous release's images into the real node."""
    from .node import containerd_address

    address = str(containerd_address(state_dir))
    rows = build_all(commit)
    for b in rows:
        load(b, address)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kgroup_devcluster.previous",
                                     description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("cmd", choices=("build", "load"))
    args = parser.parse_args(argv)
    try:
        rows = ensure_on_node(commit=commit()) if args.cmd == "load" \
            else build_all(commit())
    except ImageError as exc:
        print(f"[previous] error: {exc}", file=sys.stderr)
        return 1
    for b in rows:
        print(f"{b.image.name:<9} {b.tag:<50} {'built' if b.built else 'cached'} "
              f"in {b.seconds:.1f} s  {b.archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
