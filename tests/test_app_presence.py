"""The app's part (kgroup.core.member.app_presence) and what the member, the readiness rule
and the health summary make of it: owned means consumed. One rule per test."""

from __future__ import annotations

import dataclasses

from kgroup.core.assignment import PartitionView, View
from kgroup.core.health import HealthBook, Report, parse_summary
from kgroup.core.member.app_presence import AppPresence
from kgroup.core.member.readiness import readiness
from kgroup.core.member.reconcile import (
    Acquire,
    EndSession,
    Member,
    Release,
    Snapshot,
    StartSession,
    Target,
)
from tests.test_member import ME, TIMING, World, of, taken


def app(timeout: float = 60.0) -> AppPresence:
    return AppPresence(timeout=timeout)


# ---- the presence alone ------------------------------------------------------------------


def test_an_app_that_never_asked_does_not_take_part() -> None:
    a = app()
    assert not a.taking_part(0.0)
    a.called(1.0)  # a health report alone is no word that it is ready
    assert not a.taking_part(1.0) and not a.joined
    a.asked(2.0)
    assert a.taking_part(2.0) and a.joined


def test_an_app_is_silent_past_the_timeout_unless_a_long_poll_is_open() -> None:
    a = app(timeout=10)
    a.asked(0.0)
    assert a.taking_part(9.9) and a.silent_at() == 10.0
    assert not a.taking_part(10.0)
    a.poll_opened(11.0)
    assert a.taking_part(500.0) and a.silent_at() is None  # the poll is still open
    a.poll_closed(500.0)
    assert a.taking_part(509.0) and not a.taking_part(510.0)


def test_a_partition_is_seen_once_served_under_its_token_and_taken_up_at_the_next_call() -> None:
    a = app()
    a.asked(0.0)
    a.served([(0, 100), (1, 101)])
    assert a.seen(0, 100) and not a.seen(0, 99) and not a.seen(2, 102)
    assert not a.taken_up(0, 100)  # served, but the app has not come back since
    a.called(0.5)
    assert a.taken_up(0, 100) and a.taken_up(1, 101)
    a.served([(0, 200), (1, 101)])  # 0 moved away and back under a new token
    assert a.seen(0, 200) and not a.taken_up(0, 200) and a.taken_up(1, 101)
    assert a.not_taken_up({0: 200, 1: 101}) == [0]


def test_the_same_served_partitions_cost_no_walk_and_change_nothing() -> None:
    a = app()
    a.asked(0.0)
    parts = ((0, 100),)
    a.served(parts, key=parts)
    a.called(0.1)
    a.served(iter(()), key=parts)  # the same object: taken as the same partitions
    assert a.taken_up(0, 100)


def test_a_call_that_takes_a_partition_up_or_rejoins_says_it_changes_a_verdict() -> None:
    a = app(timeout=10)
    assert a.asked(0.0)  # joins
    assert not a.called(1.0)  # nothing new served: nothing changes
    a.served([(0, 100)])
    assert a.called(2.0)  # takes 0 up
    assert not a.called(3.0)
    assert a.called(20.0)  # silent since 13: taking part again


def test_timeout_zero_is_no_gate() -> None:
    a = AppPresence(timeout=0)
    assert a.taking_part(0.0) and a.seen(3, 7) and a.taken_up(3, 7)
    assert a.stalls({3: 7}, 1000.0) == {} and a.silent_at() is None


def test_the_sidecar_sees_stalls_without_any_report_of_the_apps() -> None:
    a = app(timeout=10)
    assert a.stalls({0: 100}, 0.0) == {0: "the app has not asked for its assignment yet"}
    a.asked(0.0)
    a.served([(0, 100)])
    assert a.stalls({0: 100, 1: 101}, 5.0) == {}  # within the bound
    a.called(6.0)  # 0 taken up; 1 never served
    assert a.stalls({0: 100, 1: 101}, 15.0) == {
        1: "the app has not taken it up within 10s"}
    assert set(a.stalls({0: 100, 1: 101}, 30.0)) == {0, 1}  # silent since 16
    assert "has not called its sidecar" in a.stalls({0: 100}, 30.0)[0]


# ---- the member: join, unseen release, withdrawal ----------------------------------------


def snap(w: World, now: float, a: AppPresence) -> Snapshot:
    return dataclasses.replace(w.snap(now), app=a.state(now))


def test_no_session_is_started_before_the_app_asks_and_no_wakeup_spins() -> None:
    w = World()
    w.target = Target(1, frozenset({0, 1}))
    m, a = Member(ME), app()
    assert m.step(snap(w, 0.0, a)) == []
    assert m.next_wakeup(snap(w, 0.0, a)) is None  # waits for the app's call, not a timer
    a.asked(5.0)
    assert m.step(snap(w, 5.0, a)) == [StartSession(timing=TIMING)]


def joined_with(w: World, a: AppPresence, now: float = 0.0) -> Member:
    a.asked(now)
    m = Member(ME)
    assert m.step(snap(w, now, a)) == [StartSession(timing=TIMING)]
    m.session_started("S1", sent_at=now, timing=TIMING, now=now)
    for acq in of(m.step(snap(w, now + 0.1, a)), Acquire):
        taken(m, w, acq)
    return m


def test_a_revoked_partition_the_app_never_saw_is_released_at_once_with_its_position() -> None:
    w = World()
    w.target = Target(1, frozenset({0, 1}))
    a = app()
    m = joined_with(w, a)
    view = m.view(0.2)
    a.served([(p.partition, p.token) for p in view.partitions if p.partition == 0])
    w.target = Target(2, frozenset())
    rels = of(m.step(snap(w, 1.0, a)), Release)
    assert [(r.partition, r.position, r.reason) for r in rels] == [(1, None, "unseen")]
    # 0 was served: the app may be working on it; the drain timeout (5 s) applies
    assert of(m.step(snap(w, 5.9, a)), Release) == []
    [late] = of(m.step(snap(w, 6.0, a)), Release)
    assert (late.partition, late.reason) == (0, "drain-timeout")


