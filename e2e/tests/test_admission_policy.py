"""The chart's ValidatingAdmissionPolicy enforces Lease ownership on a real API server.

Rule: a worker pod (service account kgroup-worker, pod-bound token) can take a partition
lock only for itself, release or annotate only a lock it holds, set the fencing token
(annotation kgroup.dev/token) at an acquisition to the resourceVersion the write replaces
and leave it alone otherwise, bump leaseTransitions by exactly one at an acquisition, take
a lock held by another pod only once the operator marked that holder's session expired
(kgroup.dev/expired-session), never write that mark itself, write only its own member
Lease, and never delete a partition Lease; the admin (and so the operator, another
identity) is not affected.

How: the chart is rendered with `helm template` (operator.enabled=false, crds.enabled=false:
the `crd` fixture applies the CRD) and its RBAC + policy objects are applied with kubectl,
with the policy's binding limited to this module's namespace so that other suites running
on the shared control plane are not judged by it. Two Pod objects (not run by anything:
their nodeSelector matches no node) give two pod-bound tokens, A and B.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kgroup_devcluster.cluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for
from kgroup_devcluster.tokens import (
    POD_NAME_EXTRA,
    api_client_from_kubeconfig,
    pod_api_client,
    service_account_kubeconfig,
    token_pod,
    whoami,
)

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kgroup"
WORKER_SA = "kgroup-worker"
GROUP = "g"
UIDS: dict[str, str] = {}  # pod name -> the uid of the token pod the fixture made


@dataclass
class Env:
    namespace: str
    admin: client.CoordinationV1Api
    a: client.CoordinationV1Api  # a pod-bound token of pod "pod-a"
    b: client.CoordinationV1Api  # a pod-bound token of pod "pod-b"
    unbound: client.CoordinationV1Api  # the worker SA with a token bound to no pod
    policy: str


def _render(cluster: Cluster, namespace: str, release: str) -> list[dict[str, Any]]:
    out = cluster.helm(
        "template", release, str(CHART), "--namespace", namespace, "--kube-version", "1.35.4",
        "--set", "operator.enabled=false", "--set", "crds.enabled=false",
        "--set", f"workerRbac.namespaces={{{namespace}}}",
        "--set", f"admissionPolicy.namespaces={{{namespace}}}",
        check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _apply(cluster: Cluster, objs: list[dict[str, Any]]) -> None:
    out = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objs), check=False)
    assert out.returncode == 0, out.stderr


@pytest.fixture(scope="module")
def env(cluster: Cluster, kube: client.ApiClient, crd: list[str],
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    core = client.CoreV1Api(kube)
    ns = f"t-admission-{secrets.token_hex(3)}"
    release = f"adm-{secrets.token_hex(3)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=ns, labels={"kgroup.dev/e2e": "true"})))
    objs = _render(cluster, ns, release)
    kinds = sorted({o["kind"] for o in objs})
    assert kinds == ["Role", "RoleBinding", "ServiceAccount", "ValidatingAdmissionPolicy",
                     "ValidatingAdmissionPolicyBinding"], kinds
    clients: list[client.ApiClient] = []
    try:
        _apply(cluster, objs)
        pods = {n: token_pod(core, ns, n, WORKER_SA) for n in ("pod-a", "pod-b")}
        UIDS.update({n: str(p.metadata.uid) for n, p in pods.items()})  # type: ignore[union-attr]
        tmp = tmp_path_factory.mktemp("admission")

        def as_pod(name: str) -> client.CoordinationV1Api:
            api = pod_api_client(cluster, pods[name], tmp / f"{name}.kubeconfig")
            clients.append(api)
            return client.CoordinationV1Api(api)

        unbound_api = api_client_from_kubeconfig(service_account_kubeconfig(
            cluster, namespace=ns, service_account=WORKER_SA, user="unbound",
            path=tmp / "unbound.kubeconfig"))
        clients.append(unbound_api)
        policy = next(o["metadata"]["name"] for o in objs
                      if o["kind"] == "ValidatingAdmissionPolicy")
        e = Env(namespace=ns, admin=client.CoordinationV1Api(kube), a=as_pod("pod-a"),
                b=as_pod("pod-b"), unbound=client.CoordinationV1Api(unbound_api),
                policy=policy)
        _wait_until_enforced(e)
        yield e
    finally:
        for api in clients:
            api.close()  # type: ignore[no-untyped-call]
        for o in objs:
            if o["kind"].startswith("ValidatingAdmissionPolicy"):
                cluster.kubectl("delete", "--ignore-not-found", o["kind"].lower(),
                                o["metadata"]["name"], check=False)
        core.delete_namespace(ns, propagation_policy="Background")


Lease = dict[str, Any]  # a Lease as JSON: the tests read and write plain dicts


def _lease(name: str, role: str, *, holder: str | None = None, transitions: int | None = None,
           labels: dict[str, str] | None = None,
           annotations: dict[str, str] | None = None) -> Lease:
    spec: dict[str, Any] = {"leaseDurationSeconds": 15}
    if holder is not None:
        spec["holderIdentity"] = holder
    if transitions is not None:
        spec["leaseTransitions"] = transitions
    return {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "annotations": annotations or {},
                     "labels": {"kgroup.dev/group": GROUP, "kgroup.dev/role": role,
                                **(labels or {})}},
        "spec": spec,
    }


def _json(api: client.CoordinationV1Api, obj: object) -> Lease:
    out: Lease = api.api_client.sanitize_for_serialization(obj)
    return out


def _create(api: client.CoordinationV1Api, env: Env, lease: Lease) -> Lease:
    # The client serialises a plain dict body as it is (its models are optional).
    return _json(api, api.create_namespaced_lease(env.namespace, lease))  # type: ignore[arg-type]


def _partition(env: Env, *, holder: str | None = None, transitions: int = 0,
               annotations: dict[str, str] | None = None) -> str:
    """A fresh partition Lease created by the admin (as the operator would, assigned to
    pod-a, with its uid, unless ``annotations`` say otherwise); its name."""
    n = secrets.randbelow(10**6)
    name = f"{GROUP}-partition-{n}"
    _create(env.admin, env, _lease(
        name, "partition", holder=holder, transitions=transitions,
        labels={"kgroup.dev/partition": str(n)},
        annotations={"kgroup.dev/assigned": "pod-a", "kgroup.dev/assigned-uid": UIDS["pod-a"],
                     **(annotations or {})}))
    return name


def _version(env: Env, name: str) -> str:
    """The Lease's resourceVersion now (read as the admin)."""
    return str(_json(env.admin, env.admin.read_namespaced_lease(name, env.namespace))[
        "metadata"]["resourceVersion"])


