"""The operator's settings: one class, read from the environment, overridable by flags.

Every field is documented here and in operator/README.md. Defaults are safe for a single
namespace-less install: watch every namespace, elect a leader through a Lease, and serve
liveness and metrics on loopback only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def _env_list(name: str) -> list[str]:
    return [x.strip() for x in os.environ.get(name, "").split(",") if x.strip()]


@dataclass
class OperatorSettings:
    """Configuration of one operator process."""

    namespaces: list[str] = field(default_factory=list)
    """``KGROUP_NAMESPACES`` (comma-separated): watch only these; empty = all namespaces."""

    peering: str = "lease"
    """``KGROUP_PEERING``: ``lease`` (one active replica via a coordination Lease),
    ``kopf`` (kopf's own peering; needs its peering CRDs) or ``none`` (standalone)."""

    leader_lease_name: str = "kgroup-operator"
    """``KGROUP_LEADER_LEASE``: name of the leader-election Lease."""

    leader_lease_namespace: str = "default"
    """``KGROUP_LEADER_NAMESPACE``: namespace of the leader-election Lease (the pod's own
    namespace in the chart)."""

    leader_lease_seconds: float = 15.0
    """``KGROUP_LEADER_LEASE_SECONDS``: leader Lease duration; renewed every third."""

    identity: str = ""
    """``KGROUP_IDENTITY`` or ``POD_NAME``: this replica's id (default hostname-pid)."""

    liveness_port: int = 8080
    """``KGROUP_LIVENESS_PORT``: kopf's liveness endpoint on 127.0.0.1 (0 = off)."""

    metrics_port: int = 9090
    """``KGROUP_METRICS_PORT``: Prometheus text on ``127.0.0.1:<port>/metrics`` (0 = off)."""

    metrics_host: str = "127.0.0.1"
    """``KGROUP_METRICS_HOST``: bind address of the metrics server."""

    status_min_interval: float = 1.0
    """``KGROUP_STATUS_MIN_INTERVAL``: at most one status write per group per this many
    seconds."""

    verbose: bool = False
    """``KGROUP_LOG_LEVEL=DEBUG`` (or ``--verbose``): kopf's verbose logging."""

    log_level: str = "INFO"
    """``KGROUP_LOG_LEVEL``: DEBUG, INFO, WARNING, ERROR or CRITICAL (the root logger's
    level: WARNING hides every INFO line)."""

    log_format: str = "text"
    """``KGROUP_LOG_FORMAT``: ``text`` or ``json`` (one JSON object per line, kopf's
    formatter)."""

    injector: bool = False
    """``KGROUP_INJECTOR`` (1/true): serve the sidecar injector (a mutating webhook for pods
    labelled ``kgroup.dev/group``; ``kgroup_operator.injector``)."""

    injector_host: str = "127.0.0.1"
    """``KGROUP_INJECTOR_HOST``: the webhook's bind address, and a name in its self-made
    certificate (the chart: the pod's IP; never a wildcard)."""

    injector_port: int = 9443
    """``KGROUP_INJECTOR_PORT``: the webhook's port."""

    injector_dns_names: list[str] = field(default_factory=list)
    """``KGROUP_INJECTOR_DNS_NAMES`` (comma-separated): the names the API server calls the
    webhook by (the chart: its Service's), in the self-made certificate."""

    injector_webhook: str = ""
    """``KGROUP_INJECTOR_WEBHOOK``: the MutatingWebhookConfiguration whose caBundle the
    operator writes with its self-made CA (empty: it writes none)."""

    injector_secret: str = ""
    """``KGROUP_INJECTOR_SECRET``: the Secret (in ``KGROUP_LEADER_NAMESPACE``, the
    operator's) through which every replica shares the self-made certificate; empty:
    ``<KGROUP_INJECTOR_WEBHOOK>-tls``."""

    injector_cert_dir: str = ""
    """``KGROUP_INJECTOR_CERT_DIR``: tls.crt, tls.key and ca.crt (cert-manager's Secret);
    empty: the replicas make one and share it (``injector_secret``)."""

    injector_cert_seconds: float = 365 * 86400.0
    """``KGROUP_INJECTOR_CERT_SECONDS``: validity of the self-made certificate (a year);
    renewed with a third of it left."""

    injector_sidecar: str = ""
    """``KGROUP_INJECTOR_SIDECAR``: the chart's sidecar values as JSON (what the injected
    sidecar is made of; ``kgroup.core.operator.injection.defaults_from_values``)."""

    @classmethod
    def from_env(cls) -> OperatorSettings:
        ident = os.environ.get("KGROUP_IDENTITY") or os.environ.get("POD_NAME") or ""
        if not ident:
            ident = f"{os.uname().nodename}-{os.getpid()}"
        return cls(
            namespaces=_env_list("KGROUP_NAMESPACES"),
            peering=os.environ.get("KGROUP_PEERING", "lease"),
            leader_lease_name=os.environ.get("KGROUP_LEADER_LEASE", "kgroup-operator"),
            leader_lease_namespace=os.environ.get("KGROUP_LEADER_NAMESPACE")
            or os.environ.get("POD_NAMESPACE", "default"),
            leader_lease_seconds=float(os.environ.get("KGROUP_LEADER_LEASE_SECONDS", "15")),
            identity=ident,
            liveness_port=int(os.environ.get("KGROUP_LIVENESS_PORT", "8080")),
            metrics_port=int(os.environ.get("KGROUP_METRICS_PORT", "9090")),
            metrics_host=os.environ.get("KGROUP_METRICS_HOST", "127.0.0.1"),
            status_min_interval=float(os.environ.get("KGROUP_STATUS_MIN_INTERVAL", "1.0")),
            verbose=os.environ.get("KGROUP_LOG_LEVEL", "INFO").upper() == "DEBUG",
            log_level=os.environ.get("KGROUP_LOG_LEVEL", "INFO").upper(),
            log_format=os.environ.get("KGROUP_LOG_FORMAT", "text").lower(),
            injector=os.environ.get("KGROUP_INJECTOR", "").lower() in ("1", "true", "yes"),
            injector_host=os.environ.get("KGROUP_INJECTOR_HOST", "127.0.0.1"),
            injector_port=int(os.environ.get("KGROUP_INJECTOR_PORT", "9443")),
            injector_dns_names=_env_list("KGROUP_INJECTOR_DNS_NAMES"),
            injector_webhook=os.environ.get("KGROUP_INJECTOR_WEBHOOK", ""),
            injector_secret=os.environ.get("KGROUP_INJECTOR_SECRET", ""),
            injector_cert_dir=os.environ.get("KGROUP_INJECTOR_CERT_DIR", ""),
            injector_cert_seconds=float(os.environ.get("KGROUP_INJECTOR_CERT_SECONDS",
                                                       str(365 * 86400))),
            injector_sidecar=os.environ.get("KGROUP_INJECTOR_SIDECAR", ""),
        )
