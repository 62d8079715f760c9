"""Least privilege on a real API server: tables of (caller, request, expected answer).

Rule: each row is one request as a real caller would send it, with the answer the chart
promises: ``allowed``, refused by a kgroup admission policy (its message names the rule),
or refused by RBAC. Writes that would change something outside this test's namespace are
server-side dry runs (admission runs, nothing is stored).

Callers: a worker pod (service account kgroup-worker, a pod-bound token of pod-a; pod-b is
another member) and the operator (its service account, a plain token), with the chart as
installed by default: operator.watchNamespaces empty, so a ClusterRole. What the rows
refuse: a worker writing another app's Lease or the operator's leader Lease; a worker
taking a lock assigned to another member; the operator writing kube-system's or
kube-node-lease's Leases or another app's. The operator is the failure detector, so: a
worker taking a held lock whose session the operator has not marked expired, or writing
that expiry mark itself; the operator marking only a lock's own session. A lock's
metadata and a member Lease are bounded: a worker changing the owner references,
finalizers, labels or other annotations of a lock (held by another, by itself, or while
acquiring it), or writing an unbounded member Lease (duration, annotation sizes,
finalizers, owners); the operator creating a lock already
held or changing a lock's owners, finalizers or labels; the operator deleting any Lease
but a free partition lock of its group that records its completion (a retired
partition's: a held one is refused with a message naming its holder); the mark
binds the pod's uid: a pod of the mark's name but another uid (a pod re-created under that
name) or a mark without a uid (an older operator's) acquires nothing.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client

from kgroup.apiclient import ApiClient, ApiError, kubeconfig_config
from kgroup_devcluster.cluster import Cluster
from kgroup_devcluster.pytest_plugin import wait_for
from kgroup_devcluster.tokens import (
    api_client_from_kubeconfig,
    pod_api_client,
    service_account_kubeconfig,
    token_pod,
)

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kgroup"
WORKER_SA = "kgroup-worker"
GROUP = "g"
LEADER = "kgroup-operator-leader"  # the chart's default operator.leaderElection.leaseName
KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
Lease = dict[str, Any]
DRY = "All"
UIDS: dict[str, str] = {}  # pod name -> the uid of the token pod the fixture made
GROUP_UID: list[str] = []  # the uid of ConsumerGroup GROUP the fixture made (the locks' owner)
OTHER_UID = "00000000-0000-0000-0000-00000000dead"  # a former pod-a's uid

T = TypeVar("T")


@dataclass
class Env:
    ns: str
    # CoordinationV1Api clients, typed Any: the tests send and read plain JSON dicts
    admin: Any
    worker: Any  # pod-a's pod-bound token
    operator: Any  # the operator's service account
    operator_kubeconfig: Path | None = None  # the same, for the operator's own client


def as_operator(env: Env, fn: Callable[[ApiClient], Awaitable[T]]) -> T:
    """``fn`` with the operator's shipped client (kgroup.apiclient) under its token, in a
    loop of its own."""
    assert env.operator_kubeconfig is not None

    async def scenario() -> T:
        api = ApiClient(kubeconfig_config(env.operator_kubeconfig))  # type: ignore[arg-type]
        try:
            return await fn(api)
        finally:
            await api.close()

    return asyncio.run(scenario())


def _render(cluster: Cluster, ns: str, release: str, *sets: str) -> list[Lease]:
    argv = [f"--set={x}" for x in sets]
    out = cluster.helm(
        "template", release, str(CHART), "--namespace", ns, "--kube-version", "1.35.4",
        "--set", "crds.enabled=false", "--set", f"workerRbac.namespaces={{{ns}}}",
        "--set", f"admissionPolicy.namespaces={{{ns}}}", *argv, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] in KINDS]


def _lease(name: str, *, labels: dict[str, str] | None = None, holder: str | None = None,
           token: int = 0, notes: dict[str, str] | None = None) -> Lease:
    spec: Lease = {"leaseDurationSeconds": 15, "leaseTransitions": token}
    if holder:
        spec["holderIdentity"] = holder
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "labels": labels or {}, "annotations": notes or {}},
            "spec": spec}


def _partition_labels(n: int) -> dict[str, str]:
    return {"kgroup.dev/group": GROUP, "kgroup.dev/role": "partition",
            "kgroup.dev/partition": str(n)}


@pytest.fixture(scope="module")
def env(cluster: Cluster, kube: client.ApiClient, crd: list[str],
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    core = client.CoreV1Api(kube)
    ns = f"t-privilege-{secrets.token_hex(3)}"
    release = f"prv-{secrets.token_hex(3)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=ns, labels={"kgroup.dev/e2e": "true"})))
    objs = _render(cluster, ns, release)
    assert {o["kind"] for o in objs} == KINDS
    clients: list[client.ApiClient] = []
    try:
        out = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objs), check=False)
        assert out.returncode == 0, out.stderr
        tmp = tmp_path_factory.mktemp("privilege")
        pod_a = token_pod(core, ns, "pod-a", WORKER_SA)
        UIDS["pod-a"] = str(pod_a.metadata.uid)  # type: ignore[union-attr]
        worker_api = pod_api_client(cluster, pod_a, tmp / "pod-a.kubeconfig")
        operator_sa = next(o["metadata"]["name"] for o in objs
                           if o["kind"] == "ServiceAccount" and "operator" in o["metadata"]["name"])
        operator_kubeconfig = service_account_kubeconfig(
            cluster, namespace=ns, service_account=operator_sa, user="operator",
            path=tmp / "operator.kubeconfig")
        operator_api = api_client_from_kubeconfig(operator_kubeconfig)
        clients += [worker_api, operator_api]
        e = Env(ns, client.CoordinationV1Api(kube), client.CoordinationV1Api(worker_api),
                client.CoordinationV1Api(operator_api), Path(operator_kubeconfig))
        # the objects the rows act on, made by the admin
        e.admin.create_namespaced_lease(ns, _lease("other-app-leader", holder="other-app-0"))
        e.admin.create_namespaced_lease(ns, _lease(
            LEADER, labels={"kgroup.dev/role": "operator-leader"}, holder="operator-0"))
        mine = {"kgroup.dev/assigned": "pod-a", "kgroup.dev/assigned-uid": UIDS["pod-a"]}
        for n, notes in ((1, mine), (2, {"kgroup.dev/assigned": "pod-b"}), (3, {}),
                         (8, {"kgroup.dev/assigned": "pod-a",
                              "kgroup.dev/assigned-uid": OTHER_UID}),
                         (9, {"kgroup.dev/assigned": "pod-a"})):
            e.admin.create_namespaced_lease(ns, _lease(
                f"{GROUP}-partition-{n}", labels=_partition_labels(n), notes=notes))
        e.admin.create_namespaced_lease(ns, _lease(  # held by pod-b, live, assigned to it
            f"{GROUP}-partition-4", labels=_partition_labels(4), holder="pod-b", token=3,
            notes={"kgroup.dev/assigned": "pod-b", "kgroup.dev/session": "s-b"}))
        e.admin.create_namespaced_lease(ns, _lease(  # held by pod-a, moved to pod-b
            f"{GROUP}-partition-5", labels=_partition_labels(5), holder="pod-a", token=2,
            notes={"kgroup.dev/assigned": "pod-b", "kgroup.dev/session": "s-a"}))
        e.admin.create_namespaced_lease(ns, _lease(  # held by pod-b, moved to pod-a, unmarked
            f"{GROUP}-partition-6", labels=_partition_labels(6), holder="pod-b", token=3,
            notes={**mine, "kgroup.dev/session": "s-b6"}))
        e.admin.create_namespaced_lease(ns, _lease(  # ... and one the operator marked expired
            f"{GROUP}-partition-7", labels=_partition_labels(7), holder="pod-b", token=3,
            notes={**mine, "kgroup.dev/session": "s-b7",
                   "kgroup.dev/expired-session": "s-b7"}))
        for n, uid in ((10, OTHER_UID), (11, UIDS["pod-a"])):  # held by a former pod-a / by it
            e.admin.create_namespaced_lease(ns, _lease(
                f"{GROUP}-partition-{n}", labels=_partition_labels(n), holder="pod-a", token=2,
                notes={**mine, "kgroup.dev/session": "s-a", "kgroup.dev/holder-uid": uid,
                       "kgroup.dev/position": "7", "kgroup.dev/position-token": "1"}))
        # locks owned by a real ConsumerGroup (a made-up owner uid would have the garbage
        # collector delete them): the deletes' rows. No operator runs here: it sits.
        group: Any = client.CustomObjectsApi(kube).create_namespaced_custom_object(
            "kgroup.dev", "v1alpha1", ns, "consumergroups", {
                "apiVersion": "kgroup.dev/v1alpha1", "kind": "ConsumerGroup",
                "metadata": {"name": GROUP},
                "spec": {"partitions": 2, "selector": {"matchLabels": {"app": "none"}}}})
        GROUP_UID[:] = [str(group["metadata"]["uid"])]
        for n, holder, notes in (
                (30, None, DONE), (31, "pod-b", {**DONE, "kgroup.dev/session": "s-b31"}),
                (32, None, {"kgroup.dev/position": "7", "kgroup.dev/position-token": "5"}),
                (33, None, {**DONE, "kgroup.dev/completed": "4"}), (34, None, DONE),
                (35, None, DONE)):
            e.admin.create_namespaced_lease(ns, lock(
                n, holder=holder, token=1, notes=notes,
                ownerReferences=[] if n == 35 else [owner(controller=True)]))
        e.admin.create_namespaced_lease(ns, _lease(  # pod-b's session (the quorum read)
            f"{GROUP}-member-pod-b", holder="pod-b", notes={"kgroup.dev/session": "s-b7"},
            labels={**MEMBER, "kgroup.dev/member": "pod-b"}))
        _wait_until_enforced(e)
        yield e
    finally:
        for api in clients:
            api.close()  # type: ignore[no-untyped-call]
        for o in objs:
            if "namespace" not in o["metadata"] and o["kind"] != "ServiceAccount":
                cluster.kubectl("delete", "--ignore-not-found", o["kind"].lower(),
                                o["metadata"]["name"], check=False)
        core.delete_namespace(ns, propagation_policy="Background")


def _wait_until_enforced(env: Env) -> None:
    """Policies take effect a moment after they are created: poll with refused dry runs."""
    def refused(api: Any, ns: str) -> bool:
        try:
            api.create_namespaced_lease(ns, _lease(f"probe-{secrets.token_hex(3)}"),
                                        dry_run=DRY)
        except client.ApiException as exc:
            return exc.status == 403 and "ValidatingAdmissionPolicy" in str(exc.body)
        return False
    wait_for("the worker policy", lambda: refused(env.worker, env.ns), timeout=60)
    wait_for("the operator policy", lambda: refused(env.operator, env.ns), timeout=60)


# ---- requests: (description, call) -----------------------------------------------------

Request = Callable[[Env], object]


def read(env: Env, name: str, ns: str | None = None) -> Lease:
    raw = env.admin.read_namespaced_lease(name, ns or env.ns, _preload_content=False)
    body: Lease = json.loads(raw.data)
    body["metadata"].setdefault("annotations", {})
    return body


def put(who: str, name: str, change: Callable[[Lease], None]) -> Request:
    """Read ``name`` as the admin, change it, replace it as ``who`` (a dry run)."""
    def call(env: Env) -> object:
        body = read(env, name)
        change(body)
        api = getattr(env, who)
        return api.replace_namespaced_lease(name, env.ns, body, dry_run=DRY)
    return call


def patch(who: str, name: str, body: Lease) -> Request:
    def call(env: Env) -> object:
        api = getattr(env, who)
        return api.patch_namespaced_lease(name, env.ns, body, dry_run=DRY)
    return call


def create(who: str, lease: Lease, ns: str | None = None) -> Request:
    def call(env: Env) -> object:
        api = getattr(env, who)
        return api.create_namespaced_lease(ns or env.ns, lease, dry_run=DRY)
    return call


def get(who: str, name: str) -> Request:
    def call(env: Env) -> object:
        return getattr(env, who).read_namespaced_lease(name, env.ns)
    return call


def delete(who: str, name: str) -> Request:
    def call(env: Env) -> object:
        api = getattr(env, who)
        return api.delete_namespaced_lease(name, env.ns, dry_run=DRY)
    return call


def acquire(holder: str, transitions: int, session: str = "s-new",
            uid: str | None = None) -> Callable[[Lease], None]:
    """An acquisition as the sidecar writes it: one more transition, the fencing token
    (kgroup.dev/token) is the resourceVersion the write replaces, and the holder's pod uid
    (kgroup.dev/holder-uid) is ``uid`` (None: the holder's token pod's, looked up when
    sent; "": none written)."""
    def change(lease: Lease) -> None:
        lease["spec"]["holderIdentity"] = holder
        lease["spec"]["leaseTransitions"] = transitions
        notes = lease["metadata"]["annotations"]
        notes["kgroup.dev/session"] = session
        notes["kgroup.dev/token"] = lease["metadata"]["resourceVersion"]
        notes.pop("kgroup.dev/expired-session", None)  # a new session starts unmarked
        holder_uid = UIDS.get(holder, "") if uid is None else uid
        if holder_uid:
            notes["kgroup.dev/holder-uid"] = holder_uid
        else:
            notes.pop("kgroup.dev/holder-uid", None)
    return change


def release(lease: Lease) -> None:
    lease["spec"].pop("holderIdentity", None)
    lease["metadata"]["annotations"].pop("kgroup.dev/session", None)


def set_note(key: str, value: str) -> Callable[[Lease], None]:
    return lambda lease: lease["metadata"]["annotations"].__setitem__(key, value)


def set_meta(key: str, value: object) -> Callable[[Lease], None]:
    return lambda lease: lease["metadata"].__setitem__(key, value)


def set_spec(key: str, value: object) -> Callable[[Lease], None]:
    return lambda lease: lease["spec"].__setitem__(key, value)


def both(*changes: Callable[[Lease], None]) -> Callable[[Lease], None]:
    def change(lease: Lease) -> None:
        for c in changes:
            c(lease)
    return change


def owner(name: str = GROUP, *, controller: bool = False) -> dict[str, object]:
    """An owner reference to ConsumerGroup ``name`` (as lease_codec.owner_reference writes;
    the uid is the fixture's group's, once made, else it names no object: a dry run, the
    garbage collector never sees it)."""
    uid = GROUP_UID[0] if GROUP_UID and name == GROUP else "00000000-0000-0000-0000-000000000001"
    ref: dict[str, object] = {"apiVersion": "kgroup.dev/v1alpha1", "kind": "ConsumerGroup",
                              "name": name, "uid": uid}
    if controller:
        ref.update(controller=True, blockOwnerDeletion=False)
    return ref


def member(notes: dict[str, str] | None = None, *, duration: int = 15,
           labels: dict[str, str] | None = None, **meta: object) -> Lease:
    """pod-a's own member Lease as the sidecar writes it, with ``meta`` added."""
    lease = _lease(f"{GROUP}-member-pod-a", labels=labels if labels is not None else MEMBER,
                   holder="pod-a", notes={"kgroup.dev/session": "s-a", **(notes or {})})
    lease["spec"]["leaseDurationSeconds"] = duration
    lease["metadata"].update(meta)
    return lease


