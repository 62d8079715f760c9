"""A swarm: many real sidecars in one process, for scale figures a 2-core machine can run.

Rule: every member is the real sidecar (``kgroup_sidecar.runtime.Sidecar`` stepping the
real core and writing through the real ``KubeAdapter`` write path), each with its own
member identity, session Lease and audit trail. Only three things are shared, because
200 separate processes would measure the machine, not kgroup:

- one list+watch each of the group and all its partition Leases (``Hub``; a sidecar
  watches no member Lease: the operator is the failure detector), handed out in the loop
  as each member's own watches would deliver them: the group to every member, a
  partition Lease only to the members whose
  scope (``next_watch_scope`` of their interest) holds it, and a re-list of its scope to a
  member whose scope changes; a member that joins late gets the hub's current objects as
  its initial lists, exactly what its own lists would have returned;
- one pair of ``ApiClient`` (aiohttp connection pools: the shared one and the one for
  member-Lease writes) for every member's requests;
- one asyncio loop (in a thread of its own).

The hub hands events over in batches (``batch_seconds``, default 0.05 s): a member steps
once per batch instead of once per event. A pod's own sidecar steps once per burst of
events anyway (its loop wakes on ``dirty``, not per event); without batching, 200 members
in one loop would each step per event and measure this process's CPU, not kgroup. Every
latency measured on the swarm carries up to one batch delay.

``own_watches=True`` gives each member its own watches instead (the real ``KubeAdapter``'s,
its own connections): the API server then sends each event to every member as it would to
N pods, so its ``apiserver_watch_events_total`` shows what N pods cost (and this process
pays for every delivery). With own watches, members of other groups of the namespace may
join too (``add(pods, group=...)``): many small groups in one swarm. ``health_interval``
makes every member's app report the health of what it holds that often, so each renewal
carries a changing summary (lags, positions).

There is no app: a revoking partition is acknowledged at once (``auto_ack``, what an app
that finished its in-flight work does), so handoffs are not bounded by the drain timeout.
``crash`` cancels a member's tasks without ending its session (what SIGKILL does: the
member Lease stays, unrenewed); ``leave`` is SIGTERM's path (revoke, release, delete).

    swarm = Swarm(kubeconfig=..., namespace="ns", group="g", audit_dir=Path(...))
    swarm.start(); swarm.add([f"w-{i}" for i in range(200)])
    swarm.leave("w-3"); swarm.crash("w-4"); swarm.close()

**Split swarms** (``SwarmProcs``): one swarm per OS process (``python -m
kgroup_devcluster.swarm``, driven by JSON lines on stdin/stdout), members dealt out
round-robin, each process sharing one watch among its own members. Same methods as
``Swarm``. One Python loop cannot step 200 members through 10,000 Lease events, and a
process per member does not fit on 2 cores: a few processes let the kernel spread the
loops over the cores. Each swarm also records its loop's worst lag (``lag_max_s``: how
late a 0.5 s timer fired) so a starving loop is named, not guessed.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kgroup.apiclient import ApiClient, load_config
from kgroup.core.lease_codec import parse_partition_lease
from kgroup.core.member.journal import Event, Revoking
from kgroup.core.objects import Obj
from kgroup_sidecar.kube import KubeAdapter, Scope
from kgroup_sidecar.metrics import Metrics
from kgroup_sidecar.runtime import Sidecar
from kgroup_sidecar.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")
EXECUTOR_THREADS = 32
SHARED_CONNECTIONS = 32
SESSION_CONNECTIONS = 256  # the members' member-Lease writes (kube.py)
OWN_CONNECTIONS = 8  # a member's own (own_watches): its two watches and its lock writes


class Hub:
    """One watch of the group and of all its partition Leases; each registered sidecar gets
    what its own watches would: the group and the partition Leases of its own scope
    (``next_watch_scope`` of its interest, exactly as its ``KubeAdapter`` would select
    them), re-listed to it when its scope changes."""

    def __init__(self, settings: Settings, loop: asyncio.AbstractEventLoop, *,
                 batch_seconds: float = 0.05) -> None:
        self.loop = loop
        self.batch_seconds = batch_seconds
        self.pending: list[tuple[str, str, Obj]] = []
        self.members: dict[str, Sidecar] = {}
        self.current: dict[str, dict[str, Obj]] = {"group": {}}
        self.partitions: dict[int, Obj] = {}
        self.scopes: dict[str, Scope] = {}
        self.watchers: dict[int, set[str]] = {}  # partition -> members whose scope has it
        self.listed: set[str] = set()
        self.events = 0
        self.deliveries = 0
        self.scope_changes = 0
        self.adapter = KubeAdapter(settings, loop=loop, on_list=self.on_list,
                                   on_event=self.on_event, metrics=Metrics(),
                                   watch_all_partitions=True)

    def on_list(self, kind: str, items: list[Obj], scope: Scope = None) -> None:
        self.flush()
        self.listed.add(kind)
        if kind == "partition":
            self.partitions = {p: o for o in items if (p := _partition(o)) is not None}
            for name, sc in list(self.members.items()):
                self._relist(name, sc)
            return
        self.current[kind] = {str(o["metadata"]["name"]): o for o in items}
        for sc in list(self.members.values()):
            sc.on_list(kind, list(items))

    def _relist(self, name: str, sc: Sidecar) -> None:
        scope = self.scopes.get(name, frozenset())
        if scope is None:
            items = list(self.partitions.values())
        else:
            items = [o for p in sorted(scope) if (o := self.partitions.get(p)) is not None]
        sc.on_list("partition", items, scope)

    def on_event(self, kind: str, event_type: str, obj: Obj) -> None:
        self.events += 1
        if kind == "partition":
            p = _partition(obj)
            if p is not None:
                if event_type == "DELETED":
                    self.partitions.pop(p, None)
                else:
                    self.partitions[p] = obj
        else:
            name = str(obj["metadata"]["name"])
            if event_type == "DELETED":
                self.current[kind].pop(name, None)
            else:
                self.current[kind][name] = obj
        if not self.pending:
            self.loop.call_later(self.batch_seconds, self.flush)
        self.pending.append((kind, event_type, obj))

    def flush(self) -> None:
        batch, self.pending = self.pending, []
        whole = [n for n, scope in self.scopes.items() if scope is None]
        for kind, event_type, obj in batch:
            if kind == "partition":
                p = _partition(obj)
                names = sorted(self.watchers.get(p, set()).union(whole)) if p is not None else []
            else:
                names = list(self.members)
            for name in names:
                sc = self.members.get(name)
                if sc is not None:
                    self.deliveries += 1
                    sc.on_event(kind, event_type, obj)

    def register(self, name: str, sidecar: Sidecar) -> None:
        self.flush()
        self.members[name] = sidecar
        self.scopes[name] = frozenset()
        for kind in ("group",):
            if kind in self.listed:
                sidecar.on_list(kind, list(self.current[kind].values()))
        if "partition" in self.listed:
            self._relist(name, sidecar)

    def set_scope(self, name: str, scope: Scope) -> None:
        """The member's ``set_partition_scope``: a new scope re-lists it to the member."""
        if name not in self.members:
            return
        current = self.scopes.get(name, frozenset())
        if scope == current:
            return
        self.flush()
        self.scope_changes += 1
        self._unindex(name)
        self.scopes[name] = scope
        for p in scope or ():
            self.watchers.setdefault(p, set()).add(name)
        if "partition" in self.listed:
            self._relist(name, self.members[name])

    def _unindex(self, name: str) -> None:
        for p in self.scopes.get(name) or ():
            watching = self.watchers.get(p)
            if watching is not None:
                watching.discard(name)
                if not watching:
                    del self.watchers[p]

    def unregister(self, name: str) -> None:
        self._unindex(name)
        self.scopes.pop(name, None)
        self.members.pop(name, None)


