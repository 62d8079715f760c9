"""The app client keeps its promise whole: a long-poll never outwaits the answer it holds,
and "lost" means gone without a release. Against a real sidecar HTTP server fed by the
scripted core (tests/test_client.py: a 3 s lease renewed every second, so the sidecar
answers ``validForSeconds`` between about 1.4 and 2.4 s)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from test_client import Scripted, scripted, wait

from kgroup.client import (
    Assignment,
    AsyncSidecarClient,
    Rebalance,
    SidecarClient,
)
from kgroup.rebalance import _Listening, _Releases

__all__ = ["scripted"]  # the fixture, imported for the tests below

LEASE_SECONDS = 3.0
QUIET_SECONDS = 3 * LEASE_SECONDS


def lost(calls: list[Rebalance]) -> list[int]:
    return [p.partition for change in calls for p in change.lost]


def test_the_sync_listener_with_the_default_wait_keeps_what_it_holds(
        scripted: Scripted) -> None:
    """Nothing changes for three lease durations: one call, nothing lost. The listener
    used to long-poll for all that was left of its answer's promise; the answer, counted
    from the poll's send time, arrived already spent (the partitions reported lost) and
    the next poll, with nothing held, waited its full 30 s. Shown failing on that listen:
    lost [0, 1] within the first lease."""
    scripted.set(target=[0, 1], epoch=1)
    c = SidecarClient(scripted.url)
    wait("acked", lambda: c.assignment().acked_epoch == 1)
    calls: list[Rebalance] = []
    stop = threading.Event()
    t = threading.Thread(target=c.listen, args=(calls.append,), kwargs={"stop": stop},
                         daemon=True)
    t.start()
    wait("assigned", lambda: calls)
    time.sleep(QUIET_SECONDS)
    stop.set()
    assert lost(calls) == []
    assert [[p.partition for p in change.assigned] for change in calls] == [[0, 1]]
    t.join(5)
    assert not t.is_alive()


def test_the_async_listener_with_the_default_wait_keeps_what_it_holds(
        scripted: Scripted) -> None:
    """The async listener, the same way (shown failing on the old listen likewise)."""
    scripted.set(target=[2, 3], epoch=1)

    async def scenario() -> list[Rebalance]:
        async with AsyncSidecarClient(scripted.url) as c:
            while (await c.assignment()).acked_epoch != 1:
                await asyncio.sleep(0.02)
            calls: list[Rebalance] = []
            stop = asyncio.Event()
            listener = asyncio.create_task(c.listen(calls.append, stop=stop))
            await asyncio.sleep(QUIET_SECONDS)
            stop.set()
            seen = list(calls)
            try:
                await asyncio.wait_for(listener, 5)
            except TimeoutError:
                listener.cancel()
            return seen

    calls = asyncio.run(scenario())
    assert lost(calls) == []
    assert [[p.partition for p in change.assigned] for change in calls] == [[2, 3]]


def listening(c: SidecarClient, on_rebalance: Callable[[Rebalance], None]
              ) -> tuple[threading.Thread, threading.Event]:
    """``c.listen(on_rebalance)`` with the default wait, on a thread of its own."""
    stop = threading.Event()
    t = threading.Thread(target=c.listen, args=(on_rebalance,), kwargs={"stop": stop},
                         daemon=True)
    t.start()
    return t, stop


def test_a_partition_the_app_released_is_not_reported_lost(scripted: Scripted) -> None:
    """The guide's listener releases what is revoked; the partition then leaves the view
    with a release, not lost (the listener used to report it lost: shown failing on it)."""
    scripted.set(target=[0, 1], epoch=1)
    c = SidecarClient(scripted.url)
    calls: list[Rebalance] = []

    def on_rebalance(change: Rebalance) -> None:
        calls.append(change)
        for p in change.revoked:
            c.release(p.partition, p.token, f"pos-{p.partition}")

    t, stop = listening(c, on_rebalance)
    wait("assigned", lambda: calls)
    scripted.set(target=[0], epoch=2)
    wait("released", lambda: scripted.released.get(1) == "pos-1")
    scripted.set(target=[0, 3], epoch=3)  # a later change: the release's view was seen
    wait("3 assigned", lambda: any(p.partition == 3 for ch in calls for p in ch.assigned))
    stop.set()
    assert [p.partition for ch in calls for p in ch.revoked] == [1]
    assert lost(calls) == []
    t.join(5)


def test_partitions_given_up_with_release_all_are_not_reported_lost(
        scripted: Scripted) -> None:
    """The async client's ``release_all`` (active partitions given up): no loss either."""
    scripted.set(target=[2, 3], epoch=1)

    async def scenario() -> tuple[list[Rebalance], dict[int, bool]]:
        async with AsyncSidecarClient(scripted.url) as c:
            calls: list[Rebalance] = []
            stop = asyncio.Event()
            listener = asyncio.create_task(c.listen(calls.append, stop=stop))
            while not any(len(ch.assigned) == 2 for ch in calls):
                await asyncio.sleep(0.02)
            released = await c.release_all({2: "2-0", 3: "3-0"})
            scripted.set(target=[1], epoch=2)  # a later change: the releases were seen
            while not any(p.partition == 1 for ch in calls for p in ch.assigned):
                await asyncio.sleep(0.02)
            stop.set()
            await asyncio.wait_for(listener, 5)
            return calls, released

    calls, released = asyncio.run(scenario())
    assert released == {2: True, 3: True}
    assert scripted.released == {2: "2-0", 3: "3-0"}
    assert lost(calls) == []


