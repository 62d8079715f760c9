"""kgroup's figures on the real node: real containers under a real kubelet, events flowing.

For each size (16 and 64 partitions, 4 workers from examples/ on the real node, the
chart's operator in its own container, the example ConsumerGroup's default settings) and
each kind of workers (the example Deployment, maxSurge 1 / maxUnavailable 0, and the
example StatefulSet), a fresh namespace and group with events flowing, then:

- rollout (`--runs` times): `kubectl rollout restart` of the workers, from the sidecars'
  ownership audit: partition moves per partition (a partition whose next owner has the
  same pod name, as a StatefulSet pod coming back, is not a move), the most partitions
  unowned at any instant, the longest ownership gap of any partition, and the rollout's
  duration (restart -> `rollout status` done); and from the fenced sink (consumption, not
  ownership: :mod:`kgroup_devcluster.consumption` samples every partition's committed
  offset and its stream's tail every 0.2 s): the longest pause of any partition (events
  pending, offset not advancing) from the restart until every partition is consumed
  again, and each partition's longest pause (p50, max);
- Deployment only, `--leaves` times each (0: none), measured by consumption: a graceful
  leave (the oldest pod, consuming for a while, deleted) and a start-up deletion (one
  more replica, removed by the ReplicaSet once `--startup-age` s old, before a PySpark
  app is up): from the delete until each of its partitions' offsets advances under a
  newer token (processed elsewhere), how long the pod owned them, whether its app had
  consumed any;
- Deployment only, `--rounds` times each (0: none): SIGKILL of a worker's app container or
  of its sidecar on the host -> every partition it owned has a newer commit in the fenced
  sink (processed again); pod deleted (the SIGTERM path) -> every partition it owned held
  by another member; operator and sidecar CPU and memory while stable, as the kubelet's
  cgroups account them (the kubelet's /stats/summary);

then the verifier (nothing lost, nothing duplicated) and the audit's safety check. The app
(`--app`) is the light worker, or the reference PySpark job as `make demo` runs it (3
workers by default: a JVM each on 2 cores). The last line printed is the JSON written to
`--out`.

    .venv/bin/python bench/bench_real_node.py [--app light|pyspark] [--workers N]
        [--partitions 16,64] [--kinds deployment,statefulset] [--runs 3] [--rounds 3]
        [--leaves 1] [--startup-age 15] [--restart-grace SECONDS]
        [--out docs/bench/real_node.json]

One group costs about 1-2 min to set up and tear down; one rollout of 4 light workers about
45-60 s (the Deployment) on 2 shared cores; the PySpark figures of one size
(`--app pyspark --partitions 16 --kinds deployment --runs 1 --rounds 0`) about 10-15 min.
"""

from __future__ import annotations

import argparse
import json
import secrets
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stage import machine, pct

from kgroup.core.objects import Obj
from kgroup_devcluster import consumption, stack
from kgroup_devcluster.cluster import Cluster, ensure_up
from kgroup_devcluster.demo import WORKER as PYSPARK_WORKER
from kgroup_devcluster.images import ensure_on_node
from kgroup_devcluster.real_group import APP, RealGroup, _ready
from kgroup_devcluster.tokens import admin_api_client
from kgroup_pipeline.keys import StreamKeys
from kgroup_pipeline.redis_server import RedisServer
from kgroup_pipeline.verify import render, verify
from kgroup_testing.sidecar_harness import (
    Interval,
    handoff_figures,
    ownership_intervals,
    read_audit,
    safety_violations,
)

REPO = Path(__file__).resolve().parents[1]
STREAM = "orders"
WORKERS = 4
RATE = 400  # events/s in all, while every measurement runs
LIGHT_WORKER = ["python3", "-m", "kgroup_pipeline.light_worker", "--drain-timeout", "20"]
# the app in each worker pod: the light worker, or the reference PySpark job as `make demo`
# runs it (local[1] Spark in the pod, the same image)
APPS = {"light": LIGHT_WORKER, "pyspark": PYSPARK_WORKER}


