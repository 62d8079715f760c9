"""The sidecar's local HTTP API (aiohttp), exactly as in docs/protocol.md and its OpenAPI
document ``openapi.yaml`` (served at ``GET /openapi.yaml``).

On a Unix socket or loopback only (settings refuse anything else). Every error is JSON
``{"error": "..."}``. The long-poll waits on the sidecar's change event, not on a timer loop.
"""

from __future__ import annotations

import asyncio
import json
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from kgroup.core.assignment import PartitionView, View
from kgroup_sidecar.runtime import Sidecar
from kgroup_sidecar.settings import Settings

SIDECAR_KEY: web.AppKey[Sidecar] = web.AppKey("sidecar", Sidecar)
DEFAULT_WAIT = 30.0
MAX_WAIT = 300.0
RELEASE_TIMEOUT = 60.0
OPENAPI = resources.files("kgroup_sidecar") / "openapi.yaml"
"""The API's contract; every route and status code here is in it (tests check both)."""


class AssignmentText:
    """``GET /v1/assignment``'s body, its ``partitions`` encoded once per view the member
    keeps (:meth:`kgroup.core.member.reconcile.Member.view` returns the same tuple while
    its version stands): the follower asks about every 2 s while partitions are held.
    Building and encoding a 1,000-partition view for each ask was a third of a
    sidecar's CPU at 1,000 partitions; keeping the view removed most of it,
    this the encoding. The tuple is immutable and held here, so the same object means
    the same partitions; a fresh tuple (a change, or a revoking deadline counting down)
    is encoded again."""

    def __init__(self) -> None:
        self._partitions: tuple[PartitionView, ...] | None = None
        self._text = "[]"

    def render(self, view: View) -> str:
        if view.partitions is not self._partitions:
            self._text = json.dumps([p.to_json() for p in view.partitions])
            self._partitions = view.partitions
        head = json.dumps(view.to_json(partitions=False))
        return f'{head[:-1]}, "partitions": {self._text}}}'


ASSIGNMENT_TEXT_KEY: web.AppKey[AssignmentText] = web.AppKey("assignment_text", AssignmentText)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def assignment(request: web.Request) -> web.Response:
    sidecar = request.app[SIDECAR_KEY]
    since_text = request.query.get("since")
    wait_text = request.query.get("wait")
    try:
        since = int(since_text) if since_text is not None else None
        wait = float(wait_text) if wait_text is not None else DEFAULT_WAIT
    except ValueError:
        return _error(400, "since must be an integer and wait a number of seconds")
    if wait < 0 or wait > MAX_WAIT:
        return _error(400, f"wait must be between 0 and {MAX_WAIT:g} seconds")
    # Asking is the app's word that it is ready to take partitions (it joins); an open
    # long-poll is the app taking part (kgroup.core.member.app_presence).
    sidecar.app_called(asked=True, poll=since is not None)
    if since is not None:
        loop = asyncio.get_running_loop()
        until = loop.time() + wait
        try:
            while sidecar.member.version <= since:
                remaining = until - loop.time()
                if remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(sidecar.changed.wait(), remaining)
                except TimeoutError:
                    break
        finally:
            sidecar.app_poll_closed()
    view = sidecar.member.view(sidecar.clock())
    text = request.app[ASSIGNMENT_TEXT_KEY].render(view)
    sidecar.app_served(view)
    return web.Response(text=text, content_type="application/json")


async def group(request: web.Request) -> web.Response:
    """The group as the sidecar last saw it: name, namespace, partitions, spec.source."""
    sidecar = request.app[SIDECAR_KEY]
    obj = sidecar.logic.group
    if obj is None or sidecar.logic.group_deleted:
        return _error(503, "the ConsumerGroup has not been seen yet")
    spec = obj.get("spec") or {}
    source = spec.get("source")
    return web.json_response({
        "name": sidecar.settings.group, "namespace": sidecar.settings.namespace,
        "partitions": sidecar.logic.partitions,
        "source": source if isinstance(source, dict) else {}})


