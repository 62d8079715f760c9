"""The operator's Prometheus exposition and its flags."""

from __future__ import annotations

from kgroup_operator.main import parse_args
from kgroup_operator.metrics import Metrics
from kgroup_operator.settings import OperatorSettings


def test_a_rebalance_counts_once_and_adds_its_moves() -> None:
    m = Metrics()
    m.rebalanced(("ns", "g"), 3)
    m.rebalanced(("ns", "g"), 2)
    text = m.render()
    assert 'kgroup_rebalances_total{namespace="ns",group="g"} 2' in text
    assert 'kgroup_partitions_moved_total{namespace="ns",group="g"} 5' in text


def test_a_rebalance_duration_lands_in_every_bucket_above_it() -> None:
    m = Metrics()
    m.completed(("ns", "g"), 2.0)
    text = m.render()
    assert 'kgroup_rebalance_duration_seconds_bucket{namespace="ns",group="g",le="1.0"} 0' in text
    assert 'kgroup_rebalance_duration_seconds_bucket{namespace="ns",group="g",le="2.5"} 1' in text
    assert 'kgroup_rebalance_duration_seconds_count{namespace="ns",group="g"} 1' in text


def test_a_forgotten_group_drops_its_gauges() -> None:
    m = Metrics()
    m.observed(("ns", "g"), unowned=1, members=2)
    m.forget(("ns", "g"))
    assert "kgroup_members{" not in m.render()


def test_namespace_flags_narrow_the_scope() -> None:
    s = parse_args(["-n", "a", "-n", "b"], OperatorSettings())
    assert s.namespaces == ["a", "b"]


def test_all_namespaces_overrides_the_environment() -> None:
    s = parse_args(["--all-namespaces"], OperatorSettings(namespaces=["x"]))
    assert s.namespaces == []


def test_the_metrics_server_binds_loopback_by_default() -> None:
    assert OperatorSettings().metrics_host == "127.0.0.1"
