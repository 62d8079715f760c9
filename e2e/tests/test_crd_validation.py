"""The API server itself refuses invalid ConsumerGroups, with messages a person reads.

These run against the real kube-apiserver with the generated CRD applied (fixture
`crd`): OpenAPI bounds, enums and required fields, the CEL rules with their messages,
partitions out of range (a change within range, either way, is a reshape), defaulting,
and the status subresource.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from kgroup.constants import API_GROUP, API_VERSION, KIND, PLURAL

pytestmark = pytest.mark.cluster

Body = dict[str, Any]


def group(name: str = "orders", **spec: Any) -> Body:
    base: Body = {"partitions": 8, "selector": {"matchLabels": {"app": "orders-worker"}}}
    base.update(spec)
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {k: v for k, v in base.items() if v is not None},
    }


@pytest.fixture
def api(kube: client.ApiClient, crd: list[str]) -> client.CustomObjectsApi:
    assert f"{PLURAL}.{API_GROUP}" in crd
    return client.CustomObjectsApi(kube)


def create(api: client.CustomObjectsApi, namespace: str, body: Body) -> Body:
    out = api.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, body)
    return typing.cast(Body, out)


def get(api: client.CustomObjectsApi, namespace: str, name: str) -> Body:
    out = api.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
    return typing.cast(Body, out)


def refused(call: Callable[[], object]) -> str:
    """Runs a call the API server must refuse with 422; returns its message."""
    with pytest.raises(client.ApiException) as info:
        call()
    assert info.value.status == 422, info.value.body
    message: str = json.loads(info.value.body or "{}")["message"]
    return message


def test_a_valid_group_is_accepted_and_defaulted(
    api: client.CustomObjectsApi, namespace: str
) -> None:
    create(api, namespace, group(source={"stream": "orders", "redis": {"db": 3}}))
    spec = get(api, namespace, "orders")["spec"]
    assert spec["assignor"] == "sticky"
    assert spec["lease"] == {"durationSeconds": 8, "renewIntervalSeconds": 2}
    assert spec["handoff"] == {"drainTimeoutSeconds": 30}
    assert spec["stabilizationWindowSeconds"] == 5
    assert spec["stabilizationMaxDelaySeconds"] == 30
    assert spec["restartGraceSeconds"] == 0
    assert spec["statefulSetRestartGraceSeconds"] == 30
    assert spec["paused"] is False
    assert spec["reshape"] == {"policy": "Generations"}
    assert spec["source"] == {"stream": "orders", "redis": {"db": 3}}, "unknown fields kept"


def test_a_partly_given_lease_gets_the_other_default(
    api: client.CustomObjectsApi, namespace: str
) -> None:
    create(api, namespace, group(lease={"durationSeconds": 60}))
    assert get(api, namespace, "orders")["spec"]["lease"] == {
        "durationSeconds": 60,
        "renewIntervalSeconds": 2,
    }


INVALID: list[tuple[str, Body, list[str]]] = [
    (
        "unknown reshape policy",
        {"reshape": {"policy": "Rehash"}},
        ["spec.reshape.policy", "Unsupported value", "Generations", "Append"],
    ),
    (
        "a split and a merge in one change",
        {"reshape": {"change": {"generation": 2, "split": 1, "merge": [2, 3]}}},
        ["spec.reshape.change takes one split (a partition number) or one merge"],
    ),
    (
        "a change that names nothing",
        {"reshape": {"change": {"generation": 2}}},
        ["spec.reshape.change takes one split (a partition number) or one merge"],
    ),
    (
        "a merge of a partition with itself",
        {"reshape": {"change": {"generation": 2, "merge": [3, 3]}}},
        ["spec.reshape.change.merge names two different partitions"],
    ),
    (
        "a change under Append",
        {"reshape": {"policy": "Append", "change": {"generation": 2, "split": 1}}},
        ["spec.reshape.change (a split or a merge) needs spec.reshape.policy: Generations"],
    ),
    (
        "a change that makes generation 1",
        {"reshape": {"change": {"generation": 1, "split": 1}}},
        ["spec.reshape.change.generation", "greater than or equal to 2"],
    ),
    ("no partitions", {"partitions": 0}, ["spec.partitions", "greater than or equal to 1"]),
    ("too many", {"partitions": 100_001}, ["spec.partitions", "less than or equal to 100000"]),
    ("no selector", {"selector": None}, ["spec.selector", "Required value"]),
    ("empty selector", {"selector": {}}, ["selector must select something"]),
    (
        "empty selector lists",
        {"selector": {"matchLabels": {}, "matchExpressions": []}},
        ["selector must select something"],
    ),
    ("unknown assignor", {"assignor": "roundrobin"}, ['Unsupported value: "roundrobin"']),
    (
        "renew equals duration",
        {"lease": {"durationSeconds": 10, "renewIntervalSeconds": 10}},
        ["lease.renewIntervalSeconds must be less than lease.durationSeconds"],
    ),
    (
        "default renew above a short duration",
        {"lease": {"durationSeconds": 2}},
        ["lease.renewIntervalSeconds must be less than lease.durationSeconds"],
    ),
    (
        "negative drain timeout",
        {"handoff": {"drainTimeoutSeconds": -1}},
        ["spec.handoff.drainTimeoutSeconds", "greater than or equal to 0"],
    ),
    (
        "negative stabilization window",
        {"stabilizationWindowSeconds": -5},
        ["spec.stabilizationWindowSeconds", "greater than or equal to 0"],
    ),
    (
        "negative restart grace",
        {"restartGraceSeconds": -1},
        ["spec.restartGraceSeconds", "greater than or equal to 0"],
    ),
]


@pytest.mark.parametrize(("case", "spec", "messages"), INVALID, ids=[c[0] for c in INVALID])
def test_an_invalid_group_is_refused_with_a_readable_message(
    api: client.CustomObjectsApi, namespace: str, case: str, spec: Body, messages: list[str]
) -> None:
    message = refused(lambda: create(api, namespace, group(**spec)))
    for expected in messages:
        assert expected in message, f"{case}: {message}"


def patch_spec(api: client.CustomObjectsApi, namespace: str, spec: Body) -> Body:
    out = api.patch_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, PLURAL, "orders", {"spec": spec}
    )
    return typing.cast(Body, out)


def test_partitions_shrink_and_grow_and_out_of_range_is_refused(
    api: client.CustomObjectsApi, namespace: str
) -> None:
    create(api, namespace, group(partitions=8))
    assert patch_spec(api, namespace, {"partitions": 4})["spec"]["partitions"] == 4
    assert patch_spec(api, namespace, {"partitions": 16})["spec"]["partitions"] == 16
    message = refused(lambda: patch_spec(api, namespace, {"partitions": 0}))
    assert "spec.partitions" in message and "greater than or equal to 1" in message
    message = refused(lambda: patch_spec(api, namespace, {"partitions": 100_001}))
    assert "spec.partitions" in message and "less than or equal to 100000" in message
    assert get(api, namespace, "orders")["spec"]["partitions"] == 16


def test_append_refuses_a_shrink_and_generations_takes_it(
    api: client.CustomObjectsApi, namespace: str
) -> None:
    create(api, namespace, group(partitions=8, reshape={"policy": "Append"}))
    message = refused(lambda: patch_spec(api, namespace, {"partitions": 4}))
    assert "spec.partitions cannot shrink (from 8 to 4) under spec.reshape.policy Append" \
        in message
    assert "set spec.reshape.policy: Generations" in message
    assert patch_spec(api, namespace, {"partitions": 12})["spec"]["partitions"] == 12
    both = patch_spec(api, namespace, {"partitions": 4, "reshape": {"policy": "Generations"}})
    assert (both["spec"]["partitions"], both["spec"]["reshape"]) == (4, {"policy": "Generations"})


TWO_GENERATIONS: Body = {"generation": 2, "nextPartition": 24, "generations": [
    {"generation": 1, "placement": "modulo", "partitions": "0-7"},
    {"generation": 2, "placement": "range", "partitions": "8-23", "widths": "1/16*16"}],
    "states": {"open": "8-23", "sealed": "0-7"}}


def test_append_refuses_a_change_once_the_layout_is_not_one_modulo_generation(
    api: client.CustomObjectsApi, namespace: str
) -> None:
    create(api, namespace, group(partitions=16))
    api.patch_namespaced_custom_object_status(
        API_GROUP, API_VERSION, namespace, PLURAL, "orders",
        {"status": {"layout": TWO_GENERATIONS}})
    message = refused(lambda: patch_spec(
        api, namespace, {"partitions": 24, "reshape": {"policy": "Append"}}))
    assert "spec.partitions cannot change under spec.reshape.policy Append while " \
        "status.layout is not one modulo generation" in message
    # the policy alone may change, and the status is still written under it
    assert patch_spec(api, namespace, {"reshape": {"policy": "Append"}})["spec"]["reshape"] == {
        "policy": "Append"}
    api.patch_namespaced_custom_object_status(
        API_GROUP, API_VERSION, namespace, PLURAL, "orders", {"status": {"epoch": 2}})
    assert get(api, namespace, "orders")["status"]["epoch"] == 2
    message = refused(lambda: patch_spec(api, namespace, {"partitions": 20}))
    assert "status.layout is not one modulo generation" in message
    one = {"generation": 1, "nextPartition": 16, "generations": [
        {"generation": 1, "placement": "modulo", "partitions": "0-15"}], "states": {"open": "0-15"}}
    api.patch_namespaced_custom_object_status(
        API_GROUP, API_VERSION, namespace, PLURAL, "orders", {"status": {"layout": one}})
    assert patch_spec(api, namespace, {"partitions": 20})["spec"]["partitions"] == 20


def test_an_update_breaking_the_lease_rule_is_refused(
    api: client.CustomObjectsApi, namespace: str
) -> None:
    create(api, namespace, group())
    message = refused(lambda: patch_spec(api, namespace, {"lease": {"durationSeconds": 2}}))
    assert "lease.renewIntervalSeconds must be less than lease.durationSeconds" in message


STATUS: Body = {
    "epoch": 3,
    "phase": "Stable",
    "memberCount": 1,
    "assignment": {"orders-worker-0": "0-7"},
    "members": [{"name": "orders-worker-0", "assigned": "0-7", "assignedCount": 8}],
}


def test_status_is_written_only_through_the_status_subresource(
    api: client.CustomObjectsApi, namespace: str
) -> None:
    body = group()
    body["status"] = STATUS
    created = create(api, namespace, body)
    assert "epoch" not in created.get("status", {}), "status on create is dropped"

    api.patch_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, PLURAL, "orders", {"status": STATUS}
    )
    assert get(api, namespace, "orders").get("status", {}).get("epoch") is None

    api.patch_namespaced_custom_object_status(
        API_GROUP, API_VERSION, namespace, PLURAL, "orders", {"status": STATUS}
    )
    status = get(api, namespace, "orders")["status"]
    assert status["epoch"] == 3
    assert status["assignment"] == {"orders-worker-0": "0-7"}
    assert status["members"][0]["ownedCount"] == 0, "defaults apply to status items too"


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"epoch": -1}, "status.epoch"),
        ({"phase": "Happy"}, 'Unsupported value: "Happy"'),
        # the assignment's shape is the chart's status policy's (e2e/tests/test_bad_status.py):
        # a CRD rule over the map would cost too much; stalledPartitions is one string
        ({"stalledPartitions": "0-3,x"}, "status.stalledPartitions must be partition ranges"),
        ({"assignment": {"w": "1" * 300_001}}, "Too long: may not be more than 300000"),
        ({"members": [{"name": "a"}, {"name": "a"}]}, "Duplicate value"),
        ({"unowned": -2}, "status.unowned"),
    ],
)
def test_an_insane_status_is_refused(
    api: client.CustomObjectsApi, namespace: str, status: Body, expected: str
) -> None:
    create(api, namespace, group())
    message = refused(
        lambda: api.patch_namespaced_custom_object_status(
            API_GROUP, API_VERSION, namespace, PLURAL, "orders", {"status": status}
        )
    )
    assert expected in message
