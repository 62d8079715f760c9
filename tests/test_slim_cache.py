"""The caches keep Leases without ``metadata.managedFields`` (kgroup.core.lease_codec.slim):
the sidecar's lock cache and the operator's group cache. Pure: the shipped caches are fed
dicts; that a write built from a slim copy keeps the server's managedFields is checked on
the real API server (e2e/tests/test_sidecar_apiclient.py)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from kgroup.core import lease_codec as codec
from kgroup.core.member.converge import SidecarLogic
from kgroup.core.operator.lease_cache import GroupLeases

MANAGED = [{"manager": "kgroup-operator", "operation": "Update", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {"f:kgroup.dev/assigned": {}}}}}]


def lock(p: int, rv: str = "10") -> dict[str, Any]:
    return {"metadata": {"name": f"g-partition-{p}", "resourceVersion": rv, "uid": "u",
                         "managedFields": copy.deepcopy(MANAGED),
                         "labels": {"kgroup.dev/role": "partition", "kgroup.dev/group": "g",
                                    "kgroup.dev/partition": str(p)},
                         "annotations": {"kgroup.dev/assigned": "a"}},
            "spec": {"leaseTransitions": 0, "leaseDurationSeconds": 8}}


def test_slim_drops_managed_fields_and_leaves_the_original_alone() -> None:
    obj = lock(0)
    out = codec.slim(obj)
    assert "managedFields" not in out["metadata"]
    assert obj["metadata"]["managedFields"] == MANAGED  # the caller's dict is not changed
    assert {k: v for k, v in obj["metadata"].items() if k != "managedFields"} == out["metadata"]
    assert out["spec"] == obj["spec"]
    bare = {"metadata": {"name": "x"}}
    assert codec.slim(bare) is bare  # nothing to drop: no copy


def test_the_sidecars_lock_cache_keeps_no_managed_fields() -> None:
    logic = SidecarLogic(pod="a", group="g", namespace="ns", clock=lambda: 0.0,
                         wall=lambda: datetime(2026, 1, 1, tzinfo=UTC), new_session=lambda: "S")
    logic.on_list("partition", [lock(0), lock(1)])
    logic.on_event("partition", "MODIFIED", lock(1, rv="11"))
    logic._store_partition(lock(2, rv="12"))  # an answer of our own write
    assert sorted(logic.partition_leases) == [0, 1, 2]
    assert all("managedFields" not in o["metadata"] for o in logic.partition_leases.values())
    assert logic.partition_leases[1]["metadata"]["resourceVersion"] == "11"


def test_the_operators_lease_cache_keeps_no_managed_fields() -> None:
    leases = GroupLeases()
    assert leases.put(lock(0), 0.0) is True
    leases.put(lock(0, rv="11"), 1.0)
    assert leases.partitions[0].resource_version == "11"
    assert all("managedFields" not in b["metadata"] for b in leases.bodies.values())
