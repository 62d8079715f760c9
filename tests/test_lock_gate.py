"""The operator's lock gate (kgroup_operator.lock_gate): pure asyncio, no I/O.

What must hold: never more holders than slots; a waiting expiry mark goes before a waiting
assignment mark, an assignment mark before a create, and within one urgency the first come
first;
a waiter cancelled before or as its turn comes loses nothing for the others.
"""

from __future__ import annotations

import asyncio

import pytest

from kgroup_operator.lock_gate import LockGate, Urgency


async def _run_all(gate: LockGate, requests: list[tuple[str, Urgency]],
                   hold: float = 0.01) -> tuple[list[str], int]:
    """Each request takes a slot for ``hold`` seconds; the order they were admitted in and
    the most holders seen at once. The first request is sent alone so that the others
    all wait behind it."""
    admitted: list[str] = []
    holders = [0, 0]  # now, most

    async def one(name: str, urgency: Urgency) -> None:
        async with gate.slot(urgency):
            admitted.append(name)
            holders[0] += 1
            holders[1] = max(holders)
            await asyncio.sleep(hold)
            holders[0] -= 1

    first, *rest = requests
    head = asyncio.create_task(one(*first))
    await asyncio.sleep(0)  # the first holds its slot: everyone after it waits
    await asyncio.gather(head, *(one(n, u) for n, u in rest))
    return admitted, holders[1]


def test_waiters_are_admitted_by_urgency_then_in_order() -> None:
    requests = [("mark-0", Urgency.MARK), ("mark-1", Urgency.MARK), ("create-0", Urgency.CREATE),
                ("mark-2", Urgency.MARK), ("expiry-0", Urgency.EXPIRY),
                ("create-1", Urgency.CREATE)]
    admitted, most = asyncio.run(_run_all(LockGate(1), requests))
    assert admitted == ["mark-0", "expiry-0", "mark-1", "mark-2", "create-0", "create-1"]
    assert most == 1


def test_never_more_holders_than_slots() -> None:
    requests = [(f"r{i}", Urgency(i % 3)) for i in range(40)]
    admitted, most = asyncio.run(_run_all(LockGate(4), requests))
    assert sorted(admitted) == sorted(n for n, _ in requests)
    assert most == 4


def test_a_cancelled_waiter_loses_nothing_for_the_others() -> None:
    async def scenario() -> list[str]:
        gate = LockGate(1)
        admitted: list[str] = []
        release = asyncio.Event()

        async def holder() -> None:
            async with gate.slot(Urgency.MARK):
                admitted.append("holder")
                await release.wait()

        async def waiter(name: str, urgency: Urgency) -> None:
            async with gate.slot(urgency):
                admitted.append(name)

        first = asyncio.create_task(holder())
        await asyncio.sleep(0)
        gone = asyncio.create_task(waiter("cancelled", Urgency.EXPIRY))
        later = asyncio.create_task(waiter("later", Urgency.MARK))
        await asyncio.sleep(0)
        assert gate.waiting == 2
        gone.cancel()
        await asyncio.sleep(0)
        assert gate.waiting == 1
        release.set()
        await asyncio.gather(first, later)
        with pytest.raises(asyncio.CancelledError):
            await gone
        # admitted as it was cancelled: the slot goes on to the next waiter
        async with gate.slot(Urgency.MARK):
            racing = asyncio.create_task(waiter("admitted-then-cancelled", Urgency.MARK))
            after = asyncio.create_task(waiter("after", Urgency.MARK))
            await asyncio.sleep(0)
        racing.cancel()  # its future was just resolved by the release above
        await asyncio.wait_for(after, 1.0)
        assert gate.free == 1 and gate.waiting == 0
        return admitted

    assert asyncio.run(scenario()) == ["holder", "later", "after"]


def test_a_gate_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        LockGate(0)
