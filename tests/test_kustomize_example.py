"""examples/kustomize/kgroup (docs/adopting.md, "With Kustomize") renders, with the
`kubectl kustomize` of the pinned kubectl (its embedded Kustomize), exactly
examples/worker-deployment-injected.yaml and examples/consumergroup.yaml: the label on the
workers' pod template, their selector untouched, nothing else labelled."""

from __future__ import annotations

import copy
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

from kgroup.core.objects import Obj
from kgroup_devcluster.cluster import build_tools

REPO = Path(__file__).resolve().parents[1]
OVERLAY = REPO / "examples" / "kustomize" / "kgroup"
INJECTED = REPO / "examples" / "worker-deployment-injected.yaml"
GROUP = REPO / "examples" / "consumergroup.yaml"
LABEL = "kgroup.dev/group"



def kustomize(path: Path) -> list[Obj]:
    kubectl = build_tools() / "kubectl"
    if not kubectl.exists():
        pytest.fail(f"{kubectl} is missing: run scripts/build-tools.sh", pytrace=False)
    out = subprocess.run([str(kubectl), "kustomize", str(path)], capture_output=True,
                         text=True, check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@cache
def rendered() -> dict[str, Obj]:
    return {d["kind"]: d for d in kustomize(OVERLAY)}


def by_kind(path: Path) -> dict[str, Obj]:
    return {d["kind"]: d for d in yaml.safe_load_all(path.read_text()) if d}


def test_the_overlay_renders_the_injected_example_and_the_group() -> None:
    out, injected = rendered(), by_kind(INJECTED)
    assert sorted(out) == ["ConfigMap", "ConsumerGroup", "Deployment"]
    assert out["Deployment"] == injected["Deployment"]
    assert out["ConfigMap"] == injected["ConfigMap"]
    assert out["ConsumerGroup"] == by_kind(GROUP)["ConsumerGroup"]


def test_only_the_workers_pod_template_gains_the_label() -> None:
    base = by_kind(OVERLAY.parent / "base" / "worker.yaml")["Deployment"]
    dep = rendered()["Deployment"]
    assert dep["spec"]["selector"] == base["spec"]["selector"]  # a changed one is refused
    assert dep["spec"]["template"]["metadata"]["labels"] == {
        **base["spec"]["template"]["metadata"]["labels"], LABEL: "orders"}
    assert LABEL not in base["spec"]["template"]["metadata"]["labels"]
    for d in rendered().values():
        assert LABEL not in (d["metadata"].get("labels") or {}), d["kind"]


def test_the_base_is_the_injected_example_without_what_the_overlay_adds() -> None:
    base = by_kind(OVERLAY.parent / "base" / "worker.yaml")["Deployment"]
    expected = copy.deepcopy(by_kind(INJECTED)["Deployment"])
    del expected["spec"]["strategy"]
    del expected["spec"]["template"]["metadata"]["labels"][LABEL]
    assert base == expected