def lock(n: int, *, holder: str | None = None, token: int = 0,
         notes: dict[str, str] | None = None, **meta: object) -> Lease:
    """Partition lock ``n`` as the operator creates it (lease_codec.new_partition_lease:
    one controller reference to the group), with ``meta`` added or replaced."""
    lease = _lease(f"{P}{n}", labels=_partition_labels(n), holder=holder, token=token,
                   notes=notes)
    lease["metadata"].update({"ownerReferences": [owner(controller=True)], **meta})
    return lease


def answer(env: Env, call: Request) -> str:
    """``allowed``, ``rbac``, or ``policy: <message>``."""
    try:
        call(env)
    except client.ApiException as exc:
        body = json.loads(exc.body or "{}")
        assert exc.status == 403, body
        message = str(body.get("message", ""))
        return f"policy: {message}" if "ValidatingAdmissionPolicy" in message else "rbac"
    return "allowed"


P = f"{GROUP}-partition-"
# a completed release's annotations (lease_codec.released_partition_lease, completed=True)
DONE = {"kgroup.dev/position": "seal-0", "kgroup.dev/position-token": "5",
        "kgroup.dev/completed": "5", "kgroup.dev/token": "5"}
MEMBER = {"kgroup.dev/group": GROUP, "kgroup.dev/role": "member", "kgroup.dev/member": "pod-a"}

