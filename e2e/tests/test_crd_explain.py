"""The CRD explains itself on the real API server: the OpenAPI v3 document it publishes
(what ``kubectl explain`` reads) has a description on every ConsumerGroup field, and
``kubectl explain`` shows units and defaults."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kgroup_devcluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for

pytestmark = pytest.mark.cluster
SCHEMA = "dev.kgroup.v1alpha1.ConsumerGroup"


def fields(doc: dict[str, Any], node: dict[str, Any], path: str = ""
           ) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every field under ``node``; ``$ref``s into the document's schemas are followed
    (the API server publishes metadata as a reference to ObjectMeta: not ours)."""
    for key, child in (node.get("properties") or {}).items():
        sub = f"{path}.{key}" if path else key
        yield sub, child
        if "allOf" not in child and "$ref" not in child:
            yield from fields(doc, child, sub)
        for inner in ("items", "additionalProperties"):
            if isinstance(child.get(inner), dict):
                yield sub + ("[]" if inner == "items" else "{}"), child[inner]
                yield from fields(doc, child[inner], sub + ("[]" if inner == "items" else "{}"))


def test_every_field_has_a_description_in_the_published_openapi(
        cluster: Cluster, crd: list[str]) -> None:
    def published() -> dict[str, Any] | None:
        # a CRD just created reaches the OpenAPI v3 document a few seconds later
        got = cluster.kubectl("get", "--raw", "/openapi/v3/apis/kgroup.dev/v1alpha1",
                              check=False)
        return json.loads(got.stdout) if got.returncode == 0 else None

    doc = wait_for("the CRD's OpenAPI v3 document", published, timeout=60)
    assert doc is not None
    schema = doc["components"]["schemas"][SCHEMA]
    found = list(fields(doc, schema))
    missing = [p for p, node in found if not node.get("description")]
    assert len(found) >= 57 and missing == []
    stamp = dict(found)["status.conditions[].lastTransitionTime"]
    assert stamp.get("format") == "date-time"


@pytest.mark.parametrize(("field", "says"), [
    ("consumergroup.spec.lease.durationSeconds", "Default: 8"),
    ("consumergroup.spec.handoff.drainTimeoutSeconds", "Seconds a revoking partition"),
    ("consumergroup.status.stalled", "kgroup.dev/health"),
])
def test_kubectl_explain_shows_units_and_defaults(
        cluster: Cluster, crd: list[str], field: str, says: str) -> None:
    text = " ".join(cluster.kubectl("explain", field).stdout.split())
    assert says in text
