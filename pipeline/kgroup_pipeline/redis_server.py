"""A private redis-server on a free loopback port, for tests, benchmarks and demos.

Rule: the helper stops exactly the process it started (by PID), never a server it did not
start, and it binds to 127.0.0.1 only. Persistence is off (``--save ''``, no AOF): the data
of a test run is thrown away with its temporary directory.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from types import TracebackType

import redis


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """``with RedisServer() as srv: srv.url`` — a redis-server that lives for the block."""

    def __init__(self, *, binary: str = "redis-server", port: int | None = None) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout: float = 10.0) -> RedisServer:
        path = shutil.which(self.binary)
        if path is None:
            raise RuntimeError(
                "redis-server not found: apt-get install -y redis-server (scripts/setup.sh does)"
            )
        self._dir = tempfile.mkdtemp(prefix="kgroup-redis-")
        self._proc = subprocess.Popen(
            [path, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", self._dir, "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.url, socket_timeout=1.0)
        try:
            while True:
                if self._proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self._proc.returncode}")
                try:
                    if client.ping():
                        return self
                except redis.exceptions.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"redis-server did not answer PING on port {self.port}")
                time.sleep(0.02)
        finally:
            client.close()

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