def test_shutdown_releases_what_the_app_never_saw_at_once() -> None:
    w = World()
    w.target = Target(1, frozenset({0, 1, 2}))
    a = app()
    m = joined_with(w, a)
    m.begin_shutdown()
    rels = of(m.step(snap(w, 1.0, a)), Release)
    assert sorted(r.partition for r in rels) == [0, 1, 2]
    assert {r.reason for r in rels} == {"unseen"}


def test_a_silent_app_makes_its_member_leave_then_join_again_when_it_calls() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    a = app(timeout=10)
    m = joined_with(w, a)
    a.served([(0, m.owned[0].token)])
    a.called(0.5)  # taken up
    m.renewed("S1", sent_at=7.0, timing=TIMING, epoch=None, now=7.0)  # deadline 15
    m.renewed("S1", sent_at=9.0, timing=TIMING, epoch=None, now=9.0)  # deadline 17
    # silent from 0.5: at 10.5 the member revokes everything; 0 was seen: drain (5 s)
    assert of(m.step(snap(w, 10.0, a)), Release) == []
    assert m.view(10.0).partitions[0].state == "active"
    m.step(snap(w, 10.5, a))
    assert m.view(10.5).partitions[0].state == "revoking"
    [rel] = of(m.step(snap(w, 15.5, a)), Release)
    m.released(0, "S1")
    acts = m.step(snap(w, 15.6, a))
    assert of(acts, EndSession) == [EndSession("S1")]
    m.session_ended()
    assert not m.done and m.session is None
    assert m.step(snap(w, 16.0, a)) == []  # still silent: no new session
    a.asked(20.0)
    assert m.step(snap(w, 20.0, a)) == [StartSession(timing=TIMING)]
    del rel


def test_an_app_that_calls_again_while_its_member_withdraws_keeps_what_it_has() -> None:
    w = World()
    w.target = Target(1, frozenset({0}))
    a = app(timeout=10)
    m = joined_with(w, a)
    a.served([(0, m.owned[0].token)])
    m.renewed("S1", sent_at=7.0, timing=TIMING, epoch=None, now=7.0)  # deadline 15
    m.step(snap(w, 10.5, a))
    assert m.view(10.5).partitions[0].state == "revoking"
    a.called(11.0)
    assert of(m.step(snap(w, 11.0, a)), Release) == []
    assert m.view(11.0).partitions[0].state == "active"  # targeted again: no release


# ---- readiness and the summary ---------------------------------------------------------


def view(parts: dict[int, int], *, acked: int = 1) -> View:
    return View(member=ME, session="S1", version=3, epoch=1, acked_epoch=acked, fenced=False,
                valid_for_seconds=6.0,
                partitions=tuple(PartitionView(p, t, "active", None)
                                 for p, t in sorted(parts.items())))


def test_a_pod_is_ready_only_once_its_app_has_taken_up_every_partition() -> None:
    a = app()
    v, target = view({0: 100, 1: 101}), Target(1, frozenset({0, 1}))

    def verdict(now: float) -> tuple[bool, str]:
        r = readiness(v, target, member=True, stopping=False, app=a, now=now)
        return r.ready, r.reason

    assert verdict(0.0) == (False, "waiting for its app to ask for its assignment "
                                   "(GET /v1/assignment)")
    a.asked(1.0)
    a.served([(0, 100), (1, 101)])
    assert verdict(1.0) == (False, "its app has not taken up 2 of its 2 partition(s) yet")
    a.called(2.0)
    assert verdict(2.0) == (True, "holds its target of epoch 1")
    assert verdict(70.0)[0] is False  # silent past the timeout
    assert readiness(v, target, member=True, stopping=False).ready  # no gate: as before


def test_the_health_summary_shows_what_the_sidecar_sees_stalled_without_reports() -> None:
    book = HealthBook(stall_after=60)
    held = {0: 100, 1: 101, 2: 102}
    book.report(Report(2, 102, position="5-0", lag=3), held, 0.0)
    stalled, text = book.summarize(held, 10.0, {1: "the app has not taken it up within 60s",
                                                7: "not held: ignored"})
    assert [h.partition for h in stalled] == [1]
    summary = parse_summary(text, partitions=8)
    assert summary is not None
    assert summary.stalled == (1,) and summary.stalled_count == 1
    assert summary.reason == "the app has not taken it up within 60s"
    assert summary.lag == 3  # the app's reports still count
    judged = {h.partition: h for h in book.judge(held, 10.0, {2: "silent"})}
    assert judged[2].stalled and judged[2].reason == "silent" and judged[2].lag == 3
    assert not book.summarize(held, 10.0)[0]  # without observations: no stall


def test_a_partition_the_app_stopped_reporting_on_is_stalled() -> None:
    """The old client's bug: an app that believes it lost its partitions keeps polling but
    never reports on them again; the sidecar sees the silence of its reports."""
    book = HealthBook(stall_after=600, silent_after=60)
    held = {0: 100}
    book.report(Report(0, 100, position="1-0", lag=0), held, 0.0)
    assert book.summarize(held, 59.0)[0] == []
    [h] = book.summarize(held, 60.0)[0]
    assert h.reason == "the app has not reported on it for 60s or more"
    book.report(Report(0, 100, position="2-0", lag=0), held, 61.0)
    assert book.summarize(held, 62.0)[0] == []
    assert HealthBook(stall_after=600).summarize(held, 1e6)[0] == []  # off: never
