"""The watch stream's pure decisions (kgroup.core.watch_stream), the same for the operator's
Lease watch and the sidecar's watches: lines cut from any chunking, a bounded line, what
each event means, where the next attempt starts and the backoff before it, the spread
server-side timeout."""

from __future__ import annotations

import json
import random
from types import MappingProxyType

import pytest

from kgroup.core import watch_stream as ws


def events(n: int) -> list[bytes]:
    return [json.dumps({"type": "MODIFIED", "object": {
        "metadata": {"name": f"l-{i}", "resourceVersion": str(100 + i)},
        "note": "x" * (i * 37 % 300)}}).encode() for i in range(n)]


@pytest.mark.parametrize("seed", range(20))
def test_lines_come_out_whole_whatever_the_chunking(seed: int) -> None:
    rng = random.Random(seed)
    want = events(50)
    stream = b"".join(e + b"\n" + (b"\n" if rng.random() < 0.1 else b"") for e in want)
    lines, out, i = ws.Lines(), [], 0
    while i < len(stream):
        n = rng.choice([1, 2, 7, 64, 1000, 5000])
        out += lines.feed(stream[i:i + n])
        i += n
    assert out == want  # every line once, in order, blank keep-alive lines dropped
    assert lines.pending == 0


def test_an_unfinished_line_waits_for_its_end() -> None:
    lines = ws.Lines()
    assert lines.feed(b'{"type":"ADD') == []
    assert lines.pending == 12
    assert lines.feed(b'ED"}\n{"ty') == [b'{"type":"ADDED"}']
    assert lines.pending == 4


def test_a_line_over_the_bound_is_refused_and_not_held() -> None:
    lines = ws.Lines(max_line=100)
    lines.feed(b"x" * 60)
    with pytest.raises(ws.LineTooLong):
        lines.feed(b"x" * 60)  # no newline yet: 120 bytes held would pass the bound
    assert lines.pending == 0
    with pytest.raises(ws.LineTooLong):
        lines.feed(b"y" * 101 + b"\nz")  # a whole line over the bound
    assert lines.pending == 0
    with pytest.raises(ws.LineTooLong):
        lines.feed(b"y" * 101 + b"\n")  # one whole line in one chunk (the common case)
    assert lines.feed(b'{"a":1}\n') == [b'{"a":1}'] and lines.feed(b" \n") == []
    assert lines.feed(b"x" * 100 + b"\n") == [b"x" * 100]  # at the bound: fine


def test_what_each_event_means() -> None:
    obj = {"metadata": {"name": "a", "resourceVersion": "7"}}
    for kind in ("ADDED", "MODIFIED", "DELETED"):
        s = ws.step({"type": kind, "object": obj})
        assert (s.deliver, s.kind, s.obj, s.resource_version) == (True, kind, obj, "7")
    bookmark = ws.step({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}})
    assert (bookmark.deliver, bookmark.resource_version) == (False, "9")
    with pytest.raises(ws.Gone):
        ws.step({"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                             "message": "too old resource version"}})
    with pytest.raises(ws.WatchError) as err:
        ws.step({"type": "ERROR", "object": {"code": 500, "message": "boom"}})
    assert not isinstance(err.value, ws.Gone) and err.value.code == 500
    with pytest.raises(ws.WatchError):  # an ERROR without a code is an error still
        ws.step({"type": "ERROR"})
    odd = ws.step({"type": "MODIFIED", "object": "not an object"})
    assert (odd.deliver, odd.obj, odd.resource_version) == (True, {}, None)
    proxied = ws.step(MappingProxyType({"type": "ADDED", "object": MappingProxyType(
        {"metadata": MappingProxyType({"resourceVersion": 12})})}))  # any Mapping
    assert (proxied.deliver, proxied.kind, proxied.resource_version) == (True, "ADDED", "12")
    untyped = ws.step({"object": obj})
    assert (untyped.deliver, untyped.kind) == (False, "")


def test_backoff_doubles_to_its_cap_spread_and_is_none_without_failures() -> None:
    assert ws.backoff(0, 0.9) == 0.0
    nominal = [ws.backoff(n, 0.5) for n in range(1, 12)]
    assert nominal[:6] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 6.4])
    assert nominal[6:] == [8.0] * 5  # capped
    assert ws.backoff(1, 0.0) == pytest.approx(0.15) and ws.backoff(1, 0.999) < 0.25
    waits = {round(ws.backoff(3, random.Random(i).random()), 6) for i in range(100)}
    assert len(waits) > 50 and min(waits) >= 0.6 and max(waits) <= 1.0  # spread, +-25 %


def test_watch_timeouts_are_spread_over_one_band() -> None:
    ends = {ws.watch_seconds(random.Random(i).random()) for i in range(100)}
    assert min(ends) >= ws.WATCH_SECONDS and max(ends) < 2 * ws.WATCH_SECONDS
    assert len(ends) > 50  # not one moment for every watch started together
    assert ws.watch_seconds(1.0) < 2 * ws.WATCH_SECONDS and ws.watch_seconds(-1) == 240


def test_a_410_lists_again_at_once_and_counts_no_failure() -> None:
    r = ws.Resume()
    r.listed("10")
    r.read("12")
    r.gone()
    assert (r.resource_version, r.failures, r.pause(0.5)) == (None, 0, 0.0)


def test_any_other_break_watches_again_from_the_last_version_after_a_growing_pause() -> None:
    r = ws.Resume()
    r.listed("10")
    r.read("15")  # events (or a bookmark) up to 15, then the connection broke
    r.failed()
    assert (r.resource_version, r.failures) == ("15", 1)
    assert r.pause(0.5) == pytest.approx(0.2)
    for _ in range(3):  # refused again and again: nothing read, the pause grows
        r.read("15")
        r.failed()
    assert (r.resource_version, r.failures) == ("15", 4)
    assert r.pause(0.5) == pytest.approx(1.6)


def test_the_failures_count_again_once_the_watch_moved_on_or_ended_or_listed() -> None:
    moved = ws.Resume("15", failures=3)
    moved.read("16")  # a bookmark alone is progress: the server answers
    assert (moved.resource_version, moved.failures) == ("16", 0)
    ended = ws.Resume("15", failures=3)
    ended.read("15")
    ended.ended()  # the server ended a quiet stream at its timeout: watch again at once
    assert (ended.resource_version, ended.failures, ended.pause(0.5)) == ("15", 0, 0.0)
    relisted = ws.Resume(None, failures=3)
    relisted.listed("20")
    assert (relisted.resource_version, relisted.failures) == ("20", 0)
    unread = ws.Resume("15", failures=2)
    unread.read(None)  # broke before anything was read
    assert (unread.resource_version, unread.failures) == ("15", 2)