class Producer:
    """Keeps producing events at RATE/s in the background until stopped."""

    def __init__(self, redis_url: str, partitions: int) -> None:
        self.redis_url, self.partitions = redis_url, partitions
        self.running = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while self.running.is_set():
            done = subprocess.run(
                [sys.executable, "-m", "kgroup_pipeline.producer", "--redis", self.redis_url,
                 "--stream", STREAM, "--partitions", str(self.partitions), "--rate",
                 str(RATE), "--count", str(RATE), "--keys", "500"],
                capture_output=True, text=True, check=False)
            if done.returncode != 0:
                self.errors.append(done.stderr[-500:])

    def __enter__(self) -> Producer:
        self.running.set()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.running.clear()
        self.thread.join(timeout=60)


# ---- the kubelet's accounting --------------------------------------------------------------


def kubelet_get(cluster: Cluster, path: str) -> bytes:
    """``path`` asked of the kubelet itself on 127.0.0.1 with the API server's
    kubelet-client certificate (the API server's node proxy refuses loopback addresses)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # the kubelet's own cert
    pki = cluster.pki
    ctx.load_cert_chain(str(pki.client_cert("apiserver-kubelet-client")),
                        str(pki.client_key("apiserver-kubelet-client")))
    url = f"https://127.0.0.1:{cluster.ports['kubelet']}{path}"
    with urllib.request.urlopen(url, context=ctx, timeout=30) as resp:
        body: bytes = resp.read()
    return body


def kubelet_stats(cluster: Cluster) -> list[Obj]:
    """The kubelet's /stats/summary (:func:`kubelet_get`)."""
    pods: list[Obj] = json.loads(kubelet_get(cluster, "/stats/summary")).get("pods", [])
    return pods


def resources(cluster: Cluster, namespace: str, seconds: float = 30.0) -> Obj:
    """CPU (cores, averaged over `seconds`) and memory of each container kind, stable."""
    def snapshot() -> dict[tuple[str, str], Obj]:
        return {(p["podRef"]["name"], c["name"]): c for p in kubelet_stats(cluster)
                if p["podRef"]["namespace"] == namespace for c in p.get("containers", [])}

    t0, a = time.monotonic(), snapshot()
    time.sleep(seconds)
    t1, b = time.monotonic(), snapshot()
    rows: dict[str, list[Obj]] = {}
    for key, c in b.items():
        if key not in a:
            continue
        used = (c["cpu"]["usageCoreNanoSeconds"] - a[key]["cpu"]["usageCoreNanoSeconds"])
        rows.setdefault(c["name"], []).append({
            "cpu_cores": used / 1e9 / (t1 - t0),
            "rss_mb": (c.get("memory", {}).get("rssBytes") or 0) / 1e6,
            "working_set_mb": (c.get("memory", {}).get("workingSetBytes") or 0) / 1e6})
    return {name: {k: max(r[k] for r in rs) for k in rs[0]} | {"containers": len(rs)}
            for name, rs in rows.items()}


# ---- one size ----------------------------------------------------------------------------


@contextmanager
def group_on_node(cluster: Cluster, partitions: int, kind: str = "Deployment", *,
                  workers: int = WORKERS, http_probes_on: int | None = None,
                  command: list[str] = LIGHT_WORKER, settle_timeout: float = 300.0,
                  **group_spec: Any) -> Iterator[tuple[RealGroup, Producer]]:
    namespace = f"bench-real-{kind[:3].lower()}-{partitions}-{secrets.token_hex(2)}"
    with RedisServer() as server:
        url = f"redis://127.0.0.1:{server.port}/0"
        g = RealGroup(cluster, admin_api_client(cluster), namespace,
                      release=f"kgroup-{secrets.token_hex(2)}", redis_url=url,
                      audit=REPO / ".state" / "bench" / namespace / "audit", kind=kind)
        g.install()
        try:
            g.apply(partitions=partitions, replicas=workers, command=command,
                    stream=STREAM, http_probes_on=http_probes_on, **group_spec)
            with Producer(url, partitions) as producer:
                g.wait_settled(workers, timeout=settle_timeout)
                yield g, producer
        finally:
            g.uninstall()
            g.delete_namespace()


def owned_by(g: RealGroup, pod: str) -> list[int]:
    return sorted(p for p, h in g.holders().items() if h == pod)


def sink_offsets(r: redis.Redis, parts: list[int]) -> dict[int, str | None]:
    k = StreamKeys(STREAM)
    return {p: r.hget(k.sink_partition(p), "offset") for p in parts}  # type: ignore[misc]


