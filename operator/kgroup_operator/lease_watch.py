"""The Leases of one ConsumerGroup: listed, then watched, by their group label, outside kopf.

Why not a kopf handler on every Lease, as for the other resources:

* **Memory** (issue 26): kopf watches a resource whole (a label filter is applied in the
  process) and keeps a memory per object it sees, so every Lease a worker creates naming
  a group that does not exist (a member Lease is theirs to create) would cost the one
  operator memory: 5,000 of them grew it by 76 MB, and a restart listed them all (271 MB,
  over the chart's 256 MiB limit: an OOM-kill loop). One watch per existing group,
  selected by ``kgroup.dev/group=<name>`` on the server, reads only the Leases of groups
  that exist; it starts when the group is seen and stops when it is deleted, and its first
  listing is what the group's loop waits for (no pass plans against a half-listed group).
* **CPU** (issue 25): a group's member Leases are renewed by every member every renew
  interval (1,000 members at the default 2 s: 500 events/s), and kopf spends far more per
  event than the cache does (its body wrappers, a deep copy of the body for its diff base,
  per-object loggers and throttler). A renewal that changes nothing material must cost
  almost nothing (``GroupLeases.put``), so the stream is read line by line, each event
  ``json.loads``-ed and handed to the loop in batches (at most one wake-up of the loop per
  ``BATCH_SECONDS``, not one per event).

A watch runs in a thread of its own (the Kubernetes client blocks; the shared pool of
``asyncio.to_thread`` must stay free for the writes) with an API client of its own (its
connection is held for the watch's life). List, then watch from the list's
resourceVersion (bookmarks keep it fresh); a 410 Gone lists again, any other break
re-watches after a short backoff. Nothing polls.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from kgroup import constants as C

log = logging.getLogger(__name__)

Obj = dict[str, Any]
WATCH_SECONDS = 300
BATCH_SECONDS = 0.1
"""Events are handed to the loop at most this often: one wake-up of the loop per batch
(renewals arrive spread out; handed over one by one, each woke the loop)."""
BACKOFF_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)


class Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class LeaseWatch:
    """List and watch the Leases labelled ``kgroup.dev/group=<group>`` in ``namespace``;
    ``on_list(items)`` after each listing, ``on_event(type, lease)`` per event, both
    called on ``loop``, in the order they arrived."""

    def __init__(self, api: client.ApiClient, namespace: str, group: str, *,
                 loop: asyncio.AbstractEventLoop, on_list: Callable[[list[Obj]], None],
                 on_event: Callable[[str, Obj], None]) -> None:
        self.api = client.ApiClient(configuration=api.configuration)
        self.coord = client.CoordinationV1Api(self.api)
        self.namespace = namespace
        self.group = group
        self.selector = f"{C.LABEL_GROUP}={group}"
        self.loop = loop
        self.on_list = on_list
        self.on_event = on_event
        self.events = 0
        self._stop = threading.Event()
        self._started = False
        self._lock = threading.Lock()
        self._pending: list[tuple[str, Any]] = []
        self._scheduled = False
        self._responses: set[Any] = set()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"leases:{namespace}/{group}")

    def alive(self) -> bool:
        """False once the watch's thread ended without being asked to stop."""
        return self._stop.is_set() or self._thread.is_alive() or not self._started

    def start(self) -> None:
        self._started = True
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        for resp in list(self._responses):
            try:
                resp.shutdown() if hasattr(resp, "shutdown") else resp.close()
            except Exception as exc:  # already closed
                log.debug("lease watch: closing the stream: %s", exc)

    # ---- the loop side -------------------------------------------------------------------

    def _push(self, kind: str, payload: Any) -> None:
        if self._stop.is_set():
            return
        with self._lock:
            self._pending.append((kind, payload))
            if self._scheduled:
                return
            self._scheduled = True
        self.loop.call_soon_threadsafe(self.loop.call_later, BATCH_SECONDS, self._flush)

    def _flush(self) -> None:
        with self._lock:
            batch, self._pending, self._scheduled = self._pending, [], False
        if self._stop.is_set():
            return
        for kind, payload in batch:
            try:
                if kind == "LIST":
                    self.on_list(payload)
                else:
                    self.on_event(kind, payload)
            except Exception:
                log.exception("Leases of %s/%s: handling a %s failed", self.namespace,
                              self.group, kind)

    # ---- the thread side -----------------------------------------------------------------

    def _call(self, **kw: Any) -> Any:
        return self.coord.list_namespaced_lease(
            self.namespace, label_selector=self.selector, _preload_content=False, **kw)

    def _run(self) -> None:
        failures = 0
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    raw = self._call(_request_timeout=(3, 60))
                    body = json.loads(raw.data)
                    rv = body["metadata"]["resourceVersion"]
                    self._push("LIST", list(body.get("items") or []))
                rv = self._watch(rv)
                failures = 0
            except Gone:
                log.info("Leases of %s/%s: watch expired (410 Gone); listing again",
                         self.namespace, self.group)
                rv = None
                continue
            except ApiException as exc:
                if exc.status == 410:
                    rv = None
                    continue
                failures += 1
                log.warning("Leases of %s/%s: %s %s; retrying", self.namespace, self.group,
                            exc.status, exc.reason)
                rv = None
            except Exception as exc:  # the API server went away: urllib3, socket, ssl errors
                if self._stop.is_set():
                    break
                failures += 1
                log.warning("Leases of %s/%s: watch broke (%s); retrying", self.namespace,
                            self.group, type(exc).__name__)
            if failures:  # backoff between reconnects only: events are waited for
                self._stop.wait(BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS)) - 1])
        self.api.close()  # type: ignore[no-untyped-call]

    def _watch(self, rv: str) -> str | None:
        """One watch request until the server ends it; the version to resume from."""
        resp = self._call(watch=True, resource_version=rv, allow_watch_bookmarks=True,
                          timeout_seconds=WATCH_SECONDS,
                          _request_timeout=(3, WATCH_SECONDS + 30))
        self._responses.add(resp)
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    return None
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.events += 1
                    self._push(str(kind), obj)
        finally:
            self._responses.discard(resp)
            resp.release_conn()
        return rv
