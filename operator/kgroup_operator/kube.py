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
resourceVersion read; never the Deployment or StatefulSet itself).

Every request goes through :class:`kgroup.apiclient.ApiClient` (aiohttp, on kopf's event
loop: the one client stack of the process, besides kopf's own session). Lock writes
(creates, assignment and expiry marks, the quorum reads before them, deletes) pass the
:class:`~kgroup_operator.lock_gate.LockGate` first, :data:`LOCK_WRITES_IN_FLIGHT` at a
time: a pass may hand over thousands at once (10,000 creates for an empty group) and they
run that many at a time, never one by one; the session holds :data:`CONNECTIONS`
connections, so the status writes, Events and lists always find one free. Which waiting
lock request goes next is the gate's: expiry marks, then assignment marks, then creates,
then deletes; a mark no longer wanted when its turn comes raises :class:`Superseded`
without a request.

Errors: an answer the caller must act on is returned (None or False: 404, 409); any
other refusal raises :class:`kgroup.apiclient.ApiError`, no answer raises what aiohttp
raises; :data:`API_ERRORS` names them all ("the API is unavailable").
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

import aiohttp

from kgroup import constants as C
from kgroup.apiclient import (
    DEPLOYMENTS,
    EVENTS,
    GROUPS,
    LEASES,
    MUTATING_WEBHOOKS,
    PODS,
    STATEFULSETS,
    ApiClient,
    ApiError,
    Resource,
)
from kgroup.core import lease_codec
from kgroup.core.objects import Obj

from .lock_gate import LockGate, Urgency

log = logging.getLogger(__name__)

T = TypeVar("T")

LOCK_WRITES_IN_FLIGHT = 16
"""Lock requests (creates, marks, quorum reads) in flight at once, over all groups: enough
to keep the API server's commits batched (etcd commits concurrent writes together), few
enough to leave it room for everyone else."""
CONNECTIONS = LOCK_WRITES_IN_FLIGHT + 8
"""The session's connections: the lock requests' and room for everything else."""
LOCK_TIMEOUT = 10.0
"""Seconds a lock request may take (no answer by then: :class:`TimeoutError`)."""
REQUEST_TIMEOUT = 30.0
"""Seconds a status write, a Scale read or write, or an Event may take."""
LIST_TIMEOUT = 60.0

API_ERRORS: tuple[type[BaseException], ...] = (ApiError, aiohttp.ClientError, OSError)
"""What a request raises when the API server refused it or did not answer (a
:class:`TimeoutError` is an :class:`OSError`)."""

SCALABLE = {"Deployment": DEPLOYMENTS, "StatefulSet": STATEFULSETS}


class Conflict(Exception):
    """The object changed since it was read (HTTP 409)."""


class Superseded(Exception):
    """A lock write no longer wanted when its turn came (its ``wanted`` said no): not sent."""


async def _unless(statuses: tuple[int, ...], request: Awaitable[Obj]) -> Obj | None:
    """``request``'s answer; None when it was refused with one of ``statuses``."""
    try:
        return await request
    except ApiError as exc:
        if exc.status in statuses:
            return None
        raise


class Kube:
    """The operator's requests, over one :class:`ApiClient`."""

    def __init__(self, api: ApiClient, *, identity: str) -> None:
        self.api = api
        self.identity = identity
        self.gate = LockGate(LOCK_WRITES_IN_FLIGHT)

    async def _lock_call(self, call: Callable[[], Awaitable[T]], urgency: Urgency,
                         wanted: Callable[[], bool] | None = None) -> T:
        """``call()`` once the gate admits it (at most :data:`LOCK_WRITES_IN_FLIGHT` at a
        time, the most urgent first); :class:`Superseded` instead when ``wanted`` says no
        at that moment."""
        async with self.gate.slot(urgency):
            if wanted is not None and not wanted():
                raise Superseded
            return await call()

    async def get_group(self, namespace: str, name: str) -> Obj | None:
        return await self.api.get(GROUPS, namespace, name, timeout=REQUEST_TIMEOUT)

    async def replace_status(self, body: Obj, status: Obj) -> Obj:
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
        try:
            return await self.api.replace(GROUPS, meta["namespace"], new,
                                          subresource="status", timeout=REQUEST_TIMEOUT)
        except ApiError as exc:
            if exc.status == 409:
                raise Conflict(exc.reason) from None
            raise

    async def create_partition_lease(self, *, namespace: str, body: Obj) -> Obj | None:
        """Create the lock ``body`` (``lease_codec.new_partition_lease``: free, marked for
        its target owner); the stored Lease, or None when the name is taken (409: the
        caller reads the Lease that holds it)."""
        return await self._lock_call(
            lambda: _unless((409,), self.api.create(LEASES, namespace, body,
                                                    timeout=LOCK_TIMEOUT)),
            Urgency.CREATE)

    async def mark_partition_lease(
        self, *, namespace: str, group: str, partition: int, member: str, uid: str | None,
        seen_rv: str, wanted: Callable[[], bool] | None = None,
    ) -> Obj | None:
        """PATCH (JSON merge) the lock's assignment mark to `member` and its pod `uid`, only
        if the lock is still at `seen_rv`; the stored Lease, or None when it changed
        meanwhile (409: the caller re-reads it and decides again) or is gone (the next
        pass creates it). Behind the expiry marks, before the creates; :class:`Superseded`
        when ``wanted`` says no as its turn comes."""
        return await self._lock_call(
            lambda: self._patch_lock(namespace, C.partition_lease_name(group, partition),
                                     lease_codec.assignment_patch(member, uid, seen_rv)),
            Urgency.MARK, wanted)

    async def _patch_lock(self, namespace: str, name: str, patch: Obj) -> Obj | None:
        return await _unless((404, 409), self.api.patch(LEASES, namespace, name, patch,
                                                        timeout=LOCK_TIMEOUT))

    async def get_lease(self, namespace: str, name: str,
                        urgency: Urgency = Urgency.EXPIRY) -> Obj | None:
        """A quorum read of one Lease (no resourceVersion: served from etcd, never from the
        watch cache); None when it does not exist."""
        return await self._lock_call(
            lambda: self.api.get(LEASES, namespace, name, timeout=LOCK_TIMEOUT), urgency)

    async def mark_partition_expired(
        self, *, namespace: str, group: str, partition: int, session: str, seen_rv: str
    ) -> Obj | None:
        """PATCH (JSON merge) the lock's expiry mark to `session`, only if the lock is still
        at `seen_rv`; the stored Lease, or None when it changed meanwhile (409) or is gone."""
        return await self._lock_call(
            lambda: self._patch_lock(namespace, C.partition_lease_name(group, partition),
                                     lease_codec.expiry_patch(session, seen_rv)),
            Urgency.EXPIRY)

    async def delete_partition_lease(self, *, namespace: str, name: str, seen_rv: str,
                                     uid: str | None = None) -> bool:
        """DELETE the Lease ``name`` only if it is still at ``seen_rv`` (and is the object
        of ``uid``): True when deleted; False when it changed meanwhile (409) or is gone
        (404). Last in the lock gate's order."""
        async def call() -> bool:
            try:
                return await self.api.delete(LEASES, namespace, name, timeout=LOCK_TIMEOUT,
                                             resource_version=seen_rv, uid=uid)
            except ApiError as exc:
                if exc.status == 409:
                    return False
                raise

        return await self._lock_call(call, Urgency.DELETE)

    async def _list(self, res: Resource, namespace: str | None) -> list[Obj]:
        """One listing, cluster-wide (namespace None) or of one namespace."""
        answer = await self.api.list(res, namespace, timeout=LIST_TIMEOUT)
        return list(answer.get("items") or [])

    async def list_pods(self, namespace: str | None) -> list[Obj]:
        return await self._list(PODS, namespace)

    async def list_statefulsets(self, namespace: str | None) -> list[Obj]:
        return await self._list(STATEFULSETS, namespace)

    async def read_scale(self, namespace: str, kind: str, name: str) -> Obj | None:
        """The target's ``autoscaling/v1`` Scale (its ``spec.replicas``,
        ``metadata.resourceVersion``), or None when the target does not exist."""
        return await self.api.get(_scalable(kind), namespace, name, subresource="scale",
                                  timeout=REQUEST_TIMEOUT)

    async def patch_scale(self, namespace: str, kind: str, name: str, *, replicas: int,
                          seen_rv: str) -> Obj | None:
        """Set the target's replicas through its scale subresource, only if its Scale is
        still at ``seen_rv``: the stored Scale, or None when it changed meanwhile (409: read
        it again and decide again) or is gone."""
        patch = {"metadata": {"resourceVersion": seen_rv}, "spec": {"replicas": replicas}}
        return await _unless((404, 409), self.api.patch(
            _scalable(kind), namespace, name, patch, subresource="scale",
            timeout=REQUEST_TIMEOUT))

    async def post_event(self, body: Obj, *, type_: str, reason: str, message: str) -> None:
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
        try:
            await self.api.create(EVENTS, meta["namespace"], event, timeout=REQUEST_TIMEOUT)
        except API_ERRORS as exc:
            why = exc.reason if isinstance(exc, ApiError) else type(exc).__name__
            log.warning("could not post event %s on %s: %s", reason, meta["name"], why)


def _scalable(kind: str) -> Resource:
    try:
        return SCALABLE[kind]
    except KeyError:
        raise ValueError(f"cannot scale a {kind}") from None


async def publish_webhook_ca(api: ApiClient, name: str, ca_pem: bytes) -> int:
    """Write ``ca_pem`` as the ``caBundle`` of every webhook of the
    MutatingWebhookConfiguration ``name`` (the chart's injector configuration): a JSON
    patch that tests each webhook's name, so a configuration edited in between is not
    written blind. Returns how many webhooks it set."""
    bundle = base64.b64encode(ca_pem).decode("ascii")
    cfg = await api.request("GET", MUTATING_WEBHOOKS.path(None, name), timeout=REQUEST_TIMEOUT)
    ops: list[Obj] = []
    for i, hook in enumerate(cfg.get("webhooks") or []):
        ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook.get("name")})
        ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle",
                    "value": bundle})
    if ops:
        await api.json_patch(MUTATING_WEBHOOKS, None, name, ops, timeout=REQUEST_TIMEOUT)
    return len(ops) // 2
