"""The Leases of one ConsumerGroup: listed, then watched, by their group label.

Why not a kopf handler on every Lease: kopf watches a resource whole (a label filter is
applied in the process) and keeps a memory per object it sees, so every Lease a worker
creates naming a group that does not exist (a member Lease is theirs to create) would
cost the one operator memory: 5,000 of them grew it by 76 MB, and a restart listed them
all (271 MB, over the chart's 256 MiB limit: an OOM-kill loop; issue 26). One watch per
existing group, selected by ``kgroup.dev/group=<name>`` on the server, reads only the
Leases of groups that exist; it starts when the group is seen and stops when it is
deleted, and its first listing is what the group's loop waits for (no pass plans against
a half-listed group).

A watch runs in a thread of its own (the Kubernetes client blocks; the shared pool of
``asyncio.to_thread`` must stay free for the writes) with an API client of its own (its
connection is held for the watch's life) and hands each listing and event to the event
loop. A watch that ends is resumed from the last resourceVersion seen; an error or an
expired version (410) lists again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from kgroup import constants as C

log = logging.getLogger(__name__)

Obj = dict[str, Any]
WATCH_SECONDS = 300
RETRY_SECONDS = 2.0


class LeaseWatch:
    """List and watch the Leases labelled ``kgroup.dev/group=<group>`` in ``namespace``;
    ``on_list(items)`` after each listing, ``on_event(type, lease)`` per event, both
    called on ``loop``."""

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
        self._stop = threading.Event()
        self._started = False
        self._watch: watch.Watch | None = None
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
        if self._watch is not None:
            self._watch.stop()  # type: ignore[no-untyped-call]

    def _hand(self, fn: Callable[..., None], *args: Any) -> None:
        if not self._stop.is_set():
            self.loop.call_soon_threadsafe(fn, *args)

    def _run(self) -> None:
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    listing: Any = self.coord.list_namespaced_lease(
                        self.namespace, label_selector=self.selector, _request_timeout=60)
                    items = [self.api.sanitize_for_serialization(x)  # type: ignore[no-untyped-call]
                             for x in listing.items]
                    rv = listing.metadata.resource_version
                    self._hand(self.on_list, items)
                rv = self._follow(rv)
            except ApiException as exc:
                if exc.status != 410:
                    log.warning("Leases of %s/%s: %s; listing again", self.namespace,
                                self.group, exc.reason)
                    self._stop.wait(RETRY_SECONDS)
                rv = None
            except Exception as exc:
                if self._stop.is_set():
                    break
                log.warning("Leases of %s/%s: watch broke (%s); listing again",
                            self.namespace, self.group, type(exc).__name__)
                self._stop.wait(RETRY_SECONDS)
                rv = None
        self.api.close()  # type: ignore[no-untyped-call]

    def _follow(self, rv: str) -> str | None:
        """Watch from ``rv`` until the watch ends; the version to resume from (None: list
        again)."""
        w = watch.Watch()  # type: ignore[no-untyped-call]
        self._watch = w
        for event in w.stream(  # type: ignore[no-untyped-call]
                self.coord.list_namespaced_lease, self.namespace,
                              label_selector=self.selector, resource_version=rv,
                              timeout_seconds=WATCH_SECONDS, allow_watch_bookmarks=True,
                              _request_timeout=WATCH_SECONDS + 30):
            if self._stop.is_set():
                return None
            kind = event.get("type")
            raw: Obj = event.get("raw_object") or {}
            if kind == "ERROR":
                return None
            rv = str((raw.get("metadata") or {}).get("resourceVersion") or rv)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._hand(self.on_event, str(kind), raw)
        return rv
