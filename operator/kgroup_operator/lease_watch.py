"""The Leases of one ConsumerGroup: listed, then watched, by their group label, outside kopf.

Why not a kopf handler on every Lease, as for the other resources:

* **Memory**: kopf watches a resource whole (a label filter is applied in the
  process) and keeps a memory per object it sees, so every Lease a worker creates naming
  a group that does not exist (a member Lease is theirs to create) would cost the one
  operator memory: 5,000 of them grew it by 76 MB, and a restart listed them all (271 MB,
  over the chart's 256 MiB limit: an OOM-kill loop). One watch per existing group,
  selected by ``kgroup.dev/group=<name>`` on the server, reads only the Leases of groups
  that exist; it starts when the group is seen and stops when it is deleted, and its first
  listing is what the group's loop waits for (no pass plans against a half-listed group).
* **CPU**: a group's member Leases are renewed by every member every renew
  interval (1,000 members at the default 2 s: 500 events/s), and kopf spends far more per
  event than the cache does (its body wrappers, a deep copy of the body for its diff base,
  per-object loggers and throttler). A renewal that changes nothing material must cost
  almost nothing (``GroupLeases.put``).

How: each watch is a task on the operator's event loop reading the API server's stream
with aiohttp (as kopf itself does; one session, its connection pool shared by every
group's watch), through the list+watch loop the sidecar's watches run too
(:func:`kgroup.kube_watch.follow`: lines cut with one bound, the same backoff, 410 and
bookmark handling), decoded with orjson. An earlier version read it with the
``kubernetes`` client in a thread per watch: urllib3's chunked reads in Python,
``json.loads`` and the hand-over to the loop cost most of the operator's steady-state CPU
(docs/benchmarks.md). List, then watch from the list's resourceVersion (bookmarks keep it
fresh); a 410 Gone lists again, any other break watches again from the last version seen,
after a spread backoff when it failed (:class:`kgroup.core.watch_stream.Resume`). Nothing
polls.

Address and credentials are the operator's :class:`kgroup.apiclient.ApiConfig` (kubeconfig
or in-cluster), the token read per request: a rotated in-cluster token is used at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson

from kgroup import constants as C
from kgroup import kube_watch
from kgroup.apiclient import ApiConfig
from kgroup.core import watch_stream as ws
from kgroup.core.objects import Obj

log = logging.getLogger(__name__)

LIST_TIMEOUT = aiohttp.ClientTimeout(total=60, connect=5)
BATCH_SECONDS = 0.1
"""After each read of the stream, reading pauses this long (:func:`_let_it_gather`) unless
the watch's owner says otherwise (``pause``)."""


