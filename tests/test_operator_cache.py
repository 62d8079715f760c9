"""The operator's cache: what it keeps of pods and Leases, and how it orders updates."""

from __future__ import annotations

from typing import Any

from kgroup import constants as C
from kgroup.core.lease_codec import not_older, parse_member_lease
from kgroup.core.operator.lease_cache import Cache as World
from kgroup.core.operator.lease_cache import pod_observation


def member_lease(
    pod: str, *, session: str = "s1", renew: str = "t1", rv: str = "10", epoch: str | None = "3"
) -> dict[str, Any]:
    ann = {C.ANNOTATION_SESSION: session}
    if epoch is not None:
        ann[C.ANNOTATION_EPOCH] = epoch
    return {
        "metadata": {
            "name": f"g-member-{pod}",
            "resourceVersion": rv,
            "annotations": ann,
            "labels": {C.LABEL_GROUP: "g", C.LABEL_ROLE: C.ROLE_MEMBER, C.LABEL_MEMBER: pod},
        },
        "spec": {"holderIdentity": pod, "leaseDurationSeconds": 3, "renewTime": renew},
    }


def lock(n: int, holder: str | None, session: str | None, rv: str = "20") -> dict[str, Any]:
    ann = {C.ANNOTATION_SESSION: session} if session else {}
    return {
        "metadata": {
            "name": f"g-partition-{n}",
            "resourceVersion": rv,
            "annotations": ann,
            "labels": {
                C.LABEL_GROUP: "g",
                C.LABEL_ROLE: C.ROLE_PARTITION,
                C.LABEL_PARTITION: str(n),
            },
        },
        "spec": {"holderIdentity": holder, "leaseTransitions": 1},
    }


def _rv(rv: str | None) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": rv}}


def test_an_older_resource_version_is_not_newer() -> None:
    assert not not_older(_rv("9"), _rv("10"))
    assert not_older(_rv("10"), _rv("10")) and not_older(_rv("11"), _rv("10"))
    assert not_older(_rv(None), _rv("10"))


def test_a_pod_is_ready_only_with_a_true_ready_condition() -> None:
    body = {
        "metadata": {"name": "p", "labels": {"a": "b"}},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]},
    }
    obs = pod_observation(body)
    assert obs.running and not obs.ready and not obs.terminating


def test_membership_reads_the_app_containers_not_the_pods_ready_condition() -> None:
    """The sidecar is Ready only once it holds its target: a pod not Ready because of it
    is still eligible, a pod whose app container is not ready is not."""
    def pod(app_ready: bool, sidecar_ready: bool, native: bool) -> dict[str, object]:
        sidecar = {"name": "kgroup-sidecar", "ready": sidecar_ready}
        status: dict[str, object] = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": str(app_ready and sidecar_ready)}],
            "containerStatuses": [{"name": "worker", "ready": app_ready}]
            + ([] if native else [sidecar]),
        }
        if native:
            status["initContainerStatuses"] = [sidecar]
        return {"metadata": {"name": "p"}, "status": status}

    for native in (True, False):
        assert pod_observation(pod(True, False, native)).ready
        assert not pod_observation(pod(False, True, native)).ready
        assert pod_observation(pod(True, True, native)).ready


