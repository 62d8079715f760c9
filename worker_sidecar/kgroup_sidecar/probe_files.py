"""Probe files: what the kubelet's exec probes test when no httpGet probe can reach the
sidecar (``KGROUP_PROBE_DIR``; the chart's ``sidecar.probes.mode: exec``).

Why files: on a node without a pod network (hostNetwork pods, as on this project's real
node) two pods cannot own one fixed port, so the kubelet's httpGet probe has no address
to ask, and the API itself is on a Unix socket. The old exec probe started a Python
interpreter to ask it (about 45 mCPU per sidecar at a 2 s readiness period); the kubelet
can instead run a small binary every image has (GNU ``find``, Essential in Debian) on two
files in the pod's emptyDir:

- ``alive``: touched every :data:`HEARTBEAT_SECONDS` by a task of the sidecar's event
  loop. The startup probe is ``find <dir>/alive -mmin +0.5 -exec false {} +``: it
  fails when the file is missing or older than 30 s, i.e. when the loop has been stuck
  (SIGSTOP, a blocking call, a deadlock) that long. The chart renders no liveness probe
  in this mode (each exec costs the container 17-30 ms of CPU): the sidecar's watchdog
  (:mod:`kgroup_sidecar.watchdog`) exits a sidecar whose loop is stuck; the command
  stays for a human (``kubectl exec``) or a chart that wants the probe.
- ``ready``: present while the sidecar is Ready (``kgroup.core.member.readiness``: holds its
  whole target, epoch acknowledged), created or removed as the verdict changes (created
  atomically: written aside, then renamed) and touched with ``alive``. Readiness is
  ``find <dir>/ready -mmin +0.25 -exec false {} +``: missing (not ready) or older than 15 s
  (the loop is stuck) fails.

``find ... -exec false {} +`` exits non-zero when ``false`` ran, i.e. when the file
matched ``-mmin +N`` (older than N minutes), and when the file does not exist.

At start the sidecar removes a ``ready`` left by an earlier run of its container (the
emptyDir outlives it); at exit it removes both files.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0
# The kubelet's readiness period for these probes (the chart's exec mode): each exec costs
# the container 17-30 ms of CPU (``runc exec``): 1.1-2.0 mCPU at 15 s, 9-15 at 2 s.
READINESS_PERIOD_SECONDS = 15
ALIVE, READY = "alive", "ready"
LIVENESS_MINUTES = "+0.5"
READINESS_MINUTES = "+0.25"


def probe_command(directory: str, name: str) -> list[str]:
    """The exec probe's command for the file ``name`` (``alive`` or ``ready``)."""
    minutes = LIVENESS_MINUTES if name == ALIVE else READINESS_MINUTES
    return ["find", f"{directory.rstrip('/')}/{name}", "-mmin", minutes, "-exec", "false",
            "{}", "+"]


class ProbeFiles:
    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.ready: bool | None = None
        self.writes = 0

    def start(self) -> None:
        """Make the directory, drop an old ``ready``, write ``alive``."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (self.dir / READY).unlink()
        self.ready = False
        self._touch(ALIVE)

    def set_ready(self, ready: bool) -> None:
        """The readiness verdict now; the file changes only when the verdict does."""
        if ready == self.ready:
            return
        self.ready = ready
        self.writes += 1
        if ready:
            self._touch(READY)
        else:
            with contextlib.suppress(FileNotFoundError):
                (self.dir / READY).unlink()

    def beat(self, ready: bool) -> None:
        """The heartbeat: ``alive`` touched, ``ready`` kept (and touched) while ready."""
        self._touch(ALIVE)
        if ready and self.ready:
            self._touch(READY)
        else:
            self.set_ready(ready)

    def stop(self) -> None:
        for name in (READY, ALIVE):
            with contextlib.suppress(FileNotFoundError):
                (self.dir / name).unlink()

    def _touch(self, name: str) -> None:
        path = self.dir / name
        try:
            os.utime(path)
        except FileNotFoundError:
            aside = self.dir / f".{name}.new"
            aside.write_bytes(b"")
            os.replace(aside, path)  # appears whole: a probe never sees it half made

    def tick(self, ready: bool) -> None:
        """:meth:`beat`, a failure logged (a full or vanished emptyDir: the probes will
        say so). The sidecar's heartbeat task calls it every :data:`HEARTBEAT_SECONDS`
        on the event loop: a stuck loop stops it, which is the point."""
        try:
            self.beat(ready)
        except OSError as exc:
            log.warning("probe files in %s: %s", self.dir, exc)