WORKER_TABLE: list[tuple[str, Request, str]] = [
    # another application's Lease, the operator's leader Lease: never the worker's
    ("create another app's Lease", create("worker", _lease("app-lock", holder="pod-a")),
     "is not a kgroup Lease"),
    ("take another app's leader lock", put("worker", "other-app-leader",
                                           acquire("pod-a", 1)), "is not a kgroup Lease"),
    ("delete another app's Lease", delete("worker", "other-app-leader"),
     "is not a kgroup Lease"),
    ("take the operator's leader Lease", put("worker", LEADER, acquire("pod-a", 1)),
     "is not a kgroup Lease"),
    ("create a kgroup-looking Lease without labels",
     create("worker", _lease(f"{P}77", holder="pod-a")), "is not a kgroup Lease"),
    # its own member Lease, the locks assigned to it
    ("create its own member Lease", create("worker", _lease(
        f"{GROUP}-member-pod-a", labels=MEMBER, holder="pod-a",
        notes={"kgroup.dev/session": "s-a"})), "allowed"),
    ("acquire a free lock assigned to it", put("worker", f"{P}1", acquire("pod-a", 1)),
     "allowed"),
    ("acquire a free lock assigned to pod-b", put("worker", f"{P}2", acquire("pod-a", 1)),
     'the operator assigned it to "pod-b"'),
    ("acquire a free lock assigned to nobody", put("worker", f"{P}3", acquire("pod-a", 1)),
     "assigned it to nobody yet"),
    ("acquire a lock marked for another pod of its name (another uid)",
     put("worker", f"{P}8", acquire("pod-a", 1)),
     f"the pod of that name with uid {OTHER_UID} (annotation kgroup.dev/assigned-uid), not "
     "this one: a pod re-created under the same name is another pod"),
    ("acquire a lock marked for its name without a uid (an older operator's mark)",
     put("worker", f"{P}9", acquire("pod-a", 1)),
     'assigned to the name "pod-a" without a pod uid'),
    ("write the mark's uid of a lock marked for it", put("worker", f"{P}8", set_note(
        "kgroup.dev/assigned-uid", "x")), "it may change it only by acquiring it"),
    ("steal pod-b's live lock with token + 1", put("worker", f"{P}4", acquire("pod-a", 4)),
     'the operator assigned it to "pod-b"'),
    ("re-acquire its own lock with a new session after the move",
     put("worker", f"{P}5", acquire("pod-a", 3)), 'the operator assigned it to "pod-b"'),
    ("release its own lock after the move", put("worker", f"{P}5", release), "allowed"),
    ("take pod-b's lock assigned to it, its session not marked expired",
     put("worker", f"{P}6", acquire("pod-a", 4)), 'its session "s-b6" is not marked expired'),
    ("take pod-b's lock assigned to it, marked expired", put("worker", f"{P}7",
                                                             acquire("pod-a", 4)), "allowed"),
    ("mark pod-b's session expired itself", put("worker", f"{P}6", set_note(
        "kgroup.dev/expired-session", "s-b6")), "only the operator, the failure detector"),
    ("mark a lock for itself", patch("worker", f"{P}2", {"metadata": {"annotations": {
        "kgroup.dev/assigned": "pod-a"}}}), "rbac"),  # no patch verb at all
    ("mark a lock for itself (update)", put("worker", f"{P}2",
                                            set_note("kgroup.dev/assigned", "pod-a")),
     "may not change the kgroup.dev/assigned mark"),
    ("create a partition lock held by itself", create("worker", _lease(
        f"{P}78", labels=_partition_labels(78), holder="pod-a", token=1,
        notes={"kgroup.dev/assigned": "pod-a", "kgroup.dev/session": "s-a"})),
     "may not create partition Lease"),
    # a lock the caller does not hold is untouchable; a holder or an acquirer
    # changes only what the protocol writes (docs/design.md, "Least privilege")
    ("give pod-b's lock an owner that does not exist", put("worker", f"{P}4", set_meta(
        "ownerReferences", [owner("gone")])), "may not change the owner references"),
    ("put a finalizer on pod-b's lock", put("worker", f"{P}4", set_meta(
        "finalizers", ["example.com/hang"])), "may not change the owner references"),
    ("label pod-b's lock", put("worker", f"{P}4", set_meta(
        "labels", {**_partition_labels(4), "x": "y"})), "may not change the owner references"),
    ("pad pod-b's lock with a 200 KB annotation", put("worker", f"{P}4", set_note(
        "pad", "x" * 200_000)), "it may change it only by acquiring it"),
    ("remove the assignment mark of pod-b's lock", put("worker", f"{P}4", lambda lease: lease[
        "metadata"]["annotations"].pop("kgroup.dev/assigned")), "kgroup.dev/assigned mark"),
    ("holder: renew its own lock (a new duration)", put("worker", f"{P}5", set_spec(
        "leaseDurationSeconds", 20)), "allowed"),
    ("holder: release its own lock with a position", put("worker", f"{P}5", both(
        release, set_note("kgroup.dev/position", "42"),
        set_note("kgroup.dev/position-token", "2"))), "allowed"),
    ("holder: add an annotation of its own to its lock", put("worker", f"{P}5", set_note(
        "x", "y")), "in this write it may change only kgroup.dev/session"),
    ("holder: put a finalizer on its own lock", put("worker", f"{P}5", set_meta(
        "finalizers", ["example.com/hang"])), "may not change the owner references"),
    ("holder: drop its own lock's owner reference", put("worker", f"{P}5", set_meta(
        "ownerReferences", [])), "allowed"),  # it had none: nothing changes
    ("holder: stretch its own lock to 2^31-1 s", put("worker", f"{P}5", set_spec(
        "leaseDurationSeconds", 2**31 - 1)), "must be at most 3600"),
    # the holder is a pod, not a name (kgroup.dev/holder-uid)
    ("acquire a lock assigned to it naming another pod as holder uid",
     put("worker", f"{P}1", acquire("pod-a", 1, uid=OTHER_UID)),
     "must write its pod's uid"),
    ("acquire a lock assigned to it without a holder uid",
     put("worker", f"{P}1", acquire("pod-a", 1, uid="")),
     'kgroup.dev/holder-uid, got "": every later write of the holder'),
    ("re-created pod: renew the lock a former pod of its name holds",
     put("worker", f"{P}10", set_spec("leaseDurationSeconds", 20)),
     f"may not renew or change partition lock {P}10: it is held by the pod of that name "
     f"with uid {OTHER_UID} (annotation kgroup.dev/holder-uid), not this one"),
    ("re-created pod: release the lock a former pod of its name holds",
     put("worker", f"{P}10", release),
     f"may not release partition lock {P}10: it is held by the pod of that name with uid "
     f"{OTHER_UID}"),
    ("re-created pod: release it with a position", put("worker", f"{P}10", both(
        release, set_note("kgroup.dev/position", "42"),
        set_note("kgroup.dev/position-token", "2"))), f"may not release partition lock {P}10"),
    ("re-created pod: write the position of the lock a former pod of its name holds",
     put("worker", f"{P}10", both(set_note("kgroup.dev/position", "42"),
                                  set_note("kgroup.dev/position-token", "2"))),
     f"may not write the position of partition lock {P}10: it is held by the pod of that "
     f"name with uid {OTHER_UID}"),
    ("re-created pod: put its own uid on the former pod's lock", put("worker", f"{P}10",
        lambda lease: set_note("kgroup.dev/holder-uid", UIDS["pod-a"])(lease)),
     "kgroup.dev/holder-uid"),
    ("true holder (its uid on the lock): renew it", put("worker", f"{P}11", set_spec(
        "leaseDurationSeconds", 20)), "allowed"),
    ("true holder: write its position", put("worker", f"{P}11", both(
        set_note("kgroup.dev/position", "42"), set_note("kgroup.dev/position-token", "2"))),
     "allowed"),
    ("true holder: release it with a position", put("worker", f"{P}11", both(
        release, set_note("kgroup.dev/position", "42"),
        set_note("kgroup.dev/position-token", "2"))), "allowed"),
    ("true holder: change its holder uid", put("worker", f"{P}11", set_note(
        "kgroup.dev/holder-uid", OTHER_UID)), "may not change annotation(s) kgroup.dev/holder-uid"),
    ("acquirer: also write an annotation of its own", put("worker", f"{P}7", both(
        acquire("pod-a", 4), set_note("kgroup.dev/epoch", "0"))),
     "may change only kgroup.dev/session, kgroup.dev/token, kgroup.dev/expired-session"),
    ("acquirer: also add an owner reference", put("worker", f"{P}7", both(
        acquire("pod-a", 4), set_meta("ownerReferences", [owner("gone")]))),
     "may not change the owner references"),
    ("acquirer: also label the lock", put("worker", f"{P}7", both(
        acquire("pod-a", 4), set_meta("labels", {**_partition_labels(7), "x": "y"}))),
     "may not change the owner references"),
    # its own member Lease is bounded
    ("member Lease as the sidecar writes it (owner: its group)", create("worker", member(
        {"kgroup.dev/epoch": "3", "kgroup.dev/health": "h" * 4096},
        labels={**MEMBER, "app.kubernetes.io/managed-by": "kgroup-sidecar"},
        ownerReferences=[owner()])), "allowed"),
    ("member Lease for 2^31-1 s", create("worker", member(duration=2**31 - 1)),
     "within the ConsumerGroup CRD's bounds"),
    ("member Lease for 1 s", create("worker", member(duration=1)),
     "within the ConsumerGroup CRD's bounds"),
    ("member Lease with a 4097-byte health summary", create("worker", member(
        {"kgroup.dev/health": "h" * 4097})), "kgroup.dev/health (4097 bytes)"),
    ("member Lease padded with another annotation", create("worker", member(
        {"pad": "x" * 100})), "may carry only the annotations"),
    ("member Lease with a 600-byte session", create("worker", member(
        {"kgroup.dev/session": "s" * 600})), "the others up to 512"),
    ("member Lease with another label", create("worker", member(
        labels={**MEMBER, "x": "y"})), "may carry only the annotations"),
    ("member Lease without its group label", create("worker", member(
        labels={k: v for k, v in MEMBER.items() if k != "kgroup.dev/group"})),
     "must name its group"),
    ("member Lease with a finalizer", create("worker", member(
        finalizers=["example.com/hang"])), "carry no finalizers"),
    ("member Lease owned by another group", create("worker", member(
        ownerReferences=[owner("other")])), "at most one owner reference"),
    ("member Lease owned by its group as controller", create("worker", member(
        ownerReferences=[owner(controller=True)])), "not a controller"),
    ("member Lease with two owners", create("worker", member(
        ownerReferences=[owner(), owner() | {"uid": "00000000-0000-0000-0000-000000000002"}])),
     "at most one owner reference"),
]

