"""The app's follower (kgroup.follower) and the sync client's kept-alive connection.

The pure part first: :func:`follow_wait` keeps the app's promise from lapsing while the
sidecar's holds, checked against a model of the sidecar's promise (renewals every 2 s of
an 8 s lease). Then against a real sidecar HTTP server (tests/test_client.py's scripted
sidecar, on a Unix socket and on loopback): changes arrive without a request per read,
one connection serves many requests, and a connection the sidecar dropped is replaced.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from test_client import Scripted, scripted, wait

from kgroup.client import Assignment, SidecarClient
from kgroup.follower import FOLLOW_MIN_WAIT, AssignmentFollower, follow_wait, handoff_wait
from kgroup_pipeline.ownership import SidecarOwnership
from kgroup_sidecar.http_api import serve

__all__ = ["scripted"]  # the fixture, imported for the tests below

HELD = {"partitions": [{"partition": 0, "token": 1, "state": "active"}], "fenced": False}


def answer(valid_for: float, sent_at: float, *, held: bool = True) -> Assignment:
    body = dict(HELD) if held else {"partitions": [], "fenced": False}
    return Assignment.from_json({**body, "validForSeconds": valid_for}, sent_at=sent_at)


def sidecar_promise(t: float, *, duration: float = 8.0, renew: float = 2.0,
                    margin: float = 1.0, latency: float = 0.05) -> float:
    """validForSeconds the sidecar answers at ``t``: its last renewal was sent at the
    last multiple of ``renew`` and confirmed ``latency`` later."""
    last_sent = (t // renew) * renew
    return last_sent + duration - margin - t


def lapses(wait_rule: Callable[[Assignment | None, float], float], *,
           horizon: float = 300.0, step: float = 0.01) -> list[float]:
    """Times at which the app held no promise although the sidecar's held (a steady
    sidecar: no changes, so each long-poll answers after its full wait)."""
    t, held, out = 0.0, answer(sidecar_promise(0.0), 0.0), []
    next_answer_at, sent = 0.0, 0.0
    probe = 0.0
    while t < horizon:
        # the poll in flight answers at next_answer_at (measured there by the sidecar)
        if t >= next_answer_at:
            held = answer(sidecar_promise(next_answer_at), sent)
            sent = next_answer_at
            next_answer_at = sent + wait_rule(held, sent)
        while probe < min(t + 1.0, horizon) and probe < next_answer_at:
            if held.valid_until <= probe:
                out.append(round(probe, 2))
            probe += step
        t = next_answer_at
    return out


def test_half_of_what_is_left_keeps_the_promise_whole() -> None:
    assert lapses(lambda a, now: follow_wait(a, now)) == []


def test_waiting_all_that_is_left_lets_the_promise_lapse() -> None:
    """The broken variant: wait until the promise would run out. The answer's promise
    counts from the send time, so it arrives already spent: the app owns nothing for
    seconds at a time although its sidecar never lost anything."""

    def greedy(a: Assignment | None, now: float) -> float:
        assert a is not None
        return max(0.1, a.valid_until - now)

    assert len(lapses(greedy)) > 100


def polls_while_renewals_stall(min_wait: float, *, stall_at: float = 10.0,
                               stall: float = 12.0) -> int:
    """Polls a follower sends while its sidecar does not renew (starved of CPU) from
    ``stall_at`` for ``stall`` seconds: the answers' promise stops growing and runs out."""
    last_renewal = (stall_at // 2.0) * 2.0

    def promise(t: float) -> float:
        renewed = last_renewal if stall_at <= t < stall_at + stall else (t // 2.0) * 2.0
        return max(0.0, renewed + 7.0 - t)

    t, polls = stall_at, 0
    held = answer(promise(t), t)
    while t < stall_at + stall:
        t += follow_wait(held, t, min_wait=min_wait)
        held = answer(promise(t), t)
        polls += 1
    return polls


def test_a_sidecar_that_cannot_renew_is_asked_at_most_about_once_a_second() -> None:
    """12 s without renewals (the promise runs out 5 s in): about one poll a second, not
    ten; the promise stays whole while the sidecar renews (the lapses test above)."""
    assert polls_while_renewals_stall(FOLLOW_MIN_WAIT) <= 14
    # the old floor asked a sidecar too starved to renew ten times a second
    assert polls_while_renewals_stall(0.1) >= 40


def test_nothing_held_or_fenced_waits_as_long_as_allowed() -> None:
    assert follow_wait(None, 0.0) == 30.0
    assert follow_wait(answer(6.0, 0.0, held=False), 0.0) == 30.0
    fenced = Assignment.from_json({**HELD, "fenced": True, "validForSeconds": 0}, sent_at=0)
    assert follow_wait(fenced, 0.0, max_wait=12) == 12
    assert follow_wait(answer(6.0, 0.0), 1.0) == 2.5
    assert follow_wait(answer(6.0, 0.0), 9.0) == FOLLOW_MIN_WAIT == 1.0  # spent: again in 1 s


def test_a_handoff_follower_keeps_a_promise_only_while_a_partition_is_revoking() -> None:
    revoking = Assignment.from_json({"partitions": [
        {"partition": 0, "token": 1, "state": "active"},
        {"partition": 1, "token": 2, "state": "revoking"}], "fenced": False,
        "validForSeconds": 6.0}, sent_at=0.0)
    # nothing revoking: no promise to keep, wait for a change (it answers at once)
    assert handoff_wait(answer(6.0, 0.0), 1.0) == 30.0
    assert handoff_wait(answer(6.0, 0.0), 9.0, max_wait=12) == 12  # spent: no matter
    assert handoff_wait(None, 0.0) == 30.0
    # a revoking partition: kept like follow_wait keeps it, without a lapse
    assert handoff_wait(revoking, 1.0) == follow_wait(revoking, 1.0) == 2.5
    assert lapses(lambda a, now: handoff_wait(revoking if a is None else Assignment(
        revoking.view, a.valid_until), now)) == []


def test_a_handoff_follower_asks_rarely_but_sees_a_revocation_at_once(
        scripted: Scripted) -> None:
    scripted.set(target=[0, 1], epoch=1)
    c = SidecarClient(scripted.url)
    wait("acked", lambda: c.assignment().acked_epoch == 1)
    plain = AssignmentFollower(scripted.url).start()
    quiet = AssignmentFollower(scripted.url, handoff=True).start()
    try:
        wait("first answers", lambda: plain.latest() is not None
             and quiet.latest() is not None)
        polls, quiet_polls = plain.polls, quiet.polls
        # 3 s lease, 1 s renew: the plain follower asks about every second to keep its
        # promise; the hand-off one waits for a change
        wait("the plain follower asked 3 more times", lambda: plain.polls - polls >= 3,
             timeout=10)
        assert quiet.polls == quiet_polls
        scripted.set(target=[0], epoch=2)
        # the change answers the open long-poll (it would otherwise wait 30 s)
        wait("revoking seen", lambda: (a := quiet.latest()) is not None
             and [p.partition for p in a.revoking] == [1], timeout=3)
        # while it is revoking, its promise is kept: never spent for long
        for _ in range(3):
            polls = quiet.polls
            wait("asked again", lambda: quiet.polls > polls, timeout=5)  # noqa: B023
            a = quiet.latest()
            assert a is not None and [p.partition for p in a.revoking] == [1]
    finally:
        plain.stop()
        quiet.stop()


def test_at_shutdown_a_handoff_ownership_asks_when_its_answer_is_spent(
        scripted: Scripted) -> None:
    scripted.set(target=[0, 1], epoch=1)
    own = SidecarOwnership(scripted.url, follow=True, handoff=True)
    try:
        wait("acked", lambda: own.client.assignment().acked_epoch == 1)
        wait("followed", lambda: (a := own.assignment()) is not None and len(a.active) == 2)
        wait("its promise spent (3 s lease), not asked again",
             lambda: own.assignment().partitions == (), timeout=10)
        own.refresh()
        assert [p.partition for p in own.assignment().partitions] == [0, 1]
    finally:
        assert own.follower is not None
        own.follower.stop()
        scripted.set(target=[0], epoch=2)  # a change ends the 30 s long-poll in flight


def test_the_follower_and_the_listeners_share_one_wait_rule() -> None:
    import kgroup.client
    import kgroup.follower

    assert kgroup.follower.follow_wait is kgroup.client.follow_wait


def test_offers_are_kept_in_send_order_and_forget_drops_older_ones() -> None:
    now = [100.0]
    f = AssignmentFollower("http://127.0.0.1:1", clock=lambda: now[0])
    newer, older = answer(6.0, 100.0), answer(6.0, 99.0)
    f.offer(newer, 100.0)
    f.offer(older, 99.0)
    assert f.latest() is newer
    now[0] = 101.0
    f.forget()
    assert f.latest() is None
    f.offer(newer, 100.0)  # sent before the forget: e.g. before a release
    assert f.latest() is None
    f.offer(older, 101.5)
    assert f.latest() is older


def test_follower_sees_changes_with_few_requests(scripted: Scripted) -> None:
    scripted.set(target=[0, 1], epoch=1)
    c = SidecarClient(scripted.url)
    wait("acked", lambda: c.assignment().acked_epoch == 1)
    f = AssignmentFollower(scripted.url).start()
    try:
        wait("first answer", lambda: f.latest() is not None)
        polls = f.polls
        t0 = time.monotonic()
        reads = 0
        while time.monotonic() - t0 < 1.0:
            a = f.latest()
            assert a is not None and [p.partition for p in a.active] == [0, 1]
            reads += 1
            time.sleep(0.005)
        # 3 s lease, 1 s renew: an answer about every second, not one per read
        assert reads > 100 and f.polls - polls <= 3
        scripted.set(target=[0], epoch=2)
        wait("revoking seen", lambda: (a := f.latest()) is not None
             and any(p.state == "revoking" for p in a.partitions), timeout=2)
        assert f.client.connections_opened == 1
    finally:
        f.stop()


def test_a_released_partition_is_not_reported_from_memory(scripted: Scripted) -> None:
    scripted.set(target=[0, 1], epoch=1)
    own = SidecarOwnership(scripted.url, follow=True)
    try:
        wait("acked", lambda: own.client.assignment().acked_epoch == 1)
        scripted.set(target=[0], epoch=2)
        wait("revoking", lambda: [p.partition for p in own.assignment().revoking] == [1])
        assert own.release(1, 11, "9-0")
        assert [p.partition for p in own.assignment().partitions] == [0]
    finally:
        assert own.follower is not None
        own.follower.stop()


def test_the_sync_client_keeps_one_connection(scripted: Scripted) -> None:
    scripted.set(target=[0], epoch=1)
    c = SidecarClient(scripted.url)
    wait("owned", lambda: c.assignment().partitions)
    for _ in range(20):
        c.assignment()
    assert c.connections_opened == 1


def test_a_connection_the_sidecar_closed_is_replaced(scripted: Scripted) -> None:
    scripted.set(target=[0], epoch=1)
    c = SidecarClient(scripted.url)
    wait("owned", lambda: c.assignment().partitions)
    # the sidecar's HTTP server stops (closing the kept-alive connection) and serves again
    scripted.call(scripted.runner.cleanup())
    scripted.runner = scripted.call(serve(scripted.sc, scripted.sc.settings))
    assert [p.partition for p in c.assignment().partitions] == [0]
    assert c.connections_opened == 2


def test_a_long_poll_in_one_thread_does_not_hold_up_another_threads_request(
        scripted: Scripted) -> None:
    scripted.set(target=[0], epoch=1)
    c = SidecarClient(scripted.url)
    a = wait("owned", lambda: (x := c.assignment()).partitions and x)
    server = scripted.runner.server
    asked = server.requests_count  # requests the sidecar's server has begun to handle
    poll = threading.Thread(target=c.wait_for_change, args=(a.version + 1000, 3.0))
    poll.start()
    wait("the long-poll in flight", lambda: server.requests_count > asked)
    t0 = time.monotonic()
    c.report_health([])
    assert time.monotonic() - t0 < 1.0 and poll.is_alive()
    poll.join()
    assert c.connections_opened == 2  # one per thread, each kept
    c.close()
