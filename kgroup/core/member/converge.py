"""The sidecar's decisions above :class:`~kgroup.core.member.reconcile.Member`, without I/O.

``Member.step`` says *what* to do (start a session, renew, acquire, release, end); this
module decides everything around it, so that no driver has a decision to make:
which observation enters the lock cache (never back in time), which partitions the watch
selects, which Kubernetes requests each action makes and in what order, what every
answer, refusal or missing answer means, how long a request may wait and when to retry.
Two drivers run it: ``kgroup_sidecar.runtime`` (asyncio + the Kubernetes client) and
``kgroup_sim.sidecar`` (the simulated API server with faults). Neither decides anything.

The shape (written down in docs/design.md, "one decision code, two drivers"):

* Observations go in by method (:meth:`SidecarLogic.on_list`, :meth:`~SidecarLogic.on_event`,
  :meth:`~SidecarLogic.app_release`, :meth:`~SidecarLogic.begin_shutdown`).
* :meth:`SidecarLogic.tick` steps the member and returns a :class:`Tick`: the request
  chains to start, the partition watch's scope, when to tick again, whether to exit.
* A request chain is a generator: it yields a request *value* (:class:`GetLease`,
  :class:`CreateLease`, :class:`ReplaceLease`, :class:`DeleteLease`, :class:`Pause`), the
  driver performs it and sends the answer back (:class:`Ok`, :class:`Refused`,
  :class:`NoAnswer`); the chain reports its outcome to the member itself. Chains run
  concurrently (a slow acquisition never delays a renewal); the member allows one
  member-Lease write in flight and ignores outcomes of an older session.
* Time comes from the injected ``clock`` (monotonic seconds) and ``wall`` (for the
  MicroTime stamps written into Leases); session ids from ``new_session``.
* What happened is told to the ``journal`` (audit, metrics, logs, the app's waiting
  release requests): reports, never decisions.

Every decision point is a method, so the simulation's regressions
(``kgroup_sim.variants``) are subclasses of this very code.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from datetime import datetime
from typing import Any

from kgroup.constants import member_lease_name, partition_lease_name
from kgroup.core import health, load
from kgroup.core import lease_codec as codec
from kgroup.core.locks import LeaseTiming
from kgroup.core.member import journal as events
from kgroup.core.member.app_presence import AppPresence, AppState
from kgroup.core.member.group_spec import (
    member_spec,
    partition_bound,
    sealed_by,
    spec_partitions,
)
from kgroup.core.member.journal import Journal
from kgroup.core.member.pacing import renew_retry_seconds, request_timeout
from kgroup.core.member.reconcile import (
    Acquire,
    Action,
    Adopted,
    AppRelease,
    EndSession,
    Fence,
    Lock,
    Lost,
    Member,
    Release,
    Renew,
    Revoke,
    Snapshot,
    StartSession,
    Target,
)
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
    Scope,
    Tick,
    Unknown,
    describe,
    found,
)
from kgroup.core.member.watch_scope import next_watch_scope
from kgroup.core.objects import Obj
from kgroup.core.ranges import MAX_PARTITIONS, max_ranges_chars, parse_ranges

__all__ = ["CONFLICT_RETRY_SECONDS", "MIN_WAIT", "REREAD_RETRY_SECONDS", "SidecarLogic"]

MIN_WAIT = 0.02
"""Floor of a wake-up already due: never spin."""
REREAD_RETRY_SECONDS = 0.5
"""Pause between re-reads of an unanswered acquisition while the API server is away."""
CONFLICT_RETRY_SECONDS = 0.05
"""Pause before retrying a renewal refused with 409 whose Lease still carries our session
(another write of ours got there first: the re-read gave us its resourceVersion)."""
SHUTDOWN_DRAIN_FRACTION = 0.6
"""While shutting down, a revocation waits at most this share of the grace period."""
WATCHES = frozenset({"group", "partition"})
"""The two watches; each must have listed once before the member takes a step. No member
Lease is watched, not even our own (we know it from our writes' answers): the operator
alone watches sessions and marks a lock whose holder's session it saw expire."""


class _Silent:
    def record(self, event: events.Event) -> None:
        pass


# ---- the logic --------------------------------------------------------------------------


class SidecarLogic:
    """One sidecar's state and decisions. Single-threaded: call it from one loop."""

    def __init__(
        self,
        *,
        pod: str,
        group: str,
        namespace: str,
        clock: Callable[[], float],
        wall: Callable[[], datetime],
        new_session: Callable[[], str],
        journal: Journal | None = None,
        termination_grace: float = 30.0,
        member: Member | None = None,
        uid: str | None = None,
        app_timeout: float = 0.0,
    ) -> None:
        self.pod = pod
        self.group_name = group
        self.namespace = namespace
        self.clock = clock
        self.wall = wall
        self.new_session = new_session
        self.journal: Journal = journal or _Silent()
        self.termination_grace = termination_grace
        # uid: this pod's (KGROUP_POD_UID); a lock marked for another pod of our name is
        # not ours to acquire (the admission policy would refuse it)
        self.member = member if member is not None else Member(pod, uid=uid)
        # the app's part: its calls and what it was served (the local API reports them);
        # app_timeout 0: no app gate (the sidecar joins at start, never leaves for silence)
        self.app = AppPresence(timeout=app_timeout)
        self.group: Obj | None = None
        self.timing: LeaseTiming | None = None
        self.drain_timeout = 30.0
        self.partitions = MAX_PARTITIONS  # spec.partitions: the bound of any target parse
        self.target: Target | None = None
        self.in_target = False  # this pod is a key of the target assignment (a member)
        self.group_deleted = False
        self.partition_leases = codec.PackedLeases()
        self.locks: dict[int, Lock] = {}
        self.my_lease: Obj | None = None
        self.app_releases: dict[int, AppRelease] = {}
        self.synced: set[str] = set()
        self.scope: Scope = frozenset()
        self.shutdown_deadline: float | None = None
        self._spec_raw: Any = None
        self._warned: set[str] = set()
        self._audited_release: set[tuple[str, int, int]] = set()
        self.health_summary: Callable[[], str | None] = lambda: None
        """The app's health summary carried by each renewal (``kgroup.core.health``)."""
        self.load_summary: Callable[[], str | None] = lambda: None  # kgroup.core.load

    # ---- decisions a variant may change -------------------------------------------------

    def request_timeout(self) -> float:
        """How long any request may wait for its answer (derived from the lease timing)."""
        timing = self.timing or LeaseTiming(duration=15, renew_interval=5)
        return request_timeout(timing)

    def renew_retry(self, timing: LeaseTiming) -> float:
        return renew_retry_seconds(timing)

    def supersedes(self, new: Obj, cached: Obj) -> bool:
        """Whether ``new`` may replace ``cached`` in the lock cache (never back in time)."""
        return codec.supersedes(new, cached)

    def reread_unanswered_acquisition(self) -> bool:
        """An acquisition without answer may have been applied: ask the server (True), or
        report it failed (False: then adoption alone must catch up; the simulation's
        ``acquire-timeout-fails`` variant)."""
        return True

    def app_state(self) -> AppState | None:
        """What the member's step knows of the app's part (None: no app gate)."""
        return self.app.state(self.clock()) if self.app.gated else None

    def cache_behind(self, lock: Lock | None, action: Release) -> bool:
        """Whether the cached lock may be older than our own acquisition (a list read
        before it, delivered after it): then a release reads the server first."""
        return lock is None or lock.token < action.token

    # ---- observations -------------------------------------------------------------------

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.journal.record(events.Warned(message))

    def on_list(self, kind: str, items: list[Obj], scope: Scope = None) -> None:
        """A (re-)list of one watch. It is authoritative on which objects exist within what
        it covers (the group; the partition Leases of ``scope``, all of the group's when
        None), not on how new each is: a cached lock newer than the listed
        one (our own write's answer) is kept."""
        if kind == "group":
            self._set_group(items[0] if items else None)
        elif kind == "partition":
            listed = {lock.partition for lock in (
                codec.parse_partition_lease(obj).value for obj in items
                if codec.is_partition(obj)) if lock is not None}
            covered = set(self.locks) if scope is None else set(self.locks) & scope
            for vanished in covered - listed:
                self._forget_lock(vanished)
            if scope is not None:
                # Locks outside the new scope are no longer watched: a cached copy would
                # only grow stale (they are read again when they come back into scope).
                for unwatched in set(self.locks) - scope:
                    self._forget_lock(unwatched)
            for obj in items:
                self._apply_lease("ADDED", obj)
        self.synced.add(kind)

    def on_event(self, kind: str, event_type: str, obj: Obj) -> None:
        if kind == "group":
            self._set_group(None if event_type == "DELETED" else obj)
        elif kind == "partition":
            self._apply_lease(event_type, obj)

    def _forget_lock(self, partition: int) -> None:
        self.partition_leases.pop(partition, None)
        self.locks.pop(partition, None)

    def _set_group(self, obj: Obj | None) -> None:
        if obj is None:
            self.target = None  # keep the last timing: our own Lease goes with the group
            self.in_target = False
            self.group_deleted = True  # revoke everything (no target alone holds)
            return
        self.group = obj
        self.group_deleted = False
        name = codec.meta(obj).get("name", "?")
        raw_spec = obj.get("spec") or {}
        if raw_spec is not self._spec_raw and raw_spec != self._spec_raw:
            self._spec_raw = raw_spec
            try:
                timing, drain_timeout = member_spec(raw_spec)
                count = spec_partitions(raw_spec)
            except ValueError as exc:
                self._warn_once(f"spec:{exc}", f"ConsumerGroup {name}: unusable spec: {exc}")
            else:
                self.timing = timing
                self.drain_timeout = drain_timeout
                self.partitions = count
        status = obj.get("status") or {}
        epoch = status.get("epoch")
        if not isinstance(epoch, int):
            self.target = None  # no target: hold what we have until the operator seeds one
            self.in_target = False
            return
        assignment = status.get("assignment") or {}
        ranges = assignment.get(self.pod, "")
        bound = partition_bound(status, self.partitions)
        try:  # bounded: a range beyond the group's numbers is refused, never expanded
            partitions = frozenset(parse_ranges(str(ranges)[:max_ranges_chars(
                bound) + 1], limit=bound))
        except ValueError as exc:
            self._warn_once(f"assign:{str(ranges)[:80]}",
                            f"ConsumerGroup {name}: bad assignment: {exc}")
            return  # keep the previous target (the operator corrects the status)
        self.target = Target(epoch=epoch, partitions=partitions,
                             sealed_by=sealed_by(status, bound))
        self.in_target = self.pod in assignment

    def _apply_lease(self, event_type: str, obj: Obj) -> None:
        name = codec.meta(obj).get("name", "?")
        if codec.is_partition(obj):
            parsed = codec.parse_partition_lease(obj)
            for problem in parsed.problems:
                self._warn_once(f"{name}:{problem}", f"Lease {name}: {problem} (treated as absent)")
            lock = parsed.value
            if lock is None:
                self._warn_once(f"{name}:nolock", f"Lease {name}: not a partition lock")
                return
            cached = self.partition_leases.get(lock.partition)
            if event_type == "DELETED":
                if cached is not None and codec.meta(cached).get("uid") != codec.meta(
                        obj).get("uid") and not self.supersedes(obj, cached):
                    return  # an old incarnation's deletion, replayed
                self._forget_lock(lock.partition)
            elif cached is None or self.supersedes(obj, cached):
                self.partition_leases[lock.partition] = obj
                self.locks[lock.partition] = lock
            # else: older than what we know (a replayed event, or our own write's answer
            # came first)

    def _store_partition(self, obj: Obj) -> None:
        """An answer (or a read) of a partition Lease enters the cache like an event."""
        lock = codec.parse_partition_lease(obj).value
        if lock is None:
            return
        cached = self.partition_leases.get(lock.partition)
        if cached is None or self.supersedes(obj, cached):
            self.partition_leases[lock.partition] = obj
            self.locks[lock.partition] = lock

    # ---- app requests and shutdown ------------------------------------------------------

    def app_release(self, partition: int, token: int, position: str | None,
                    completed: bool = False) -> None:
        """The app released (or acknowledged the revocation of) a partition; ``completed``:
        read to its seal marker (``position``), recorded on the lock with the release."""
        self.app_releases[partition] = AppRelease(token=token, position=position,
                                                  completed=completed)

    def begin_shutdown(self) -> bool:
        """SIGTERM: revoke everything, then end the session. False if already begun."""
        if self.shutdown_deadline is not None:
            return False
        self.shutdown_deadline = self.clock() + self.termination_grace - 1
        self.member.begin_shutdown()
        return True

    # ---- the step -----------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        drain = self.drain_timeout
        if self.shutdown_deadline is not None:
            drain = min(drain, max(0.0, SHUTDOWN_DRAIN_FRACTION * self.termination_grace))
        return Snapshot(
            now=self.clock(),
            timing=self.timing if self.synced >= WATCHES else None,
            drain_timeout=drain,
            target=self.target,
            locks=dict(self.locks),
            app_releases=dict(self.app_releases),
            group_deleted=self.group_deleted,
            app=self.app_state(),
        )

    def tick(self) -> Tick:
        """Step the member on what is known now; what to do, watch and wait for next."""
        if self.member.done:
            return Tick([], self.scope, None, exit="session ended")
        snap = self.snapshot()
        chains = [c for action in self.member.step(snap) if (c := self.execute(action))]
        self.scope = self.next_scope(self.member.partitions_of_interest(self.target))
        if self.member.done:
            return Tick(chains, self.scope, None, exit="session ended")
        now = self.clock()
        if self.shutdown_deadline is not None and now >= self.shutdown_deadline:
            return Tick(chains, self.scope, None, exit="grace period over")
        wake = self.member.next_wakeup(snap) if snap.timing is not None else None
        silent_at = self.app.silent_at()
        if silent_at is not None and snap.timing is not None and silent_at > now:
            wake = silent_at if wake is None else min(wake, silent_at)
        if self.shutdown_deadline is not None:
            wake = self.shutdown_deadline if wake is None else min(wake, self.shutdown_deadline)
        return Tick(chains, self.scope, None if wake is None else max(MIN_WAIT, wake - now))

    def next_scope(self, interest: frozenset[int]) -> Scope:
        return next_watch_scope(self.scope, interest)

    def execute(self, action: Action) -> Chain | None:
        """What one action of the member means: a report now, or a request chain."""
        if isinstance(action, Fence):
            self.journal.record(events.Fenced(action.session, action.until,
                                              [list(p) for p in action.partitions]))
            for p, token in action.partitions:
                self._resolve(p, token, False)
            self.app_releases.clear()
            return None
        if isinstance(action, Lost):
            self.journal.record(events.Lost(action.session, action.partition, action.token))
            self._resolve(action.partition, action.token, False)
            return None
        if isinstance(action, Revoke):
            self.journal.record(events.Revoking(action.partition, action.token))
            return None
        if isinstance(action, Adopted):
            self.journal.record(events.Acquired(action.session, action.partition, action.token,
                                                action.position, adopted=True))
            return None
        if isinstance(action, StartSession):
            return self._start_session(action)
        if isinstance(action, Renew):
            return self._renew(action)
        if isinstance(action, Acquire):
            return self._acquire(action)
        if isinstance(action, Release):
            return self._release(action)
        if isinstance(action, EndSession):
            return self._end_session(action)
        return None

    def _resolve(self, partition: int, token: int, ok: bool) -> None:
        self.journal.record(events.Resolved(partition, token, ok))
        released = self.app_releases.get(partition)
        if released is not None and released.token == token:
            del self.app_releases[partition]

    # ---- request chains -----------------------------------------------------------------

    @property
    def my_lease_name(self) -> str:
        return member_lease_name(self.group_name, self.pod)

    def _start_session(self, action: StartSession) -> Chain:
        assert self.group is not None
        session = self.new_session()
        name = self.my_lease_name
        answer = yield GetLease(name, self.request_timeout(), session=True)
        existing = found(answer)
        if isinstance(existing, Unknown):
            self.journal.record(events.SessionStartFailed(describe(answer)))
            self.member.session_start_failed(now=self.clock())
            return
        body = codec.new_member_lease(
            name=name, namespace=self.namespace, group=self.group, member=self.pod,
            session=session, duration=action.timing.duration, existing=existing,
            now=self.wall(),
        )
        sent = self.clock()
        if existing is None:
            answer = yield CreateLease(body, self.request_timeout())
        else:
            answer = yield ReplaceLease(body, self.request_timeout())
        if not isinstance(answer, Ok) or answer.obj is None:
            self.journal.record(events.SessionStartFailed(describe(answer)))
            self.member.session_start_failed(now=self.clock())
            return
        self.my_lease = answer.obj
        self.member.session_started(session, sent_at=sent, timing=action.timing, now=self.clock())
        if self.member.session == session:
            self.journal.record(events.SessionStarted(session))

    def _renew(self, action: Renew) -> Chain:
        assert self.my_lease is not None
        body = codec.renewed_member_lease(self.my_lease, duration=action.timing.duration,
                                          epoch=action.epoch, now=self.wall())
        health.annotate(body, self.health_summary())
        load.annotate_load(body, self.load_summary())
        sent = self.clock()
        answer = yield ReplaceLease(body, self.request_timeout())
        if isinstance(answer, Ok) and answer.obj is not None:
            self.my_lease = answer.obj
            self.member.renewed(action.session, sent_at=sent, timing=action.timing,
                                epoch=action.epoch, now=self.clock())
            return
        lost = isinstance(answer, Refused) and answer.status == 404
        retry = self.renew_retry(action.timing)
        if isinstance(answer, Refused) and answer.status == 409:
            reread = yield GetLease(self.my_lease_name, self.request_timeout(), session=True)
            fresh = reread.obj if isinstance(reread, Ok) else None
            mine = fresh is not None and _session_of(fresh) == action.session
            lost = fresh is not None and not mine
            if mine:
                self.my_lease = fresh
            if not lost:
                retry = CONFLICT_RETRY_SECONDS
        self.journal.record(events.RenewFailed(describe(answer), lost))
        self.member.renew_failed(action.session, now=self.clock(), session_lost=lost,
                                 retry_in=retry)

    def _acquire(self, action: Acquire) -> Chain:
        p = action.partition
        # A takeover needs no read of the holder's member Lease: the operator read it (a
        # quorum GET) before it marked the session expired, and the write's precondition
        # is the marked lock as cached (Member.lock_state decided on its mark).
        last = self.partition_leases.get(p)
        if last is None or codec.meta(last).get("resourceVersion") != action.expected_rv:
            self._acquire_failed(action, None)
            return
        assert self.timing is not None
        body = codec.acquired_partition_lease(
            last, member=self.pod, session=action.session, token=action.token,
            duration=self.timing.duration, now=self.wall(), uid=self.member.uid,
        )
        answer = yield ReplaceLease(body, self.request_timeout())
        result = answer.obj if isinstance(answer, Ok) else None
        if result is None and isinstance(answer, NoAnswer) \
                and self.reread_unanswered_acquisition():
            # No answer: the write may have happened. Reporting a failure would leave a
            # lock carrying our live session that the core waits on for ever; ask instead.
            result = yield from self._reread_acquisition(action, codec.meta(body)["name"])
        if result is None:
            self._acquire_failed(action, answer)
            return
        self._store_partition(result)
        lock = codec.parse_partition_lease(result).value
        token = lock.token if lock is not None else action.token
        self.member.acquired(p, action.session, token=token,
                             resource_version=codec.meta(result)["resourceVersion"])
        if self.member.session == action.session and p in self.member.owned:
            self.journal.record(events.Acquired(action.session, p, token,
                                                lock.position if lock else None, adopted=False))

    def _acquire_failed(self, action: Acquire, answer: Answer | None) -> None:
        self.journal.record(events.AcquireFailed(
            action.partition, "cache moved on" if answer is None else describe(answer)))
        self.member.acquire_failed(action.partition, action.session, now=self.clock())

    def _reread_acquisition(self, action: Acquire, name: str) -> Generator[
            Request, Answer, Obj | None]:
        """After an unanswered acquisition: the Lease if it shows our write, else None.
        Retried while the session that wrote it lasts."""
        while self.member.session == action.session:
            answer = yield GetLease(name, self.request_timeout())
            fresh = found(answer)
            if isinstance(fresh, Unknown):
                yield Pause(REREAD_RETRY_SECONDS)
                continue
            if fresh is None:
                return None
            self._store_partition(fresh)
            lock = codec.parse_partition_lease(fresh).value
            if lock is not None and (lock.holder, lock.session, lock.token) == (
                self.pod, action.session, action.token
            ):
                return fresh
            return None
        return None

    def _ours(self, lock: Lock | None, action: Release) -> bool:
        return lock is not None and (lock.holder, lock.session, lock.token) == (
            self.pod, action.session, action.token)

    def _release(self, action: Release) -> Chain:
        p = action.partition
        key = (action.session, p, action.token)
        if key not in self._audited_release:  # ownership ends before the write is sent
            self._audited_release.add(key)
            self.journal.record(events.Releasing(action.session, p, action.token,
                                                 action.position, action.reason))
        last = self.partition_leases.get(p)
        lock = codec.parse_partition_lease(last).value if last else None
        if self.cache_behind(lock, action):
            answer = yield GetLease(partition_lease_name(self.group_name, p),
                                    self.request_timeout())
            fresh = found(answer)
            if isinstance(fresh, Unknown):
                self.journal.record(events.ReleaseFailed(p, f"re-read: {describe(answer)}"))
                self.member.release_failed(p, action.session, now=self.clock(), still_ours=True)
                return
            last = fresh
            if last is not None:
                self._store_partition(last)
            lock = codec.parse_partition_lease(last).value if last else None
        if last is None or not self._ours(lock, action):
            gone = lock is None  # the Lease vanished (group deleted): nothing to write
            self.member.release_failed(p, action.session, now=self.clock(), still_ours=False)
            self._resolve(p, action.token, gone)
            return
        # A 409 on a lock we still hold means someone wrote another field (the operator's
        # assignment mark): release again at once from the fresh read, once.
        for retry in (True, False):
            body = codec.released_partition_lease(last, token=action.token,
                                                  position=action.position,
                                                  completed=action.completed)
            answer = yield ReplaceLease(body, self.request_timeout())
            if isinstance(answer, Ok) and answer.obj is not None:
                self._store_partition(answer.obj)
                self.journal.record(events.Released(p, action.token, action.position))
                self.member.released(p, action.session)
                self._resolve(p, action.token, True)
                return
            still_ours = True  # unless a read shows otherwise (no answer: retried later)
            if isinstance(answer, Refused) and answer.status in (404, 409):
                fresh = found((yield GetLease(codec.meta(body)["name"], self.request_timeout())))
                if not isinstance(fresh, Unknown):
                    if fresh is not None:
                        self._store_partition(fresh)
                    still_ours = fresh is not None and self._ours(
                        codec.parse_partition_lease(fresh).value, action)
                    if still_ours and retry and fresh is not None:
                        last = fresh
                        continue
            break
        self.journal.record(events.ReleaseFailed(p, describe(answer)))
        self.member.release_failed(p, action.session, now=self.clock(), still_ours=still_ours)
        if not still_ours:
            self._resolve(p, action.token, False)

    def _end_session(self, action: EndSession) -> Chain:
        answer = yield DeleteLease(self.my_lease_name, self.request_timeout(), session=True)
        if isinstance(answer, NoAnswer) or (
                isinstance(answer, Refused) and answer.status != 404):
            self.journal.record(events.EndSessionFailed(describe(answer)))
        self.journal.record(events.SessionEnded(action.session))
        self.member.session_ended()


def _session_of(member_lease: Obj) -> str | None:
    parsed = codec.parse_member_lease(member_lease).value
    return parsed.session if parsed is not None else None
