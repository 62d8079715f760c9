"""One simulated run: the store, the operator, the members, the faults, the verdict
(the faults themselves: :mod:`kgroup_sim.faults` and :mod:`kgroup_sim.hand_edits`).

Rules of this module:

* A run is a pure function of ``(seed, SimConfig)``: same inputs, same trace, same
  verdict. Nothing reads the real clock; nothing iterates a set of strings unsorted.
* Faults are injected only during ``[0, fault_time)`` (a crash's return, if due later, is
  moved to ``fault_time``); after that the network is clean, so the group must converge
  within :meth:`World.bound` and then stay quiet (no epoch bump, no lock change).
* Reshapes (``SimConfig.reshape``): the admin's spec changes, the producer's seals and
  when each reshape ended are kept by :mod:`kgroup_sim.reshapes`.
* A load (``SimConfig.load``, ``SimConfig.oscillation``): the convergence phase starts at
  its last shift if that comes after the faults, and the window in which rebalances must
  have stopped follows it (:mod:`kgroup_sim.oscillation`).
* Watches: each observer's streams of the store's changes, with their faults and
  re-lists, are kept by :mod:`kgroup_sim.watches`.

Over 600 lines, and one job: the run's wiring (store commits fed to the checker and the
watches, members started and stopped, the verdict at the end); what had a job of its own
(reshapes, the load window, watches, faults, hand edits) lives in its own module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kgroup.constants import API_GROUP, API_VERSION, KIND, member_lease_name, partition_lease_name
from kgroup.core import lease_codec as codec
from kgroup.core.layout_status import layout_from_status
from kgroup.core.member.reconcile import Lock, Member
from kgroup.core.objects import Obj
from kgroup.core.operator.decide import ExpiryRule
from kgroup.core.operator.load_window import LOAD_WINDOW_REPORTS
from kgroup.core.operator.pod_identity import PodIdentities
from kgroup.core.operator.reshape import Layout
from kgroup.core.ranges import parse_ranges
from kgroup.crd_models import BalanceSettings, ConsumerGroupSpec
from kgroup_sim import faults, oscillation
from kgroup_sim.checks import Checker, OscillationCheck, Violation
from kgroup_sim.control import GROUP_KEY, SimOperator
from kgroup_sim.faults import FAULT_KINDS, Fault
from kgroup_sim.hand_edits import HAND_EDIT_KINDS
from kgroup_sim.kernel import Kernel, Process
from kgroup_sim.load import LoadFeed, ZipfLoad
from kgroup_sim.reshapes import Reshapes
from kgroup_sim.sidecar import GROUP, NAMESPACE, MemberFactory, SimSidecar
from kgroup_sim.store import Store, lease_key, streams_of
from kgroup_sim.variants import REGRESSIONS, logic_with
from kgroup_sim.watches import Event, Watches

__all__ = ["FAULT_KINDS", "HAND_EDIT_KINDS", "REGRESSIONS", "Fault", "Result", "SimConfig", "World",
           "run_seed"]


APP_CHECK_EVERY = 0.5
"""Seconds between two checks of the apps' part (World._check_apps)."""