def settle(g: RealGroup, sampler: consumption.Sampler, workers: int) -> float:
    """Stable with every worker Ready, then every partition consumed again (an app that
    owns partitions before it consumes them is Ready before that); returns when."""
    g.wait_settled(workers, timeout=600)
    return sampler.wait_consuming(timeout=600)


def rollout(g: RealGroup, partitions: int, workers: int,
            sampler: consumption.Sampler) -> Obj:
    """One `kubectl rollout restart` of the workers, measured from the ownership audit
    (moves, unowned, ownership gaps) and from the sink (consumption pauses)."""
    assert g.audit is not None
    epoch0 = int((g.settled(workers) or {}).get("epoch", 0))
    t0 = time.monotonic()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    g.kubectl("rollout", "restart", g.workload)
    g.kubectl("rollout", "status", g.workload, "--timeout=600s", timeout=620)
    t_done = time.monotonic()
    status = g.wait_settled(workers, timeout=300)
    t1 = time.monotonic()
    records = read_audit(sorted(g.audit.glob("*.jsonl")))
    intervals = ownership_intervals(records, now=t1)
    fig: Obj = dict(handoff_figures(intervals, partitions, t0, t1))
    # a sidecar that could not renew in time (the audit's clock is the host's monotonic
    # one, the same as this process's): why a partition may pause far longer than a handoff
    fig["fences"] = [{"pod": r["member"], "after_restart_s": round(r["mono"] - t0, 1),
                      "partitions": len(r.get("partitions") or [])}
                     for r in records if r.get("event") == "fence" and t0 <= r["mono"] <= t1]
    fig["duration_s"] = t_done - t0
    fig["epochs"] = int(status["epoch"]) - epoch0
    t_consuming = sampler.wait_consuming(timeout=600)
    fig["consumption"] = consumption.pause_figures(sampler.snapshot(), t0, t_consuming)
    fig["consuming_again_after_s"] = t_consuming - t0
    since = f"--since={int(t1 - t0) + 5}s"
    operator = g.operator_ready()[0].metadata.name
    fig["epoch_log"] = [line[-220:] for line in
                        g.kubectl("logs", operator, since).splitlines() if ": epoch " in line]
    # a worker's readiness probe that failed during the rollout: its pod counted as
    # unavailable, which the Deployment controller may scale down first
    events = json.loads(g.kubectl("get", "events", "-o", "json",
                                  "--field-selector", "reason=Unhealthy"))["items"]
    fig["probe_failures"] = sorted(
        f"{e['involvedObject']['name']}: {e.get('message', '')[:120]}" for e in events
        # "probe errored ... context canceled": the kubelet's probe cut short as the
        # container stops, not an answer of the sidecar
        if "Readiness probe failed" in e.get("message", "")
        and e.get("lastTimestamp", "") >= started)
    return fig


# ---- a pod leaving: measured by consumption ------------------------------------------------


def held_tokens(g: RealGroup, pod: str) -> dict[int, int]:
    """The partitions `pod` holds now, each with the fencing token it holds it under (its
    sidecar's latest acquisition in the audit)."""
    assert g.audit is not None
    parts = set(owned_by(g, pod))
    latest: dict[int, Interval] = {}
    for iv in ownership_intervals(read_audit(sorted(g.audit.glob("*.jsonl")))):
        if iv.member == pod and iv.partition in parts and (
                iv.partition not in latest or iv.start > latest[iv.partition].start):
            latest[iv.partition] = iv
    return {p: iv.token for p, iv in sorted(latest.items())}


def pod_age(pod: Any) -> float:
    return time.time() - float(pod.metadata.creation_timestamp.timestamp())


