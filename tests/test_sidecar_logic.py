"""The sidecar's decision code (kgroup.core.member.converge), case by case: for each decision
the exact sequence of Kubernetes requests it makes, on a fake clock, with the answers fed
back by hand. This is the code both drivers run (kgroup_sidecar.runtime against the real
API server, kgroup_sim.sidecar against the simulated one); the runtime's mapping of these
requests onto real API calls is checked in e2e/tests/test_sidecar_driver.py.

Modelled on client-go's leader election tests: a scripted answer per request, then the
requests made and the state reached are compared exactly."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from kgroup.core.locks import LeaseTiming
from kgroup.core.member.converge import SidecarLogic
from kgroup.core.member.journal import Event
from kgroup.core.member.pacing import request_timeout
from kgroup.core.member.requests import (
    Answer,
    Chain,
    CreateLease,
    DeleteLease,
    GetLease,
    NoAnswer,
    Ok,
    Pause,
    Refused,
    ReplaceLease,
    Request,
)
from kgroup.core.objects import Obj
from kgroup_sim.variants import (
    AcquireTimeoutFails,
    FixedRequestTimeout,
    StaleRelist,
    TokenOnlyCache,
)

ME = "pod-a"
TIMING = LeaseTiming(duration=15, renew_interval=5)
TIMEOUT = request_timeout(TIMING)  # 2.33 s: every request of this timing carries it


def group(epoch: int | None = 1, mine: str = "0-1") -> Obj:
    status: Obj = {} if epoch is None else {"epoch": epoch, "assignment": {ME: mine}}
    return {"metadata": {"name": "g", "namespace": "ns", "uid": "g-uid", "resourceVersion": "5"},
            "spec": {"partitions": 2, "selector": {"matchLabels": {"app": "x"}},
                     "lease": {"durationSeconds": 15, "renewIntervalSeconds": 5},
                     "handoff": {"drainTimeoutSeconds": 10}},
            "status": status}


def lock(p: int, *, token: int = 0, rv: str = "10", holder: str | None = None,
         session: str | None = None, assigned: str | None = ME,
         expired: str | None = None) -> Obj:
    """A partition Lease, marked for ``assigned`` (by default this member); ``expired``:
    the operator's expiry mark."""
    notes = {"kgroup.dev/session": session} if session else {}
    if assigned:
        notes["kgroup.dev/assigned"] = assigned
    if expired:
        notes["kgroup.dev/expired-session"] = expired
    spec: Obj = {"leaseTransitions": token}
    if holder:
        spec["holderIdentity"] = holder
    return {"metadata": {"name": f"g-partition-{p}", "namespace": "ns", "uid": f"u{p}",
                         "resourceVersion": rv, "annotations": notes,
                         "labels": {"kgroup.dev/group": "g", "kgroup.dev/role": "partition",
                                    "kgroup.dev/partition": str(p)}},
            "spec": spec}


def member_lease(member: str, session: str, rv: str) -> Obj:
    return {"metadata": {"name": f"g-member-{member}", "namespace": "ns", "resourceVersion": rv,
                         "annotations": {"kgroup.dev/session": session},
                         "labels": {"kgroup.dev/group": "g", "kgroup.dev/role": "member",
                                    "kgroup.dev/member": member}},
            "spec": {"holderIdentity": member, "leaseDurationSeconds": 15}}


def written(body: Obj, rv: str) -> Obj:
    """What the API server answers to a write of ``body``: it, with a new version."""
    return {**body, "metadata": {**body["metadata"], "resourceVersion": rv}}


class Journal:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def record(self, event: Event) -> None:
        self.events.append((event.kind, event.fields()))

    def kinds(self) -> list[str]:
        return [e for e, _ in self.events if e != "resolved"]


