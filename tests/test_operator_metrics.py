"""The operator's Prometheus exposition and its flags."""

from __future__ import annotations

import pytest

from kgroup.crd_models import LoadStatus
from kgroup_operator.main import parse_args
from kgroup_operator.metrics import Metrics
from kgroup_operator.settings import OperatorSettings


def test_a_rebalance_counts_once_and_adds_its_moves() -> None:
    m = Metrics()
    m.rebalanced(("ns", "g"), 3)
    m.rebalanced(("ns", "g"), 2)
    text = m.render()
    assert 'kgroup_rebalances_total{group="g",group_namespace="ns"} 2.0' in text
    assert 'kgroup_partitions_moved_total{group="g",group_namespace="ns"} 5.0' in text


def test_a_rebalance_duration_lands_in_every_bucket_above_it() -> None:
    m = Metrics()
    m.completed(("ns", "g"), 2.0)
    text = m.render()
    labels = 'group="g",group_namespace="ns"'
    assert f'kgroup_rebalance_duration_seconds_bucket{{{labels},le="1.0"}} 0.0' in text
    assert f'kgroup_rebalance_duration_seconds_bucket{{{labels},le="2.5"}} 1.0' in text
    assert f'kgroup_rebalance_duration_seconds_count{{{labels}}} 1.0' in text


def test_a_forgotten_group_drops_every_series_of_it_and_only_of_it() -> None:
    m = Metrics()
    for key in (("ns", "g"), ("ns", "h")):
        m.observed(key, unowned=1, members=2, partitions=4)
        m.rebalanced(key, 1)
    m.forget(("ns", "g"))
    m.forget(("ns", "never-seen"))
    text = m.render()
    assert 'group="g"' not in text
    assert 'kgroup_members{group="h",group_namespace="ns"} 2.0' in text


def test_no_label_collides_with_a_prometheus_target_label() -> None:
    m = Metrics()
    m.observed(("ns", "g"), unowned=0, members=1, partitions=2)
    m.rebalanced(("ns", "g"), 1)
    m.completed(("ns", "g"), 1.0)
    labels = {name for metric in m.registry.collect() for sample in metric.samples
              for name in sample.labels}
    assert labels >= {"group_namespace", "group"}
    assert not labels & {"namespace", "pod", "job", "instance"}


def test_a_standby_reports_leader_zero_and_its_process() -> None:
    m = Metrics()
    m.set_leader(False)
    text = m.render()
    assert "kgroup_operator_leader 0.0" in text
    assert "process_resident_memory_bytes" in text
    m.set_leader(True)
    assert "kgroup_operator_leader 1.0" in m.render()


def test_namespace_flags_narrow_the_scope() -> None:
    s = parse_args(["-n", "a", "-n", "b"], OperatorSettings())
    assert s.namespaces == ["a", "b"]


def test_log_level_and_format_flags() -> None:
    s = parse_args(["--log-level", "warning", "--log-format", "JSON"], OperatorSettings())
    assert (s.log_level, s.log_format, s.verbose) == ("WARNING", "json", False)
    assert parse_args(["-v"], OperatorSettings()).log_level == "DEBUG"
    with pytest.raises(SystemExit):  # a bad KGROUP_LOG_LEVEL is refused, not a traceback
        parse_args([], OperatorSettings(log_level="LOUD"))


def test_all_namespaces_overrides_the_environment() -> None:
    s = parse_args(["--all-namespaces"], OperatorSettings(namespaces=["x"]))
    assert s.namespaces == []


def test_the_metrics_server_binds_loopback_by_default() -> None:
    assert OperatorSettings().metrics_host == "127.0.0.1"


def test_the_load_gauges_follow_the_status_and_go_with_it() -> None:
    m = Metrics()
    m.loaded(("ns", "g"), LoadStatus(rate=120.5, lag=6000, recommended_members=3))
    text = m.render()
    labels = 'group="g",group_namespace="ns"'
    assert f"kgroup_recommended_members{{{labels}}} 3.0" in text
    assert f"kgroup_load_events_per_second{{{labels}}} 120.5" in text
    assert f"kgroup_load_lag_events{{{labels}}} 6000.0" in text
    m.loaded(("ns", "g"), LoadStatus(rate=1.0))  # no lag, no recommendation yet
    text = m.render()
    assert f"kgroup_recommended_members{{{labels}}}" not in text
    assert f"kgroup_load_lag_events{{{labels}}}" not in text
    m.loaded(("ns", "g"), None)
    assert f"kgroup_load_events_per_second{{{labels}}}" not in m.render()
