"""What GitOps tools make of a ConsumerGroup: the Argo CD health check's test cases, and
the Go checker that runs the real readers.

Two readers, run for real by ``devtools/gitops-health`` (Go):

- kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status; Flux, kpt, cli-utils): the library's
  ``status.Compute``;
- Argo CD: ``gitops/argocd/kgroup.dev/ConsumerGroup/health.lua`` under gopher-lua, as
  Argo CD's controller runs a resource customization.

The test cases of ``health.lua`` (``health_test.yaml`` and ``testdata/*.yaml``, in the
layout of Argo CD's ``resource_customizations``) and the ``argocd-cm`` patch that installs
it (``gitops/argocd/argocd-cm-patch.yaml``) are generated here, the cases from the
operator's own status code (:func:`kgroup.core.operator.status.aggregate_status`), never
written by hand: ``python -m kgroup_devtools.gitops --write`` renders them, ``--check``
exits 1 on drift (a unit test runs it), so a change of the conditions shows up as a
changed test case.
Each :class:`Case` also says what kstatus must answer; ``tests/test_gitops_health.py``
runs both readers on every case.

The checker is built from ``devtools/gitops-health`` (its own go.mod) into
``~/.cache/kgroup/bin/gitops-health-<digest>/`` (``KGROUP_CACHE``), keyed by the digest of
its sources, so a warm call costs a hash of three files; ``--build`` prints its path.
"""

from __future__ import annotations

import argparse
import difflib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from kgroup import constants as C
from kgroup.core.operator.status import MemberLeaseObservation, aggregate_status
from kgroup.crd_models import ConsumerGroupSpec, ConsumerGroupStatus

REPO = Path(__file__).resolve().parents[2]
HEALTH_DIR = REPO / "gitops" / "argocd" / C.API_GROUP / C.KIND
HEALTH_LUA = HEALTH_DIR / "health.lua"
CHECKER_SRC = REPO / "devtools" / "gitops-health"
ARGOCD_CM_PATCH = REPO / "gitops" / "argocd" / "argocd-cm-patch.yaml"
ARGOCD_CM_KEY = f"resource.customizations.health.{C.API_GROUP}_{C.KIND}"

_WALL = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
_TARGET = {"orders-worker-0": [0, 1, 2, 3], "orders-worker-1": [4, 5, 6, 7]}
_HELD = {p: m for m, ps in _TARGET.items() for p in ps}


@dataclass(frozen=True)
class Case:
    """One ConsumerGroup and what each reader must say of it.

    ``argocd``: Argo CD's health status and the condition whose message it shows (or the
    message itself when no condition carries it); ``kstatus``: kstatus' status."""

    name: str
    obj: dict[str, Any]
    argocd: tuple[str, str]
    kstatus: str

    @property
    def argocd_message(self) -> str:
        _, source = self.argocd
        for c in (self.obj.get("status") or {}).get("conditions") or []:
            if c["type"] == source:
                return str(c["message"] or c["reason"])
        return source


def _obj(spec: ConsumerGroupSpec, status: ConsumerGroupStatus | None, *,
         generation: int = 2) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{C.API_GROUP}/{C.API_VERSION}", "kind": C.KIND,
        "metadata": {"name": "orders", "namespace": "orders", "generation": generation},
        "spec": spec.to_wire()}
    if status is not None:
        body["status"] = status.to_wire()
    return body


def _status(spec: ConsumerGroupSpec, *, members: set[str] | None = None,
            acked: Mapping[str, str] | None = None, holders: Mapping[int, str] | None = None,
            target: Mapping[str, list[int]] | None = None, stalled: str = "",
            now: float = 1.0, generation: int = 2,
            bare: tuple[str, ...] = ()) -> ConsumerGroupStatus:
    """The status the operator writes for this observation (epoch 3, 8 partitions)."""
    target = _TARGET if target is None else target
    members = set(target) if members is None else members
    acked = acked or {}
    note = (json.dumps({"stalled": stalled, "stalledCount": 1, "reason": "sink refused token 4"})
            if stalled else None)
    leases = {m: MemberLeaseObservation(m, "s-" + m, acked.get(m, "3"),
                                        note if m == "orders-worker-0" else None)
              for m in members}
    status, _ = aggregate_status(
        spec=spec, generation=generation, previous=ConsumerGroupStatus(), epoch=3,
        target=target, members=members, member_leases=leases,
        holders=_HELD if holders is None else holders, last_change_at=0.0, now=now,
        wall=_WALL, bare_pods=bare)
    return status


