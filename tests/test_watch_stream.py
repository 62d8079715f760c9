"""The watch stream's pure decisions (kgroup.core.operator.watch_stream): lines cut from any
chunking, a bounded line, what each event means, and the backoff between attempts."""

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


def test_backoff_grows_to_a_bound_and_is_none_without_failures() -> None:
    waits = [ws.backoff(n) for n in range(0, 9)]
    assert waits[0] == 0.0
    assert waits[1:] == sorted(waits[1:]) and waits[1] > 0
    assert max(waits) == ws.BACKOFF_SECONDS[-1] == waits[-1]
