"""Kubernetes adapter of the sidecar: two watch threads feeding the asyncio loop, and
blocking writes run in worker threads.

Why threads: the official ``kubernetes`` client is synchronous. Each watch runs
list-then-watch in its own daemon thread and hands every event to the loop with
``call_soon_threadsafe``; the loop alone touches the state. A ``410 Gone`` re-lists; a
broken stream (API server restart, network) re-watches from the last resourceVersion after
a short backoff. The two watches:

- ``group``: the ConsumerGroup (field selector on its name);
- ``partition``: the partition Leases **this member cares about** (its target, what it
  holds, what it is acquiring), by a set-based label selector
  (``kgroup.dev/partition in (...)``). Watching every partition Lease of the group made
  each sidecar receive every other member's lock writes: O(members x partitions) watch
  events per rebalance, the measured scale limit (docs/design.md). The scope is decided
  by ``kgroup.core.sidecar_logic`` (``next_watch_scope``: widen at once when the interest
  gains a partition, narrow only when the scope holds more than twice the interest) and
  handed over with ``set_partition_scope``; steady state never restarts the watch.
  A scope change re-lists under the new selector (the list is authoritative only inside
  that scope, which ``on_list`` receives) and shuts the old stream's socket so a quiet
  stream does not linger; an interest beyond ``MAX_SELECTED_PARTITIONS`` watches the
  group's partition Leases whole.

No member Lease is watched (not even our own: the write answers tell us about it): the
operator is the failure detector and marks a lock whose holder's session it saw expire
(docs/design.md), so no sidecar receives another member's renewals.

Writes go through worker threads with the request timeout each request carries (the
logic's ``request_timeout``: short enough that a renewal whose answer is lost is retried
before the fencing deadline), and return the raw JSON of the object written, so the
caller learns the new resourceVersion. Writes of the member Lease (session start,
renewal, end) have a thread of their own: a member taking hundreds
of partitions at once queues those acquisitions in the shared pool, and a renewal queued
behind them would miss its deadline and fence the member.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from kgroup.constants import (
    API_GROUP,
    API_VERSION,
    LABEL_GROUP,
    LABEL_PARTITION,
    LABEL_ROLE,
    PLURAL,
    ROLE_MEMBER,
    ROLE_PARTITION,
)
from kgroup_sidecar.metrics import Metrics
from kgroup_sidecar.settings import Settings

log = logging.getLogger(__name__)

Obj = dict[str, Any]
T = TypeVar("T")
Scope = frozenset[int] | None
"""The partitions a list or watch covers; None: every partition Lease of the group."""
ListHandler = Callable[[str, list[Obj], Scope], None]
EventHandler = Callable[[str, str, Obj], None]

WATCH_SECONDS = 240
watch_factory: Any = watch.Watch
BACKOFF_SECONDS = (0.2, 0.5, 1.0, 2.0)
def partition_selector(group: str, scope: Scope) -> str:
    base = f"{LABEL_GROUP}={group},{LABEL_ROLE}={ROLE_PARTITION}"
    if scope is None:
        return base
    return f"{base},{LABEL_PARTITION} in ({','.join(str(p) for p in sorted(scope))})"


def make_configuration(settings: Settings) -> client.Configuration:
    cfg = client.Configuration()
    loader: Any = config  # the loaders carry no type hints
    if settings.kubeconfig:
        loader.load_kube_config(config_file=settings.kubeconfig, client_configuration=cfg)
    else:
        loader.load_incluster_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = 16
    cfg.retries = False
    return cfg


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an API error, or None when the server was not reached."""
    if isinstance(exc, ApiException) and exc.status:
        return int(exc.status)
    return None