def _update(api: client.CoordinationV1Api, env: Env, name: str,
            change: Callable[[Lease], object]) -> Lease:
    """Read the Lease as the admin, apply `change`, write it back as `api` (with its RV)."""
    lease = _json(env.admin, env.admin.read_namespaced_lease(name, env.namespace))
    lease["metadata"].setdefault("annotations", {})
    change(lease)
    return _json(api, api.replace_namespaced_lease(
        name, env.namespace, lease))  # type: ignore[arg-type]


def _denied(call: Callable[[], object]) -> str:
    """Run `call`, which the policy must refuse; return the API server's message."""
    with pytest.raises(client.ApiException) as info:
        call()
    body = json.loads(info.value.body or "{}")
    assert info.value.status == 403, body
    message = str(body["message"])
    assert "ValidatingAdmissionPolicy" in message, message  # not RBAC: the policy refused
    return message


def _acquire(holder: str, transitions: int, token: str | None = None) -> Callable[[Lease], None]:
    """An acquisition as the sidecar writes it: the fencing token is the resourceVersion
    read (the write's precondition), unless ``token`` says otherwise, and the holder's pod
    uid (kgroup.dev/holder-uid) is its token pod's."""
    def change(lease: Lease) -> None:
        lease["spec"]["holderIdentity"] = holder
        lease["spec"]["leaseTransitions"] = transitions
        notes = lease["metadata"]["annotations"]
        notes["kgroup.dev/session"] = f"s-{holder}"
        notes["kgroup.dev/token"] = lease["metadata"]["resourceVersion"] if token is None \
            else token
        notes.pop("kgroup.dev/expired-session", None)  # a new session starts unmarked
        if holder in UIDS:
            notes["kgroup.dev/holder-uid"] = UIDS[holder]
    return change


