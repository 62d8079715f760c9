"""examples/worker-deployment-injected.yaml (the app and the label) is, once injected with
the chart's default values, examples/worker-deployment.yaml (the sidecar written out):
pure, `helm template` for the operator's injector values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from chart_render import REPO, one, render

from kgroup.core.objects import Obj
from kgroup.core.operator.injection import ANNOTATION_INJECTED, defaults_from_values, inject

SHORT = REPO / "examples" / "worker-deployment-injected.yaml"
LONG = REPO / "examples" / "worker-deployment.yaml"


def docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def chart_defaults() -> Any:
    objs = render("injector.enabled=true", "sidecar.image.tag=0.1.0")
    op = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in op["env"]}
    return defaults_from_values(json.loads(env["KGROUP_INJECTOR_SIDECAR"]))


def test_the_injected_example_is_the_written_out_example() -> None:
    short, long = one(docs(SHORT), "Deployment"), one(docs(LONG), "Deployment")
    template = short["spec"]["template"]
    out = inject({"apiVersion": "v1", "kind": "Pod", **template}, chart_defaults())
    assert out is not None
    assert out["metadata"]["annotations"] == {ANNOTATION_INJECTED:
                                              "ghcr.io/kgroup/kgroup-sidecar:0.1.0"}
    assert out["spec"] == long["spec"]["template"]["spec"]
    assert out["metadata"]["labels"] == {**long["spec"]["template"]["metadata"]["labels"],
                                         "kgroup.dev/group": "orders"}
    rest = {k: v for k, v in short["spec"].items() if k != "template"}
    assert rest == {k: v for k, v in long["spec"].items() if k != "template"}
    assert one(docs(SHORT), "ConfigMap") == one(docs(LONG), "ConfigMap")


def test_the_user_writes_no_sidecar_line() -> None:
    def lines(path: Path) -> int:  # YAML a user writes: no comments, no blank lines
        return sum(1 for s in path.read_text().splitlines()
                   if s.strip() and not s.strip().startswith("#"))

    assert (lines(SHORT), lines(LONG)) == (66, 178)  # the figures docs/adopting.md gives
    text = SHORT.read_text().split("apiVersion", 1)[1]  # past the header comment
    assert "kgroup-sidecar" not in text and "KGROUP_SIDECAR" not in text
    assert "automountServiceAccountToken" not in text and "serviceAccountName" not in text
