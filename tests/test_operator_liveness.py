"""The operator's liveness (kopf's /healthz, the pod's liveness probe) fails while a group
loop cannot do its job, and only then (an operator must not say healthy while it
plans nothing). The loop and the probe handler are the shipped ones; reconcile passes are
replaced by ones that fail as a bug would, or as an unreachable API server would."""

from __future__ import annotations

import asyncio

import kopf
import pytest

from kgroup.apiclient import ApiError
from kgroup_operator import controller as controller_module
from kgroup_operator.controller import FAILURES_UNHEALTHY, GroupController
from kgroup_operator.groups import GroupLoops
from kgroup_operator.handlers import health
from kgroup_operator.settings import OperatorSettings


class Passes:
    """What each reconcile pass does: raise ``error`` (None: succeed)."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error
        self.count = 0


def loops(monkeypatch: pytest.MonkeyPatch, passes: Passes) -> GroupLoops:
    # a failed pass is retried only when poked: each poke is one pass
    monkeypatch.setattr(controller_module, "FAILED_PASS_RETRY_SECONDS", 60.0)
    monkeypatch.setattr(controller_module, "API_RETRY_SECONDS", 60.0)
    rt = GroupLoops(kube=None, settings=OperatorSettings())  # type: ignore[arg-type]

    async def reconcile(self: GroupController) -> float | None:
        passes.count += 1
        if passes.error is not None:
            raise passes.error
        return None

    monkeypatch.setattr(GroupController, "reconcile", reconcile)
    monkeypatch.setattr(GroupLoops, "_watch", lambda self, key, c: Watch())
    return rt


class Watch:
    """A group's Lease watch (lease_watch.LeaseWatch) that is alive until it is not."""

    def __init__(self) -> None:
        self.running = True

    def alive(self) -> bool:
        return self.running

    def stop(self) -> None:
        pass


async def _passes(rt: GroupLoops, passes: Passes, n: int) -> None:
    """Poke the group's loop until it made ``n`` more passes."""
    rt.group_seen(("ns", "g"), BODY)
    goal = passes.count + n
    while passes.count < goal:
        rt.poke(("ns", "g"))
        await asyncio.sleep(0.005)


BODY = {"metadata": {"name": "g", "namespace": "ns", "resourceVersion": "1"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}}}


def test_a_group_loop_failing_again_and_again_fails_liveness(
        monkeypatch: pytest.MonkeyPatch) -> None:
    passes = Passes(RuntimeError("bug"))
    rt = loops(monkeypatch, passes)

    async def scenario() -> None:
        await _passes(rt, passes, FAILURES_UNHEALTHY - 1)
        health(rt)  # not yet: a bad pass or two happen
        await _passes(rt, passes, 1)
        with pytest.raises(kopf.PermanentError, match="ns/g: 3 passes failed in a row"):
            health(rt)
        passes.error = None
        await _passes(rt, passes, 1)  # a pass succeeds: healthy again
        assert health(rt) == {"groups": 1, "synced": False}
        await rt.stop()

    asyncio.run(scenario())


def test_an_unreachable_api_server_does_not_fail_liveness(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A restart would not bring the API server back: those failures do not count."""
    passes = Passes(ApiError(503, "ServiceUnavailable"))
    rt = loops(monkeypatch, passes)

    async def scenario() -> None:
        await _passes(rt, passes, 2 * FAILURES_UNHEALTHY)
        assert rt.controllers[("ns", "g")].failures == 0
        health(rt)
        await rt.stop()

    asyncio.run(scenario())


def test_a_group_loop_that_ended_fails_liveness(monkeypatch: pytest.MonkeyPatch) -> None:
    rt = loops(monkeypatch, Passes(None))

    async def scenario() -> None:
        rt.group_seen(("ns", "g"), BODY)
        c = rt.controllers[("ns", "g")]
        assert c.task is not None
        c.task.cancel()  # a cancelled task is a stop, not a crash
        await asyncio.wait([c.task])
        health(rt)

        async def crash() -> None:
            raise SystemError("the loop itself broke")

        c.task = asyncio.create_task(crash())
        await asyncio.wait([c.task])
        with pytest.raises(kopf.PermanentError, match="loop ended"):
            health(rt)

    asyncio.run(scenario())


def test_a_lease_watch_that_ended_fails_liveness(monkeypatch: pytest.MonkeyPatch) -> None:
    rt = loops(monkeypatch, Passes(None))

    async def scenario() -> None:
        rt.group_seen(("ns", "g"), BODY)
        health(rt)
        rt.watches[("ns", "g")].running = False  # type: ignore[attr-defined]
        with pytest.raises(kopf.PermanentError, match="ns/g: its Lease watch ended"):
            health(rt)
        await rt.stop()

    asyncio.run(scenario())


def test_the_real_lease_watch_is_not_alive_once_its_task_ended_unasked() -> None:
    """lease_watch.LeaseWatch itself: its task ends only on a bug (every API or network
    error is retried); then alive() is False. Stopped on purpose, it stays alive()."""
    from kgroup.apiclient import ApiConfig
    from kgroup_operator.lease_watch import Http, LeaseWatch

    async def scenario() -> None:
        def watch() -> LeaseWatch:
            return LeaseWatch(Http(ApiConfig("https://127.0.0.1:1", False)), "ns", "g",
                              on_list=lambda items: None, on_event=lambda kind, obj: None)

        async def bug() -> None:
            raise SystemError("the watch itself broke")

        async def forever() -> None:
            await asyncio.Event().wait()

        broken, stopped = watch(), watch()
        broken._run = bug  # type: ignore[method-assign]
        stopped._run = forever  # type: ignore[method-assign]
        assert broken.alive() and stopped.alive()  # not started yet
        broken.start()
        stopped.start()
        await broken.wait_stopped()  # its task ended (raised), unasked
        assert not broken.alive()
        assert stopped.alive()
        stopped.stop()
        await stopped.wait_stopped()
        assert stopped.alive()

    asyncio.run(scenario())
