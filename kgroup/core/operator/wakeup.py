"""When a group's loop, woken by its own timer (no watch event poked it), must plan again.

Pure: the caller passes its monotonic ``now``. A pass's plan names its deadlines; one of
them is the earliest session expiry (:meth:`GroupLeases.next_expiry`). A member's renewal
is not a material change (:func:`kgroup.core.operator.lease_cache.material_member_change`), so it
does not wake the loop and that expiry goes stale: the member renewed, its session runs
on. Waking at a stale expiry and planning again would cost a full pass every few seconds
at any size (the earliest of many sessions is always about ``duration - renew`` away).
So :func:`after_pass` keeps what the pass saw (the live sessions and the deadlines other
than session expiries: the earliest one, and the earliest lock holder's that the failure
detector, ``operator_logic.expiries_to_mark``, waits for) and :func:`on_timer` says
whether anything is due: a deadline other than a session expiry, or a session that was
live at the pass and is not any more. Otherwise the loop sleeps on until the true earliest
expiry or the other deadline.

Renewals only push expiries later, and every other change of a session (a new member, a
new session, a shorter duration, a session live again) is material and pokes the loop,
so the expiry a pass saw is never later than the true one: no expiry is slept through.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kgroup.core.operator.lease_cache import GroupLeases

__all__ = ["BUSY_READ_PAUSE", "MAX_PASS_PAUSE", "QUIET_AFTER", "QUIET_READ_PAUSE", "Quiet",
           "after_pass", "on_timer", "pass_pause", "read_pause"]


@dataclass(frozen=True)
class Quiet:
    """What the last pass saw: its live sessions and, absolute on the loop's clock, the
    earliest deadline that is not a session expiry (None: none)."""

    live: Mapping[str, str]
    other_at: float | None


def after_pass(leases: GroupLeases, deadlines: Iterable[float | None], wake_at: float | None,
               now: float, *, idle_recheck: float) -> Quiet:
    """``deadlines``: the plan's deadlines (absolute); ``wake_at``: when the pass asked to
    run again (absolute; it may be earlier than every deadline, e.g. a rate limit). Every
    live session's expiry is taken out of them; whatever else remains, and
    ``now + idle_recheck`` (the loop's upper bound on a sleep), is the other deadline."""
    live = leases.live_sessions(now)
    # Every live session's expiry (the earliest of all, and the earliest of the lock
    # holders' that the failure detector waits for): on_timer sees any of them pass.
    expiries = {t for m, s in live.items() if (t := leases.tracker.expires_at(m, s)) is not None}
    others = [d for d in deadlines if d is not None and d not in expiries]
    if wake_at is not None and not any(abs(wake_at - t) <= 1e-6 for t in expiries):
        others.append(wake_at)
    others.append(now + idle_recheck)
    return Quiet(live=live, other_at=min(others))


def on_timer(quiet: Quiet | None, leases: GroupLeases, now: float) -> float | None:
    """None: plan now. Otherwise the seconds to sleep on (nothing is due)."""
    if quiet is None or quiet.other_at is None or quiet.other_at <= now:
        return None
    if leases.live_sessions(now) != quiet.live:
        return None
    expiry = leases.next_expiry(now)
    until = quiet.other_at if expiry is None else min(expiry, quiet.other_at)
    return max(0.0, until - now)


BUSY_READ_PAUSE = 0.1
"""Seconds a group's Lease watch lets events gather between reads while the group moves."""
QUIET_READ_PAUSE = 0.5
"""The same once nothing happened in the group for :data:`QUIET_AFTER` seconds."""
QUIET_AFTER = 10.0
"""Seconds after the group was last poked or planned (and while its status says
Rebalancing) before its Lease watch reads at the quiet pace."""


def read_pause(active_at: float | None, rebalancing: bool, now: float) -> float:
    """How long the group's Lease watch pauses between two reads of its stream.

    Each read costs a wake-up of the loop and a pass of asyncio's TLS layer whatever it
    brings, so reading less often costs less (1,000 members renewing every 2 s: 0.030
    cores at 0.1 s, 0.015 at 0.5 s; docs/benchmarks.md). While the group moves -- it was
    poked or planned (``active_at``) in the last :data:`QUIET_AFTER` seconds (every
    material change pokes it) or its status says Rebalancing (revocations and
    acknowledgements outstanding) -- the next event may be the one a hand-over waits for,
    and reads stay every :data:`BUSY_READ_PAUSE`. A poke of the group (a pod changed) also
    ends a quiet pause at once (the watch's ``hurry``). What a quiet pause delays is the
    first Lease event of a change and the observation of a renewal: a renewal stamped up
    to the pause late makes its session expire that much later on the operator's clock (a
    crash is taken over up to :data:`QUIET_READ_PAUSE` later), never earlier, so the
    failure detector stays safe.
    """
    if rebalancing or active_at is None or now - active_at < QUIET_AFTER:
        return BUSY_READ_PAUSE
    return QUIET_READ_PAUSE


MAX_PASS_PAUSE = 0.5
"""The longest breath a group's loop takes between two passes (:func:`pass_pause`)."""
PASS_PAUSE_FROM = 0.005
"""A decision shorter than this (any group of a few hundred partitions) takes no pause."""


def pass_pause(decide_seconds: float) -> float:
    """Seconds the loop lets everything else run before the next pass of a group whose
    last decision took ``decide_seconds``: as long as that decision, at most
    :data:`MAX_PASS_PAUSE`; none below :data:`PASS_PAUSE_FROM`.

    A decision runs on the operator's one event loop and holds it. At 10,000 partitions
    one takes tens of milliseconds, and during a rebalance every lock event pokes the
    group again, so passes ran back to back: the lock writes in flight (16 at a time) only
    finished between two passes and the next were admitted only then -- 16 marks per pass,
    ≈ 70 marks/s, while the API server had room for far more (docs/benchmarks.md). With
    the pause a pass holds the loop at most half the time; the pokes that arrive meanwhile
    are served by the one pass after it. What it delays is that pass, by at most one
    decision's time (and only for groups whose decisions are that slow).
    """
    if decide_seconds < PASS_PAUSE_FROM:
        return 0.0
    return min(decide_seconds, MAX_PASS_PAUSE)
