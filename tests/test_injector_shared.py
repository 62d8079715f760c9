"""The injector as every operator replica runs it, pure parts: the AdmissionReview answer
(kgroup_operator.injector.answer) and the shared certificate's life
(kgroup_operator.certs.next_step, held). The Secret and two replicas on the real API
server: e2e/tests/test_injector.py."""

from __future__ import annotations

import base64
import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonpatch
import pytest

from kgroup.core.operator.injection import SidecarDefaults, inject
from kgroup_operator.certs import Held, Step, held, make_pair, next_step
from kgroup_operator.injector import answer

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def h(made: datetime, life: timedelta, cas: int = 1) -> Held:
    return Held(made, made + life, cas)


@pytest.mark.parametrize(("state", "at", "step"), [
    (None, T0, Step.MAKE),
    (h(T0, 30 * DAY), T0 + 19 * DAY, Step.KEEP),
    (h(T0, 30 * DAY), T0 + 20 * DAY, Step.RENEW),  # a third of its life left
    (h(T0, 30 * DAY), T0 + 31 * DAY, Step.MAKE),  # expired: nothing usable held
    (h(T0, 30 * DAY, cas=2), T0 + timedelta(seconds=9), Step.KEEP),  # still settling
    (h(T0, 30 * DAY, cas=2), T0 + timedelta(seconds=10), Step.TRIM),
    (h(T0, 30 * DAY, cas=2), T0 + 20 * DAY, Step.RENEW),
])
def test_the_shared_pairs_next_step(state: Held | None, at: datetime, step: Step) -> None:
    assert next_step(state, at, settle_seconds=10) is step


def test_held_reads_the_dates_and_the_bundle() -> None:
    one, two = make_pair(["127.0.0.1"], T0, 3600), make_pair(["127.0.0.1"], T0, 3600)
    got = held(one.cert_pem, one.ca_pem + two.ca_pem)
    assert got == Held(T0, T0 + timedelta(hours=1), 2)
    with pytest.raises(ValueError):
        held(b"not a certificate", one.ca_pem)


# -- the admission answer ---------------------------------------------------------------

DEFAULTS = SidecarDefaults(image="ghcr.io/kgroup/kgroup-sidecar:0.1.0",
                           readiness={"periodSeconds": None, "timeoutSeconds": 3})


def pod(labels: dict[str, str] | None = None, **ann: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w", "namespace": "orders", "labels": labels or {},
                         "annotations": dict(ann)},
            "spec": {"containers": [{"name": "app", "image": "example.invalid/app:1"}]}}


def review(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "operation": operation, "object": obj}}


def patched(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    out: dict[str, Any] = jsonpatch.apply_patch(obj, ops)
    return out


def test_a_labelled_pod_is_patched_into_the_injected_one() -> None:
    p = pod({"kgroup.dev/group": "orders"})
    out = answer(review(p), DEFAULTS)
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    resp = out["response"]
    assert resp["uid"] == "u-1" and resp["allowed"] is True
    assert patched(p, resp) == inject(copy.deepcopy(p), DEFAULTS)
    assert p == pod({"kgroup.dev/group": "orders"})  # the request is not changed in place


def test_others_pass_unchanged_and_bad_overrides_are_refused() -> None:
    for obj, op in [(pod({"app": "x"}), "CREATE"), (pod({"kgroup.dev/group": "o"}), "UPDATE")]:
        resp = answer(review(obj, op), DEFAULTS)["response"]
        assert resp == {"uid": "u-1", "allowed": True}
    injected = inject(pod({"kgroup.dev/group": "orders"}), DEFAULTS)
    assert injected is not None  # already carries the sidecar: left alone
    assert answer(review(injected), DEFAULTS)["response"] == {"uid": "u-1", "allowed": True}
    typo = pod({"kgroup.dev/group": "orders"}, **{"sidecar.kgroup.dev/log-levle": "DEBUG"})
    resp = answer(review(typo), DEFAULTS)["response"]
    assert resp["allowed"] is False and resp["status"]["code"] == 400
    assert "unknown annotation 'sidecar.kgroup.dev/log-levle'" in resp["status"]["message"]