@dataclass(frozen=True)
class SimConfig:
    members: int = 5
    partitions: int = 32
    fault_time: float = 60.0
    fault_rate: float = 0.12  # random process faults per second during the fault phase
    kinds: tuple[str, ...] = FAULT_KINDS
    script: tuple[Fault, ...] = ()
    event_loss: float = 0.03
    event_replay: float = 0.02
    message_loss: float = 0.02
    slow: float = 0.03
    ack_never: float = 0.15
    app_tick: float = 0.7
    termination_grace: float = 30.0
    relist: tuple[float, float] = (5.0, 10.0)
    quiet_time: float = 20.0
    spec: ConsumerGroupSpec | None = None  # None: drawn from the seed
    member_factory: MemberFactory = Member
    # old bugs of the sidecar's decisions brought back (kgroup_sim.variants.REGRESSIONS)
    regressions: frozenset[str] = frozenset()
    # the operator's failure detector (kgroup.core.operator.decide.ExpiryRule, or a broken
    # variant of it from kgroup_sim.variants)
    expiry_rule: Callable[[], ExpiryRule] = ExpiryRule
    # the store refuses a takeover without the operator's expiry mark, as the chart's
    # admission policy does; False: only the sidecar's own rule keeps it from happening
    expiry_admission: bool = True
    # Sidecars watch only the partition Leases of their interest (the runtime's scoped
    # partition watch); False: every Lease of the group, as the runtime does beyond
    # MAX_SELECTED_PARTITIONS (and as every sidecar did when the pinned seeds were found).
    scoped_watch: bool = True
    # "": members' pods are bare (no controller); else pods of a Deployment at this
    # revision (ownerReferences + pod-template-hash), as a rollout needs.
    revision: str = ""
    # members' pods are a StatefulSet's (StatefulSet/worker; ``revision`` is then unused)
    statefulset: bool = False
    # which pod (uid) each member's marks are for (kgroup.core.operator.pod_identity, or a broken
    # variant from kgroup_sim.variants)
    identities: Callable[[], PodIdentities] = PodIdentities
    # the store refuses an acquisition by a pod whose uid is not the mark's, as the chart's
    # admission policy does with the pod-bound token's pod-uid; False: not checked
    uid_admission: bool = True
    # the store refuses a holder's write (release, position) from a pod whose uid is not the
    # lock's kgroup.dev/holder-uid, as the chart's admission policy does; False: not checked
    holder_admission: bool = True
    # The app's part (kgroup.core.member.app_presence): the sidecars' app timeout (0: no
    # app gate, as when the pinned seeds were found), each app's start-up delay drawn from
    # ``app_start``, and the chance per incarnation that its app falls silent (hung) for a
    # while or goes blind (keeps polling, processes and reports nothing: the old listen).
    app_timeout: float = 0.0
    app_start: tuple[float, float] = (0.0, 0.0)
    app_silence: float = 0.0
    app_blind: float = 0.0
    # the sidecar judges an app that reports by its reports (a partition it stopped
    # reporting on is stalled); False: the broken variant a blind app is caught with
    report_silence: bool = True
    # the apps' load reports (kgroup_sim.load): one feed for every seed, or a ZipfLoad
    # drawing each seed's own; None: no reports
    load: LoadFeed | ZipfLoad | None = None
    # spec.balance for the run, over the given or drawn spec (mode load: the load-aware
    # planner; kgroup_sim.variants.BALANCES); None: the spec's own
    balance: BalanceSettings | None = None
    # how many of each member's latest load reports the operator averages
    # (GroupLeases.load_window_reports; kgroup_sim.variants.LOAD_WINDOWS)
    load_window: int = LOAD_WINDOW_REPORTS
    # after the faults and the load's last shift, the window in which load rebalances
    # must stop (kgroup_sim.checks.OscillationCheck); None: not checked, the run ends
    # once converged and quiet
    oscillation: OscillationCheck | None = None
    # Reshapes: the sizes spec.partitions is changed to, in order, each at a time drawn
    # from the seed within ``reshape_window`` (fractions of the fault phase); the policy
    # is the spec's (Generations by default). () : no reshape.
    reshape: tuple[int, ...] = ()
    reshape_window: tuple[float, float] = (0.1, 0.8)
    # The apps read a sealed partition to its seal in a backlog drawn per partition from
    # this range (simulated seconds; empty with probability ``seal_empty``) and release it
    # completed. None: apps never reach a seal (as before reshapes were simulated).
    seal_drain: tuple[float, float] | None = None
    seal_empty: float = 0.25
    # the class of the operator's layouts (kgroup.core.operator.reshape.Layout, or a
    # broken variant from kgroup_sim.variants): which partitions may be assigned
    layout: type[Layout] = Layout
    verbose: bool = False


