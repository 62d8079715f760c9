"""A member's renewal is taken without parsing its Lease again (``GroupLeases._renewal``:
parsing every renewal cost the operator most of its CPU): whatever sequence of Lease
versions arrives, the cache must end up exactly as parsing every version gives, and say
"material" exactly when parsing says so."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest

from kgroup import constants as C
from kgroup.core.objects import Obj
from kgroup.core.operator.lease_cache import GroupLeases


def lease(name: str, member: str, rv: int) -> Obj:
    return {"metadata": {"name": name, "resourceVersion": str(rv),
                         "labels": {C.LABEL_GROUP: "g", C.LABEL_ROLE: C.ROLE_MEMBER,
                                    C.LABEL_MEMBER: member},
                         "annotations": {C.ANNOTATION_SESSION: f"{member}-s1",
                                         C.ANNOTATION_EPOCH: "0"}},
            "spec": {"holderIdentity": member, "leaseDurationSeconds": 8}}


def mutate(rng: random.Random, body: Obj) -> Obj:
    b = copy.deepcopy(body)
    m, notes, spec = b["metadata"], b["metadata"]["annotations"], b["spec"]
    what = rng.choice(["renew"] * 6 + ["session", "epoch", "bad-epoch", "duration", "member",
                                       "no-member-label", "holder", "role", "health",
                                       "stall", "no-session"])
    if what == "session":
        notes[C.ANNOTATION_SESSION] = f"s{rng.randrange(3)}"
    elif what == "epoch":
        notes[C.ANNOTATION_EPOCH] = str(rng.randrange(3))
    elif what == "bad-epoch":
        notes[C.ANNOTATION_EPOCH] = "x"
    elif what == "duration":
        spec["leaseDurationSeconds"] = rng.choice([8, 15, 0, None])
    elif what == "member":
        m["labels"][C.LABEL_MEMBER] = rng.choice(["a", "b", "c"])
    elif what == "no-member-label":
        m["labels"].pop(C.LABEL_MEMBER, None)
    elif what == "holder":
        spec["holderIdentity"] = rng.choice(["a", "b", None])
    elif what == "role":
        m["labels"][C.LABEL_ROLE] = rng.choice([C.ROLE_MEMBER, "other"])
    elif what == "health":
        notes[C.ANNOTATION_HEALTH] = json.dumps({"lag": rng.randrange(99), "stalled": "",
                                                 "stalledCount": 0}, separators=(",", ":"))
    elif what == "stall":
        notes[C.ANNOTATION_HEALTH] = json.dumps({"stalled": "1", "stalledCount": 1})
    elif what == "no-session":
        notes.pop(C.ANNOTATION_SESSION, None)
    return b


def state(gl: GroupLeases, now: float) -> Any:
    return (gl.members, sorted(gl.bodies), gl.live_sessions(now), gl.next_expiry(now),
            [(m, gl.tracker.session_of(m), gl.tracker.marker_of(m)) for m in gl.tracker.members()])


@pytest.mark.parametrize("seed", range(60))
def test_the_renewal_shortcut_changes_nothing_parsing_would_not(seed: int) -> None:
    rng = random.Random(seed)
    fast, slow = GroupLeases(), GroupLeases()
    slow._renewal = lambda old, body, name: None  # type: ignore[method-assign]
    names = {"g-member-a": lease("g-member-a", "a", 1), "g-member-b": lease("g-member-b", "b", 2)}
    rv, now, took = 10, 0.0, 0
    for _ in range(300):
        name = rng.choice(sorted(names))
        rv += 1
        now += rng.choice([0.5, 2.0, 9.0])
        start = names[name] if rng.random() > 0.15 else lease(name, name[-1], rv)  # a reset
        body = mutate(rng, start)
        body["metadata"]["resourceVersion"] = str(rv if rng.random() > 0.05 else rv - 50)
        names[name] = body
        if rng.random() < 0.05:
            fast.drop(copy.deepcopy(body))
            slow.drop(copy.deepcopy(body))
            continue
        old = fast.bodies.get(name)
        took += old is not None and fast._renewal(old, body, name) is not None
        assert fast.put(copy.deepcopy(body), now) == slow.put(copy.deepcopy(body), now)
        assert state(fast, now) == state(slow, now)
    assert took > 40  # the shortcut was taken, not only skipped