OPERATOR_TABLE: list[tuple[str, Request, str]] = [
    ("create a partition lock, marked", create("operator", lock(
        80, notes={"kgroup.dev/assigned": "pod-a"})),
     "allowed"),
    # it creates locks free, and never changes their metadata but the marks
    ("create a lock held by pod-a", create("operator", lock(82, holder="pod-a")),
     'only free: no holderIdentity (got "pod-a")'),
    ("create a lock with a token and a session", create("operator", lock(
        83, notes={"kgroup.dev/token": "999999", "kgroup.dev/session": "s"})),
     "no annotation but kgroup.dev/assigned"),
    ("create a lock with 5 acquisitions", create("operator", lock(84, token=5)),
     "leaseTransitions 0"),
    ("create a lock with a finalizer", create("operator", lock(85, finalizers=["x.io/hang"])),
     "no finalizers"),
    ("create a lock without its owner reference", create("operator", lock(86, ownerReferences=[])),
     "exactly one owner reference"),
    ("give a lock an owner that does not exist (merge patch)", patch("operator", f"{P}4", {
        "metadata": {"ownerReferences": [owner("gone")]}}),
     "may not change the owner references"),
    ("put a finalizer on a lock (merge patch)", patch("operator", f"{P}4", {
        "metadata": {"finalizers": ["x.io/hang"]}}), "may not change the owner references"),
    ("label a lock (merge patch)", patch("operator", f"{P}4", {
        "metadata": {"labels": {"x": "y"}}}), "may not change the owner references"),
    ("pad a lock with an annotation (merge patch)", patch("operator", f"{P}4", {
        "metadata": {"annotations": {"pad": "x" * 1000}}}),
     "may change only the kgroup.dev/assigned, kgroup.dev/assigned-uid and "
     "kgroup.dev/expired-session"),
    ("change a lock's token (merge patch)", patch("operator", f"{P}4", {
        "metadata": {"annotations": {"kgroup.dev/token": "1"}}}),
     "may change only the kgroup.dev/assigned, kgroup.dev/assigned-uid and "
     "kgroup.dev/expired-session"),
    ("move a lock's mark (merge patch)", patch("operator", f"{P}4", {"metadata": {
        "annotations": {"kgroup.dev/assigned": "pod-a"}}}), "allowed"),
    ("move a lock's mark with its pod's uid (conditional merge patch)", lambda env: env.operator
     .patch_namespaced_lease(f"{P}4", env.ns, {"metadata": {
         "resourceVersion": read(env, f"{P}4")["metadata"]["resourceVersion"],
         "annotations": {"kgroup.dev/assigned": "pod-a",
                         "kgroup.dev/assigned-uid": UIDS["pod-a"]}}}, dry_run=DRY), "allowed"),
    ("mark a lock's session expired (merge patch)", patch("operator", f"{P}6", {"metadata": {
        "annotations": {"kgroup.dev/expired-session": "s-b6"}}}), "allowed"),
    ("mark a lock expired under another session", patch("operator", f"{P}6", {"metadata": {
        "annotations": {"kgroup.dev/expired-session": "s-b5"}}}),
     "only to the session it holds"),
    ("change a lock's session (merge patch)", patch("operator", f"{P}6", {"metadata": {
        "annotations": {"kgroup.dev/session": "s-x"}}}),
     "may change only the kgroup.dev/assigned, kgroup.dev/assigned-uid and "
     "kgroup.dev/expired-session"),
    ("create a lock marked expired", create("operator", lock(
        81, notes={"kgroup.dev/expired-session": "s"})),
     "no annotation but kgroup.dev/assigned and kgroup.dev/assigned-uid "
     "(got [kgroup.dev/expired-session])"),
    ("read a holder's member Lease (the quorum read)", get("operator", f"{GROUP}-member-pod-b"),
     "allowed"),
    ("set a lock's holder (merge patch)", patch("operator", f"{P}4", {"spec": {
        "holderIdentity": "pod-a"}}), "may change only the annotations"),
    ("strip a lock's labels (merge patch)", patch("operator", f"{P}4", {"metadata": {
        "labels": {"kgroup.dev/role": None}}}), "may write only kgroup partition locks"),
    ("update a lock (PUT)", put("operator", f"{P}4", set_note("x", "y")), "rbac"),
    # deletes: only a free lock of the group that records its completion
    ("delete a free lock read to its end (a retired partition's)", delete("operator", f"{P}30"),
     "allowed"),
    ("delete a held lock", delete("operator", f"{P}31"),
     'may not delete Lease t-privilege-'),
    ("delete a held lock: the message names the holder", delete("operator", f"{P}31"),
     'it is held by "pod-b"; only a free lock of a retired partition'),
    ("delete a free lock not read to its end", delete("operator", f"{P}32"),
     'it records no completion (kgroup.dev/completed "" must equal'),
    ("delete a lock whose completion a later release replaced", delete("operator", f"{P}33"),
     'it records no completion (kgroup.dev/completed "4" must equal'),
    ("delete a free completed lock without its owner reference", delete("operator", f"{P}35"),
     "the operator deletes only partition locks"),
    ("delete a held lock without its owner reference", delete("operator", f"{P}4"),
     "the operator deletes only partition locks"),
    ("delete a member Lease", delete("operator", f"{GROUP}-member-pod-b"),
     "the operator deletes only partition locks"),
    ("delete its leader Lease", delete("operator", LEADER),
     "the operator deletes only partition locks"),
    ("delete another app's Lease", delete("operator", "other-app-leader"),
     "the operator deletes only partition locks"),
    ("create another app's Lease", create("operator", _lease("app-lock")),
     "may write only kgroup partition locks"),
    ("patch another app's Lease", patch("operator", "other-app-leader", {"spec": {
        "holderIdentity": "operator-0"}}), "may write only kgroup partition locks"),
    ("label another app's Lease as a lock", patch("operator", "other-app-leader", {
        "metadata": {"labels": _partition_labels(9)}}), "may write only kgroup partition"),
    ("create a member Lease", create("operator", _lease(
        f"{GROUP}-member-pod-a", labels=MEMBER, holder="pod-a")),
     "may write only kgroup partition locks"),
    ("create a Lease in kube-system", create("operator", _lease(
        "kube-controller-manager-x", labels=_partition_labels(1)), ns="kube-system"),
     "kube-system and kube-node-lease"),
    ("create a Lease in kube-node-lease", create("operator", _lease(
        "node-x", labels=_partition_labels(1)), ns="kube-node-lease"),
     "kube-system and kube-node-lease"),
    ("create its leader Lease under another name", create("operator", _lease(
        "kgroup-other-leader", labels={"kgroup.dev/role": "operator-leader"})),
     "may write only kgroup partition locks"),
    ("renew its leader Lease (PUT, by name)", put("operator", LEADER,
                                                 acquire("operator-1", 1)), "allowed"),
    ("take another app's Lease (PUT)", put("operator", "other-app-leader",
                                           acquire("operator-1", 1)), "rbac"),
]


