"""A producer's routing over a partition lineage: where a key goes, what a switch seals,
what a refused write does (pure, no Redis)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_lineage_properties import apply, changes

from kgroup.core.lineage import Lineage, LineageError, Split, State, Uniform, initial, key_hash
from kgroup.core.routing import (
    Refusal,
    after_refusal,
    layout_from_status,
    layout_to_status,
    newer,
    route,
    route_all,
    sealing_generation,
    to_seal,
)
from kgroup_pipeline.keys import partition_for

KEYS = [f"c{i:05d}" for i in range(2_000)]


def test_a_group_of_one_modulo_generation_routes_every_key_as_before() -> None:
    for n in (1, 7, 16, 24):
        lineage = initial(n)
        assert route_all(lineage, KEYS) == [partition_for(k, n) for k in KEYS]
        assert to_seal(lineage) == ()  # nothing to seal: a producer writes at once


def test_after_16_to_24_keys_go_to_the_new_ranges_and_all_16_are_to_be_sealed() -> None:
    lineage = initial(16).reshape(Uniform(24))
    parts = route_all(lineage, KEYS)
    assert set(parts) == set(range(16, 40))
    assert parts == [route(lineage, k) for k in KEYS]
    assert to_seal(lineage) == tuple(range(16))
    assert {sealing_generation(lineage, p) for p in range(16)} == {2}


def test_completed_partitions_need_no_seal_and_a_split_seals_only_what_it_cut() -> None:
    lineage = initial(4).reshape(Uniform(4))  # 0-3 modulo -> 4-7 ranges
    for p in range(4):
        lineage = lineage.complete(p)
    assert to_seal(lineage) == ()
    lineage = lineage.reshape(Split(5))  # 5 -> 8, 9; 4, 6, 7 carried
    assert to_seal(lineage) == (5,)
    assert sealing_generation(lineage, 5) == 3
    with pytest.raises(LineageError, match="open"):
        sealing_generation(lineage, 4)


def test_a_source_that_goes_back_never_moves_the_producer_to_an_older_generation() -> None:
    old = initial(16)
    new = old.reshape(Uniform(24))
    assert newer(None, old) is old
    assert newer(new, old) is new
    assert newer(old, new) is new
    done = new.complete(3)
    assert newer(new, done) is done  # the same generation: the answer that knows more


def test_a_refused_write_waits_for_the_sealing_generation_then_routes_again() -> None:
    old = initial(16)
    new = old.reshape(Uniform(24))
    # another producer switched first: this one's layout does not know the seal
    assert after_refusal(old, 3, 2) is Refusal.WAIT
    assert after_refusal(new, 3, 2) is Refusal.REROUTE
    # a seal newer than the layout, even on a partition it already replaced: wait
    assert after_refusal(new, 3, 3) is Refusal.WAIT
    # a partition the layout still calls open cannot be written: wait for the layout
    assert after_refusal(new, 20, 2) is Refusal.WAIT


@st.composite
def reshaped(draw: st.DrawFn) -> tuple[Lineage, Lineage]:
    """A lineage and the next one (one change applied), from generated changes."""
    lineage = draw(st.sampled_from([initial(16), initial(5)]))
    for kind, n in draw(st.lists(changes, max_size=6)):
        lineage = apply(lineage, kind, n)
    kind, n = draw(changes)
    return lineage, apply(lineage, kind, n)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reshaped(), st.lists(st.text(max_size=12), min_size=1, max_size=40))
def test_a_switch_moves_a_key_only_to_a_successor_and_seals_where_it_was(
        pair: tuple[Lineage, Lineage], keys: list[str]) -> None:
    before, after = pair
    sealed = set(to_seal(after))
    for key in keys:
        old, new = route(before, key), route(after, key)
        assert new == after.partition_of(key_hash(key))
        if old == new:
            continue
        # the key's new partition waits for its old one, which the switch seals first
        assert old in after.predecessors(new)
        assert new in after.successors(old)
        assert after.state(old) is not State.OPEN
        assert old in sealed or after.state(old) is State.COMPLETED


def test_status_layout_round_trips_and_a_group_without_it_is_one_modulo_generation() -> None:
    lineage = initial(16).reshape(Uniform(24)).complete(3)
    doc = layout_to_status(lineage)
    assert doc["generation"] == 2 and doc["states"] == {
        "open": "16-39", "sealed": "0-2,4-15", "completed": "3"}
    assert layout_from_status(doc, 16) == lineage
    assert layout_from_status(None, 16) == initial(16)  # made before lineage: unchanged
    with pytest.raises(LineageError, match="generation is 3, but its newest generation is 2"):
        layout_from_status({**doc, "generation": 3}, 16)
    with pytest.raises(LineageError, match="expected int"):
        layout_from_status({**doc, "generation": "2"}, 16)
    with pytest.raises(LineageError, match="expected a mapping"):
        layout_from_status([doc], 16)
    with pytest.raises(LineageError, match="unknown fields"):
        layout_from_status({**doc, "epoch": 1}, 16)


def test_the_status_layout_example_in_the_docs_is_what_the_codec_writes() -> None:
    text = (Path(__file__).parent.parent / "docs" / "reshape.md").read_text()
    block = text.split("```yaml\nstatus:\n", 1)[1].split("```", 1)[0]
    doc = yaml.safe_load("status:\n" + block)["status"]["layout"]
    lineage = initial(16).reshape(Uniform(24)).complete(3)
    assert doc == layout_to_status(lineage)
    assert layout_from_status(doc, 16) == lineage