class KubeAdapter:
    def __init__(
        self,
        settings: Settings,
        *,
        loop: asyncio.AbstractEventLoop,
        on_list: ListHandler,
        on_event: EventHandler,
        metrics: Metrics,
        watch_all_partitions: bool = False,
    ) -> None:
        self.settings = settings
        self.namespace = settings.namespace
        self._loop = loop
        self._on_list = on_list
        self._on_event = on_event
        self._metrics = metrics
        self._cfg = make_configuration(settings)
        self._writer = client.ApiClient(self._cfg)
        # Any: called with raw dict bodies and _preload_content=False (raw JSON back).
        self._leases: Any = client.CoordinationV1Api(self._writer)
        self._stop = threading.Event()
        self._watches: list[Any] = []
        self._session_writes = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="session-write")
        # The partition watch's scope: guarded by _scope_changed's lock; a new generation
        # makes the watch thread re-list under the new selector.
        self._scope_changed = threading.Condition()
        self._scope: Scope = None if watch_all_partitions else frozenset()
        self._whole = watch_all_partitions
        self._scope_gen = 0
        self.scope_changes = 0

    # ---- watches --------------------------------------------------------------------

    def start(self) -> None:
        group_api = client.CustomObjectsApi(client.ApiClient(self._cfg))
        lease_api = client.CoordinationV1Api(client.ApiClient(self._cfg))
        group_field = f"metadata.name={self.settings.group}"

        def list_groups(**kw: Any) -> Any:
            return group_api.list_namespaced_custom_object(
                API_GROUP, API_VERSION, self.namespace, PLURAL, field_selector=group_field, **kw
            )

        def list_partitions(**kw: Any) -> Any:
            return lease_api.list_namespaced_lease(self.namespace, **kw)

        for kind, fn in (("group", list_groups), ("partition", list_partitions)):
            thread = threading.Thread(
                target=self._watch_forever, args=(kind, fn), name=f"watch-{kind}", daemon=True
            )
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._scope_changed:
            self._scope_changed.notify_all()
        for w in list(self._watches):
            w.stop()
        self._session_writes.shutdown(wait=False, cancel_futures=True)

    def set_partition_scope(self, scope: Scope) -> None:
        """The partition Leases to watch (the logic's scope, handed over after each tick);
        a new scope restarts the partition watch with a re-list."""
        if self._whole:
            return
        with self._scope_changed:
            if scope == self._scope:
                return
            self._scope = scope
            self._scope_gen += 1
            self.scope_changes += 1
            self._scope_changed.notify_all()
        for w in list(self._watches):
            if getattr(w, "kgroup_kind", None) == "partition":
                w.stop()
                # Unblock a read waiting on a quiet stream (urllib3 >= 2.3; ``_resp`` is the
                # client's Watch's own). Without it a quiet old stream would hold the new
                # scope back until its next event or its timeout. The stream may already be
                # gone (ENOTCONN): the thread then re-lists on its own.
                resp = getattr(w, "_resp", None)
                try:
                    if resp is not None and hasattr(resp, "shutdown"):
                        resp.shutdown()
                except Exception as exc:
                    log.debug("partition watch: shutting the old stream failed: %s", exc)

    def _current_scope(self, kind: str) -> tuple[int, Scope, dict[str, Any]]:
        """(generation, scope, list/watch arguments) of a watch; the fixed watches have
        generation 0 and no scope."""
        if kind != "partition":
            return 0, None, {}
        with self._scope_changed:
            while not self._stop.is_set() and self._scope == frozenset():
                # Nothing of interest: an empty list, then wait for an interest.
                empty_gen = self._scope_gen
                self._emit_list(kind, [], frozenset())
                while not self._stop.is_set() and self._scope_gen == empty_gen:
                    self._scope_changed.wait()
            gen, scope = self._scope_gen, self._scope
        return gen, scope, {"label_selector": partition_selector(self.settings.group, scope)}

    def _scope_moved(self, kind: str, gen: int) -> bool:
        return kind == "partition" and self._scope_gen != gen

    def _emit_list(self, kind: str, items: list[Obj], scope: Scope) -> None:
        self._loop.call_soon_threadsafe(self._on_list, kind, items, scope)

    def _emit_event(self, kind: str, event_type: str, obj: Obj) -> None:
        self._loop.call_soon_threadsafe(self._on_event, kind, event_type, obj)

    def _watch_forever(self, kind: str, list_fn: Callable[..., Any]) -> None:
        failures = 0
        resource_version: str | None = None
        listed_gen, gen = -1, 0
        while not self._stop.is_set():
            try:
                gen, scope, selection = self._current_scope(kind)
                if self._stop.is_set():
                    break
                if gen != listed_gen:
                    resource_version = None  # a new scope: list it afresh
                if resource_version is None:
                    raw = list_fn(_preload_content=False, _request_timeout=(3, 10), **selection)
                    body = json.loads(raw.data)
                    resource_version = body["metadata"]["resourceVersion"]
                    listed_gen = gen
                    self._emit_list(kind, list(body.get("items") or []), scope)
                w: Any = watch_factory()
                w.kgroup_kind = kind
                self._watches.append(w)
                try:
                    if self._scope_moved(kind, gen):
                        continue  # the scope changed during the list: re-list at once
                    for event in w.stream(
                        list_fn,
                        resource_version=resource_version,
                        timeout_seconds=WATCH_SECONDS,
                        allow_watch_bookmarks=True,
                        _request_timeout=(3, WATCH_SECONDS + 10),
                        **selection,
                    ):
                        if self._stop.is_set() or self._scope_moved(kind, gen):
                            break
                        failures = 0
                        raw_obj: Obj = event["raw_object"]
                        rv = (raw_obj.get("metadata") or {}).get("resourceVersion")
                        if rv:
                            resource_version = rv
                        if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                            self._emit_event(kind, event["type"], raw_obj)
                finally:
                    self._watches.remove(w)
                if self._scope_moved(kind, gen):
                    continue
            except ApiException as exc:
                if exc.status == 410:
                    log.info("watch of %s expired (410 Gone): re-listing", kind)
                    resource_version = None
                    continue
                failures += 1
                log.warning("watch of %s failed (%s %s); retrying", kind, exc.status, exc.reason)
            except Exception as exc:  # the API server went away: urllib3, socket, ssl errors
                if self._scope_moved(kind, gen):
                    continue  # our own shutdown of the old stream
                failures += 1
                log.warning("watch of %s broke (%s); retrying", kind, type(exc).__name__)
            if not self._stop.is_set():
                # Backoff between reconnects only: events are waited for, never polled.
                self._stop.wait(BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)])

    # ---- reads and writes -----------------------------------------------------------

    async def _call(self, call: Callable[[], T], *, session: bool) -> T:
        """Run a blocking request in a worker thread: the member Lease's own thread for
        session writes, the shared pool for the rest."""
        if session:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._session_writes, call)
        return await asyncio.to_thread(call)

    async def get_lease(self, name: str, *, timeout: float, session: bool = False) -> Obj | None:
        def call() -> Obj | None:
            try:
                raw = self._leases.read_namespaced_lease(
                    name, self.namespace, _preload_content=False,
                    _request_timeout=_limits(timeout),
                )
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            result: Obj = json.loads(raw.data)
            return result

        return await self._call(call, session=session)

    async def create_lease(self, body: Obj, *, timeout: float) -> Obj:
        def call() -> Obj:
            raw = self._leases.create_namespaced_lease(
                self.namespace, body, _preload_content=False, _request_timeout=_limits(timeout)
            )
            result: Obj = json.loads(raw.data)
            return result

        self._metrics.api_write("create")
        return await self._call(call, session=_is_member_lease(body))

    async def replace_lease(self, body: Obj, *, timeout: float) -> Obj:
        """PUT with ``metadata.resourceVersion`` in the body: a conditional update."""
        name = body["metadata"]["name"]

        def call() -> Obj:
            raw = self._leases.replace_namespaced_lease(
                name, self.namespace, body, _preload_content=False,
                _request_timeout=_limits(timeout),
            )
            result: Obj = json.loads(raw.data)
            return result

        self._metrics.api_write("update")
        return await self._call(call, session=_is_member_lease(body))

    async def delete_lease(self, name: str, *, timeout: float,
                           resource_version: str | None = None, session: bool = False) -> None:
        def call() -> None:
            options = client.V1DeleteOptions(
                preconditions=client.V1Preconditions(resource_version=resource_version)
                if resource_version
                else None
            )
            try:
                self._leases.delete_namespaced_lease(
                    name, self.namespace, body=options, _request_timeout=_limits(timeout)
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise

        self._metrics.api_write("delete")
        await self._call(call, session=session)


def _limits(timeout: float) -> tuple[float, float]:
    """(connect, total) limits of a request that may wait ``timeout`` seconds in all."""
    return (min(2.0, timeout), timeout)


def _is_member_lease(body: Obj) -> bool:
    return bool(((body.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE) == ROLE_MEMBER)
