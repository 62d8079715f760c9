"""Rendering the Helm chart (charts/kgroup) for the chart tests: `helm template` (the binary
scripts/build-tools.sh builds from its Go module; a no-op when cached), parsed YAML.

Rule of the chart tests (tests/test_chart*.py): every assertion is on objects `helm
template` rendered, never on the template text, so a test fails when what would reach
the API server changes.
"""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

from kgroup.core.objects import Obj
from kgroup_devcluster.cluster import build_tools

REPO = Path(__file__).resolve().parents[1]


CHART = REPO / "charts" / "kgroup"


CRD_FILE = "kgroup.dev_consumergroups.yaml"


# `helm template` assumes Kubernetes 1.20 unless told; the chart requires >= 1.30.
KUBE_VERSION = "1.35.4"




@cache
def helm_bin() -> str:
    helm = build_tools() / "helm"
    if not helm.exists():
        pytest.fail(f"{helm} is missing: run scripts/build-tools.sh", pytrace=False)
    return str(helm)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_bin(), *args], capture_output=True, text=True, check=check,
                          timeout=120)


def render(*sets: str, chart: Path = CHART, namespace: str = "kgroup-system") -> list[Obj]:
    argv = ["template", "kg", str(chart), "--namespace", namespace,
            "--kube-version", KUBE_VERSION]
    for s in sets:
        argv += ["--set", s]
    out = helm(*argv, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in by_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def parent_chart(tmp_path: Path, template: str) -> Path:
    """A chart that depends on kgroup (copied into its charts/) and renders `template`."""
    parent = tmp_path / "parent"
    (parent / "templates").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: parent\nversion: 0.0.1\nkubeVersion: '>=1.30.0-0'\n"
        "dependencies:\n- name: kgroup\n  version: 0.1.0\n")
    (parent / "values.yaml").write_text(
        "kgroup:\n  operator: {enabled: false}\n  sidecar: {image: {tag: '9.9.9'}}\n")
    shutil.copytree(CHART, parent / "charts" / "kgroup")
    (parent / "templates" / "pod.yaml").write_text(template)
    return parent


def render_file(values: Path, *sets: str) -> list[Obj]:
    out = helm("template", "kg", str(CHART), "--namespace", "kgroup-system",
               "--kube-version", KUBE_VERSION, "-f", str(values),
               *[a for s in sets for a in ("--set", s)], check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]