def cases() -> list[Case]:
    spec = ConsumerGroupSpec.model_validate({
        "partitions": 8, "selector": {"matchLabels": {"app": "orders-worker"}},
        "lease": {"durationSeconds": 8, "renewIntervalSeconds": 2},
        "handoff": {"drainTimeoutSeconds": 30}})
    paused = spec.model_copy(update={"paused": True})
    moving = {**_HELD, 4: "orders-worker-0"}
    unowned = {p: m for p, m in _HELD.items() if p < 6}
    three = {"orders-worker-0", "orders-worker-1", "orders-worker-2"}
    return [
        Case("settled", _obj(spec, _status(spec)), ("Healthy", "Ready"), "Current"),
        Case("rebalancing-epoch-not-acknowledged",
             _obj(spec, _status(spec, acked={"orders-worker-1": "2"})),
             ("Progressing", "Reconciling"), "InProgress"),
        Case("rebalancing-partitions-moving", _obj(spec, _status(spec, holders=moving)),
             ("Progressing", "Reconciling"), "InProgress"),
        Case("rebalancing-membership-changing", _obj(spec, _status(spec, members=three)),
             ("Progressing", "Reconciling"), "InProgress"),
        Case("unowned-within-the-deadline", _obj(spec, _status(spec, holders=unowned)),
             ("Progressing", "Reconciling"), "InProgress"),
        Case("degraded-partitions-unowned",
             _obj(spec, _status(spec, holders=unowned, now=40.0)),
             ("Degraded", "Stalled"), "Failed"),
        Case("degraded-partitions-stalled", _obj(spec, _status(spec, stalled="1-2")),
             ("Degraded", "Stalled"), "Failed"),
        Case("degraded-bad-member-annotation",
             _obj(spec, _status(spec, acked={"orders-worker-1": "seven"})),
             ("Degraded", "Stalled"), "Failed"),
        Case("pending-no-members",
             _obj(spec, _status(spec, members=set(), target={}, holders={}, now=40.0)),
             ("Progressing", "Ready"), "InProgress"),
        # a labelled pod without the sidecar beside working members: Argo CD's Degraded;
        # kstatus has no word for a working group short of a replica (Current)
        Case("sidecar-missing", _obj(spec, _status(spec, bare=("orders-worker-2",))),
             ("Degraded", "SidecarMissing"), "Current"),
        # without any member: nothing consumes until the pods are replaced (Failed)
        Case("sidecar-missing-no-members",
             _obj(spec, _status(spec, members=set(), target={}, holders={},
                                bare=("orders-worker-0",))),
             ("Degraded", "Stalled"), "Failed"),
        Case("paused", _obj(paused, _status(paused)),
             ("Suspended", "ConsumerGroup is paused (spec.paused): its target assignment "
                           "is frozen"), "Current"),
        Case("paused-and-stalled", _obj(paused, _status(paused, stalled="1-2")),
             ("Degraded", "Stalled"), "Failed"),
        Case("generation-not-observed", _obj(spec, _status(spec, generation=1)),
             ("Progressing", "Waiting for the kgroup operator to observe generation 2"),
             "InProgress"),
        # kstatus reads an object without conditions as Current: before the operator's
        # first write it cannot tell a ConsumerGroup from a kind that has no status
        Case("no-status-yet", _obj(spec, None, generation=1),
             ("Progressing", "Waiting for the kgroup operator to write the status"),
             "Current"),
    ]


def _yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=100)


def render() -> dict[Path, str]:
    """Every generated file: ``testdata/<case>.yaml`` and ``health_test.yaml``."""
    out: dict[Path, str] = {}
    tests = []
    for case in cases():
        path = f"testdata/{case.name}.yaml"
        out[HEALTH_DIR / path] = _yaml(case.obj)
        tests.append({"healthStatus": {"status": case.argocd[0],
                                       "message": case.argocd_message},
                      "inputPath": path})
    out[ARGOCD_CM_PATCH] = argocd_cm_patch(HEALTH_LUA.read_text())
    out[HEALTH_DIR / "health_test.yaml"] = (
        "# Generated by `python -m kgroup_devtools.gitops --write` from the operator's status\n"
        "# code (devtools/kgroup_devtools/gitops.py); run by Argo CD's TestLuaHealthScript\n"
        "# layout and by tests/test_gitops_health.py.\n" + _yaml({"tests": tests}))
    return out