class Case:
    """One SidecarLogic on a fake clock; chains are driven with scripted answers."""

    def __init__(self, logic: type[SidecarLogic] = SidecarLogic) -> None:
        self.now = 1000.0
        self.journal = Journal()
        self.logic = logic(pod=ME, group="g", namespace="ns", clock=lambda: self.now,
                           wall=lambda: datetime(2026, 1, 1, tzinfo=UTC),
                           new_session=lambda: "S1", journal=self.journal)

    def observe(self, grp: Obj, locks: list[Obj]) -> None:
        self.logic.on_list("group", [grp])
        self.logic.on_list("partition", locks, None)

    def run(self, chain: Chain, answer: Callable[[Request], Answer]) -> list[Request]:
        """Drive ``chain`` to its end; ``answer`` plays the API server for each request."""
        made: list[Request] = []
        reply: Answer | None = None
        while True:
            try:
                request = chain.send(reply)  # type: ignore[arg-type]
            except StopIteration:
                return made
            made.append(request)
            reply = answer(request)

    def tick(self) -> list[Chain]:
        return self.logic.tick().chains

    def start_session(self) -> None:
        (chain,) = self.tick()
        self.run(chain, lambda r: Ok(None) if isinstance(r, GetLease) else Ok(
            written(r.body, "50")) if isinstance(r, CreateLease) else Ok())
        assert self.logic.member.session == "S1"


def answers(*replies: Answer) -> Callable[[Request], Answer]:
    queue = list(replies)
    return lambda _request: queue.pop(0)


def shape(requests: list[Request]) -> list[tuple[str, str]]:
    """(kind, object name) of each request: the order of calls, as a test reads it."""
    out = []
    for r in requests:
        if isinstance(r, CreateLease | ReplaceLease):
            out.append((type(r).__name__, r.body["metadata"]["name"]))
        elif isinstance(r, GetLease | DeleteLease):
            out.append((type(r).__name__, r.name))
        else:
            out.append((type(r).__name__, str(r.seconds)))
    return out


# ---- the session --------------------------------------------------------------------------


def test_nothing_is_requested_before_every_watch_has_listed_once() -> None:
    case = Case()
    case.logic.on_list("group", [group()])
    case.logic.on_list("member", [])
    assert case.tick() == []


def test_a_session_starts_with_a_read_then_a_create_of_the_member_lease() -> None:
    case = Case()
    case.observe(group(), [lock(0), lock(1)])
    (chain,) = case.tick()
    made = case.run(chain, answers(Ok(None), Ok({"metadata": {"resourceVersion": "50"}})))
    assert shape(made) == [("GetLease", "g-member-pod-a"), ("CreateLease", "g-member-pod-a")]
    get, create = made
    assert isinstance(get, GetLease) and get.session and get.timeout == TIMEOUT
    assert isinstance(create, CreateLease)
    body = create.body
    assert body["metadata"]["annotations"] == {"kgroup.dev/session": "S1"}
    assert body["metadata"]["ownerReferences"][0]["uid"] == "g-uid"
    assert body["spec"]["holderIdentity"] == ME and body["spec"]["leaseDurationSeconds"] == 15
    assert case.logic.member.session == "S1" and case.journal.kinds() == ["session"]


def test_a_session_takes_over_our_old_member_lease_with_its_version() -> None:
    case = Case()
    case.observe(group(), [lock(0), lock(1)])
    (chain,) = case.tick()
    old = member_lease(ME, "S0", "40")
    made = case.run(chain, answers(Ok(old), Ok(written(old, "51"))))
    assert shape(made) == [("GetLease", "g-member-pod-a"), ("ReplaceLease", "g-member-pod-a")]
    replace = made[1]
    assert isinstance(replace, ReplaceLease)
    assert replace.body["metadata"]["resourceVersion"] == "40"
    assert replace.body["metadata"]["annotations"]["kgroup.dev/session"] == "S1"


def test_an_unanswered_session_read_writes_nothing_and_retries_about_a_second_later() -> None:
    case = Case()
    case.observe(group(), [lock(0), lock(1)])
    (chain,) = case.tick()
    assert shape(case.run(chain, answers(NoAnswer("timeout")))) == [
        ("GetLease", "g-member-pod-a")]
    assert case.logic.member.session is None
    wake = case.logic.tick().wake_in
    assert wake is not None and 0.75 <= wake <= 1.25  # SESSION_BACKOFF's first pause
    case.now += wake - 0.01
    assert case.tick() == []
    case.now += 0.01
    assert len(case.tick()) == 1  # the retry