@pytest.mark.parametrize(("what", "request_", "expected"), WORKER_TABLE,
                         ids=[row[0] for row in WORKER_TABLE])
def test_a_worker_writes_only_its_member_lease_and_the_locks_assigned_to_it(
        env: Env, what: str, request_: Request, expected: str) -> None:
    judged(what, answer(env, request_), expected)


@pytest.mark.parametrize(("what", "request_", "expected"), OPERATOR_TABLE,
                         ids=[row[0] for row in OPERATOR_TABLE])
def test_the_operator_writes_only_kgroups_leases(
        env: Env, what: str, request_: Request, expected: str) -> None:
    judged(what, answer(env, request_), expected)


def judged(what: str, got: str, expected: str) -> None:
    """``expected``: "allowed", "rbac" (RBAC's 403), or a phrase of the policy's message."""
    if expected in ("allowed", "rbac"):
        assert got == expected, (what, got)
    else:
        assert got.startswith("policy: ") and expected in got, (what, got)


def test_the_admin_is_judged_by_neither_policy(env: Env) -> None:
    for call in (create("admin", _lease("app-lock-2")),
                 put("admin", f"{P}2", acquire("pod-a", 1)),
                 put("admin", f"{P}2", set_note("kgroup.dev/assigned", "pod-a"))):
        assert answer(env, call) == "allowed"