def wait_gone(g: RealGroup, pod: str, timeout: float = 120.0) -> float:
    """When the pod object is gone (its containers stopped, its sidecar's audit final)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listing: Any = g.core.list_namespaced_pod(g.namespace, label_selector=f"app={APP}")
        if not any(p.metadata.name == pod for p in listing.items):
            return time.monotonic()
        time.sleep(0.2)
    raise TimeoutError(f"pod {pod} still there after {timeout} s")


def after_leave(g: RealGroup, sampler: consumption.Sampler, pod: str, tokens: dict[int, int],
                t_del: float, timeout: float = 180.0) -> Obj:
    """From the deletion of `pod` (at t_del, holding `tokens`): when each of its partitions
    was processed elsewhere (the sink's offset advanced under a newer token), whether its
    app had consumed any of them, and how long the pod owned each (the audit)."""
    assert g.audit is not None
    deadline = t_del + timeout
    while True:
        series = sampler.snapshot()
        moved = {p: consumption.processed_elsewhere(series[p], t_del, tok)
                 for p, tok in tokens.items()}
        if all(v is not None for v in moved.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    t_gone = wait_gone(g, pod)
    intervals = [iv for iv in ownership_intervals(read_audit(sorted(g.audit.glob("*.jsonl"))),
                                                  ended_at={pod: t_gone})
                 if iv.member == pod and tokens.get(iv.partition) == iv.token]
    done = [v for v in moved.values() if v is not None]
    return {
        "pod": pod, "partitions": len(tokens),
        "app_consumed_before_delete": any(
            consumption.committed_under(series[p], tok, t_del) for p, tok in tokens.items()),
        "processed_elsewhere_s": {str(p): None if v is None else round(v, 2)
                                  for p, v in moved.items()},
        "processed_elsewhere_max_s": max(done, default=0.0) if len(done) == len(moved)
        else None,
        "processed_elsewhere_p50_s": pct(done, 0.5) if done else None,
        "not_processed_elsewhere": sorted(p for p, v in moved.items() if v is None),
        "owned_s_max": max((iv.end - iv.start for iv in intervals), default=0.0),
        "held_after_delete_s_max": max((iv.end - t_del for iv in intervals), default=0.0),
        "pod_gone_after_s": t_gone - t_del,
    }


def graceful_leave(g: RealGroup, sampler: consumption.Sampler, workers: int) -> Obj:
    """Delete the oldest worker pod (consuming for a while), its replacement coming up as
    the Deployment makes it; then back to all workers consuming."""
    victim = min(g.pods(), key=lambda p: p.metadata.creation_timestamp)
    name, age = victim.metadata.name, pod_age(victim)
    tokens = held_tokens(g, name)
    t_del = time.monotonic()
    g.core.delete_namespaced_pod(name, g.namespace)
    fig = after_leave(g, sampler, name, tokens, t_del) | {"age_at_delete_s": age}
    settle(g, sampler, workers)
    return fig


def startup_delete(g: RealGroup, sampler: consumption.Sampler, workers: int,
                   age: float) -> Obj:
    """A pod deleted while its app is still starting: one more replica, and once the new
    pod is `age` s old the ReplicaSet removes exactly it (scaled back, the pod's
    controller.kubernetes.io/pod-deletion-cost lowest), with no replacement to take its
    partitions."""
    before = {p.metadata.name for p in g.pods()}
    g.kubectl("scale", g.workload, f"--replicas={workers + 1}")
    pod = stack.wait("the new worker pod", lambda: next(
        (p for p in g.pods() if p.metadata.name not in before), None), timeout=60)
    name = pod.metadata.name
    time.sleep(max(0.0, age - pod_age(pod)))
    g.kubectl("annotate", "pod", name, "controller.kubernetes.io/pod-deletion-cost=-1000",
              "--overwrite")
    tokens = held_tokens(g, name)
    fresh = g.core.read_namespaced_pod(name, g.namespace)
    age_at, ready = pod_age(fresh), _ready(fresh)
    t_del = time.monotonic()
    g.kubectl("scale", g.workload, f"--replicas={workers}")
    deleted = stack.wait("a worker pod deleted", lambda: sorted(
        (before | {name}) - {p.metadata.name for p in g.pods()}), timeout=60)
    if deleted != [name]:
        raise RuntimeError(f"the ReplicaSet deleted {deleted}, not the new pod {name}")
    fig = after_leave(g, sampler, name, tokens, t_del) | {
        "age_at_delete_s": age_at, "ready_at_delete": ready}
    settle(g, sampler, workers)
    return fig


def measure(cluster: Cluster, partitions: int, rounds: int, runs: int,
            kind: str = "Deployment", restart_grace: int | None = None, *,
            app: str = "light", workers: int = WORKERS, leaves: int = 1,
            startup_age: float = 15.0, steady: float = 20.0) -> Obj:
    spec: Obj = {} if restart_grace is None else {"restartGraceSeconds": restart_grace}
    out: Obj = {"partitions": partitions, "workers": workers, "rate": RATE, "kind": kind,
                "app": app, "app_command": APPS[app], "group_spec": spec or "the example's"}
    started = time.monotonic()
    with group_on_node(cluster, partitions, kind, workers=workers, command=APPS[app],
                       settle_timeout=600, **spec) as (g, producer), \
            consumption.Sampler(g.redis_url, STREAM, partitions) as sampler:
        r = redis.Redis.from_url(g.redis_url, decode_responses=True)
        assert g.audit is not None
        t_up = sampler.wait_consuming(timeout=600)
        out["consuming_after_s"] = t_up - started
        time.sleep(steady)  # the pauses of a group at rest: the commit cadence
        out["steady"] = consumption.pause_figures(sampler.snapshot(), t_up,
                                                  time.monotonic())
        print(f"[real-node] {app}: steady {out['steady']}", flush=True)
        # rollouts first: the audit's intervals are cut by nothing but handoffs then
        rolls = []
        for _ in range(runs):
            rolls.append(rollout(g, partitions, workers, sampler))
            print(f"[real-node] {kind} x {partitions} partitions: rollout {rolls[-1]}",
                  flush=True)
        out["rollout"] = rolls
        for _ in range(leaves if kind == "Deployment" else 0):
            out.setdefault("graceful_leave", []).append(graceful_leave(g, sampler, workers))
            print(f"[real-node] graceful leave: {out['graceful_leave'][-1]}", flush=True)
            out.setdefault("startup_delete", []).append(
                startup_delete(g, sampler, workers, startup_age))
            print(f"[real-node] start-up deletion: {out['startup_delete'][-1]}", flush=True)
        if kind == "Deployment" and rounds > 0:
            failures(cluster, g, r, rounds, workers, out)
        finish(g, r, producer, out, killed_at=out.pop("killed_at", {}))
        out["sampler_errors"] = sampler.errors[:3]
    out["seconds"] = time.monotonic() - started
    return out


def failures(cluster: Cluster, g: RealGroup, r: redis.Redis, rounds: int, workers: int,
             out: Obj) -> None:
    """Resources while stable, then container crashes and pod deletions (Deployment)."""
    out["resources"] = resources(cluster, g.namespace)
    print(f"[real-node] resources {out['resources']}", flush=True)
    killed_at: dict[str, float] = {}
    for container in ("worker", "kgroup-sidecar"):
        times = []
        for i in range(rounds):
            victim = g.pods()[i % workers].metadata.name
            parts = owned_by(g, victim)
            before = sink_offsets(r, parts)
            t0 = time.monotonic()
            g.kill_container(victim, container)
            if container == "kgroup-sidecar":
                killed_at[victim] = t0
            deadline = t0 + 120
            while time.monotonic() < deadline:
                now = sink_offsets(r, parts)
                if all(now[p] != before[p] for p in parts):
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError(f"{victim}'s partitions not processed again")
            times.append(time.monotonic() - t0)
            g.wait_settled(workers, timeout=300)
        out[f"crash_{container}"] = times
        print(f"[real-node] SIGKILL {container}: {times}", flush=True)
    times = []
    for i in range(rounds):
        victim = g.pods()[i % workers].metadata.name
        parts = owned_by(g, victim)
        t0 = time.monotonic()
        g.core.delete_namespaced_pod(victim, g.namespace)
        deadline = t0 + 120
        while time.monotonic() < deadline:
            h = g.holders()
            if all(h.get(p) not in (None, victim) for p in parts):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"{victim}'s partitions not taken over")
        times.append(time.monotonic() - t0)
        g.wait_settled(workers, timeout=300)
    out["pod_delete"] = times
    out["killed_at"] = killed_at
    print(f"[real-node] pod delete: {times}", flush=True)


def finish(g: RealGroup, r: redis.Redis, producer: Producer, out: Obj, *,
           killed_at: dict[str, float]) -> None:
    """Stop producing, wait for the workers to catch up, verify, check the audit."""
    assert g.audit is not None
    producer.__exit__()
    deadline = time.monotonic() + 180
    while not (report := verify(r, STREAM)).caught_up and time.monotonic() < deadline:
        time.sleep(0.5)
    out["verifier"] = {"caught_up": report.caught_up, "clean": report.clean,
                       "produced": report.total("produced"),
                       "lost": report.total("lost"),
                       "duplicated": report.total("duplicated")}
    out["violations"] = safety_violations(read_audit(sorted(g.audit.glob("*.jsonl"))),
                                          ended_at=killed_at)
    out["producer_errors"] = producer.errors[:3]
    print(render(report), flush=True)


def summary(res: Obj) -> Obj:
    def stats(xs: list[float]) -> Obj:
        return {"n": len(xs), "p50": pct(xs, 0.5), "p95": pct(xs, 0.95),
                "max": max(xs, default=float("nan"))}
    s: Obj = {k: stats(res[k]) for k in ("crash_worker", "crash_kgroup-sidecar", "pod_delete")
              if k in res}
    for k in ("moves_per_partition", "max_unowned", "longest_pause_s", "duration_s",
              "epochs", "consuming_again_after_s"):
        s[f"rollout_{k}"] = stats([float(x[k]) for x in res["rollout"]])
    for k in ("longest_pause_s", "per_partition_longest_p50_s", "per_partition_longest_max_s"):
        s[f"rollout_consumption_{k}"] = stats(
            [float(x["consumption"][k]) for x in res["rollout"]])
    if "steady" in res:
        s["steady_longest_pause_s"] = res["steady"]["longest_pause_s"]
    for leave in ("startup_delete", "graceful_leave"):
        for k in ("processed_elsewhere_max_s", "owned_s_max", "held_after_delete_s_max",
                  "age_at_delete_s", "partitions"):
            xs = [x[k] for x in res.get(leave, [])]
            if xs:  # None: a partition not processed elsewhere within the timeout
                s[f"{leave}_{k}"] = stats([float(x) for x in xs if x is not None]) | {
                    "missing": sum(x is None for x in xs)}
        if res.get(leave):
            s[f"{leave}_app_consumed_before_delete"] = [
                x["app_consumed_before_delete"] for x in res[leave]]
    s["verifier"] = res["verifier"]
    s["violations"] = len(res["violations"])
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    ap.add_argument("--app", choices=sorted(APPS), default="light",
                    help="the app in each worker pod: the light worker, or the reference "
                    "PySpark job as `make demo` runs it")
    ap.add_argument("--workers", type=int, default=None,
                    help=f"worker pods (default {WORKERS}; 3 with --app pyspark: 2 cores)")
    ap.add_argument("--partitions", default="16,64")
    ap.add_argument("--kinds", default="deployment,statefulset",
                    help="the workers: deployment, statefulset or both")
    ap.add_argument("--runs", "--rollouts", dest="runs", type=int, default=3,
                    help="rollouts per size and kind")
    ap.add_argument("--rounds", type=int, default=3,
                    help="crashes and pod deletions of each kind (Deployment; 0: none)")
    ap.add_argument("--leaves", type=int, default=1,
                    help="graceful leaves and start-up deletions, measured by consumption "
                    "(Deployment; 0: none)")
    ap.add_argument("--startup-age", type=float, default=15.0,
                    help="the start-up deletion's pod age at its delete, seconds")
    ap.add_argument("--restart-grace", type=int, default=None,
                    help="the group's restartGraceSeconds (default: the example's)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "real_node.json")
    args = ap.parse_args(argv)
    workers = args.workers or (3 if args.app == "pyspark" else WORKERS)
    uptime = subprocess.run(["uptime"], capture_output=True, text=True,
                            check=False).stdout.strip()
    cluster = ensure_up(who="bench")
    ensure_on_node(cluster.state_dir)
    results: Obj = {"machine": machine(cluster), "uptime_at_start": uptime, "command": " ".join(
        ["bench/bench_real_node.py", *(argv if argv is not None else sys.argv[1:])]),
        "app": args.app, "workers": workers, "sizes": []}
    ok = True
    kinds = {"deployment": "Deployment", "statefulset": "StatefulSet"}
    for p in (int(x) for x in args.partitions.split(",")):
        for kind in (kinds[k.strip().lower()] for k in args.kinds.split(",")):
            res = measure(cluster, p, args.rounds, args.runs, kind, args.restart_grace,
                          app=args.app, workers=workers, leaves=args.leaves,
                          startup_age=args.startup_age)
            res["summary"] = summary(res)
            results["sizes"].append(res)
            ok &= res["verifier"]["clean"] and not res["violations"]
            print(json.dumps(res["summary"], indent=1), flush=True)
            args.out.write_text(json.dumps(results, indent=1) + "\n")  # after each group
    print(f"[real-node] wrote {args.out}", flush=True)
    print(json.dumps(results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