@pytest.mark.parametrize(("reply", "reread", "requests", "lost", "retry"), [
    (Ok(None), None, ["ReplaceLease"], False, None),
    (NoAnswer(), None, ["ReplaceLease"], False, 0.5),
    (Refused(404), None, ["ReplaceLease"], True, 0.5),
    (Refused(409), "S1", ["ReplaceLease", "GetLease"], False, 0.05),
    (Refused(409), "S9", ["ReplaceLease", "GetLease"], True, 0.5),
])
def test_a_renewal_and_what_each_answer_means(
    reply: Answer, reread: str | None, requests: list[str], lost: bool, retry: float | None,
) -> None:
    case = Case()
    case.observe(group(epoch=None), [])
    case.start_session()
    case.now += 5.0
    (chain,) = case.tick()

    def answer(r: Request) -> Answer:
        if isinstance(r, ReplaceLease):
            return Ok(written(r.body, "60")) if reply == Ok(None) else reply
        return Ok(member_lease(ME, reread or "", "61"))

    made = case.run(chain, answer)
    assert [k for k, _ in shape(made)] == requests
    assert all(r.timeout == TIMEOUT for r in made if not isinstance(r, Pause))
    member = case.logic.member
    if retry is None:
        assert member.deadline == pytest.approx(case.now + 15 - 3)  # from this renewal
        return
    assert case.journal.events[-1][0] == "renew-failed"
    assert case.journal.events[-1][1]["lost"] is lost
    tick = case.logic.tick()
    if lost:  # the deadline is now: the very next tick fences (and starts anew)
        assert "fence" in case.journal.kinds()
    else:
        assert tick.wake_in == pytest.approx(retry) and "fence" not in case.journal.kinds()


# ---- acquisitions -------------------------------------------------------------------------


def ready_to_acquire(locks: list[Obj], logic: type[SidecarLogic] = SidecarLogic) -> Case:
    """Session started, target {0}."""
    case = Case(logic)
    case.observe(group(mine="0"), locks)
    case.start_session()
    return case


def test_a_free_lock_is_acquired_with_one_conditional_update_its_precondition_the_token(
) -> None:
    case = ready_to_acquire([lock(0, token=3, rv="20"), lock(1)])
    chains = case.tick()
    assert len(chains) == 1
    made = case.run(chains[0], lambda r: Ok(written(r.body, "70")))  # type: ignore[union-attr]
    assert shape(made) == [("ReplaceLease", "g-partition-0")]
    body = made[0].body  # type: ignore[union-attr]
    assert body["metadata"]["resourceVersion"] == "20"  # the precondition...
    assert body["metadata"]["annotations"]["kgroup.dev/token"] == "20"  # ...is the token
    assert body["spec"]["holderIdentity"] == ME and body["spec"]["leaseTransitions"] == 4
    assert body["metadata"]["annotations"]["kgroup.dev/session"] == "S1"
    assert case.logic.member.owned[0].token == 20
    assert case.logic.locks[0].resource_version == "70"


def test_a_lock_marked_expired_by_the_operator_is_taken_with_one_write_clearing_the_mark(
) -> None:
    case = ready_to_acquire([lock(0, token=3, rv="20", holder="b", session="T", expired="T")])
    (chain,) = case.tick()
    made = case.run(chain, lambda r: Ok(written(r.body, "71")))  # type: ignore[union-attr]
    # no read of b's member Lease: the operator read it (quorum) before it marked the lock
    assert shape(made) == [("ReplaceLease", "g-partition-0")]
    body = made[0].body  # type: ignore[union-attr]
    assert body["metadata"]["resourceVersion"] == "20"  # the marked lock is the precondition
    assert "kgroup.dev/expired-session" not in body["metadata"]["annotations"]
    assert body["spec"]["holderIdentity"] == ME
    assert case.logic.member.owned[0].token == 20


