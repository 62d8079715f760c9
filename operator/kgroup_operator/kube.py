"""Kubernetes calls of the operator: every request it makes lives here.

Rules: the operator never changes a lock's holder (sidecars alone do); it creates
partition Leases with no holder (marked for their target owner and its pod's uid), moves a
lock's assignment mark with one merge patch of those two annotations alone, conditional on
the lock's resourceVersion as the operator decided on it, reads a member Lease (a quorum GET)
before it marks a lock's holder session expired with one merge patch of the
``kgroup.dev/expired-session`` annotation conditional on the lock's resourceVersion,
deletes a retired partition's Lease (free and recorded completed:
``kgroup.core.operator.retention``) only with preconditions on its resourceVersion and uid
as read, writes the group's status only through the status subresource with the read
``resourceVersion`` (a 409 is raised as :class:`Conflict` for the caller to re-read and
recompute), posts core/v1 Events, and reads and sets ``spec.autoscaling``'s target's
replicas through its ``scale`` subresource only (a merge patch conditional on the
resourceVersion read; never the Deployment or StatefulSet itself). The
blocking client runs in threads so the kopf event loop never stalls.

Lock writes (creates, assignment and expiry marks, the quorum reads before them) go
through a pool of their own, :data:`LOCK_WRITES_IN_FLIGHT` threads over as many
connections: a pass may hand over thousands at once (10,000 creates for an empty group)
and they run that many at a time, never one by one, while the status writes and Events
keep the default pool. Which waiting request goes next is the
:class:`~kgroup_operator.lock_gate.LockGate`'s: expiry marks, then assignment marks,
then creates; a mark no longer wanted when its turn comes raises :class:`Superseded`
without a request. Their answers are read as JSON, not built into the client's models
and serialised back (most of the operator's CPU per write).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import copy
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kgroup import constants as C
from kgroup.core import lease_codec

from .lock_gate import LockGate, Urgency

log = logging.getLogger(__name__)

LOCK_WRITES_IN_FLIGHT = 16
"""Lock requests (creates, marks, quorum reads) in flight at once, over all groups: enough
to keep the API server's commits batched (etcd commits concurrent writes together), few
enough to leave it room for everyone else."""


class Conflict(Exception):
    """The object changed since it was read (HTTP 409)."""


class Superseded(Exception):
    """A lock write no longer wanted when its turn came (its ``wanted`` said no): not sent."""


class Kube:
    """Thin async wrappers over the blocking Kubernetes client."""

    def __init__(self, api: client.ApiClient, *, identity: str) -> None:
        self.api = api
        self.identity = identity
        self.custom = client.CustomObjectsApi(api)
        self.coord = client.CoordinationV1Api(api)
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        cfg = copy.copy(api.configuration)
        cfg.connection_pool_maxsize = LOCK_WRITES_IN_FLIGHT
        self.lock_api = client.ApiClient(configuration=cfg)
        self.locks = client.CoordinationV1Api(self.lock_api)
        self._pool = concurrent.futures.ThreadPoolExecutor(
            LOCK_WRITES_IN_FLIGHT, thread_name_prefix="kgroup-locks")
        self.gate = LockGate(LOCK_WRITES_IN_FLIGHT)

    async def _lock_call(self, call: Callable[[], Any], urgency: Urgency,
                         wanted: Callable[[], bool] | None = None) -> Any:
        """``call`` in the lock pool once the gate admits it (at most
        :data:`LOCK_WRITES_IN_FLIGHT` at a time, the most urgent first); :class:`Superseded`
        instead when ``wanted`` says no at that moment."""
        async with self.gate.slot(urgency):
            if wanted is not None and not wanted():
                raise Superseded
            return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.lock_api.close()  # type: ignore[no-untyped-call]

    def _plain(self, obj: Any) -> dict[str, Any]:
        out: dict[str, Any] = self.api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
        return out

    async def get_group(self, namespace: str, name: str) -> dict[str, Any] | None:
        def call() -> dict[str, Any] | None:
            try:
                obj = self.custom.get_namespaced_custom_object(
                    C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, name
                )
                return cast(dict[str, Any], obj)
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        return await asyncio.to_thread(call)

    async def replace_status(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """PUT the status subresource with `body`'s resourceVersion as precondition."""
        meta = body["metadata"]
        new = {
            "apiVersion": body.get("apiVersion", f"{C.API_GROUP}/{C.API_VERSION}"),
            "kind": body.get("kind", C.KIND),
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "resourceVersion": meta["resourceVersion"],
            },
            "spec": body.get("spec", {}),
            "status": status,
        }

        def call() -> dict[str, Any]:
            try:
                out = self.custom.replace_namespaced_custom_object_status(
                    C.API_GROUP, C.API_VERSION, meta["namespace"], C.PLURAL, meta["name"], new
                )
                return cast(dict[str, Any], out)
            except ApiException as exc:
                if exc.status == 409:
                    raise Conflict(str(exc.reason)) from None
                raise

        return await asyncio.to_thread(call)

    async def create_partition_lease(self, *, namespace: str,
                                     body: dict[str, Any]) -> dict[str, Any] | None:
        """Create the lock ``body`` (``lease_codec.new_partition_lease``: free, marked for
        its target owner); the stored Lease, or None when the name is taken (409: the
        caller reads the Lease that holds it)."""
        def call() -> dict[str, Any] | None:
            try:
                return _json(self.locks.create_namespaced_lease(namespace, cast(Any, body),
                                                                _preload_content=False))
            except ApiException as exc:
                if exc.status == 409:
                    return None
                raise

        return cast(dict[str, Any] | None, await self._lock_call(call, Urgency.CREATE))

    async def mark_partition_lease(
        self, *, namespace: str, group: str, partition: int, member: str, uid: str | None,
        seen_rv: str, wanted: Callable[[], bool] | None = None,
    ) -> dict[str, Any] | None:
        """PATCH (JSON merge) the lock's assignment mark to `member` and its pod `uid`, only
        if the lock is still at `seen_rv`; the stored Lease, or None when it changed
        meanwhile (409: the caller re-reads it and decides again) or is gone (the next
        pass creates it). Behind the expiry marks, before the creates; :class:`Superseded`
        when ``wanted`` says no as its turn comes."""
        name = C.partition_lease_name(group, partition)
        body = lease_codec.assignment_patch(member, uid, seen_rv)

        def call() -> dict[str, Any] | None:
            try:
                return _json(self.locks.patch_namespaced_lease(name, namespace, body,
                                                               _preload_content=False))
            except ApiException as exc:
                if exc.status in (404, 409):
                    return None
                raise

        return cast(dict[str, Any] | None, await self._lock_call(call, Urgency.MARK, wanted))

    async def get_lease(self, namespace: str, name: str,
                        urgency: Urgency = Urgency.EXPIRY) -> dict[str, Any] | None:
        """A quorum read of one Lease (no resourceVersion: served from etcd, never from the
        watch cache); None when it does not exist."""
        def call() -> dict[str, Any] | None:
            try:
                return _json(self.locks.read_namespaced_lease(name, namespace,
                                                              _preload_content=False))
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        return cast(dict[str, Any] | None, await self._lock_call(call, urgency))

    async def mark_partition_expired(
        self, *, namespace: str, group: str, partition: int, session: str, seen_rv: str
    ) -> dict[str, Any] | None:
        """PATCH (JSON merge) the lock's expiry mark to `session`, only if the lock is still
        at `seen_rv`; the stored Lease, or None when it changed meanwhile (409) or is gone."""
        name = C.partition_lease_name(group, partition)
        body = lease_codec.expiry_patch(session, seen_rv)

        def call() -> dict[str, Any] | None:
            try:
                return _json(self.locks.patch_namespaced_lease(name, namespace, body,
                                                               _preload_content=False))
            except ApiException as exc:
                if exc.status in (404, 409):
                    return None
                raise

        return cast(dict[str, Any] | None, await self._lock_call(call, Urgency.EXPIRY))

    async def delete_partition_lease(self, *, namespace: str, name: str, seen_rv: str,
                                     uid: str | None = None) -> bool:
        """DELETE the Lease ``name`` only if it is still at ``seen_rv`` (and is the object
        of ``uid``): True when deleted; False when it changed meanwhile (409) or is gone
        (404). Last in the lock gate's order."""
        options = client.V1DeleteOptions(preconditions=client.V1Preconditions(
            resource_version=seen_rv, uid=uid))

        def call() -> bool:
            try:
                _json(self.locks.delete_namespaced_lease(name, namespace, body=options,
                                                         _preload_content=False))
                return True
            except ApiException as exc:
                if exc.status in (404, 409):
                    return False
                raise

        return cast(bool, await self._lock_call(call, Urgency.DELETE))

    async def _list(self, namespace: str | None, everywhere: Callable[..., Any],
                    namespaced: Callable[..., Any], **kw: Any) -> list[dict[str, Any]]:
        """One listing, cluster-wide (namespace None) or of one namespace, as plain dicts."""
        def call() -> list[dict[str, Any]]:
            res = everywhere(**kw) if namespace is None else namespaced(namespace, **kw)
            return [self._plain(x) for x in res.items]

        return await asyncio.to_thread(call)

    async def list_pods(self, namespace: str | None) -> list[dict[str, Any]]:
        return await self._list(namespace, self.core.list_pod_for_all_namespaces,
                                self.core.list_namespaced_pod)

    async def list_statefulsets(self, namespace: str | None) -> list[dict[str, Any]]:
        return await self._list(namespace, self.apps.list_stateful_set_for_all_namespaces,
                                self.apps.list_namespaced_stateful_set)

    def _scale_calls(self, kind: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        if kind == "Deployment":
            return (self.apps.read_namespaced_deployment_scale,
                    self.apps.patch_namespaced_deployment_scale)
        if kind == "StatefulSet":
            return (self.apps.read_namespaced_stateful_set_scale,
                    self.apps.patch_namespaced_stateful_set_scale)
        raise ValueError(f"cannot scale a {kind}")

    async def read_scale(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        """The target's ``autoscaling/v1`` Scale (its ``spec.replicas``,
        ``metadata.resourceVersion``), or None when the target does not exist."""
        read, _ = self._scale_calls(kind)

        def call() -> dict[str, Any] | None:
            try:
                return _json(read(name, namespace, _preload_content=False))
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        return await asyncio.to_thread(call)

    async def patch_scale(self, namespace: str, kind: str, name: str, *, replicas: int,
                          seen_rv: str) -> dict[str, Any] | None:
        """Set the target's replicas through its scale subresource, only if its Scale is
        still at ``seen_rv``: the stored Scale, or None when it changed meanwhile (409: read
        it again and decide again) or is gone."""
        _, patch = self._scale_calls(kind)
        body = {"metadata": {"resourceVersion": seen_rv}, "spec": {"replicas": replicas}}

        def call() -> dict[str, Any] | None:
            try:
                return _json(patch(name, namespace, body, _preload_content=False))
            except ApiException as exc:
                if exc.status in (404, 409):
                    return None
                raise

        return await asyncio.to_thread(call)

    async def post_event(
        self, body: dict[str, Any], *, type_: str, reason: str, message: str
    ) -> None:
        """A core/v1 Event about the ConsumerGroup `body`; failures are only logged."""
        meta = body["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": f"{C.API_GROUP}/{C.API_VERSION}",
                "kind": C.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": "kgroup-operator"},
            "reportingComponent": "kgroup.dev/operator",
            "reportingInstance": self.identity[:128],
        }

        def call() -> None:
            try:
                self.core.create_namespaced_event(meta["namespace"], cast(Any, event))
            except ApiException as exc:
                log.warning("could not post event %s on %s: %s", reason, meta["name"], exc.reason)

        await asyncio.to_thread(call)

def publish_webhook_ca(api: client.ApiClient, name: str, ca_pem: bytes) -> int:
    """Write ``ca_pem`` as the ``caBundle`` of every webhook of the
    MutatingWebhookConfiguration ``name`` (the chart's injector configuration): a JSON
    patch that tests each webhook's name, so a configuration edited in between is not
    written blind. Returns how many webhooks it set (blocking)."""
    bundle = base64.b64encode(ca_pem).decode("ascii")
    admission = client.AdmissionregistrationV1Api(api)
    cfg = admission.read_mutating_webhook_configuration(name)
    ops: list[dict[str, Any]] = []
    for i, hook in enumerate(cfg.webhooks or []):
        ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook.name})
        ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle",
                    "value": bundle})
    if ops:
        admission.patch_mutating_webhook_configuration(name, ops)
    return len(ops) // 2


def _json(response: Any) -> dict[str, Any]:
    """The body of an answer read with ``_preload_content=False`` (urllib3's response),
    whose connection then goes back to the pool: urllib3 keeps it out of the pool until
    released, and without this every request opened a TLS connection of its own."""
    try:
        out: dict[str, Any] = json.loads(response.data)
    finally:
        response.release_conn()
    return out
