"""A renewal's health text read without parsing it when it says no stall
(``group_cache.says_no_stall``: parsing it cost the operator most of a renewal's CPU): the
shortcut must give what parsing gives (``health_key``), for every summary the sidecar
writes and for hostile texts."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from kgroup.core.health import PartitionHealth, encode_summary
from kgroup.core.operator import lease_cache as group_cache
from kgroup.core.operator.lease_cache import health_key, says_no_stall


def parsed_key(raw: str | None) -> Any:
    """health_key the slow way: always parse."""
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return raw
    if not isinstance(data, dict):
        return raw
    key = (data.get("stalled") or None, data.get("stalledCount") or None,
           data.get("reason") or None)
    return None if key == (None, None, None) else key


def summary(rng: random.Random, n: int, stall_rate: float) -> str | None:
    rows = [PartitionHealth(p, 1, rng.choice([None, f"{rng.randrange(10**9)}-0", "Ω-1",
                                              'a"b', "x\\y"]),
                            rng.choice([None, rng.randrange(10**6)]),
                            rng.random() < stall_rate, rng.choice(["", "slow", 'say "hi"']),
                            0.0, 0.0)
            for p in rng.sample(range(10_000), n)]
    return encode_summary(rows)


@pytest.mark.parametrize("seed", range(200))
def test_the_shortcut_agrees_with_parsing_on_every_summary_the_sidecar_writes(
        seed: int) -> None:
    rng = random.Random(seed)
    raw = summary(rng, rng.choice([1, 3, 20, 150, 400]), rng.choice([0.0, 0.0, 0.01, 0.5]))
    assert health_key(raw) == parsed_key(raw)


def test_every_healthy_summary_with_plain_positions_takes_the_shortcut() -> None:
    """Stream ids, offsets: what a healthy member renews with, every size it is cut to."""
    for n in (1, 20, 150, 400):
        raw = encode_summary([PartitionHealth(p, 1, f"{p * 7919}-0", p, False, "", 0.0, 0.0)
                              for p in range(n)])
        assert raw is not None and says_no_stall(raw), raw


HOSTILE = [
    '{"stalledCount":0}',
    '{"lag":1,"stalledCount":0}',
    '{"lag":1,"stalled":"","stalledCount":0}',
    '{"stalled":"3","lag":1,"stalled":"","stalledCount":0}',  # a duplicate: last wins
    '{"stalled":"3","stalledCount":0}',  # stalled not where the sidecar writes it
    '{"lag":1,"reason":"x","stalled":"","stalledCount":0}',
    '{"a":{"reason":"x"},"stalledCount":0}',
    '{"\\u0073talled":"4","stalledCount":0}',  # an escaped key: "stalled"
    '{"x":"\\"stalled\\":\\"\\"","stalledCount":0}',
    '{"stalledCount":2,"stalledCount":0}',
    '{"stalledCount":0,"stalled":"1"}',
    '{"stalledCount":00}',
    '{"partitions":{"stalledCount":0}}',
    '{"stalled":"","stalledCount":0,"x":{"stalledCount":0}}',
    '{"lag":1,"stalled":"1-3","stalledCount":3}',
    '{"lag":1,"stalled":"","stalledCount":1}',
    '[{"stalledCount":0}]',
    '"stalledCount":0}',
    "not json",
]


@pytest.mark.parametrize("raw", HOSTILE)
def test_the_shortcut_agrees_with_parsing_on_hostile_texts(raw: str) -> None:
    try:
        json.loads(raw)
    except ValueError:
        # not JSON: the shortcut may read it as no stall (as the status reads any
        # malformed annotation), but never as a stall
        assert health_key(raw) in (None, raw)
        return
    assert health_key(raw) == parsed_key(raw)


def test_a_loose_shortcut_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker's own check: a shortcut that only looks at the text's end misses a
    stall named earlier (a duplicate key) and an escaped key."""
    monkeypatch.setattr(group_cache, "says_no_stall",
                        lambda raw: raw.endswith('"stalledCount":0}'))
    wrong = [raw for raw in HOSTILE if _json(raw) and health_key(raw) != parsed_key(raw)]
    assert len(wrong) >= 3


def _json(raw: str) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True