@dataclass
class Result:
    seed: int
    violations: list[Violation]
    faults: dict[str, int]
    converged_after: float | None
    sim_time: float
    events: int
    store_writes: int
    bound: float
    spec: str
    sink_accepted: int = 0
    sink_refused: int = 0  # stale-token writes the fenced sink refused
    trace: list[str] = field(default_factory=list)
    # the target's changes after the faults (and the load's last shift, if later):
    # partitions moved and targets that moved any (SimConfig.load runs; 0 otherwise)
    moves: int = 0
    rebalances: int = 0
    last_move_after: float | None = None  # simulated s from the same start to the last
    # partitions moved in the oscillation window (None: SimConfig.oscillation unset)
    window_moves: int | None = None
    # of those, late settling (OscillationCheck.late_above; None: unset or not checked)
    late_moves: int | None = None
    # the final target's busiest member over the mean, on the true (noise-free) rates,
    # and the best any assignment could do (load_bound); None: no load
    busiest: float | None = None
    load_bound: float | None = None
    # reshapes: each spec change's time and how long until the layout settled after it
    # (None: not settled), partitions completed, acquisitions of successors
    reshapes: list[tuple[float, float | None]] = field(default_factory=list)
    completed: int = 0
    successor_acquisitions: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations


def draw_spec(rng: Any, cfg: SimConfig) -> ConsumerGroupSpec:
    duration, renew = rng.choice([(6, 2), (10, 3), (15, 5)])
    return ConsumerGroupSpec.model_validate({
        "partitions": cfg.partitions,
        "selector": {"matchLabels": {"app": "sim"}},
        "assignor": rng.choice(["sticky", "sticky", "sticky", "range"]),
        "stabilizationWindowSeconds": rng.choice([0, 1, 3]),
        "stabilizationMaxDelaySeconds": rng.choice([5, 10]),
        "lease": {"durationSeconds": duration, "renewIntervalSeconds": renew},
        "handoff": {"drainTimeoutSeconds": rng.choice([0, 2, 5, 8])},
        "restartGraceSeconds": rng.choice([0, 0, 8]),
    })


