"""Ask the sidecar by hand: ``python3 -m kgroup_sidecar.probe /readyz``.

For a human (``kubectl exec ... -- python3 -m kgroup_sidecar.probe /readyz``), not for
the kubelet: it starts a Python interpreter, which as a probe every 2 s cost a sidecar
about 45 mCPU. The chart's probes are an httpGet on the probe port or ``find`` on the
probe files (docs/deploy.md, "Probes"). It reads the address from the container's own
``KGROUP_LISTEN`` (``unix:///path`` or ``host:port``), asks ``GET <path>`` and exits 0 on
a 2xx answer, 1 otherwise (the reason, from the JSON body, on stdout). Stdlib only.
"""

from __future__ import annotations

import http.client
import os
import socket
import sys

DEFAULT_LISTEN = "127.0.0.1:8470"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.socket_path)


def connection(listen: str, timeout: float) -> http.client.HTTPConnection:
    """A connection to the API at ``listen`` (a KGROUP_LISTEN value)."""
    if listen.startswith("unix://"):
        return _UnixConnection(listen[len("unix://"):], timeout)
    host, _, port = listen.removeprefix("http://").rpartition(":")
    return http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout)


def probe(path: str, listen: str, timeout: float = 2.0) -> tuple[bool, str]:
    conn = connection(listen, timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read(2048).decode(errors="replace")
    except (OSError, http.client.HTTPException) as exc:
        return False, f"{listen}{path}: {exc}"
    finally:
        conn.close()
    return 200 <= resp.status < 300, f"{resp.status} {body}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = args[0] if args else "/healthz"
    ok, detail = probe(path, os.environ.get("KGROUP_LISTEN") or DEFAULT_LISTEN)
    print(detail)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
