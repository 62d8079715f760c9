"""Chaos, CI-sized: 45 s of seeded faults on the full stack, then nothing lost.

The body is ``bench/chaos.py`` (``make chaos`` runs it for five minutes): pod deletions,
SIGKILLs, SIGSTOP past the lease, scaling 3..5, operator restarts and one kube-apiserver
restart while light workers consume; then the group must be Stable again, the verifier
must find no lost and no duplicated event, and the audit no overlap of active ownership.
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
