"""The sidecar's loop: observations in, ``Member.step`` decisions out, outcomes back.

Level-triggered: every watch event, app request and action outcome sets ``dirty``; the
loop then builds a fresh snapshot, steps the core, and waits for the next event or the
core's next deadline (``next_wakeup``), never sleeping on a fixed period. Writes run as
tasks so a slow acquisition never delays a renewal; the core allows one member-Lease
write in flight and ignores results that belong to an older session.

The lock cache never goes back in time (``objects.supersedes``): a replayed watch event,
or a re-list read before our own write and delivered after it, is older than what we
know and is dropped. Where the cache may still be behind our own acquisition, the
executor asks the server before deciding (``_release``). Every request carries a timeout
derived from the lease timing (``member.request_timeout``), so a renewal whose answer is
lost is retried before the fencing deadline. Mirrored step for step by kgroup.sim.sidecar.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from kgroup.api import ConsumerGroupSpec
from kgroup.constants import ANNOTATION_SESSION, member_lease_name, partition_lease_name
from kgroup.core.locks import LeaseTiming, SessionTracker
from kgroup.core.member import (
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
    renew_retry_seconds,
    request_timeout,
)
from kgroup.core.ranges import parse_ranges
from kgroup.core.readiness import Readiness, readiness
from kgroup_sidecar import objects
from kgroup_sidecar.audit import AuditLog
from kgroup_sidecar.kube import KubeAdapter, status_of
from kgroup_sidecar.metrics import Metrics
from kgroup_sidecar.settings import Settings

log = logging.getLogger(__name__)
Obj = dict[str, Any]
MIN_WAIT = 0.02  # floor for a wake-up already due: never spin
WATCHES = frozenset({"group", "member", "partition"})  # each listed once before any step


class Sidecar:
    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self.member = Member(settings.pod_name)
        self.tracker = SessionTracker()
        self.metrics = Metrics()
        self.audit = AuditLog(settings.audit_file, settings.pod_name)
        self.group: Obj | None = None
        self.timing: LeaseTiming | None = None
        self.drain_timeout = 30.0
        self.target: Target | None = None
        self.in_target = False  # this pod is a key of the target assignment (a member)
        self.group_deleted = False
        self.partition_leases: dict[int, Obj] = {}
        self.locks: dict[int, Lock] = {}
        self.my_lease: Obj | None = None
        self.app_releases: dict[int, AppRelease] = {}
        self.release_waiters: dict[tuple[int, int], list[asyncio.Future[bool]]] = {}
        self.synced: set[str] = set()
        self.kube: KubeAdapter | None = None
        self.dirty = asyncio.Event()
        self.changed = asyncio.Event()
        self._published = -1
        self._warned: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._audited_release: set[tuple[str, int, int]] = set()
        self.shutdown_deadline: float | None = None

    # ---- observations ---------------------------------------------------------------

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)

    def on_list(self, kind: str, items: list[Obj], scope: frozenset[int] | None = None) -> None:
        """A (re-)list of one watch. It is authoritative on which objects exist within what
        it covers (the group; every member Lease; the partition Leases of ``scope``, all of
        the group's when None), not on how new each is: a cached lock newer than the listed
        one (our own write's answer) is kept."""
        if kind == "group":
            self._set_group(items[0] if items else None)
        elif kind == "member":
            seen = set()
            for obj in items:
                self._apply_lease("ADDED", obj)
                parsed = objects.parse_member_lease(obj)
                if parsed.value is not None:
                    seen.add(parsed.value.member)
            for gone in set(self.tracker.members()) - seen:
                self.tracker.forget(gone)
        else:
            listed = {lock.partition for lock in (
                objects.parse_partition_lease(obj).value for obj in items
                if objects.is_partition(obj)) if lock is not None}
            covered = set(self.locks) if scope is None else set(self.locks) & scope
            for vanished in covered - listed:
                self.partition_leases.pop(vanished, None)
                self.locks.pop(vanished, None)
            if scope is not None:
                # Locks outside the new scope are no longer watched: a cached copy would
                # only grow stale (they are read again when they come back into scope).
                for unwatched in set(self.locks) - scope:
                    self.partition_leases.pop(unwatched, None)
                    self.locks.pop(unwatched, None)
            for obj in items:
                self._apply_lease("ADDED", obj)
        self.synced.add(kind)
        self.dirty.set()

    def on_event(self, kind: str, event_type: str, obj: Obj) -> None:
        if kind == "group":
            self._set_group(None if event_type == "DELETED" else obj)
        else:
            self._apply_lease(event_type, obj)
        self.dirty.set()

    def _set_group(self, obj: Obj | None) -> None:
        if obj is None:
            self.target = None  # keep the last timing: our own Lease goes with the group
            self.in_target = False
            self.group_deleted = True  # revoke everything (no target alone holds)
            return
        self.group = obj
        self.group_deleted = False
        name = objects.meta(obj).get("name", "?")
        try:
            spec = ConsumerGroupSpec.model_validate(obj.get("spec") or {})
            timing = LeaseTiming(
                duration=spec.lease.duration_seconds,
                renew_interval=spec.lease.renew_interval_seconds,
            )
        except (ValidationError, ValueError) as exc:
            self._warn_once(f"spec:{exc}", f"ConsumerGroup {name}: unusable spec: {exc}")
        else:
            self.timing = timing
            self.drain_timeout = float(spec.handoff.drain_timeout_seconds)
            if self.kube is not None:
                limit = request_timeout(timing)
                self.kube.write_timeout = (min(2.0, limit), limit)
        status = obj.get("status") or {}
        epoch = status.get("epoch")
        if not isinstance(epoch, int):
            self.target = None  # no target: hold what we have until the operator seeds one
            self.in_target = False
            return
        assignment = status.get("assignment") or {}
        ranges = assignment.get(self.settings.pod_name, "")
        try:
            partitions = frozenset(parse_ranges(str(ranges)))
        except ValueError as exc:
            self._warn_once(f"assign:{ranges}", f"ConsumerGroup {name}: bad assignment: {exc}")
            return  # keep the previous target
        self.target = Target(epoch=epoch, partitions=partitions)
        self.in_target = self.settings.pod_name in assignment

    def _apply_lease(self, event_type: str, obj: Obj) -> None:
        name = objects.meta(obj).get("name", "?")
        if objects.is_partition(obj):
            parsed = objects.parse_partition_lease(obj)
            for problem in parsed.problems:
                self._warn_once(f"{name}:{problem}", f"Lease {name}: {problem} (treated as absent)")
            lock = parsed.value
            if lock is None:
                self._warn_once(f"{name}:nolock", f"Lease {name}: not a partition lock")
                return
            cached = self.partition_leases.get(lock.partition)
            if event_type == "DELETED":
                if cached is not None and objects.meta(cached).get("uid") != objects.meta(
                        obj).get("uid") and not objects.supersedes(obj, cached):
                    return  # an old incarnation's deletion, replayed
                self.partition_leases.pop(lock.partition, None)
                self.locks.pop(lock.partition, None)
            elif cached is None or objects.supersedes(obj, cached):
                self.partition_leases[lock.partition] = obj
                self.locks[lock.partition] = lock
            # else: older than what we know (a replayed event, or our own write's answer
            # came first)
        elif objects.is_member(obj):
            parsed = objects.parse_member_lease(obj)
            for problem in parsed.problems:
                self._warn_once(f"{name}:{problem}", f"Lease {name}: {problem} (treated as absent)")
            ml = parsed.value
            if ml is None:
                return
            if event_type == "DELETED" or ml.session is None:
                self.tracker.forget(ml.member)
            else:
                self.tracker.observe(ml.member, ml.session, ml.marker, ml.duration, self.clock())

    # ---- the loop -------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        drain = self.drain_timeout
        if self.shutdown_deadline is not None:
            drain = min(drain, max(0.0, 0.6 * self.settings.termination_grace_seconds))
        return Snapshot(
            now=self.clock(),
            timing=self.timing if self.synced >= WATCHES else None,
            drain_timeout=drain,
            target=self.target,
            locks=dict(self.locks),
            tracker=self.tracker,
            app_releases=dict(self.app_releases),
            group_deleted=self.group_deleted,
        )

    def publish(self) -> None:
        self.metrics.held = len(self.member.owned)
        if self.member.version != self._published:
            self._published = self.member.version
            self.changed.set()
            self.changed = asyncio.Event()

    def readiness(self) -> Readiness:
        """``GET /readyz``: Ready once the whole target is held and its epoch acknowledged
        (``kgroup.core.readiness``)."""
        return readiness(self.member.view(self.clock()), self.target, member=self.in_target,
                         stopping=self.member.shutting_down)

    def begin_shutdown(self) -> None:
        if self.shutdown_deadline is None:
            log.info("SIGTERM: revoking every partition, then ending the session")
            self.shutdown_deadline = self.clock() + self.settings.termination_grace_seconds - 1
            self.member.begin_shutdown()
            self.dirty.set()

    async def run(self, kube: KubeAdapter) -> None:
        self.kube = kube
        kube.start()
        while not self.member.done:
            self.dirty.clear()
            snap = self.snapshot()
            for action in self.member.step(snap):
                self.execute(action)
            kube.set_partition_interest(self.member.partitions_of_interest(self.target))
            self.publish()
            if self.member.done:
                break
            now = self.clock()
            if self.shutdown_deadline is not None and now >= self.shutdown_deadline:
                log.warning("grace period over: exiting with partitions still held")
                break
            wake = self.member.next_wakeup(snap) if snap.timing is not None else None
            if self.shutdown_deadline is not None:
                wake = self.shutdown_deadline if wake is None else min(wake, self.shutdown_deadline)
            timeout = None if wake is None else max(MIN_WAIT, wake - now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.dirty.wait(), timeout)
        kube.stop()
        for task in list(self._tasks):
            task.cancel()

    def execute(self, action: Action) -> None:
        if isinstance(action, Fence):
            self._fenced(action)
        elif isinstance(action, Lost):
            self.metrics.lost += 1
            self.audit.write("lost", session=action.session, partition=action.partition,
                             token=action.token)
            log.error("partition %d (token %d) was taken by another session", action.partition,
                      action.token)
            self._resolve(action.partition, action.token, False)
        elif isinstance(action, Revoke):
            log.info("partition %d revoking (token %d)", action.partition, action.token)
        elif isinstance(action, Adopted):
            self.metrics.acquisitions += 1
            log.info("acquired partition %d (token %d): a write reported failed was applied",
                     action.partition, action.token)
            self.audit.write("acquire", session=action.session, partition=action.partition,
                             token=action.token, position=action.position)
        else:
            self._spawn(self._run_write(action))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_write(self, action: Action) -> None:
        try:
            if isinstance(action, StartSession):
                await self._start_session(action)
            elif isinstance(action, Renew):
                await self._renew(action)
            elif isinstance(action, Acquire):
                await self._acquire(action)
            elif isinstance(action, Release):
                await self._release(action)
            elif isinstance(action, EndSession):
                await self._end_session(action)
        finally:
            self.publish()
            self.dirty.set()

    # ---- action executors -----------------------------------------------------------

    def _fenced(self, action: Fence) -> None:
        self.metrics.fencings += 1
        log.warning("session %s fenced: %d partition(s) lost", action.session,
                    len(action.partitions))
        self.audit.write("fence", session=action.session, until=action.until,
                         partitions=[list(p) for p in action.partitions])
        for p, token in action.partitions:
            self._resolve(p, token, False)
        self.app_releases.clear()

    def _resolve(self, partition: int, token: int, ok: bool) -> None:
        for future in self.release_waiters.pop((partition, token), []):
            if not future.done():
                future.set_result(ok)
        released = self.app_releases.get(partition)
        if released is not None and released.token == token:
            del self.app_releases[partition]

    async def _start_session(self, action: StartSession) -> None:
        assert self.kube is not None and self.group is not None
        session = secrets.token_hex(8)
        name = member_lease_name(self.settings.group, self.settings.pod_name)
        try:
            existing = await self.kube.get_lease(name, session=True)
            body = objects.new_member_lease(
                name=name, namespace=self.settings.namespace, group=self.group,
                member=self.settings.pod_name, session=session,
                duration=action.timing.duration, existing=existing,
            )
            sent = self.clock()
            if existing is None:
                result = await self.kube.create_lease(body)
            else:
                result = await self.kube.replace_lease(body)
        except Exception as exc:
            log.warning("could not start a session: %s", _describe(exc))
            self.member.session_start_failed(now=self.clock())
            return
        self.my_lease = result
        self.member.session_started(session, sent_at=sent, timing=action.timing, now=self.clock())
        if self.member.session == session:
            log.info("session %s started", session)
            self.audit.write("session", session=session)

    async def _renew(self, action: Renew) -> None:
        assert self.kube is not None and self.my_lease is not None
        body = objects.renewed_member_lease(
            self.my_lease, duration=action.timing.duration, epoch=action.epoch
        )
        sent = self.clock()
        try:
            result = await self.kube.replace_lease(body)
        except Exception as exc:
            self.metrics.renew_failures += 1
            status = status_of(exc)
            lost = status == 404
            if status == 409:
                fresh = await self._get_quietly(objects.meta(body)["name"])
                mine = fresh is not None and (
                    objects.annotations_of(fresh).get(ANNOTATION_SESSION) == action.session
                )
                lost = fresh is not None and not mine
                if mine:
                    self.my_lease = fresh
            log.warning("renewal failed: %s%s", _describe(exc), " (session lost)" if lost else "")
            retry = renew_retry_seconds(action.timing)
            self.member.renew_failed(action.session, now=self.clock(), session_lost=lost,
                                     retry_in=0.05 if status == 409 and not lost else retry)
            return
        self.my_lease = result
        self.member.renewed(action.session, sent_at=sent, timing=action.timing,
                            epoch=action.epoch, now=self.clock())

    async def _get_quietly(self, name: str) -> Obj | None:
        assert self.kube is not None
        try:
            return await self.kube.get_lease(name)
        except Exception:
            return None

    async def _acquire(self, action: Acquire) -> None:
        assert self.kube is not None and self.timing is not None
        p = action.partition
        name: str | None = None  # set once the write is about to be sent
        try:
            if action.verify_holder is not None and not await self._holder_expired(action):
                self.member.acquire_failed(p, action.session, now=self.clock())
                return
            last = self.partition_leases.get(p)
            if last is None or objects.meta(last).get("resourceVersion") != action.expected_rv:
                self.member.acquire_failed(p, action.session, now=self.clock())
                return
            name = objects.meta(last)["name"]
            body = objects.acquired_partition_lease(
                last, member=self.settings.pod_name, session=action.session,
                token=action.token, duration=self.timing.duration,
            )
            result = await self.kube.replace_lease(body)
        except Exception as exc:
            log.info("acquisition of partition %d failed: %s", p, _describe(exc))
            reread = None
            if status_of(exc) is None and name is not None:
                # No answer (timeout, broken connection): the write may have happened.
                # Reporting a failure would leave a lock carrying our live session that
                # the core waits on for ever; ask the server instead.
                reread = await self._reread_acquisition(action, name)
            if reread is None:
                self.member.acquire_failed(p, action.session, now=self.clock())
                return
            result = reread
        self._store_partition(result)
        lock = objects.parse_partition_lease(result).value
        token = lock.token if lock is not None else action.token
        self.member.acquired(p, action.session, token=token,
                             resource_version=objects.meta(result)["resourceVersion"])
        if self.member.session == action.session and p in self.member.owned:
            self.metrics.acquisitions += 1
            log.info("acquired partition %d (token %d)", p, token)
            self.audit.write("acquire", session=action.session, partition=p, token=token,
                             position=lock.position if lock else None)

    async def _holder_expired(self, action: Acquire) -> bool:
        """Quorum read of the holder's member Lease before a takeover (locks.py: a watch
        may lag). The read goes through the tracker (a changed marker restarts its clock),
        and the tracker, not a marker comparison, says whether the session is still live:
        a renewal learnt by any path since the decision counts."""
        assert self.kube is not None and action.verify_holder is not None
        holder = action.verify_holder
        fresh = await self.kube.get_lease(member_lease_name(self.settings.group, holder))
        if fresh is None:
            self.tracker.forget(holder)
            return True
        self._apply_lease("MODIFIED", fresh)
        session = action.verify_session
        return session is None or not self.tracker.is_live(holder, session, self.clock())

    async def _reread_acquisition(self, action: Acquire, name: str) -> Obj | None:
        """After an unanswered acquisition: the Lease if it shows our write, else None.
        Retried while the session that wrote it lasts."""
        assert self.kube is not None
        while self.member.session == action.session:
            try:
                fresh = await self.kube.get_lease(name)
            except Exception:
                await asyncio.sleep(0.5)  # retry backoff while the API server is away
                continue
            if fresh is None:
                return None
            self._store_partition(fresh)
            lock = objects.parse_partition_lease(fresh).value
            if lock is not None and (lock.holder, lock.session, lock.token) == (
                self.settings.pod_name, action.session, action.token
            ):
                return fresh
            return None
        return None

    def _store_partition(self, obj: Obj) -> None:
        lock = objects.parse_partition_lease(obj).value
        if lock is None:
            return
        cached = self.partition_leases.get(lock.partition)
        if cached is None or objects.supersedes(obj, cached):
            self.partition_leases[lock.partition] = obj
            self.locks[lock.partition] = lock

    async def _release(self, action: Release) -> None:
        assert self.kube is not None
        p = action.partition
        key = (action.session, p, action.token)
        if key not in self._audited_release:  # ownership ends before the write is sent
            self._audited_release.add(key)
            self.audit.write("release", session=action.session, partition=p,
                             token=action.token, position=action.position, reason=action.reason)
        last = self.partition_leases.get(p)
        lock = objects.parse_partition_lease(last).value if last else None
        if lock is None or lock.token < action.token:
            # The cache is older than our own acquisition (a list read before it, delivered
            # after it): ask the server before deciding the lock is no longer ours.
            try:
                last = await self.kube.get_lease(partition_lease_name(self.settings.group, p))
            except Exception as exc:
                log.info("release of partition %d: re-read failed: %s", p, _describe(exc))
                self.member.release_failed(p, action.session, now=self.clock(), still_ours=True)
                return
            if last is not None:
                self._store_partition(last)
            lock = objects.parse_partition_lease(last).value if last else None
        if lock is None or lock.holder != self.settings.pod_name or lock.session != action.session \
                or lock.token != action.token:
            ours = lock is None  # the Lease vanished (group deleted): nothing to write
            self.member.release_failed(p, action.session, now=self.clock(), still_ours=False)
            self._resolve(p, action.token, ours)
            return
        body = objects.released_partition_lease(last or {}, token=action.token,
                                                position=action.position)
        try:
            result = await self.kube.replace_lease(body)
        except Exception as exc:
            still_ours = True
            if status_of(exc) in (404, 409):
                fresh = await self._get_quietly(objects.meta(body)["name"])
                if fresh is not None:
                    self._store_partition(fresh)
                    now_lock = objects.parse_partition_lease(fresh).value
                    still_ours = now_lock is not None and (
                        now_lock.holder, now_lock.session, now_lock.token
                    ) == (self.settings.pod_name, action.session, action.token)
                else:
                    still_ours = False
            log.info("release of partition %d failed: %s", p, _describe(exc))
            self.member.release_failed(p, action.session, now=self.clock(), still_ours=still_ours)
            if not still_ours:
                self._resolve(p, action.token, False)
            return
        self._store_partition(result)
        self.metrics.releases += 1
        log.info("released partition %d (token %d, position %s)", p, action.token,
                 action.position)
        self.member.released(p, action.session)
        self._resolve(p, action.token, True)

    async def _end_session(self, action: EndSession) -> None:
        assert self.kube is not None
        name = member_lease_name(self.settings.group, self.settings.pod_name)
        try:
            await self.kube.delete_lease(name, session=True)
        except Exception as exc:
            log.warning("could not delete the member Lease: %s", _describe(exc))
        self.audit.write("session-end", session=action.session)
        self.member.session_ended()

    # ---- app requests ---------------------------------------------------------------

    async def app_release(self, partition: int, token: int, position: str | None,
                          timeout: float) -> bool:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.release_waiters.setdefault((partition, token), []).append(future)
        self.app_releases[partition] = AppRelease(token=token, position=position)
        self.dirty.set()
        return await asyncio.wait_for(future, timeout)


def _describe(exc: BaseException) -> str:
    status = status_of(exc)
    if status is not None:
        return f"HTTP {status}"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__} {text}"[:200]

