"""Kubernetes adapter of the sidecar: two watch threads feeding the asyncio loop, and
blocking writes run in worker threads.

Why threads: the official ``kubernetes`` client is synchronous. Each watch (the
ConsumerGroup, and the group's Leases by label selector) runs list-then-watch in its own
daemon thread and hands every event to the loop with ``call_soon_threadsafe``; the loop
alone touches the state. A ``410 Gone`` re-lists; a broken stream (API server restart,
network) re-watches from the last resourceVersion after a short backoff. Writes go through
``asyncio.to_thread`` with a request timeout derived from the lease timing (set by the
runtime from ``kgroup.core.member.request_timeout``: short enough that a renewal whose
answer is lost is retried before the fencing deadline), and return the raw JSON of the
object written, so the caller learns the new resourceVersion.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from kgroup.constants import API_GROUP, API_VERSION, LABEL_GROUP, PLURAL
from kgroup_sidecar.metrics import Metrics
from kgroup_sidecar.settings import Settings

log = logging.getLogger(__name__)

Obj = dict[str, Any]
ListHandler = Callable[[str, list[Obj]], None]
EventHandler = Callable[[str, str, Obj], None]

WATCH_SECONDS = 240
watch_factory: Any = watch.Watch
BACKOFF_SECONDS = (0.2, 0.5, 1.0, 2.0)


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
        self.write_timeout: tuple[float, float] = (2.0, 4.0)

    # ---- watches --------------------------------------------------------------------

    def start(self) -> None:
        group_api = client.CustomObjectsApi(client.ApiClient(self._cfg))
        lease_api = client.CoordinationV1Api(client.ApiClient(self._cfg))
        group_field = f"metadata.name={self.settings.group}"
        lease_labels = f"{LABEL_GROUP}={self.settings.group}"

        def list_groups(**kw: Any) -> Any:
            return group_api.list_namespaced_custom_object(
                API_GROUP, API_VERSION, self.namespace, PLURAL, field_selector=group_field, **kw
            )

        def list_leases(**kw: Any) -> Any:
            return lease_api.list_namespaced_lease(
                self.namespace, label_selector=lease_labels, **kw
            )

        for kind, fn in (("group", list_groups), ("lease", list_leases)):
            thread = threading.Thread(
                target=self._watch_forever, args=(kind, fn), name=f"watch-{kind}", daemon=True
            )
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for w in list(self._watches):
            w.stop()

    def _emit_list(self, kind: str, items: list[Obj]) -> None:
        self._loop.call_soon_threadsafe(self._on_list, kind, items)

    def _emit_event(self, kind: str, event_type: str, obj: Obj) -> None:
        self._loop.call_soon_threadsafe(self._on_event, kind, event_type, obj)

    def _watch_forever(self, kind: str, list_fn: Callable[..., Any]) -> None:
        failures = 0
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
                    raw = list_fn(_preload_content=False, _request_timeout=(3, 10))
                    body = json.loads(raw.data)
                    resource_version = body["metadata"]["resourceVersion"]
                    self._emit_list(kind, list(body.get("items") or []))
                w: Any = watch_factory()
                self._watches.append(w)
                try:
                    for event in w.stream(
                        list_fn,
                        resource_version=resource_version,
                        timeout_seconds=WATCH_SECONDS,
                        allow_watch_bookmarks=True,
                        _request_timeout=(3, WATCH_SECONDS + 10),
                    ):
                        if self._stop.is_set():
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
            except ApiException as exc:
                if exc.status == 410:
                    log.info("watch of %s expired (410 Gone): re-listing", kind)
                    resource_version = None
                    continue
                failures += 1
                log.warning("watch of %s failed (%s %s); retrying", kind, exc.status, exc.reason)
            except Exception as exc:  # the API server went away: urllib3, socket, ssl errors
                failures += 1
                log.warning("watch of %s broke (%s); retrying", kind, type(exc).__name__)
            if not self._stop.is_set():
                # Backoff between reconnects only: events are waited for, never polled.
                self._stop.wait(BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)])

    # ---- reads and writes -----------------------------------------------------------

    async def get_lease(self, name: str) -> Obj | None:
        def call() -> Obj | None:
            try:
                raw = self._leases.read_namespaced_lease(
                    name, self.namespace, _preload_content=False,
                    _request_timeout=self.write_timeout,
                )
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            result: Obj = json.loads(raw.data)
            return result

        return await asyncio.to_thread(call)

    async def create_lease(self, body: Obj) -> Obj:
        def call() -> Obj:
            raw = self._leases.create_namespaced_lease(
                self.namespace, body, _preload_content=False, _request_timeout=self.write_timeout
            )
            result: Obj = json.loads(raw.data)
            return result

        self._metrics.api_writes["create"] += 1
        return await asyncio.to_thread(call)

    async def replace_lease(self, body: Obj) -> Obj:
        """PUT with ``metadata.resourceVersion`` in the body: a conditional update."""
        name = body["metadata"]["name"]

        def call() -> Obj:
            raw = self._leases.replace_namespaced_lease(
                name, self.namespace, body, _preload_content=False,
                _request_timeout=self.write_timeout,
            )
            result: Obj = json.loads(raw.data)
            return result

        self._metrics.api_writes["update"] += 1
        return await asyncio.to_thread(call)

    async def delete_lease(self, name: str, *, resource_version: str | None = None) -> None:
        def call() -> None:
            options = client.V1DeleteOptions(
                preconditions=client.V1Preconditions(resource_version=resource_version)
                if resource_version
                else None
            )
            try:
                self._leases.delete_namespaced_lease(
                    name, self.namespace, body=options, _request_timeout=self.write_timeout
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise

        self._metrics.api_writes["delete"] += 1
        await asyncio.to_thread(call)