class World:
    def __init__(self, seed: int, cfg: SimConfig) -> None:
        self.seed = seed
        self.cfg = cfg
        self.kernel = Kernel(seed)
        self.rng = self.kernel.rng
        self.spec = cfg.spec or draw_spec(self.rng, cfg)
        if cfg.balance is not None:
            self.spec = self.spec.model_copy(update={"balance": cfg.balance})
        # this run's load reports (a ZipfLoad draws them from the seed)
        self.load_feed: LoadFeed | None = (None if cfg.load is None
                                           else cfg.load.for_seed(seed, cfg.partitions))
        self.checker = Checker()
        self.store = Store(self._committed, expiry_admission=cfg.expiry_admission,
                           holder_admission=cfg.holder_admission)
        self.watches = Watches(self)
        self.sidecars: dict[str, SimSidecar] = {}
        self.incarnations = 0
        self.ids = 0
        self.names = 0
        self.faults: dict[str, int] = {}
        self.lines: list[str] = []
        self._claim_sig: dict[int, tuple[Any, ...]] = {}
        # incarnation -> (partition, token) -> when the app check first saw it held
        self._held_first: dict[int, dict[tuple[int, int], float]] = {}
        self._by_proc: dict[int, SimSidecar] = {}
        self.epochs: list[tuple[float, Any, dict[str, str]]] = []  # (time, epoch, target)
        self.operator: SimOperator | None = None
        self.operator_proc: Process | None = None
        self.logic = logic_with(cfg.regressions)
        self.revisions: dict[str, str] = {}  # member name -> its pod's revision
        self.bare: set[str] = set()  # names whose pod is bare whatever the config says
        # the impostor (a bare pod under a departed StatefulSet pod's name) and until when
        # (true time) the restart grace keeps the name for the StatefulSet's pod
        self.impostor: tuple[SimSidecar, float] | None = None
        self.reshapes = Reshapes(self)  # SimConfig.reshape's spec changes and seals

    # ---- services for the simulated processes ---------------------------------------

    @property
    def faulty(self) -> bool:
        return self.kernel.now < self.cfg.fault_time

    def count(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    def new_id(self) -> str:
        self.ids += 1
        return f"s{self.ids}"

    def loop_latency(self) -> float:
        return self.rng.uniform(0.0005, 0.005)

    def message_latency(self) -> float:
        if self.faulty and self.rng.random() < self.cfg.slow:
            self.count("slow-message")
            return self.rng.uniform(0.2, 1.5)
        return self.rng.uniform(0.001, 0.03)

    def _drop(self) -> bool:
        if self.faulty and self.rng.random() < self.cfg.message_loss:
            self.count("lost-request-or-answer")
            return True
        return False

    def request(self, proc: Process, request: Callable[[], Any],
                done: Callable[[Any], None], *, timeout: float | None = None) -> None:
        """A request to the store; ``timeout`` None: the operator's (0.4 x the lease)."""
        if timeout is None:
            timeout = max(0.5, 0.4 * self.spec.lease.duration_seconds)
        proc.rpc(request, done, latency=self.message_latency, timeout=timeout, drop=self._drop)

    def write_latency(self) -> float:
        return self.rng.uniform(0.01, 0.3)

    def ack_delay(self) -> float | None:
        if self.rng.random() < self.cfg.ack_never:
            return None
        return self.rng.uniform(0.0, 1.2 * self.spec.handoff.drain_timeout_seconds + 0.2)

    def sink_open(self, owner: str, partition: int, token: int) -> None:
        self.checker.step = self.kernel.events
        self.checker.sink_open(owner, partition, token, self.kernel.now)

    def sink_write(self, owner: str, partition: int, token: int) -> None:
        self.checker.step = self.kernel.events
        self.trace(owner, f"app write p{partition} token {token}")
        self.checker.sink_write(owner, partition, token, self.kernel.now)

    def trace(self, who: str, what: Any) -> None:
        if self.cfg.verbose:
            self.lines.append(f"{self.kernel.now:10.4f} {who}: {what}")

    # ---- the store's commits: checks, then the watches -------------------------------

    def _committed(self, key: str, old: Obj | None, new: Obj | None) -> None:
        self.checker.step = self.kernel.events
        obj = new if new is not None else old
        assert obj is not None
        streams = streams_of(key, obj)
        if "partition" in streams and new is not None:
            lock = codec.parse_partition_lease(new).value
            was = codec.parse_partition_lease(old).value if old is not None else None
            if lock is not None and lock.holder is not None and (
                was is None or (was.holder, was.session) != (lock.holder, lock.session)
            ):
                self.checker.store_acquired(lock.partition, was.token if was else -1,
                                            lock.token, lock.holder, self.kernel.now)
                self.checker.acquired_in_order(lock.partition, lock.holder, self.kernel.now)
                if self.impostor is not None and self.kernel.now < self.impostor[1] \
                        and lock.session == self.impostor[0].member.session:
                    self.checker.fail("impostor", self.kernel.now, (
                        f"partition {lock.partition} taken by {lock.holder}/{lock.session}, a "
                        f"bare pod under a departed StatefulSet pod's name, within the "
                        f"restart grace (until {self.impostor[1]:.3f})"))
                if not self._session_exists(lock.holder, lock.session):
                    # acquired under a session whose member Lease was deleted (by hand or
                    # by the garbage collector) before the holder saw it: others may take
                    # the lock at once; the token alone fences the holder's writes
                    self.checker.revoke(lock.partition, lock.token,
                                        f"{lock.holder}/{lock.session}")
        if "partition" in streams and new is not None and codec.completed_token(new) is not None:
            lock = codec.parse_partition_lease(new).value
            if lock is not None:
                self.checker.completion_seen(lock.partition, self.kernel.now)
        if "group" in streams and new is not None:
            self.reshapes.layout_committed((new.get("status") or {}).get("layout"))
            epoch = (new.get("status") or {}).get("epoch")
            if old is None or epoch != (old.get("status") or {}).get("epoch"):
                self.epochs.append((self.kernel.now, epoch,
                                    dict((new.get("status") or {}).get("assignment") or {})))
        if self.cfg.verbose:
            self.trace("store", f"{key} = {new}")
        event: Event = ("ADDED" if old is None else "DELETED" if new is None else "MODIFIED",
                        obj)
        self.watches.fan_out(streams, event)

    # ---- processes -------------------------------------------------------------------

    def _process(self, name: str) -> Process:
        return Process(self.kernel, name, offset=self.rng.uniform(0, 1e4),
                       rate=self.rng.uniform(0.99, 1.01))

    def start_operator(self) -> None:
        if self.operator_proc is not None and self.operator_proc.alive:
            return  # one active operator (leader election): a second restart's start
        self.operator_proc = proc = self._process("operator")
        self.operator = SimOperator(self, proc)
        self.watches.watch(proc, self.operator, ("group", "lease", "pod"))

    def start_member(self, name: str | None = None, revision: str | None = None
                     ) -> SimSidecar:
        if name is None:
            self.names += 1
            name = f"m{self.names:02d}"
        self.revisions.setdefault(name, self.cfg.revision if revision is None else revision)
        proc = self._process(name)
        self.incarnations += 1
        sc = SimSidecar(self, proc, logic=self.logic, factory=self.cfg.member_factory)
        sc.key = self.incarnations
        self._by_proc[id(proc)] = sc
        self.sidecars[name] = sc
        self.put_pod(name, ready=True)
        pod = self.store.get(f"pods/{name}")
        assert pod is not None
        sc.uid = sc.member.uid = pod["metadata"]["uid"]  # the downward API's KGROUP_POD_UID
        self.watches.watch(proc, sc, ("group", "partition"), scoped=self.cfg.scoped_watch)
        proc.schedule(self.rng.uniform(0, self.cfg.app_tick), sc.app_tick)
        if self.cfg.app_timeout > 0:
            self._app_faults(sc)
        return sc

    def _app_faults(self, sc: SimSidecar) -> None:
        """The app of a new incarnation: its start-up delay, and whether (and when) it
        falls silent or goes blind during the fault phase."""
        cfg, proc = self.cfg, sc.proc
        proc.schedule(self.rng.uniform(*cfg.app_start), sc.app_start)
        horizon = max(0.0, cfg.fault_time - self.kernel.now)
        if self.rng.random() < cfg.app_silence and horizon > 0:
            silence = self.rng.uniform(cfg.app_timeout, 2 * cfg.app_timeout + 10)
            proc.schedule(self.rng.uniform(0, horizon), sc.app_fall_silent, silence)
        if self.rng.random() < cfg.app_blind and horizon > 0:
            proc.schedule(self.rng.uniform(0, horizon), sc.app_go_blind)

    def put_pod(self, name: str, *, ready: bool, terminating: bool = False) -> None:
        key = f"pods/{name}"
        meta: Obj = {"name": name, "namespace": NAMESPACE,
                     "labels": dict(self.spec.selector.match_labels)}
        if name in self.bare:
            pass
        elif self.cfg.statefulset:
            meta["ownerReferences"] = [{"kind": "StatefulSet", "name": "worker",
                                        "controller": True}]
        elif rev := self.revisions.get(name):
            meta["labels"]["pod-template-hash"] = rev
            meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": f"worker-{rev}",
                                        "controller": True}]
        if terminating:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
               "status": {"phase": "Running", "conditions": [
                   {"type": "Ready", "status": "True" if ready else "False"}]}}
        if self.store.get(key) is None:
            self.store.create(key, pod)
        else:
            self.store.update(key, pod)

    def delete_pod(self, name: str) -> None:
        if self.store.get(f"pods/{name}") is not None:
            self.store.delete(f"pods/{name}")

    def sidecar_exited(self, sc: SimSidecar) -> None:
        self.gone(sc)
        if self.sidecars.get(sc.pod) is sc:
            del self.sidecars[sc.pod]
            self.delete_pod(sc.pod)

    def live_names(self) -> list[str]:
        return sorted(n for n, sc in self.sidecars.items()
                      if sc.proc.alive and sc.logic.shutdown_deadline is None)

    # ---- faults ----------------------------------------------------------------------

    def inject(self, fault: Fault) -> None:
        """Make ``fault`` happen now (:mod:`kgroup_sim.faults`)."""
        faults.inject(self, fault)

    def _session_exists(self, member: str, session: str | None) -> bool:
        obj = self.store.get(lease_key(member_lease_name(GROUP, member)))
        parsed = codec.parse_member_lease(obj).value if obj is not None else None
        return parsed is not None and parsed.session == session

    def restart(self, name: str | None) -> None:
        if name is not None and name in self.sidecars:
            return
        self.start_member(name)

    # ---- checks ----------------------------------------------------------------------

    def after_event(self) -> None:
        """Re-read the view of every sidecar that ran code in this event."""
        now = self.kernel.now
        self.checker.step = self.kernel.events
        for proc in self.kernel.touched:
            sc = self._by_proc.get(id(proc))
            if sc is None or not proc.alive:
                continue
            m = sc.member
            # the view kept while the version stands must be the one built afresh
            kept = m.view(proc.clock())
            m._view_parts = None
            assert kept == m.view(proc.clock()), f"{sc.pod}: a kept view is stale"
            sig = (m.version, m.deadline, m.fenced, m.session)
            if self._claim_sig.get(sc.key) == sig:
                continue
            self._claim_sig[sc.key] = sig
            view = m.view(proc.clock())
            tokens = {p.partition: p.token for p in view.partitions}
            # the health book's shortcut must list what the view lists, in every state
            held = m.held_tokens(proc.clock())
            assert held == tokens, f"{sc.pod}: held_tokens {held} != view {tokens}"
            deadline = m.deadline
            until = proc.to_true(deadline) if deadline is not None else now
            if self.cfg.verbose:
                self.trace(sc.pod, f"app view {view.session}: {tokens} until {until:.3f}")
            self.checker.update_claim(str(sc.key), f"{sc.pod}/{view.session}", tokens, until,
                                      now)

    def _check_apps(self) -> None:
        """Owned means consumed (:mod:`kgroup.core.member.app_presence`), checked every
        :data:`APP_CHECK_EVERY` seconds on each live sidecar, on its own clock:

        * **app-join**: no partition is held before the app asked for its assignment;
        * **silent-owner**: an app silent for its timeout plus the drain timeout (and two
          renew intervals of slack) holds nothing any more: its member left;
        * **silent-stall**: a held partition the app has not processed for its timeout
          plus a renew interval (and slack) is shown stalled in the health summary the
          sidecar's next renewal carries (its reports, and what it sees itself)."""
        cfg, s = self.cfg, self.spec
        slack = 2 * s.lease.renew_interval_seconds + 1.0
        for sc in list(self.sidecars.values()):
            if not sc.proc.alive or sc.logic.shutdown_deadline is not None:
                continue
            now = sc.proc.clock()
            held = sc.member.held_tokens(now)
            if not held:
                continue
            app = sc.logic.app
            if not sc.app_up:
                self.checker.fail("app-join", self.kernel.now,
                                  f"{sc.pod} holds {sorted(held)} before its app asked")
                continue
            silent_for = now - app.last_call if app.last_call is not None \
                and app.open_polls == 0 else 0.0
            if silent_for > cfg.app_timeout + s.handoff.drain_timeout_seconds + slack:
                self.checker.fail("silent-owner", self.kernel.now,
                                  f"{sc.pod}: its app silent for {silent_for:.1f}s, it still "
                                  f"holds {sorted(held)}")
                continue
            sc.health.prune(held)
            reported = sc.health.reported() if cfg.report_silence else None
            stalled, _ = sc.health.summarize(held, now, app.stalls(held, now, reported))
            shown = {h.partition for h in stalled}
            first = self._held_first.setdefault(sc.key, {})
            for key in [k for k in first if k not in held.items()]:
                del first[key]
            for p, token in held.items():
                since = first.setdefault((p, token), now)
                idle = now - max(since, sc.processed.get((p, token), since))
                if idle > cfg.app_timeout + slack and p not in shown:
                    self.checker.fail("silent-stall", self.kernel.now,
                                      f"{sc.pod}: partition {p} (token {token}) not processed "
                                      f"for {idle:.1f}s and not shown stalled")
        self.kernel.after(APP_CHECK_EVERY, self._check_apps)

    def gone(self, sc: SimSidecar) -> None:
        """A sidecar process ended (crash or exit): its app claims nothing any more."""
        sc.proc.crash()
        self.checker.drop_claim(str(sc.key))
        self._by_proc.pop(id(sc.proc), None)

    def bound(self) -> float:
        s = self.spec
        grace = max(s.restart_grace_seconds, s.stateful_set_restart_grace_seconds) \
            if self.cfg.statefulset else s.restart_grace_seconds
        return (s.stabilization_window_seconds + s.handoff.drain_timeout_seconds
                + 3 * s.lease.duration_seconds + grace
                + self.cfg.relist[1] + 5.0)

    def lock(self, partition: int) -> Lock | None:
        """The stored lock of ``partition`` (ground truth), or None."""
        obj = self.store.get(lease_key(partition_lease_name(GROUP, partition)))
        return codec.parse_partition_lease(obj).value if obj is not None else None

    def status(self) -> dict[str, Any]:
        group = self.store.get(GROUP_KEY)
        if group is None:
            return {}  # deleted, to be applied again
        status: dict[str, Any] = group.get("status") or {}
        return status

    def not_converged(self) -> str | None:
        """Why the group has not converged (ground truth in the store), or None."""
        status = self.status()
        epoch = status.get("epoch")
        assignment = {m: parse_ranges(r) for m, r in (status.get("assignment") or {}).items()}
        live = self.live_names()
        if sorted(assignment) != live:
            return f"target members {sorted(assignment)} != live members {live}"
        owner = {p: m for m, ps in assignment.items() for p in ps}
        # what may be assigned: partitions 0..N-1 unless a reshape's layout says otherwise
        expected = sorted(layout_from_status(status.get("layout"),
                                             self.spec.partitions).assignable())
        if sorted(owner) != expected:
            return f"target covers {len(owner)} of {len(expected)} partitions"
        if self.cfg.reshape and (why := self.reshapes.settled()) is not None:
            return f"reshape not ended: {why}"
        for p in expected:
            lock = self.lock(p)
            sc = self.sidecars[owner[p]]
            if lock is None or lock.holder != owner[p] or lock.session != sc.member.session:
                return f"partition {p} lock {lock} is not with {owner[p]}/{sc.member.session}"
            if lock.assigned != owner[p]:
                return f"partition {p} lock is marked for {lock.assigned}, not {owner[p]}"
        for m in live:
            body = self.store.get(lease_key(member_lease_name(GROUP, m)))
            lease = codec.parse_member_lease(body).value if body is not None else None
            sc = self.sidecars[m]
            if lease is None or lease.epoch != epoch:
                return f"member {m} acknowledged {getattr(lease, 'epoch', None)}, not {epoch}"
            view = sc.member.view(sc.proc.clock())
            active = [pv.partition for pv in view.partitions if pv.state == "active"]
            if active != assignment[m] or len(view.partitions) != len(active):
                return f"member {m} app view {active} != target {assignment[m]}"
        return None

    def _fingerprint(self) -> tuple[Any, ...]:
        space = self.spec.partitions
        if self.cfg.reshape:  # every number the layout has issued
            space = max(space, int((self.status().get("layout") or {}).get(
                "nextPartition") or 0))
        locks = tuple((lock.holder, lock.session, lock.token) if lock else None
                      for lock in map(self.lock, range(space)))
        return self.status().get("epoch"), locks

    # ---- the run ---------------------------------------------------------------------

    def run(self) -> Result:
        cfg = self.cfg
        self.store.create(GROUP_KEY, {
            "apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND,
            "metadata": {"name": GROUP, "namespace": NAMESPACE, "generation": 1},
            "spec": self.spec.to_wire(), "status": {}})
        self.start_operator()
        for _ in range(cfg.members):
            self.start_member()
        if cfg.app_timeout > 0:
            self.kernel.after(APP_CHECK_EVERY, self._check_apps)
        for fault in cfg.script:
            self.kernel.at(fault.at, self.inject, fault)
        if cfg.reshape:
            self.reshapes.schedule()
        if cfg.kinds and cfg.fault_rate > 0:
            self.kernel.after(self.rng.expovariate(cfg.fault_rate), faults.random_fault, self)
        checker = self.checker
        self.kernel.run_until(cfg.fault_time, self.after_event)
        start = oscillation.convergence_start(self)  # the faults' end, or the load's shift
        osc = cfg.oscillation
        # load rebalances may follow one another after a shift (a refresh each, the
        # dwell time between moves of a partition): the settle time is theirs too
        stable_since = self.converge(start, osc.settle if osc is not None else 0.0)
        load = oscillation.load_figures(self, start, oscillation.check_window(self, start))
        converged_at = stable_since
        return Result(
            seed=self.seed,
            violations=list(checker.violations),
            faults=dict(sorted(self.faults.items())),
            converged_after=None if converged_at is None else converged_at - start,
            sim_time=self.kernel.now,
            events=self.kernel.events,
            store_writes=self.store.writes,
            bound=self.bound(),
            spec=_describe(self.spec),
            sink_accepted=checker.sink_accepted,
            sink_refused=checker.sink_refused,
            trace=self.lines,
            moves=load.moves,
            rebalances=load.rebalances,
            last_move_after=load.last_move_after,
            window_moves=load.window_moves,
            late_moves=load.late_moves,
            busiest=load.busiest,
            load_bound=load.load_bound,
            reshapes=self.reshapes.durations(),
            completed=len(checker.completed_at),
            successor_acquisitions=checker.successor_acquisitions,
        )

    def converge(self, start: float, slack: float = 0.0) -> float | None:
        """From ``start`` (no faults any more), run until the group is converged and quiet
        for ``quiet_time``, or a violation (liveness: not so within :meth:`bound` plus
        ``slack``); returns since when it was converged and unchanged, or None."""
        cfg, checker = self.cfg, self.checker
        stable_since: float | None = None  # converged, and unchanged since
        fingerprint: tuple[Any, ...] = ()
        bound = self.reshapes.bound() if cfg.reshape else self.bound()
        deadline = start + bound + slack
        t = start
        while not checker.violations:
            t += 0.5
            self.kernel.run_until(t, self.after_event)
            if checker.violations:
                break
            why = self.not_converged()
            if why is not None:
                stable_since = None
            elif stable_since is None or self._fingerprint() != fingerprint:
                stable_since, fingerprint = t, self._fingerprint()
            if stable_since is not None and t >= stable_since + cfg.quiet_time:
                break
            if (stable_since is None and t > deadline) or t > deadline + cfg.quiet_time:
                state = why or "epoch or locks changed while converged"
                checker.fail("liveness", t, f"not converged and quiet "
                             f"{bound + slack:.1f}s after faults stopped: {state}")
        return stable_since


def _describe(spec: ConsumerGroupSpec) -> str:
    return (f"partitions={spec.partitions} assignor={spec.assignor} "
            f"window={spec.stabilization_window_seconds}/{spec.stabilization_max_delay_seconds}"
            f" lease={spec.lease.duration_seconds}/{spec.lease.renew_interval_seconds} "
            f"drain={spec.handoff.drain_timeout_seconds} grace={spec.restart_grace_seconds}")


def run_seed(seed: int, cfg: SimConfig | None = None) -> Result:
    """Run one seed; the same seed and config always give the same result."""
    return World(seed, cfg or SimConfig()).run()
