"""Chaos on the full stack: faults while events flow, then the verifier and the audit.

Rule: seeded (``--seed``): the same seed draws the same sequence of faults. The stack is
the one a user installs (helm chart: operator, RBAC, admission policy; the local runner
runs every pod's containers as processes with pod-bound tokens; sidecar + light worker
per pod; events through a private redis-server). For ``--seconds`` it injects, at random:

- ``delete_pod``: delete a worker pod (graceful: SIGTERM, the grace period, SIGKILL);
- ``sigkill``: SIGKILL every process of a worker pod (the runner restarts them);
- ``sigstop``: SIGSTOP a worker pod's processes for longer than the lease, then SIGCONT
  (the sidecar must have fenced itself; a zombie's late commit is refused by its token);
- ``scale``: the Deployment to 3..5 replicas;
- ``operator_restart``: delete the operator's pod;
- ``apiserver_restart``: once, half-way (``Cluster.restart_apiserver``);
- hand edits an admin makes (drawn too unless ``--no-hand-edits``): ``lock_deleted`` (``kubectl
  delete lease`` of a held partition lock: the operator creates it again, its holder
  loses it, the next owner's token is the new Lease's resourceVersion, above the old) and
  ``group_reapplied`` (``kubectl delete cg``, then ``kubectl apply`` of the same group: the
  garbage collector deletes its Leases, the workers keep running, and the new tokens are
  above every token the fenced sink holds, so nothing is refused as a zombie for ever).

A lock deleted under its holder is taken without its consent: until the holder sees the
deletion, it and the next owner may both be active, and only the token protects the data
(the sink refuses the older one). The audit counts such overlaps apart
(``revoked_overlaps``); any other overlap is a safety violation.

Then the faults stop, the producer stops, the group must come back Stable, and the report
holds the verifier's totals (lost, duplicated), the audit's safety violations (overlapping
active ownership) and the count of each fault. ``run`` is also the body of
``e2e/tests/test_chaos.py``.

    .venv/bin/python bench/chaos.py [--seconds 300] [--seed 1] [--no-hand-edits]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import redis
import yaml
from kubernetes import client

from kgroup_devcluster.cluster import Cluster
from kgroup_pipeline.redis_server import RedisServer
from kgroup_pipeline.verify import render, verify
from kgroup_testing.sidecar_harness import (
    Interval,
    interval_violations,
    ownership_intervals,
    read_audit,
)

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "kgroup"
GROUP, STREAM, APP = "orders", "orders", "orders-worker"
PARTITIONS = 16
LEASE, RENEW = 4, 1
FAULTS = ("delete_pod", "sigkill", "sigstop", "scale", "operator_restart")
HAND_EDITS = ("lock_deleted", "group_reapplied")


@dataclass
class Chaos:
    cluster: Cluster
    api: client.ApiClient
    seed: int
    ns: str = field(default_factory=lambda: f"chaos-{secrets.token_hex(3)}")
    counts: Counter[str] = field(default_factory=Counter)
    killed_at: dict[str, float] = field(default_factory=dict)
    producing: threading.Event = field(default_factory=threading.Event)
    produced_runs: int = 0
    producer_errors: list[str] = field(default_factory=list)
    replicas: int = 3
    revoked: list[tuple[int | None, float]] = field(default_factory=list)  # (partition, mono)
    redis_url: str = ""
    deleted_locks: list[tuple[int, int, str]] = field(default_factory=list)  # p, token, holder
    deleted_at: list[float] = field(default_factory=list)  # monotonic, as the audit's

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.custom: Any = client.CustomObjectsApi(self.api)
        self.state = REPO / ".state" / "chaos" / self.ns

    # ---- reading ---------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        obj = self.custom.get_namespaced_custom_object(
            "kgroup.dev", "v1alpha1", self.ns, "consumergroups", GROUP)
        return dict(obj.get("status") or {})

    def stable_with(self, members: int) -> dict[str, Any] | None:
        st = self.status()
        ok = (st.get("phase") == "Stable" and st.get("memberCount") == members
              and st.get("unowned") == 0
              and all(m.get("ownedCount") == m.get("assignedCount")
                      and m.get("acknowledgedEpoch") == st.get("epoch")
                      for m in st.get("members", [])))
        return st if ok else None

    def workers(self) -> list[str]:
        pods: Any = self.core.list_namespaced_pod(self.ns, label_selector=f"app={APP}")
        return sorted(p.metadata.name for p in pods.items if p.metadata.deletion_timestamp is None)

    def runner_state(self) -> dict[str, Any]:
        path = self.state / "runner.json"
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            return {}

    def pids(self, pod: str) -> list[int]:
        containers = (self.runner_state().get(f"{self.ns}/{pod}") or {}).get("containers", {})
        return [c["pid"] for c in containers.values() if c.get("pid")]

    # ---- faults ----------------------------------------------------------------------
    def fault(self, kind: str) -> None:
        pods = self.workers()
        if kind in ("delete_pod", "sigkill", "sigstop") and not pods:
            return
        if kind == "delete_pod":
            self.core.delete_namespaced_pod(self.rng.choice(pods), self.ns)
        elif kind == "sigkill":
            # one SIGKILL per pod name: the audit ends the pod's sessions begun before its
            # kill time (taken once the signals are sent: no later line of theirs)
            fresh = [p for p in pods if p not in self.killed_at]
            if not fresh:
                return self.fault("delete_pod")
            victim = self.rng.choice(fresh)
            for pid in self.pids(victim):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.killed_at[victim] = time.monotonic()
        elif kind == "sigstop":
            victim = self.rng.choice(pods)
            pids = self.pids(victim)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            time.sleep(LEASE + 2)  # the fault's own length: longer than the lease
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        elif kind == "scale":
            self.replicas = self.rng.randint(3, 5)
            self.apps.patch_namespaced_deployment_scale(
                APP, self.ns, {"spec": {"replicas": self.replicas}})
        elif kind == "operator_restart":
            ops: Any = self.core.list_namespaced_pod(
                self.ns, label_selector="app.kubernetes.io/component=operator")
            for pod in ops.items:
                self.core.delete_namespaced_pod(pod.metadata.name, self.ns)
        elif kind == "apiserver_restart":
            self.cluster.restart_apiserver()
        elif kind == "lock_deleted":
            self.delete_lock()
        elif kind == "group_reapplied":
            self.reapply_group()
        self.counts[kind] += 1

    def locks(self) -> dict[int, dict[str, Any]]:
        """The group's partition Leases now, by partition (as JSON)."""
        coord = client.CoordinationV1Api(self.api)
        leases: Any = coord.list_namespaced_lease(
            self.ns, label_selector=f"kgroup.dev/group={GROUP},kgroup.dev/role=partition")
        out: dict[int, dict[str, Any]] = {}
        for lease in leases.items:
            body = cast(Any, self.api).sanitize_for_serialization(lease)
            out[int(body["metadata"]["labels"]["kgroup.dev/partition"])] = body
        return out

    def delete_lock(self, partition: int | None = None) -> int:
        """kubectl delete lease <group>-partition-<p> (a held one, drawn by the seed)."""
        if partition is None:
            held = sorted(p for p, b in self.locks().items()
                          if (b.get("spec") or {}).get("holderIdentity"))
            partition = self.rng.choice(held or list(range(PARTITIONS)))
        lock = self.locks().get(partition) or {"metadata": {}}
        at = time.monotonic()
        client.CoordinationV1Api(self.api).delete_namespaced_lease(
            f"{GROUP}-partition-{partition}", self.ns)  # gone already: NotFound, not counted
        self.deleted_locks.append((partition, tokens_of({partition: lock})[partition],
                                   (lock.get("spec") or {}).get("holderIdentity") or ""))
        self.revoked.append((partition, at))
        self.deleted_at.append(at)
        return partition

    def reapply_group(self) -> None:
        """kubectl delete cg, wait until it is gone, kubectl apply it again."""
        self.revoked.append((None, time.monotonic()))
        self.custom.delete_namespaced_custom_object(
            "kgroup.dev", "v1alpha1", self.ns, "consumergroups", GROUP)
        wait_for("the ConsumerGroup to be gone", lambda: not any(
            g["metadata"]["name"] == GROUP for g in self.custom.list_namespaced_custom_object(
                "kgroup.dev", "v1alpha1", self.ns, "consumergroups")["items"]), 30)
        done = self.cluster.kubectl("apply", "-f", "-",
                                    input=yaml.safe_dump(self.manifests(self.redis_url)[0]),
                                    check=False)
        if done.returncode != 0:
            raise RuntimeError(f"kubectl apply: {done.stderr}")

    # ---- the stack ---------------------------------------------------------------------
    def manifests(self, redis_url: str) -> list[dict[str, Any]]:
        group = {
            "apiVersion": "kgroup.dev/v1alpha1", "kind": "ConsumerGroup",
            "metadata": {"name": GROUP, "namespace": self.ns},
            "spec": {"partitions": PARTITIONS, "selector": {"matchLabels": {"app": APP}},
                     "stabilizationWindowSeconds": 1, "stabilizationMaxDelaySeconds": 5,
                     "lease": {"durationSeconds": LEASE, "renewIntervalSeconds": RENEW},
                     "handoff": {"drainTimeoutSeconds": 8},
                     "source": {"stream": STREAM, "redisUrl": redis_url}}}
        env = [{"name": "KGROUP_REDIS_URL", "value": redis_url},
               {"name": "KGROUP_STREAM", "value": STREAM}]
        sidecar = {
            "name": "kgroup-sidecar", "image": "kgroup-sidecar:dev", "restartPolicy": "Always",
            "command": ["kgroup-sidecar"],
            "env": [{"name": "KGROUP_GROUP", "value": GROUP},
                    {"name": "KGROUP_NAMESPACE",
                     "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "KGROUP_POD_NAME",
                     "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    # Events name the pod by uid (the Events policy refuses them without),
                    # and the sidecar takes only locks marked for this pod's uid
                    {"name": "KGROUP_POD_UID",
                     "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                    {"name": "KGROUP_LISTEN", "value": "127.0.0.1:8470"}]}
        app = {"name": "worker", "image": "kgroup-worker:dev",
               "command": ["python", "-m", "kgroup_pipeline.light_worker",
                           "--drain-timeout", "6"],
               "env": [*env, {"name": "KGROUP_SIDECAR_URL", "value": "http://127.0.0.1:8470"}]}
        deployment = {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": APP, "namespace": self.ns},
            "spec": {"replicas": self.replicas, "selector": {"matchLabels": {"app": APP}},
                     "template": {"metadata": {"labels": {"app": APP}},
                                  "spec": {"serviceAccountName": "kgroup-worker",
                                           "terminationGracePeriodSeconds": 15,
                                           "initContainers": [sidecar], "containers": [app]}}}}
        return [group, deployment]

    def produce(self, redis_url: str) -> None:
        while self.producing.is_set():
            done = subprocess.run(
                [sys.executable, "-m", "kgroup_pipeline.producer", "--redis", redis_url,
                 "--stream", STREAM, "--partitions", str(PARTITIONS), "--rate", "300",
                 "--count", "300", "--keys", "200"], capture_output=True, text=True)
            self.produced_runs += 1
            if done.returncode != 0:
                self.producer_errors.append(done.stderr[-1000:])


def wait_for(what: str, cond: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond()
        except Exception as exc:  # the API server restarting
            last = exc
        else:
            if last:
                return last
        time.sleep(0.5)
    raise TimeoutError(f"timed out waiting for {what} (last: {str(last)[:300]})")


def run(cluster: Cluster, api: client.ApiClient, *, seconds: float, seed: int,
        apiserver_restart: bool = True, hand_edits: bool = False,
        script: tuple[str, ...] = (), log: Any = print) -> dict[str, Any]:
    """``hand_edits``: draw HAND_EDITS too; ``script``: inject these faults in this order
    (one per gap) instead of drawing, for ``seconds`` at least."""
    ch = Chaos(cluster, api, seed)
    kinds = FAULTS + HAND_EDITS if hand_edits else FAULTS
    ch.state.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    ch.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ch.ns)))
    accounts: Any = ch.core.list_namespaced_service_account
    wait_for("the default ServiceAccount", lambda: any(
        sa.metadata.name == "default" for sa in accounts(ch.ns).items), 60)
    redis_server = RedisServer().start()
    redis_url = ch.redis_url = f"redis://127.0.0.1:{redis_server.port}/0"
    release = f"kgroup-{secrets.token_hex(2)}"
    runner: subprocess.Popen[bytes] | None = None
    producer: threading.Thread | None = None
    report: dict[str, Any] = {"seed": seed, "seconds": seconds, "namespace": ch.ns}
    try:
        out = cluster.helm(
            "install", release, str(CHART), "--namespace", ch.ns, "--take-ownership",
            "--set", f"operator.watchNamespaces={{{ch.ns}}}",
            "--set", f"workerRbac.namespaces={{{ch.ns}}}",
            "--set", f"admissionPolicy.namespaces={{{ch.ns}}}",
            "--set", "operator.image.repository=kgroup-operator",
            "--set", "operator.image.tag=dev", "--wait=false", check=False)
        if out.returncode != 0:
            raise RuntimeError(f"helm install: {out.stderr}")
        with open(ch.state / "runner.log", "ab") as runner_log:
            runner = subprocess.Popen(
                [sys.executable, "-m", "kgroup_devcluster.runner", "--namespace", ch.ns,
                 "--state-dir", str(ch.state), "--audit-dir", str(ch.state / "audit"),
                 "--env", "KGROUP_METRICS_HOST=127.0.0.1", "--env", "KGROUP_METRICS_PORT=0",
                 "--env", "KGROUP_LIVENESS_PORT=0"],
                stdout=runner_log, stderr=subprocess.STDOUT)
        for doc in ch.manifests(redis_url):
            done = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=False)
            if done.returncode != 0:
                raise RuntimeError(f"kubectl apply: {done.stderr}")
        ch.producing.set()
        producer = threading.Thread(target=ch.produce, args=(redis_url,), daemon=True)
        producer.start()
        wait_for("Stable with 3 members", lambda: ch.stable_with(3), 150)
        report["setup_s"] = round(time.monotonic() - started, 1)
        log(f"chaos {ch.ns}: stable after {report['setup_s']} s; faults for {seconds:g} s")

        t_faults = time.monotonic()
        report["tokens_before"] = tokens_of(ch.locks())
        restart_at = t_faults + seconds / 2 if apiserver_restart else None
        pending = list(script)
        while time.monotonic() - t_faults < seconds or pending:
            if restart_at is not None and time.monotonic() >= restart_at:
                kind, restart_at = "apiserver_restart", None
            elif script:
                if not pending:
                    break
                kind = pending.pop(0)
            else:
                kind = ch.rng.choice(kinds)
            try:
                ch.fault(kind)
            except Exception as exc:  # an API call during the API server's restart
                ch.counts[f"{kind}_failed"] += 1
                log(f"  fault {kind} failed: {type(exc).__name__}")
            time.sleep(ch.rng.uniform(2.0, 6.0))  # the gap between faults is part of the draw
        report["faults"] = dict(sorted(ch.counts.items()))
        log(f"  faults injected: {report['faults']}")

        t_settle = time.monotonic()
        ch.producing.clear()
        producer.join(timeout=60)
        ch.apps.patch_namespaced_deployment_scale(APP, ch.ns, {"spec": {"replicas": 3}})
        wait_for("Stable with 3 members after the faults", lambda: ch.stable_with(3), 180)
        report["tokens_after"] = tokens_of(ch.locks())
        report["deleted_locks"] = ch.deleted_locks
        report["deleted_locks_retaken_higher"] = all(
            report["tokens_after"].get(p, 0) > t for p, t, _ in ch.deleted_locks)
        r = redis.Redis.from_url(redis_url, decode_responses=True)
        rep = wait_for("the workers to catch up", lambda: (x := verify(r, STREAM)).caught_up
                       and x, 120)
        report["settle_s"] = round(time.monotonic() - t_settle, 1)
        report["produced"] = rep.total("produced")
        report["committed"] = rep.total("committed")
        report["lost"] = rep.total("lost")
        report["duplicated"] = rep.total("duplicated")
        report["out_of_order"] = rep.total("out_of_order")
        report["verifier_clean"] = rep.clean
        report["verifier"] = render(rep)
        audit = read_audit(sorted((ch.state / "audit").glob("*.jsonl")))
        report["audit_acquisitions"] = sum(rec["event"] == "acquire" for rec in audit)
        report["audit_fences"] = sum(rec["event"] == "fence" for rec in audit)
        report["audit_lost"] = sum(rec["event"] == "lost" for rec in audit)
        report["deleted_lock_timings"] = deleted_lock_timings(
            audit, ch.deleted_locks, ch.deleted_at)
        report["max_token_before"] = max(report["tokens_before"].values(), default=0)
        report["tokens_went_back"] = sorted(
            p for p, t in report["tokens_after"].items()
            if t < report["tokens_before"].get(p, 0))
        report["zombie_refused"] = rep.zombie_refused
        everything, left = audit_violations(audit, killed_at=ch.killed_at,
                                            revoked=ch.revoked, now=time.monotonic())
        report["revoked_overlaps"] = len(everything) - len(left)
        report["safety_violations"] = left
        report["producer_errors"] = ch.producer_errors[:3]
        report["total_s"] = round(time.monotonic() - started, 1)
        return report
    finally:
        ch.producing.clear()
        if producer is not None:
            producer.join(timeout=60)
        if runner is not None:
            runner.send_signal(signal.SIGTERM)
            try:
                runner.wait(timeout=40)
            except subprocess.TimeoutExpired:
                runner.kill()
                runner.wait(5)
        cluster.helm("uninstall", release, "--namespace", ch.ns, check=False)
        with contextlib.suppress(client.ApiException):
            ch.core.delete_namespace(ch.ns)
        redis_server.stop()


def tokens_of(locks: dict[int, dict[str, Any]]) -> dict[int, int]:
    """The fencing token of every partition lock (0: never acquired)."""
    return {p: int((b["metadata"].get("annotations") or {}).get("kgroup.dev/token") or 0)
            for p, b in sorted(locks.items())}


def deleted_lock_timings(audit: list[dict[str, Any]], deleted: list[tuple[int, int, str]],
                         at: list[float]) -> list[dict[str, Any]]:
    """Per deleted lock: seconds until its holder's sidecar reported it lost (None: never)
    and until the partition was acquired again, with that token."""
    out = []
    for (p, token, holder), t in zip(deleted, at, strict=True):
        lost = [float(r["mono"]) - t for r in audit if r["event"] == "lost"
                and r.get("partition") == p and r.get("member") == holder
                and float(r["mono"]) >= t]
        again = sorted((float(r["mono"]) - t, int(r["token"])) for r in audit
                       if r["event"] == "acquire" and r.get("partition") == p
                       and float(r["mono"]) >= t)
        out.append({"partition": p, "old_token": token,
                    "lost_after_s": round(min(lost), 3) if lost else None,
                    "retaken_after_s": round(again[0][0], 3) if again else None,
                    "new_token": again[0][1] if again else None})
    return out


def revoked_at(intervals: list[Interval],
               revoked: list[tuple[int | None, float]]) -> list[Interval]:
    """Each ownership interval ended at the first deletion of its lock (by hand, or with
    its group: partition None) after it began, if that came before its own end: from then
    on the token fences it. An interval that had ended already is left as it was."""
    out = []
    for iv in intervals:
        cuts = [at for p, at in revoked if (p is None or p == iv.partition) and at > iv.start]
        out.append(replace(iv, end=min([iv.end, *cuts])))
    return out


def audit_violations(audit: list[dict[str, Any]], *, killed_at: dict[str, float],
                     revoked: list[tuple[int | None, float]],
                     now: float) -> tuple[list[str], list[str]]:
    """The audit's overlaps of active ownership and token regressions: (all of them, those
    left once ownership of a revoked lock ends at its deletion). A session's ownership ends
    at its own end (release, lost, fence's ``until``, or its process's SIGKILL in
    ``killed_at``), then at a revocation if that came first; still running: ``now``."""
    intervals = ownership_intervals(audit, ended_at=killed_at, now=now)
    return interval_violations(intervals), interval_violations(revoked_at(intervals, revoked))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-apiserver-restart", action="store_true")
    ap.add_argument("--no-hand-edits", action="store_true",
                    help="do not draw lock_deleted and group_reapplied")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from stage import cluster as get_cluster

    from kgroup_devcluster.tokens import admin_api_client
    cl = get_cluster()
    report = run(cl, admin_api_client(cl), seconds=args.seconds, seed=args.seed,
                 apiserver_restart=not args.no_apiserver_restart, hand_edits=not args.no_hand_edits)
    print(report.pop("verifier"))
    print(json.dumps(report, indent=1))
    ok = (report["lost"] == 0 and report["duplicated"] == 0 and report["verifier_clean"]
          and not report["safety_violations"])
    print("chaos: PASS" if ok else "chaos: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
