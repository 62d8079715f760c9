"""The injector's self-made certificate, shared by every operator replica through one
Secret (``KGROUP_INJECTOR_SECRET``, in the operator's namespace; the chart renders it
empty and gives the operator ``get`` and ``update`` on that one name).

Every write is an update with the read's resourceVersion as precondition (or a create
when the Secret is absent, outside the chart): two replicas that both find it empty, or
both find it due for renewal, race, one write wins, the other gets 409 and reads the
winner's pair. The decisions are :func:`kgroup_operator.certs.next_step`'s; here are the
calls. Keys: ``tls.crt``, ``tls.key``, ``ca.crt`` (the bundle the webhook configuration's
``caBundle`` holds: one CA, or the new and the old while a renewal settles).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kgroup.apiclient import SECRETS, ApiClient, ApiError
from kgroup.constants import MANAGED_BY

from .certs import Step, held, make_pair, next_step
from .kube import API_ERRORS, REQUEST_TIMEOUT

log = logging.getLogger(__name__)

KEYS = ("tls.crt", "tls.key", "ca.crt")


@dataclass(frozen=True)
class Stored:
    """What one read of the Secret found."""

    data: dict[str, bytes]  # empty: absent, or rendered empty by the chart
    resource_version: str | None  # None: the Secret does not exist

    def usable(self) -> bool:
        return all(self.data.get(k) for k in KEYS)


class SecretStore:
    """Reads and conditional writes of the one Secret."""

    def __init__(self, api: ApiClient, namespace: str, name: str) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name

    async def read(self) -> Stored:
        s = await self.api.get(SECRETS, self.namespace, self.name, timeout=REQUEST_TIMEOUT)
        if s is None:
            return Stored({}, None)
        data = {k: base64.b64decode(v) for k, v in (s.get("data") or {}).items()}
        return Stored(data, s["metadata"]["resourceVersion"])

    async def write(self, seen: Stored, data: dict[str, bytes]) -> bool:
        """Replace what ``seen`` read with ``data``; False when another writer was first."""
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace,
                                "labels": {MANAGED_BY: "kgroup-operator"}}
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta,
                "data": {k: base64.b64encode(v).decode("ascii") for k, v in data.items()}}
        try:
            if seen.resource_version is None:
                await self.api.create(SECRETS, self.namespace, body, timeout=REQUEST_TIMEOUT)
            else:
                meta["resourceVersion"] = seen.resource_version
                await self.api.replace(SECRETS, self.namespace, body,
                                       timeout=REQUEST_TIMEOUT)
        except ApiError as exc:
            if exc.status in (409, 404):  # someone else wrote (or deleted) it first
                return False
            raise
        return True


def _held(stored: Stored) -> Any:
    if not stored.usable():
        return None
    try:
        return held(stored.data["tls.crt"], stored.data["ca.crt"])
    except ValueError:
        log.error("injector Secret holds an unreadable certificate: making a new one")
        return None


async def step_once(store: SecretStore, names: list[str], valid_seconds: float,
                    settle_seconds: float, now: datetime | None = None) -> Stored:
    """One read, then at most one conditional write. Returns what the Secret
    holds afterwards: the written pair, or after a lost race the winner's (read again)."""
    now = now or datetime.now(UTC)
    seen = await store.read()
    step = next_step(_held(seen), now, settle_seconds)
    if step is Step.KEEP:
        return seen
    if step is Step.TRIM:
        new_ca = seen.data["ca.crt"].split(b"-----END CERTIFICATE-----", 1)[0]
        data = {**seen.data, "ca.crt": new_ca + b"-----END CERTIFICATE-----\n"}
    else:
        pair = make_pair(names, now, valid_seconds)
        bundle = pair.ca_pem + (seen.data.get("ca.crt", b"") if step is Step.RENEW else b"")
        data = {"tls.crt": pair.cert_pem, "tls.key": pair.key_pem, "ca.crt": bundle}
    if await store.write(seen, data):
        log.info("injector certificate: %s (Secret %s/%s)", step.value, store.namespace,
                 store.name)
    return await store.read()  # ours, or after a lost race the winner's


async def settle(store: SecretStore, names: list[str], valid_seconds: float,
                 settle_seconds: float) -> Stored:
    """:func:`step_once` until the Secret holds a usable pair (retried every 2 s while
    the API server refuses or cannot be reached)."""
    while True:
        try:
            got = await step_once(store, names, valid_seconds, settle_seconds)
            if got.usable():
                return got
        except ApiError as exc:
            log.warning("injector Secret %s/%s: %s %s", store.namespace, store.name,
                        exc.status, exc.reason)
        except API_ERRORS as exc:
            log.warning("injector Secret %s/%s: %s", store.namespace, store.name,
                        type(exc).__name__)
        await asyncio.sleep(2.0)
