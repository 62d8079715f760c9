"""Membership and live lock holders: who counts as a member, which locks count as held."""

from __future__ import annotations

from kgroup.core.operator.planner import (
    LockObservation,
    PodObservation,
    current_members,
    live_holders,
)
from kgroup.crd_models import LabelSelector

SELECTOR = LabelSelector(match_labels={"app": "w"})


def pod(name: str, **kw: object) -> PodObservation:
    return PodObservation(name=name, labels={"app": "w"}, **kw)  # type: ignore[arg-type]


def test_a_running_ready_pod_with_a_live_session_is_a_member() -> None:
    assert current_members(selector=SELECTOR, pods=[pod("a")], live_sessions={"a": "s1"}) == {"a"}


def test_a_pod_without_a_live_session_is_not_a_member() -> None:
    assert current_members(selector=SELECTOR, pods=[pod("a")], live_sessions={}) == set()


def test_a_pod_not_matching_the_selector_is_not_a_member() -> None:
    other = PodObservation(name="a", labels={"app": "other"})
    assert current_members(selector=SELECTOR, pods=[other], live_sessions={"a": "s"}) == set()


def test_a_pod_that_is_not_ready_is_not_a_member() -> None:
    pods = [pod("a", ready=False)]
    assert current_members(selector=SELECTOR, pods=pods, live_sessions={"a": "s"}) == set()


def test_a_pod_that_is_not_running_is_not_a_member() -> None:
    pods = [pod("a", running=False)]
    assert current_members(selector=SELECTOR, pods=pods, live_sessions={"a": "s"}) == set()


def test_a_terminating_pod_is_not_a_member() -> None:
    pods = [pod("a", terminating=True)]
    assert current_members(selector=SELECTOR, pods=pods, live_sessions={"a": "s"}) == set()


def test_a_lock_counts_as_held_only_under_its_holders_live_session() -> None:
    locks = [
        LockObservation(0, "a", "s1"),
        LockObservation(1, "a", "old-session"),
        LockObservation(2, "b", "s2"),
        LockObservation(3, None, None),
    ]
    assert live_holders(locks, {"a": "s1"}) == {0: "a"}
