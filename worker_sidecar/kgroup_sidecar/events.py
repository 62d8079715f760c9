"""Kubernetes Events on the sidecar's own pod, so ``kubectl describe pod`` tells what
happened to a member: ``Fenced``, ``PartitionLost``, ``HandoffTimedOut`` (posted by
:class:`~kgroup_sidecar.runtime.Sidecar`), and whatever else calls :meth:`EventPoster.post`
(e.g. a stalled partition: ``post("Warning", "PartitionStalled", "...")``).

core/v1 Events, as client-go's EventRecorder writes them: the same reason and message
again within :data:`AGGREGATE_SECONDS` patches the first Event's ``count`` and
``lastTimestamp`` instead of creating another, so a flapping member costs one object, not
one per flap. ``involvedObject`` names the pod with its uid (``KGROUP_POD_UID`` from the
downward API): ``kubectl describe pod`` lists only Events whose uid matches. Posting is
best effort and never blocks the loop: the calls run as their own tasks and a failure is
only logged (an Event must not cost a lock). The worker Role allows ``events`` create and
patch in the pod's namespace (charts/kgroup/templates/_worker-rbac.tpl).

The bodies and the aggregation rule are pure (:func:`event_body`, :class:`Aggregator`), so
they are tested without I/O; the posting itself against the real API server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kgroup.apiclient import EVENTS, ApiClient, ApiError

log = logging.getLogger(__name__)

AGGREGATE_SECONDS = 600.0
COMPONENT = "kgroup-sidecar"
REPORTING_COMPONENT = "kgroup.dev/sidecar"
MAX_MESSAGE = 1024
REQUEST_TIMEOUT = 10.0


@dataclass(frozen=True)
class Pod:
    """The pod the Events are about."""

    namespace: str
    name: str
    uid: str | None = None


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(pod: Pod, *, type_: str, reason: str, message: str, now: datetime) -> dict[str, Any]:
    """A new core/v1 Event about ``pod`` (count 1, first = last timestamp = ``now``)."""
    involved: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "name": pod.name,
                                "namespace": pod.namespace}
    if pod.uid:
        involved["uid"] = pod.uid
    stamp = _stamp(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
        "involvedObject": involved,
        "type": type_,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": REPORTING_COMPONENT,
        "reportingInstance": pod.name[:128],
    }


@dataclass
class _Seen:
    name: str
    count: int
    first_seen: float


class Aggregator:
    """Which Event a repeat should patch: one per (type, reason, message) for
    :data:`AGGREGATE_SECONDS` after it was created."""

    def __init__(self, window: float = AGGREGATE_SECONDS) -> None:
        self.window = window
        self._seen: dict[tuple[str, str, str], _Seen] = {}

    def repeat_of(self, key: tuple[str, str, str], now: float) -> _Seen | None:
        seen = self._seen.get(key)
        if seen is None or now - seen.first_seen >= self.window:
            self._seen.pop(key, None)
            return None
        return seen

    def created(self, key: tuple[str, str, str], name: str, now: float) -> None:
        self._seen[key] = _Seen(name, 1, now)
        for k in [k for k, s in self._seen.items() if now - s.first_seen >= self.window]:
            del self._seen[k]


class EventPoster:
    """Posts Events on one pod through ``api`` (the sidecar's shared client), aggregating
    repeats."""

    def __init__(self, api: ApiClient, pod: Pod, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._api = api
        self.pod = pod
        self._clock = clock
        self._wall = wall
        self._aggregator = Aggregator()
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[str | None]] = set()

    async def post(self, type_: str, reason: str, message: str) -> str | None:
        """Create the Event, or patch the count of the same one posted shortly before.
        Returns the Event's name, or None when the API refused or could not be reached."""
        key = (type_, reason, message[:MAX_MESSAGE])
        async with self._lock:  # one at a time: a repeat must see the first one's name
            now = self._clock()
            seen = self._aggregator.repeat_of(key, now)
            try:
                if seen is not None:
                    seen.count += 1
                    patch = {"count": seen.count, "lastTimestamp": _stamp(self._wall())}
                    await self._api.patch(EVENTS, self.pod.namespace, seen.name, patch,
                                          timeout=REQUEST_TIMEOUT)
                    return seen.name
                body = event_body(self.pod, type_=type_, reason=reason, message=message,
                                  now=self._wall())
                created = await self._api.create(EVENTS, self.pod.namespace, body,
                                                 timeout=REQUEST_TIMEOUT)
                name = str(created["metadata"]["name"])
                self._aggregator.created(key, name, now)
                return name
            except ApiError as exc:
                log.warning("could not post Event %s on pod %s: %s %s", reason, self.pod.name,
                            exc.status, exc.reason)
            except Exception as exc:  # unreachable API server: the log line is all we can do
                log.warning("could not post Event %s on pod %s: %s", reason, self.pod.name,
                            type(exc).__name__)
            return None

    def post_soon(self, type_: str, reason: str, message: str) -> None:
        """:meth:`post` from synchronous code running in the loop (fire and forget)."""
        task = asyncio.get_running_loop().create_task(self.post(type_, reason, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the Events still being posted (at exit)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
