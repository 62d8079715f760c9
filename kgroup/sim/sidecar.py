"""A simulated sidecar (and the app beside it) around the real ``kgroup.core.member``.

Rule of this module: mirror ``kgroup_sidecar.runtime.Sidecar`` step for step, replacing
only its I/O. Watch events and lists feed the same caches (a partition event with a lower
token than the cached one is dropped, member Leases feed a ``SessionTracker`` on this
process's clock); ``Member.step`` runs on every change and at ``next_wakeup``; each write
action runs as its own request chain (GET then conditional update where the runtime does
so) and reports its outcome exactly as the runtime does, including on timeouts, where
the write may or may not have happened. A divergence from the runtime makes the
simulation prove the wrong thing, so keep the two in step when either changes.

Regressions, each chosen by name in ``SimConfig.regressions`` (none by default), bring
back a bug the simulation found in the runtime and the runtime has fixed since, so the
tests can prove the seeds that found it still catch it (tests/test_simulation.py):
``holder-marker-compare``: the holder re-read compares the fresh marker with the
tracker's current one instead of asking the tracker whether the session is live;
``acquire-timeout-fails``: an acquisition that timed out is reported failed, though it
may have been applied; ``stale-relist``: a re-list replaces newer cached locks, and a
release on a cache older than the member's own acquisition gives the lock up unwritten;
``token-only-cache``: the cache compares tokens only, so a replayed older version with
the same token overwrites it; ``fixed-request-timeout``: requests time out after 0.4 x
the lease duration and a failed renewal is retried after min(1 s, renew / 2), so one
lost renewal answer fences a member with the default 15 s / 5 s lease.

The simulated app polls the view (``Member.view`` on this process's clock, as the client
does), opens the fenced sink with every token it is handed, writes under it while the
partition is in its view, and acknowledges a revocation after a random delay, or never
(the drain timeout then releases it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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
from kgroup.sim.kernel import TIMEOUT, Process
from kgroup.sim.store import (
    GroupObj,
    MemberLeaseObj,
    PartitionLeaseObj,
    Stored,
    WriteError,
)

if TYPE_CHECKING:
    from kgroup.sim.world import World

__all__ = ["REGRESSIONS", "MemberFactory", "SimSidecar"]

REGRESSIONS = frozenset({"acquire-timeout-fails", "fixed-request-timeout",
                         "holder-marker-compare", "stale-relist", "token-only-cache"})
"""Bugs of the runtime's past, brought back by name (see the module docstring)."""

MIN_WAIT = 0.02  # the runtime's floor for a wake-up already due
MemberFactory = Callable[[str], Member]


def _status_of(result: Any) -> int | None:
    return result.status if isinstance(result, WriteError) else None


