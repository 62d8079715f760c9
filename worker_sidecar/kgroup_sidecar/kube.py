"""Kubernetes adapter of the sidecar: list+watch tasks and writes, all on the asyncio loop.

Everything runs in the sidecar's one event loop (:mod:`kgroup.apiclient`, aiohttp
straight to the API server): no threads. Each watch is a task that lists, hands the list to
``on_list``, then watches from the list's resourceVersion (with bookmarks) and hands every
event to ``on_event``: the list+watch loop the operator's Lease watch runs too
(:func:`kgroup.kube_watch.follow`: lines cut with one bound, the same spread backoff and
server-side timeout). A ``410 Gone`` re-lists; any other break (a refusal, an API server
restart, the network) re-watches from the last resourceVersion after the backoff; a
stream the server ended (its timeout) is simply watched again.

The watches are data (:func:`watches`): one :class:`WatchSpec` per watch.

- ``group``: the ConsumerGroup (field selector on its name);
- ``partition``: the partition Leases **this member cares about** (its target, what it
  holds, what it is acquiring), by a set-based label selector
  (``kgroup.dev/partition in (...)``). Watching every partition Lease of the group made
  each sidecar receive every other member's lock writes: O(members x partitions) watch
  events per rebalance, the measured scale limit (docs/design.md). The scope is decided
  by ``kgroup.core.member.converge`` (``next_watch_scope``: widen at once when the interest
  gains a partition, narrow only when the scope holds more than twice the interest) and
  handed over with ``set_partition_scope``; steady state never restarts the watch.
  A scope change cancels the partition watch's task (a quiet old stream is closed at
  once) and starts it again, which re-lists under the new selector (the list is
  authoritative only inside that scope, which ``on_list`` receives); an empty scope is an
  empty list and no watch; an interest beyond ``MAX_SELECTED_PARTITIONS`` watches the
  group's partition Leases whole.

No member Lease is watched (not even our own: the write answers tell us about it): the
operator is the failure detector and marks a lock whose holder's session it saw expire
(docs/design.md), so no sidecar receives another member's renewals.

Writes carry the request timeout each request has (the logic's ``request_timeout``: short
enough that a renewal whose answer is lost is retried before the fencing deadline), and
return the JSON of the object written, so the caller learns the new resourceVersion.
Requests about the member Lease (session start, renewal, end) go through a client of their
own, with its own connection pool: a member taking hundreds of partitions at once queues
those acquisitions in the shared pool, and a renewal queued behind them would miss its
deadline and fence the member.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from functools import partial

import aiohttp

from kgroup import kube_watch
from kgroup.apiclient import GROUPS, LEASES, ApiClient, ApiError, Gone, Resource, load_config
from kgroup.constants import (
    LABEL_GROUP,
    LABEL_PARTITION,
    LABEL_ROLE,
    ROLE_MEMBER,
    ROLE_PARTITION,
)
from kgroup.core import watch_stream as ws
from kgroup.core.lease_codec import slim
from kgroup.core.objects import Obj
from kgroup_sidecar.metrics import Metrics
from kgroup_sidecar.settings import Settings

log = logging.getLogger(__name__)

Scope = frozenset[int] | None
"""The partitions a list or watch covers; None: every partition Lease of the group."""
ListHandler = Callable[[str, list[Obj], Scope], None]
EventHandler = Callable[[str, str, Obj], None]

LIST_TIMEOUT = 10.0
LIST_PAGE = 250
"""Objects per list page: the peak of a list is one page decoded whole (≈ 1.2 MB of
Python objects for 250 locks) besides the slim objects kept so far."""
SHARED_CONNECTIONS = 16
SESSION_CONNECTIONS = 2


@dataclass(frozen=True)
class WatchSpec:
    """One list+watch: the kind the logic knows it by, the resource, its selectors;
    ``scoped``: the partition watch, whose label selector follows the scope."""

    kind: str
    resource: Resource
    label_selector: str | None = None
    field_selector: str | None = None
    scoped: bool = False


def watches(group: str) -> list[WatchSpec]:
    """What a sidecar watches (dropping a watch is dropping its line)."""
    return [
        WatchSpec("group", GROUPS, field_selector=f"metadata.name={group}"),
        WatchSpec("partition", LEASES, scoped=True),
    ]


def partition_selector(group: str, scope: Scope) -> str:
    base = f"{LABEL_GROUP}={group},{LABEL_ROLE}={ROLE_PARTITION}"
    if scope is None:
        return base
    return f"{base},{LABEL_PARTITION} in ({','.join(str(p) for p in sorted(scope))})"


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an API error, or None when the server was not reached."""
    if isinstance(exc, ApiError):
        return exc.status
    return None


