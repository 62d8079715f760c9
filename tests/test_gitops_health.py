"""What GitOps tools read from a ConsumerGroup, with the real readers: kstatus' library
and Argo CD's health.lua under gopher-lua (the Go checker ``devtools/gitops-health``, built
once into the cache). The objects are the operator's own statuses
(:mod:`kgroup_devtools.gitops`, generated from ``aggregate_status``); no cluster.

The checks fail on broken variants, shown here: a health.lua without its Stalled branch
fails its Argo CD test cases, and the status the operator wrote before the kstatus
conditions (Stalled only for stalled partitions, no Reconciling) is read by kstatus as
InProgress where the group is degraded.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
from kgroup_devtools import gitops

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="go: the checker is built")

CASES = {c.name: c for c in gitops.cases()}


def test_the_argo_cd_test_cases_are_the_operators_current_statuses() -> None:
    assert gitops.main(["--check"]) == 0, "run python -m kgroup_devtools.gitops --write"


def test_health_lua_passes_its_argo_cd_test_cases() -> None:
    out = gitops.run_health_tests()
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("\nok ") + out.stdout.startswith("ok ") == len(CASES)


def test_each_reader_gives_each_group_state_its_verdict() -> None:
    got = gitops.verdicts(*(c.obj for c in CASES.values()))
    assert len(got) == len(CASES)
    for case, verdict in zip(CASES.values(), got, strict=True):
        assert verdict["kstatus"]["status"] == case.kstatus, case.name
        assert (verdict["argocd"]["status"], verdict["argocd"]["message"]) == (
            case.argocd[0], case.argocd_message), case.name
    # the readers agree wherever kstatus has a word for the state: it has none for a
    # working group short of a replica (a labelled pod without the sidecar beside members)
    words = {"Current": {"Healthy", "Suspended"}, "InProgress": {"Progressing"},
             "Failed": {"Degraded"}}
    for case, verdict in zip(CASES.values(), got, strict=True):
        if case.name not in ("no-status-yet", "sidecar-missing"):
            assert verdict["argocd"]["status"] in words[verdict["kstatus"]["status"]], case.name


def without_branch(tmp_path: Path, condition: str) -> tuple[Path, list[str]]:
    """A copy of the health check without its branch for ``condition`` True, and the test
    cases it then fails (its test run must fail)."""
    broken = tmp_path / "ConsumerGroup"
    shutil.copytree(gitops.HEALTH_DIR, broken)
    script = (broken / "health.lua").read_text()
    start = script.index(f'if says("{condition}", "True") then')
    end = script.index("end\n", start) + len("end\n")
    (broken / "health.lua").write_text(script[:start] + script[end:])
    out = gitops.run_health_tests(broken)
    assert out.returncode == 1
    return broken, sorted(line.split()[1].rstrip(":") for line in out.stdout.splitlines()
                          if line.startswith("FAIL"))


def test_a_health_lua_without_its_sidecar_missing_branch_fails_its_test_case(
        tmp_path: Path) -> None:
    broken, failed = without_branch(tmp_path, "SidecarMissing")
    # beside members the group reads Healthy without the branch; with none, Stalled
    # already says Degraded
    assert failed == ["testdata/sidecar-missing.yaml"]
    (verdict,) = gitops.verdicts(CASES["sidecar-missing"].obj, lua=broken / "health.lua")
    assert verdict["argocd"]["status"] == "Healthy"


def test_labelled_pods_without_the_sidecar_fail_a_group_for_kstatus_only_without_members(
        ) -> None:
    bare, alone = gitops.verdicts(CASES["sidecar-missing"].obj,
                                  CASES["sidecar-missing-no-members"].obj)
    assert bare["kstatus"]["status"] == "Current"
    assert alone["kstatus"]["status"] == "Failed"
    assert "orders-worker-0" in alone["kstatus"]["message"]


def test_a_health_lua_without_its_stalled_branch_fails_its_test_cases(tmp_path: Path) -> None:
    _, failed = without_branch(tmp_path, "Stalled")
    assert failed == ["testdata/degraded-bad-member-annotation.yaml",
                      "testdata/degraded-partitions-stalled.yaml",
                      "testdata/degraded-partitions-unowned.yaml",
                      "testdata/paused-and-stalled.yaml",
                      "testdata/sidecar-missing-no-members.yaml"]


def _as_before(obj: dict[str, Any]) -> dict[str, Any]:
    """The status as written before the kstatus conditions: no Reconciling, and Stalled
    only for partitions their app reports stalled."""
    old = copy.deepcopy(obj)
    conds = old["status"]["conditions"]
    conds[:] = [c for c in conds if c["type"] != "Reconciling"]
    for c in conds:
        if c["type"] == "Stalled" and c["reason"] != "PartitionsStalled":
            c.update(status="False", reason="Progressing")
    return old


def test_the_status_before_the_kstatus_conditions_reads_as_in_progress_when_degraded() -> None:
    degraded = [CASES["degraded-partitions-unowned"], CASES["degraded-bad-member-annotation"]]
    now = gitops.verdicts(*(c.obj for c in degraded))
    before = gitops.verdicts(*(_as_before(c.obj) for c in degraded))
    assert [v["kstatus"]["status"] for v in now] == ["Failed", "Failed"]
    assert [v["kstatus"]["status"] for v in before] == ["InProgress", "InProgress"]


def test_the_checker_is_cached_by_the_digest_of_its_sources() -> None:
    first = gitops.checker()
    assert first.parent.name == f"gitops-health-{gitops.checker_digest()}"
    assert gitops.checker() == first and first.stat().st_mtime == gitops.checker().stat().st_mtime