def _release(lease: Lease) -> None:
    lease["spec"].pop("holderIdentity", None)


def _wait_until_enforced(env: Env) -> None:
    """The policy takes effect a moment after it is created: poll with a write it refuses."""
    name = _partition(env)

    def refused() -> bool:
        try:
            _update(env.a, env, name, _acquire("pod-b", 1))
        except client.ApiException as e:
            return e.status == 403 and "ValidatingAdmissionPolicy" in str(e.body)
        # Not enforced yet: the write went through; undo it as the admin and try again.
        def reset(lease: Lease) -> None:
            lease["spec"].pop("holderIdentity", None)
            lease["spec"]["leaseTransitions"] = 0
        _update(env.admin, env, name, reset)
        return False
    wait_for("the admission policy to be enforced", refused, timeout=60)


def test_tokens_name_their_pods(env: Env) -> None:
    info = whoami(env.a.api_client)
    assert info["username"] == f"system:serviceaccount:{env.namespace}:{WORKER_SA}"
    assert info["extra"][POD_NAME_EXTRA] == ["pod-a"]
    assert POD_NAME_EXTRA not in (whoami(env.unbound.api_client).get("extra") or {})


def test_policy_expressions_type_check(env: Env, kube: client.ApiClient) -> None:
    api = client.AdmissionregistrationV1Api(kube)

    def checked() -> Any:
        p = api.read_validating_admission_policy(env.policy)
        status = p.status
        if status is None or p.metadata is None or \
                status.observed_generation != p.metadata.generation:
            return None
        return status
    status = wait_for("the policy's type checking", checked, timeout=60)
    assert status.type_checking is not None  # the API server type-checked the expressions
    assert not status.type_checking.expression_warnings, status.type_checking


def test_a_pod_takes_a_free_lock_for_itself_and_releases_it_with_a_position(env: Env) -> None:
    name = _partition(env)
    lease = _update(env.a, env, name, _acquire("pod-a", 1))
    assert lease["spec"]["holderIdentity"] == "pod-a"
    assert lease["spec"]["leaseTransitions"] == 1

    def release(lease: Lease) -> None:
        _release(lease)
        lease["metadata"]["annotations"].update({"kgroup.dev/position": "1700-5",
                                                 "kgroup.dev/position-token": "1"})
    released = _update(env.a, env, name, release)
    assert "holderIdentity" not in released["spec"]
    assert released["spec"]["leaseTransitions"] == 1
    assert released["metadata"]["annotations"]["kgroup.dev/position"] == "1700-5"


def test_a_pod_cannot_take_a_lock_for_another_pod(env: Env) -> None:
    name = _partition(env)
    message = _denied(lambda: _update(env.a, env, name, _acquire("pod-b", 1)))
    assert 'pod pod-a may take partition lock' in message
    assert 'holderIdentity must be "pod-a", not "pod-b"' in message


def test_a_pod_cannot_release_another_pods_lock(env: Env) -> None:
    name = _partition(env, holder="pod-b", transitions=1,
                      annotations={"kgroup.dev/session": "s-pod-b"})
    message = _denied(lambda: _update(env.a, env, name, _release))
    assert "pod pod-a may not release partition lock" in message
    assert "held by pod-b" in message
    # ... and its holder can.
    assert "holderIdentity" not in _update(env.b, env, name, _release)["spec"]


