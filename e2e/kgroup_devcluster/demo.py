"""`make demo`: the whole of kgroup on this machine, as a newcomer would want to see it.

Starts the local control plane with its real node and a Redis server, builds and loads the
images (`make images`), `helm install`s the chart (the operator in its own container),
applies examples/consumergroup.yaml (16 partitions) and examples/worker-deployment.yaml
with 3 PySpark workers (each pod: the kgroup-sidecar + the Structured Streaming job, real
containers under the kubelet, pod-bound tokens), produces events, scales to 4 workers while
events flow, prints `kubectl get cg` before and after, and the verifier's result.
Everything it started keeps running so the person can look around; `make demo-down`
stops it.

    python -m kgroup_devcluster.demo [up|down] [--events N] [--rate R]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import threading
import time

import redis

from kgroup_pipeline.verify import verify

from . import processes, stack
from .cluster import STATE_DIR, ensure_up, running
from .images import ensure_on_node
from .real_group import APP, GROUP, RealGroup
from .tokens import admin_api_client

NAMESPACE = "kgroup-demo"
RELEASE = "kgroup"
STREAM = "orders"
WORKER = ["python3", "-m", "kgroup_pipeline.worker", "--master", "local[1]",
          "--drain-timeout", "20"]
PARTITIONS = 16
DEMO_DIR = STATE_DIR.parent / "demo"
PIDS = DEMO_DIR / "pids.json"
REDIS_PORT = 6390


def say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def show(title: str, text: str) -> None:
    print(f"\n--- {title} ---\n{text.rstrip()}\n", flush=True)


def _start(name: str, argv: list[str]) -> None:
    """Start a process that outlives the demo command; recorded by PID + argv."""
    records = processes.load_records(PIDS)
    if name in records and processes.is_alive(records[name]):
        return
    records[name] = processes.start(name, argv, log=DEMO_DIR / f"{name}.log")
    processes.save_records(PIDS, records)


def up(*, events: int, rate: int) -> int:
    started = time.monotonic()
    DEMO_DIR.mkdir(parents=True, exist_ok=True)
    if running() is None:
        say("starting the local control plane (etcd, kube-apiserver, controller-manager, "
            "scheduler, kwok) and the real node (containerd + kubelet)")
    cluster = ensure_up(who="cli")
    env_line = (f"export KUBECONFIG={cluster.kubeconfig}\n"
                f"  export PATH={cluster.bin_dir}:$PATH   # kubectl and helm built for it")
    say("make images: operator, sidecar and PySpark worker images from docker/ "
        "(cached by content), loaded into the real node's containerd")
    for b in ensure_on_node(cluster.state_dir):
        say(f"  {b.tag}  {b.size / 1e6:.0f} MB  {'built' if b.built else 'cached'}")

    redis_port = REDIS_PORT
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        r.ping()
        say(f"Redis already running on 127.0.0.1:{redis_port}")
    except redis.ConnectionError:
        say(f"starting redis-server on 127.0.0.1:{redis_port}")
        (DEMO_DIR / "redis").mkdir(exist_ok=True)
        _start("redis", ["redis-server", "--bind", "127.0.0.1", "--port", str(redis_port),
                         "--save", "", "--appendonly", "no", "--dir", str(DEMO_DIR / "redis")])
        stack.wait("Redis", r.ping, timeout=20)

    group = RealGroup(cluster, admin_api_client(cluster), NAMESPACE, release=RELEASE,
                      redis_url=redis_url)
    say(f"helm install {RELEASE} charts/kgroup --namespace {NAMESPACE} "
        "-f e2e/values-real-node.yaml (the operator in its own container on the real node)")
    group.install()
    say(f"kubectl apply: examples/consumergroup.yaml ({PARTITIONS} partitions) + "
        f"examples/worker-deployment.yaml with 3 PySpark workers (each pod: the "
        "kgroup-sidecar + the Structured Streaming job, real containers)")
    group.apply(partitions=PARTITIONS, replicas=3, stream=STREAM, command=WORKER,
                stabilizationWindowSeconds=2, lease={"durationSeconds": 10,
                                                     "renewIntervalSeconds": 2})
    group.wait_settled(3, timeout=600)
    show("kubectl get pods -o wide (real containers on the real node)",
         group.kubectl("get", "pods", "-o", "wide"))

    producing = threading.Event()
    producing.set()
    produced = {"runs": 0}

    def produce() -> None:
        while producing.is_set():
            subprocess.run(
                [sys.executable, "-m", "kgroup_pipeline.producer", "--redis", redis_url,
                 "--stream", STREAM, "--partitions", str(PARTITIONS), "--rate", str(rate),
                 "--count", str(rate * 2), "--keys", "1000"], check=False,
                capture_output=True)
            produced["runs"] += 1

    say(f"producing events at {rate}/s")
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    stack.wait("the first events to be committed", lambda: _committed(r) > 0, timeout=300)
    show("kubectl get cg (3 workers, events flowing)",
         group.kubectl("get", "cg", "-o", "wide"))
    say(f"kubectl scale deployment {APP} --replicas=4 (while events flow; the rollout waits "
        "for the new pod's readiness = it owns its partitions)")
    group.kubectl("scale", "deployment", APP, "--replicas=4")
    after = group.wait_settled(4, timeout=600)
    rebalance = after.get("lastRebalance") or {}
    say(f"rebalanced to epoch {after.get('epoch')}: {rebalance.get('moved')} partitions moved "
        f"({rebalance.get('reason')})")
    while produced["runs"] * rate * 2 < events:
        time.sleep(1)
    producing.clear()
    producer.join(timeout=60)
    show("kubectl get cg (4 workers)", group.kubectl("get", "cg", "-o", "wide"))
    show("kubectl describe cg (status)",
         group.kubectl("describe", "cg", GROUP).split("Events:")[0])

    say("waiting for the workers to commit everything, then running the verifier")
    verifier = [sys.executable, "-m", "kgroup_pipeline.verify", "--redis", redis_url,
                "--stream", STREAM, "--wait", "180"]
    result = subprocess.run(verifier, capture_output=True, text=True, check=False)
    show("python -m kgroup_pipeline.verify", result.stdout + result.stderr)
    wall = time.monotonic() - started
    say(f"done in {wall:.0f} s; verifier exit code {result.returncode} "
        f"({'zero lost, zero duplicated' if result.returncode == 0 else 'PROBLEM'})")
    print(f"""
