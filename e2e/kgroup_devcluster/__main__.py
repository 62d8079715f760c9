"""`python -m kgroup_devcluster up|down|status|env`: the Makefile's cluster targets.

Rule: progress goes to stderr and the export line to stdout, so the last line `up`
prints is `export KUBECONFIG=<path>` and `eval "$(python -m kgroup_devcluster up)"` works.
"""

from __future__ import annotations

import argparse
import sys

from .cluster import STATE_DIR, ClusterError, ensure_up, load, running, stop
from .node import NodeError
from .node_images import ImageError


def _export_line(kubeconfig: str) -> str:
    return f"export KUBECONFIG={kubeconfig}"


def cmd_up() -> int:
    was_running = running() is not None
    # Also when it runs: records that the CLI wants the cluster to outlive test sessions.
    cluster = ensure_up(who="cli")
    state = "already running" if was_running else "up"
    print(f"[devcluster] {state} at {cluster.server}", file=sys.stderr)
    print(f"[devcluster] logs: {cluster.log_dir}/<name>.log", file=sys.stderr, flush=True)
    print(_export_line(str(cluster.kubeconfig)), flush=True)
    return 0


def cmd_down() -> int:
    stopped = stop()
    what = ", ".join(stopped) if stopped else "nothing was running"
    print(f"[devcluster] stopped: {what}; removed {STATE_DIR}", file=sys.stderr)
    return 0


def cmd_status() -> int:
    cluster = load()
    if cluster is None:
        print(f"no cluster (no state in {STATE_DIR})")
        return 1
    all_alive = True
    for name, (rec, alive) in cluster.status().items():
        pid = rec.pid if rec is not None else "-"
        all_alive &= alive
        print(f"{name:<24} {'alive' if alive else 'DEAD':<6} pid {pid}")
    print(f"server {cluster.server}  kubeconfig {cluster.kubeconfig}")
    return 0 if all_alive else 1


def cmd_env() -> int:
    cluster = load()
    if cluster is None:
        print(f"no cluster (no state in {STATE_DIR}); run `up` first", file=sys.stderr)
        return 1
    print(_export_line(str(cluster.kubeconfig)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kgroup_devcluster",
                                     description="the local Kubernetes control plane")
    parser.add_argument("command", choices=["up", "down", "status", "env"])
    args = parser.parse_args(argv)
    commands = {"up": cmd_up, "down": cmd_down, "status": cmd_status, "env": cmd_env}
    try:
        return commands[args.command]()
    except (ClusterError, NodeError, ImageError) as e:
        print(f"[devcluster] error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
