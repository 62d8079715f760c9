"""The sidecar's metrics registry: identity labels, per-partition series, exposition."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from kgroup.core.assignment import PartitionView, View
from kgroup_sidecar.metrics import Metrics

IDENTITY = 'group="g",group_namespace="ns",member="pod-0"'


def metrics() -> Metrics:
    return Metrics(namespace="ns", group="g", member="pod-0")


def view(*parts: tuple[int, int, str], fenced: bool = False, acked: int | None = 3) -> View:
    return View(member="pod-0", session="s", version=1, epoch=3, acked_epoch=acked,
                fenced=fenced, valid_for_seconds=5.0,
                partitions=tuple(PartitionView(p, t, st, None, None) for p, t, st in parts))


def test_events_count_with_the_members_identity() -> None:
    m = metrics()
    m.acquired()
    m.acquired()
    m.fenced()
    m.api_write("update")
    m.api_write("patch")
    text = m.render()
    assert f"kgroup_sidecar_acquisitions_total{{{IDENTITY}}} 2.0" in text
    assert f"kgroup_sidecar_fencings_total{{{IDENTITY}}} 1.0" in text
    assert f'kgroup_sidecar_api_writes_total{{{IDENTITY},verb="create"}} 0.0' in text
    assert m.api_writes() == 2.0
    assert m.value("kgroup_sidecar_fencings_total") == 1.0


def test_a_released_partition_leaves_no_series_behind() -> None:
    m = metrics()
    m.publish(view((1, 7, "active"), (4, 2, "revoking")))
    text = m.render()
    assert f'kgroup_sidecar_partition_token{{{IDENTITY},partition="1"}} 7.0' in text
    assert f'kgroup_sidecar_partition_revoking{{{IDENTITY},partition="4"}} 1.0' in text
    assert f"kgroup_sidecar_held_partitions{{{IDENTITY}}} 2.0" in text
    m.publish(view((1, 7, "active")))
    text = m.render()
    assert 'partition="4"' not in text
    assert f"kgroup_sidecar_acknowledged_epoch{{{IDENTITY}}} 3.0" in text
    m.publish(view(fenced=True))
    assert "partition=" not in m.render()
    assert m.value("kgroup_sidecar_fenced") == 1.0


class CountedPartitions(tuple[PartitionView, ...]):
    """A view's partitions that count how often they are walked."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().__iter__()


def test_publishing_costs_nothing_per_partition_and_a_scrape_reads_the_view() -> None:
    """A member publishes after every request chain: 1,000 acquisitions must not cost
    1,000 x 1,000 series writes, nor 2,000 gauge children kept. Publishing
    walks no partition; a scrape walks them once and shows the last view's values."""
    m = metrics()
    held = CountedPartitions(PartitionView(p, p + 100, "active", None, None)
                             for p in range(1000))
    big = View(member="pod-0", session="s", version=1, epoch=3, acked_epoch=3,
               fenced=False, valid_for_seconds=5.0, partitions=held)
    CountedPartitions.walks = 0
    for _ in range(50):
        m.publish(big)
    assert CountedPartitions.walks == 0
    text = m.render()
    assert CountedPartitions.walks == 1
    assert text.count("kgroup_sidecar_partition_token{") == 1000
    assert m.value("kgroup_sidecar_partition_token", partition="999") == 1099.0
    m.publish(view(*((p, p + 100, "active") for p in range(10))))  # 990 released
    assert m.value("kgroup_sidecar_partition_token", partition="999") == 0.0
    assert m.value("kgroup_sidecar_partition_token", partition="9") == 109.0
    assert m.render().count("kgroup_sidecar_partition_revoking{") == 10


def test_no_label_collides_with_a_prometheus_target_label() -> None:
    m = metrics()
    m.publish(view((1, 7, "active")))
    m.api_write("create")
    labels = {name for metric in m.registry.collect() for sample in metric.samples
              for name in sample.labels}
    assert labels >= {"group_namespace", "group", "member", "partition", "verb"}
    assert not labels & {"namespace", "pod", "job", "instance"}


def test_process_metrics_and_openmetrics_on_request() -> None:
    m = metrics()
    assert "process_cpu_seconds_total" in m.render()
    body, content_type = m.exposition("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")
    body, content_type = m.exposition("")
    assert content_type.startswith("text/plain") and b"# EOF" not in body


def test_two_sidecars_in_one_process_count_apart() -> None:
    a, b = metrics(), Metrics(namespace="ns", group="g", member="pod-1")
    a.fenced()
    assert (a.value("kgroup_sidecar_fencings_total"),
            b.value("kgroup_sidecar_fencings_total")) == (1.0, 0.0)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool: scripts/setup.sh")
def test_promtool_accepts_the_exposition_and_refuses_a_broken_one() -> None:
    m = metrics()
    m.publish(view((1, 7, "active")))
    m.acquired()
    ok = subprocess.run(["promtool", "check", "metrics"], input=m.render(), text=True,
                        capture_output=True, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = ("# HELP kgroup_sidecar_fencings Sessions fenced.\n"
              "# TYPE kgroup_sidecar_fencings counter\nkgroup_sidecar_fencings 1\n")
    bad = subprocess.run(["promtool", "check", "metrics"], input=broken, text=True,
                         capture_output=True, check=False)
    assert bad.returncode != 0 and "_total" in bad.stdout + bad.stderr