Look around:
  {env_line}
  kubectl -n {NAMESPACE} get cg,pods,leases
  kubectl -n {NAMESPACE} describe cg {GROUP}
  kubectl -n {NAMESPACE} logs deploy/{APP} -c worker        (or -c kgroup-sidecar)
  kubectl -n {NAMESPACE} rollout restart deployment/{APP}
  kubectl -n {NAMESPACE} scale deployment {APP} --replicas=2
  produce more: {sys.executable} -m kgroup_pipeline.producer --redis {redis_url} \\
      --stream {STREAM} --partitions {PARTITIONS} --rate 1000 --duration 30
  verify:       {" ".join(verifier[:-2])}
Tear down:  make demo-down   (and make cluster-down for the control plane and the node)""")
    return result.returncode


def _committed(r: redis.Redis) -> int:
    """Events the workers' fenced sink has committed so far."""
    return int(verify(r, STREAM).total("committed"))


def down() -> int:
    cluster = running()
    if cluster is not None:
        cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE, check=False)
        # waits for the pods' graceful stop (their partitions handed over), so that a
        # `make demo` right after finds no namespace still terminating
        cluster.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found",
                        "--timeout=180s", check=False, timeout=200)
    # redis-server rewrites its process title, so it is stopped through its own port
    with contextlib.suppress(redis.ConnectionError):
        redis.Redis(host="127.0.0.1", port=REDIS_PORT).shutdown(nosave=True)
        say(f"stopped redis-server on 127.0.0.1:{REDIS_PORT}")
    PIDS.unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kgroup_devcluster.demo")
    ap.add_argument("action", nargs="?", choices=["up", "down"], default="up")
    ap.add_argument("--events", type=int, default=60_000, help="events to produce in all")
    ap.add_argument("--rate", type=int, default=2_000, help="events per second")
    args = ap.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return up(events=args.events, rate=args.rate) if args.action == "up" else down()


if __name__ == "__main__":
    sys.exit(main())
