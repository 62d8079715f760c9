"""What the real node leaves on the host, found and removed: mounts under a directory,
a cgroup subtree in every hierarchy and the processes in it, kernel settings.

Rule: every function here acts only on what the caller names: mounts whose mount point
is under the given directory, cgroups under the given cgroup path (unique to one state
dir), processes found in that cgroup subtree or started with the given containerd
socket. Nothing is found by a process name alone.

Why: the kubelet and containerd outlive no one gracefully. The kubelet bind-mounts its
root dir onto itself and mounts tmpfs volumes under it; containerd mounts each
container's overlay rootfs and each sandbox's /dev/shm under its state dir; runc creates
the containers' cgroups under the kubelet's cgroupRoot in every v1 hierarchy (and the
unified one on a hybrid host). A `down` that kills the daemons alone leaves all of that.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import json
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

CGROUP_FS = ("cgroup", "cgroup2")
_MNT_DETACH = 2


def _unescape(field: str) -> str:
    """Mount points in /proc/self/mountinfo escape space, tab, newline and backslash."""
    return (field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
            .replace("\\134", "\\"))


def parse_mountinfo(text: str) -> list[tuple[str, str, str]]:
    """(mount point, fs type, super options) of every line of a mountinfo, in order."""
    out = []
    for line in text.splitlines():
        left, right = line.split(" - ", 1)
        fstype, _source, options = [*right.split(" "), "", ""][:3]
        out.append((_unescape(left.split(" ")[4]), fstype, options))
    return out


def _mountinfo() -> list[tuple[str, str, str]]:
    return parse_mountinfo(Path("/proc/self/mountinfo").read_text())


def mounts_under(directory: Path, mounts: list[tuple[str, str, str]] | None = None) -> list[str]:
    """Mount points at or under `directory`, deepest (then latest) first; `mounts` as
    parse_mountinfo returns them (default: this process's)."""
    root = str(directory.resolve())
    found = [m for m, _, _ in (_mountinfo() if mounts is None else mounts)
             if m == root or m.startswith(root + "/")]
    order = {m: i for i, m in enumerate(found)}
    return sorted(found, key=lambda m: (m.count("/"), order[m]), reverse=True)


def _umount(target: str, flags: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(target.encode(), flags) == 0:
        return 0
    return ctypes.get_errno()


def unmount_all(directory: Path, *, rounds: int = 5) -> list[str]:
    """Unmount everything mounted under `directory` (stacked mounts included); a busy one
    is detached lazily. Returns the mount points still there (empty when all is gone)."""
    for _ in range(rounds):
        targets = mounts_under(directory)
        if not targets:
            return []
        for target in targets:
            err = _umount(target, 0)
            if err == errno.EBUSY:
                _umount(target, _MNT_DETACH)
    return mounts_under(directory)


# ---- cgroups -------------------------------------------------------------------------------


def hierarchies() -> list[Path]:
    """The mount points of every cgroup hierarchy (v1 controllers and cgroup2), one per
    hierarchy even when a hierarchy is mounted twice."""
    seen: dict[str, Path] = {}
    for mount, fstype, options in _mountinfo():
        if fstype in CGROUP_FS:
            key = fstype + ":" + ",".join(sorted(o for o in options.split(",") if o != "rw"))
            seen.setdefault(key, Path(mount))
    return list(seen.values())


def make_cgroup(path: str) -> None:
    """Create `path` (absolute cgroup path) in every hierarchy. A new cpuset cgroup starts
    with no CPUs and memory nodes, so its parent's are copied in (as the kubelet needs)."""
    rel = path.strip("/")
    for h in hierarchies():
        parent = h
        for part in rel.split("/"):
            d = parent / part
            if not d.is_dir():
                d.mkdir()
                for name in ("cpuset.cpus", "cpuset.mems"):
                    if (parent / name).exists() and not (d / name).read_text().strip():
                        (d / name).write_text((parent / name).read_text())
            parent = d


def cgroup_dirs(path: str) -> list[Path]:
    """Every directory of the subtree `path` in every hierarchy, deepest first."""
    out: list[Path] = []
    for h in hierarchies():
        top = h / path.strip("/")
        if top.is_dir():
            out.extend(Path(d) for d, _, _ in os.walk(top))
    return sorted(out, key=lambda p: len(p.parts), reverse=True)


def cgroup_pids(path: str) -> set[int]:
    """The PIDs of every process in the subtree `path` of any hierarchy."""
    pids: set[int] = set()
    for d in cgroup_dirs(path):
        with contextlib.suppress(FileNotFoundError, OSError):
            pids.update(int(p) for p in (d / "cgroup.procs").read_text().split())
    return pids


def kill_cgroup(path: str, *, timeout: float = 10.0) -> set[int]:
    """SIGKILL every process in the subtree `path` until it is empty. Returns the PIDs
    still there at the timeout (empty on success)."""
    deadline = time.monotonic() + timeout
    while (pids := cgroup_pids(path)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    return cgroup_pids(path)


def remove_cgroup(path: str, *, timeout: float = 10.0) -> list[Path]:
    """rmdir the subtree `path` depth-first in every hierarchy (a cgroup whose last
    process just died may be busy for a moment). Returns the directories left."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for d in cgroup_dirs(path):
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(d)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


# ---- processes by argv ---------------------------------------------------------------------


def _cmdlines() -> Iterable[tuple[int, list[str]]]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if raw:
                yield int(entry.name), [p.decode(errors="replace")
                                        for p in raw.rstrip(b"\0").split(b"\0")]


def pids_with_arg_pair(flag: str, value: str) -> list[int]:
    """PIDs whose argv holds `flag` directly followed by `value` (for example the
    containerd shims of one containerd: `-address <its socket>`)."""
    return [pid for pid, argv in _cmdlines()
            if any(a == flag and b == value for a, b in itertools.pairwise(argv))]


def pids_named(basename: str) -> list[int]:
    """PIDs whose argv[0] has this file name (used only to count, never to signal)."""
    return [pid for pid, argv in _cmdlines() if Path(argv[0]).name == basename]


def kill_pids(pids: Iterable[int], *, timeout: float = 5.0) -> None:
    """SIGKILL the PIDs (found by the caller as ours) and wait until they are gone."""
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{p}").exists() and not _zombie(p) for p in pids):
        if time.monotonic() > deadline:
            return
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


# ---- kernel settings -------------------------------------------------------------------------


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def save_sysctls(names: Iterable[str], record: Path) -> None:
    """Write the current values of `names` to `record`, unless it exists already (the
    first kubelet on the machine saw the values before any kubelet changed them)."""
    if record.exists():
        return
    values = {n: _sysctl_path(n).read_text().strip() for n in names}
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(values, indent=2) + "\n")


def restore_sysctls(record: Path) -> dict[str, str]:
    """Write back the values saved in `record` and remove it; returns what was written."""
    try:
        values: dict[str, str] = json.loads(record.read_text())
    except FileNotFoundError:
        return {}
    for name, value in values.items():
        with contextlib.suppress(OSError):
            _sysctl_path(name).write_text(value + "\n")
    record.unlink()
    return values
