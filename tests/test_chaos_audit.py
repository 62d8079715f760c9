"""The chaos run's ownership audit (``bench/chaos.py``: ``audit_violations``), on audit
lines built by hand: pure, no cluster.

A session's ownership ends when it really ended (release, ``lost``, the fence's ``until``,
its process's SIGKILL), or at the deletion of its lock (by hand, or with its group) if
that came first; two sessions active on one partition at once is a violation, unless the
overlap began after a deletion of the lock under the older one (the token fences it).

Shown to fail: the real overlaps below are reported; the checker ``make chaos`` used to
run (a synthetic ``lost`` at each deletion for every earlier acquisition, kept here as
``synthetic_lost_variant``) reports a SIGKILLed session as active until a group re-apply
a minute later, and so an overlap the audit does not hold; and the restarted-session test
fails on the harness that closed every session of a killed pod at its kill time (the
restarted one's interval was empty: [7, 7]), checked by running it against that version.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kgroup_testing.sidecar_harness import Interval, interval_violations, safety_violations

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import chaos

Revoked = list[tuple[int | None, float]]


def rec(mono: float, event: str, session: str, partition: int | None = None,
        token: int | None = None, *, member: str | None = None,
        **extra: object) -> dict[str, Any]:
    return {"mono": mono, "event": event, "session": session,
            "member": member or f"pod-{session[0]}", "partition": partition, "token": token,
            **extra}


def synthetic_lost_variant(audit: list[dict[str, Any]], killed_at: dict[str, float],
                           revoked: Revoked) -> list[str]:
    """The broken checker: a ``lost`` line at each deletion for every acquisition before
    it, which closes a session SIGKILLed long before at the deletion, not at its kill."""
    cut = list(audit)
    for partition, at in revoked:
        for r in audit:
            if r["event"] == "acquire" and float(r["mono"]) < at and (
                    partition is None or r.get("partition") == partition):
                cut.append({**r, "event": "lost", "mono": at})
    return safety_violations(cut, ended_at=killed_at, now=1000.0)


def sigkill_then_reapply() -> tuple[list[dict[str, Any]], dict[str, float], Revoked]:
    """Pod lhx89 acquires partition 12 one second before its SIGKILL; its restarted
    process (a new session) takes partition 3; partition 12 goes to pod q once the lease
    ran out; 57 s after the kill the group is deleted and applied again: q loses 12 (its
    lock deleted with the group) and r retakes it with a higher token."""
    audit = [
        rec(9.0, "session", "a1", member="lhx89"),
        rec(10.0, "acquire", "a1", 12, 5, member="lhx89"),
        # SIGKILL at 11.0: no more lines of a1
        rec(13.0, "session", "a2", member="lhx89"),
        rec(14.0, "acquire", "a2", 3, 4, member="lhx89"),
        rec(16.0, "acquire", "q1", 12, 6, member="q"),
        rec(68.1, "lost", "q1", 12, 6, member="q"),
        rec(68.2, "lost", "a2", 3, 4, member="lhx89"),
        rec(70.0, "acquire", "r1", 12, 9, member="r"),
        rec(70.5, "acquire", "a2", 3, 10, member="lhx89"),
    ]
    return audit, {"lhx89": 11.0}, [(None, 68.0)]


def test_a_sigkilled_session_ends_at_its_kill_not_at_a_later_group_reapply() -> None:
    audit, killed, revoked = sigkill_then_reapply()
    everything, left = chaos.audit_violations(audit, killed_at=killed, revoked=revoked,
                                              now=100.0)
    assert (everything, left) == ([], [])


def test_the_synthetic_lost_variant_reports_the_sigkill_then_reapply_as_an_overlap() -> None:
    audit, killed, revoked = sigkill_then_reapply()
    [problem] = synthetic_lost_variant(audit, killed, revoked)
    assert problem.startswith("partition 12: lhx89/a1 (token 5) active until 68.000 overlaps "
                              "q/q1 (token 6)")


def test_two_sessions_active_on_one_partition_at_once_is_a_violation() -> None:
    audit = [rec(1.0, "acquire", "a", 0, 1), rec(2.0, "acquire", "b", 0, 2),
             rec(3.0, "release", "a", 0, 1)]
    for revoked in ([], [(1, 1.5)]):  # a deleted lock of another partition excuses nothing
        everything, left = chaos.audit_violations(audit, killed_at={}, revoked=revoked,
                                                  now=10.0)
        assert len(left) == 1 and "overlaps pod-b/b" in left[0], revoked
        assert everything == left


def test_an_overlap_after_a_lock_was_deleted_and_retaken_is_still_a_violation() -> None:
    audit = [rec(1.0, "acquire", "a", 0, 1), rec(2.0, "lost", "a", 0, 1),
             rec(3.0, "acquire", "b", 0, 5), rec(4.0, "acquire", "c", 0, 6)]
    _, left = chaos.audit_violations(audit, killed_at={}, revoked=[(0, 1.5)], now=10.0)
    assert len(left) == 1 and "pod-b/b (token 5) active until 10.000 overlaps pod-c/c" in left[0]


def test_a_lock_deleted_under_its_holder_excuses_the_overlap_until_the_holder_sees_it() -> None:
    audit = [rec(1.0, "acquire", "a", 0, 1), rec(5.1, "acquire", "b", 0, 7),
             rec(5.2, "lost", "a", 0, 1)]
    everything, left = chaos.audit_violations(audit, killed_at={}, revoked=[(0, 5.0)],
                                              now=10.0)
    assert len(everything) == 1 and left == []
    # the same overlap with the deletion after the next owner's acquisition is not excused
    _, late = chaos.audit_violations(audit, killed_at={}, revoked=[(0, 5.15)], now=10.0)
    assert len(late) == 1


def test_a_restarted_sessions_ownership_runs_past_its_pods_kill_time() -> None:
    """The pod's kill time ends its sessions begun before it, not the one its restarted
    process began after: that one's overlap with another owner is found."""
    audit = [rec(1.0, "acquire", "a1", 1, 1, member="m"),
             rec(6.0, "session", "a2", member="m"), rec(7.0, "acquire", "a2", 0, 3, member="m"),
             rec(8.0, "acquire", "b", 0, 4)]
    everything, left = chaos.audit_violations(audit, killed_at={"m": 5.0}, revoked=[],
                                              now=10.0)
    assert len(left) == 1 and "m/a2 (token 3) active until 10.000 overlaps pod-b/b" in left[0]
    assert everything == left