def test_a_pod_cannot_write_the_position_of_a_lock_it_does_not_hold(env: Env) -> None:
    name = _partition(env, holder="pod-b", transitions=1)

    def annotate(lease: Lease) -> None:
        lease["metadata"]["annotations"]["kgroup.dev/position"] = "9999-0"
    message = _denied(lambda: _update(env.a, env, name, annotate))
    assert "may not write the position" in message


def test_a_pod_cannot_change_a_lock_it_does_not_hold(env: Env) -> None:
    name = _partition(env, holder="pod-b", transitions=1)

    def stretch(lease: Lease) -> None:
        lease["spec"]["leaseDurationSeconds"] = 3600
    message = _denied(lambda: _update(env.a, env, name, stretch))
    assert "does not hold partition lock" in message


@pytest.mark.parametrize("token", [0, 3, 5])
def test_an_acquisition_must_bump_the_fencing_token_by_exactly_one(env: Env,
                                                                   token: int) -> None:
    name = _partition(env, transitions=3)
    message = _denied(lambda: _update(env.a, env, name, _acquire("pod-a", token)))
    assert "must set it to 4" in message and f"got {token}" in message
    assert _update(env.a, env, name, _acquire("pod-a", 4))["spec"]["leaseTransitions"] == 4


def test_a_holder_cannot_change_the_acquisition_count_while_holding(env: Env) -> None:
    name = _partition(env)
    _update(env.a, env, name, _acquire("pod-a", 1))

    def bump(lease: Lease) -> None:
        lease["spec"]["leaseTransitions"] = 7
    message = _denied(lambda: _update(env.a, env, name, bump))
    assert "must stay 1" in message


@pytest.mark.parametrize("offset", [-1, 1, 10**12, None])
def test_an_acquisition_token_must_be_the_resource_version_it_replaces(env: Env,
                                                                      offset: int | None) -> None:
    name = _partition(env, transitions=3)
    rv = int(_version(env, name))
    wrong = "" if offset is None else str(rv + offset)
    message = _denied(lambda: _update(env.a, env, name, _acquire("pod-a", 4, wrong)))
    assert f'must set it to the resourceVersion the write replaces, "{rv}"' in message
    taken = _update(env.a, env, name, _acquire("pod-a", 4))
    assert taken["metadata"]["annotations"]["kgroup.dev/token"] == str(rv)
    assert int(taken["metadata"]["resourceVersion"]) > rv  # the next acquisition's is higher


def test_a_write_without_precondition_cannot_carry_a_stale_token(env: Env) -> None:
    # A worker may not patch at all (RBAC: the sidecar never patches), and a Lease update
    # must carry a resourceVersion (the API server refuses an unconditional one): a write
    # is always conditional on the version whose number becomes the token, so an old read
    # cannot be replayed.
    name = _partition(env)
    stale = _version(env, name)
    _update(env.admin, env, name, lambda lease: lease["metadata"]["annotations"].update(
        {"note": "a write by the operator moves the version on"}))
    patch = {"spec": {"holderIdentity": "pod-a", "leaseTransitions": 1},
             "metadata": {"annotations": {"kgroup.dev/session": "s-pod-a",
                                          "kgroup.dev/token": stale}}}
    with pytest.raises(client.ApiException) as info:
        env.a.patch_namespaced_lease(name, env.namespace, patch)
    assert info.value.status == 403 and "cannot patch resource" in str(info.value.body)

    def replay(lease: Lease) -> None:
        _acquire("pod-a", 1, token=stale)(lease)
        del lease["metadata"]["resourceVersion"]  # no precondition
    with pytest.raises(client.ApiException) as info:
        _update(env.a, env, name, replay)
    assert info.value.status == 422 and "resourceVersion" in str(info.value.body)
    message = _denied(lambda: _update(env.a, env, name, _acquire("pod-a", 1, token=stale)))
    assert "kgroup.dev/token" in message  # the current version, not the stale one