def test_a_pod_with_a_deletion_timestamp_is_terminating() -> None:
    body = {"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert pod_observation(body).terminating


def test_a_member_lease_is_read_with_its_session_and_epoch() -> None:
    view = parse_member_lease(member_lease("w-0")).value
    assert (view.member, view.session, view.epoch_annotation, view.duration) == (
        "w-0",
        "s1",
        "3",
        3.0,
    )


def test_a_member_session_is_live_for_one_duration_after_its_last_renewal() -> None:
    world = World(known={("ns", "g")})
    key = world.put_lease("ns", member_lease("w-0", renew="t1"), now=100.0)
    assert key == ("ns", "g")
    leases = world.group(("ns", "g"))
    assert leases.live_sessions(102.9) == {"w-0": "s1"}
    assert leases.live_sessions(103.0) == {}


def test_a_renewal_restarts_the_session_clock() -> None:
    world = World(known={("ns", "g")})
    world.put_lease("ns", member_lease("w-0", renew="t1", rv="10"), now=100.0)
    world.put_lease("ns", member_lease("w-0", renew="t2", rv="11"), now=102.0)
    assert world.group(("ns", "g")).live_sessions(104.5) == {"w-0": "s1"}


def test_a_stale_event_does_not_overwrite_a_fresher_lease() -> None:
    world = World(known={("ns", "g")})
    world.put_lease("ns", member_lease("w-0", epoch="5", rv="11"), now=0.0)
    world.put_lease("ns", member_lease("w-0", epoch="4", rv="10"), now=1.0)
    assert world.group(("ns", "g")).members["w-0"].epoch_annotation == "5"


def test_a_deleted_member_lease_ends_the_session() -> None:
    world = World(known={("ns", "g")})
    world.put_lease("ns", member_lease("w-0"), now=0.0)
    world.drop_lease("ns", member_lease("w-0"))
    assert world.group(("ns", "g")).live_sessions(0.5) == {}


def test_partition_leases_become_lock_observations() -> None:
    world = World(known={("ns", "g")})
    world.put_lease("ns", lock(0, "w-0", "s1"), now=0.0)
    world.put_lease("ns", lock(1, None, None), now=0.0)
    locks = sorted(world.group(("ns", "g")).locks(), key=lambda x: x.partition)
    assert [(x.partition, x.holder, x.session) for x in locks] == [
        (0, "w-0", "s1"),
        (1, None, None),
    ]


def test_the_next_expiry_is_the_earliest_live_session_end() -> None:
    world = World(known={("ns", "g")})
    world.put_lease("ns", member_lease("w-0"), now=10.0)
    world.put_lease("ns", member_lease("w-1", session="s2"), now=11.0)
    assert world.group(("ns", "g")).next_expiry(12.0) == 13.0


def test_a_statefulset_s_kept_ordinals_follow_its_spec_and_its_deletion() -> None:
    c = World()
    sts = {"metadata": {"name": "orders"}, "spec": {"replicas": 3}}
    assert c.put_statefulset("ns", sts) is True
    assert c.put_statefulset("ns", sts) is False  # unchanged: no group poked
    assert c.kept_ordinals("ns") == {"StatefulSet/orders": range(0, 3)}
    c.put_statefulset("ns", {"metadata": {"name": "orders"},
                             "spec": {"replicas": 2, "ordinals": {"start": 5}}})
    assert c.kept_ordinals("ns") == {"StatefulSet/orders": range(5, 7)}
    c.drop_statefulset("ns", "orders")
    assert c.kept_ordinals("ns") == {"StatefulSet/orders": range(0)}
    assert c.kept_ordinals("other") == {}


def test_leases_of_a_group_that_does_not_exist_are_not_kept() -> None:
    """A worker can create member Leases naming any group; the operator keeps
    only those of ConsumerGroups that exist, and forgets a group's when it is deleted."""
    world = World(known={("ns", "g")})
    for i in range(100):
        assert world.put_lease("ns", member_lease("w-0") | {"metadata": {
            **member_lease("w-0")["metadata"],
            "name": f"ghost-{i}-member-w-0",
            "labels": {**member_lease("w-0")["metadata"]["labels"],
                       "kgroup.dev/group": f"ghost-{i}"}}}, now=0.0) is None
    assert world.put_lease("other-ns", member_lease("w-0"), now=0.0) is None
    assert world.put_lease("ns", member_lease("w-0"), now=0.0) == ("ns", "g")
    assert set(world.groups) == {("ns", "g")}
    assert world.group_added(("ns", "ghost-1")) and not world.group_added(("ns", "g"))
    world.group_removed(("ns", "g"))
    assert ("ns", "g") not in world.groups
    assert world.put_lease("ns", member_lease("w-0"), now=1.0) is None
    assert world.drop_lease("ns", member_lease("w-0")) is None
    assert set(world.groups) == set()


def test_the_lock_list_follows_every_change_of_holder_or_session() -> None:
    """``GroupLeases.locks()`` is kept between passes and built again only when a lock's
    holder or session changed, was added or deleted: each of those must show."""
    from kgroup.core.operator.lease_cache import GroupLeases

    g = GroupLeases()
    g.put(lock(0, "a", "s-a", rv="20"), 0.0)
    g.put(lock(1, None, None, rv="21"), 0.0)
    assert {(x.partition, x.holder, x.session) for x in g.locks()} == {
        (0, "a", "s-a"), (1, None, None)}
    kept = g.locks()
    g.put(lock(0, "a", "s-a", rv="22"), 0.0)  # a write that moves neither: the same list
    assert g.locks() is kept
    g.put(lock(0, "b", "s-b", rv="23"), 0.0)  # another holder
    g.put(lock(1, "a", "s-a2", rv="24"), 0.0)  # taken
    assert {(x.partition, x.holder, x.session) for x in g.locks()} == {
        (0, "b", "s-b"), (1, "a", "s-a2")}
    g.put(lock(1, "a", "s-a3", rv="25"), 0.0)  # a new session of the same holder
    assert (1, "a", "s-a3") in {(x.partition, x.holder, x.session) for x in g.locks()}
    g.put(lock(2, None, None, rv="26"), 0.0)  # created
    g.drop(lock(0, "b", "s-b", rv="27"))  # deleted
    assert sorted(x.partition for x in g.locks()) == [1, 2]
