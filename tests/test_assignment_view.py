"""The assignment view is one class: what the sidecar serves is what the client and the
pipeline read back (pure, no I/O)."""

from __future__ import annotations

import json

import kgroup.client as client
from kgroup.core.assignment import PartitionView, View
from kgroup_pipeline import ownership
from kgroup_pipeline.scripted import ScriptedCoordinator

SERVED = View(member="pod-0", session="s-1", version=7, epoch=3, acked_epoch=2, fenced=False,
              valid_for_seconds=5.4321,
              partitions=(PartitionView(0, 4, "active", "12", None),
                          PartitionView(3, 9, "revoking", None, 1.5)))


def test_what_the_sidecar_serves_reads_back_as_the_same_object() -> None:
    wire = json.loads(json.dumps(SERVED.to_json()))
    back = View.from_json(wire)
    assert back == View(**{**SERVED.__dict__, "valid_for_seconds": 5.432})
    assert back.to_json() == wire


def test_the_client_counts_the_promise_around_the_view_on_its_own_clock() -> None:
    now = [100.0]
    a = client.Assignment.from_json(SERVED.to_json(), sent_at=99.0, clock=lambda: now[0])
    assert a.view == View.from_json(SERVED.to_json())
    assert a.valid_until == 99.0 + 5.432
    assert (a.member, a.version, a.epoch, a.acked_epoch) == ("pod-0", 7, 3, 2)
    assert [p.partition for p in a.active] == [0]
    assert [p.partition for p in a.revoking] == [3]
    now[0] = 99.0 + 5.432
    assert a.expired and a.partitions == () and a.all_partitions == SERVED.partitions


def test_a_body_without_fenced_or_validity_promises_nothing() -> None:
    a = client.Assignment.from_json({"partitions": [{"partition": 1, "token": 2,
                                                     "state": "active"}]}, sent_at=0.0,
                                    clock=lambda: -1.0)
    assert a.fenced and a.partitions == () and len(a.all_partitions) == 1


def test_client_and_pipeline_name_the_same_classes() -> None:
    assert client.Partition is PartitionView and client.View is View
    assert ownership.OwnedPartition is PartitionView
    static = ownership.StaticOwnership([2, 0], token=5).assignment()
    assert isinstance(static, client.Assignment)
    assert static.active == (PartitionView(0, 5), PartitionView(2, 5)) and not static.expired


def test_the_scripted_sidecar_serves_the_sidecars_shape() -> None:
    c = ScriptedCoordinator(2)
    c.assign("m", [1])
    wire = c.view("m").view.to_json()
    assert list(wire) == list(SERVED.to_json())
    assert wire["partitions"] == [{"partition": 1, "token": 1, "state": "active",
                                   "position": None, "revokeDeadlineSeconds": None,
                                   "sealedBy": None}]
    assert (wire["validForSeconds"], wire["fenced"], wire["session"]) == (30.0, False, "m")