def test_the_operators_delete_takes_only_a_free_completed_lock_at_the_version_read(
        env: Env) -> None:
    """kgroup_operator.kube's delete as shipped, under the operator's token, for real (not a
    dry run): a held lock of the group is refused by the policy with a message naming its
    holder (raised: the driver logs it and does not ask again until the lock changes); a
    free lock that records its completion, at a resourceVersion it is no longer at, is not
    deleted (the precondition: False); at the version read, it is deleted."""
    from kgroup_operator.kube import Kube

    def delete(n: int, rv: str | None = None) -> bool:
        body = read(env, f"{P}{n}")
        return as_operator(env, lambda api: Kube(api, identity="e2e").delete_partition_lease(
            namespace=env.ns, name=f"{P}{n}", seen_rv=rv or body["metadata"]["resourceVersion"],
            uid=body["metadata"]["uid"]))

    with pytest.raises(ApiError) as refused:
        delete(31)
    assert refused.value.status == 403
    message = refused.value.body["message"]
    assert 'may not delete Lease ' + f"{env.ns}/{P}31" in message, message
    assert 'it is held by "pod-b"' in message, message
    before = read(env, f"{P}34")["metadata"]["resourceVersion"]
    env.admin.patch_namespaced_lease(f"{P}34", env.ns, {  # changed since it was read
        "metadata": {"annotations": {"kgroup.dev/assigned": "pod-a"}}})
    assert delete(34, before) is False
    assert read(env, f"{P}34")["metadata"]["name"] == f"{P}34"  # still there
    assert delete(34) is True
    with pytest.raises(client.ApiException) as gone:
        read(env, f"{P}34")
    assert gone.value.status == 404
    assert read(env, f"{P}31")["spec"]["holderIdentity"] == "pod-b"  # untouched


