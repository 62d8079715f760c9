"""``kgroup status``: the view and its table from objects as read (pure, no cluster)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from kgroup.core.layout_status import layout_to_status
from kgroup.core.lineage import Uniform, initial
from kgroup.core.objects import Obj
from kgroup.core.operator.status_view import build_view, render_table
from kgroup.status_cli import render


def group(**status: Any) -> Obj:
    return {"metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"partitions": 4, "selector": {"matchLabels": {"app": "w"}}},
            "status": {"phase": "Degraded", "epoch": 3, "unowned": 1, "stalled": 1,
                       "stalledPartitions": "1",
                       "assignment": {"a": "0-1", "b": "2-3"},
                       "members": [{"name": "a", "assignedCount": 2, "ownedCount": 2,
                                    "acknowledgedEpoch": 3},
                                   {"name": "b", "assignedCount": 2, "ownedCount": 1,
                                    "acknowledgedEpoch": 2}],
                       "conditions": [{"type": "Ready", "status": "False",
                                       "reason": "PartitionsStalled",
                                       "lastTransitionTime": "2026-01-01T00:00:00Z",
                                       "message": "1 partitions stalled: 1"}],
                       **status}}


def member(name: str, session: str, health: Obj | None = None) -> Obj:
    notes = {"kgroup.dev/session": session, "kgroup.dev/epoch": "3"}
    if health is not None:
        notes["kgroup.dev/health"] = json.dumps(health)
    return {"metadata": {"name": f"orders-member-{name}", "annotations": notes,
                         "resourceVersion": "7",
                         "labels": {"kgroup.dev/group": "orders", "kgroup.dev/role": "member",
                                    "kgroup.dev/member": name}},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 15}}


def lock(p: int, holder: str | None, session: str | None, token: int,
         position: str | None = None) -> Obj:
    notes = {k: v for k, v in (("kgroup.dev/session", session),
                               ("kgroup.dev/position", position)) if v is not None}
    spec: Obj = {"leaseTransitions": token}
    if holder:
        spec["holderIdentity"] = holder
    return {"metadata": {"name": f"orders-partition-{p}", "annotations": notes,
                         "resourceVersion": "9",
                         "labels": {"kgroup.dev/group": "orders",
                                    "kgroup.dev/role": "partition",
                                    "kgroup.dev/partition": str(p)}},
            "spec": spec}


LEASES = [
    member("a", "sa", {"stalled": "1", "stalledCount": 1, "lag": 15, "reason": "refused",
                       "partitions": {"0": [5, "10-0"], "1": [10, "11-0"]}}),
    member("b", "sb"),
    lock(0, "a", "sa", 4),
    lock(1, "a", "sa", 2),
    lock(2, "a", "sa", 7, "20-0"),  # still with a: moving to b (revoking)
    lock(3, "b", "old-session", 3, "30-0"),  # b's old session: nobody holds it
]


def test_each_partition_has_its_owner_state_token_position_and_lag() -> None:
    view = build_view(group(), LEASES)
    rows = [(r.partition, r.owner, r.state, r.token, r.position, r.lag)
            for r in view.partitions]
    assert rows == [(0, "a", "active", 4, "10-0", 5),
                    (1, "a", "stalled", 2, "11-0", 10),
                    (2, "a", "revoking", 7, "20-0", None),
                    (3, None, "free", 3, "30-0", None)]
    assert [(m.name, m.assigned, m.owned, m.acknowledged_epoch, m.lag, m.stalled)
            for m in view.members] == [("a", 2, 2, 3, 15, 1), ("b", 2, 1, 2, None, 0)]


def test_the_table_reads_like_kubectl() -> None:
    assert render_table(build_view(group(), LEASES)) == "\n".join([
        "ConsumerGroup shop/orders: Degraded, epoch 3, 4 partitions, 2 members, unowned 1, "
        "stalled 1 (1)",
        "",
        "PARTITION   OWNER   STATE      TOKEN   POSITION   LAG",
        "0           a       active     4       10-0       5",
        "1           a       stalled    2       11-0       10",
        "2           a       revoking   7       20-0       -",
        "3           -       free       3       30-0       -",
        "",
        "MEMBER   ASSIGNED   OWNED   ACK-EPOCH   LAG   STALLED   LOAD/S",
        "a        2          2       3           15    1         -",
        "b        2          1       2           -     0         -",
        "",
        "CONDITION   STATUS   REASON              SINCE                  MESSAGE",
        "Ready       False    PartitionsStalled   2026-01-01T00:00:00Z   1 partitions stalled: 1",
    ])


def test_the_load_and_the_recommended_size_are_shown_when_the_status_has_them() -> None:
    load = {"rate": 120.5, "lag": 3000, "busiestOverMean": 1.4, "bound": 1.1,
            "recommendedMembers": 3, "measuredAt": "2026-01-01T00:00:30Z"}
    g = group(load=load)
    g["status"]["members"][0]["load"] = 84.3
    view = build_view(g, LEASES)
    assert view.load == load and [m.load for m in view.members] == [84.3, None]
    lines = render_table(view).splitlines()
    assert lines[1] == ("Load: 120.5 events/s, lag 3000, busiest/mean 1.4 (best possible "
                        "1.1), recommended members 3 (measured 2026-01-01T00:00:30Z)")
    assert "a        2          2       3           15    1         84.3" in lines
    assert build_view(group(), LEASES).load is None


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_json_and_yaml_carry_the_same_view(output: str) -> None:
    view = build_view(group(), LEASES)
    text = render(view, output)
    back = json.loads(text) if output == "json" else yaml.safe_load(text)
    assert back == view.to_dict()
    assert back["partitions"][1]["state"] == "stalled"


def test_a_group_with_no_status_yet_shows_every_partition_free() -> None:
    view = build_view({"metadata": {"name": "g", "namespace": "n"},
                       "spec": {"partitions": 2}}, [])
    assert [(r.state, r.owner, r.token) for r in view.partitions] == [
        ("free", None, 0), ("free", None, 0)]
    assert view.phase == "Unknown" and view.members == []


def test_a_reshape_under_way_shows_the_lineage_and_what_waits() -> None:
    """4 -> 2 with partition 0 read to its end: 4 and 5 wait for 1-3."""
    lineage = initial(4).reshape(Uniform(2)).complete(0)
    g = group(layout=layout_to_status(lineage))
    g["spec"]["partitions"] = 2
    view = build_view(g, [member("a", "s-a"), lock(1, "a", "s-a", 2)])
    rows = {r.partition: (r.lineage, r.waits_for) for r in view.partitions}
    assert rows == {0: ("completed", ""), 1: ("sealed", ""), 2: ("sealed", ""),
                    3: ("sealed", ""), 4: ("open", "1-3"), 5: ("open", "1-3")}
    assert (view.generation, view.generations) == (2, 2)
    text = render_table(view)
    assert ", generation 2 (2 kept)" in text.splitlines()[0]
    assert "WAITS-FOR" in text and any(
        line.split()[:1] == ["4"] and line.split()[-2:] == ["open", "1-3"]
        for line in text.splitlines())


def test_one_generation_keeps_the_table_as_it_was_and_a_bad_layout_falls_back() -> None:
    plain = render_table(build_view(group(), LEASES))
    assert "LAYOUT" not in plain and "generation" not in plain.splitlines()[0]
    garbled = build_view(group(layout={"generation": "x"}), LEASES)
    assert [r.partition for r in garbled.partitions] == [0, 1, 2, 3]


def test_pods_without_the_sidecar_get_a_line_under_the_header() -> None:
    g = group(sidecarMissing={"count": 12, "pods": [f"bare-{i}" for i in range(10)]})
    view = build_view(g, LEASES)
    assert (view.sidecar_missing, view.sidecar_missing_pods[:2]) == (12, ["bare-0", "bare-1"])
    lines = render_table(view).splitlines()
    assert lines[1] == ("Without the sidecar: 12 pods labelled with the group (bare-0, "
                        "bare-1, bare-2, bare-3, bare-4, bare-5, bare-6, bare-7, bare-8, "
                        "bare-9 and 2 more), taking no part in it; delete them to have "
                        "them re-created with the sidecar")
    assert json.loads(render(view, "json"))["sidecar_missing_pods"][0] == "bare-0"
    assert not any(line.startswith("Without the sidecar")
                   for line in render_table(build_view(group(), LEASES)).splitlines())
