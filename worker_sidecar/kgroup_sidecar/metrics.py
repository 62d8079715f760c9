"""Counters and gauges of the sidecar, rendered as Prometheus text (no client library)."""

from __future__ import annotations

from collections import Counter


class Metrics:
    def __init__(self) -> None:
        self.acquisitions = 0
        self.releases = 0
        self.fencings = 0
        self.lost = 0
        self.renew_failures = 0
        self.api_writes: Counter[str] = Counter()
        self.held = 0

    def render(self) -> str:
        lines = [
            "# HELP kgroup_sidecar_held_partitions Partitions this member holds now.",
            "# TYPE kgroup_sidecar_held_partitions gauge",
            f"kgroup_sidecar_held_partitions {self.held}",
        ]
        for name, value, help_text in (
            ("acquisitions", self.acquisitions, "Partition locks acquired."),
            ("releases", self.releases, "Partition locks released."),
            ("fencings", self.fencings, "Sessions fenced (every partition lost at once)."),
            ("lost_partitions", self.lost, "Partitions found taken by another session."),
            ("renew_failures", self.renew_failures, "Failed member-Lease renewals."),
        ):
            lines += [
                f"# HELP kgroup_sidecar_{name}_total {help_text}",
                f"# TYPE kgroup_sidecar_{name}_total counter",
                f"kgroup_sidecar_{name}_total {value}",
            ]
        lines += [
            "# HELP kgroup_sidecar_api_writes_total Kubernetes API writes by verb.",
            "# TYPE kgroup_sidecar_api_writes_total counter",
        ]
        for verb in sorted(set(self.api_writes) | {"create", "update", "delete"}):
            count = self.api_writes[verb]
            lines.append(f'kgroup_sidecar_api_writes_total{{verb="{verb}"}} {count}')
        return "\n".join(lines) + "\n"