def test_a_fenced_session_ends_at_its_deadline_and_token_regressions_are_found() -> None:
    audit = [rec(1.0, "acquire", "a", 0, 1), rec(5.0, "acquire", "b", 0, 2),
             rec(9.0, "fence", "a", until=4.0, partitions=[[0, 0]])]
    assert chaos.audit_violations(audit, killed_at={}, revoked=[], now=10.0) == ([], [])
    audit[1]["token"] = 1
    _, left = chaos.audit_violations(audit, killed_at={}, revoked=[(0, 4.5)], now=10.0)
    assert left == ["partition 0: token 1 of pod-b after token 1 of pod-a"]


intervals = st.lists(
    st.builds(lambda p, s, t, a, d: Interval(f"m{s}", f"s{s}", p, t, a, a + d),
              st.integers(0, 2), st.integers(0, 3), st.integers(1, 9),
              st.floats(0, 50), st.floats(0, 20)),
    max_size=8)
revocations = st.lists(st.tuples(st.none() | st.integers(0, 2), st.floats(0, 70)),
                       max_size=3)


@given(intervals, revocations)
def test_revocations_only_shorten_ownership_and_never_add_a_violation(
        ivs: list[Interval], revoked: Revoked) -> None:
    cut = chaos.revoked_at(ivs, revoked)
    assert all(c.start == i.start and c.start <= c.end <= i.end for c, i in zip(cut, ivs,
                                                                                strict=True))
    assert not interval_violations(cut) or interval_violations(ivs)
    assert chaos.revoked_at(ivs, []) == ivs
