"""A Kubernetes watch stream read and resumed: the decisions, without I/O.

A watch answers with one JSON event per line (``{"type": ..., "object": ...}``) until the
API server ends the stream. What a watcher decides, whatever reads the bytes:

* :class:`Lines` cuts the byte chunks into lines, holding at most one unfinished line,
  and refuses one longer than its bound (memory stays bounded whatever the server sends;
  an object is at most 1.5 MiB, so a line is too);
* :func:`step` says what an event means: one to hand on (ADDED, MODIFIED, DELETED), a
  BOOKMARK (only its resourceVersion, to resume from), or an ERROR (410 Gone: the version
  is too old, list again; anything else: watch again);
* :class:`Resume` says where the next attempt starts and how long it waits: a 410 lists
  again at once; any other break watches again from the last version seen, after
  :func:`backoff` (exponential, capped, spread: :data:`RECONNECT`) when it failed; a
  stream the server simply ended is watched again at once (events are waited for, not
  polled);
* :func:`watch_seconds` is the server-side timeout a watch asks for, spread so that the
  watches started together do not all end together.

Used by both processes' watches, through :mod:`kgroup.kube_watch`: the operator's
per-group Lease watch (``kgroup_operator.lease_watch``) and the sidecar's watches
(``kgroup_sidecar.kube``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from kgroup.core.backoff import Backoff

__all__ = ["MAX_LINE_BYTES", "RECONNECT", "WATCH_SECONDS", "Gone", "LineTooLong", "Lines",
           "Resume", "Step", "WatchError", "backoff", "step", "watch_seconds"]

MAX_LINE_BYTES = 8 * 1024 * 1024
"""An event line's bound: an object is at most 1.5 MiB (etcd's request limit), JSON
escaping of its annotations can at most double it, and the event adds a few bytes."""
RECONNECT = Backoff(base=0.2, cap=8.0)
"""The pause before listing or watching again after failures in a row: 0.2, 0.4 ... 6.4,
8 s, spread by +-25 %. An overloaded API server answering every watch with 5xx is not
asked again by every watcher together (docs/design.md, "Retries back off, spread")."""
WATCH_SECONDS = 240
"""A watch's server-side timeout, before its spread: each watch asks for a time drawn in
``[WATCH_SECONDS, 2 * WATCH_SECONDS)`` (as client-go's reflector does)."""
DELIVERED = frozenset({"ADDED", "MODIFIED", "DELETED"})


class LineTooLong(ValueError):
    """A line grew past its bound: the stream is dropped (and watched again)."""


class WatchError(Exception):
    """An ERROR event, or an answer other than 200 to the watch request."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(f"{code} {message}".strip())
        self.code = code
        self.message = message


class Gone(WatchError):
    """410: the watch's resourceVersion is too old: list again."""


def error(code: int, message: str = "") -> WatchError:
    return (Gone if code == 410 else WatchError)(code, message)


class Lines:
    """Byte chunks in, complete non-empty lines out; at most ``max_line`` bytes held."""

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self.max_line = max_line
        self._pending = b""

    @property
    def pending(self) -> int:
        """Bytes held of a line not finished yet."""
        return len(self._pending)

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines ``chunk`` finishes. A watch reads one event per chunk in the steady
        state (a renewal), so that case is taken first, without a split; otherwise one
        split per chunk, and the bound checked line by line only when the bytes at hand
        exceed it."""
        end = chunk.find(b"\n")
        if end < 0:
            if len(self._pending) + len(chunk) > self.max_line:
                self._pending = b""
                raise LineTooLong(f"a watch line over {self.max_line} bytes")
            self._pending += chunk
            return []
        if end == len(chunk) - 1 and not self._pending:  # one whole line
            if end > self.max_line:
                raise LineTooLong(f"a watch line over {self.max_line} bytes")
            line = chunk[:end]
            return [line] if line.strip() else []
        data = self._pending + chunk if self._pending else chunk
        *lines, rest = data.split(b"\n")
        if len(data) > self.max_line and (
                len(rest) > self.max_line or max(map(len, lines)) > self.max_line):
            self._pending = b""
            raise LineTooLong(f"a watch line over {self.max_line} bytes")
        self._pending = rest
        return [line for line in lines if line.strip()]


class Step(NamedTuple):
    """What one event means: ``deliver`` it (its type and object) or not; the version to
    resume from (None: unchanged). A tuple: one is made per event, in every pod."""

    deliver: bool
    kind: str
    obj: Mapping[str, Any]
    resource_version: str | None


_tuple = tuple.__new__  # a Step without the Python-level __new__ of a NamedTuple


def step(event: Mapping[str, Any]) -> Step:
    """One decoded event; an ERROR raises :class:`Gone` (410) or :class:`WatchError`.
    (The ``dict`` checks first: what a JSON decoder makes, without an ABC check.)"""
    kind = event.get("type")
    if kind.__class__ is not str:
        kind = str(kind or "")
    obj = event.get("object")
    if obj.__class__ is not dict and not isinstance(obj, Mapping):
        obj = {}
    if kind == "ERROR":
        code = obj.get("code")
        raise error(code if isinstance(code, int) else 500, str(obj.get("message") or ""))
    meta = obj.get("metadata")
    rv = (meta.get("resourceVersion")
          if meta.__class__ is dict or isinstance(meta, Mapping) else None)
    return _tuple(Step, (kind in DELIVERED, kind, obj,
                         rv if rv.__class__ is str and rv else (str(rv) if rv else None)))


def backoff(failures: int, draw: float) -> float:
    """Seconds to wait after ``failures`` failed attempts in a row (0: none failed);
    ``draw`` in [0, 1) (``random.random()``): where in its spread the pause falls."""
    return RECONNECT.delay(failures, draw)


def watch_seconds(draw: float) -> int:
    """The server-side timeout one watch asks for; ``draw`` in [0, 1)."""
    return int(WATCH_SECONDS * (1.0 + min(max(draw, 0.0), 0.999)))


@dataclass
class Resume:
    """Where a list+watch picks up after its stream ended or broke.

    ``resource_version`` None: list first. Only a 410 Gone forgets the version (the one
    case where watching again from it cannot work); any other break (a refusal, a dropped
    connection, an API server restart, a line over the bound, what is not JSON) is a
    failure, and the watch resumes from the last version seen after :func:`backoff`.
    The failures count again from 0 once a list answered or the stream moved the version
    on (an event or a bookmark), or the server ended it."""

    resource_version: str | None = None
    failures: int = 0

    def listed(self, resource_version: str) -> None:
        self.resource_version = resource_version
        self.failures = 0

    def read(self, resource_version: str | None) -> None:
        """The stream stopped (ended or broke) after reading up to ``resource_version``."""
        if resource_version is not None and resource_version != self.resource_version:
            self.resource_version = resource_version
            self.failures = 0

    def ended(self) -> None:
        """The server ended the stream (its timeout): watch again at once."""
        self.failures = 0

    def gone(self) -> None:
        """410 Gone: list again, at once."""
        self.resource_version = None

    def failed(self) -> None:
        self.failures += 1

    def pause(self, draw: float) -> float:
        """Seconds to wait before the next attempt; ``draw`` in [0, 1)."""
        return backoff(self.failures, draw)