def test_a_holder_cannot_change_the_fencing_token_while_holding(env: Env) -> None:
    name = _partition(env)
    token = _update(env.a, env, name, _acquire("pod-a", 1))["metadata"]["annotations"][
        "kgroup.dev/token"]

    def raise_token(lease: Lease) -> None:
        lease["metadata"]["annotations"]["kgroup.dev/token"] = str(10**15)
    message = _denied(lambda: _update(env.a, env, name, raise_token))
    assert f'it must stay "{token}"' in message

    def drop_token(lease: Lease) -> None:
        del lease["metadata"]["annotations"]["kgroup.dev/token"]
    assert f'it must stay "{token}"' in _denied(lambda: _update(env.a, env, name, drop_token))


def test_a_worker_cannot_create_a_lock_with_a_token(env: Env) -> None:
    n = secrets.randbelow(10**6)
    lease = _lease(f"{GROUP}-partition-{n}", "partition", holder="pod-a", transitions=1,
                   labels={"kgroup.dev/partition": str(n)},
                   annotations={"kgroup.dev/session": "s-pod-a", "kgroup.dev/token": "999999999"})
    message = _denied(lambda: _create(env.a, env, lease))
    # workers create no partition Lease at all (the operator creates them, marked for the
    # member it assigns); a lock with a token is refused either way
    assert "may not create partition Lease" in message


def test_a_pod_takes_a_held_lock_only_once_the_operator_marked_its_session_expired(
        env: Env) -> None:
    # Whether B's session is over is the operator's call (it watches every session, on its
    # own clock, and re-reads the holder before it marks); the policy checks the mark.
    name = _partition(env, holder="pod-b", transitions=2,
                      annotations={"kgroup.dev/session": "s-pod-b"})
    message = _denied(lambda: _update(env.a, env, name, _acquire("pod-a", 3)))
    assert "pod pod-a may not take partition lock" in message
    assert 'from pod-b: its session "s-pod-b" is not marked expired' in message

    def mark(lease: Lease) -> None:  # the operator's expiry mark (here: as the admin)
        lease["metadata"]["annotations"]["kgroup.dev/expired-session"] = "s-pod-b"
    _update(env.admin, env, name, mark)
    taken = _update(env.a, env, name, _acquire("pod-a", 3))
    assert taken["spec"]["holderIdentity"] == "pod-a"
    assert "kgroup.dev/expired-session" not in taken["metadata"]["annotations"]


def test_a_mark_of_another_session_does_not_let_a_pod_take_a_held_lock(env: Env) -> None:
    name = _partition(env, holder="pod-b", transitions=2,
                      annotations={"kgroup.dev/session": "s-pod-b2",
                                   "kgroup.dev/expired-session": "s-pod-b1"})
    message = _denied(lambda: _update(env.a, env, name, _acquire("pod-a", 3)))
    assert 'kgroup.dev/expired-session is "s-pod-b1"' in message


@pytest.mark.parametrize("holder", [None, "pod-a", "pod-b"])
def test_a_worker_may_never_write_the_expiry_mark(env: Env, holder: str | None) -> None:
    # not on a free lock, not on its own, not on another's (to take it right after)
    notes = {"kgroup.dev/session": f"s-{holder}"} if holder else {}
    name = _partition(env, holder=holder, transitions=1 if holder else 0, annotations=notes)

    def mark(lease: Lease) -> None:
        lease["metadata"]["annotations"]["kgroup.dev/expired-session"] = f"s-{holder}"
    message = _denied(lambda: _update(env.a, env, name, mark))
    assert "only the operator, the failure detector, marks a session expired" in message