def test_a_pod_re_created_under_its_name_acquires_only_once_the_operator_marked_it(
        cluster: Cluster, kube: client.ApiClient, env: Env, tmp_path: Path) -> None:
    """For real, with pod-bound tokens: pod-r's lock is marked for its uid and pod-r takes
    it (its uid written as the holder uid); pod-r is deleted and a pod of the same name
    created (another uid, as a StatefulSet's pod re-created, or a bare pod under its name)
    while the old session still holds the lock: its release and its position write are
    refused with a message naming both uids, and so is its acquisition; the operator's own
    mark (kgroup_operator.kube, conditional on the lock as read, under the operator's
    token) moves it to the new uid, and then it is allowed (a new session re-acquiring the
    name's lock), after which the new pod is the holder and its release is allowed."""
    from kgroup_operator.kube import Kube

    core = client.CoreV1Api(kube)
    first = token_pod(core, env.ns, "pod-r", WORKER_SA)
    old_uid = str(first.metadata.uid)  # type: ignore[union-attr]
    env.admin.create_namespaced_lease(env.ns, _lease(  # no owner: the GC would delete it
        f"{P}20", labels=_partition_labels(20), notes={
            "kgroup.dev/assigned": "pod-r", "kgroup.dev/assigned-uid": old_uid}))
    old_api = pod_api_client(cluster, first, tmp_path / "pod-r-old.kubeconfig")
    try:
        body = read(env, f"{P}20")
        acquire("pod-r", 1, session="s-old", uid=old_uid)(body)
        held: Any = client.CoordinationV1Api(old_api).replace_namespaced_lease(
            f"{P}20", env.ns, body)  # type: ignore[arg-type]
        assert held.metadata.annotations["kgroup.dev/holder-uid"] == old_uid
    finally:
        old_api.close()  # type: ignore[no-untyped-call]
    core.delete_namespaced_pod("pod-r", env.ns, grace_period_seconds=0)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("pod-r", env.ns)
        except client.ApiException as exc:
            return bool(exc.status == 404)
        return False

    wait_for("pod-r deleted", gone, timeout=30)
    second = token_pod(core, env.ns, "pod-r", WORKER_SA)
    new_uid = str(second.metadata.uid)  # type: ignore[union-attr]
    assert new_uid != old_uid
    api = pod_api_client(cluster, second, tmp_path / "pod-r.kubeconfig")
    try:
        again = client.CoordinationV1Api(api)

        def write(change: Callable[[Lease], None]) -> object:
            body = read(env, f"{P}20")
            change(body)
            return again.replace_namespaced_lease(f"{P}20", env.ns, body)  # type: ignore[arg-type]

        def refusal(change: Callable[[Lease], None]) -> str:
            with pytest.raises(client.ApiException) as refused:
                write(change)
            message = str(json.loads(refused.value.body or "{}").get("message", ""))
            assert refused.value.status == 403, message
            return message

        def take() -> object:
            return write(acquire("pod-r", 1, session="s-2", uid=new_uid))

        position = both(set_note("kgroup.dev/position", "9"),
                        set_note("kgroup.dev/position-token", "1"))
        for verb, change in (("release", both(release, position)),
                             ("write the position of", position)):
            message = refusal(change)
            assert (f"pod pod-r (uid {new_uid}) may not {verb} partition lock {P}20: it is "
                    f"held by the pod of that name with uid {old_uid} (annotation "
                    f"kgroup.dev/holder-uid)") in message, message
        assert read(env, f"{P}20")["spec"]["holderIdentity"] == "pod-r"
        message = refusal(acquire("pod-r", 1, session="s-2", uid=new_uid))
        assert (f"pod pod-r (uid {new_uid}) may not take partition lock {P}20: it is "
                f"assigned to the pod of that name with uid {old_uid}") in message, message
        seen = read(env, f"{P}20")["metadata"]["resourceVersion"]
        stored = as_operator(env, lambda api: Kube(api, identity="e2e").mark_partition_lease(
            namespace=env.ns, group=GROUP, partition=20, member="pod-r", uid=new_uid,
            seen_rv=seen))
        assert stored is not None
        assert stored["metadata"]["annotations"]["kgroup.dev/assigned-uid"] == new_uid
        taken: Any = take()
        assert taken.spec.holder_identity == "pod-r"
        assert taken.metadata.annotations["kgroup.dev/holder-uid"] == new_uid
        released: Any = write(both(release, position))
        assert released.spec.holder_identity is None
    finally:
        api.close()  # type: ignore[no-untyped-call]