def _partition(obj: Obj) -> int | None:
    lock = parse_partition_lease(obj).value
    return lock.partition if lock is not None else None


class SwarmAdapter(KubeAdapter):
    """A member's adapter: its watches are the hub's, its writes share one client."""

    def __init__(self, settings: Settings, *, hub: Hub, sidecar: Sidecar,
                 clients: tuple[ApiClient, ApiClient], loop: asyncio.AbstractEventLoop,
                 own_watches: bool = False) -> None:
        super().__init__(settings, loop=loop, on_list=sidecar.on_list,
                         on_event=sidecar.on_event, metrics=sidecar.metrics,
                         api=clients[0], session_api=clients[1])
        self._hub = hub
        self._sidecar = sidecar
        self._own = own_watches

    def start(self) -> None:
        if self._own:
            super().start()
        else:
            self._hub.register(self.settings.pod_name, self._sidecar)

    def set_partition_scope(self, scope: Scope) -> None:
        if self._own:
            super().set_partition_scope(scope)
        else:
            self._hub.set_scope(self.settings.pod_name, scope)

    def stop(self) -> None:
        if self._own:
            super().stop()
            return
        self._hub.unregister(self.settings.pod_name)


class AckingSidecar(Sidecar):
    """A sidecar whose app acknowledges every revocation at once (position unchanged)."""

    def record(self, event: Event) -> None:
        super().record(event)
        if isinstance(event, Revoking):
            self.logic.app_release(event.partition, event.token, None)
            self.dirty.set()


