"""The sidecar's Prometheus metrics, kept by prometheus-client in one registry per sidecar.

Every family is named ``kgroup_sidecar_*`` and carries the member's identity as labels
``group_namespace``, ``group`` and ``member`` (never ``namespace``/``pod``/``job``/
``instance``: those are the scraper's target labels, and a clash would be renamed
``exported_*`` or overwrite them). Per-partition families add ``partition``; they are
read from the member's state at scrape time (:class:`HeldPartitions`, and the health
collector), so a series exists only while the member holds the partition and a released
one disappears from the next scrape instead of lingering with its old value. The
registry also holds the default process, platform and GC collectors.

One registry per :class:`Metrics`, not the library's global one: a test process or the
scale swarm runs many sidecars side by side, each with its own counts.

Served twice: on the local API (``GET /metrics``, for the app and the probes) and, when
``KGROUP_METRICS_LISTEN`` is set, on its own TCP address for a scraper outside the pod
(:func:`serve`). Other modules add families through :meth:`Metrics.gauge` or
:meth:`Metrics.counter` (the identity labels are bound for them), or register a collector.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web
from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kgroup import __version__
from kgroup.core.assignment import View
from kgroup.metrics_http import exposition, serve_registry

IDENTITY = ("group_namespace", "group", "member")
VERBS = ("create", "update", "delete")


class HeldPartitions(Collector):
    """The per-partition families of what the member holds (``partition_token``,
    ``partition_revoking``), read from the last published view at scrape time.

    Not prometheus-client gauges with a child per partition: a child costs ≈ 750 bytes
    and a write per change, so 1,000 held partitions kept 1.5 MB of children and every
    publish (after each request chain) compared 2,000 values (a sidecar's memory and CPU at
    1,000 partitions). A scrape costs what it shows; publishing costs nothing
    per partition. A released partition is absent from the next scrape."""

    def __init__(self, identity: tuple[str, str, str]) -> None:
        self.identity = identity
        self.view: View | None = None

    def collect(self) -> Iterable[Metric]:
        token = GaugeMetricFamily(
            "kgroup_sidecar_partition_token",
            "Fencing token of each partition this member holds (a series per held "
            "partition; none once released).", labels=[*IDENTITY, "partition"])
        revoking = GaugeMetricFamily(
            "kgroup_sidecar_partition_revoking",
            "1 while a held partition is being revoked (the app is finishing its work), "
            "0 while active.", labels=[*IDENTITY, "partition"])
        for p in self.view.partitions if self.view is not None else ():
            labels = [*self.identity, str(p.partition)]
            token.add_metric(labels, float(p.token))
            revoking.add_metric(labels, 1.0 if p.state == "revoking" else 0.0)
        yield token
        yield revoking

    def describe(self) -> Iterable[Metric]:
        """The families without samples (registering reads no view)."""
        for name in ("kgroup_sidecar_partition_token", "kgroup_sidecar_partition_revoking"):
            yield GaugeMetricFamily(name, "", labels=[*IDENTITY, "partition"])


class Metrics:
    """The sidecar's counters and gauges (one registry, the identity labels bound)."""

    def __init__(self, *, namespace: str = "", group: str = "", member: str = "",
                 process: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.identity = (namespace, group, member)
        if process:
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            if GC_COLLECTOR is not None:
                GCCollector(registry=self.registry)
        Info("kgroup_build", "The kgroup version running (component: operator or sidecar).",
             [*IDENTITY, "component"], registry=self.registry).labels(
                 *self.identity, "sidecar").info({"version": __version__})
        self._acquisitions = self.counter(
            "kgroup_sidecar_acquisitions", "Partition locks acquired.")
        self._releases = self.counter(
            "kgroup_sidecar_releases", "Partition locks released (handed over or given back).")
        self._fencings = self.counter(
            "kgroup_sidecar_fencings",
            "Sessions fenced: the member Lease could not be renewed in time, every "
            "partition was given up at once.")
        self._lost = self.counter(
            "kgroup_sidecar_lost_partitions",
            "Partitions found taken by another session while this member held them.")
        self._renew_failures = self.counter(
            "kgroup_sidecar_renew_failures", "Failed member-Lease renewals.")
        api_writes = Counter(
            "kgroup_sidecar_api_writes", "Kubernetes API writes (Leases), by verb.",
            [*IDENTITY, "verb"], registry=self.registry)
        self._api_writes = {verb: api_writes.labels(*self.identity, verb) for verb in VERBS}
        self._api_writes_family = api_writes
        self._held = self.gauge(
            "kgroup_sidecar_held_partitions",
            "Partitions this member holds now (active or revoking), as its app sees them.")
        self._fenced = self.gauge(
            "kgroup_sidecar_fenced",
            "1 while this member has no valid session (fenced, or not started yet).")
        self._epoch = self.gauge(
            "kgroup_sidecar_acknowledged_epoch",
            "The group epoch this member last acknowledged in its member Lease.")
        self.held_partitions = HeldPartitions(self.identity)
        self.registry.register(self.held_partitions)
        self._fenced.set(1)

    # ---- families for other modules ---------------------------------------------------

    def counter(self, name: str, documentation: str) -> Counter:
        """A counter of this member (``name`` without ``_total``; the library adds it)."""
        family = Counter(name, documentation, IDENTITY, registry=self.registry)
        return family.labels(*self.identity)

    def gauge(self, name: str, documentation: str) -> Gauge:
        """A gauge of this member."""
        family = Gauge(name, documentation, IDENTITY, registry=self.registry)
        return family.labels(*self.identity)

    # ---- what happened ----------------------------------------------------------------

    def acquired(self) -> None:
        self._acquisitions.inc()

    def released(self) -> None:
        self._releases.inc()

    def fenced(self) -> None:
        self._fencings.inc()

    def lost_partition(self) -> None:
        self._lost.inc()

    def renew_failed(self) -> None:
        self._renew_failures.inc()

    def api_write(self, verb: str) -> None:
        child = self._api_writes.get(verb)
        if child is None:
            child = self._api_writes[verb] = self._api_writes_family.labels(*self.identity, verb)
        child.inc()

    def publish(self, view: View) -> None:
        """The member's state now: held partitions, their tokens and states, the epoch."""
        self._held.set(len(view.partitions))
        self._fenced.set(1 if view.fenced else 0)
        if view.acked_epoch is not None:
            self._epoch.set(view.acked_epoch)
        self.held_partitions.view = view  # read at scrape time, not copied

    # ---- reading ----------------------------------------------------------------------

    def value(self, name: str, **labels: str) -> float:
        """One sample's value (0 when absent), e.g. ``value("kgroup_sidecar_fencings_total")``;
        the identity labels are filled in."""
        found = self.registry.get_sample_value(name, dict(zip(IDENTITY, self.identity,
                                                               strict=True), **labels))
        return found or 0.0

    def api_writes(self) -> float:
        """Every Lease write this member made."""
        return sum(self.value("kgroup_sidecar_api_writes_total", verb=v)
                   for v in self._api_writes)

    def render(self) -> str:
        """The Prometheus text format (0.0.4)."""
        return generate_latest(self.registry).decode()

    def exposition(self, accept: str) -> tuple[bytes, str]:
        """Body and content type for a scrape's ``Accept`` header (OpenMetrics if asked)."""
        return exposition(self.registry, accept)


async def serve(metrics: Metrics, host: str, port: int) -> web.AppRunner:
    """``GET /metrics`` alone on ``host:port`` (``KGROUP_METRICS_LISTEN``), for a scraper
    outside the pod; the local API stays where it is. The caller cleans the runner up."""
    return await serve_registry(metrics.registry, host, port)
