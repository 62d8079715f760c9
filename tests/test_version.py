"""One version everywhere: pyproject.toml's ``[project] version`` is the source; the
package's ``__version__``, the chart's ``version`` and ``appVersion``, CHANGELOG.md's
newest release and what the operator and the sidecar report (their ``kgroup_build_info``
and start-up log line) must all say the same."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
from test_logs import _sidecar_log, dead_api_kubeconfig

import kgroup
from kgroup_operator.metrics import Metrics as OperatorMetrics
from kgroup_sidecar.metrics import Metrics as SidecarMetrics

REPO = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def changelog_releases() -> list[tuple[str, str]]:
    """``(version, date)`` of every ``## [x.y.z] - date`` heading, newest first."""
    text = (REPO / "CHANGELOG.md").read_text()
    return re.findall(r"^## \[(\d+\.\d+\.\d+[^\]]*)\] - (\d{4}-\d{2}-\d{2})$", text, re.M)


def test_the_package_says_the_pyproject_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION)
    assert kgroup.__version__ == VERSION


def test_the_chart_and_its_app_version_say_the_pyproject_version() -> None:
    chart = yaml.safe_load((REPO / "charts" / "kgroup" / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION)


def test_the_changelog_has_unreleased_on_top_then_this_release() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.*)$", text, re.M)
    assert headings[0] == "[Unreleased]"
    releases = changelog_releases()
    assert releases and releases[0][0] == VERSION
    assert headings[1] == f"[{VERSION}] - {releases[0][1]}"


def test_the_operator_and_the_sidecar_export_their_version() -> None:
    assert (OperatorMetrics(process=False).registry.get_sample_value(
        "kgroup_build_info", {"component": "operator", "version": VERSION})) == 1.0
    sidecar = SidecarMetrics(namespace="ns", group="g", member="p", process=False)
    assert sidecar.value("kgroup_build_info", component="sidecar", version=VERSION) == 1.0


def test_a_real_sidecar_logs_its_version_when_it_starts(tmp_path: Path) -> None:
    assert f"(kgroup {VERSION})" in _sidecar_log(tmp_path, "INFO", "text")


def test_a_real_operator_logs_its_version_when_it_starts(tmp_path: Path) -> None:
    kubeconfig = dead_api_kubeconfig(tmp_path / "kubeconfig")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "NO_PROXY": "127.0.0.1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kgroup_operator.main", "--metrics-port", "0",
         "--liveness-port", "0", "--namespace", "ns"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    try:
        first = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert f"kgroup-operator {VERSION} starting as " in first
