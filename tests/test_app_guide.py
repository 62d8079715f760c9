"""docs/app-guide.md's Python examples, run as written against a real sidecar HTTP server
fed by the scripted core (tests/test_client.py).

The examples leave some names to the reader (``finish_in_flight_work``, ``stream_length``,
``processed``, ``sink_refused``, ``process``, ``url``, and in the async example
``on_rebalance`` and ``positions``): the tests supply them. A bare ``...`` statement is
the reader's own code: the tests put theirs there (wait until the example has something
to work on). Everything else runs as the page shows it, and the tests assert what the
page says it achieves.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_client import Scripted, scripted, wait
from test_client_promise import drain_within

from kgroup.client import Partition, Rebalance

__all__ = ["scripted"]  # the fixture, imported for the tests below

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "app-guide.md"
LEASE_SECONDS = 3.0  # the scripted sidecar's lease
READERS_PART = "the_readers_code"


def examples() -> dict[str, list[str]]:
    """The guide's ```python blocks, by the title of the section they are in."""
    out: dict[str, list[str]] = {}
    section = ""
    for heading, code in re.findall(r"^## ([^\n]+)$|^```python\n(.*?)^```$", GUIDE.read_text(),
                                    re.M | re.S):
        if heading:
            section = heading
        else:
            out.setdefault(section, []).append(code)
    return out


def example(title: str, index: int = 0) -> str:
    matches = [blocks for section, blocks in examples().items() if section.startswith(title)]
    assert len(matches) == 1, f"no single section {title!r} in {GUIDE}"
    return matches[0][index]


class _ReadersPart(ast.NodeTransformer):
    """``...`` as a statement -> a call of the test's code (awaited inside ``async def``)."""

    def __init__(self) -> None:
        self.in_async = [False]

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self.in_async.append(False)
        self.generic_visit(node)
        self.in_async.pop()
        return node

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        self.in_async.append(True)
        self.generic_visit(node)
        self.in_async.pop()
        return node

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        if isinstance(node.value, ast.Constant) and node.value.value is Ellipsis:
            call: ast.expr = ast.Call(ast.Name(READERS_PART, ast.Load()), [], [])
            if self.in_async[-1]:
                call = ast.Await(call)
            return ast.copy_location(ast.Expr(call), node)
        return node


def run(code: str, namespace: dict[str, Any], readers_part: Callable[[], Any] | None = None
        ) -> None:
    tree = ast.fix_missing_locations(_ReadersPart().visit(ast.parse(code)))
    namespace[READERS_PART] = readers_part or (lambda: None)
    exec(compile(tree, str(GUIDE), "exec"), namespace)  # the guide's own code


def test_the_readers_part_is_where_the_guide_writes_an_ellipsis() -> None:
    seen: list[str] = []
    run("x = 1\n...\nasync def f():\n    ...  # yours\n", ns := {}, lambda: seen.append("sync"))
    assert seen == ["sync"]

    async def in_async() -> None:
        seen.append("async")

    ns[READERS_PART] = in_async
    asyncio.run(ns["f"]())
    assert seen == ["sync", "async"]
    assert set(examples()) >= {"Sync: one callback per rebalance", "Async",
                               "Shutdown: give everything back"}


def listener_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.endswith("(listen)")]


def test_the_guides_sync_worker_runs_as_written(scripted: Scripted,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync listener (default wait), a health report, the follower and the shutdown,
    in the page's order: the listener's ``owned`` holds what is assigned and keeps it for
    two lease durations, a revoked partition is finished and released with its position,
    one finished too late for its release is given up and the listener goes on, the
    report reaches the sidecar, the follower hands its partitions to ``process``, and
    the shutdown gives everything back with the app's positions."""
    scripted.set(target=[0, 1, 2], epoch=1)
    monkeypatch.setenv("KGROUP_SIDECAR_URL", scripted.url)
    finished: list[int] = []
    worked_on: list[int] = []
    slow: set[int] = set()

    def finish_in_flight_work(partition: int) -> None:
        if partition in slow:
            time.sleep(1.0)  # longer than the drain timeout below
        finished.append(partition)

    ns: dict[str, Any] = {
        "finish_in_flight_work": finish_in_flight_work,
        "stream_length": lambda n: 100,
        "processed": lambda n: 90 + n,
        "sink_refused": lambda n: n == 3,
        "process": lambda p: worked_on.append(p.partition),
        "url": scripted.url,
    }
    before = set(listener_threads())
    run(example("Sync: one callback per rebalance", 0), ns)
    owned: dict[int, Partition] = ns["owned"]
    wait("owned", lambda: sorted(owned) == [0, 1, 2])

    ns["positions"].update({0: "0-5", 1: "1-7", 2: "2-9"})  # what the app committed
    scripted.set(target=[0, 2], epoch=2)
    wait("1 released", lambda: scripted.released.get(1) == "1-7")
    wait("1 no longer owned", lambda: sorted(owned) == [0, 2])
    assert finished == [1]
    quiet_until = time.monotonic() + 2 * LEASE_SECONDS
    while time.monotonic() < quiet_until:
        assert sorted(owned) == [0, 2]
        time.sleep(0.05)

    # Too slow: the sidecar gives 2 up at its drain timeout, the release is refused. The
    # listener goes on (a later change still reaches owned), 2 is no longer owned.
    slow.add(2)
    scripted.set(target=[0], epoch=3)
    drain_within(scripted, 0.3)
    wait("2 given up by the sidecar", lambda: 2 in finished and sorted(owned) == [0])
    assert scripted.released[2] is None  # the drain timeout's release: no position
    scripted.set(target=[0, 3], epoch=4)
    wait("3 owned", lambda: sorted(owned) == [0, 3])
    ns["positions"][3] = "3-4"

    run(example("Sync: one callback per rebalance", 1), ns)
    summary = json.loads(scripted.sc.health.summary())
    assert summary["partitions"] == {"0": [10, "0-5"], "3": [7, "3-4"]}
    assert summary["stalled"] == "3" and summary["reason"] == "sink refused the token"

    def follower_answered() -> None:
        wait("the follower's first answer", lambda: ns["follower"].latest() is not None)

    run(example("Asking before every batch"), ns, follower_answered)
    ns["follower"].stop()
    assert worked_on == [0, 3]

    run(example("Shutdown: give everything back"), ns)
    assert scripted.released == {0: "0-5", 1: "1-7", 2: None, 3: "3-4"}
    wait("the listener stopped", lambda: not set(listener_threads()) - before, timeout=5)


def test_the_guides_async_worker_runs_as_written(scripted: Scripted) -> None:
    """The async example with a coroutine ``on_rebalance``: the listener reports what is
    assigned while the app works, stops when asked, and ``release_all`` gives everything
    back with the app's positions."""
    scripted.set(target=[1, 3], epoch=1)
    calls: list[Rebalance] = []

    async def on_rebalance(change: Rebalance) -> None:
        calls.append(change)

    async def processing() -> None:
        while not calls:
            await asyncio.sleep(0.02)

    ns: dict[str, Any] = {"url": scripted.url, "on_rebalance": on_rebalance,
                          "positions": {1: "1-1", 3: "3-3"}}
    run(example("Async"), ns, processing)
    asyncio.run(asyncio.wait_for(ns["main"](), 20))
    assert [[p.partition for p in change.assigned] for change in calls] == [[1, 3]]
    assert scripted.released == {1: "1-1", 3: "3-3"}
