"""Prometheus metrics of the operator, as plain text exposition (no extra dependency).

Families: ``kgroup_rebalances_total``, ``kgroup_partitions_moved_total``,
``kgroup_rebalance_duration_seconds`` (histogram), ``kgroup_unowned_partitions``,
``kgroup_members``, ``kgroup_status_writes_total``; all labelled by namespace and group.
Served by aiohttp on loopback only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
Key = tuple[str, str]  # (namespace, group)


@dataclass
class _Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(BUCKETS):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.n += 1


@dataclass
class Metrics:
    rebalances: dict[Key, int] = field(default_factory=dict)
    moved: dict[Key, int] = field(default_factory=dict)
    status_writes: dict[Key, int] = field(default_factory=dict)
    unowned: dict[Key, int] = field(default_factory=dict)
    members: dict[Key, int] = field(default_factory=dict)
    durations: dict[Key, _Histogram] = field(default_factory=dict)

    def rebalanced(self, key: Key, moved: int) -> None:
        self.rebalances[key] = self.rebalances.get(key, 0) + 1
        self.moved[key] = self.moved.get(key, 0) + moved

    def status_written(self, key: Key) -> None:
        self.status_writes[key] = self.status_writes.get(key, 0) + 1

    def completed(self, key: Key, seconds: float) -> None:
        self.durations.setdefault(key, _Histogram()).observe(seconds)

    def observed(self, key: Key, *, unowned: int, members: int) -> None:
        self.unowned[key] = unowned
        self.members[key] = members

    def forget(self, key: Key) -> None:
        for family in (self.unowned, self.members):
            family.pop(key, None)

    def render(self) -> str:
        lines: list[str] = []

        def family(name: str, kind: str, help_: str, values: dict[Key, int]) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            for (ns, group), value in sorted(values.items()):
                lines.append(f'{name}{{namespace="{ns}",group="{group}"}} {value}')

        family("kgroup_rebalances_total", "counter", "Epoch bumps written.", self.rebalances)
        family(
            "kgroup_partitions_moved_total",
            "counter",
            "Partitions moved by rebalances.",
            self.moved,
        )
        family(
            "kgroup_status_writes_total",
            "counter",
            "Status updates written.",
            self.status_writes,
        )
        family("kgroup_unowned_partitions", "gauge", "Partitions with no live owner.", self.unowned)
        family("kgroup_members", "gauge", "Members of the group.", self.members)
        name = "kgroup_rebalance_duration_seconds"
        lines.append(f"# HELP {name} From epoch written to every member settled.")
        lines.append(f"# TYPE {name} histogram")
        for (ns, group), h in sorted(self.durations.items()):
            labels = f'namespace="{ns}",group="{group}"'
            for bound, count in zip(BUCKETS, h.counts, strict=True):
                lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {count}')
            lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {h.n}')
            lines.append(f"{name}_sum{{{labels}}} {h.total}")
            lines.append(f"{name}_count{{{labels}}} {h.n}")
        return "\n".join(lines) + "\n"


async def serve(metrics: Metrics, host: str, port: int) -> web.AppRunner:
    """Start the /metrics endpoint; the caller cleans the returned runner up."""

    async def handle(_: web.Request) -> web.Response:
        return web.Response(text=metrics.render(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
