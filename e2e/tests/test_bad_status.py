"""A bad status edit on the real API server.

An admin's ``kubectl patch cg orders --subresource=status -p
'{"status":{"assignment":{"<member>":"0-99999999"}}}'`` was stored, and within 6 s the
operator and the named member's sidecar were OOM-killed while ``kubectl get cg`` said
Stable. Two layers answer it, each shown here:

- the readers are bounded: with no admission policy installed the write is stored, and
  the operator (same process, memory not grown) writes the status again with a Warning
  Event; the sidecars keep running and the group is Ready again (a real write, a real
  operator process and real sidecar processes on kwok pods);
- the API server refuses it: a table of (request, answer) for status writes, with the
  CRD's own rules and the chart's status policy (``admission-policy-status.yaml``).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from operator_harness import GROUP, OperatorProcess
from test_operator import get_status, make_group, make_pods, operator, status_where

from kgroup import constants as C
from kgroup.core.ranges import parse_ranges
from kgroup_devcluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for
from kgroup_testing.sidecar_harness import SidecarProcess

__all__ = ["operator"]
pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kgroup"
PODS = ("w-0", "w-1")
PARTITIONS = 6


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def patch_status(cluster: Cluster, namespace: str, status: dict[str, Any]) -> Any:
    """``kubectl patch --subresource=status --type=merge`` as an admin would type it (the
    patch goes through a file: one argument may not exceed 128 KiB)."""
    path = cluster.state_dir / f"patch-{secrets.token_hex(4)}.json"
    path.write_text(json.dumps({"status": status}))
    try:
        return cluster.kubectl("patch", "cg", GROUP, "-n", namespace, "--subresource=status",
                               "--type=merge", "--patch-file", str(path), check=False)
    finally:
        path.unlink()


@pytest.fixture
def sidecars(cluster: Cluster, kube: client.ApiClient, operator: OperatorProcess,
             namespace: str, tmp_path: Path) -> Iterator[dict[str, SidecarProcess]]:
    make_group(kube, namespace, partitions=PARTITIONS)
    make_pods(kube, namespace, *PODS)
    procs = {p: SidecarProcess(p, GROUP, namespace, str(cluster.kubeconfig), tmp_path).start()
             for p in PODS}
    try:
        yield procs
    finally:
        for sc in procs.values():
            sc.stop()
    for sc in procs.values():
        assert "Traceback" not in sc.log_text(), sc.log_text()[-4000:]


def _stable(st: dict[str, Any]) -> bool:
    ready: dict[str, Any] = next(
        (c for c in st.get("conditions") or [] if c["type"] == "Ready"), {})
    return st.get("phase") == "Stable" and ready.get("status") == "True"


def test_an_absurd_assignment_leaves_the_operator_and_the_group_working(
        cluster: Cluster, kube: client.ApiClient, namespace: str, operator: OperatorProcess,
        sidecars: dict[str, SidecarProcess]) -> None:
    before = status_where(kube, namespace, "Stable", _stable, timeout=60)
    assert operator.proc is not None
    pid = operator.proc.pid
    sidecar_pids = {p: sc.proc.pid for p, sc in sidecars.items() if sc.proc is not None}
    rss_before = rss_kib(pid)
    member = sorted(before["assignment"])[0]

    out = patch_status(cluster, namespace, {"assignment": {member: "0-99999999"}})
    # no chart policy here: the CRD alone stores it (the table below shows the policy)
    assert out.returncode == 0, out.stderr
    t0 = time.monotonic()

    def repaired() -> dict[str, Any]:
        st = get_status(kube, namespace)
        ranges = st.get("assignment") or {}
        try:
            owned = {p for r in ranges.values() for p in parse_ranges(r, limit=PARTITIONS)}
        except ValueError:
            return {}
        return st if owned == set(range(PARTITIONS)) and _stable(st) else {}

    after = wait_for("the status repaired and the group Stable", repaired, timeout=60)
    repair_s = time.monotonic() - t0
    assert set(after["assignment"]) == set(PODS)
    # the operator: same process, answering its liveness probe, memory not grown
    assert operator.proc.poll() is None and operator.proc.pid == pid
    assert operator.alive()
    rss_after = rss_kib(pid)
    assert rss_after - rss_before < 20 * 1024, (rss_before, rss_after)
    # the sidecars: same processes, every partition held again
    for p, sc in sidecars.items():
        assert sc.alive() and sc.proc is not None and sc.proc.pid == sidecar_pids[p]
    events: Any = client.CoreV1Api(kube).list_namespaced_event(namespace)
    warnings = [e for e in events.items if e.reason == "StatusEditedByHand"]
    assert warnings and warnings[0].type == "Warning", [e.reason for e in events.items]
    assert warnings[0].involved_object.name == GROUP
    print(f"repaired in {repair_s:.2f} s; operator RSS {rss_before} -> {rss_after} KiB; "
          f"event: {warnings[0].message}")


# -- the API server's answers ---------------------------------------------------------------


@pytest.fixture(scope="module")
def status_policy(cluster: Cluster, crd: list[str]) -> Iterator[str]:
    """The chart's status policy, applied alone (cluster-scoped; removed afterwards)."""
    release = f"st-{secrets.token_hex(3)}"
    out = cluster.helm("template", release, str(CHART), "--kube-version", "1.35.4",
                       "--show-only", "templates/admission-policy-status.yaml", check=False)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert {d["kind"] for d in docs} == {"ValidatingAdmissionPolicy",
                                        "ValidatingAdmissionPolicyBinding"}
    text = yaml.safe_dump_all(docs)
    applied = cluster.kubectl("apply", "-f", "-", input=text, check=False)
    assert applied.returncode == 0, applied.stderr
    try:
        yield docs[0]["metadata"]["name"]
    finally:
        cluster.kubectl("delete", "-f", "-", input=text, check=False)


