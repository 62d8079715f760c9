"""The sidecar's Events: bodies and the aggregation of repeats (pure, no API server)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

from kgroup.core.member import journal as ev
from kgroup_sidecar.events import AGGREGATE_SECONDS, Aggregator, EventPoster, Pod, event_body
from kgroup_sidecar.runtime import Sidecar
from kgroup_sidecar.settings import Settings

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


def test_an_event_is_about_the_pod_with_its_uid() -> None:
    body = event_body(Pod("orders", "w-0", "u-1"), type_="Warning", reason="Fenced",
                      message="x" * 5000, now=NOW)
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "w-0",
                                      "namespace": "orders", "uid": "u-1"}
    assert body["metadata"] == {"generateName": "w-0.", "namespace": "orders"}
    assert (body["type"], body["reason"], body["count"]) == ("Warning", "Fenced", 1)
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-11-23T12:00:00Z"
    assert len(body["message"]) == 1024
    assert body["reportingInstance"] == "w-0"


def test_without_a_uid_the_reference_has_none() -> None:
    body = event_body(Pod("orders", "w-0"), type_="Normal", reason="R", message="m", now=NOW)
    assert "uid" not in body["involvedObject"]


def test_a_repeat_within_the_window_patches_the_first_event() -> None:
    agg = Aggregator()
    key = ("Warning", "Fenced", "m")
    assert agg.repeat_of(key, 0.0) is None
    agg.created(key, "w-0.abc", 0.0)
    seen = agg.repeat_of(key, AGGREGATE_SECONDS - 1)
    assert seen is not None and seen.name == "w-0.abc"
    assert agg.repeat_of(("Warning", "Fenced", "other"), 1.0) is None
    assert agg.repeat_of(key, AGGREGATE_SECONDS) is None  # window over: a new Event


class _Recorder:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def post_soon(self, type_: str, reason: str, message: str) -> None:
        self.posted.append((type_, reason, message))


def _sidecar() -> tuple[Sidecar, _Recorder]:
    settings = Settings(group="g", namespace="ns", pod_name="w-0")
    sidecar = Sidecar(settings)
    recorder = _Recorder()
    sidecar.events = cast(EventPoster, recorder)
    return sidecar, recorder


def test_fenced_lost_and_a_timed_out_handoff_become_warning_events() -> None:
    sidecar, recorder = _sidecar()
    sidecar.record(ev.Fenced("s1", 1.0, [[3, 7], [1, 2]]))
    sidecar.record(ev.Lost("s1", 4, 9))
    sidecar.record(ev.Releasing("s1", 5, 2, None, "drain-timeout"))
    sidecar.record(ev.Releasing("s1", 6, 2, "1-0", "app"))
    sidecar.record(ev.Acquired("s1", 8, 1, None, adopted=False))
    assert [(t, r) for t, r, _ in recorder.posted] == [
        ("Warning", "Fenced"), ("Warning", "PartitionLost"), ("Warning", "HandoffTimedOut")]
    assert "1 (token 2), 3 (token 7)" in recorder.posted[0][2]
    assert "partition 4 (token 9)" in recorder.posted[1][2]
    assert "partition 5" in recorder.posted[2][2]
