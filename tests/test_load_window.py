"""The operator's load window: every renewal's load report of the last 30 s, averaged,
and the noise they show widening the balance's band (kgroup.core.operator.load_window,
load_status.group_load, load_balance.LoadBalance.noise)."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from kgroup import constants as C
from kgroup.core.load import encode_load
from kgroup.core.operator.assignors import Assignee
from kgroup.core.operator.lease_cache import GroupLeases
from kgroup.core.operator.load_balance import LoadBalance, plan_load_balance
from kgroup.core.operator.load_status import NOISE_SIGMAS, group_load
from kgroup.core.operator.load_window import (
    LOAD_WINDOW_MAX_SECONDS,
    LOAD_WINDOW_REPORTS,
    LoadWindow,
)
from kgroup.core.operator.status import MemberLeaseObservation


def test_a_repeated_report_is_one_run_and_the_window_keeps_the_latest_reports() -> None:
    w = LoadWindow(reports=4)
    w.add("a", 0.0)
    w.add("a", 2.0)
    w.add("b", 4.0)
    assert w.samples() == (("a", 2), ("b", 1))
    w.add("c", 6.0)
    w.add("d", 8.0)  # five reports: the oldest "a" goes
    assert w.samples() == (("a", 1), ("b", 1), ("c", 1), ("d", 1))
    w.add("e", 10.0)
    assert w.samples() == (("b", 1), ("c", 1), ("d", 1), ("e", 1))
    w.add("f", 10.0 + LOAD_WINDOW_MAX_SECONDS + 0.1)  # all but "f" were seen too long ago
    assert w.samples() == (("f", 1),)
    shipped = LoadWindow()
    for i in range(3 * LOAD_WINDOW_REPORTS):
        shipped.add(str(i % 5), float(i))
    assert sum(n for _, n in shipped.samples()) == LOAD_WINDOW_REPORTS


def test_a_one_report_window_keeps_the_latest_only_and_none_is_refused() -> None:
    w = LoadWindow(reports=1)
    w.add("a", 0.0)
    w.add("a", 1.0)
    w.add("b", 2.0)
    assert w.samples() == (("b", 1),)
    with pytest.raises(ValueError, match="at least the latest"):
        LoadWindow(reports=0)


def member_body(rv: int, load: str | None, member: str = "m-0") -> dict[str, Any]:
    notes = {C.ANNOTATION_SESSION: "s-1", C.ANNOTATION_EPOCH: "1"}
    if load is not None:
        notes[C.ANNOTATION_LOAD] = load
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": f"g-member-{member}", "namespace": "ns",
                         "resourceVersion": str(rv), "annotations": notes,
                         "labels": {C.LABEL_GROUP: "g", C.LABEL_ROLE: C.ROLE_MEMBER,
                                    C.LABEL_MEMBER: member}},
            "spec": {"holderIdentity": member, "leaseDurationSeconds": 6,
                     "renewTime": "2026-01-01T00:00:00.000000Z"}}


def test_the_cache_keeps_each_new_write_once_and_forgets_a_lease_that_stops_reporting(
) -> None:
    leases = GroupLeases()
    first, second = encode_load({0: 10.0}, {}), encode_load({0: 14.0}, {})
    assert first is not None and second is not None
    leases.put(member_body(1, first), 0.0)
    leases.put(member_body(2, second), 2.0)
    leases.put(member_body(2, second), 2.5)  # a replayed event or a re-list: no new sample
    seen = leases.member_observations()["m-0"]
    assert seen.load_samples == ((first, 1), (second, 1))
    assert seen.load_annotation == second
    leases.put(member_body(3, None), 4.0)
    assert leases.member_observations()["m-0"].load_samples == ()


def observation(samples: list[tuple[dict[int, float], int]], lag: int | None = None
                ) -> MemberLeaseObservation:
    raws = []
    for i, (rates, n) in enumerate(samples):
        raw = encode_load(rates, {0: lag} if lag is not None and i == len(samples) - 1 else {})
        assert raw is not None
        raws.append((raw, n))
    return MemberLeaseObservation("a", "s-a", None, None, raws[-1][0], tuple(raws))


def test_rates_are_the_window_mean_and_the_lag_the_latest() -> None:
    seen = observation([({0: 10.0, 1: 4.0}, 3), ({0: 20.0, 1: 4.0}, 1)], lag=7)
    load = group_load({"a": seen}, {0: "a", 1: "a"}, partitions=2)
    assert load is not None
    assert load.partition_rates == pytest.approx({0: 12.5, 1: 4.0}, rel=3e-3)
    assert load.member_rates["a"] == pytest.approx(16.5, rel=3e-3)
    assert load.lag == 7
    # without the window (the latest report alone) the figures are the latest's
    latest = MemberLeaseObservation("a", "s-a", None, None, seen.load_annotation)
    alone = group_load({"a": latest}, {0: "a", 1: "a"}, partitions=2)
    assert alone is not None and alone.partition_rates[0] == pytest.approx(20.0, rel=3e-3)


def test_a_partition_taken_over_lately_counts_at_its_own_mean_in_the_total() -> None:
    # partition 1 joined the member half-way through its window: the earlier reports
    # do not carry it, so the mean of the reports' totals (150) would count it at 0 in
    # them, where the member now does 200/s
    seen = observation([({0: 100.0}, 16), ({0: 100.0, 1: 100.0}, 16)])
    load = group_load({"a": seen}, {0: "a", 1: "a"}, partitions=2)
    assert load is not None
    assert load.partition_rates == pytest.approx({0: 100.0, 1: 100.0}, rel=3e-3)
    assert load.member_rates["a"] == pytest.approx(200.0, rel=3e-3)
    # a partition given away is out of every report's total alike
    gave = group_load({"a": seen}, {0: "a"}, partitions=2)
    assert gave is not None and gave.member_rates["a"] == pytest.approx(100.0, rel=3e-3)


def test_agreeing_reports_have_no_noise_and_scattered_ones_have_their_standard_error(
) -> None:
    steady = observation([({0: 10.0}, 15)])
    load = group_load({"a": steady}, {0: "a"}, partitions=1)
    assert load is not None and load.noise(["a"]) == 0.0
    rng = random.Random(3)
    draws = [10.0 * rng.uniform(0.8, 1.2) for _ in range(15)]
    noisy = observation([({0: d}, 1) for d in draws])
    load = group_load({"a": noisy}, {0: "a"}, partitions=1)
    assert load is not None
    mean = sum(draws) / len(draws)
    error = math.sqrt(sum((d - mean) ** 2 for d in draws) / (len(draws) - 1) / len(draws))
    assert load.noise(["a"]) == pytest.approx(NOISE_SIGMAS * error / mean, rel=0.01)


def test_noise_widens_the_dead_zone_and_the_gain_a_rebalance_must_make() -> None:
    # a at 1.25x the mean: above the shipped trigger (1.20), below it plus 0.1 of noise
    members = [Assignee("a"), Assignee("b")]
    current = {"a": [0, 1], "b": [2, 3]}
    loads = {0: 10.0, 1: 2.5, 2: 4.0, 3: 3.5}
    holders = {p: m for m, ps in current.items() for p in ps}
    quiet = plan_load_balance(4, members, current, holders, loads, {}, 1000.0,
                              LoadBalance(noise=0.1))
    assert quiet.moved == ()
    moved = plan_load_balance(4, members, current, holders, loads, {}, 1000.0, LoadBalance())
    assert moved.moved != ()
    with pytest.raises(ValueError, match="noise"):
        LoadBalance(noise=-0.1)


def test_a_take_parses_only_the_annotations_the_last_take_did_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import kgroup.core.operator.load_status as load_status_module
    from kgroup.core.load import parse_load as real
    calls: list[str | None] = []

    def counting(raw: str | None, *, partitions: int) -> Any:
        calls.append(raw)
        return real(raw, partitions=partitions)

    monkeypatch.setattr(load_status_module, "parse_load", counting)
    parsed = load_status_module.ParsedLoads()
    first = observation([({0: float(v)}, 1) for v in range(10, 14)])  # four reports
    parsed.rotate(1)
    load = group_load({"a": first}, {0: "a"}, partitions=1, parse=parsed)
    assert load is not None and len(calls) == 4
    later = observation([({0: float(v)}, 1) for v in range(12, 16)])  # two of them again
    calls.clear()
    parsed.rotate(1)
    again = group_load({"a": later}, {0: "a"}, partitions=1, parse=parsed)
    assert again is not None and len(calls) == 2  # the two new ones
    assert again.member_rates["a"] == pytest.approx(13.5, rel=3e-3)
    # the reports no window holds any more are forgotten at the next take
    calls.clear()
    parsed.rotate(1)
    group_load({"a": first}, {0: "a"}, partitions=1, parse=parsed)
    assert len(calls) == 2  # 10 and 11 were dropped with the take that did not see them
    # another partition count reads every annotation anew
    calls.clear()
    parsed.rotate(2)
    group_load({"a": first}, {0: "a"}, partitions=2, parse=parsed)
    assert len(calls) == 4