@pytest.mark.parametrize("expired", [None, "T0"])
def test_a_lock_held_by_another_session_without_its_expiry_mark_is_never_taken(
    expired: str | None,
) -> None:
    case = ready_to_acquire([lock(0, token=3, rv="20", holder="b", session="T",
                                  expired=expired)])
    case.now += 10  # b looks silent (the sidecar watches no member Lease); ours is live
    made = [r for c in case.tick()
            for r in case.run(c, lambda r: Ok(written(r.body, "60")))]  # type: ignore[union-attr]
    assert shape(made) == [("ReplaceLease", "g-member-pod-a")]  # our renewal, nothing else
    assert 0 not in case.logic.member.owned


@pytest.mark.parametrize("shows_ours", [True, False])
def test_an_unanswered_acquisition_is_read_back_before_it_counts_as_failed(
    shows_ours: bool,
) -> None:
    case = ready_to_acquire([lock(0, token=3, rv="20"), lock(1)])
    (chain,) = case.tick()
    sent: list[Obj] = []

    def answer(r: Request) -> Answer:
        if isinstance(r, ReplaceLease):
            sent.append(r.body)
            return NoAnswer("timeout")
        if not sent:
            return NoAnswer()
        return Ok(written(sent[0], "72") if shows_ours else lock(0, token=4, rv="72",
                                                                 holder="c", session="U"))

    made = case.run(chain, answer)
    assert shape(made) == [("ReplaceLease", "g-partition-0"), ("GetLease", "g-partition-0")]
    assert (0 in case.logic.member.owned) is shows_ours


def test_the_read_back_of_an_unanswered_acquisition_pauses_between_attempts() -> None:
    case = ready_to_acquire([lock(0, token=3, rv="20"), lock(1)])
    (chain,) = case.tick()
    made = case.run(chain, answers(NoAnswer(), NoAnswer(), Ok(), Ok(None)))
    assert shape(made) == [("ReplaceLease", "g-partition-0"), ("GetLease", "g-partition-0"),
                           ("Pause", "0.5"), ("GetLease", "g-partition-0")]
    assert 0 not in case.logic.member.owned  # the Lease is gone: failed


def test_a_refused_acquisition_is_not_read_back() -> None:
    case = ready_to_acquire([lock(0, token=3, rv="20"), lock(1)])
    (chain,) = case.tick()
    made = case.run(chain, answers(Refused(409)))
    assert shape(made) == [("ReplaceLease", "g-partition-0")]
    assert 0 not in case.logic.member.owned


# ---- releases and the end ---------------------------------------------------------------


def holding_zero(logic: type[SidecarLogic] = SidecarLogic) -> Case:
    case = ready_to_acquire([lock(0, token=3, rv="20"), lock(1)], logic=logic)
    (chain,) = case.tick()
    case.run(chain, lambda r: Ok(written(r.body, "70")))  # type: ignore[union-attr]
    case.logic.on_event("group", "MODIFIED", group(epoch=2, mine=""))  # 0 moves away
    case.tick()  # revoke
    return case


def test_a_revoked_partition_is_released_with_its_position_on_the_apps_word() -> None:
    case = holding_zero()
    case.logic.app_release(0, 20, "p-17")
    (chain,) = [c for c in case.tick()]
    made = case.run(chain, lambda r: Ok(written(r.body, "80")))  # type: ignore[union-attr]
    assert shape(made) == [("ReplaceLease", "g-partition-0")]
    body = made[0].body  # type: ignore[union-attr]
    assert "holderIdentity" not in body["spec"] and body["metadata"]["resourceVersion"] == "70"
    assert body["metadata"]["annotations"] == {"kgroup.dev/assigned": ME,
                                               "kgroup.dev/position": "p-17",
                                               "kgroup.dev/position-token": "20",
                                               "kgroup.dev/token": "20"}  # kept
    assert 0 not in case.logic.member.owned
    assert ("resolved", {"partition": 0, "token": 20, "ok": True}) in case.journal.events


