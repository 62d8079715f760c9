"""Chaos, CI-sized: 45 s of seeded faults on the full stack, then nothing lost.

The body is ``bench/chaos.py`` (``make chaos`` runs it for five minutes): pod deletions,
SIGKILLs, SIGSTOP past the lease, scaling 3..5, operator restarts and one kube-apiserver
restart while light workers consume; then the group must be Stable again, the verifier
must find no lost and no duplicated event, and the audit no overlap of active ownership.
The second test scripts an admin's hand edits instead (a held lock deleted, the group
deleted and applied again) and checks the fencing tokens never went back.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kubernetes import client

from kgroup_devcluster.cluster import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import chaos

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.mark.timeout(400)
def test_seeded_faults_lose_nothing_and_never_overlap_owners(
        cluster: Cluster, kube: client.ApiClient, crd: list[str]) -> None:
    report = chaos.run(cluster, kube, seconds=45, seed=7)
    print({k: v for k, v in report.items() if k != "verifier"})
    assert sum(n for k, n in report["faults"].items() if not k.endswith("_failed")) >= 5
    assert report["faults"].get("apiserver_restart") == 1
    assert report["produced"] > 0 and report["audit_acquisitions"] > 0
    assert report["lost"] == 0, report["verifier"]
    assert report["duplicated"] == 0, report["verifier"]
    assert report["verifier_clean"], report["verifier"]
    assert report["safety_violations"] == []


@pytest.mark.timeout(500)
def test_locks_deleted_and_the_group_applied_again_keep_tokens_rising_and_lose_nothing(
        cluster: Cluster, kube: client.ApiClient, crd: list[str]) -> None:
    """kubectl delete lease (twice), kubectl delete cg + apply, kubectl delete lease, while
    events flow: each deleted lock is created again by the operator, its holder loses it
    (audit ``lost``), the next owner's token is above the deleted one; after the group
    came back every token is above every token before it, and the pipeline processed
    everything (no zombie refusal for ever, no loss, no duplicate)."""
    report = chaos.run(cluster, kube, seconds=0, seed=11, apiserver_restart=False,
                       script=("lock_deleted", "lock_deleted", "group_reapplied",
                               "lock_deleted"))
    print({k: v for k, v in report.items() if k != "verifier"})
    assert report["faults"] == {"group_reapplied": 1, "lock_deleted": 3}
    assert len(report["deleted_locks"]) == 3 and report["deleted_locks_retaken_higher"]
    assert all(holder for _, _, holder in report["deleted_locks"]), "held locks were deleted"
    for timing in report["deleted_lock_timings"]:  # the holder saw its lock gone, stopped
        assert timing["lost_after_s"] is not None and timing["lost_after_s"] < 5, timing
        assert timing["new_token"] > timing["old_token"], timing
    assert report["tokens_went_back"] == []
    assert min(report["tokens_after"].values()) > report["max_token_before"] > 0
    assert report["produced"] > 0 and report["committed"] > 0
    assert report["lost"] == 0 and report["duplicated"] == 0, report["verifier"]
    assert report["verifier_clean"], report["verifier"]
    assert report["safety_violations"] == []