async def release(request: web.Request) -> web.Response:
    sidecar = request.app[SIDECAR_KEY]
    try:
        partition = int(request.match_info["n"])
    except ValueError:
        return _error(400, "partition must be an integer")
    try:
        body: Any = json.loads(await request.text())
    except json.JSONDecodeError:
        return _error(400, "body must be JSON: {\"token\": int, \"position\": str|null}")
    if not isinstance(body, dict):
        return _error(400, "body must be a JSON object")
    token = body.get("token")
    position = body.get("position")
    if not isinstance(token, int) or isinstance(token, bool):
        return _error(400, "token must be an integer")
    if position is not None and not isinstance(position, str):
        return _error(400, "position must be a string or null")
    completed = body.get("completed", False)
    if not isinstance(completed, bool):
        return _error(400, "completed must be true or false")
    if completed and position is None:
        return _error(400, "a completed release needs its position: the seal marker")
    sidecar.app_called()
    refused = sidecar.member.check_release(partition, token, sidecar.clock())
    if refused is not None:
        return _error(*refused)
    try:
        ok = await sidecar.app_release(partition, token, position, RELEASE_TIMEOUT,
                                       completed)
    except TimeoutError:
        return _error(503, f"partition {partition} not released yet; try again")
    if not ok:
        return _error(409, f"partition {partition} was lost before it could be released")
    return web.json_response({"released": True})


async def health(request: web.Request) -> web.Response:
    """The app's per-partition report: position, lag, stalled (kgroup.core.health)."""
    sidecar = request.app[SIDECAR_KEY]
    try:
        body: Any = json.loads(await request.text())
    except json.JSONDecodeError:
        return _error(400, "body must be JSON")
    sidecar.app_called()
    status, answer = sidecar.health.report(body)
    return web.json_response(answer, status=status)


async def healthz(request: web.Request) -> web.Response:
    """200 while the sidecar's event loop answers (``/livez`` is the same)."""
    return web.json_response({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    """200 once the whole target is held and its epoch acknowledged, else 503; the body
    says why (``kgroup.core.member.readiness``)."""
    sidecar = request.app[SIDECAR_KEY]
    verdict = sidecar.readiness()
    body = {"ready": verdict.ready, "reason": verdict.reason,
            "session": sidecar.member.session, "epoch": sidecar.member.view(
                sidecar.clock()).acked_epoch}
    return web.json_response(body, status=200 if verdict.ready else 503)


async def openapi(request: web.Request) -> web.Response:
    """This API's OpenAPI document (``openapi.yaml`` next to this module)."""
    return web.Response(text=OPENAPI.read_text(), content_type="application/yaml")


async def metrics(request: web.Request) -> web.Response:
    sidecar = request.app[SIDECAR_KEY]
    body, content_type = sidecar.metrics.exposition(request.headers.get("Accept", ""))
    return web.Response(body=body, headers={"Content-Type": content_type})


def build_app(sidecar: Sidecar) -> web.Application:
    app = web.Application()
    app[SIDECAR_KEY] = sidecar
    app[ASSIGNMENT_TEXT_KEY] = AssignmentText()
    app.router.add_get("/v1/assignment", assignment)
    app.router.add_get("/v1/group", group)
    app.router.add_post("/v1/partitions/{n}/release", release)
    app.router.add_post("/v1/health", health)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.yaml", openapi)
    return app


async def serve(sidecar: Sidecar, settings: Settings) -> web.AppRunner:
    """Serve on ``settings.listen_socket`` (a Unix socket) or loopback host:port.

    A socket file left by an earlier run of the container (the emptyDir outlives it) is
    replaced; the socket is made group-writable so an app container running under another
    uid of the pod's fsGroup can connect."""
    runner = web.AppRunner(build_app(sidecar), access_log=None)
    await runner.setup()
    site: web.BaseSite
    if settings.listen_socket is not None:
        path = Path(settings.listen_socket)
        path.parent.mkdir(parents=True, exist_ok=True)
        site = web.UnixSite(runner, str(path))
        await site.start()
        path.chmod(0o660)
    else:
        site = web.TCPSite(runner, settings.listen_host, settings.listen_port)
        await site.start()
    return runner


async def serve_probes(sidecar: Sidecar, host: str, port: int) -> web.AppRunner:
    """``/healthz``, ``/livez`` and ``/readyz`` alone on ``host:port``
    (``KGROUP_PROBE_LISTEN``: the pod's IP, for the kubelet's httpGet probes); nothing
    there can change the sidecar's state. The caller cleans the runner up."""
    app = web.Application()
    app[SIDECAR_KEY] = sidecar
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