def test_a_lock_deleted_under_its_holder_is_lost_at_once_without_a_write() -> None:
    case = holding_zero()
    # kubectl delete lease g-partition-0: the list (or the DELETED event) no longer has it
    case.logic.on_list("partition", [], frozenset({0, 1}))
    case.logic.app_release(0, 20, None)
    for chain in case.tick():  # a renewal at most: nothing to write, the lock is gone
        assert all(isinstance(r, ReplaceLease) and r.body["metadata"]["name"] == "g-member-pod-a"
                   for r in case.run(chain, lambda r: Ok(written(r.body, "99"))))  # type: ignore[union-attr]
    assert "release" not in case.journal.kinds()
    assert 0 not in case.logic.member.owned
    assert case.logic.member.view(case.now).partitions == ()  # the app stops at once


def test_a_release_refused_because_the_lock_moved_on_reads_it_and_gives_up() -> None:
    case = holding_zero()
    case.logic.app_release(0, 20, None)
    (chain,) = case.tick()
    taken = lock(0, token=5, rv="90", holder="c", session="U")
    made = case.run(chain, lambda r: Refused(409) if isinstance(r, ReplaceLease) else Ok(taken))
    assert shape(made) == [("ReplaceLease", "g-partition-0"), ("GetLease", "g-partition-0")]
    assert 0 not in case.logic.member.owned
    assert ("resolved", {"partition": 0, "token": 20, "ok": False}) in case.journal.events


def test_a_release_refused_because_the_operator_moved_the_mark_is_retried_at_once() -> None:
    """The operator's mark write (the partition now targets pod-b) changed the lock's
    resourceVersion under the holder: the release reads it, still ours, and writes again
    from the fresh version without waiting for a retry timer."""
    case = holding_zero()
    case.logic.app_release(0, 20, "p-17")
    (chain,) = case.tick()
    marked = lock(0, token=4, rv="75", holder=ME, session="S1", assigned="pod-b")
    session = case.logic.member.session
    marked["metadata"]["annotations"]["kgroup.dev/session"] = session
    marked["metadata"]["annotations"]["kgroup.dev/token"] = "20"
    puts: list[str] = []

    def answer(r: Any) -> Any:
        if isinstance(r, ReplaceLease):
            puts.append(r.body["metadata"]["resourceVersion"])
            return Refused(409) if len(puts) == 1 else Ok(written(r.body, "80"))
        return Ok(marked)

    made = case.run(chain, answer)
    assert shape(made) == [("ReplaceLease", "g-partition-0"), ("GetLease", "g-partition-0"),
                           ("ReplaceLease", "g-partition-0")]
    assert puts == ["70", "75"] and 0 not in case.logic.member.owned
    last = made[-1].body  # type: ignore[union-attr]
    assert last["metadata"]["annotations"]["kgroup.dev/assigned"] == "pod-b"
    assert ("resolved", {"partition": 0, "token": 20, "ok": True}) in case.journal.events


def test_shutdown_ends_with_a_delete_of_the_member_lease() -> None:
    case = Case()
    case.observe(group(epoch=1, mine=""), [lock(0), lock(1)])
    case.start_session()
    assert case.logic.begin_shutdown() and not case.logic.begin_shutdown()
    (chain,) = case.tick()
    made = case.run(chain, answers(Refused(404)))  # already gone: fine
    assert shape(made) == [("DeleteLease", "g-member-pod-a")]
    assert case.logic.tick().exit == "session ended"
    assert case.journal.kinds()[-1] == "session-end"


def test_the_watch_scope_follows_the_interest() -> None:
    case = ready_to_acquire([lock(0), lock(1)])
    assert case.logic.tick().scope == frozenset({0})


# ---- the historic bugs, as variants of this very code, change what is requested ----------


@pytest.mark.parametrize(("logic", "reads_back"), [(SidecarLogic, True),
                                                   (AcquireTimeoutFails, False)])
