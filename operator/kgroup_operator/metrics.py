"""The operator's Prometheus metrics, kept by prometheus-client in the operator's registry.

Families (per group, labels ``group_namespace`` and ``group``: never ``namespace``, which
is the scraper's own target label for the operator pod's namespace):
``kgroup_rebalances_total``, ``kgroup_partitions_moved_total``,
``kgroup_status_writes_total``, ``kgroup_planning_passes_total`` (counters),
``kgroup_rebalance_duration_seconds`` (histogram: from the epoch written to every member
settled), ``kgroup_unowned_partitions``, ``kgroup_members``, ``kgroup_partitions``
(gauges); ``kgroup_recommended_members``, ``kgroup_load_events_per_second``,
``kgroup_load_lag_events`` (gauges from ``status.load``, present only while the group's
apps report load: what an HPA on an external metric, or KEDA's prometheus scaler, reads);
``kgroup_operator_leader`` (1 on the active replica, 0 on a standby);
``kgroup_build_info{component="operator",version=...}``; and the default process, platform
and GC collectors.

The server starts before leader election (``main.run``), so a standby answers a scrape
too: leader 0 and its process metrics. One registry per :class:`Metrics` (not the
library's global one), so tests can run several side by side.
"""

from __future__ import annotations

import contextlib
import logging

from aiohttp import web
from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from kgroup import __version__
from kgroup.crd_models import LoadStatus
from kgroup.metrics_http import serve_registry

log = logging.getLogger(__name__)

BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
LABELS = ("group_namespace", "group")
Key = tuple[str, str]  # (namespace, group)


class Metrics:
    """The operator's families in their own registry."""

    def __init__(self, *, process: bool = True) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        if process:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            if GC_COLLECTOR is not None:
                GCCollector(registry=r)
        Info("kgroup_build", "The kgroup version running (component: operator or sidecar).",
             registry=r).info({"component": "operator", "version": __version__})
        self.leader = Gauge("kgroup_operator_leader",
                            "1 while this replica is the active operator, 0 while it stands by.",
                            registry=r)
        self.rebalances = Counter("kgroup_rebalances", "Epoch bumps written (target changes).",
                                  LABELS, registry=r)
        self.moved = Counter("kgroup_partitions_moved",
                             "Partitions whose owner changed in a rebalance.", LABELS, registry=r)
        self.status_writes = Counter("kgroup_status_writes",
                                     "ConsumerGroup status updates written.", LABELS, registry=r)
        self.passes = Counter("kgroup_planning_passes",
                              "Planning passes (decide) run: material changes and deadlines "
                              "only, not member renewals.", LABELS, registry=r)
        self.durations = Histogram("kgroup_rebalance_duration_seconds",
                                   "From an epoch written to every member settled on it.",
                                   LABELS, buckets=BUCKETS, registry=r)
        self.unowned = Gauge("kgroup_unowned_partitions",
                             "Partitions with no live owner.", LABELS, registry=r)
        self.members = Gauge("kgroup_members", "Members of the group.", LABELS, registry=r)
        self.partitions = Gauge("kgroup_partitions", "Partitions of the group (spec).", LABELS,
                                registry=r)
        self.stalled = Gauge("kgroup_stalled_partitions",
                             "Partitions whose owner's app reports no progress (status.stalled).",
                             LABELS, registry=r)
        self.recommended = Gauge("kgroup_recommended_members",
                                 "Members the group needs (status.load.recommendedMembers).",
                                 LABELS, registry=r)
        self.rate = Gauge("kgroup_load_events_per_second",
                          "Events/s the group's apps report processing (status.load.rate).",
                          LABELS, registry=r)
        self.lag = Gauge("kgroup_load_lag_events",
                         "Events behind, as the group's apps report (status.load.lag).",
                         LABELS, registry=r)
        self._load = (self.recommended, self.rate, self.lag)
        self._families: tuple[Counter | Gauge | Histogram, ...] = (
            self.rebalances, self.moved, self.status_writes, self.passes, self.durations,
            self.unowned, self.members, self.partitions, self.stalled, *self._load)

    def set_leader(self, leader: bool) -> None:
        self.leader.set(1 if leader else 0)

    def rebalanced(self, key: Key, moved: int) -> None:
        self.rebalances.labels(*key).inc()
        self.moved.labels(*key).inc(moved)

    def status_written(self, key: Key) -> None:
        self.status_writes.labels(*key).inc()

    def planned(self, key: Key) -> None:
        self.passes.labels(*key).inc()

    def completed(self, key: Key, seconds: float) -> None:
        self.durations.labels(*key).observe(seconds)

    def observed(self, key: Key, *, unowned: int, members: int,
                 partitions: int | None = None, stalled: int = 0) -> None:
        self.unowned.labels(*key).set(unowned)
        self.stalled.labels(*key).set(stalled)
        self.members.labels(*key).set(members)
        if partitions is not None:
            self.partitions.labels(*key).set(partitions)

    def loaded(self, key: Key, load: LoadStatus | None) -> None:
        """``status.load`` as last taken; None: the group reports no load (no series)."""
        figures = (None, None, None) if load is None else (
            load.recommended_members, load.rate, load.lag)
        for gauge, value in zip(self._load, figures, strict=True):
            if value is None:
                with contextlib.suppress(KeyError):
                    gauge.remove(*key)
            else:
                gauge.labels(*key).set(value)

    def forget(self, key: Key) -> None:
        """A deleted group: every series of it goes (a counter reset is what Prometheus'
        ``rate`` expects when the thing counted disappears)."""
        for family in self._families:
            with contextlib.suppress(KeyError):
                family.remove(*key)

    def render(self) -> str:
        """The Prometheus text format (0.0.4)."""
        return generate_latest(self.registry).decode()


async def serve(metrics: Metrics, host: str, port: int) -> web.AppRunner:
    """Start ``GET /metrics`` on ``host:port``; the caller cleans the returned runner up.
    OpenMetrics when the scraper asks for it (``Accept``), else the text format."""
    return await serve_registry(metrics.registry, host, port)
