"""`make demo`: the whole of kgroup on this machine, as a newcomer would want to see it.

Starts the local control plane and a Redis server, `helm install`s the chart, creates a
ConsumerGroup of 16 partitions and a Deployment of 3 PySpark workers (each pod: the
kgroup-sidecar + the Structured Streaming job, run as processes by the local runner with
pod-bound tokens), produces events, scales to 4 workers while events flow, prints
`kubectl get cg` before and after, and the verifier's result. Everything it started keeps
running so the person can look around; `make demo-down` stops it.

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
from kubernetes import client

from . import processes, stack
from .cluster import STATE_DIR, ensure_up, running
from .tokens import admin_api_client

NAMESPACE = "kgroup-demo"
RELEASE = "kgroup"
GROUP = "orders"
APP = "orders-worker"
STREAM = "orders"
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
            "scheduler, kwok)")
    cluster = ensure_up(who="cli")
    env_line = (f"export KUBECONFIG={cluster.kubeconfig}\n"
                f"  export PATH={cluster.bin_dir}:$PATH   # kubectl and helm built for it")
    api = admin_api_client(cluster)
    core = client.CoreV1Api(api)

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

    if not core.list_namespace(field_selector=f"metadata.name={NAMESPACE}").items:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    say(f"helm install {RELEASE} charts/kgroup --namespace {NAMESPACE}")
    stack.helm_install(cluster, release=RELEASE, namespace=NAMESPACE)
    say("starting the local pod runner (plays the container runtime for kwok's pods)")
    _start("runner", stack.runner_argv(namespace=NAMESPACE, state_dir=DEMO_DIR))

    say(f"kubectl apply: ConsumerGroup {GROUP} ({PARTITIONS} partitions) + "
        f"Deployment {APP} (3 PySpark workers, each with the kgroup-sidecar)")
    spec = stack.GroupSpec(
        name=GROUP, app_label=APP, partitions=PARTITIONS, replicas=3,
        app_command=["python", "-m", "kgroup_pipeline.worker", "--master", "local[1]",
                     "--drain-timeout", "20"],
        stream=STREAM, redis_url=redis_url, stabilization_window=2, lease_duration=10,
        renew_interval=2, drain_timeout=30, termination_grace=45)
    stack.apply(cluster, stack.manifests(spec, NAMESPACE))
    watcher = stack.GroupWatcher(api, NAMESPACE, GROUP)
    stack.wait("the group to be Stable with 3 members", lambda: watcher.stable_with(3),
               timeout=300)

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
    time.sleep(10)
    show("kubectl get cg (3 workers, events flowing)",
         cluster.kubectl("-n", NAMESPACE, "get", "cg", "-o", "wide").stdout)
    say(f"kubectl scale deployment {APP} --replicas=4 (while events flow)")
    cluster.kubectl("-n", NAMESPACE, "scale", "deployment", APP, "--replicas=4")
    after = stack.wait("the group to be Stable with 4 members", lambda: watcher.stable_with(4),
                       timeout=300)
    rebalance = after.get("lastRebalance") or {}
    say(f"rebalanced to epoch {after.get('epoch')}: {rebalance.get('moved')} partitions moved "
        f"({rebalance.get('reason')})")
    while produced["runs"] * rate * 2 < events:
        time.sleep(1)
    producing.clear()
    producer.join(timeout=60)
    show("kubectl get cg (4 workers)",
         cluster.kubectl("-n", NAMESPACE, "get", "cg", "-o", "wide").stdout)
    show("kubectl describe cg (status)",
         cluster.kubectl("-n", NAMESPACE, "describe", "cg", GROUP).stdout.split("Events:")[0])

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
  kubectl -n {NAMESPACE} scale deployment {APP} --replicas=2
  logs of every pod's processes: {DEMO_DIR}/pods/<namespace>_<pod>/<container>.log
  produce more: {sys.executable} -m kgroup_pipeline.producer --redis {redis_url} \\
      --stream {STREAM} --partitions {PARTITIONS} --rate 1000 --duration 30
  verify:       {" ".join(verifier[:-2])}
Tear down:  make demo-down   (and make cluster-down for the control plane)""")
    return result.returncode


def down() -> int:
    cluster = running()
    if cluster is not None:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE, check=False)
    records = processes.load_records(PIDS)
    if "runner" in records and processes.stop(records["runner"], grace=60):
        say(f"stopped the pod runner and its pods' processes (pid {records['runner'].pid})")
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
