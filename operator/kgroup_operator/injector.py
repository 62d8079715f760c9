"""The sidecar injector: a mutating admission webhook served by kopf in the operator.

Imported (which registers its kopf handlers) only when ``KGROUP_INJECTOR`` is on. The
decision is :func:`kgroup.core.operator.injection.inject`; this module is its adapter:

* ``@kopf.on.mutate`` for pods at CREATE labelled ``kgroup.dev/group``: the pod becomes the
  injected one (kopf turns the difference into the JSON patch the API server applies); a
  pod kopf cannot inject as written is denied with the reason.
* kopf's :class:`kopf.WebhookServer` serves it over TLS on ``KGROUP_INJECTOR_HOST:PORT``
  (the pod's IP in the chart, 127.0.0.1 by default; never a wildcard). The certificate
  comes from ``KGROUP_INJECTOR_CERT_DIR`` (cert-manager's Secret: tls.crt, tls.key,
  ca.crt; kopf reloads it when the files change) or is made at start
  (:mod:`kgroup_operator.certs`), whose CA the operator then writes into the
  MutatingWebhookConfiguration ``KGROUP_INJECTOR_WEBHOOK`` itself.
* kopf does not manage the webhook configuration (``settings.admission.managed`` stays
  None): the chart renders it, because kopf's would carry no namespaceSelector, a fixed
  30 s timeout, and would be deleted when the operator stops, which is when pods created
  meanwhile would silently go without their sidecar.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from kgroup import constants as C
from kgroup.core.operator.injection import InjectionRefused, SidecarDefaults, inject

from .certs import ServingCert, make_serving_cert, renew_in
from .groups import GroupLoops
from .settings import OperatorSettings

log = logging.getLogger(__name__)

WEBHOOK_ID = "inject"
"""The handler's id, and so the webhook's URL path (``/inject``)."""


@dataclass
class Injector:
    settings: OperatorSettings
    defaults: SidecarDefaults
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


def _check_interval(s: OperatorSettings) -> float:
    """How often kopf's server looks for renewed files: a minute, less for short-lived
    certificates."""
    return max(1.0, min(60.0, s.injector_cert_seconds / 20))


def _server(s: OperatorSettings, cert_dir: Path) -> tuple[kopf.WebhookServer, bytes | None]:
    """kopf's server with cert-manager's files, or with a certificate made now in
    ``cert_dir`` (its CA returned, to be published)."""
    if s.injector_cert_dir:
        d = Path(s.injector_cert_dir)
        return kopf.WebhookServer(addr=s.injector_host, port=s.injector_port,
                                  host=s.injector_host, certfile=d / "tls.crt",
                                  pkeyfile=d / "tls.key", cafile=d / "ca.crt"), None
    made = _make(s, cert_dir)
    return kopf.WebhookServer(addr=s.injector_host, port=s.injector_port,
                              host=s.injector_host, certfile=made.cert_file,
                              pkeyfile=made.key_file, cadata=made.ca_pem,
                              file_check_interval=_check_interval(s)), made.ca_pem


def _make(s: OperatorSettings, cert_dir: Path) -> ServingCert:
    return make_serving_cert([*s.injector_dns_names, s.injector_host], cert_dir,
                             valid_seconds=s.injector_cert_seconds)


async def _renew(s: OperatorSettings, rt: GroupLoops, cert_dir: Path, ca: bytes) -> None:
    """Renew the self-made certificate for ever, each time with a third of its life left:
    the new CA joins the old one in the bundle, the files are replaced (kopf's server
    reloads them within its check interval), then the bundle holds the new CA alone."""
    while True:
        await asyncio.sleep(renew_in(s.injector_cert_seconds))
        try:
            made = _make(s, cert_dir)
            await rt.kube.publish_webhook_ca(s.injector_webhook, made.ca_pem + ca)
            await asyncio.sleep(2 * _check_interval(s) + 1)
            await rt.kube.publish_webhook_ca(s.injector_webhook, made.ca_pem)
            ca = made.ca_pem
            log.info("injector certificate renewed")
        except (OSError, ApiException) as exc:  # retried at the next turn, a third later
            log.error("injector certificate renewal failed: %s", exc)


@kopf.on.startup()
async def start_injector(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    inj: Injector = memo.injector
    s = inj.settings
    cert_dir = Path(tempfile.mkdtemp(prefix="kgroup-injector-"))
    server, ca = _server(s, cert_dir)
    settings.admission.server = server
    settings.admission.managed = None
    log.info("sidecar injector on https://%s:%d/%s", s.injector_host, s.injector_port,
             WEBHOOK_ID)
    if ca is not None and s.injector_webhook:
        rt: GroupLoops = memo.groups
        n = await rt.kube.publish_webhook_ca(s.injector_webhook, ca)
        log.info("injector CA written to %d webhook(s) of %s", n, s.injector_webhook)
        inj.tasks.append(asyncio.create_task(_renew(s, rt, cert_dir, ca)))


@kopf.on.cleanup()
async def stop_injector(memo: Any, **_: Any) -> None:
    inj: Injector = memo.injector
    for t in inj.tasks:
        t.cancel()


@kopf.on.mutate("v1", "pods", id=WEBHOOK_ID, operations=["CREATE"], persistent=True,
                labels={C.LABEL_GROUP: kopf.PRESENT})
async def inject_sidecar(body: kopf.Body, patch: kopf.Patch, memo: Any, **_: Any) -> None:
    inj: Injector = memo.injector
    try:
        injected = inject(copy.deepcopy(dict(body)), inj.defaults)
    except InjectionRefused as exc:
        raise kopf.AdmissionError(str(exc), code=400) from None
    if injected is None:
        return

    def become(raw: Any) -> None:
        raw.clear()
        raw.update(copy.deepcopy(injected))

    patch.fns.append(become)