def test_the_operators_leader_election_passes_its_policy_and_labels_its_lease(
        env: Env) -> None:
    """leader.py as shipped, under the operator's token: it takes over an unlabelled leader
    Lease (as an older version left it), renews and releases it, and creates a new one
    after a delete; every write is allowed and leaves kgroup's label on the Lease."""
    from kgroup_operator.leader import LeaseElector

    env.admin.delete_namespaced_lease(LEADER, env.ns)
    env.admin.create_namespaced_lease(env.ns, _lease(LEADER))  # unlabelled, free

    def elector(api: ApiClient, name: str = LEADER) -> LeaseElector:
        return LeaseElector(api, namespace=env.ns, name=name, identity="operator-1",
                            duration=15)

    async def acquire(api: ApiClient) -> bool:
        return await elector(api)._try_acquire()

    def role() -> str | None:
        labels: dict[str, str] = read(env, LEADER)["metadata"].get("labels") or {}
        return labels.get("kgroup.dev/role")

    assert role() is None
    assert as_operator(env, acquire)  # a replace that adds the labels
    assert role() == "operator-leader" and read(env, LEADER)["spec"]["holderIdentity"] == \
        "operator-1"

    assert as_operator(env, lambda api: elector(api)._renew())
    env.admin.delete_namespaced_lease(LEADER, env.ns)
    assert as_operator(env, acquire)  # 404: a create, labelled
    assert role() == "operator-leader"
    env.admin.create_namespaced_lease(env.ns, _lease("kgroup-not-mine"))
    with pytest.raises(ApiError) as info:  # RBAC: only its own leader Lease
        as_operator(env, lambda api: elector(api, "kgroup-not-mine")._try_acquire())
    assert info.value.status == 403


def test_with_watched_namespaces_the_operator_has_roles_there_and_nothing_elsewhere(
        cluster: Cluster, kube: client.ApiClient, env: Env,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The other install mode (operator.watchNamespaces set): Roles in the watched
    namespaces only. The operator writes kgroup's locks there; RBAC refuses it every other
    namespace, kube-system included; the policy still refuses a non-kgroup Lease there."""
    release = f"prw-{secrets.token_hex(3)}"
    objs = [o for o in _render(cluster, env.ns, release, f"operator.watchNamespaces={{{env.ns}}}")
            if "worker" not in o["metadata"]["name"]]
    assert not [o for o in objs if o["kind"] == "ClusterRole"]
    try:
        out = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objs), check=False)
        assert out.returncode == 0, out.stderr
        sa = next(o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount")
        path = service_account_kubeconfig(
            cluster, namespace=env.ns, service_account=sa, user="operator-roles",
            path=tmp_path_factory.mktemp("roles") / "operator.kubeconfig")
        with api_client_from_kubeconfig(path) as api:
            roles = Env(env.ns, env.admin, env.worker, client.CoordinationV1Api(api))
            wait_for("the second operator policy", lambda: answer(roles, create(
                "operator", _lease("probe-roles"))).startswith("policy: "), timeout=60)
            table = [
                ("a lock in its namespace", create("operator", lock(90)), "allowed"),
                ("a lock elsewhere", create("operator", lock(90), ns="default"), "rbac"),
                ("kube-system", create("operator", _lease(
                    "x", labels=_partition_labels(1)), ns="kube-system"), "rbac"),
                ("another app's Lease in its namespace", create("operator", _lease("app-2")),
                 "policy"),
            ]
            got = {what: answer(roles, call).split(":")[0] for what, call, _ in table}
            assert got == {what: expected for what, _, expected in table}
    finally:
        for o in objs:
            if "namespace" not in o["metadata"] and o["kind"] != "ServiceAccount":
                cluster.kubectl("delete", "--ignore-not-found", o["kind"].lower(),
                                o["metadata"]["name"], check=False)
