"""The CRD in crds/ is generated from kgroup/crd_models.py and agrees with it field by field."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from kgroup_devtools import crdgen
from pydantic import BaseModel, TypeAdapter

from kgroup import crd_models as api

CRD_FILE = Path(__file__).resolve().parent.parent / "crds" / "kgroup.dev_consumergroups.yaml"


def load() -> dict[str, Any]:
    return typing.cast(dict[str, Any], yaml.safe_load(CRD_FILE.read_text()))


def schema() -> dict[str, Any]:
    version = load()["spec"]["versions"][0]
    return typing.cast(dict[str, Any], version["schema"]["openAPIV3Schema"])


def test_checked_in_crd_equals_the_generated_one() -> None:
    assert CRD_FILE.read_text() == crdgen.render(), "run: python -m kgroup_devtools.crdgen --write"


def test_check_mode_passes_on_the_checked_in_file() -> None:
    assert crdgen.main(["--check", "--path", str(CRD_FILE)]) == 0
    assert crdgen.CRD_PATH == CRD_FILE  # `make crd` (no --path) writes the checked-in file


def test_check_mode_fails_with_a_diff_on_drift(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    drifted = tmp_path / "crd.yaml"
    drifted.write_text(CRD_FILE.read_text().replace("maximum: 100000", "maximum: 5"))
    assert crdgen.main(["--check", "--path", str(drifted)]) == 1
    err = capsys.readouterr().err
    assert "-                maximum: 5" in err
    assert "+                maximum: 100000" in err
    assert "crdgen --write" in err


def test_write_mode_writes_what_check_accepts(tmp_path: Path) -> None:
    target = tmp_path / "out" / "crd.yaml"
    assert crdgen.main(["--write", "--path", str(target)]) == 0
    assert crdgen.main(["--check", "--path", str(target)]) == 0


def test_crd_names_scope_subresource_and_columns() -> None:
    crd = load()
    spec = crd["spec"]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == "consumergroups.kgroup.dev"
    assert spec["group"] == "kgroup.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["shortNames"] == ["cg"]
    assert spec["names"]["categories"] == ["kgroup"]
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Epoch": ".status.epoch",
        "Generation": ".status.layout.generation",
        "Partitions": ".spec.partitions",
        "Members": ".status.memberCount",
        "Unowned": ".status.unowned",
        "Stalled": ".status.stalled",
        "Recommended": ".status.load.recommendedMembers",
        "Without-Sidecar": ".status.sidecarMissing.count",
        "Age": ".metadata.creationTimestamp",
    }
    # only in -o wide: absent for most groups, it would widen every table
    assert {c["name"] for c in version["additionalPrinterColumns"]
            if c.get("priority")} == {"Without-Sidecar"}


def test_source_keeps_unknown_fields() -> None:
    source = schema()["properties"]["spec"]["properties"]["source"]
    assert source["x-kubernetes-preserve-unknown-fields"] is True
    assert source["type"] == "object"


def _walk_structural(node: dict[str, Any], path: str) -> None:
    assert "type" in node, f"{path}: a structural schema gives every node a type"
    assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
    for name, sub in node.get("properties", {}).items():
        _walk_structural(sub, f"{path}.{name}")
    if "items" in node:
        _walk_structural(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        _walk_structural(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural() -> None:
    _walk_structural(schema(), "")


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """Independent of crdgen: the nested model of M, M | None, list[M]."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is list:
        inner, _ = _model_of(args[0])
        return inner, True
    if args and typing.get_origin(annotation) is not dict:
        return _model_of(args[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def _compare(model: type[BaseModel], node: dict[str, Any], path: str) -> list[str]:
    """Every disagreement between a model and its CRD node, as readable lines."""
    problems: list[str] = []
    props = node["properties"]
    fields = {(f.alias or n): f for n, f in model.model_fields.items()}
    if set(fields) != set(props):
        problems.append(f"{path}: model fields {sorted(fields)} vs CRD {sorted(props)}")
    required = sorted(a for a, f in fields.items() if f.is_required())
    if required != sorted(node.get("required", [])):
        problems.append(f"{path}: required {required} vs CRD {node.get('required')}")
    for alias, field in fields.items():
        sub = props.get(alias, {})
        if not field.is_required():
            value = field.get_default(call_default_factory=True)
            if value is None:
                if "default" in sub:
                    problems.append(f"{path}.{alias}: CRD default {sub['default']!r}, model None")
            else:
                wire = TypeAdapter[Any](typing.cast(Any, field.annotation)).dump_python(
                    value, by_alias=True, mode="json", exclude_none=True
                )
                if sub.get("default") != wire:
                    problems.append(f"{path}.{alias}: CRD {sub.get('default')!r}, model {wire!r}")
        inner, is_list = _model_of(field.annotation)
        if inner is not None:
            problems += _compare(inner, sub["items"] if is_list else sub, f"{path}.{alias}")
    return problems


def test_models_and_crd_agree_on_every_field_name_and_default() -> None:
    props = schema()["properties"]
    problems = _compare(api.ConsumerGroupSpec, props["spec"], "spec")
    problems += _compare(api.ConsumerGroupStatus, props["status"], "status")
    assert problems == []


def _apply_defaults(node: dict[str, Any], obj: Any) -> Any:
    """What the API server's structural defaulting does to `obj`."""
    if isinstance(obj, dict) and "properties" in node:
        out = dict(obj)
        for name, sub in node["properties"].items():
            if name not in out and "default" in sub:
                out[name] = sub["default"]
            if name in out:
                out[name] = _apply_defaults(sub, out[name])
        return out
    if isinstance(obj, list) and "items" in node:
        return [_apply_defaults(node["items"], x) for x in obj]
    return obj


def test_crd_defaulting_yields_the_models_defaults() -> None:
    minimal = {"partitions": 3, "selector": {"matchLabels": {"app": "w"}}}
    defaulted = _apply_defaults(schema()["properties"]["spec"], minimal)
    assert defaulted == api.ConsumerGroupSpec.model_validate(minimal).to_wire()
    assert defaulted["assignor"] == "sticky"
    assert defaulted["lease"] == {"durationSeconds": 8, "renewIntervalSeconds": 2}


def test_validation_rules_carry_the_messages_people_read() -> None:
    spec = schema()["properties"]["spec"]["properties"]
    rules = {
        name: [r.get("messageExpression", r.get("message")) for r in node[crdgen.CEL_KEY]]
        for name, node in spec.items()
        if crdgen.CEL_KEY in node
    }
    assert "selector must select something" in rules["selector"][0]
    assert rules["lease"] == ["lease.renewIntervalSeconds must be less than lease.durationSeconds"]
    assert "partitions" not in rules  # a change either way is a reshape (status.layout)


def test_the_status_layout_is_in_the_schema() -> None:
    layout = schema()["properties"]["status"]["properties"]["layout"]["properties"]
    assert layout["generation"]["type"] == "integer"
    assert set(layout["generations"]["items"]["properties"]) == {
        "generation", "placement", "partitions", "widths"}


def test_an_overlay_path_that_names_no_field_is_refused() -> None:
    with pytest.raises(KeyError, match="no field 'partition'"):
        crdgen.apply_overlay(crdgen.openapi_schema(), {"spec.partition": {"minimum": 1}})