def argocd_cm_patch(script: str) -> str:
    """``argocd-cm`` with the health check under its key: a patch for ``kubectl patch
    --patch-file`` or a Kustomize ``patches`` entry."""
    body = "".join(f"    {line}\n" if line else "\n" for line in script.splitlines())
    return ("# Generated by `python -m kgroup_devtools.gitops --write` from\n"
            f"# {HEALTH_LUA.relative_to(REPO)}. Install (docs/operations.md, \"GitOps health\"):\n"
            f"#   kubectl -n argocd patch configmap argocd-cm --patch-file "
            f"{ARGOCD_CM_PATCH.relative_to(REPO)}\n"
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: argocd-cm\ndata:\n"
            f"  {ARGOCD_CM_KEY}: |\n{body}")


# ---- the Go checker -------------------------------------------------------------------


def _cache() -> Path:
    return Path(os.environ.get("KGROUP_CACHE") or Path.home() / ".cache" / "kgroup") / "bin"


def checker_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(CHECKER_SRC.iterdir()):
        if path.suffix == ".go" or path.name in ("go.mod", "go.sum"):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def checker() -> Path:
    """The checker's binary, built with ``go build`` when the cache has none of this
    digest (one build at a time: a second caller waits, then finds it)."""
    binary = _cache() / f"gitops-health-{checker_digest()}" / "gitops-health"
    if binary.exists():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    with (_cache() / ".gitops-health.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():
            env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}
            tmp = binary.with_name("gitops-health.tmp")
            subprocess.run(["go", "build", "-trimpath", "-o", str(tmp), "."],
                           cwd=CHECKER_SRC, env=env, check=True)
            tmp.rename(binary)
    return binary


def verdicts(*objects: Mapping[str, Any], lua: Path = HEALTH_LUA) -> list[dict[str, Any]]:
    """kstatus' and Argo CD's verdicts on each object (a JSON List is sent to the checker):
    ``[{"name", "generation", "kstatus": {"status", "message"}, "argocd": {...}}]``."""
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    out = subprocess.run([str(checker()), "check", "--lua", str(lua), "-"], input=body,
                         capture_output=True, text=True, check=False, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"gitops-health check failed: {out.stderr.strip()}")
    return [json.loads(line) for line in out.stdout.splitlines()]


def run_health_tests(directory: Path = HEALTH_DIR) -> subprocess.CompletedProcess[str]:
    """``gitops-health test``: every case of ``health_test.yaml`` through ``health.lua``."""
    return subprocess.run([str(checker()), "test", str(directory)], capture_output=True,
                          text=True, check=False, timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kgroup_devtools.gitops",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write the test cases")
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff on drift")
    mode.add_argument("--build", action="store_true", help="build the checker, print its path")
    args = parser.parse_args(argv)
    if args.build:
        print(checker())
        return 0
    files = render()
    if args.write:
        for old in (HEALTH_DIR / "testdata").glob("*.yaml"):
            if old not in files:
                old.unlink()
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        print(f"wrote {len(files)} files under {ARGOCD_CM_PATCH.parent.relative_to(REPO)}")
        return 0
    on_disk = {p: p.read_text() for p in (HEALTH_DIR / "testdata").glob("*.yaml")}
    test_file = HEALTH_DIR / "health_test.yaml"
    for path in (test_file, ARGOCD_CM_PATCH):
        on_disk[path] = path.read_text() if path.exists() else ""
    drift = False
    for path in sorted(set(files) | set(on_disk)):
        want, have = files.get(path, ""), on_disk.get(path, "")
        if want != have:
            drift = True
            sys.stderr.writelines(difflib.unified_diff(
                have.splitlines(keepends=True), want.splitlines(keepends=True),
                fromfile=f"{path} (checked in)", tofile=f"{path} (generated)"))
    if drift:
        print("\nthe Argo CD test cases are out of date: run "
              "`python -m kgroup_devtools.gitops --write`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
