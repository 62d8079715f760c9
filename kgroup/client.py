"""The application's client of its sidecar's local API (sync over urllib, async over aiohttp).

The one rule: a partition is reported as owned only while the sidecar's promise holds.
Every answer carries ``validForSeconds``; the client adds it to the time the request was
*sent*, on its own monotonic clock, and stops reporting the partitions after that even
when the sidecar cannot be reached (the sidecar may be paused, or its session fenced).
Measuring from the send time is conservative: the sidecar computed the figure later. So a
long-poll that waited ``w`` gets an answer with ``w`` less of it left: every long-poll
waits as :func:`follow_wait` says (half of what is left of the promise while partitions
are held), so that its answer arrives still valid.

No kubernetes import here: the app knows only its sidecar's URL (``KGROUP_SIDECAR_URL``):
``unix:///var/run/kgroup/sidecar.sock`` (a Unix socket in a volume the pod's containers
share: what the chart renders) or ``http://127.0.0.1:<port>``. Requests go straight to
that address, never through an HTTP proxy named in the environment.

This module performs the requests; the rules without I/O (an answer and its promise, what
a change of answer means to the app, how long a long-poll waits, when a release is
retried) are :mod:`kgroup.rebalance`'s, and their names are re-exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kgroup.core.assignment import View
from kgroup.core.health import Report
from kgroup.core.ranges import format_ranges, parse_ranges
from kgroup.rebalance import (
    FOLLOW_MAX_WAIT,
    FOLLOW_MIN_WAIT,
    RELEASE_RETRY_SECONDS,
    Assignment,
    AsyncRebalanceListener,
    Callback,
    Partition,
    Rebalance,
    RebalanceListener,
    _Listening,
    _per_partition,
    _Releases,
    after_release_error,
    follow_wait,
)

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "FOLLOW_MAX_WAIT",
    "FOLLOW_MIN_WAIT",
    "Assignment",
    "AsyncSidecarClient",
    "Partition",
    "Rebalance",
    "Report",
    "SidecarClient",
    "SidecarError",
    "View",
    "follow_wait",
    "format_ranges",
    "parse_ranges",
]

DEFAULT_URL = "http://127.0.0.1:8470"
UNIX_SCHEME = "unix://"


@dataclass(frozen=True)
class SidecarAddress:
    """Where the sidecar listens: a Unix socket path, or an http host and port."""

    socket_path: str | None
    host: str = "localhost"
    port: int | None = None

    @classmethod
    def parse(cls, url: str) -> SidecarAddress:
        """``unix:///abs/path.sock`` or ``http://host:port``; anything else is a ValueError."""
        if url.startswith(UNIX_SCHEME):
            path = url[len(UNIX_SCHEME):]
            if not path.startswith("/"):
                raise ValueError(f"sidecar URL {url!r}: expected unix:///absolute/path")
            return cls(socket_path=path)
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or parts.path.strip("/"):
            raise ValueError(f"sidecar URL {url!r}: expected unix:///path or http://host:port")
        return cls(socket_path=None, host=parts.hostname, port=parts.port or 80)

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.socket_path is not None:
            return _UnixHTTPConnection(self.socket_path, timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix stream socket (the Host header says ``localhost``)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _error_message(raw: bytes, fallback: str) -> str:
    try:
        payload = json.loads(raw)
    except ValueError:
        return fallback
    message = payload.get("error") if isinstance(payload, dict) else None
    return str(message or fallback)


class SidecarError(Exception):
    """The sidecar refused a request (``status`` 400/404/409/503) or could not be reached
    (``status`` 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


def _release_body(token: int, position: str | None, completed: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"token": token, "position": position}
    if completed:  # only then: the body of an ordinary release stays as it was
        body["completed"] = True
    return body


def _reports_body(reports: Iterable[Report]) -> dict[str, Any]:
    # "rate" only when said: a report without it reads the same to any sidecar
    return {"partitions": [
        {"partition": r.partition, "token": r.token, "position": r.position, "lag": r.lag,
         "stalled": r.stalled, "reason": r.reason}
        | ({} if r.rate is None else {"rate": r.rate}) for r in reports]}


LISTEN_RETRY_SECONDS = 0.5


class SidecarClient:
    """Synchronous client (stdlib http.client). One kept-alive connection per client and
    thread (a thread's long-poll never holds up another thread's request): a request on
    a connection the sidecar closed meanwhile (idle, or the sidecar restarted) is sent
    once more on a new one."""

    def __init__(self, url: str = DEFAULT_URL, *, timeout: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url.rstrip("/")
        self.address = SidecarAddress.parse(self.url)
        self.timeout = timeout
        self.clock = clock
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()
        self._released = _Releases()
        self.connections_opened = 0

    def close(self) -> None:
        """Close every thread's connection (the next request opens a new one)."""
        with self._lock:
            conns, self._open = self._open, set()
        for conn in conns:
            conn.close()

    def _connection(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """-> (this thread's connection, whether it was used before)."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        with self._lock:
            if conn is not None and conn in self._open:
                return conn, True
            conn = self.address.connection(timeout)
            self._open.add(conn)
            self.connections_opened += 1
        self._local.conn = conn
        return conn, False

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        with self._lock:
            self._open.discard(conn)

    def _exchange(self, method: str, path: str, data: bytes | None,
                  timeout: float) -> tuple[int, str, bytes]:
        while True:
            conn, reused = self._connection(timeout)
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                conn.request(method, path, body=data,
                             headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                raw = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                self._drop(conn)
                # a kept-alive connection the sidecar closed: sent again once on a new one
                # (never after a timeout). Every request of this API may be sent twice: a
                # release already done answers 404, a health report is replaced.
                if reused and isinstance(exc, ConnectionError | http.client.BadStatusLine):
                    continue
                raise SidecarError(0, f"sidecar unreachable: {exc}") from None
            if resp.will_close:
                self._drop(conn)
            return resp.status, resp.reason, raw

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None,
                 timeout: float | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        status, reason, raw = self._exchange(method, path, data, timeout or self.timeout)
        if status >= 400:
            raise SidecarError(status, _error_message(raw, reason))
        try:
            result: dict[str, Any] = json.loads(raw)
        except ValueError as exc:
            raise SidecarError(0, f"sidecar answered no JSON: {exc}") from None
        return result

    def group(self) -> dict[str, Any]:
        """``GET /v1/group``: the group's ``name``, ``namespace``, ``partitions`` and its
        ``spec.source`` as ``source`` (which stream: the group author's block). Does not
        join the group."""
        return self._request("GET", "/v1/group")

    def assignment(self) -> Assignment:
        sent = self.clock()
        return Assignment.from_json(self._request("GET", "/v1/assignment"), sent_at=sent,
                                    clock=self.clock)

    def wait_for_change(self, since: int, timeout: float = 30.0, *,
                        give_up_after: float | None = None) -> Assignment:
        """Long-poll: the view once its version is above ``since``, or after ``timeout``.
        The request is abandoned (``SidecarError``, status 0) after ``give_up_after``
        seconds (default: ``timeout`` plus the client's timeout)."""
        sent = self.clock()
        body = self._request("GET", f"/v1/assignment?since={since}&wait={timeout:g}",
                             timeout=give_up_after or timeout + self.timeout)
        return Assignment.from_json(body, sent_at=sent, clock=self.clock)

    def release(self, partition: int, token: int, position: str | None, *,
                completed: bool = False) -> bool:
        """Acknowledge a revocation (or give a partition up) with its last position. The
        partition then leaves :meth:`listen`'s view without being reported lost.
        ``completed``: the partition is sealed and ``position`` is its seal marker: it was
        read to its end (a reshape's predecessor; ``docs/protocol.md``)."""
        self._released.sent(partition, token)
        try:
            body = self._request("POST", f"/v1/partitions/{partition}/release",
                                 _release_body(token, position, completed), timeout=65.0)
        except SidecarError as exc:
            if exc.status in (404, 409):
                self._released.refused(partition, token)
            raise
        return bool(body.get("released"))

    def report_health(self, reports: Iterable[Report]) -> dict[str, Any]:
        """Report per partition its position, lag and whether it is stalled
        (``POST /v1/health``); kept in the sidecar's memory, no API write. -> the answer,
        ``{"accepted": n, "refused": [{"partition", "error"}]}``."""
        return self._request("POST", "/v1/health", _reports_body(reports))

    def release_all(self, positions: Mapping[int, str | None], *,
                    timeout: float = 30.0) -> dict[int, bool]:
        """Shutdown helper: release every partition held now, each with its position from
        ``positions`` (a partition missing there is released with the position it was
        handed over with). A 503 ("not released yet; try again") is retried until
        ``timeout``. -> partition: released (False when it was lost meanwhile)."""
        deadline = self.clock() + timeout
        out: dict[int, bool] = {}
        for p in self.assignment().partitions:
            position = positions.get(p.partition, p.position)
            while True:
                try:
                    out[p.partition] = self.release(p.partition, p.token, position)
                    break
                except SidecarError as exc:
                    outcome = after_release_error(exc.status, now=self.clock(),
                                                  deadline=deadline)
                    if outcome == "raise":
                        raise
                    if outcome == "lost":
                        out[p.partition] = False
                        break
                time.sleep(RELEASE_RETRY_SECONDS)
        return out

    def listen(self, on_rebalance: RebalanceListener, *,
               stop: threading.Event | None = None, wait: float = FOLLOW_MAX_WAIT) -> None:
        """Call ``on_rebalance`` once per change of what the member holds, until ``stop``
        is set (checked between polls: at most ``wait`` seconds apart).

        Each long-poll waits as :func:`follow_wait` says: at most ``wait`` with nothing
        held, half of what is left of the promise while partitions are held, so an answer
        arrives still valid. Partitions whose promise runs out (sidecar unreachable,
        paused, fenced) are reported lost by their deadline; a partition the app released
        through this client (:meth:`release`, :meth:`release_all`) leaves without being
        reported (the release's own answer says how it went)."""
        stop = stop or threading.Event()
        state = _Listening(self._released, wait)
        while not stop.is_set():
            now = self.clock()
            budget = state.wait(now)
            try:
                if state.current is None:
                    answer = self.assignment()
                else:
                    answer = self.wait_for_change(
                        state.current.version, budget,
                        give_up_after=state.give_up_after(now, budget, self.timeout))
            except SidecarError:
                change = state.unreachable()
                if change is not None:
                    on_rebalance(change)
                stop.wait(min(LISTEN_RETRY_SECONDS, budget))
                continue
            change = state.answered(answer)
            if change is not None:
                on_rebalance(change)

    def watch(self, on_assigned: Callback, on_revoked: Callback, on_lost: Callback, *,
              stop: threading.Event | None = None, wait: float = FOLLOW_MAX_WAIT) -> None:
        """:meth:`listen` with one callback per partition (lost, then assigned, then
        revoked)."""
        self.listen(_per_partition(on_assigned, on_revoked, on_lost), stop=stop, wait=wait)


AsyncCallback = Callable[[Partition], Awaitable[None] | None]


class AsyncSidecarClient:
    """asyncio client (aiohttp); same semantics as :class:`SidecarClient`. One HTTP
    session (one connection pool) per client, opened on the first request: close it with
    :meth:`close` or use the client as ``async with AsyncSidecarClient(...) as c``."""

    def __init__(self, url: str = DEFAULT_URL, *, timeout: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url.rstrip("/")
        self.address = SidecarAddress.parse(self.url)
        self.timeout = timeout
        self.clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._released = _Releases()
        self.sessions_opened = 0

    async def __aenter__(self) -> AsyncSidecarClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _open(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None or self._session.closed:
            connector: aiohttp.BaseConnector | None = None
            if self.address.socket_path is not None:
                connector = aiohttp.UnixConnector(path=self.address.socket_path)
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
            self.sessions_opened += 1
        return self._session

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None,
                       timeout: float | None = None) -> dict[str, Any]:
        import aiohttp

        base = "http://localhost" if self.address.socket_path is not None else self.url
        try:
            async with self._open().request(
                    method, base + path, json=body,
                    timeout=aiohttp.ClientTimeout(total=timeout or self.timeout)) as resp:
                payload: Any = await resp.json(content_type=None)
                if resp.status >= 400:
                    message = payload.get("error") if isinstance(payload, dict) else None
                    raise SidecarError(resp.status, str(message or resp.reason))
                result: dict[str, Any] = payload
                return result
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise SidecarError(0, f"sidecar unreachable: {exc}") from None

    async def group(self) -> dict[str, Any]:
        """See :meth:`SidecarClient.group`."""
        return await self._request("GET", "/v1/group")

    async def assignment(self) -> Assignment:
        sent = self.clock()
        body = await self._request("GET", "/v1/assignment")
        return Assignment.from_json(body, sent_at=sent, clock=self.clock)

    async def wait_for_change(self, since: int, timeout: float = 30.0, *,
                              give_up_after: float | None = None) -> Assignment:
        """See :meth:`SidecarClient.wait_for_change`."""
        sent = self.clock()
        body = await self._request("GET", f"/v1/assignment?since={since}&wait={timeout:g}",
                                   timeout=give_up_after or timeout + self.timeout)
        return Assignment.from_json(body, sent_at=sent, clock=self.clock)

    async def release(self, partition: int, token: int, position: str | None, *,
                      completed: bool = False) -> bool:
        """See :meth:`SidecarClient.release`."""
        self._released.sent(partition, token)
        try:
            body = await self._request("POST", f"/v1/partitions/{partition}/release",
                                       _release_body(token, position, completed),
                                       timeout=65.0)
        except SidecarError as exc:
            if exc.status in (404, 409):
                self._released.refused(partition, token)
            raise
        return bool(body.get("released"))

    async def report_health(self, reports: Iterable[Report]) -> dict[str, Any]:
        """See :meth:`SidecarClient.report_health`."""
        return await self._request("POST", "/v1/health", _reports_body(reports))

    async def release_all(self, positions: Mapping[int, str | None], *,
                          timeout: float = 30.0) -> dict[int, bool]:
        """See :meth:`SidecarClient.release_all`."""
        deadline = self.clock() + timeout
        out: dict[int, bool] = {}
        for p in (await self.assignment()).partitions:
            position = positions.get(p.partition, p.position)
            while True:
                try:
                    out[p.partition] = await self.release(p.partition, p.token, position)
                    break
                except SidecarError as exc:
                    outcome = after_release_error(exc.status, now=self.clock(),
                                                  deadline=deadline)
                    if outcome == "raise":
                        raise
                    if outcome == "lost":
                        out[p.partition] = False
                        break
                await asyncio.sleep(RELEASE_RETRY_SECONDS)
        return out

    async def listen(self, on_rebalance: AsyncRebalanceListener, *,
                     stop: asyncio.Event | None = None, wait: float = FOLLOW_MAX_WAIT) -> None:
        """See :meth:`SidecarClient.listen`."""
        stop = stop or asyncio.Event()
        state = _Listening(self._released, wait)

        async def call(change: Rebalance | None) -> None:
            result = on_rebalance(change) if change is not None else None
            if result is not None:
                await result

        while not stop.is_set():
            now = self.clock()
            budget = state.wait(now)
            try:
                if state.current is None:
                    answer = await self.assignment()
                else:
                    answer = await self.wait_for_change(
                        state.current.version, budget,
                        give_up_after=state.give_up_after(now, budget, self.timeout))
            except SidecarError:
                await call(state.unreachable())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), min(LISTEN_RETRY_SECONDS, budget))
                continue
            await call(state.answered(answer))

    async def watch(self, on_assigned: AsyncCallback, on_revoked: AsyncCallback,
                    on_lost: AsyncCallback, *, stop: asyncio.Event | None = None,
                    wait: float = FOLLOW_MAX_WAIT) -> None:
        """:meth:`listen` with one callback per partition (lost, assigned, revoked)."""

        async def call(cb: AsyncCallback, p: Partition) -> None:
            result = cb(p)
            if result is not None:
                await result

        async def listener(change: Rebalance) -> None:
            for p in change.lost:
                await call(on_lost, p)
            for p in change.assigned:
                await call(on_assigned, p)
            for p in change.revoked:
                await call(on_revoked, p)

        await self.listen(listener, stop=stop, wait=wait)
