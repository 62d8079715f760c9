"""Leader election on a coordination Lease: exactly one operator replica is active.

client-go's shape, with its clock rule: a standby acts only on times it measured itself.
It remembers the leader's ``renewTime`` (a marker) and when *it* first saw that value;
only when the marker stayed unchanged for a full lease duration on the standby's own
monotonic clock does it take the Lease, with a resourceVersion precondition. The leader
renews every third of the duration and stops itself (sets the stop flag) if it could not
renew within two thirds of it, so it is gone before any standby may take over.

The Lease carries kgroup's labels (``kgroup.dev/role=operator-leader``): the chart's
admission policy lets the operator write no Lease without them (a Lease left unlabelled by
an older version is labelled at the next write).
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kgroup.constants import LABEL_ROLE, MANAGED_BY, ROLE_LEADER

log = logging.getLogger(__name__)


LABELS = {LABEL_ROLE: ROLE_LEADER, MANAGED_BY: "kgroup-operator"}
"""The leader Lease's labels (no kgroup.dev/group: it is no group's Lease)."""


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _labelled(lease: Any) -> Any:
    """A read Lease (client model) with kgroup's labels added, for a replace."""
    lease.metadata.labels = {**(lease.metadata.labels or {}), **LABELS}
    return lease


class LeaseElector:
    """Acquire, hold and release one leader Lease."""

    def __init__(
        self, api: client.ApiClient, *, namespace: str, name: str, identity: str, duration: float
    ) -> None:
        self.coord = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self._seen: tuple[str, float] | None = None  # (marker, when first seen on our clock)

    def _body(self, rv: str | None, transitions: int) -> dict[str, Any]:
        now = _now_micro()
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace,
                                "labels": dict(LABELS)}
        if rv:
            meta["resourceVersion"] = rv
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, int(self.duration)),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }

    def _try_acquire(self) -> bool:
        """One attempt (blocking); True when we hold the Lease now."""
        # 1. read the Lease; create it when absent
        try:
            lease = self.coord.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            try:
                self.coord.create_namespaced_lease(self.namespace, cast(Any, self._body(None, 0)))
                return True
            except ApiException as exc2:
                if exc2.status == 409:
                    return False
                raise
        spec = lease.spec
        assert spec is not None and lease.metadata is not None
        holder = spec.holder_identity
        marker = f"{holder}|{spec.renew_time}"
        now = time.monotonic()
        # 2. someone else holds it: wait until its marker is unchanged for a duration
        if holder and holder != self.identity:
            if self._seen is None or self._seen[0] != marker:
                self._seen = (marker, now)
                return False
            if now - self._seen[1] < float(spec.lease_duration_seconds or self.duration):
                return False
        # 3. free, ours, or expired on our clock: take it with a precondition
        transitions = int(spec.lease_transitions or 0) + (0 if holder == self.identity else 1)
        try:
            self.coord.replace_namespaced_lease(
                self.name,
                self.namespace,
                cast(Any, self._body(lease.metadata.resource_version, transitions)),
            )
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    async def acquire(self) -> None:
        """Wait until this replica is the leader."""
        while True:
            try:
                if await asyncio.to_thread(self._try_acquire):
                    log.info(
                        "leader Lease %s/%s acquired by %s",
                        self.namespace,
                        self.name,
                        self.identity,
                    )
                    return
            except ApiException as exc:
                log.warning("leader election: %s", exc.reason)
            await asyncio.sleep(self.duration / 3)

    def _renew(self) -> bool:
        lease = self.coord.read_namespaced_lease(self.name, self.namespace)
        if lease.spec is None or lease.spec.holder_identity != self.identity:
            return False
        lease.spec.renew_time = datetime.now(UTC)
        self.coord.replace_namespaced_lease(self.name, self.namespace, _labelled(lease))
        return True

    async def hold(self, stop: asyncio.Event) -> None:
        """Renew until `stop` is set; set it ourselves when leadership is lost."""
        last_ok = time.monotonic()
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.duration / 3)
                return
            except TimeoutError:
                pass
            try:
                if await asyncio.to_thread(self._renew):
                    last_ok = time.monotonic()
                else:
                    log.error("leader Lease taken by another replica; stopping")
                    stop.set()
                    return
            except ApiException as exc:
                log.warning("leader Lease renewal failed: %s", exc.reason)
            if time.monotonic() - last_ok > self.duration * 2 / 3:
                log.error("could not renew the leader Lease in time; stopping")
                stop.set()
                return

    async def release(self) -> None:
        def call() -> None:
            try:
                lease = self.coord.read_namespaced_lease(self.name, self.namespace)
                if lease.spec is not None and lease.spec.holder_identity == self.identity:
                    lease.spec.holder_identity = None
                    lease.spec.renew_time = None
                    lease.spec.acquire_time = None
                    self.coord.replace_namespaced_lease(self.name, self.namespace,
                                                        _labelled(lease))
            except Exception as exc:  # best effort: a standby takes over after a duration
                log.warning("could not release the leader Lease: %s", exc)

        await asyncio.to_thread(call)
