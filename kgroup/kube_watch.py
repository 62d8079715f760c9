"""One list+watch loop over aiohttp, for both processes: the operator's per-group Lease
watch (``kgroup_operator.lease_watch``) and the sidecar's watches (``kgroup_sidecar.kube``).

Each process brings what differs: how it lists (one request, or pages), how it opens a
request (its session, address and credentials), its JSON decoder (the operator has orjson;
the sidecar's image does not) and what it does between reads (the operator pauses its
reads to batch renewals: ``after_read``). What the stream means is decided once, in
:mod:`kgroup.core.watch_stream`: lines cut with one bound (:class:`~ws.Lines`), each event
read by :func:`~ws.step` (deliver / bookmark / 410 Gone / error), where the next attempt
starts and how long it waits (:class:`~ws.Resume`: a 410 lists again at once, any other
break watches again from the last version after a spread backoff, a stream the server
ended is watched again at once), and the server-side timeout each watch asks for
(:func:`~ws.watch_seconds`, spread).

The per-event work is the decoding, :func:`~ws.step` and the handler: events are read in
a plain loop over each chunk's lines, not through a generator per event.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, NoReturn

import aiohttp

from kgroup.core import watch_stream as ws

__all__ = ["Deliver", "Open", "follow", "stream"]

Open = Callable[[dict[str, str], aiohttp.ClientTimeout],
                AbstractAsyncContextManager[aiohttp.ClientResponse]]
"""A watch request with these query parameters (the selectors are the opener's) and this
timeout: ``session.get(url, params={**selection, **params}, headers=..., timeout=...)``."""
Deliver = Callable[[str, Any], None]
"""An event handed on: its type (ADDED, MODIFIED, DELETED) and its object."""
AfterRead = Callable[[aiohttp.ClientResponse], Awaitable[None]]
CONNECT_SECONDS = 3.0
READ_SLACK_SECONDS = 30
"""How long past its own timeout a silent stream is waited for before it counts as broken
(the server ends a watch at its timeout, and sends bookmarks meanwhile)."""


async def stream(open_: Open, resume: ws.Resume, deliver: Deliver, *,
                 loads: Callable[[bytes], Any], seconds: int,
                 after_read: AfterRead | None = None) -> None:
    """One watch request from ``resume.resource_version``, read until the server ends it
    (about ``seconds``): each event handed to ``deliver`` in order, bookmarks only moving
    the version on; ``resume`` holds the last version read however the stream stops.
    Raises :class:`~ws.Gone` (410, as the answer or as an ERROR event),
    :class:`~ws.WatchError` (any other refusal), :class:`~ws.LineTooLong`, or what
    aiohttp or ``loads`` raise."""
    rv = resume.resource_version
    params = {"watch": "true", "resourceVersion": str(rv), "allowWatchBookmarks": "true",
              "timeoutSeconds": str(seconds)}
    timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_SECONDS,
                                    sock_read=seconds + READ_SLACK_SECONDS)
    async with open_(params, timeout) as resp:
        if resp.status != 200:
            raise refusal(resp.status, await resp.read(), loads)
        lines = ws.Lines()
        step = ws.step
        try:
            async for chunk in resp.content.iter_any():
                for line in lines.feed(chunk):
                    s = step(loads(line))
                    rv = s.resource_version or rv
                    if s.deliver:
                        deliver(s.kind, s.obj)
                if after_read is not None:
                    await after_read(resp)
        finally:
            resume.read(rv)


async def follow(list_: Callable[[], Awaitable[str]], open_: Open, deliver: Deliver, *,
                 loads: Callable[[bytes], Any], name: str, log: logging.Logger,
                 resume: ws.Resume | None = None, after_read: AfterRead | None = None,
                 draw: Callable[[], float] = random.random) -> NoReturn:
    """List (``list_`` hands the objects on and returns the list's resourceVersion), then
    watch from it, for ever: :class:`~ws.Resume` decides each next attempt. Ends only
    when cancelled (or on a bug: every error of the API server or the network is
    retried)."""
    resume = resume if resume is not None else ws.Resume()
    while True:
        try:
            if resume.resource_version is None:
                resume.listed(await list_())
            await stream(open_, resume, deliver, loads=loads,
                         seconds=ws.watch_seconds(draw()), after_read=after_read)
            resume.ended()
            continue
        except ws.Gone:
            log.info("watch of %s expired (410 Gone): listing again", name)
            resume.gone()
            continue
        except ws.WatchError as exc:  # the API server refused
            resume.failed()
            log.warning("watch of %s refused (%s); retrying", name, exc)
        except Exception as exc:  # the API server went away, or sent what is not JSON
            resume.failed()  # (aiohttp.ClientError, TimeoutError, ValueError, ...)
            log.warning("watch of %s broke (%s: %s); retrying", name, type(exc).__name__, exc)
        # Backoff between reconnects only: events are waited for, never polled.
        await asyncio.sleep(resume.pause(draw()))


def refusal(status: int, raw: bytes, loads: Callable[[bytes], Any]) -> ws.WatchError:
    """An answer other than 200 as the error it stands for (410: :class:`~ws.Gone`)."""
    try:
        body = loads(raw) if raw else {}
    except ValueError:
        body = {}
    message = str(body.get("message") or "") if isinstance(body, dict) else ""
    return ws.error(status, message)