class Http:
    """One aiohttp session to the API server for every Lease watch of the process (its
    connections unbounded: one per watched group), its address and credentials the
    operator's :class:`ApiConfig`. Made lazily, inside the running loop."""

    def __init__(self, config: ApiConfig) -> None:
        self.config = config
        self.server = config.server.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.config.ssl_context, limit=0),
                cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    def headers(self) -> dict[str, str]:
        return {"Accept": "application/json", **self.config.headers()}

    def leases_url(self, namespace: str) -> str:
        return f"{self.server}/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class LeaseWatch:
    """List and watch the Leases labelled ``kgroup.dev/group=<group>`` in ``namespace``;
    ``on_list(items)`` after each listing, ``on_event(type, lease)`` per event, in the
    order they arrived, on the loop."""

    def __init__(self, http: Http, namespace: str, group: str, *,
                 on_list: Callable[[list[Obj]], None],
                 on_event: Callable[[str, Obj], None],
                 pause: Callable[[], float] | None = None) -> None:
        self.http = http
        self.namespace = namespace
        self.group = group
        self.selector = f"{C.LABEL_GROUP}={group}"
        self.on_list = on_list
        self.on_event = on_event
        self.pause = pause or (lambda: BATCH_SECONDS)
        self.events = 0
        self.reads = 0
        self.lists = 0
        self._resume = ws.Resume()
        self._stopped = False
        self._task: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()
        self._resp: aiohttp.ClientResponse | None = None

    def hurry(self) -> None:
        """End the current pause between reads now (the group is moving: its next Lease
        events are wanted at once); the pauses after it are ``pause()``'s again."""
        self._hurry.set()

    def tls_held_bytes(self) -> int | None:
        """Bytes the TLS layer read from the socket and holds undecrypted (None: no open
        watch over TLS). During a pause at most one read's worth: the rest waits in the
        kernel, unread (:func:`_let_it_gather`)."""
        conn = None if self._resp is None else self._resp.connection
        size = getattr(conn.transport, "get_read_buffer_size", None) if conn else None
        return None if size is None else int(size())

    @property
    def hurried(self) -> bool:
        """A hurry is pending: the next pause between reads is skipped (or ends now)."""
        return self._hurry.is_set()

    def alive(self) -> bool:
        """False once the watch's task ended without being asked to stop (it only ends so
        on a bug: every error of the API server or the network is retried)."""
        return self._stopped or self._task is None or not self._task.done()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"leases:{self.namespace}/{self.group}")

    def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()

    async def wait_stopped(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    # ---- the stream ----------------------------------------------------------------------

    @property
    def failures(self) -> int:
        """Attempts that failed in a row (the backoff's count)."""
        return self._resume.failures

    async def _run(self) -> None:
        await kube_watch.follow(self._list, self._open, self._deliver, loads=orjson.loads,
                                name=f"Leases of {self.namespace}/{self.group}", log=log,
                                resume=self._resume, after_read=self._after_read)

    async def _list(self) -> str:
        async with self.http.session().get(
                self.http.leases_url(self.namespace), params={"labelSelector": self.selector},
                headers=self.http.headers(), timeout=LIST_TIMEOUT) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise kube_watch.refusal(resp.status, raw, orjson.loads)
        body = orjson.loads(raw)
        self.lists += 1
        self._deliver_list(list(body.get("items") or []))
        return str(body["metadata"]["resourceVersion"])

    @contextlib.asynccontextmanager
    async def _open(self, params: dict[str, str], timeout: aiohttp.ClientTimeout
                    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One watch request (``kube_watch.stream`` reads it); held meanwhile for
        :meth:`tls_held_bytes`."""
        async with self.http.session().get(
                self.http.leases_url(self.namespace),
                params={"labelSelector": self.selector, **params},
                headers=self.http.headers(), timeout=timeout) as resp:
            self._resp = resp
            try:
                yield resp
            finally:
                self._resp = None

    async def _after_read(self, resp: aiohttp.ClientResponse) -> None:
        self.reads += 1
        await _let_it_gather(resp, self.pause(), self._hurry)

    def _deliver_list(self, items: list[Obj]) -> None:
        try:
            self.on_list(items)
        except Exception:
            log.exception("Leases of %s/%s: handling a listing failed", self.namespace,
                          self.group)

    def _deliver(self, kind: str, obj: Any) -> None:
        self.events += 1
        try:
            self.on_event(kind, obj)
        except Exception:
            log.exception("Leases of %s/%s: handling a %s failed", self.namespace,
                          self.group, kind)


async def _let_it_gather(resp: aiohttp.ClientResponse, seconds: float,
                         hurry: asyncio.Event) -> None:
    """Stop reading the connection for ``seconds`` (or until ``hurry`` is set): the events
    that arrive meanwhile wait in the socket and are read, decrypted and parsed in one go.

    Renewals arrive spread out (1,000 members at 2 s: one every 2 ms), each in a TCP
    segment of its own; read as they come, each cost a wake-up of the loop, a pass of
    asyncio's SSL layer (Python code) and aiohttp's parser: more than the event itself.
    The pause uses aiohttp's own flow control (the protocol's pause/resume), which its
    stream reader uses when its buffer fills. An event waits at most this long more (the
    pace: :func:`kgroup.core.operator.wakeup.read_pause`).

    Over TLS that alone only stops the *decrypted* data: asyncio's TLS layer goes on
    reading the socket, one wake-up per record, until 256 KiB of records wait (seen with
    strace at 200 members: one ``recvfrom`` per renewal through every pause). So for the
    pause its read-buffer limits (the public ``set_read_buffer_limits`` of asyncio's TLS
    transport) are set so that one waiting byte stops it reading the socket, and put back
    to the defaults before reading resumes (a partial record would otherwise hold them
    paused for good)."""
    conn = resp.connection
    if conn is None or conn.protocol is None:
        return
    protocol = conn.protocol
    limits = getattr(conn.transport, "set_read_buffer_limits", None)  # TLS only
    protocol.pause_reading()
    if limits is not None:
        limits(high=1, low=0)
    try:
        if not hurry.is_set() and seconds > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await hurry.wait()
        hurry.clear()
    finally:
        if protocol.transport is not None:
            if limits is not None:
                limits()
            protocol.resume_reading()