TOO_LONG = ",".join(str(i) for i in range(0, 2 * 60_000, 2))  # 60,000 partitions: 344 KB

# six partitions reshaped to two: numbered 6 and 7
RESHAPED = {"generation": 2, "nextPartition": 8, "generations": [
    {"generation": 1, "placement": "modulo", "partitions": "0-5"},
    {"generation": 2, "placement": "range", "partitions": "6-7", "widths": "1/2*2"}],
    "states": {"open": "6-7", "sealed": "0-5"}}

# (status patch, expected: "allowed" or a piece of the refusal's message)
ROWS: list[tuple[str, dict[str, Any], str]] = [
    ("beyond a reshaped layout's numbers", {"layout": RESHAPED, "assignment": {"w-0": "6-8"}},
     "status.assignment of w-0 names partition 8 but the group numbers its partitions "
     "below 8: a target may name only partitions that exist"),
    ("a reshaped layout's new partitions",
     {"layout": RESHAPED, "assignment": {"w-0": "0-2", "w-1": "6-7"}}, "allowed"),
    ("a typo'd range far beyond spec.partitions",
     {"assignment": {"w-0": "0-99999999"}},
     "status.assignment of w-0 names partition 99999999 but the group has 6 partitions "
     "(0-5): a target may name only partitions that exist"),
    ("one past the end", {"assignment": {"w-0": "0-2", "w-1": "3-6"}},
     "status.assignment of w-1 names partition 6 but the group has 6 partitions"),
    ("a number too long to be a partition", {"assignment": {"w-0": "0-9999999999"}},
     "status.assignment of w-0 must be partition ranges such as 0-3,7,9-12 (numbers of at "
     "most 9 digits, a dash between the ends of a range, commas between ranges), not "
     '"0-9999999999"'),
    ("not ranges at all", {"assignment": {"w-0": "all"}},
     'status.assignment of w-0 must be partition ranges such as 0-3,7,9-12'),
    ("a long malformed value is quoted cut short",
     {"assignment": {"w-0": "0-2,x" + "7" * 200}},
     'not "0-2,x' + "7" * 55 + '..."'),
    ("a member's assigned ranges malformed",
     {"members": [{"name": "w-0", "assigned": "0-9999999999"}]},
     "status.members[].assigned of w-0 must be partition ranges such as 0-3,7,9-12"),
    ("stalled partitions not ranges (the CRD's own rule)", {"stalledPartitions": "1,,2"},
     "status.stalledPartitions must be partition ranges such as 0-3,7,9-12: numbers of at "
     "most 9 digits"),
    ("a stalled partition number too long", {"stalledPartitions": "12345678901"},
     "status.stalledPartitions must be partition ranges"),
    ("longer than any target can be", {"assignment": {"w-0": TOO_LONG}},
     "Too long: may not be more than 300000"),
    ("stalled partitions beyond spec.partitions", {"stalledPartitions": "2,40"},
     "status.stalledPartitions names partition 40 but the group numbers its partitions "
     "below 6"),
    ("a valid target", {"assignment": {"w-0": "0-2", "w-1": "3-5"}}, "allowed"),
    ("valid stalled partitions", {"stalledPartitions": "1,5"}, "allowed"),
]


@pytest.mark.parametrize(("what", "status", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_the_api_server_refuses_a_status_naming_partitions_that_do_not_exist(
        cluster: Cluster, kube: client.ApiClient, namespace: str, status_policy: str,
        what: str, status: dict[str, Any], expected: str) -> None:
    make_group(kube, namespace, partitions=PARTITIONS)

    def answer() -> tuple[int, str] | None:
        t0 = time.monotonic()
        out = patch_status(cluster, namespace, status)
        elapsed = time.monotonic() - t0
        if expected != "allowed" and out.returncode == 0:
            # a new policy takes a moment to load: undo and try again
            patch_status(cluster, namespace, {"assignment": None, "stalledPartitions": None})
            return None
        print(f"{what}: {elapsed * 1000:.0f} ms (kubectl): {out.stderr.strip()[:300]}")
        return out.returncode, out.stderr

    got = wait_for(f"an answer to {what}", answer, timeout=30)
    assert got is not None
    code, stderr = got
    if expected == "allowed":
        assert code == 0, stderr
        st = get_status(kube, namespace)
        assert all(st.get(k) == v for k, v in status.items())
    else:
        assert code != 0 and expected in stderr, stderr
        assert "is invalid" in stderr  # 422 Invalid, not a 403 or a 500
        assert get_status(kube, namespace).get("assignment") in (None, {})


def test_the_status_policy_answers_a_raw_request_with_422(
        cluster: Cluster, kube: client.ApiClient, namespace: str, status_policy: str) -> None:
    """The HTTP answer itself, for the closing note: status code and reason."""
    make_group(kube, namespace, partitions=PARTITIONS)
    api = client.CustomObjectsApi(kube)

    def refused() -> client.ApiException | None:
        try:
            api.patch_namespaced_custom_object_status(
                C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, GROUP,
                {"status": {"assignment": {"w-0": "0-99999999"}}})
        except client.ApiException as exc:
            return exc
        api.patch_namespaced_custom_object_status(
            C.API_GROUP, C.API_VERSION, namespace, C.PLURAL, GROUP,
            {"status": {"assignment": None}})
        return None

    exc = wait_for("a refusal", refused, timeout=30)
    assert exc is not None
    body = json.loads(str(exc.body))
    assert exc.status == 422 and body["reason"] == "Invalid", body
    assert f"ValidatingAdmissionPolicy '{status_policy}'" in body["message"]
    print(exc.status, body["message"])
