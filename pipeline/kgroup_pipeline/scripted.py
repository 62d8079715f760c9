"""A scripted coordinator that follows the lock rules, for tests without Kubernetes.

Rule: it behaves like the sidecars and their Lease locks, reduced to one process. A
partition has at most one holder; its token grows by one at every change of holder; a
partition moved to another member turns *revoking* at its holder and reaches the new
member only after the holder released it (handing over its position) — or after
:meth:`ScriptedCoordinator.expire` declared the holder dead, which is how a test makes a
zombie. :func:`serve_sidecar` puts one member's view behind the sidecar's HTTP API
(docs/protocol.md), so a PySpark worker in another process can be scripted too.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kgroup.client import Assignment
from kgroup_pipeline.ownership import OwnedPartition, lasting


@dataclass
class _Lock:
    holder: str | None = None
    token: int = 0
    target: str | None = None
    position: str | None = None
    position_token: int | None = None


class ScriptedCoordinator:
    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self._locks = [_Lock() for _ in range(partitions)]
        self._version = 0
        self._cv = threading.Condition()
        self.releases: list[tuple[str, int, int, str | None]] = []  # member, p, token, pos
        # GET /v1/assignment served by serve_sidecar: "ask" (plain), "poll" (since=V)
        self.requests: Counter[str] = Counter()
        self.first_asked_at: float | None = None  # time.monotonic() of the first GET
        self.completed: dict[int, str | None] = {}  # released as read to its seal: position

    def _grant(self, p: int) -> None:
        lock = self._locks[p]
        if lock.holder is None and lock.target is not None:
            lock.holder = lock.target
            lock.token += 1
            self._version += 1

    def assign(self, member: str, partitions: list[int]) -> None:
        """Target `partitions` at `member` (moving them away from any other holder)."""
        with self._cv:
            for p in partitions:
                self._locks[p].target = member
                self._grant(p)
            self._version += 1
            self._cv.notify_all()

    def move(self, partition: int, member: str) -> None:
        self.assign(member, [partition])

    def expire(self, member: str) -> None:
        """The member's session ends without a release (a crash, or a partitioned pod)."""
        with self._cv:
            for p, lock in enumerate(self._locks):
                if lock.holder == member:
                    lock.holder = None
                    if lock.target == member:
                        lock.target = None
                    self._grant(p)
            self._version += 1
            self._cv.notify_all()

    def release(self, member: str, partition: int, token: int, position: str | None, *,
                completed: bool = False) -> bool:
        """``completed``: the member read the (sealed) partition to its seal marker."""
        with self._cv:
            lock = self._locks[partition]
            if lock.holder != member or lock.token != token:
                return False
            self.releases.append((member, partition, token, position))
            if completed:
                self.completed[partition] = position
            lock.holder = None
            lock.position, lock.position_token = position, token
            if lock.target == member:
                lock.target = None
            self._grant(partition)
            self._version += 1
            self._cv.notify_all()
            return True

    def view(self, member: str) -> Assignment:
        with self._cv:
            parts = tuple(
                OwnedPartition(p, lock.token,
                               "active" if lock.target == member else "revoking",
                               lock.position)
                for p, lock in enumerate(self._locks) if lock.holder == member
            )
            return lasting(parts, member=member, version=self._version)

    def wait_for_change(self, since: int, timeout: float) -> None:
        """A long-poll's wait, as the sidecar's: until the version is not ``since``, or
        ``timeout`` seconds."""
        with self._cv:
            self._cv.wait_for(lambda: self._version != since, timeout=max(0.0, timeout))

    def holder(self, partition: int) -> tuple[str | None, int]:
        with self._cv:
            lock = self._locks[partition]
            return lock.holder, lock.token

    def ownership(self, member: str) -> ScriptedOwnership:
        return ScriptedOwnership(self, member)


class ScriptedOwnership:
    def __init__(self, coordinator: ScriptedCoordinator, member: str) -> None:
        self.coordinator = coordinator
        self.member = member

    def assignment(self) -> Assignment:
        return self.coordinator.view(self.member)

    def release(self, partition: int, token: int, position: str | None) -> bool:
        return self.coordinator.release(self.member, partition, token, position)

    def complete(self, partition: int, token: int, position: str) -> bool:
        return self.coordinator.release(self.member, partition, token, position,
                                        completed=True)


def serve_sidecar(coordinator: ScriptedCoordinator, member: str) -> tuple[ThreadingHTTPServer, str]:
    """Serve `member`'s view on a free 127.0.0.1 port as the sidecar API; returns (server, url).

    The caller stops it with ``server.shutdown(); server.server_close()``.
    """

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/v1/assignment":
                query = parse_qs(url.query)
                since = query.get("since")
                coordinator.requests["poll" if since else "ask"] += 1
                if coordinator.first_asked_at is None:
                    coordinator.first_asked_at = time.monotonic()
                if since:  # a long-poll: answered on a change, or after its wait
                    wait = float(query.get("wait", ["0"])[0])
                    coordinator.wait_for_change(int(since[0]), min(wait, 30.0))
                self._send(200, coordinator.view(member).view.to_json())
            elif url.path in ("/healthz", "/readyz"):
                self._send(200, {"ok": True})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            parts = self.path.strip("/").split("/")
            if len(parts) != 4 or parts[:2] != ["v1", "partitions"] or parts[3] != "release":
                self._send(404, {"error": "not found"})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                partition, token = int(parts[2]), int(body["token"])
            except (ValueError, KeyError, TypeError):
                self._send(400, {"error": "malformed body"})
                return
            holder, current = coordinator.holder(partition)
            if holder != member:
                self._send(404, {"error": "not held"})
            elif current != token:
                self._send(409, {"error": "stale token"})
            else:
                ok = coordinator.release(member, partition, token, body.get("position"),
                                         completed=body.get("completed") is True)
                self._send(200 if ok else 409, {"released": ok})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, name=f"sidecar-{member}", daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
