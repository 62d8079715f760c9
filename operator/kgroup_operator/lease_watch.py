"""The operator's list+watch of kgroup Leases, outside kopf.

Why not a kopf handler like the other resources: a group's member Leases are renewed by
every member every renew interval (1,000 members at the default 2 s: 500 events/s), and
kopf spends far more per event than the cache does (its body wrappers, a deep copy of the
body for its diff base, per-object loggers and throttler, the patch application). A renewal
that changes nothing material must cost almost nothing (``GroupLeases.put``), so Leases
come through this thin watch instead: the blocking client in one thread per namespace
scope reads the stream line by line, ``json.loads`` each event and hands the events to
the loop in batches (at most one wake-up of the loop per ``BATCH_SECONDS``, not one per
event).

List, then watch from the list's resourceVersion (bookmarks keep it fresh); a 410 Gone
re-lists, any other break re-watches after a short backoff. A listing is authoritative
on which Leases exist (``GroupLoops.leases_listed``). Nothing polls.
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
ListHandler = Callable[[str | None, list[Obj]], None]  # (namespace scope, items)
EventHandler = Callable[[str, Obj], None]  # (ADDED | MODIFIED | DELETED, object)


class Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class LeaseWatch:
    def __init__(self, api: client.ApiClient, scopes: list[str | None], *,
                 loop: asyncio.AbstractEventLoop, on_list: ListHandler,
                 on_event: EventHandler) -> None:
        self.coord = client.CoordinationV1Api(api)
        self.scopes = scopes
        self.loop = loop
        self.on_list = on_list
        self.on_event = on_event
        self.events = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pending: list[tuple[str, Any, Any]] = []
        self._scheduled = False
        self._responses: set[Any] = set()

    def start(self) -> None:
        for scope in self.scopes:
            threading.Thread(target=self._run, args=(scope,), daemon=True,
                             name=f"lease-watch-{scope or 'all'}").start()

    def stop(self) -> None:
        self._stop.set()
        for resp in list(self._responses):
            try:
                resp.shutdown() if hasattr(resp, "shutdown") else resp.close()
            except Exception as exc:  # already closed
                log.debug("lease watch: closing the stream: %s", exc)

    # ---- the loop side -------------------------------------------------------------------

    def _push(self, kind: str, a: Any, b: Any) -> None:
        with self._lock:
            self._pending.append((kind, a, b))
            if self._scheduled:
                return
            self._scheduled = True
        self.loop.call_soon_threadsafe(self.loop.call_later, BATCH_SECONDS, self._flush)

    def _flush(self) -> None:
        with self._lock:
            batch, self._pending, self._scheduled = self._pending, [], False
        for kind, a, b in batch:
            try:
                if kind == "LIST":
                    self.on_list(a, b)
                else:
                    self.on_event(kind, b)
            except Exception:
                log.exception("lease watch: handling a %s failed", kind)

    # ---- the thread side -----------------------------------------------------------------

    def _call(self, scope: str | None, **kw: Any) -> Any:
        kw = {"label_selector": C.LABEL_GROUP, "_preload_content": False, **kw}
        if scope is None:
            return self.coord.list_lease_for_all_namespaces(**kw)
        return self.coord.list_namespaced_lease(scope, **kw)

    def _run(self, scope: str | None) -> None:
        failures = 0
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    raw = self._call(scope, _request_timeout=(3, 60))
                    body = json.loads(raw.data)
                    rv = body["metadata"]["resourceVersion"]
                    self._push("LIST", scope, list(body.get("items") or []))
                rv = self._watch(scope, rv)
                failures = 0
            except Gone:
                log.info("lease watch of %s expired (410 Gone): re-listing", scope or "all")
                rv = None
                continue
            except ApiException as exc:
                if exc.status == 410:
                    rv = None
                    continue
                failures += 1
                log.warning("lease watch of %s failed (%s %s); retrying", scope or "all",
                            exc.status, exc.reason)
            except Exception as exc:  # the API server went away: urllib3, socket, ssl errors
                if self._stop.is_set():
                    break
                failures += 1
                log.warning("lease watch of %s broke (%s); retrying", scope or "all",
                            type(exc).__name__)
            if failures:  # backoff between reconnects only: events are waited for
                self._stop.wait(BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS)) - 1])

    def _watch(self, scope: str | None, rv: str) -> str:
        """One watch request until the server ends it; returns the newest resourceVersion."""
        resp = self._call(scope, watch=True, resource_version=rv,
                          allow_watch_bookmarks=True, timeout_seconds=WATCH_SECONDS,
                          _request_timeout=(3, WATCH_SECONDS + 30))
        self._responses.add(resp)
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    break
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
                    self._push(kind, None, obj)
        finally:
            self._responses.discard(resp)
            resp.release_conn()
        return rv
