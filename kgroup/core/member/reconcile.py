"""The sidecar's state machine: make this member's held partitions converge on its target.

Shape: Kafka KIP-848's member reconciliation. The adapter feeds an observed
:class:`Snapshot` (group target, partition locks, the app's release requests, ``now``) to
:meth:`Member.step`, executes the returned actions in order, and reports each action's
outcome back (``session_started``, ``renewed``, ``acquired``, ...).
Nothing here does I/O or reads a clock; all times are the caller's monotonic seconds.

Rules, in the order ``step`` applies them:

1. Session first. When the fencing deadline (``locks.fencing_deadline`` of the last
   *confirmed* renewal) has passed, **fence**: every partition is reported lost at once
   (the app view empties), in-flight results of the old session are ignored, and only
   then a new session is started. No lock is taken before the session is confirmed.
2. Trust our own writes over stale reads: an observed lock whose resourceVersion is
   lower than the one our acquisition stored is an old event and is ignored; a lock whose
   holder/session/token is no longer ours while we are not releasing it, or that is gone
   (deleted by hand: the operator creates it again), is *lost*.
   An acquisition reported failed may still be applied (no answer, and the adapter's
   re-read reached the server before the write did): when the lock later shows our live
   session with exactly the token that acquisition wrote, it is **adopted** (action
   :class:`Adopted`) and held like any other (revoked at once if not targeted). Only
   such writes are adopted, never a lock merely *seen* with our session: a lagging view
   may show one we have released since.
3. Revoke before assign: a partition held but not targeted becomes *revoking* (the app
   is told to finish in-flight work); it is released when the app acknowledges (with its
   position) or when ``drain_timeout`` has passed since revoking started. A revoking
   partition that is targeted again becomes active again without being released.
   **No target is not an empty target**: while the group's status carries no epoch
   (restored from a backup without status, emptied by hand, or never written yet), or
   epoch 0 (the operator's status before it computed any target: it writes one while
   its stabilisation window runs, also after an emptied status), the member holds what
   it has: no revocation, no acquisition, and an acknowledgement only if it holds
   nothing. The operator seeds an empty status from the current lock holders, so holding
   on moves nothing. Everything is revoked only on shutdown or when the group is deleted
   (``Snapshot.group_deleted``). Partitions already revoking keep draining.
4. Acquire a targeted partition only when its lock exists (the operator creates it),
   is marked for this member and its pod (``Lock.assigned``, ``Lock.assigned_uid`` when the
   member knows its uid: the API server refuses anyone else) and
   is FREE or TAKEABLE (:meth:`Member.lock_state`: held by another member, it is
   takeable only once the operator marked its session expired, ``Lock.expired``; no
   member watches another's session); the write carries the observed resourceVersion as its
   precondition, and that resourceVersion is the new token (:mod:`kgroup.core.tokens`:
   tokens of a partition never go backwards, even across a Lease deleted and created
   again). A lock held by our own *older* session is FREE to us.
5. Acknowledge epoch E on the member Lease only when held == target(E) exactly.
6. Renew the session every renew interval (one member-Lease write in flight at a time).
7. The app's part (:mod:`kgroup.core.member.app_presence`, ``Snapshot.app``; None: no
   app gate). A session is started only while the app takes part (it has asked for its
   assignment and is not silent): before, the pod is no member. When the app stops
   taking part the member **withdraws**: it revokes everything as at shutdown, ends its
   session once nothing is held, and starts a new one when the app calls again. A
   revoked partition the app has not seen under its token is released at once, with the
   position it was handed (the app cannot be working on it); the drain timeout applies
   only to partitions the app has seen.
   Requests are timed and retried by :mod:`kgroup.core.member.pacing`.

What ``step`` reads: the locks of :meth:`Member.partitions_of_interest` only (the target,
what is held, acquired or possibly acquired). An adapter may watch just those
(:mod:`kgroup.core.member.watch_scope` says when to re-select), so a member's watch
traffic grows with its own share, not with the group; it watches no member Lease but its
own writes.

Why this module is over 600 lines: :class:`Member` is one state machine whose rules each
read and change what the others keep (the partitions held, acquired, retried, and the
session), so its step, its queries and the outcomes the adapter reports stay one class;
its vocabulary (:mod:`~kgroup.core.member.view`), pacing and watch scope live apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kgroup.core.assignment import PartitionView, View
from kgroup.core.backoff import draws
from kgroup.core.locks import LeaseTiming, Lock, LockState, fencing_deadline, lock_state
from kgroup.core.member.pacing import ACQUISITIONS_IN_FLIGHT, PARTITION_BACKOFF, SESSION_BACKOFF
from kgroup.core.member.view import (
    AckEpoch,
    Acquire,
    Action,
    Adopted,
    AppRelease,
    EndSession,
    Fence,
    Lost,
    PartitionState,
    Release,
    Renew,
    Revoke,
    Snapshot,
    StartSession,
    Target,
)
from kgroup.core.tokens import acquisition_token, resource_version_number

NO_TARGET_EPOCH = 0
"""The epoch of the operator's status before it computed any target (assignment empty);
the first target is epoch 1 (kgroup.core.operator.planner bumps the epoch at every target
change)."""

__all__ = [
    "NO_TARGET_EPOCH",
    "AckEpoch",
    "Acquire",
    "Action",
    "Adopted",
    "AppRelease",
    "EndSession",
    "Fence",
    "Lock",
    "Lost",
    "Member",
    "PartitionState",
    "PartitionView",
    "Release",
    "Renew",
    "Revoke",
    "Snapshot",
    "StartSession",
    "Target",
    "View",
]


@dataclass
class _Owned:
    token: int
    state: PartitionState
    resource_version: str
    position: str | None
    revoking_since: float | None = None
    release_position: str | None = None
    release_reason: str = ""
    release_in_flight: bool = False
    release_completed: bool = False


def _older(rv: str, than: str) -> bool:
    """Whether resourceVersion ``rv`` is known to be older than ``than`` (False when
    either is not a number)."""
    a, b = resource_version_number(rv), resource_version_number(than)
    return a is not None and b is not None and a < b


class Member:
    """One member's reconciliation state. Single-threaded: call it from one loop."""

    def __init__(self, member: str, *, uid: str | None = None,
                 draw: Callable[[], float] | None = None) -> None:
        self.member = member
        self.uid = uid  # this pod's uid: acquire only a lock whose mark names it (None: any)
        # the retries' spread, numbers in [0, 1); by default a stream seeded by the pod (its
        # uid differs from every other pod's, so members that failed together retry apart,
        # and a simulated run is reproducible)
        if draw is None:
            stream = draws(f"{member}/{uid}")
            draw = stream.__next__
        self._draw = draw
        self.session: str | None = None
        self._starting = False
        self._retry_session_at = 0.0
        self._session_failures = 0
        self._confirmed_sent: float | None = None  # send time of last confirmed write
        self._confirmed_timing: LeaseTiming | None = None
        self._session_write_in_flight = False
        self._next_renew_at = 0.0
        self._written_epoch: int | None = None
        # the target partitions of the epoch written as acknowledged, and of the
        # acknowledgement in flight (readiness: an epoch that leaves them alone does not
        # make the pod unready while its acknowledgement is on its way)
        self._written_partitions: frozenset[int] | None = None
        self._ack_partitions: frozenset[int] | None = None
        self.owned: dict[int, _Owned] = {}
        self._acquiring: dict[int, str | None] = {}  # partition -> handed-over position
        self._attempted: dict[int, int] = {}  # partition -> token of the acquisition in flight
        # acquisitions reported failed that the server may still apply: partition -> token
        self._unconfirmed: dict[int, int] = {}
        self._retry_at: dict[int, float] = {}
        self._failures: dict[int, int] = {}  # partition -> failed attempts in a row
        # partitions the app gave back while still targeted (it is stopping: Kafka's
        # "leave group"): not taken again until the target epoch changes or a drain
        # timeout has passed, so a stopping app and its sidecar cannot ping-pong a lock
        self._relinquished: dict[int, tuple[int | None, float]] = {}
        self._epoch: int | None = None
        self.version = 0
        self._sealed_by: Mapping[int, int] = {}  # the target's, as last shown
        self._view_parts: tuple[int, tuple[PartitionView, ...]] | None = None
        self.fenced = False
        self.shutting_down = False
        self._ending = False
        self.done = False
        self.fence_count = 0
        self._drain_timeout = 0.0

    # ---- derived --------------------------------------------------------------------

    @property
    def deadline(self) -> float | None:
        """Fencing deadline of the current session, or None when none is confirmed."""
        if self.session is None or self._confirmed_sent is None:
            return None
        timing = self._confirmed_timing
        assert timing is not None
        return fencing_deadline(self._confirmed_sent, timing.duration, timing.effective_margin)

    def _expired(self, now: float) -> bool:
        deadline = self.deadline
        return deadline is not None and now >= deadline

    def held_tokens(self, now: float) -> dict[int, int]:
        """partition -> token of what :meth:`view` at ``now`` lists (active or revoking),
        without building it: the health book asks at every report and renewal, and a
        view of 1,000 partitions is 1,000 objects (the sidecar's CPU)."""
        deadline = self.deadline
        if deadline is None or now >= deadline or self.fenced:
            return {}
        releasing = PartitionState.RELEASING
        return {p: o.token for p, o in self.owned.items() if o.state is not releasing}

    def view(self, now: float) -> View:
        """The app's view at ``now``; empty once the deadline passed, even before ``step``."""
        deadline = self.deadline
        live = deadline is not None and now < deadline and not self.fenced
        parts: list[PartitionView] = []
        cached = self._view_parts
        shown: tuple[PartitionView, ...] = ()
        if live and cached is not None and cached[0] == self.version:
            shown = cached[1]  # nothing the view shows moved: no revoking partition either
        elif live:
            for p in sorted(self.owned):
                o = self.owned[p]
                if o.state is PartitionState.RELEASING:
                    continue
                revoke_deadline = None
                if o.state is PartitionState.REVOKING and o.revoking_since is not None:
                    revoke_deadline = max(0.0, o.revoking_since + self._drain_timeout - now)
                parts.append(PartitionView(p, o.token, o.state.value, o.position, revoke_deadline,
                                           self._sealed_by.get(p)))
            # Kept while the version stands (every change of what the view shows bumps
            # it: the long-poll's contract), unless a revoking partition's deadline counts
            # down with ``now``. An app polling 1,000 partitions every second rebuilt
            # 1,000 objects each time (the sidecar's CPU).
            shown = tuple(parts)
            revoking = any(v.revoke_deadline_seconds is not None for v in shown)
            self._view_parts = None if revoking else (self.version, shown)
        return View(
            member=self.member,
            session=self.session,
            version=self.version,
            epoch=self._epoch,
            acked_epoch=self._written_epoch,
            fenced=not live,
            valid_for_seconds=max(0.0, deadline - now) if live and deadline is not None else 0.0,
            partitions=shown,
        )

    @property
    def acked_partitions(self) -> frozenset[int] | None:
        """The partitions of the target whose epoch this session last wrote as
        acknowledged (None: none yet)."""
        return self._written_partitions

    def partitions_of_interest(self, target: Target | None) -> frozenset[int]:
        """The partitions whose locks ``step`` and ``next_wakeup`` read: the target, what
        is held (in any state), what is being acquired, and what an unanswered acquisition
        may have written. An adapter that watches only these locks feeds ``step`` every
        lock it decides on (the sidecar's partition watch is scoped to them)."""
        wanted = set(target.partitions) if target is not None else set()
        wanted.update(self.owned, self._acquiring, self._unconfirmed)
        return frozenset(wanted)

    def check_release(self, partition: int, token: int, now: float) -> tuple[int, str] | None:
        """Validate an app's release request: None if acceptable, else (HTTP status, why)."""
        owned = self.owned.get(partition)
        if owned is None or self.fenced or self._expired(now) \
                or owned.state is PartitionState.RELEASING:
            return 404, f"partition {partition} is not held by this member"
        if owned.token != token:
            return 409, f"token {token} is not the current token {owned.token} of {partition}"
        return None

    def next_wakeup(self, snap: Snapshot) -> float | None:
        """The earliest time ``step`` has something to do without a new observation."""
        times: list[float] = []
        deadline = self.deadline
        if deadline is not None:
            times.append(deadline)
        if self.session is None and not self._starting and (
                snap.app is None or snap.app.taking_part):
            times.append(self._retry_session_at)  # (an app's first call wakes the loop)
        if self.session is not None and not self._session_write_in_flight:
            times.append(self._next_renew_at)
        for o in self.owned.values():
            if o.state is PartitionState.REVOKING and o.revoking_since is not None:
                times.append(o.revoking_since + snap.drain_timeout)
        # Retry times already past were acted on by ``step`` (or an outcome is pending,
        # which wakes the loop): only future ones are wake-ups. A lock held by another
        # member needs no timer: the operator's expiry mark arrives as a watch event.
        times.extend(t for t in self._retry_at.values() if t > snap.now)
        times.extend(until for _, until in self._relinquished.values() if until > snap.now)
        return min(times) if times else None

    def lock_state(self, lock: Lock, session: str) -> LockState:
        """Whether this member (under ``session``) may take ``lock``: a lock held by our
        own *older* session is FREE to us; one held by another session is TAKEABLE only
        with the operator's expiry mark of that session (:func:`locks.lock_state`)."""
        if lock.holder == self.member and lock.session != session:
            return LockState.FREE
        return lock_state(holder=lock.holder, session=lock.session, expired=lock.expired)

    # ---- the reconciliation step ----------------------------------------------------

    def step(self, snap: Snapshot) -> list[Action]:
        if self.done:
            return []
        if snap.timing is None:  # the group was never seen: nothing to hold, nothing to end
            if self.shutting_down and self.session is None and not self._starting:
                self.done = True
            return []
        self._drain_timeout = snap.drain_timeout
        if snap.target is not None and snap.target.epoch != self._epoch:
            self._epoch = snap.target.epoch
            self._bump()
        if snap.target is not None and snap.target.sealed_by != self._sealed_by:
            changed = set(snap.target.sealed_by.items()) ^ set(self._sealed_by.items())
            self._sealed_by = snap.target.sealed_by
            if any(p in self.owned for p, _ in changed):
                self._bump()  # what the view shows of a held partition changed
        # 1. the session: fence on a passed deadline, then (re)start.
        actions = self._fence() if self._expired(snap.now) else []
        if self.session is None:
            return actions + self._start_session(snap, snap.timing)
        session = self.session
        # 2. reconcile what we hold with what we observe.
        actions.extend(self._lost(snap, session))
        # No target (a status without epoch) holds what we have; deletion, shutdown and
        # an app that stopped taking part revoke everything (rules 3 and 7).
        withdrawing = snap.app is not None and not snap.app.taking_part
        leaving = self.shutting_down or withdrawing
        holding = (snap.target is None or snap.target.epoch == NO_TARGET_EPOCH) and not (
            leaving or snap.group_deleted)
        targeted: frozenset[int] = frozenset()
        if not leaving and snap.target is not None:
            targeted = snap.target.partitions
        actions.extend(self.adopt(snap, session))
        # 3. revoke before assign; release on the app's word or at the drain timeout.
        actions.extend(self._revoke_and_release(snap, targeted, holding))
        # 4. acquire what is targeted, free or takeable (and not given back by the app).
        actions.extend(self._acquire(snap, session, targeted))
        # 5. acknowledge the epoch once held == target exactly; 6. renew.
        if not self._session_write_in_flight and not withdrawing:
            actions.extend(self._write_session(snap, session, snap.timing))
        if leaving and not self.owned and not self._acquiring and not self._ending:
            self._ending = True
            actions.append(EndSession(session))
        return actions

    def _start_session(self, snap: Snapshot, timing: LeaseTiming) -> list[Action]:
        """Rule 1 without a session: the session start to send (none while one is on its
        way, before the retry time, for a deleted group or while the app takes no part);
        done instead when shutting down."""
        if self.shutting_down:
            if not self._starting:
                self.done = True
            return []
        # No session for a group that is gone: its member Lease would name the deleted
        # group as owner and be garbage-collected under it (a group applied again
        # is waited for; shutdown and the app's view are not affected).
        if not self._starting and snap.now >= self._retry_session_at and not snap.group_deleted \
                and (snap.app is None or snap.app.taking_part):
            self._starting = True
            return [StartSession(timing=timing)]
        return []

    def _lost(self, snap: Snapshot, session: str) -> list[Action]:
        """Rule 2: the held partitions whose locks are no longer ours (each dropped from
        what is held); a stale event of a lock is ignored."""
        actions: list[Action] = []
        for p in sorted(self.owned):
            o = self.owned[p]
            lock = snap.locks.get(p)
            if o.state is PartitionState.RELEASING:
                continue  # our release result is on its way
            if lock is not None and lock.resource_version == o.resource_version \
                    and lock.holder == self.member and lock.session == session \
                    and lock.token == o.token:
                continue  # the steady state: the lock as we wrote it (no version to parse)
            if lock is not None and _older(lock.resource_version, o.resource_version):
                continue  # a stale event: our own write is newer
            ours = lock is not None and lock.holder == self.member \
                and lock.session == session and lock.token == o.token
            if ours:
                assert lock is not None
                o.resource_version = lock.resource_version
                continue
            del self.owned[p]
            self._bump()
            actions.append(Lost(partition=p, session=session, token=o.token))
        return actions

    def _revoke_and_release(self, snap: Snapshot, targeted: frozenset[int],
                            holding: bool) -> list[Action]:
        """Rule 3: the revocations of held partitions no longer targeted (a revoking one
        targeted again is active again), then the releases due."""
        now = snap.now
        actions: list[Action] = []
        active, app_releases = PartitionState.ACTIVE, snap.app_releases
        for p in sorted(self.owned):
            o = self.owned[p]
            if o.state is active and (holding or p in targeted) and p not in app_releases:
                continue  # the steady state: kept, and nothing asked of it (no version bump)
            if o.state is PartitionState.ACTIVE and p not in targeted and not holding:
                o.state, o.revoking_since = PartitionState.REVOKING, now
                self._bump()
                actions.append(Revoke(p, o.token, now + snap.drain_timeout))
            elif o.state is PartitionState.REVOKING and p in targeted:
                o.state, o.revoking_since = PartitionState.ACTIVE, None
                self._bump()
            if self._retry_at.get(p, 0.0) > now:
                continue
            release = self._release_due(p, o, snap)
            if release is not None:
                actions.append(release)
        return actions

    def _release_due(self, p: int, o: _Owned, snap: Snapshot) -> Release | None:
        """Rule 3's release of held partition ``p``, if one is due: a retry after a failed
        release, the app's release, the drain timeout, or a revoked partition the app has
        not seen."""
        if o.state is PartitionState.RELEASING:
            if not o.release_in_flight:  # a retry after a failed release
                return self._release(p, o, o.release_position, o.release_reason,
                                     o.release_completed)
            return None
        app = snap.app_releases.get(p)
        if app is not None and app.token == o.token:
            if o.state is PartitionState.ACTIVE:
                self._relinquished[p] = (self._epoch, snap.now + snap.drain_timeout)
            return self._release(p, o, app.position, "app", app.completed)
        if (
            o.state is PartitionState.REVOKING
            and o.revoking_since is not None
            and snap.now >= o.revoking_since + snap.drain_timeout
        ):
            return self._release(p, o, None, "drain-timeout")
        if o.state is PartitionState.REVOKING and snap.app is not None \
                and not snap.app.seen(p, o.token):
            return self._release(p, o, None, "unseen")
        return None

    def _acquire(self, snap: Snapshot, session: str, targeted: frozenset[int]) -> list[Action]:
        """Rule 4: the acquisitions of targeted partitions not held whose locks are marked
        for this pod and free or takeable, at most :data:`ACQUISITIONS_IN_FLIGHT` in flight."""
        now = snap.now
        actions: list[Action] = []
        for p, (epoch, until) in list(self._relinquished.items()):
            if epoch != self._epoch or now >= until:
                del self._relinquished[p]
        for p in sorted(targeted.difference(self.owned)):  # a held one needs nothing here
            if len(self._acquiring) >= ACQUISITIONS_IN_FLIGHT:
                break  # the rest when these end (each end steps the member again)
            if p in self._acquiring or self._retry_at.get(p, 0.0) > now:
                continue
            if p in self._relinquished:
                continue
            lock = snap.locks.get(p)
            if lock is None or lock.assigned != self.member or (
                    self.uid is not None and lock.assigned_uid != self.uid):
                continue  # not created or not marked for our pod yet: wait for the operator
            if lock.holder == self.member and lock.session == session:
                continue  # ours already: adopted above, or an acquisition in flight
            state = self.lock_state(lock, session)
            if state is LockState.HELD:
                continue
            token = acquisition_token(lock.resource_version)
            if token is None:
                continue  # not an etcd revision: no token can be derived (never on etcd)
            self._acquiring[p] = lock.position
            self._attempted[p] = token
            actions.append(Acquire(
                partition=p, session=session, token=token, expected_rv=lock.resource_version,
                takeover=bool(lock.holder) and lock.holder != self.member))
        return actions

    def _write_session(self, snap: Snapshot, session: str,
                       timing: LeaseTiming) -> list[Action]:
        """Rules 5 and 6, with no member-Lease write in flight: the acknowledgement of an
        epoch held exactly, else a renewal when it is due."""
        epoch = self._ackable_epoch(snap)
        if epoch is not None and epoch != self._written_epoch:
            assert snap.target is not None  # an ackable epoch is the target's
            self._session_write_in_flight = True
            self._ack_partitions = frozenset(snap.target.partitions)
            return [AckEpoch(session, timing, epoch)]
        if snap.now >= self._next_renew_at:
            self._session_write_in_flight = True
            return [Renew(session, timing, self._written_epoch)]
        return []
    def adopt(self, snap: Snapshot, session: str) -> list[Action]:
        """Rule 2: adopt the lock an acquisition reported failed has written after all
        (even if no longer targeted: rule 3 then revokes and releases it).

        A public seam: the simulation's ``NoAdoptionMember`` overrides it to show that
        without adoption such a partition stays stuck (sim/kgroup_sim/variants.py)."""
        actions: list[Action] = []
        for p in sorted(self._unconfirmed):
            if p in self.owned or p in self._acquiring:
                continue
            lock = snap.locks.get(p)
            if lock is None:
                continue
            if (lock.holder, lock.session, lock.token) == (
                    self.member, session, self._unconfirmed[p]):
                self._unconfirmed.pop(p, None)
                self._partition_done(p)
                self.owned[p] = _Owned(lock.token, PartitionState.ACTIVE, lock.resource_version,
                                       lock.position)
                self._bump()
                actions.append(Adopted(p, session, lock.token, lock.position))
            elif _older(str(self._unconfirmed[p]), lock.resource_version):
                # The lock moved past our write's precondition (its token) without
                # showing our write: another write won, ours can no longer apply.
                del self._unconfirmed[p]
        return actions

    def _ackable_epoch(self, snap: Snapshot) -> int | None:
        if snap.target is None or self.shutting_down or self._acquiring:
            return None
        held = {p for p, o in self.owned.items() if o.state is PartitionState.ACTIVE}
        if len(held) != len(self.owned) or held != set(snap.target.partitions):
            return None
        return snap.target.epoch

    def _release(self, p: int, o: _Owned, position: str | None, reason: str,
                 completed: bool = False) -> Release:
        assert self.session is not None
        if o.state is not PartitionState.RELEASING:
            o.state = PartitionState.RELEASING
            self._bump()
        o.release_position, o.release_reason, o.release_in_flight = position, reason, True
        o.release_completed = completed
        return Release(p, self.session, o.token, o.resource_version, position, reason,
                       completed)

    def _fence(self) -> list[Action]:
        session = self.session
        deadline = self.deadline
        assert session is not None and deadline is not None
        lost = tuple((p, o.token) for p, o in sorted(self.owned.items()))
        self.owned.clear()
        self._acquiring.clear()
        self._attempted.clear()
        self._unconfirmed.clear()
        self._retry_at.clear()
        self._failures.clear()
        self.session = None
        self._confirmed_sent = None
        self._session_write_in_flight = False
        self._written_epoch = None
        self._written_partitions = None
        self.fenced = True
        self.fence_count += 1
        self._bump()
        return [Fence(session=session, partitions=lost, until=deadline)]

    def _bump(self) -> None:
        self.version += 1

    # ---- outcomes reported by the adapter -------------------------------------------

    def begin_shutdown(self) -> None:
        self.shutting_down = True

    def session_started(
        self, session: str, *, sent_at: float, timing: LeaseTiming, now: float
    ) -> None:
        self._starting = False
        if fencing_deadline(sent_at, timing.duration, timing.effective_margin) <= now:
            self._retry_session_at = now  # confirmed too late to be of use: start again
            return
        self.session = session
        self._session_failures = 0
        self._unconfirmed.clear()  # an older session's writes: FREE to this one
        self._confirmed_sent = sent_at
        self._confirmed_timing = timing
        self._next_renew_at = sent_at + timing.renew_interval
        self._written_epoch = None
        self._written_partitions = None
        self.fenced = False
        self._bump()

    def session_start_failed(self, *, now: float) -> None:
        self._starting = False
        self._session_failures += 1
        self._retry_session_at = now + SESSION_BACKOFF.delay(self._session_failures,
                                                             self._draw())

    def _retry_partition(self, partition: int, now: float) -> None:
        failures = self._failures.get(partition, 0) + 1
        self._failures[partition] = failures
        self._retry_at[partition] = now + PARTITION_BACKOFF.delay(failures, self._draw())

    def _partition_done(self, partition: int) -> None:
        self._retry_at.pop(partition, None)
        self._failures.pop(partition, None)

    def renewed(
        self, session: str, *, sent_at: float, timing: LeaseTiming, epoch: int | None, now: float
    ) -> None:
        """A member-Lease write sent at ``sent_at`` succeeded. A confirmation that arrives
        after the current deadline does not rescue the session (see locks.py)."""
        if session != self.session:
            return
        self._session_write_in_flight = False
        if self._expired(now):
            return  # the next step fences
        self._confirmed_sent = sent_at
        self._confirmed_timing = timing
        self._next_renew_at = sent_at + timing.renew_interval
        if epoch != self._written_epoch:
            self._written_epoch = epoch
            self._written_partitions = self._ack_partitions
            self._bump()

    def renew_failed(
        self, session: str, *, now: float, session_lost: bool, retry_in: float
    ) -> None:
        """``session_lost``: the member Lease is gone or carries another session."""
        if session != self.session:
            return
        self._session_write_in_flight = False
        self._next_renew_at = now + retry_in
        if session_lost and self._confirmed_sent is not None:
            self._confirmed_sent = -1e18  # the deadline is now: the next step fences

    def acquired(self, partition: int, session: str, *, token: int, resource_version: str) -> None:
        position = self._acquiring.pop(partition, None)
        self._attempted.pop(partition, None)
        self._unconfirmed.pop(partition, None)
        self._partition_done(partition)
        if session != self.session:
            return  # an old session's write; the new session sees the lock as FREE
        self.owned[partition] = _Owned(token, PartitionState.ACTIVE, resource_version, position)
        self._bump()

    def acquire_failed(self, partition: int, session: str, *, now: float) -> None:
        self._acquiring.pop(partition, None)
        token = self._attempted.pop(partition, None)
        if session == self.session:
            self._retry_partition(partition, now)
            if token is not None:
                self._unconfirmed[partition] = token

    def released(self, partition: int, session: str) -> None:
        o = self.owned.get(partition)
        if session == self.session and o is not None and o.state is PartitionState.RELEASING:
            del self.owned[partition]
            self._partition_done(partition)
            self._bump()

    def release_failed(self, partition: int, session: str, *, now: float, still_ours: bool) -> None:
        o = self.owned.get(partition)
        if session != self.session or o is None:
            return
        o.release_in_flight = False
        if still_ours:
            self._retry_partition(partition, now)  # retried by step
        else:
            self._partition_done(partition)
            del self.owned[partition]
            self._bump()

    def session_ended(self) -> None:
        """The member Lease is deleted: done when shutting down; after a withdrawal the
        member starts a new session once its app takes part again."""
        self.done = self.shutting_down
        self.session = None
        self._ending = False
        self._confirmed_sent = None
        self._session_write_in_flight = False
        self._written_epoch = None
        self._written_partitions = None
        self._bump()
