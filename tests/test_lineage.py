"""Partition lineage, rule by rule: placement, reshapes, states, retirement, wire form."""

from __future__ import annotations

import copy
import json
from fractions import Fraction
from typing import Any

import pytest

from kgroup.core.lineage import (
    HASH_SPACE,
    MAX_GENERATIONS,
    Generation,
    Lineage,
    LineageError,
    Merge,
    Placement,
    Split,
    State,
    Uniform,
    initial,
    key_hash,
    partition_of,
    reshape,
)
from kgroup.core.lineage_codec import decode, encode
from kgroup.core.ranges import parse_ranges
from kgroup_pipeline.keys import partition_for

KEYS = [f"user-{i}" for i in range(200)]


def range_lineage(widths: list[Fraction]) -> Lineage:
    gen = Generation(1, Placement.RANGE, tuple(range(len(widths))), tuple(widths))
    return Lineage((gen,), next_partition=len(widths))


def complete_all(lineage: Lineage, partitions: list[int]) -> Lineage:
    for p in partitions:
        lineage = lineage.complete(p)
    return lineage


# -- generation 1: today's placement --------------------------------------------------------


def test_generation_one_places_keys_as_the_producer_does_today() -> None:
    lineage = initial(16)
    for key in KEYS:
        assert lineage.partition_of(key_hash(key)) == partition_for(key, 16)
    assert lineage.latest.partitions == tuple(range(16))
    assert lineage.assignable() == frozenset(range(16))
    assert {lineage.state(p) for p in range(16)} == {State.OPEN}


def test_a_range_generation_finds_a_key_by_its_hash_range() -> None:
    gen = initial(4, Placement.RANGE).latest
    quarter = HASH_SPACE // 4
    assert [partition_of(h, gen) for h in (0, quarter - 1, quarter, HASH_SPACE - 1)] \
        == [0, 0, 1, 3]
    assert gen.span(2) == (2 * quarter, 3 * quarter)
    with pytest.raises(ValueError, match="outside"):
        gen.partition_of(HASH_SPACE)


# -- reshapes ---------------------------------------------------------------------------------


def test_the_first_reshape_of_a_modulo_group_waits_for_every_old_partition() -> None:
    before = initial(16)
    after = reshape(before, Uniform(24))
    assert after.latest.partitions == tuple(range(16, 40))
    assert after.next_partition == 40
    for q in range(16, 40):
        assert after.predecessors(q) == tuple(range(16))
    assert after.successors(3) == tuple(range(16, 40))
    assert {after.state(p) for p in range(16)} == {State.SEALED}
    assert after.assignable() == frozenset(range(16))
    for key in KEYS:
        assert after.partition_of(key_hash(key)) == \
            16 + key_hash(key) * 24 // HASH_SPACE


def test_a_modulo_predecessor_set_narrower_than_the_count_is_the_residues_of_the_range() -> None:
    # 50,000 residues, 100,000 ranges of 42,949 or 42,950 hashes: each successor can
    # receive the keys of only the residues its range contains.
    after = initial(50_000).reshape(Uniform(100_000))
    first, wraps = 50_000, 50_000 + 1
    assert after.predecessors(first) == tuple(range(42_949))
    lo, hi = after.latest.span(wraps)
    residues = sorted({h % 50_000 for h in range(lo, hi)})
    assert after.predecessors(wraps) == tuple(residues)
    assert 0 in residues and 49_999 in residues  # the range wraps round the residues


def test_a_uniform_reshape_between_ranges_links_overlapping_ranges() -> None:
    gen2 = initial(16).reshape(Uniform(24))
    gen3 = gen2.reshape(Uniform(8))  # each of 8 covers exactly 3 of 24
    assert gen3.latest.partitions == tuple(range(40, 48))
    assert [gen3.predecessors(q) for q in (40, 47)] == [(16, 17, 18), (37, 38, 39)]
    gen4 = gen3.reshape(Uniform(16))  # each of 16 is half of one of 8
    assert [gen4.predecessors(q) for q in (48, 49, 63)] == [(40,), (40,), (47,)]
    assert gen4.successors(40) == (48, 49)


def test_a_split_gives_the_halves_new_numbers_and_carries_the_rest() -> None:
    before = initial(4, Placement.RANGE)
    after = before.reshape(Split(1))
    assert after.latest.partitions == (0, 4, 5, 2, 3)
    assert after.predecessors(4) == after.predecessors(5) == (1,)
    assert after.predecessors(2) == ()  # carried: same number, same range, no wait
    assert after.successors(1) == (4, 5)
    lo, hi = before.latest.span(1)
    assert after.latest.span(4)[0] == lo and after.latest.span(5)[1] == hi
    assert after.state(1) is State.SEALED and after.state(2) is State.OPEN
    assert after.assignable() == frozenset({0, 1, 2, 3})


