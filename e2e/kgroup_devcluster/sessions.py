"""Test sessions sharing one local cluster: who may stop it, and when.

Rule: several pytest sessions (several engineers share this machine and tree) may use
the cluster at once. Each session registers itself (PID + argv) in `<state>/users/`; a
cluster that a session started is stopped by the last session to leave, and a cluster
the CLI started (`make cluster-up`) is never stopped by a session.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import processes
from .cluster import STATE_DIR, Cluster, ensure_up, get_owner, state_lock, stop_locked, users_dir


def this_process() -> processes.Record:
    """A record of the calling process (for the session registry)."""
    raw = Path(f"/proc/{os.getpid()}/cmdline").read_bytes()
    argv = tuple(p.decode(errors="replace") for p in raw.rstrip(b"\0").split(b"\0"))
    return processes.Record(name="session", pid=os.getpid(), argv=argv)


def join(*, state_dir: Path = STATE_DIR) -> Cluster:
    """ensure_up() for a test session, registered as a user of the cluster."""
    return ensure_up(state_dir=state_dir, who="pytest", _register=this_process())


def leave(*, state_dir: Path = STATE_DIR) -> bool:
    """Unregister this session; stop the cluster if a session started it and none is left.

    Returns True when the cluster was stopped.
    """
    me = this_process()
    with state_lock():
        (users_dir(state_dir) / f"{me.pid}.json").unlink(missing_ok=True)
        others = [r for r in processes.load_records_dir(users_dir(state_dir))
                  if processes.is_alive(r)]
        if others or get_owner(state_dir) != "pytest":
            return False
        stop_locked(state_dir, 10.0)
        return True
