"""Start, find again and stop the control plane's processes, by recorded PID and argv.

Rule: a process is ours only if `/proc/<pid>/cmdline` is exactly the argv we started it
with. A PID alone is never enough: after a reboot or a long pause the number may belong
to someone else, and we must never signal a process we did not start.

Why: the processes outlive the `up` command (they run in their own session), so the only
link back to them is `pids.json` in the state dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Popen objects of the processes this Python process started: kept so they are reaped
# (no zombie, no ResourceWarning) when we stop them from the same process.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class Record:
    """One started process: its name, PID and argv."""

    name: str
    pid: int
    argv: tuple[str, ...]


def _read_cmdline(pid: int) -> tuple[str, ...] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    if not raw:  # a zombie or a kernel thread
        return None
    return tuple(part.decode(errors="replace") for part in raw.rstrip(b"\0").split(b"\0"))


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    # The state follows the command name, which is in parentheses and may hold spaces.
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _reap(pid: int) -> None:
    """Collect the exit status if `pid` is our child and has exited (never blocks)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is not None:
            del _CHILDREN[pid]
        return
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def is_alive(record: Record) -> bool:
    """True when the PID runs and its cmdline is the recorded argv."""
    if _read_cmdline(record.pid) != record.argv:
        return False
    return not _is_zombie(record.pid)


def start(name: str, argv: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> Record:
    """Start `argv` detached (own session), stdout and stderr appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {name}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=None if env is None else dict(env),
            cwd=cwd,
        )
    _CHILDREN[proc.pid] = proc
    record = Record(name=name, pid=proc.pid, argv=tuple(argv))
    # Popen may return while the kernel is still inside exec (the vfork parent resumes
    # before the new argv is visible in /proc), so wait until the cmdline is ours.
    deadline = time.monotonic() + 5.0
    while not is_alive(record) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return record


def stop(record: Record, *, grace: float = 10.0) -> bool:
    """SIGTERM the process if it is still ours, SIGKILL after `grace` seconds.

    Returns True when a signal was sent. A process that is gone or whose cmdline no
    longer matches is left alone.
    """
    if not is_alive(record):
        _reap(record.pid)
        return False
    os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(record.pid)
        if not is_alive(record):
            _reap(record.pid)
            return True
        time.sleep(0.05)
    if is_alive(record):
        os.kill(record.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while is_alive(record) and time.monotonic() < deadline:
            time.sleep(0.05)
    _reap(record.pid)
    return True


def load_records(path: Path) -> dict[str, Record]:
    """The records in `pids.json`, by name (empty if the file is missing)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return {
        name: Record(name=name, pid=int(item["pid"]), argv=tuple(item["argv"]))
        for name, item in data.items()
    }


def save_records(path: Path, records: Mapping[str, Record]) -> None:
    data = {name: {"pid": r.pid, "argv": list(r.argv)} for name, r in records.items()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def save_record(path: Path, record: Record) -> None:
    path.write_text(json.dumps({"name": record.name, "pid": record.pid,
                                "argv": list(record.argv)}) + "\n")


def load_records_dir(directory: Path) -> list[Record]:
    """The records saved one per file (save_record) in `directory`."""
    out: list[Record] = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            item = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        out.append(Record(name=item["name"], pid=int(item["pid"]), argv=tuple(item["argv"])))
    return out