def test_a_merge_joins_adjacent_ranges_only() -> None:
    lineage = initial(4, Placement.RANGE)
    merged = lineage.reshape(Merge(2, 1))
    assert merged.latest.partitions == (0, 4, 3)
    assert merged.predecessors(4) == (1, 2)
    with pytest.raises(LineageError, match="0 and 2 are not adjacent"):
        lineage.reshape(Merge(0, 2))
    with pytest.raises(LineageError, match="partition 1 is not in the newest generation"):
        merged.reshape(Merge(0, 1))


def test_numbers_are_never_reused_even_when_a_range_comes_back() -> None:
    lineage = initial(4, Placement.RANGE).reshape(Split(1)).reshape(Merge(4, 5))
    assert lineage.latest.partitions == (0, 6, 2, 3)  # 1's range again, a new number
    assert lineage.predecessors(6) == (4, 5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (Split(3), "places keys by hash % 16: its first reshape must be uniform"),
        (Merge(3, 4), "its first reshape must be uniform"),
        (Uniform(0), "1 to 100000 partitions, not 0"),
    ],
)
def test_a_modulo_generation_takes_only_a_uniform_reshape(change: Any, message: str) -> None:
    with pytest.raises(LineageError, match=message):
        initial(16).reshape(change)


def test_a_reshape_that_changes_nothing_or_splits_a_single_hash_is_refused() -> None:
    with pytest.raises(LineageError, match="changes no range"):
        initial(8, Placement.RANGE).reshape(Uniform(8))
    tiny = range_lineage([Fraction(1, HASH_SPACE), 1 - Fraction(1, HASH_SPACE)])
    with pytest.raises(LineageError, match="partition 0 owns 1 hash: too few to split"):
        tiny.reshape(Split(0))
    with pytest.raises(LineageError, match="partition 9 is not in the newest"):
        tiny.reshape(Split(9))


def test_a_lineage_keeps_at_most_max_generations() -> None:
    lineage = initial(4, Placement.RANGE)
    for _ in range(MAX_GENERATIONS - 1):
        lineage = lineage.reshape(Split(lineage.latest.partitions[0]))
    with pytest.raises(LineageError, match="oldest must be read to its end and retired"):
        lineage.reshape(Split(lineage.latest.partitions[0]))


# -- states and the rule ------------------------------------------------------------------------


def test_a_successor_is_assignable_only_once_every_predecessor_is_completed() -> None:
    lineage = initial(16).reshape(Uniform(24)).reshape(Uniform(8))
    assert lineage.assignable() == frozenset(range(16))
    for p in range(15):
        lineage = lineage.complete(p)
        assert not lineage.is_assignable(16)
        assert lineage.assignable() == frozenset(range(p + 1, 16))
    lineage = lineage.complete(15)
    assert lineage.assignable() == frozenset(range(16, 40))  # not yet 40-47
    lineage = complete_all(lineage, [16, 17])
    assert not lineage.is_assignable(40)
    lineage = lineage.complete(18)
    assert lineage.is_assignable(40) and not lineage.is_assignable(41)
    assert lineage.state(18) is State.COMPLETED


def test_completion_is_refused_for_an_open_partition_or_before_its_predecessors() -> None:
    lineage = initial(4, Placement.RANGE).reshape(Split(1)).reshape(Split(4))
    with pytest.raises(LineageError, match="partition 0 is open: only a sealed"):
        lineage.complete(0)
    with pytest.raises(LineageError, match="partition 4 cannot be completed before its "
                                           "predecessors 1"):
        lineage.complete(4)
    done = lineage.complete(1)
    with pytest.raises(LineageError, match="partition 1 is completed"):
        done.complete(1)


# -- retirement -------------------------------------------------------------------------------


def test_the_oldest_generation_retires_once_all_it_hands_over_is_completed() -> None:
    lineage = initial(4, Placement.RANGE).reshape(Split(1)).reshape(Uniform(2))
    assert lineage.retirable() == frozenset()
    lineage = lineage.complete(1)
    assert lineage.retirable() == frozenset({1})  # 0, 2, 3 are carried into generation 2
    before = {p: lineage.is_assignable(p) for p in lineage.partitions - {1}}
    retired = lineage.retire()
    assert [g.number for g in retired.generations] == [2, 3]
    assert retired.partitions == lineage.partitions - {1}
    assert retired.completed == frozenset()
    assert {p: retired.is_assignable(p) for p in retired.partitions} == before
    assert retired.predecessors(4) == ()
    assert retired.retire() == retired
    # the dropped number is not issued again
    assert 1 not in retired.reshape(Uniform(3)).latest.partitions
    assert retired.next_partition == lineage.next_partition


def test_the_newest_generation_never_retires() -> None:
    lineage = initial(16)
    assert lineage.retirable() == frozenset() and lineage.retire() == lineage
    lineage = complete_all(lineage.reshape(Uniform(24)), list(range(16)))
    assert lineage.retirable() == frozenset(range(16))
    assert lineage.retire().generations == (lineage.latest,)


# -- wire form --------------------------------------------------------------------------------

