"""Every kopf decorator of the operator, and nothing else: each handler only feeds the
in-memory :class:`~kgroup.core.operator.lease_cache.Cache` and pokes the group loops that care.

Watched: ConsumerGroups, pods and StatefulSets (in the operator's namespace scope).
Leases are not kopf's: each existing group's Leases are watched by their group label
(``lease_watch``), so Leases naming groups that do not exist never reach the process, and
a member's renewal costs a line read and a cache update, not kopf's per-event work (it
was most of the operator's CPU while a group was stable). No handler lists or polls; the
only listing is the initial one at start-up, so that no group is reconciled before the
caches are complete (a group reconciled against half a cache would see members "leave"
and move partitions).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf
import orjson

from kgroup import constants as C
from kgroup.apiclient import SERVICE_ACCOUNT
from kgroup.core.operator.injection import needs_sidecar

from .groups import GroupLoops

log = logging.getLogger(__name__)


def _rt(memo: Any) -> GroupLoops:
    rt: GroupLoops = memo.groups
    return rt


@kopf.on.login()
def login(settings: kopf.OperatorSettings, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's credentials, from the source the operator's own client reads
    (:func:`kgroup.apiclient.default_config`): ``KUBECONFIG`` or, outside a pod,
    ``~/.kube/config`` (kopf's own kubeconfig login); in a pod the service account at
    ``KUBERNETES_SERVICE_HOST``/``_PORT``, as client-go reaches it (kopf's own
    service-account login names ``kubernetes.default.svc``, a name to resolve). kopf calls
    this again after a 401, so a rotated token is read again. Registering it also keeps
    kopf from logging in through the ``kubernetes`` client when one is installed."""
    account_token = SERVICE_ACCOUNT / "token"
    if os.environ.get("KUBECONFIG") or not account_token.exists():
        return kopf.login_with_kubeconfig(settings=settings, **kwargs)
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get(
        "KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise kopf.LoginError("in a pod without KUBERNETES_SERVICE_HOST/PORT")
    namespace = SERVICE_ACCOUNT / "namespace"
    return kopf.ConnectionInfo(
        server=f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}",
        ca_path=str(SERVICE_ACCOUNT / "ca.crt"),
        token=account_token.read_text().strip() or None,
        default_namespace=namespace.read_text().strip() if namespace.exists() else None,
        trust_env=settings.networking.trust_env)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    settings.posting.enabled = False  # our Events are posted explicitly (kube.post_event)
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kgroup.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kgroup.dev", key="last-handled-configuration"
    )
    # No dynamic scanning of namespaces and CRDs: the operator's RBAC grants neither (least
    # privilege), and with scanning on kopf retries those forbidden lists for about a
    # minute before it serves anything (an operator restart took 55-75 s). The resources
    # come from API discovery at start; the chart installs the CRD before the operator.
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    await _rt(memo).start()


def health(rt: GroupLoops) -> dict[str, Any]:
    """What the liveness probe reports; raises :class:`kopf.PermanentError` (kopf answers
    500) while a group's loop cannot do its job: it ended, or keeps failing for a reason
    other than the API server (``GroupController.problem``)."""
    problems = rt.problems()
    if problems:
        log.error("unhealthy: %s", "; ".join(problems))
        raise kopf.PermanentError("; ".join(problems)[:1000])
    return {"groups": len(rt.controllers), "synced": rt.cache.synced}


@kopf.on.probe(id="groups")
async def liveness(memo: Any, **_: Any) -> dict[str, Any]:
    """kopf's ``/healthz`` (the pod's liveness probe): the kubelet restarts an operator
    that plans nothing instead of trusting a healthy-looking process."""
    return health(_rt(memo))


@kopf.on.cleanup()
async def cleanup(memo: Any, **_: Any) -> None:
    await _rt(memo).stop()


@kopf.on.event(C.API_GROUP, C.API_VERSION, C.PLURAL)
async def group_event(
    type: str, body: kopf.Body, namespace: str | None, name: str, memo: Any, **_: Any
) -> None:
    rt = _rt(memo)
    if namespace is None:
        return
    if type == "DELETED":
        await rt.group_deleted((namespace, name))
    else:
        # a copy of its own (kopf's body is a view): orjson's round trip costs a tenth of
        # copy.deepcopy's, which showed in profiles at every status write of a large group
        rt.group_seen((namespace, name), orjson.loads(orjson.dumps(dict(body))))
        await rt.report_bare_pods((namespace, name))


@kopf.on.event("v1", "pods")
async def pod_event(
    type: str, body: kopf.Body, namespace: str | None, name: str, memo: Any, **_: Any
) -> None:
    rt = _rt(memo)
    if namespace is None:
        return
    if type == "DELETED":
        old = rt.cache.drop_pod(namespace, name)
        rt.poke_pod(namespace, old, None)
        rt.pod_gone(namespace, dict(body))
    else:
        old, new = rt.cache.put_pod(namespace, body)
        if old != new:
            rt.poke_pod(namespace, old, new)
        if needs_sidecar(body):
            await rt.report_missing_sidecar(namespace, dict(body))


@kopf.on.event("apps", "v1", "statefulsets")
async def statefulset_event(
    type: str, body: kopf.Body, namespace: str | None, name: str, memo: Any, **_: Any
) -> None:
    """A StatefulSet's replicas decide whether a departed pod's name comes back (a scaled
    down pod's partitions are handed out at once, not after the restart grace)."""
    rt = _rt(memo)
    if namespace is None:
        return
    if type == "DELETED":
        rt.cache.drop_statefulset(namespace, name)
    elif not rt.cache.put_statefulset(namespace, body):
        return
    rt.poke_namespace(namespace)
