"""The app's per-partition health in the sidecar: reports in, summary and gauges out.

``POST /v1/health`` feeds :class:`kgroup.core.health.HealthBook` (in memory only); each
member-Lease renewal the sidecar writes anyway carries the book's summary
(``kgroup.dev/health``), and ``/metrics`` shows per partition the reported lag and
whether it is stalled (judged at scrape time, so a partition no longer held disappears).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kgroup.core.health import HealthBook, PartitionHealth, parse_reports
from kgroup.core.load import encode_load
from kgroup_sidecar.metrics import IDENTITY

Held = Callable[[], Mapping[int, int]]
"""-> partition: token of every partition the member holds now."""
LOAD_FRESH_SECONDS = 60.0
"""A partition's rate counts on the renewals for this long after the app reported it."""
Observed = Callable[[Mapping[int, int], float, Container[int] | None], Mapping[int, str]]
"""(held, now, reported) -> partition: why, for each held partition the sidecar sees
stalled (``kgroup.core.member.app_presence.AppPresence.stalls``)."""


class SidecarHealth(Collector):
    """Registered in the sidecar's metrics registry (``kgroup_sidecar.metrics``), so the
    lag and stall gauges carry the same identity labels and are served wherever the other
    sidecar metrics are (the local API's ``/metrics`` and ``KGROUP_METRICS_LISTEN``)."""

    def __init__(self, *, identity: tuple[str, str, str], held: Held,
                 clock: Callable[[], float], stall_after: float,
                 registry: CollectorRegistry | None = None,
                 observed: Observed | None = None,
                 silent_after: float | None = None) -> None:
        self.identity = identity  # (group_namespace, group, member): metrics.IDENTITY
        self.held = held
        self.clock = clock
        # partitions the sidecar itself sees stalled (its app's part), with why
        self.observed: Observed = observed or (lambda held, now, reported: {})
        self.book = HealthBook(stall_after=stall_after, silent_after=silent_after)
        # called once per partition when it turns stalled (the runtime posts an Event)
        self.on_stalled: Callable[[PartitionHealth], None] | None = None
        self._stalled: set[int] = set()
        if registry is not None:
            registry.register(self)

    def report(self, body: Any) -> tuple[int, dict[str, Any]]:
        """``POST /v1/health``: -> (HTTP status, JSON answer)."""
        items = body.get("partitions") if isinstance(body, dict) else None
        if not isinstance(items, list):
            return 400, {"error": 'body must be {"partitions": [{"partition": int, '
                                  '"token": int, "position": str|null, "lag": int|null, '
                                  '"stalled": bool, "reason": str, '
                                  '"rate": number|null}, ...]}'}
        reports = parse_reports(items)
        if isinstance(reports, str):
            return 400, {"error": reports}
        refused = self.book.report_all(reports, self.held(), self.clock())
        return 200, {"accepted": len(reports) - len(refused),
                     "refused": [{"partition": p, "error": why} for p, why in refused]}

    def _observed(self, held: Mapping[int, int], now: float) -> Mapping[int, str]:
        self.book.prune(held)  # a report under another token is no report of this one
        return self.observed(held, now, self.book.reported())

    def judge(self) -> list[PartitionHealth]:
        held, now = self.held(), self.clock()
        return self.book.judge(held, now, self._observed(held, now))

    def summary(self) -> str | None:
        """The ``kgroup.dev/health`` annotation for the next renewal; a partition that
        turned stalled since the last one is passed to ``on_stalled`` (once per stall)."""
        held, now = self.held(), self.clock()
        judged, text = self.book.summarize(held, now, self._observed(held, now))
        stalled = {h.partition: h for h in judged}
        if self.on_stalled is not None:
            for p in sorted(set(stalled) - self._stalled):
                self.on_stalled(stalled[p])
        self._stalled = set(stalled)
        return text

    def load(self) -> str | None:
        """The ``kgroup.dev/load`` annotation for the next renewal: the held partitions'
        fresh rates and lags (``kgroup.core.load``)."""
        rates, lags = self.book.loads(self.held(), self.clock(), LOAD_FRESH_SECONDS)
        return encode_load(rates, lags)

    def collect(self) -> Iterable[Metric]:
        lag = GaugeMetricFamily(
            "kgroup_sidecar_partition_lag",
            "Lag the app last reported for a held partition (stream entries behind).",
            labels=[*IDENTITY, "partition"])
        stalled = GaugeMetricFamily(
            "kgroup_sidecar_partition_stalled",
            "1 while a held partition is stalled (reported so, or no progress with lag).",
            labels=[*IDENTITY, "partition"])
        for h in self.judge():
            labels = [*self.identity, str(h.partition)]
            if h.lag is not None:
                lag.add_metric(labels, float(h.lag))
            stalled.add_metric(labels, 1.0 if h.stalled else 0.0)
        yield lag
        yield stalled

    def describe(self) -> Iterable[Metric]:
        """The families without samples: registering reads no state (held() may not work
        before the sidecar runs)."""
        yield GaugeMetricFamily("kgroup_sidecar_partition_lag", "", labels=[*IDENTITY, "partition"])
        yield GaugeMetricFamily("kgroup_sidecar_partition_stalled", "",
                                labels=[*IDENTITY, "partition"])