@dataclass
class Running:
    sidecar: Sidecar
    task: asyncio.Task[None]
    started: float


class Swarm:
    def __init__(self, *, kubeconfig: str, namespace: str, group: str,
                 audit_dir: Path | None = None, auto_ack: bool = True,
                 grace: float = 30.0, own_watches: bool = False,
                 health_interval: float | None = None) -> None:
        self.kubeconfig, self.namespace, self.group = kubeconfig, namespace, group
        self.audit_dir, self.auto_ack, self.grace = audit_dir, auto_ack, grace
        self.own_watches, self.health_interval = own_watches, health_interval
        self.health_reports = 0
        self.loop = asyncio.new_event_loop()
        self.loop.set_default_executor(
            concurrent.futures.ThreadPoolExecutor(EXECUTOR_THREADS, thread_name_prefix="swarm"))
        self.thread = threading.Thread(target=self.loop.run_forever, name="swarm", daemon=True)
        self.members: dict[str, Running] = {}
        self.crashed_at: dict[str, float] = {}
        hub_settings = self.settings("swarm-hub", audit=False)
        self.clients: tuple[ApiClient, ApiClient] | None = None  # made in the loop
        self.own_clients: list[ApiClient] = []  # a member's own (own_watches)
        self.config: Any = None
        self.hub = Hub(hub_settings, self.loop)
        self.lag_max_s = 0.0

    async def _watch_lag(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.5)
            self.lag_max_s = max(self.lag_max_s, time.monotonic() - t - 0.5)

    async def _report_health(self, interval: float) -> None:
        """Every member's app reports the health of what it holds every ``interval`` s,
        as ``POST /v1/health`` would (``SidecarHealth.report``): positions advance, lags
        move, processed rates vary, nothing stalls. Each renewal then carries a fresh
        health summary and load annotation (``kgroup.dev/load``), as with real apps;
        ``KGROUP_SWARM_RATES=0`` in the environment leaves the rates out (apps that report
        no load: the cost benchmark's before and after)."""
        rates = os.environ.get("KGROUP_SWARM_RATES", "1") != "0"
        tick = 0
        while True:
            await asyncio.sleep(interval)
            tick += 1
            for run in list(self.members.values()):
                held = run.sidecar.held()
                if not held:
                    continue
                run.sidecar.health.report({"partitions": [
                    {"partition": p, "token": t, "position": f"{1000 * tick + p}-0",
                     "lag": (tick * 7 + p) % 50}
                    | ({"rate": float(10 + (tick * 3 + p) % 40)} if rates else {})
                    for p, t in held.items()]})
                self.health_reports += 1

    def settings(self, pod: str, *, audit: bool = True, group: str | None = None) -> Settings:
        audit_file = (str(self.audit_dir / f"audit-{pod}.jsonl")
                      if audit and self.audit_dir is not None else None)
        return Settings(group=group or self.group, namespace=self.namespace, pod_name=pod,
                        listen_port=0, kubeconfig=self.kubeconfig, log_level="WARNING",
                        audit_file=audit_file, termination_grace_seconds=self.grace,
                        app_timeout_seconds=0)  # no app asks: the sidecar joins at start

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> Swarm:
        if self.audit_dir is not None:
            self.audit_dir.mkdir(parents=True, exist_ok=True)
        self.thread.start()

        async def clients() -> tuple[ApiClient, ApiClient]:
            self.config = config = load_config(self.kubeconfig)
            return (ApiClient(config, connections=SHARED_CONNECTIONS),
                    ApiClient(config, connections=SESSION_CONNECTIONS))

        self.clients = self._call(clients())
        self.loop.call_soon_threadsafe(self.hub.adapter.start)
        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._watch_lag()))
        if self.health_interval:
            interval = self.health_interval
            self.loop.call_soon_threadsafe(
                lambda: self.loop.create_task(self._report_health(interval)))
        return self

    def add(self, pods: Iterable[str], group: str | None = None) -> None:
        """Start members ``pods`` (of ``group``: another group than the swarm's needs
        ``own_watches``, the hub watches the swarm's group only)."""
        if group not in (None, self.group) and not self.own_watches:
            raise ValueError("members of another group need own_watches")

        async def go() -> None:
            for pod in pods:
                settings = self.settings(pod, group=group)
                sc: Sidecar = (AckingSidecar if self.auto_ack else Sidecar)(settings)
                assert self.clients is not None
                clients = self.clients
                if self.own_watches:
                    # its watches and lock writes on connections of its own, as a pod's:
                    # a shared pool would queue N members' long-lived watches behind each
                    # other (32 connections for 50 members' 100 watches timed out)
                    own = ApiClient(self.config, connections=OWN_CONNECTIONS)
                    self.own_clients.append(own)
                    clients = (own, self.clients[1])
                adapter = SwarmAdapter(settings, hub=self.hub, sidecar=sc,
                                       clients=clients, loop=self.loop,
                                       own_watches=self.own_watches)
                task = self.loop.create_task(sc.run(adapter), name=f"sidecar-{pod}")
                self.members[pod] = Running(sc, task, time.monotonic())

        self._call(go())

    def leave(self, pod: str, timeout: float = 60.0) -> None:
        """SIGTERM's path: revoke, release, end the session; returns once it has ended."""
        run = self.members.pop(pod)

        async def go() -> None:
            run.sidecar.begin_shutdown()
            await asyncio.wait_for(asyncio.shield(run.task), timeout)

        self._call(go(), timeout + 5)

    def crash(self, pod: str) -> float:
        """SIGKILL's equivalent: the member stops at once, its session Lease stays behind."""
        run = self.members.pop(pod)

        async def go() -> float:
            assert run.sidecar.kube is not None
            run.sidecar.kube.stop()
            run.task.cancel()
            for task in list(run.sidecar._tasks):  # its writes in flight die with it
                task.cancel()
            return time.monotonic()

        at = self._call(go())
        self.crashed_at[pod] = at
        return at

    def held(self) -> dict[str, int]:
        return {pod: len(r.sidecar.member.owned) for pod, r in self.members.items()}

    def api_writes(self) -> int:
        return int(sum(r.sidecar.metrics.api_writes() for r in self.members.values()))

    def fencings(self) -> int:
        """Sessions fenced so far among the members still running (a loop too busy to
        renew in time shows up here)."""
        return int(sum(r.sidecar.metrics.value("kgroup_sidecar_fencings_total")
                       for r in self.members.values()))

    def stats(self) -> dict[str, Any]:
        return {"api_writes": self.api_writes(), "fencings": self.fencings(),
                "events": self.hub.events, "deliveries": self.hub.deliveries,
                "scope_changes": self.hub.scope_changes, "members": len(self.members),
                "lag_max_s": round(self.lag_max_s, 3), "health_reports": self.health_reports,
                "cpu_s": round(sum(os.times()[:2]), 2)}

    def close(self) -> None:
        """Crash every member left (their Leases go with the namespace) and stop the loop."""
        for pod in list(self.members):
            try:
                self.crash(pod)
            except Exception as exc:  # the loop may be gone already
                log.warning("swarm: could not stop %s: %s", pod, exc)

        async def close_clients() -> None:
            await self.hub.adapter.aclose()
            for api in [*(self.clients or ()), *self.own_clients]:
                await api.close()

        try:
            self._call(close_clients(), 10)
        except Exception as exc:  # the loop may be gone already
            log.warning("swarm: could not close its clients: %s", exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class SwarmProcs:
    """``processes`` swarms in child processes; members dealt out round-robin."""

    def __init__(self, *, kubeconfig: str, namespace: str, group: str, processes: int,
                 audit_dir: Path | None = None, grace: float = 30.0,
                 own_watches: bool = False, health_interval: float | None = None) -> None:
        cmd = [sys.executable, "-m", "kgroup_devcluster.swarm", "--kubeconfig", kubeconfig,
               "--namespace", namespace, "--group", group, "--grace", str(grace)]
        if audit_dir is not None:
            cmd += ["--audit-dir", str(audit_dir)]
        if own_watches:
            cmd += ["--own-watches"]
        if health_interval:
            cmd += ["--health-interval", str(health_interval)]
        self.procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       text=True, bufsize=1) for _ in range(processes)]
        self.where: dict[str, int] = {}
        self.crashed_at: dict[str, float] = {}
        self._next = 0

    def start(self) -> SwarmProcs:
        return self

    def _ask(self, i: int, op: str, **args: Any) -> Any:
        proc = self.procs[i]
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"swarm process {proc.pid} ended (rc {proc.poll()})")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"swarm process {proc.pid}: {reply['error']}")
        return reply.get("result")

    def add(self, pods: Iterable[str], group: str | None = None) -> None:
        share: dict[int, list[str]] = {}
        for pod in pods:
            i = self._next % len(self.procs)
            self._next += 1
            self.where[pod] = i
            share.setdefault(i, []).append(pod)
        for i, mine in share.items():
            self._ask(i, "add", pods=mine, group=group)

    def leave(self, pod: str, timeout: float = 60.0) -> None:
        self._ask(self.where.pop(pod), "leave", pod=pod, timeout=timeout)

    def crash(self, pod: str) -> float:
        at = float(self._ask(self.where.pop(pod), "crash", pod=pod))
        self.crashed_at[pod] = at
        return at

    def stats(self) -> list[dict[str, Any]]:
        return [dict(self._ask(i, "stats"), pid=p.pid) for i, p in enumerate(self.procs)]

    def api_writes(self) -> int:
        return sum(int(s["api_writes"]) for s in self.stats())

    def fencings(self) -> int:
        return sum(int(s["fencings"]) for s in self.stats())

    def close(self) -> None:
        for i, proc in enumerate(self.procs):
            try:
                self._ask(i, "close")
            except Exception as exc:  # already gone
                log.warning("swarm process %s: %s", proc.pid, exc)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def serve(argv: list[str] | None = None) -> int:
    """A child of ``SwarmProcs``: one request per stdin line, one JSON reply per line."""
    ap = argparse.ArgumentParser(description="one swarm process, driven over stdin")
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--audit-dir", type=Path)
    ap.add_argument("--grace", type=float, default=30.0)
    ap.add_argument("--own-watches", action="store_true",
                    help="each member opens its own watches (as a pod does), no shared hub")
    ap.add_argument("--health-interval", type=float, default=None,
                    help="every member's app reports health this often (seconds)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    swarm = Swarm(kubeconfig=args.kubeconfig, namespace=args.namespace, group=args.group,
                  audit_dir=args.audit_dir, grace=args.grace, own_watches=args.own_watches,
                  health_interval=args.health_interval).start()
    for line in sys.stdin:
        req = json.loads(line)
        op = req.pop("op")
        try:
            result: Any = None
            if op == "add":
                swarm.add(req["pods"], req.get("group"))
            elif op == "leave":
                swarm.leave(req["pod"], req.get("timeout", 60.0))
            elif op == "crash":
                result = swarm.crash(req["pod"])
            elif op == "stats":
                result = swarm.stats()
            elif op == "close":
                swarm.close()
                print(json.dumps({"result": None}), flush=True)
                return 0
            print(json.dumps({"result": result}), flush=True)
        except Exception as exc:  # reported to the parent, which raises
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
    swarm.close()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
