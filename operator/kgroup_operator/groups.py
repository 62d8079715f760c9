"""The operator's live state: the cache, one reconcile loop per group.

One :class:`GroupLoops` per process, handed to kopf handlers through kopf's ``memo``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from kgroup.core import lease_codec as codec
from kgroup.core.group import PodObservation

from .cache import Cache, GroupKey
from .controller import GroupController
from .kube import Kube
from .lease_watch import LeaseWatch
from .metrics import Metrics
from .settings import OperatorSettings

log = logging.getLogger(__name__)


class GroupLoops:
    def __init__(self, *, kube: Kube, settings: OperatorSettings,
                 metrics: Metrics | None = None) -> None:
        self.kube = kube
        self.settings = settings
        self.cache = Cache()
        # served by main.run from before leader election on (a standby answers scrapes)
        self.metrics = metrics if metrics is not None else Metrics(process=False)
        self.controllers: dict[GroupKey, GroupController] = {}
        self.lease_watch: LeaseWatch | None = None

    async def start(self) -> None:
        """Initial listing of pods, StatefulSets and kgroup Leases, then let the group loops
        run (a StatefulSet's replicas say whether a pod away across this restart comes
        back: ``kgroup.core.rollout.restart_grace``)."""
        scopes: list[str | None] = list(self.settings.namespaces) or [None]
        for ns in scopes:
            for pod in await self.kube.list_pods(ns):
                self.cache.put_pod(pod["metadata"]["namespace"], pod)
            for sts in await self.kube.list_statefulsets(ns):
                self.cache.put_statefulset(sts["metadata"]["namespace"], sts)
            now = time.monotonic()
            for lease in await self.kube.list_group_leases(ns):
                self.cache.put_lease(lease["metadata"]["namespace"], lease, now)
        self.cache.synced = True
        log.info("caches synced: %d namespaces with pods", len(self.cache.pods))
        for c in self.controllers.values():
            c.poke()
        self.lease_watch = LeaseWatch(self.kube.api, scopes, loop=asyncio.get_running_loop(),
                                      on_list=self.leases_listed, on_event=self.lease_seen)
        self.lease_watch.start()

    async def stop(self) -> None:
        if self.lease_watch is not None:
            self.lease_watch.stop()
        for key in list(self.controllers):
            await self.controllers.pop(key).stop()

    def lease_seen(self, type_: str, body: dict[str, Any]) -> None:
        """A kgroup Lease's watch event (``lease_watch``): the group's loop is poked only
        when the change is material (a plain renewal only restarts the session's clock)."""
        namespace = codec.meta(body).get("namespace")
        if not namespace:
            return
        if type_ == "DELETED":
            key = self.cache.drop_lease(namespace, body)
        else:
            key = self.cache.put_lease(namespace, body, time.monotonic())
        if key is not None:
            self.poke(key)

    def leases_listed(self, scope: str | None, items: list[dict[str, Any]]) -> None:
        """A (re-)listing of the kgroup Leases of a namespace scope (None: every namespace):
        authoritative on which exist; every group of the scope is poked."""
        by_group: dict[GroupKey, list[dict[str, Any]]] = {}
        for body in items:
            namespace, group = codec.meta(body).get("namespace"), codec.group_of(body)
            if namespace and group:
                by_group.setdefault((namespace, group), []).append(body)
        keys = {k for k in self.cache.groups if scope is None or k[0] == scope} | set(by_group)
        now = time.monotonic()
        for key in keys:
            self.cache.group(key).relist(by_group.get(key, []), now)
            self.poke(key)

    def group_seen(self, key: GroupKey, body: dict[str, Any]) -> None:
        c = self.controllers.get(key)
        if c is None:
            c = GroupController(
                key,
                cache=self.cache,
                kube=self.kube,
                metrics=self.metrics,
                settings=self.settings,
            )
            self.controllers[key] = c
            c.start()
        c.update(body)

    async def group_deleted(self, key: GroupKey) -> None:
        c = self.controllers.pop(key, None)
        if c is not None:
            await c.stop()
        self.cache.groups.pop(key, None)
        self.metrics.forget(key)

    def poke(self, key: GroupKey) -> None:
        c = self.controllers.get(key)
        if c is not None:
            c.poke()

    def poke_namespace(self, namespace: str) -> None:
        for (ns, _), c in self.controllers.items():
            if ns == namespace:
                c.poke()

    def poke_pod(
        self, namespace: str, old: PodObservation | None, new: PodObservation | None
    ) -> None:
        """Poke the groups in `namespace` whose selector matches the pod before or after."""
        for (ns, _), c in self.controllers.items():
            if ns != namespace or c.selector is None:
                continue
            if any(p is not None and c.selector.matches(dict(p.labels)) for p in (old, new)):
                c.poke()
