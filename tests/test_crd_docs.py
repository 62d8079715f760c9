"""Every field of the CRD explains itself (devtools/kgroup_devtools/crd_docs.py): a
description on each node, units and defaults where they apply, timestamps with format date-time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kgroup_devtools import crdgen
from kgroup_devtools.crd_docs import DESCRIPTIONS


def fields(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if path:
        yield path, node
    for key, child in (node.get("properties") or {}).items():
        yield from fields(child, f"{path}.{key}" if path else key)
    if isinstance(node.get("items"), dict):
        yield from fields(node["items"], path + "[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from fields(node["additionalProperties"], path + "{}")


def undescribed(schema: dict[str, Any]) -> list[str]:
    """metadata is left out: the API server forbids describing it (it is ObjectMeta)."""
    return [p for p, node in fields(schema) if not node.get("description") and p != "metadata"]


def test_every_field_of_the_crd_has_a_description() -> None:
    schema = crdgen.openapi_schema()
    assert len(list(fields(schema))) >= 57
    assert undescribed(schema) == []


def test_the_check_fails_on_a_field_without_description() -> None:
    schema = crdgen.openapi_schema()
    del schema["properties"]["spec"]["properties"]["paused"]["description"]
    assert undescribed(schema) == ["spec.paused"]


def test_every_defaulted_field_says_its_default_and_seconds_say_so() -> None:
    for path, node in fields(crdgen.openapi_schema()):
        text = node.get("description", "")
        if path.startswith("spec.") and "default" in node \
                and node["type"] in ("integer", "boolean", "string"):
            assert "Default:" in text, path
        if path.endswith("Seconds") and path.startswith("spec."):
            assert "Seconds" in text or "seconds" in text, path


def test_timestamps_carry_format_date_time() -> None:
    stamps = {p for p, node in fields(crdgen.openapi_schema())
              if node.get("format") == "date-time"}
    assert stamps == {"status.conditions[].lastTransitionTime",
                      "status.lastRebalance.startedAt", "status.lastRebalance.completedAt",
                      "status.load.measuredAt", "status.autoscaling.lastScaleTime",
                      "status.autoscaling.scaleDownSince", "status.autoscaling.scaleUpSeen"}


def test_every_description_names_an_existing_field() -> None:
    paths = {p for p, _ in fields(crdgen.openapi_schema())}
    assert set(DESCRIPTIONS) <= paths
