"""kgroup's figures on the real node: real containers under a real kubelet, events flowing.

For each size (16 and 64 partitions, 4 light workers from examples/ on the real node, the
chart's operator in its own container, the example ConsumerGroup's default settings) and
each kind of workers (the example Deployment, maxSurge 1 / maxUnavailable 0, and the
example StatefulSet), a fresh namespace and group with events flowing, then:

- rollout (`--runs` times): `kubectl rollout restart` of the workers (readiness =
  ownership), from the sidecars' ownership audit: partition moves per partition (a
  partition whose next owner has the same pod name, as a StatefulSet pod coming back, is
  not a move), the most partitions unowned at any instant, the longest pause of any
  partition, and the rollout's duration (restart -> `rollout status` done);
- Deployment only, `--rounds` times each (0: none): SIGKILL of a worker's app container or
  of its sidecar on the host -> every partition it owned has a newer commit in the fenced
  sink (processed again); pod deleted (the SIGTERM path) -> every partition it owned held
  by another member; operator and sidecar CPU and memory while stable, as the kubelet's
  cgroups account them (the kubelet's /stats/summary);

then the verifier (nothing lost, nothing duplicated) and the audit's safety check.

    .venv/bin/python bench/bench_real_node.py [--partitions 16,64]
        [--kinds deployment,statefulset] [--runs 3] [--rounds 3]
        [--restart-grace SECONDS] [--out docs/bench/real_node.json]

One group costs about 1-2 min to set up and tear down; one rollout of 4 workers about 45-60 s
(the Deployment) on 2 shared cores.
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

from kgroup_devcluster.cluster import Cluster, ensure_up
from kgroup_devcluster.images import ensure_on_node
from kgroup_devcluster.real_group import RealGroup
from kgroup_devcluster.tokens import admin_api_client
from kgroup_pipeline.keys import StreamKeys
from kgroup_pipeline.redis_server import RedisServer
from kgroup_pipeline.verify import render, verify
from kgroup_testing.sidecar_harness import (
    handoff_figures,
    ownership_intervals,
    read_audit,
    safety_violations,
)

REPO = Path(__file__).resolve().parents[1]
Obj = dict[str, Any]
STREAM = "orders"
WORKERS = 4
RATE = 400  # events/s in all, while every measurement runs
LIGHT_WORKER = ["python3", "-m", "kgroup_pipeline.light_worker", "--drain-timeout", "20"]


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


def kubelet_stats(cluster: Cluster) -> list[Obj]:
    """The kubelet's /stats/summary, asked of the kubelet itself on 127.0.0.1 with the API
    server's kubelet-client certificate (the API server's node proxy refuses loopback
    addresses)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # the kubelet's own cert
    pki = cluster.pki
    ctx.load_cert_chain(str(pki.client_cert("apiserver-kubelet-client")),
                        str(pki.client_key("apiserver-kubelet-client")))
    url = f"https://127.0.0.1:{cluster.ports['kubelet']}/stats/summary"
    with urllib.request.urlopen(url, context=ctx, timeout=30) as resp:
        pods: list[Obj] = json.loads(resp.read()).get("pods", [])
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
                  **group_spec: Any) -> Iterator[tuple[RealGroup, Producer]]:
    namespace = f"bench-real-{kind[:3].lower()}-{partitions}-{secrets.token_hex(2)}"
    with RedisServer() as server:
        url = f"redis://127.0.0.1:{server.port}/0"
        g = RealGroup(cluster, admin_api_client(cluster), namespace,
                      release=f"kgroup-{secrets.token_hex(2)}", redis_url=url,
                      audit=REPO / ".state" / "bench" / namespace / "audit", kind=kind)
        g.install()
        try:
            g.apply(partitions=partitions, replicas=workers, command=LIGHT_WORKER,
                    stream=STREAM, http_probes_on=http_probes_on, **group_spec)
            with Producer(url, partitions) as producer:
                g.wait_settled(workers, timeout=300)
                yield g, producer
        finally:
            g.uninstall()
            g.delete_namespace()


def owned_by(g: RealGroup, pod: str) -> list[int]:
    return sorted(p for p, h in g.holders().items() if h == pod)


def sink_offsets(r: redis.Redis, parts: list[int]) -> dict[int, str | None]:
    k = StreamKeys(STREAM)
    return {p: r.hget(k.sink_partition(p), "offset") for p in parts}  # type: ignore[misc]