def test_only_the_shipped_code_reads_back_an_unanswered_acquisition(
    logic: type[SidecarLogic], reads_back: bool,
) -> None:
    case = ready_to_acquire([lock(0, token=3, rv="20"), lock(1)], logic=logic)
    (chain,) = case.tick()
    made = case.run(chain, answers(NoAnswer(), Ok(None)))
    assert (("GetLease", "g-partition-0") in shape(made)) is reads_back


@pytest.mark.parametrize(("logic", "releases"), [(SidecarLogic, True), (StaleRelist, False)])
def test_a_list_read_before_our_acquisition_does_not_make_us_give_the_lock_up_unwritten(
    logic: type[SidecarLogic], releases: bool,
) -> None:
    """Seed 1963 of the old simulation: a re-list read before our acquisition (token 3,
    free) arrives after it. The shipped cache keeps the newer lock and the release writes
    with its version; the old code replaced it and then gave the lock up unwritten."""
    case = holding_zero(logic)
    case.logic.on_list("partition", [lock(0, token=3, rv="20")], frozenset({0, 1}))
    case.logic.app_release(0, 20, None)
    (chain,) = case.tick()
    ours = lock(0, token=4, rv="70", holder=ME, session="S1")
    made = case.run(chain, lambda r: Ok(ours) if isinstance(r, GetLease) else Ok(
        written(r.body, "81")))  # type: ignore[union-attr]
    if releases:
        assert shape(made) == [("ReplaceLease", "g-partition-0")]
        assert made[0].body["metadata"]["resourceVersion"] == "70"  # type: ignore[union-attr]
    else:  # the stale list replaced our acquisition: the lock is given up unwritten
        assert made == [] and ("resolved", {"partition": 0, "token": 20, "ok": False}) in \
            case.journal.events


@pytest.mark.parametrize(("logic", "timeout"), [(SidecarLogic, TIMEOUT),
                                                (FixedRequestTimeout, 6.0)])
def test_requests_wait_at_most_the_timeout_derived_from_the_lease(
    logic: type[SidecarLogic], timeout: float,
) -> None:
    case = Case(logic)
    case.observe(group(), [lock(0), lock(1)])
    (chain,) = case.tick()
    assert case.run(chain, answers(NoAnswer()))[0].timeout == pytest.approx(  # type: ignore[union-attr]
        timeout)


@pytest.mark.parametrize(("logic", "kept"), [(SidecarLogic, "210"), (TokenOnlyCache, "200")])
def test_a_replayed_acquisition_does_not_bring_a_released_holder_back(
    logic: type[SidecarLogic], kept: str,
) -> None:
    case = Case(logic)
    case.logic.on_event("partition", "MODIFIED", lock(0, token=5, rv="200", holder=ME,
                                                      session="S"))
    case.logic.on_event("partition", "MODIFIED", lock(0, token=5, rv="210"))
    case.logic.on_event("partition", "MODIFIED", lock(0, token=5, rv="200", holder=ME,
                                                      session="S"))
    assert case.logic.locks[0].resource_version == kept


def test_an_assignment_beyond_spec_partitions_keeps_the_previous_target_unexpanded() -> None:
    """``"0-99999999"`` in the status once OOM-killed the named member's sidecar. The
    parse is bounded by spec.partitions (2 here): the bad target is refused, warned about
    once, and the previous one kept until the operator corrects the status."""
    case = Case()
    case.observe(group(1, "0-1"), [lock(0), lock(1)])
    assert case.logic.target is not None and case.logic.target.partitions == {0, 1}
    bad = group(2, "0-99999999")
    case.logic.on_list("group", [bad])
    assert case.logic.target.epoch == 1 and case.logic.target.partitions == {0, 1}
    case.logic.on_list("group", [group(2, "0-2")])  # just past the end: refused too
    assert case.logic.target.epoch == 1
    case.logic.on_list("group", [group(3, "1")])
    assert case.logic.target.epoch == 3 and case.logic.target.partitions == {1}