class KubeAdapter:
    """The sidecar's watches and Lease requests. ``api``/``session_api``: clients to share
    (the swarm's members share one pair); by default the adapter makes its own, inside the
    loop, on first use, and :meth:`aclose` closes them."""

    def __init__(
        self,
        settings: Settings,
        *,
        loop: asyncio.AbstractEventLoop,
        on_list: ListHandler,
        on_event: EventHandler,
        metrics: Metrics,
        watch_all_partitions: bool = False,
        api: ApiClient | None = None,
        session_api: ApiClient | None = None,
    ) -> None:
        self.settings = settings
        self.namespace = settings.namespace
        self._loop = loop
        self._on_list = on_list
        self._on_event = on_event
        self._metrics = metrics
        self._api, self._session_api = api, session_api
        self._own_clients = api is None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._specs = {w.kind: w for w in watches(settings.group)}
        self._stopped = False
        self._scope: Scope = None if watch_all_partitions else frozenset()
        self._whole = watch_all_partitions
        self.scope_changes = 0

    def _clients(self) -> tuple[ApiClient, ApiClient]:
        if self._api is None or self._session_api is None:
            config = load_config(self.settings.kubeconfig)
            self._api = ApiClient(config, connections=SHARED_CONNECTIONS)
            self._session_api = ApiClient(config, connections=SESSION_CONNECTIONS)
        return self._api, self._session_api

    @property
    def api(self) -> ApiClient:
        """The shared client (Events go through it too)."""
        return self._clients()[0]

    # ---- watches --------------------------------------------------------------------

    def start(self) -> None:
        self._clients()
        for spec in self._specs.values():
            self._start_watch(spec)

    def _start_watch(self, spec: WatchSpec) -> None:
        self._tasks[spec.kind] = self._loop.create_task(self._watch_forever(spec),
                                                        name=f"watch-{spec.kind}")

    def stop(self) -> None:
        self._stopped = True
        for task in self._tasks.values():
            task.cancel()

    async def aclose(self) -> None:
        """Stop, and close the clients this adapter made."""
        self.stop()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        if self._own_clients:
            for api in (self._api, self._session_api):
                if api is not None:
                    await api.close()

    def set_partition_scope(self, scope: Scope) -> None:
        """The partition Leases to watch (the logic's scope, handed over after each tick);
        a new scope restarts the partition watch with a re-list."""
        if self._whole or scope == self._scope:
            return
        self._scope = scope
        self.scope_changes += 1
        spec = next((s for s in self._specs.values() if s.scoped), None)
        task = self._tasks.get(spec.kind) if spec is not None else None
        if spec is None or task is None or self._stopped:
            return  # not started yet: start() lists the current scope
        task.cancel()  # closes its stream; the new task lists under the new selector
        self._start_watch(spec)

    def _selection(self, spec: WatchSpec) -> tuple[Scope, dict[str, str | None]]:
        if not spec.scoped:
            return None, {"label_selector": spec.label_selector,
                          "field_selector": spec.field_selector}
        return self._scope, {"label_selector": partition_selector(self.settings.group,
                                                                  self._scope)}

    async def _watch_forever(self, spec: WatchSpec) -> None:
        api = self._clients()[0]
        kind = spec.kind
        scope, selection = self._selection(spec)
        if spec.scoped and scope == frozenset():
            self._on_list(kind, [], scope)  # nothing of interest: an empty list, no watch
            return
        query = {"labelSelector": selection.get("label_selector"),
                 "fieldSelector": selection.get("field_selector")}

        def open_(params: dict[str, str], timeout: aiohttp.ClientTimeout
                  ) -> AbstractAsyncContextManager[aiohttp.ClientResponse]:
            return api.open_watch(spec.resource, self.namespace, {**query, **params},
                                  timeout=timeout)

        await kube_watch.follow(partial(self._list, api, spec, selection, scope), open_,
                                partial(self._on_event, kind), loads=json.loads, name=kind,
                                log=log)

    async def _list(self, api: ApiClient, spec: WatchSpec, selection: dict[str, str | None],
                    scope: Scope) -> str:
        """One list, in pages of :data:`LIST_PAGE` objects, each object without its
        ``managedFields`` (:func:`~kgroup.core.lease_codec.slim`), handed whole to
        ``on_list``; -> its resourceVersion (a page's token gone stale is a 410: the watch
        loop lists again). A member's 1,000 locks decoded in one answer were ≈ 5 MB of
        Python objects at once (tracemalloc), and kept in the watch's frame they lived as
        long as the watch: a function of its own drops every page when it returns."""
        items: list[Obj] = []
        token: str | None = None
        while True:
            try:
                page = await api.list(spec.resource, self.namespace, timeout=LIST_TIMEOUT,
                                      limit=LIST_PAGE, continue_token=token, **selection)
            except Gone as exc:  # a page's token gone stale: list again, at once
                raise ws.Gone(exc.status, exc.reason) from exc
            items.extend(slim(o) for o in page.get("items") or [])
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                break
        self._on_list(spec.kind, items, scope)
        return str(meta["resourceVersion"])

    # ---- reads and writes -----------------------------------------------------------

    def _via(self, session: bool) -> ApiClient:
        shared, own = self._clients()
        return own if session else shared

    async def get_lease(self, name: str, *, timeout: float, session: bool = False) -> Obj | None:
        return await self._via(session).get(LEASES, self.namespace, name, timeout=timeout)

    async def create_lease(self, body: Obj, *, timeout: float) -> Obj:
        self._metrics.api_write("create")
        return await self._via(_is_member_lease(body)).create(
            LEASES, self.namespace, body, timeout=timeout)

    async def replace_lease(self, body: Obj, *, timeout: float) -> Obj:
        """PUT with ``metadata.resourceVersion`` in the body: a conditional update."""
        self._metrics.api_write("update")
        return await self._via(_is_member_lease(body)).replace(
            LEASES, self.namespace, body, timeout=timeout)

    async def delete_lease(self, name: str, *, timeout: float,
                           resource_version: str | None = None, session: bool = False) -> None:
        """Delete (only that resourceVersion, when given); a Lease already gone is fine."""
        self._metrics.api_write("delete")
        await self._via(session).delete(LEASES, self.namespace, name, timeout=timeout,
                                        resource_version=resource_version)


def _is_member_lease(body: Obj) -> bool:
    return bool(((body.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE) == ROLE_MEMBER)