def drain_within(scripted: Scripted, seconds: float) -> None:
    """The sidecar gives a revoked partition up ``seconds`` after revoking it (the
    scripted core's ``set`` makes it 30 s)."""

    async def apply() -> None:
        scripted.sc.logic.drain_timeout = seconds
        scripted.sc.dirty.set()

    scripted.call(apply())


def test_a_revoked_partition_the_app_never_released_is_lost(scripted: Scripted) -> None:
    """The sidecar gives a revoked partition up at its drain timeout: gone without the
    app's release, so lost (the app must not commit under its token any more)."""
    scripted.set(target=[0, 1], epoch=1)
    c = SidecarClient(scripted.url)
    calls: list[Rebalance] = []
    t, stop = listening(c, calls.append)
    wait("assigned", lambda: calls)
    scripted.set(target=[0], epoch=2)
    drain_within(scripted, 0.3)
    wait("lost", lambda: lost(calls))
    stop.set()
    assert [p.partition for ch in calls for p in ch.revoked] == [1]
    assert lost(calls) == [1] and 1 in scripted.released
    t.join(5)


def view(*held: tuple[int, int], sent_at: float = 0.0) -> Assignment:
    return Assignment.from_json(
        {"partitions": [{"partition": n, "token": t, "state": "active"} for n, t in held],
         "fenced": False, "validForSeconds": 2.0}, sent_at=sent_at, clock=lambda: 0.5)


def test_only_a_release_the_sidecar_took_hides_the_partitions_leaving() -> None:
    """The record of the app's releases, without I/O: noted when a release is sent,
    dropped when the sidecar refuses it (the partition was lost before it could be
    released: its leaving is a loss), matched per token, used once."""
    releases = _Releases()
    state = _Listening(releases, max_wait=30.0)
    assert state.answered(view((0, 5), (1, 6), (2, 7), (3, 8))) is not None
    releases.sent(0, 5)  # taken by the sidecar
    releases.sent(1, 6)
    releases.refused(1, 6)  # 409: lost before it could be released
    releases.sent(2, 99)  # under a token the partition is not held with
    change = state.answered(view((3, 8)))
    assert change is not None
    assert [p.partition for p in change.lost] == [1, 2]
    releases.sent(3, 8)  # released, then held again under a new token: assigned, not lost
    change = state.answered(view((0, 9), (3, 10)))
    assert change is not None and change.lost == ()
    assert [(p.partition, p.token) for p in change.assigned] == [(0, 9), (3, 10)]
    change = state.answered(view())  # the record of partition 0 was used up with token 5
    assert change is not None and [p.partition for p in change.lost] == [0, 3]


def test_a_listener_whose_answer_arrived_spent_gets_its_partitions_back_at_once(
        scripted: Scripted) -> None:
    """The app's process stands still 10 s (its clock jumps) while its poll is in flight:
    the answer arrives spent with the partitions still in it, so they are lost; the next
    poll is short and gets them back within a second. The listener used to think it held
    nothing and wait 30 s (shown failing on it: no second assignment within 5 s)."""
    scripted.set(target=[0, 1], epoch=1)
    skew = [0.0]
    c = SidecarClient(scripted.url, clock=lambda: time.monotonic() + skew[0])
    wait("acked", lambda: c.assignment().acked_epoch == 1)
    calls: list[Rebalance] = []
    t, stop = listening(c, calls.append)
    wait("assigned", lambda: calls)
    skew[0] = 10.0
    jumped = time.monotonic()
    wait("lost", lambda: lost(calls))
    wait("assigned again", lambda: sum(len(ch.assigned) for ch in calls) == 4, timeout=5)
    back_after = time.monotonic() - jumped
    stop.set()
    assert sorted(lost(calls)) == [0, 1]
    assert [p.partition for p in calls[-1].assigned] == [0, 1]
    assert back_after < 3.0, back_after
    t.join(5)


def test_a_paused_sidecar_costs_the_app_its_partitions_by_their_deadline(
        scripted: Scripted) -> None:
    """The sidecar stops answering (its loop stands still 5 s) while a poll is in flight:
    the app hears its partitions are lost once the promise runs out (at most about 2.4 s
    here), not when the sidecar answers again. The poll used to wait its wait plus the
    client's 5 s timeout (shown failing on it: lost only after the pause, at about 5 s)."""
    scripted.set(target=[0], epoch=1)
    c = SidecarClient(scripted.url)
    calls: list[Rebalance] = []
    t, stop = listening(c, calls.append)
    wait("assigned", lambda: calls)
    paused = time.monotonic()
    scripted.loop.call_soon_threadsafe(time.sleep, 5.0)
    wait("lost", lambda: lost(calls), timeout=10)
    lost_after = time.monotonic() - paused
    stop.set()
    assert lost_after < 3.5, lost_after
    t.join(5)