class SimSidecar:
    """One incarnation of a member pod: its sidecar process and its app."""

    def __init__(self, world: World, proc: Process, *, factory: MemberFactory) -> None:
        self.world = world
        self.proc = proc
        self.pod = proc.name
        self.member = factory(self.pod)
        self.tracker = SessionTracker()
        self.timing: LeaseTiming | None = None
        self.drain_timeout = float(world.spec.handoff.drain_timeout_seconds)
        self.target: Target | None = None
        self.group_deleted = False
        self.partition_objs: dict[int, PartitionLeaseObj] = {}
        self.locks: dict[int, Lock] = {}
        self.my_lease: MemberLeaseObj | None = None
        self.app_releases: dict[int, AppRelease] = {}
        self.synced: set[str] = set()
        self.shutdown_deadline: float | None = None
        self.key = 0  # the world's incarnation number
        self._step_due = False
        self._wake_gen = 0
        self._sessions = 0
        # the app
        self.opened: set[tuple[int, int, str]] = set()
        self.ack_planned: set[tuple[int, int]] = set()
        self.writes = 0
        self._observed_version = -1

    # ---- observations (runtime.on_list / on_event) -----------------------------------

    def on_list(self, stream: str, items: list[tuple[str, Stored]],
                scope: frozenset[int] | None = None) -> None:
        """runtime.on_list: the Lease list carries the member Leases and the partition
        Leases of ``scope`` (all when None); it is authoritative within that scope, and
        cached locks outside it are dropped (no longer watched)."""
        if stream == "group":
            self._set_group(items[0][1] if items else None)
        else:
            if self._regressed("stale-relist"):
                self.partition_objs.clear()
                self.locks.clear()
            listed = {obj.partition for _, obj in items if isinstance(obj, PartitionLeaseObj)}
            covered = set(self.locks) if scope is None else set(self.locks) & scope
            unwatched = set() if scope is None else set(self.locks) - scope
            for vanished in sorted(covered - listed | unwatched):
                self.partition_objs.pop(vanished, None)
                self.locks.pop(vanished, None)
            seen: set[str] = set()
            for key, obj in items:
                self._apply(key, obj)
                if isinstance(obj, MemberLeaseObj):
                    seen.add(obj.member)
            for gone in self.tracker.members():
                if gone not in seen:
                    self.tracker.forget(gone)
        self.synced.add(stream)
        self.poke()

    def on_event(self, stream: str, key: str, obj: Stored | None) -> None:
        if stream == "group":
            self._set_group(obj)
        elif obj is None:
            kind, _, name = key.partition("/")
            if kind == "partition":
                self.partition_objs.pop(int(name), None)
                self.locks.pop(int(name), None)
            else:
                self.tracker.forget(name)
        else:
            self._apply(key, obj)
        self.poke()

    def _regressed(self, name: str) -> bool:
        return name in self.world.cfg.regressions

    def _set_group(self, obj: Stored | None) -> None:
        if not isinstance(obj, GroupObj):
            self.target = None
            self.group_deleted = True
            return
        self.group_deleted = False
        lease = self.world.spec.lease
        self.timing = LeaseTiming(
            duration=lease.duration_seconds, renew_interval=lease.renew_interval_seconds
        )
        epoch = obj.status.get("epoch")
        if not isinstance(epoch, int):
            self.target = None
            return
        ranges = (obj.status.get("assignment") or {}).get(self.pod, "")
        self.target = Target(epoch=epoch, partitions=frozenset(parse_ranges(str(ranges))))

    def _apply(self, key: str, obj: Stored) -> None:
        if isinstance(obj, PartitionLeaseObj):
            self._store_partition(obj)
        elif isinstance(obj, MemberLeaseObj):
            self.tracker.observe(obj.member, obj.session, str(obj.rv), obj.duration,
                                 self.proc.clock())

    def _store_partition(self, obj: PartitionLeaseObj) -> None:
        """runtime._apply_lease / _store_partition with ``objects.supersedes``: never back
        in time (token first, then resourceVersion; one object, no uid to compare)."""
        cached = self.partition_objs.get(obj.partition)
        if cached is None or self._supersedes(obj, cached):
            self.partition_objs[obj.partition] = obj
            self.locks[obj.partition] = _lock(obj)

    def _supersedes(self, new: PartitionLeaseObj, cached: PartitionLeaseObj) -> bool:
        if new.token != cached.token:
            return new.token > cached.token
        return self._regressed("token-only-cache") or new.rv >= cached.rv

    def _request_timeout(self) -> float:
        if self._regressed("fixed-request-timeout"):
            return max(0.5, 0.4 * self.world.spec.lease.duration_seconds)
        lease = self.world.spec.lease
        return request_timeout(LeaseTiming(duration=lease.duration_seconds,
                                           renew_interval=lease.renew_interval_seconds))

    # ---- the loop --------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        drain = self.drain_timeout
        if self.shutdown_deadline is not None:
            drain = min(drain, max(0.0, 0.6 * self.world.cfg.termination_grace))
        return Snapshot(
            now=self.proc.clock(),
            timing=self.timing if self.synced >= {"group", "lease"} else None,
            drain_timeout=drain,
            target=self.target,
            locks=dict(self.locks),
            tracker=self.tracker,
            app_releases=dict(self.app_releases),
            group_deleted=self.group_deleted,
        )

    def poke(self) -> None:
        if not self._step_due:
            self._step_due = True
            self.proc.schedule(self.world.loop_latency(), self.step)

    def begin_shutdown(self) -> None:
        if self.shutdown_deadline is None:
            self.shutdown_deadline = self.proc.clock() + self.world.cfg.termination_grace - 1
            self.member.begin_shutdown()
            self.poke()

    def step(self) -> None:
        self._step_due = False
        if self.member.done:
            self.world.sidecar_exited(self)
            return
        snap = self.snapshot()
        for action in self.member.step(snap):
            self.execute(action)
        self.world.set_scope(self, self.member.partitions_of_interest(self.target))
        self.app_observe()
        if self.member.done:
            self.world.sidecar_exited(self)
            return
        now = self.proc.clock()
        if self.shutdown_deadline is not None and now >= self.shutdown_deadline:
            self.world.sidecar_exited(self)  # grace over: exit with partitions held
            return
        wake = self.member.next_wakeup(snap) if snap.timing is not None else None
        if self.shutdown_deadline is not None:
            wake = self.shutdown_deadline if wake is None else min(wake, self.shutdown_deadline)
        if wake is not None:
            self._wake_gen += 1
            self.proc.schedule(max(MIN_WAIT, wake - now) / self.proc.rate, self._wake,
                               self._wake_gen)

    def _wake(self, gen: int) -> None:
        if gen == self._wake_gen:
            self.poke()

    def _done(self) -> None:
        """After any outcome: the runtime's ``finally: publish(); dirty.set()``."""
        self.app_observe()
        self.poke()

    def execute(self, action: Action) -> None:
        self.world.trace(self.pod, action)
        if isinstance(action, Fence):
            self.world.count("fence")
            for p, token in action.partitions:
                self._resolve(p, token)
            self.app_releases.clear()
        elif isinstance(action, Lost):
            self.world.count("lost")
            self._resolve(action.partition, action.token)
        elif isinstance(action, Revoke | Adopted):
            pass
        elif isinstance(action, StartSession):
            self._start_session(action)
        elif isinstance(action, Renew):
            self._renew(action)
        elif isinstance(action, Acquire):
            self._acquire(action)
        elif isinstance(action, Release):
            self._release(action)
        elif isinstance(action, EndSession):
            self._end_session(action)

    def _resolve(self, partition: int, token: int) -> None:
        released = self.app_releases.get(partition)
        if released is not None and released.token == token:
            del self.app_releases[partition]

    def _rpc(self, request: Callable[[], Any], done: Callable[[Any], None]) -> None:
        self.world.request(self.proc, request, done, timeout=self._request_timeout())

    # ---- action executors (runtime._start_session, _renew, ...) ----------------------

    def _start_session(self, action: StartSession) -> None:
        self._sessions += 1
        session = f"{self.pod}.{self.world.new_id()}"
        key = f"member/{self.pod}"
        store = self.world.store

        def got(existing: Any) -> None:
            if existing is TIMEOUT or isinstance(existing, Exception):
                self.member.session_start_failed(now=self.proc.clock())
                self._done()
                return
            body = MemberLeaseObj(0, self.pod, session, float(action.timing.duration), None)
            sent = self.proc.clock()

            def written(result: Any) -> None:
                if not isinstance(result, MemberLeaseObj):
                    self.member.session_start_failed(now=self.proc.clock())
                else:
                    self.my_lease = result
                    self.member.session_started(session, sent_at=sent, timing=action.timing,
                                                now=self.proc.clock())
                self._done()

            if existing is None:
                self._rpc(lambda: store.create(key, body), written)
            else:
                rv = existing.rv
                self._rpc(lambda: store.update(key, body, expected_rv=rv), written)

        self._rpc(lambda: store.get(key), got)

    def _renew(self, action: Renew) -> None:
        assert self.my_lease is not None
        key = f"member/{self.pod}"
        store = self.world.store
        body = dataclasses.replace(self.my_lease, duration=float(action.timing.duration),
                                   epoch=action.epoch)
        rv = self.my_lease.rv
        sent = self.proc.clock()
        retry = renew_retry_seconds(action.timing)
        if self._regressed("fixed-request-timeout"):
            retry = min(1.0, action.timing.renew_interval / 2)

        def written(result: Any) -> None:
            if isinstance(result, MemberLeaseObj):
                self.my_lease = result
                self.member.renewed(action.session, sent_at=sent, timing=action.timing,
                                    epoch=action.epoch, now=self.proc.clock())
                self._done()
                return
            status = _status_of(result)
            if status == 409:
                def fresh(obj: Any) -> None:
                    got = obj if isinstance(obj, MemberLeaseObj) else None
                    mine = got is not None and got.session == action.session
                    if mine:
                        self.my_lease = got
                    self.member.renew_failed(action.session, now=self.proc.clock(),
                                             session_lost=got is not None and not mine,
                                             retry_in=0.05 if mine or got is None else retry)
                    self._done()

                self._rpc(lambda: store.get(key), fresh)
                return
            self.member.renew_failed(action.session, now=self.proc.clock(),
                                     session_lost=status == 404, retry_in=retry)
            self._done()

        self._rpc(lambda: store.update(key, body, expected_rv=rv), written)

    def _acquire(self, action: Acquire) -> None:
        p = action.partition
        store = self.world.store
        key = f"partition/{p}"

        def failed() -> None:
            self.member.acquire_failed(p, action.session, now=self.proc.clock())
            self._done()

        def write() -> None:
            last = self.partition_objs.get(p)
            if last is None or str(last.rv) != action.expected_rv:
                failed()
                return
            body = dataclasses.replace(last, holder=self.pod, session=action.session,
                                       token=action.token)
            rv = last.rv

            def succeeded(result: PartitionLeaseObj) -> None:
                self._store_partition(result)
                self.member.acquired(p, action.session, token=result.token,
                                     resource_version=str(result.rv))
                self._done()

            def reread(result: Any) -> None:
                # runtime._reread_acquisition: a timeout says nothing about whether the
                # write happened; ask the server (again, while the session lasts)
                if result is TIMEOUT or isinstance(result, Exception):
                    if self.member.session == action.session:
                        self.proc.schedule(0.5, self._rpc, lambda: store.get(key), reread)
                        return
                elif isinstance(result, PartitionLeaseObj):
                    if (result.holder, result.session, result.token) == (
                        self.pod, action.session, action.token
                    ):
                        succeeded(result)
                        return
                    self._store_partition(result)
                failed()

            def written(result: Any) -> None:
                if isinstance(result, PartitionLeaseObj):
                    succeeded(result)
                elif result is TIMEOUT and not self._regressed("acquire-timeout-fails"):
                    self._rpc(lambda: store.get(key), reread)
                else:
                    failed()

            self._rpc(lambda: store.update(key, body, expected_rv=rv), written)

        holder = action.verify_holder
        if holder is None:
            write()
            return

        def verified(fresh: Any) -> None:
            if fresh is TIMEOUT or isinstance(fresh, Exception):
                failed()
                return
            if not self._regressed("holder-marker-compare"):
                # runtime._holder_expired: feed the fresh read to the tracker, then ask it
                # whether the session is live; a renewal seen by any path since the
                # decision resets it
                if isinstance(fresh, MemberLeaseObj):
                    self._apply(f"member/{holder}", fresh)
                    if action.verify_session is not None and self.tracker.is_live(
                        holder, action.verify_session, self.proc.clock()
                    ):
                        failed()
                        return
                else:
                    self.tracker.forget(holder)
                write()
                return
            # the old bug: compare with the tracker's *current* marker, which a concurrent
            # verification or a watch event may have moved on already
            if (
                isinstance(fresh, MemberLeaseObj)
                and fresh.session == action.verify_session
                and str(fresh.rv) != self.tracker.marker_of(holder)
            ):
                self._apply(f"member/{holder}", fresh)
                failed()
                return
            write()

        self._rpc(lambda: store.get(f"member/{holder}"), verified)

    def _release(self, action: Release) -> None:
        p = action.partition
        last = self.partition_objs.get(p)
        if (
            not self._regressed("stale-relist")
            and (last is None or last.token < action.token)
        ):
            # runtime._release: the cache is older than our own acquisition (a re-list read
            # before it, delivered after it): re-read instead of giving the lock up unwritten
            def fresh(obj: Any) -> None:
                if obj is TIMEOUT or isinstance(obj, Exception):
                    # unknown: retry later, the lock may well be ours
                    self.member.release_failed(p, action.session, now=self.proc.clock(),
                                               still_ours=True)
                    self._done()
                    return
                if isinstance(obj, PartitionLeaseObj):
                    self._store_partition(obj)
                    self._release_with(action, obj)
                else:
                    self._release_with(action, None)  # gone: nothing to write

            self._rpc(lambda: self.world.store.get(f"partition/{p}"), fresh)
            return
        self._release_with(action, last)

    def _release_with(self, action: Release, last: PartitionLeaseObj | None) -> None:
        p = action.partition
        store = self.world.store
        key = f"partition/{p}"
        if (
            last is None
            or last.holder != self.pod
            or last.session != action.session
            or last.token != action.token
        ):
            self.member.release_failed(p, action.session, now=self.proc.clock(), still_ours=False)
            self._resolve(p, action.token)
            self._done()
            return
        body = dataclasses.replace(last, holder=None, session=None)
        if action.position is not None:
            body = dataclasses.replace(body, position=action.position,
                                       position_token=action.token)
        rv = last.rv

        def written(result: Any) -> None:
            if isinstance(result, PartitionLeaseObj):
                self._store_partition(result)
                self.member.released(p, action.session)
                self._resolve(p, action.token)
                self._done()
                return
            if _status_of(result) in (404, 409):
                def fresh(obj: Any) -> None:
                    still = False
                    if isinstance(obj, PartitionLeaseObj):
                        self._store_partition(obj)
                        still = (obj.holder, obj.session, obj.token) == (
                            self.pod, action.session, action.token)
                    elif obj is TIMEOUT or isinstance(obj, Exception):
                        still = False  # the runtime's _get_quietly: None
                    self.member.release_failed(p, action.session, now=self.proc.clock(),
                                               still_ours=still)
                    if not still:
                        self._resolve(p, action.token)
                    self._done()

                self._rpc(lambda: store.get(key), fresh)
                return
            self.member.release_failed(p, action.session, now=self.proc.clock(),
                                       still_ours=True)
            self._done()

        self._rpc(lambda: store.update(key, body, expected_rv=rv), written)

    def _end_session(self, action: EndSession) -> None:
        key = f"member/{self.pod}"
        store = self.world.store

        def deleted(_: Any) -> None:
            self.member.session_ended()
            self._done()

        self._rpc(lambda: store.delete(key), deleted)

    # ---- the app ---------------------------------------------------------------------

    def app_observe(self) -> None:
        """The app reads the view: open the sink for new tokens, plan acknowledgements."""
        if self.member.version == self._observed_version:
            return  # the view can only have shrunk (deadline) since the last look
        self._observed_version = self.member.version
        view = self.member.view(self.proc.clock())
        for pv in view.partitions:
            key = (pv.partition, pv.token, view.session or "")
            if key not in self.opened:
                self.opened.add(key)
                self.world.sink_open(f"{self.pod}/{view.session}", pv.partition, pv.token)
            if pv.state == "revoking" and (pv.partition, pv.token) not in self.ack_planned:
                self.ack_planned.add((pv.partition, pv.token))
                delay = self.world.ack_delay()
                if delay is not None:
                    self.proc.schedule(delay, self._app_ack, pv.partition, pv.token)

    def _app_ack(self, partition: int, token: int) -> None:
        if self.member.check_release(partition, token, self.proc.clock()) is not None:
            return
        self.writes += 1
        self.app_releases[partition] = AppRelease(token=token,
                                                  position=f"{partition}@{token}.{self.writes}")
        self.poke()

    def app_write_all(self) -> None:
        """Start a write under the token of every partition in the view."""
        view = self.member.view(self.proc.clock())
        for pv in view.partitions:
            self.writes += 1
            self.proc.schedule(self.world.write_latency(), self.world.sink_write,
                               f"{self.pod}/{view.session}", pv.partition, pv.token)

    def app_tick(self) -> None:
        """Periodic work: write under the token of one partition in the view."""
        view = self.member.view(self.proc.clock())
        if view.partitions:
            pv = view.partitions[self.world.kernel.rng.randrange(len(view.partitions))]
            self.writes += 1
            self.proc.schedule(self.world.write_latency(), self.world.sink_write,
                               f"{self.pod}/{view.session}", pv.partition, pv.token)
        self.proc.schedule(self.world.cfg.app_tick, self.app_tick)


def _lock(obj: PartitionLeaseObj) -> Lock:
    return Lock(obj.partition, obj.holder, obj.session, obj.token, str(obj.rv), obj.position,
                obj.position_token)