EXAMPLE = {
    "nextPartition": 42,
    "generations": [
        {"generation": 1, "placement": "modulo", "partitions": "0-15"},
        {"generation": 2, "placement": "range", "partitions": "16-39", "widths": "1/24*24"},
        {"generation": 3, "placement": "range", "partitions": "16,40-41,18-39",
         "widths": "1/24,1/48*2,1/24*22"},
    ],
    "states": {"open": "16,18-41", "sealed": "0-2,4-15,17", "completed": "3"},
}


def example() -> Lineage:
    return initial(16).reshape(Uniform(24)).reshape(Split(17)).complete(3)


def test_the_documented_example_encodes_as_shown_and_decodes_back() -> None:
    assert encode(example()) == EXAMPLE
    assert decode(json.loads(json.dumps(EXAMPLE))) == example()


def test_the_example_is_the_one_in_the_docs() -> None:
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "reshape.md").read_text()
    for gen in EXAMPLE["generations"]:  # type: ignore[attr-defined]
        assert f'partitions: "{gen["partitions"]}"' in text


def test_two_thousand_partitions_over_eight_generations_stay_small() -> None:
    lineage = initial(2000).reshape(Uniform(2000))
    for i in range(6):
        ps = lineage.latest.partitions
        change = Split(ps[300 * i]) if i % 2 == 0 else Merge(ps[300 * i], ps[300 * i + 1])
        lineage = lineage.reshape(change)
    text = json.dumps(encode(lineage))
    assert len(text) < 2000
    assert decode(json.loads(text)) == lineage


def mutated(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc: Any = copy.deepcopy(EXAMPLE)
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc  # type: ignore[no-any-return]


DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("states",), DELETE, r"lineage: missing fields \['states'\]"),
        (("extra",), 1, r"lineage: unknown fields \['extra'\]"),
        (("generations",), [], "1 to 8 generations, not 0"),
        (("generations",), "0-15", "lineage.generations: expected list"),
        (("generations", 1), 7, r"generations\[1\]: expected a mapping, got int"),
        (("generations", 1, "generation"), 5, "generation 5 follows generation 1"),
        (("generations", 1, "generation"), True, r"generations\[1\].generation: expected int"),
        (("generations", 1, "placement"), "hash", "'hash' is neither modulo nor range"),
        (("generations", 1, "widths"), DELETE, "a range generation needs widths"),
        (("generations", 0, "widths"), "1", "a modulo generation has no widths"),
        (("generations", 0, "partitions"), "1-16", "modulo: its partitions must be 0-15"),
        (("generations", 1, "widths"), "1/24*23", "24 partitions but 23 widths"),
        (("generations", 1, "widths"), "1/24*23,1/12", "widths add up to 25/24, not 1"),
        (("generations", 1, "widths"), "1/24*23,0/1", "every width must be positive"),
        (("generations", 1, "widths"), "1/24*23,x", "bad width 'x'"),
        (("generations", 1, "widths"), "1/0*24", "zero denominator"),
        (("generations", 1, "widths"), "1/24*999999", "more than 100000 widths"),
        (("generations", 1, "widths"), "1/281474976710657*24", "finer than 1/2\\*\\*48"),
        (("generations", 1, "partitions"), "16-38,16", "lists a partition twice"),
        (("generations", 1, "partitions"), "0-999999999", "names 1000000000 partitions"),
        (("generations", 1, "partitions"), "15-38", "partition 15 is in generations 1 and 2 "
                                                    "with different ranges"),
        (("generations", 2, "partitions"), "16,40-41,18-38,3",
         "partition 3 reappears in generation 3: numbers are never reused"),
        (("generations", 2, "partitions"), "16,40-41,18-38,17",
         "partition 17 is in generations 2 and 3 with different ranges"),
        (("generations", 2, "partitions"), "16,42-43,18-39", "next partition 42 must be above"),
        (("nextPartition",), 30, "next partition 30 must be above every partition"),
        (("states", "completed"), "3,16", "16 are completed but open"),
        (("states", "completed"), "3,17", "partition 17 is completed but its predecessors "
                                          "0-2,4-15 are not"),
        (("states", "completed"), "3,99", "completed partitions 99 are in no kept generation"),
        (("states", "sealed"), "0-15,17", "lineage.states.sealed: lists 0-15,17, but the "
                                          "generations make 0-2,4-15,17 sealed"),
        (("states", "open"), DELETE, "lineage.states.open: lists none"),
        (("states", "done"), "3", r"lineage.states: unknown fields \['done'\]"),
    ],
)
def test_decode_refuses_what_is_not_a_lineage_naming_field_and_rule(
        path: tuple[Any, ...], value: Any, message: str) -> None:
    with pytest.raises(LineageError, match=message):
        decode(mutated(path, value))


def test_decode_refuses_a_huge_text_before_expanding_it() -> None:
    doc = mutated(("states", "sealed"), "0-" + "9" * 9 + "," * 3_000_000)
    with pytest.raises(LineageError, match="longer than any list"):
        decode(doc)


def test_state_strings_are_the_project_range_strings() -> None:
    states = EXAMPLE["states"]
    assert isinstance(states, dict)
    assert parse_ranges(states["sealed"]) == [0, 1, 2, *range(4, 16), 17]
