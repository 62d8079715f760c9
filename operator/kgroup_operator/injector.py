"""The sidecar injector: a mutating admission webhook served by every operator replica.

Started by ``kgroup-operator`` at process start when ``KGROUP_INJECTOR`` is on, before
leader election and whatever the replica's role: a standby serves it as the leader does,
so the injector's Service has a Ready endpoint while the leader changes or the operator
rolls (the chart's readiness probe checks the webhook's TLS handshake). The decision is
:func:`kgroup.core.operator.injection.inject`; this module is its adapter:

* :func:`answer`: an AdmissionReview in, its response out. A pod at CREATE labelled
  ``kgroup.dev/group`` is patched into the injected one (a JSON patch made by
  ``jsonpatch``); a pod that cannot be injected as written is refused (400, the reason);
  anything else is allowed unchanged.
* kopf's :class:`kopf.WebhookServer` serves it over TLS on ``KGROUP_INJECTOR_HOST:PORT``
  (the pod's IP in the chart, 127.0.0.1 by default; never a wildcard), reloading its files
  when they change. They come from ``KGROUP_INJECTOR_CERT_DIR`` (cert-manager's Secret
  mounted: tls.crt, tls.key, ca.crt), or from the pair every replica shares through one
  Secret (:mod:`kgroup_operator.injector_cert`), whose CA bundle each replica writes into
  the MutatingWebhookConfiguration ``KGROUP_INJECTOR_WEBHOOK`` when it changes.
* The webhook configuration is the chart's, not kopf's: kopf's would carry no
  namespaceSelector, a fixed 30 s timeout, and would be deleted when the operator stops,
  which is when pods created meanwhile would silently go without their sidecar.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import logging
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import kopf

from kgroup import constants as C
from kgroup.apiclient import ApiClient
from kgroup.core.operator.injection import InjectionRefused, SidecarDefaults, inject

from .certs import write_pair
from .injector_cert import SecretStore, Stored, settle
from .kube import API_ERRORS, publish_webhook_ca
from .settings import OperatorSettings

log = logging.getLogger(__name__)

WEBHOOK_ID = "inject"
"""The webhook's URL path (``/inject``)."""


@dataclass
class Injector:
    settings: OperatorSettings
    defaults: SidecarDefaults
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


def answer(review: Mapping[str, Any], defaults: SidecarDefaults) -> dict[str, Any]:
    """The AdmissionReview response to ``review`` (pure)."""
    req = review.get("request") or {}
    out: dict[str, Any] = {"uid": req.get("uid", ""), "allowed": True}
    pod = req.get("object")
    labels = ((pod or {}).get("metadata") or {}).get("labels") or {}
    if (req.get("operation") == "CREATE" and (req.get("kind") or {}).get("kind") == "Pod"
            and isinstance(pod, dict) and C.LABEL_GROUP in labels):
        try:
            injected = inject(copy.deepcopy(pod), defaults)
        except InjectionRefused as exc:
            out.update(allowed=False, status={"code": 400, "message": str(exc)})
        else:
            if injected is not None:
                ops = jsonpatch.make_patch(pod, injected).patch
                out["patchType"] = "JSONPatch"
                out["patch"] = base64.b64encode(json.dumps(ops).encode()).decode("ascii")
    return {"apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
            "kind": "AdmissionReview", "response": out}


def _check_interval(s: OperatorSettings) -> float:
    """How often the Secret is read and kopf's server looks for renewed files: a minute,
    less for short-lived certificates."""
    return max(1.0, min(60.0, s.injector_cert_seconds / 20))


def settle_seconds(s: OperatorSettings) -> float:
    """After a renewal, how long until every replica surely serves the new pair: its
    next read of the Secret, then its server's next look at the files (twice, for
    margin)."""
    return 3 * _check_interval(s) + 1


def secret_name(s: OperatorSettings) -> str:
    return s.injector_secret or (f"{s.injector_webhook}-tls" if s.injector_webhook
                                 else "kgroup-injector-tls")


async def _serve(inj: Injector, server: kopf.WebhookServer) -> None:
    async def fn(request: Any, **_: Any) -> Any:
        return answer(request, inj.defaults)

    async for _ in server(fn):  # one turn per (re)load of the certificate files
        log.info("sidecar injector on https://%s:%d/%s", inj.settings.injector_host,
                 inj.settings.injector_port, WEBHOOK_ID)


def _server(s: OperatorSettings, cert: Path, key: Path) -> kopf.WebhookServer:
    return kopf.WebhookServer(addr=s.injector_host, port=s.injector_port,
                              host=s.injector_host, certfile=cert, pkeyfile=key,
                              file_check_interval=_check_interval(s))


async def _keep_in_step(inj: Injector, api: ApiClient, store: SecretStore, cert_dir: Path,
                        stored: Stored) -> None:
    """Serve what the Secret holds, for ever: its files rewritten when the Secret
    changes (kopf's server reloads them), its CA bundle published when it changes, a
    renewal made when due (by whichever replica gets there first)."""
    s = inj.settings
    names = [*s.injector_dns_names, s.injector_host]
    published: bytes | None = None
    served = stored.data
    while True:
        try:
            if stored.data != served:
                write_pair(stored.data["tls.crt"], stored.data["tls.key"], cert_dir)
                served = stored.data
                log.info("injector certificate files replaced from the Secret")
            if s.injector_webhook and stored.data["ca.crt"] != published:
                n = await publish_webhook_ca(api, s.injector_webhook, stored.data["ca.crt"])
                published = stored.data["ca.crt"]
                log.info("injector CA written to %d webhook(s) of %s", n, s.injector_webhook)
        except API_ERRORS as exc:  # retried at the next turn
            log.error("injector certificate: %s", exc)
        await asyncio.sleep(_check_interval(s))
        stored = await settle(store, names, s.injector_cert_seconds, settle_seconds(s))


async def _run(inj: Injector, api: ApiClient) -> None:
    s = inj.settings
    if s.injector_cert_dir:
        d = Path(s.injector_cert_dir)
        await _serve(inj, kopf.WebhookServer(
            addr=s.injector_host, port=s.injector_port, host=s.injector_host,
            certfile=d / "tls.crt", pkeyfile=d / "tls.key", cafile=d / "ca.crt"))
        return
    store = SecretStore(api, s.leader_lease_namespace, secret_name(s))
    names = [*s.injector_dns_names, s.injector_host]
    stored = await settle(store, names, s.injector_cert_seconds, settle_seconds(s))
    cert_dir = Path(tempfile.mkdtemp(prefix="kgroup-injector-"))
    cert, key = write_pair(stored.data["tls.crt"], stored.data["tls.key"], cert_dir)
    await asyncio.gather(_serve(inj, _server(s, cert, key)),
                         _keep_in_step(inj, api, store, cert_dir, stored))


def start(inj: Injector, api: ApiClient) -> asyncio.Task[None]:
    """Serve the injector from now until the task is cancelled; a failure is logged and
    the process's readiness (the webhook's handshake) shows it."""

    async def run() -> None:
        try:
            await _run(inj, api)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the sidecar injector stopped")
            raise

    task = asyncio.create_task(run(), name="injector")
    inj.tasks.append(task)
    return task


async def stop(inj: Injector) -> None:
    for t in inj.tasks:
        t.cancel()
    await asyncio.gather(*inj.tasks, return_exceptions=True)
