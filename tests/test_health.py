"""Per-partition health: the app's reports, the sidecar's summary on the member Lease's
renewal, and the operator's Stalled condition (kgroup.core.health, kgroup.core.operator.status)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kgroup.core.health import (
    MAX_SUMMARY_BYTES,
    MAX_SUMMARY_ROWS,
    HealthBook,
    Report,
    encode_summary,
    parse_report,
    parse_reports,
    parse_summary,
)
from kgroup.core.member.requests import Answer, Ok, ReplaceLease, Request
from kgroup.core.operator.status import MemberLeaseObservation
from tests.test_sidecar_logic import Case, group, written
from tests.test_status_aggregation import ALL_HELD, agg, cond

HELD = {3: 7, 4: 2}


def test_a_report_is_refused_for_a_partition_not_held_or_under_another_token() -> None:
    book = HealthBook()
    assert book.report(Report(9, 1), HELD, 0.0) == "partition 9 is not held by this member"
    assert "token 6 is not the current one (7)" in str(book.report(Report(3, 6), HELD, 0.0))
    assert book.report(Report(3, 7, "10-0", 5), HELD, 0.0) is None
    assert [h.partition for h in book.judge(HELD, 1.0)] == [3]


def test_a_partition_is_stalled_when_the_app_says_so_or_makes_no_progress_with_lag() -> None:
    book = HealthBook(stall_after=60)
    book.report(Report(3, 7, "10-0", lag=5), HELD, 0.0)
    book.report(Report(4, 2, "20-0", lag=0), HELD, 0.0)
    assert [h.stalled for h in book.judge(HELD, 59.0)] == [False, False]
    book.report(Report(3, 7, "10-0", lag=8), HELD, 30.0)  # same position: no progress
    book.report(Report(4, 2, "20-0", lag=0), HELD, 30.0)  # nothing to do: not stuck
    h3, h4 = book.judge(HELD, 61.0)
    assert h3.stalled and not h4.stalled
    assert h3.reason == "no progress for 60s or more with a lag above 0"
    assert book.judge(HELD, 90.0)[0].reason == h3.reason  # the text does not change
    book.report(Report(3, 7, "11-0", lag=8), HELD, 62.0)  # progress clears it
    assert not book.judge(HELD, 63.0)[0].stalled
    book.report(Report(4, 2, "20-0", 0, stalled=True, reason="sink refused token 2"),
                HELD, 64.0)
    assert book.judge(HELD, 64.0)[1].reason == "sink refused token 2"


def test_time_spent_idle_is_not_time_without_progress() -> None:
    """After a quiet period (lag 0, position unchanged) the first events made
    the sidecar post PartitionStalled at once. Stalled means the lag stayed above zero
    without progress for the stall time; the clock starts when the lag rises."""
    book = HealthBook(stall_after=120)
    for t in range(0, 600, 10):  # ten idle minutes: nothing to do, position unchanged
        book.report(Report(3, 7, "10-0", lag=0), HELD, float(t))
    book.report(Report(3, 7, "10-0", lag=40), HELD, 600.0)  # events arrive
    assert not book.judge(HELD, 601.0)[0].stalled
    book.report(Report(3, 7, "10-0", lag=80), HELD, 700.0)  # still no progress...
    assert not book.judge(HELD, 719.0)[0].stalled
    assert book.judge(HELD, 720.0)[0].stalled  # ...for the whole stall time: stuck
    book.report(Report(3, 7, "10-0", lag=0), HELD, 730.0)  # caught up (lag 0): not stuck
    book.report(Report(3, 7, "10-0", lag=5), HELD, 800.0)
    assert not book.judge(HELD, 900.0)[0].stalled


def test_a_partition_that_changed_hands_is_forgotten() -> None:
    book = HealthBook()
    book.report(Report(3, 7, "10-0", 5, stalled=True), HELD, 0.0)
    assert book.judge({3: 8}, 1.0) == []  # taken again under token 8: the report was 7's


def test_the_summary_is_compact_deterministic_and_bounded() -> None:
    book = HealthBook()
    book.report(Report(3, 7, "10-0", 5, stalled=True, reason="sink refused token 7"), HELD, 0)
    book.report(Report(4, 2, "20-0", 1), HELD, 0)
    text = encode_summary(book.judge(HELD, 1.0))
    assert text == ('{"lag":6,"partitions":{"3":[5,"10-0"],"4":[1,"20-0"]},'
                    '"reason":"sink refused token 7","stalled":"3","stalledCount":1}')
    back = parse_summary(text, partitions=8)
    assert back is not None and back.stalled == (3,) and back.lag == 6
    assert back.partitions[4] == (1, "20-0")
    held = {p: 1 for p in range(5000)}
    big = HealthBook()
    for p in range(0, 5000, 2):
        big.report(Report(p, 1, f"{p}-123456789", 10**9, stalled=True), held, 0)
    text = encode_summary(big.judge(held, 1.0))
    assert text is not None and len(text.encode()) <= MAX_SUMMARY_BYTES
    small = json.loads(text)
    assert small["stalledCount"] == 2500 and "partitions" not in small
    assert encode_summary([]) is None


def test_the_summary_lists_the_stalled_then_the_most_behind_and_no_more_rows() -> None:
    """A renewal's size must not follow the partitions a member holds: the
    figures of at most MAX_SUMMARY_ROWS partitions, the stalled first, then the most
    behind."""
    held = {p: 1 for p in range(1000)}
    book = HealthBook()
    for p in range(1000):
        book.report(Report(p, 1, f"{p}-0", lag=p // 10, stalled=(p == 7)), held, 0)
    text = encode_summary(book.judge(held, 1.0))
    back = parse_summary(text, partitions=1000)
    assert back is not None and back.lag == sum(p // 10 for p in range(1000))
    assert back.stalled == (7,) and back.stalled_count == 1
    # stalled (though its lag is 0), then lag 99 (990-999), then of lag 98 the lowest
    assert sorted(back.partitions) == [7, *range(980, 985), *range(990, 1000)]
    assert len(back.partitions) == MAX_SUMMARY_ROWS and back.partitions[995] == (99, "995-0")
    few = {p: 1 for p in range(MAX_SUMMARY_ROWS * 62)}  # many partitions, the same size
    sizes = set()
    for n in (MAX_SUMMARY_ROWS, MAX_SUMMARY_ROWS * 8, MAX_SUMMARY_ROWS * 62):
        b = HealthBook()
        for p in range(n):
            b.report(Report(p, 1, "1700000000000-0", lag=1000 + p % 9), few, 0)
        sizes.add(len(encode_summary(b.judge(few, 1.0)) or ""))
    # only the digits of the partition numbers and of the total lag vary (without the
    # bound: 0.5 KiB, 3.2 KiB, then the 4 KiB fallback without rows)
    assert max(sizes) - min(sizes) <= 64, sizes


@pytest.mark.parametrize(("raw", "stalled"), [
    ('{"stalled":"0-99999999","stalledCount":1}', tuple(range(8))),  # clipped, not expanded
    ('{"stalled":"x"}', ()),
    ("not json", None),
    ("[1]", None),
])
def test_a_garbled_annotation_is_read_safely(raw: str, stalled: tuple[int, ...] | None) -> None:
    summary = parse_summary(raw, partitions=8)
    assert (summary.stalled if summary else None) == stalled


@pytest.mark.parametrize(("item", "error"), [
    ({"partition": 1, "token": 1, "lag": -1}, "lag must be"),
    ({"partition": True, "token": 1}, "partition must be"),
    ({"partition": 1, "token": "1"}, "token must be"),
    ({"partition": 1, "token": 1, "stalled": "yes"}, "stalled must be"),
    ({"partition": 1, "token": 1, "position": 5}, "position must be"),
])
def test_a_malformed_report_says_what_is_wrong(item: dict[str, Any], error: str) -> None:
    assert error in str(parse_report(item))


def test_the_renewal_carries_the_summary_and_drops_it_when_there_is_none() -> None:
    case = Case()
    case.observe(group(epoch=None), [])
    case.start_session()
    case.logic.health_summary = lambda: '{"stalledCount":0}'
    sent: list[Any] = []

    def answer(r: Request) -> Answer:
        assert isinstance(r, ReplaceLease)
        sent.append(r.body["metadata"]["annotations"].get("kgroup.dev/health"))
        return Ok(written(r.body, str(60 + len(sent))))

    case.now += 5.0
    (chain,) = case.tick()
    made = case.run(chain, answer)
    assert len(made) == 1  # the renewal it makes anyway: no extra write
    case.logic.health_summary = lambda: None
    case.now += 5.0
    (chain,) = case.tick()
    case.run(chain, answer)
    assert sent == ['{"stalledCount":0}', None]


def stalled_by(member: str, partitions: str) -> dict[str, MemberLeaseObservation]:
    note = json.dumps({"stalled": partitions, "stalledCount": 1, "reason": "sink refused"})
    return {"a": MemberLeaseObservation("a", "s-a", "3", note if member == "a" else None),
            "b": MemberLeaseObservation("b", "s-b", "3", note if member == "b" else None)}


def test_a_stall_reported_by_the_holder_makes_the_group_stalled_and_not_ready() -> None:
    st, problems = agg(member_leases=stalled_by("a", "1-2"))
    assert st.stalled == 2 and st.stalled_partitions == "1-2"
    assert cond(st, "Stalled") == ("True", "PartitionsStalled")
    assert cond(st, "Ready") == ("False", "PartitionsStalled")
    assert st.phase == "Degraded"
    assert [p.reason for p in problems] == ["PartitionsStalled"]  # -> one Warning Event
    assert "a (1-2): sink refused" in problems[0].message


def test_a_stall_reported_by_a_member_that_does_not_hold_the_partition_is_ignored() -> None:
    assert ALL_HELD[1] == "a"
    st, problems = agg(member_leases=stalled_by("b", "1-2"))
    assert st.stalled == 0 and problems == [] and st.phase == "Stable"
    assert cond(st, "Stalled") == ("False", "Progressing")
    assert cond(st, "Ready") == ("True", "AllPartitionsOwned")


@pytest.mark.parametrize("seed", range(150))
def test_a_renewals_summary_is_what_judging_every_partition_gives(seed: int) -> None:
    """``HealthBook.summarize`` (what each renewal asks: the stalled judged, the annotation)
    equals ``judge`` then ``encode_summary``, for books of every shape: stalls reported and
    timed out, lags missing, zero or tied, partitions dropped from ``held``, rows cut."""
    import copy
    import random

    rng = random.Random(seed)
    n = rng.choice([0, 1, 5, 16, 17, 40, 300])
    book = HealthBook(stall_after=rng.choice([10.0, 120.0]))
    held = {p: rng.randrange(1, 4) for p in rng.sample(range(2_000), n)}
    now = 0.0
    for _ in range(rng.choice([1, 3])):
        now += rng.choice([1.0, 50.0, 200.0])
        for p, token in held.items():
            if rng.random() < 0.8:
                book.report(Report(
                    p, token, rng.choice([None, "1-0", f"{int(now)}-0"]),
                    rng.choice([None, 0, 0, 5, 5, rng.randrange(10**6)]),
                    rng.random() < 0.05, rng.choice(["", "sink refused"])), held, now)
    held = {p: (t if rng.random() < 0.9 else t + 1) for p, t in held.items()
            if rng.random() < 0.95}
    now += rng.choice([0.0, 15.0, 130.0])
    slow = copy.deepcopy(book)
    judged = slow.judge(held, now)
    assert book.summarize(held, now) == ([h for h in judged if h.stalled],
                                         encode_summary(judged))


def _random_item(rng: Any, held: dict[int, int]) -> Any:
    """A report item as an app (or a hostile caller) might send it."""
    p = rng.choice(sorted(held) or [0]) if rng.random() < 0.9 else rng.randrange(50)
    item: dict[str, Any] = {"partition": p, "token": held.get(p, 1) + rng.choice([0] * 9 + [1])}
    for key, values in (("position", [None, "7-0", "", 7]), ("lag", [None, 0, 3, -1, True]),
                        ("stalled", [False, True, None, 1]),
                        ("reason", ["", "x", None, "r" * 200, 5])):
        if rng.random() < 0.5:
            item[key] = rng.choice(values)
    if rng.random() < 0.02:
        return rng.choice([None, [], "x", {"partition": True, "token": 1}, {"token": 1}])
    return item


@pytest.mark.parametrize("seed", range(150))
def test_a_batch_of_reports_is_parsed_and_booked_as_one_by_one(seed: int) -> None:
    """``parse_reports`` and ``HealthBook.report_all`` (the POST /v1/health path) give what
    ``parse_report`` and ``report`` give item by item: the same reports or the first
    item's error, the same refusals in order, the same book afterwards."""
    import copy
    import random

    rng = random.Random(seed)
    held = {p: rng.randrange(1, 4) for p in rng.sample(range(40), rng.randrange(0, 30))}
    fast, slow = HealthBook(stall_after=10.0), HealthBook(stall_after=10.0)
    now = 0.0
    for _ in range(4):
        now += rng.choice([0.5, 5.0, 20.0])
        clean = rng.random() < 0.7
        items = [_random_item(rng, held) for _ in range(rng.randrange(0, 40))]
        if clean:  # mostly well-formed batches, so the booking is exercised too
            items = [i for i in items if isinstance(parse_report(i), Report)]
        one_by_one = [parse_report(i) for i in items]
        first_error = next((r for r in one_by_one if isinstance(r, str)), None)
        batch = parse_reports(items)
        if first_error is not None:
            assert batch == first_error
            continue
        assert batch == one_by_one
        expected = [(r.partition, why) for r in one_by_one if isinstance(r, Report)
                    for why in [slow.report(r, held, now)] if why is not None]
        assert fast.report_all(copy.copy(batch), held, now) == expected
        assert fast.entries == slow.entries
