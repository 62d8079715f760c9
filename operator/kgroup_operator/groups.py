"""The operator's live state: the cache, one reconcile loop per group.

One :class:`GroupLoops` per process, handed to kopf handlers through kopf's ``memo``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kgroup import constants as C
from kgroup.core.operator.lease_cache import Cache, GroupKey
from kgroup.core.operator.planner import PodObservation

from .controller import GroupController
from .kube import Kube
from .lease_watch import Http, LeaseWatch
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
        self.watches: dict[GroupKey, LeaseWatch] = {}
        self.http: Http | None = None  # the Lease watches' aiohttp session, made lazily
        self.missing_sidecar: set[str] = set()  # pods reported as SidecarMissing (uids)
        self.bare_pods: dict[GroupKey, dict[str, str]] = {}  # to report: uid -> name

    async def start(self) -> None:
        """Initial listing of pods and StatefulSets, then let the group loops run (a
        StatefulSet's replicas say whether a pod away across this restart comes back:
        ``kgroup.core.operator.rollout.restart_grace``)."""
        scopes: list[str | None] = list(self.settings.namespaces) or [None]
        for ns in scopes:
            for pod in await self.kube.list_pods(ns):
                self.cache.put_pod(pod["metadata"]["namespace"], pod)
            for sts in await self.kube.list_statefulsets(ns):
                self.cache.put_statefulset(sts["metadata"]["namespace"], sts)
        # no Lease is listed here: each group's own watch lists its Leases when the group
        # is seen (lease_watch), so Leases naming groups that do not exist are never read
        self.cache.synced = True
        log.info("caches synced: %d namespaces with pods", len(self.cache.pods))
        for c in self.controllers.values():
            c.poke()

    def problems(self) -> list[str]:
        """Why this operator cannot do its job (empty: it can): the liveness probe fails
        while this is not empty (``handlers.liveness``)."""
        out = [p for c in self.controllers.values() if (p := c.problem()) is not None]
        out += [f"{ns}/{name}: its Lease watch ended" for (ns, name), w in
                self.watches.items() if not w.alive()]
        return out

    async def stop(self) -> None:
        for w in self.watches.values():
            w.stop()
        self.watches.clear()
        for key in list(self.controllers):
            await self.controllers.pop(key).stop()
        if self.http is not None:
            await self.http.close()

    def group_seen(self, key: GroupKey, body: dict[str, Any]) -> None:
        c = self.controllers.get(key)
        if c is None:
            self.cache.group_added(key)
            c = GroupController(
                key,
                cache=self.cache,
                kube=self.kube,
                metrics=self.metrics,
                settings=self.settings,
            )
            self.controllers[key] = c
            self.watches[key] = self._watch(key, c)
            c.start()
        c.update(body)

    def _watch(self, key: GroupKey, c: GroupController) -> LeaseWatch:
        """The group's Lease watch: its first listing lets the group's loop plan."""
        namespace, _ = key

        def listed(items: list[dict[str, Any]]) -> None:
            if self.controllers.get(key) is not c:
                return
            self.cache.group(key).relist(items, time.monotonic())
            c.leases_listed = True
            c.poke()

        def event(kind: str, body: dict[str, Any]) -> None:
            if self.controllers.get(key) is c:
                self.lease_event(namespace, kind, body)

        if self.http is None:
            self.http = Http(self.kube.api.config)
        w = LeaseWatch(self.http, namespace, key[1], on_list=listed, on_event=event,
                       pause=c.read_pause)
        c.hurry = w.hurry  # a poke of the group ends the watch's pause between reads
        w.start()
        return w

    def lease_event(self, namespace: str, kind: str, body: dict[str, Any]) -> None:
        """A watch event of a kgroup Lease of an existing group: into the cache, and the
        group's loop poked."""
        if kind == "DELETED":
            key = self.cache.drop_lease(namespace, body)
        else:
            key = self.cache.put_lease(namespace, body, time.monotonic())
        if key is not None:
            self.poke(key)

    async def group_deleted(self, key: GroupKey) -> None:
        w = self.watches.pop(key, None)
        if w is not None:
            w.stop()
        c = self.controllers.pop(key, None)
        if c is not None:
            await c.stop()
        self.cache.group_removed(key)
        self.metrics.forget(key)

    async def report_missing_sidecar(self, namespace: str, pod: dict[str, Any]) -> int:
        """A Warning Event ``SidecarMissing`` on the group a pod is labelled with, once per
        pod, when the pod runs without the sidecar (created while injection was off or
        failing open): it takes no part in its group, and says so instead of idling. A pod
        seen before its group is reported when the group is (:meth:`report_bare_pods`)."""
        meta = pod.get("metadata") or {}
        uid, name = str(meta.get("uid", "")), str(meta.get("name", ""))
        group = str((meta.get("labels") or {}).get(C.LABEL_GROUP, ""))
        if uid and uid not in self.missing_sidecar:
            self.bare_pods.setdefault((namespace, group), {})[uid] = name
        return await self.report_bare_pods((namespace, group))

    async def report_bare_pods(self, key: GroupKey) -> int:
        c = self.controllers.get(key)
        pods = self.bare_pods.get(key)
        if c is None or c.body is None or not pods:
            return 0
        body = c.body
        self.bare_pods.pop(key, None)
        for uid, name in pods.items():
            self.missing_sidecar.add(uid)
            await self.kube.post_event(
                body, type_="Warning", reason="SidecarMissing",
                message=f"pod {name} is labelled {C.LABEL_GROUP}={key[1]} but has no "
                        f"{C.SIDECAR_CONTAINER} container, so it takes no part in the group "
                        "(created while the sidecar injector was off or unreachable): "
                        "delete it to have it re-created with the sidecar")
        return len(pods)

    def pod_gone(self, namespace: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        self.missing_sidecar.discard(uid)
        group = str((meta.get("labels") or {}).get(C.LABEL_GROUP, ""))
        self.bare_pods.get((namespace, group), {}).pop(uid, None)

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
        """Poke the groups in `namespace` whose selector matches the pod before or after,
        and the group it is labelled with (a pod without the sidecar is reported on it)."""
        named = {p.labels.get(C.LABEL_GROUP) for p in (old, new) if p is not None}
        for (ns, name), c in self.controllers.items():
            if ns != namespace:
                continue
            if name in named or (c.selector is not None and any(
                    p is not None and c.selector.matches(dict(p.labels)) for p in (old, new))):
                c.poke()