def test_a_worker_may_not_remove_the_expiry_mark_of_a_lock_it_neither_holds_nor_takes(
        env: Env) -> None:
    name = _partition(env, holder="pod-b", transitions=1,
                      annotations={"kgroup.dev/session": "s-pod-b",
                                   "kgroup.dev/expired-session": "s-pod-b"})

    def unmark(lease: Lease) -> None:
        del lease["metadata"]["annotations"]["kgroup.dev/expired-session"]
    message = _denied(lambda: _update(env.a, env, name, unmark))
    assert "remove the kgroup.dev/expired-session mark" in message


def test_workers_cannot_delete_partition_leases(env: Env) -> None:
    name = _partition(env, holder="pod-a", transitions=1)
    message = _denied(lambda: env.a.delete_namespaced_lease(name, env.namespace))
    assert "may not delete partition Lease" in message


def _member(pod: str, *, name: str | None = None, holder: str | None = None) -> Lease:
    return _lease(name or f"{GROUP}-member-{pod}", "member", holder=holder or pod,
                  labels={"kgroup.dev/member": pod},
                  annotations={"kgroup.dev/session": secrets.token_hex(4)})


def test_a_pod_writes_its_own_member_lease_only(env: Env) -> None:
    message = _denied(lambda: _create(env.a, env, _member("pod-b")))
    assert "may write only its own member Lease" in message
    # Its own name, but another holder: refused too.
    message = _denied(lambda: _create(env.a, env, _member("pod-a", holder="pod-b")))
    assert 'holderIdentity "pod-b"' in message
    own = _create(env.a, env, _member("pod-a"))
    assert own["spec"]["holderIdentity"] == "pod-a"
    # Renewal of its own session: allowed.
    renewed = _update(env.a, env, own["metadata"]["name"],
                      lambda lease: lease["spec"].update(leaseDurationSeconds=20))
    assert renewed["spec"]["leaseDurationSeconds"] == 20


def test_a_pod_cannot_touch_another_pods_member_lease(env: Env) -> None:
    name = _create(env.b, env, _member("pod-b"))["metadata"]["name"]
    message = _denied(lambda: _update(env.a, env, name,
                                      lambda lease: lease["spec"].update(holderIdentity="pod-a")))
    assert "may write only its own member Lease" in message
    message = _denied(lambda: env.a.delete_namespaced_lease(name, env.namespace))
    assert "may delete only its own member Lease" in message
    env.b.delete_namespaced_lease(name, env.namespace)  # its owner may


def test_labels_cannot_be_stripped_to_escape_the_policy(env: Env) -> None:
    name = _partition(env, holder="pod-b", transitions=1)

    def strip(lease: Lease) -> None:
        lease["metadata"]["labels"] = {}
        lease["spec"]["holderIdentity"] = "pod-a"
    message = _denied(lambda: _update(env.a, env, name, strip))
    assert "kgroup" in message


def test_a_worker_token_not_bound_to_a_pod_is_refused(env: Env) -> None:
    name = _partition(env)
    message = _denied(lambda: _update(env.unbound, env, name, _acquire("pod-a", 1)))
    assert "only with a pod-bound token" in message


def test_the_admin_is_not_affected(env: Env) -> None:
    name = _partition(env, holder="pod-b", transitions=1)
    lease = _update(env.admin, env, name, _acquire("pod-a", 9))  # any holder, any token
    assert lease["spec"]["holderIdentity"] == "pod-a"
    assert lease["spec"]["leaseTransitions"] == 9
    _create(env.admin, env, _member("pod-b"))
    env.admin.delete_namespaced_lease(f"{GROUP}-member-pod-b", env.namespace)
    env.admin.delete_namespaced_lease(name, env.namespace)
    with pytest.raises(client.ApiException) as info:
        env.admin.read_namespaced_lease(name, env.namespace)
    assert info.value.status == 404


def test_rbac_still_limits_the_worker_to_its_namespace(env: Env) -> None:
    with pytest.raises(client.ApiException) as info:
        env.a.list_namespaced_lease("default")
    assert info.value.status == 403

