"""The one list+watch loop both processes run (kgroup.kube_watch.follow), on scripted
answers instead of an API server: what is listed and watched from which version, what
is delivered, and how long each retry waits. The real API server's 410s, restarts and
long lines: e2e/tests/test_operator_lease_watch.py, e2e/tests/test_sidecar_apiclient.py."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from kgroup import kube_watch
from kgroup.core import watch_stream as ws


class Content:
    def __init__(self, chunks: list[bytes], then: BaseException | None) -> None:
        self.chunks, self.then = chunks, then

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.then is not None:
            raise self.then


class Answer:
    """One scripted answer to a watch request: a status and its body, or a stream of
    chunks that ends (``then`` None) or breaks (``then``: what it raises)."""

    def __init__(self, status: int = 200, chunks: list[bytes] | None = None,
                 then: BaseException | None = None, body: bytes = b"") -> None:
        self.status, self.body = status, body
        self.content = Content(chunks or [], then)

    async def read(self) -> bytes:
        return self.body


def line(kind: str, name: str, rv: str) -> bytes:
    return json.dumps({"type": kind, "object": {
        "metadata": {"name": name, "resourceVersion": rv}}}).encode() + b"\n"


def error_event(code: int) -> bytes:
    return json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": code,
                                                   "message": "m"}}).encode() + b"\n"


class Script:
    """Lists and watch answers in order; the log of what the loop did."""

    def __init__(self, lists: list[str | BaseException], answers: list[Answer]) -> None:
        self.lists, self.answers = lists, answers
        self.log: list[tuple[str, Any]] = []

    async def list_(self) -> str:
        if not self.lists:
            raise asyncio.CancelledError  # the script is over
        item = self.lists.pop(0)
        if isinstance(item, BaseException):
            self.log.append(("list-failed", None))
            raise item
        self.log.append(("list", item))
        return item

    @asynccontextmanager
    async def open_(self, params: dict[str, str], timeout: aiohttp.ClientTimeout
                    ) -> AsyncIterator[Any]:
        assert params["watch"] == "true" and params["allowWatchBookmarks"] == "true"
        assert ws.WATCH_SECONDS <= int(params["timeoutSeconds"]) < 2 * ws.WATCH_SECONDS
        assert timeout.sock_read is not None and timeout.sock_read > int(params["timeoutSeconds"])
        if not self.answers:
            raise asyncio.CancelledError
        self.log.append(("watch", params["resourceVersion"]))
        yield self.answers.pop(0)

    def deliver(self, kind: str, obj: Any) -> None:
        self.log.append((kind, obj["metadata"]["name"]))


def run(script: Script, monkeypatch: pytest.MonkeyPatch, reads: list[int] | None = None
        ) -> list[tuple[str, Any]]:
    async def no_sleep(seconds: float) -> None:
        script.log.append(("pause", round(seconds, 3)))

    async def after_read(resp: Any) -> None:
        if reads is not None:
            reads.append(1)

    async def go() -> None:
        monkeypatch.setattr(asyncio, "sleep", no_sleep)  # the pauses, recorded
        with pytest.raises(asyncio.CancelledError):
            await kube_watch.follow(script.list_, script.open_, script.deliver,
                                    loads=json.loads, name="t", log=logging.getLogger("t"),
                                    after_read=after_read, draw=lambda: 0.5)

    asyncio.run(go())
    return script.log


def test_events_in_any_chunking_bookmarks_move_the_version_a_quiet_end_watches_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stream = line("ADDED", "a", "11") + b"\n" + line("BOOKMARK", "", "15") + line(
        "MODIFIED", "a", "16")
    chunks = [stream[:7], stream[7:60], stream[60:]]
    reads: list[int] = []
    log = run(Script(["10"], [Answer(chunks=chunks), Answer(chunks=[line("BOOKMARK", "", "20")]),
                              Answer()]), monkeypatch, reads)
    assert log == [("list", "10"), ("watch", "10"), ("ADDED", "a"), ("MODIFIED", "a"),
                   ("watch", "16"), ("watch", "20")]  # ended by the server: no pause
    assert len(reads) == 4  # once per chunk read


def test_a_410_as_an_event_or_as_the_answer_lists_again_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = run(Script(["10", "30", "40"], [
        Answer(chunks=[line("ADDED", "a", "11") + error_event(410)]),
        Answer(status=410, body=b'{"kind":"Status","code":410,"message":"too old"}'),
        Answer()]), monkeypatch)
    assert log == [("list", "10"), ("watch", "10"), ("ADDED", "a"), ("list", "30"),
                   ("watch", "30"), ("list", "40"), ("watch", "40")]


def test_other_breaks_watch_again_from_the_last_version_after_a_growing_pause(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = run(Script(["10"], [
        Answer(chunks=[line("ADDED", "a", "11")], then=aiohttp.ClientPayloadError("cut")),
        Answer(status=500, body=b"not json"),
        Answer(chunks=[error_event(500)]),
        Answer(then=TimeoutError()),
        Answer(chunks=[b"{not json\n"]),
        Answer(chunks=[line("MODIFIED", "a", "12")], then=ConnectionResetError()),
        Answer()]), monkeypatch)
    assert log == [("list", "10"), ("watch", "10"), ("ADDED", "a"),
                   ("pause", 0.2), ("watch", "11"),  # it had read: counted afresh
                   ("pause", 0.4), ("watch", "11"),  # refused
                   ("pause", 0.8), ("watch", "11"),  # an ERROR event other than 410
                   ("pause", 1.6), ("watch", "11"),  # silent too long
                   ("pause", 3.2), ("watch", "11"),  # not JSON
                   ("MODIFIED", "a"), ("pause", 0.2), ("watch", "12")]


def test_a_failed_list_is_retried_after_the_pause_and_a_list_counts_afresh(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = run(Script([aiohttp.ClientConnectionError("refused"), TimeoutError(), "10"],
                     [Answer(status=503), Answer()]), monkeypatch)
    assert log == [("list-failed", None), ("pause", 0.2), ("list-failed", None),
                   ("pause", 0.4), ("list", "10"), ("watch", "10"), ("pause", 0.2),
                   ("watch", "10")]


def test_a_line_over_the_bound_breaks_the_stream_and_is_not_held(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ws, "MAX_LINE_BYTES", 1000)
    monkeypatch.setattr(ws.Lines.__init__, "__defaults__", (1000,))
    big = [b'{"type":"ADDED","object":{"x":"' + b"y" * 600, b"y" * 600, b"y" * 600]
    log = run(Script(["10"], [Answer(chunks=[line("ADDED", "a", "11"), *big]), Answer()]),
              monkeypatch)
    # broken at the bound (a failure: the pause), not read on until the server ends it
    assert log == [("list", "10"), ("watch", "10"), ("ADDED", "a"), ("pause", 0.2),
                   ("watch", "11")]
