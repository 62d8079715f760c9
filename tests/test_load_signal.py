"""The load signal on the wire: the app's rates in its health report, the member Lease's
``kgroup.dev/load`` annotation written and read back (kgroup.core.load)."""

from __future__ import annotations

import json
import math

import pytest

from kgroup.constants import ANNOTATION_LOAD
from kgroup.core.health import HealthBook, Report, parse_report
from kgroup.core.load import (
    MAX_LOAD_BYTES,
    annotate_load,
    decode_rate,
    encode_load,
    encode_rate,
    parse_load,
)


def test_a_report_without_a_rate_stays_valid_and_carries_none() -> None:
    report = parse_report({"partition": 3, "token": 7, "lag": 5})
    assert report == Report(3, 7, None, 5, False, "", None)


def test_a_report_with_a_rate_carries_it_as_a_float() -> None:
    report = parse_report({"partition": 3, "token": 7, "rate": 12})
    assert isinstance(report, Report) and report.rate == 12.0


@pytest.mark.parametrize("rate", [-1, "5", True, math.inf, math.nan])
def test_a_bad_rate_is_refused_with_a_reason(rate: object) -> None:
    why = parse_report({"partition": 3, "token": 7, "rate": rate})
    assert isinstance(why, str) and "rate must be a finite number" in why


@pytest.mark.parametrize("rate", [1e-3, 0.37, 1.0, 41.7, 5_000.0, 123_456.0])
def test_a_rate_decodes_within_a_third_of_a_percent(rate: float) -> None:
    top = 123_456.0
    back = decode_rate(encode_rate(rate, top), top)
    assert abs(back - rate) <= 0.0028 * rate


def test_zero_is_exact_and_the_top_is_the_top_code() -> None:
    assert decode_rate(encode_rate(0.0, 10.0), 10.0) == 0.0
    assert encode_rate(10.0, 10.0) == 4095
    assert decode_rate(4095, 10.0) == 10.0


def _sizes(n: int) -> int:
    rates = {p: 1.0 + (p * 7919 % 97) for p in range(n)}
    lags = {p: 10 * p for p in range(n)}
    text = encode_load(rates, lags)
    assert text is not None
    return len(text.encode())


def test_the_encoding_size_at_10_200_and_1000_partitions() -> None:
    # the figures docs/design.md and kgroup.core.load quote
    assert (_sizes(10), _sizes(200), _sizes(1000)) == (78, 464, 2066)


def test_round_trip_keeps_totals_and_every_partition_within_a_step() -> None:
    rates = {p: 0.5 * (p % 13) for p in range(0, 400, 3)}
    lags = {p: p for p in range(0, 400, 3)}
    text = encode_load(rates, lags)
    back = parse_load(text, partitions=400)
    assert back is not None
    assert back.lag == sum(lags.values())
    assert back.rate == pytest.approx(sum(rates.values()), rel=1e-6)
    assert set(back.rates) == set(rates)
    for p, rate in rates.items():
        assert back.rates[p] == pytest.approx(rate, rel=0.0028, abs=0.0)
    assert back.reporting == len(rates)


def test_the_same_figures_give_the_same_text_whatever_the_order() -> None:
    a = encode_load({1: 2.0, 5: 3.0}, {1: 4, 5: 6})
    b = encode_load(dict(reversed(list({1: 2.0, 5: 3.0}.items()))), {5: 6, 1: 4})
    assert a == b


def test_nothing_to_say_is_no_annotation() -> None:
    assert encode_load({}, {}) is None


def test_lag_alone_is_carried_without_rates() -> None:
    text = encode_load({}, {2: 9})
    back = parse_load(text, partitions=4)
    assert back is not None and back.lag == 9 and back.rate is None and not back.rates


def test_too_many_scattered_partitions_keep_the_totals_and_the_count() -> None:
    rates = {p: 1.0 for p in range(0, 100_000, 7)}  # 14,286 partitions numbered apart
    text = encode_load(rates, {})
    assert text is not None and len(text.encode()) <= MAX_LOAD_BYTES
    back = parse_load(text, partitions=100_000)
    assert back is not None and not back.rates
    assert back.reporting == len(rates) and back.rate == pytest.approx(len(rates))


@pytest.mark.parametrize("raw", [
    None, "", "not json", "[]", '{"v":2,"rate":1}', '{"v":1,"rate":-1,"lag":-3}',
])
def test_a_malformed_or_foreign_annotation_reads_as_nothing_or_no_figure(raw: str | None
                                                                          ) -> None:
    back = parse_load(raw, partitions=10)
    assert back is None or (back.rate is None and back.lag is None and not back.rates)


def test_partitions_beyond_the_group_refuse_the_per_partition_figures() -> None:
    text = encode_load({3: 1.0, 99_999: 2.0}, {})
    back = parse_load(text, partitions=10)
    assert back is not None and back.rates == {} and back.rate == 3.0


def test_codes_that_do_not_match_the_ranges_are_ignored() -> None:
    data = json.loads(encode_load({1: 1.0, 2: 2.0}, {}) or "")
    data["q"] = data["q"][:2]
    back = parse_load(json.dumps(data), partitions=10)
    assert back is not None and back.rates == {} and back.rate == 3.0


def test_annotate_puts_and_removes_the_annotation() -> None:
    body: dict[str, object] = {"metadata": {"annotations": {"a": "b"}}}
    annotate_load(body, "x")
    assert body["metadata"] == {"annotations": {"a": "b", ANNOTATION_LOAD: "x"}}
    annotate_load(body, None)
    assert body["metadata"] == {"annotations": {"a": "b"}}


def test_the_book_gives_fresh_rates_and_lags_of_held_partitions_only() -> None:
    book = HealthBook()
    held = {1: 10, 2: 20, 3: 30}
    book.report_all([Report(1, 10, lag=5, rate=4.0), Report(2, 20, lag=7),
                     Report(3, 30, rate=1.0)], held, now=0.0)
    book.report_all([Report(1, 10, lag=6, rate=5.0)], held, now=50.0)
    rates, lags = book.loads(held, now=70.0, fresh_for=60.0)
    assert rates == {1: 5.0} and lags == {1: 6}  # 2 and 3 reported 70 s ago
    rates, lags = book.loads({1: 11}, now=51.0, fresh_for=60.0)
    assert rates == {} and lags == {}  # partition 1 changed hands: its report is gone


def test_a_rate_more_than_32_octaves_below_the_top_reads_as_the_smallest_code() -> None:
    assert encode_rate(1e-6, 123_456.0) == 1
    assert 0 < decode_rate(1, 123_456.0) < 1e-4


def test_the_batch_encoding_gives_each_rates_own_code() -> None:
    rates = {p: [0.0, 1e-12, 0.37, 5.0, 41.7, 99.9][p % 6] for p in range(60)}
    text = encode_load(rates, {})
    assert text is not None
    q = json.loads(text)["q"]
    top = float(json.loads(text)["max"])
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    got = [alphabet.index(q[2 * i]) * 64 + alphabet.index(q[2 * i + 1]) for i in range(60)]
    assert got == [encode_rate(rates[p], top) for p in range(60)]


def test_the_protocol_documents_a_real_encoding() -> None:
    # docs/protocol.md quotes this text for partitions 3 (40/s) and 7 (20/s)
    assert encode_load({3: 40.0, 7: 20.0}, {3: 100, 7: 20}) == (
        '{"lag":120,"max":40.0,"p":"3,7","q":"__9_","rate":60.0,"v":1}')