def rollout(g: RealGroup, partitions: int) -> Obj:
    """One `kubectl rollout restart` of the workers, measured from the ownership audit."""
    assert g.audit is not None
    epoch0 = int((g.settled(WORKERS) or {}).get("epoch", 0))
    t0 = time.monotonic()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    g.kubectl("rollout", "restart", g.workload)
    g.kubectl("rollout", "status", g.workload, "--timeout=600s", timeout=620)
    t_done = time.monotonic()
    status = g.wait_settled(WORKERS, timeout=300)
    t1 = time.monotonic()
    intervals = ownership_intervals(read_audit(sorted(g.audit.glob("*.jsonl"))), now=t1)
    fig: Obj = dict(handoff_figures(intervals, partitions, t0, t1))
    fig["duration_s"] = t_done - t0
    fig["epochs"] = int(status["epoch"]) - epoch0
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


def measure(cluster: Cluster, partitions: int, rounds: int, runs: int,
            kind: str = "Deployment", restart_grace: int | None = None) -> Obj:
    spec: Obj = {} if restart_grace is None else {"restartGraceSeconds": restart_grace}
    out: Obj = {"partitions": partitions, "workers": WORKERS, "rate": RATE, "kind": kind,
                "group_spec": spec or "the example's"}
    started = time.monotonic()
    with group_on_node(cluster, partitions, kind, **spec) as (g, producer):
        r = redis.Redis.from_url(g.redis_url, decode_responses=True)
        assert g.audit is not None
        # rollouts first: the audit's intervals are cut by nothing but handoffs then
        rolls = []
        for _ in range(runs):
            rolls.append(rollout(g, partitions))
            print(f"[real-node] {kind} x {partitions} partitions: rollout {rolls[-1]}",
                  flush=True)
        out["rollout"] = rolls
        if kind == "Deployment" and rounds > 0:
            failures(cluster, g, r, rounds, out)
        finish(g, r, producer, out, killed_at=out.pop("killed_at", {}))
    out["seconds"] = time.monotonic() - started
    return out


def failures(cluster: Cluster, g: RealGroup, r: redis.Redis, rounds: int, out: Obj) -> None:
    """Resources while stable, then container crashes and pod deletions (Deployment)."""
    out["resources"] = resources(cluster, g.namespace)
    print(f"[real-node] resources {out['resources']}", flush=True)
    killed_at: dict[str, float] = {}
    for container in ("worker", "kgroup-sidecar"):
        times = []
        for i in range(rounds):
            victim = g.pods()[i % WORKERS].metadata.name
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
            g.wait_settled(WORKERS, timeout=300)
        out[f"crash_{container}"] = times
        print(f"[real-node] SIGKILL {container}: {times}", flush=True)
    times = []
    for i in range(rounds):
        victim = g.pods()[i % WORKERS].metadata.name
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
        g.wait_settled(WORKERS, timeout=300)
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
              "epochs"):
        s[f"rollout_{k}"] = stats([float(x[k]) for x in res["rollout"]])
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    ap.add_argument("--partitions", default="16,64")
    ap.add_argument("--kinds", default="deployment,statefulset",
                    help="the workers: deployment, statefulset or both")
    ap.add_argument("--runs", "--rollouts", dest="runs", type=int, default=3,
                    help="rollouts per size and kind")
    ap.add_argument("--rounds", type=int, default=3,
                    help="crashes and pod deletions of each kind (Deployment; 0: none)")
    ap.add_argument("--restart-grace", type=int, default=None,
                    help="the group's restartGraceSeconds (default: the example's)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "real_node.json")
    args = ap.parse_args(argv)
    cluster = ensure_up(who="bench")
    ensure_on_node(cluster.state_dir)
    results: Obj = {"machine": machine(cluster), "command": " ".join(
        ["bench/bench_real_node.py", *(argv if argv is not None else sys.argv[1:])]),
        "sizes": []}
    ok = True
    kinds = {"deployment": "Deployment", "statefulset": "StatefulSet"}
    for p in (int(x) for x in args.partitions.split(",")):
        for kind in (kinds[k.strip().lower()] for k in args.kinds.split(",")):
            res = measure(cluster, p, args.rounds, args.runs, kind, args.restart_grace)
            res["summary"] = summary(res)
            results["sizes"].append(res)
            ok &= res["verifier"]["clean"] and not res["violations"]
            print(json.dumps(res["summary"], indent=1), flush=True)
            args.out.write_text(json.dumps(results, indent=1) + "\n")  # after each group
    print(f"[real-node] wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
