"""The sidecar's settings, read once from the environment (names in docs/protocol.md).

One frozen dataclass with a documented field per variable; a bad value is a clear message
and exit status 2 (see ``main``), never a traceback. The local API must stay local: either
a Unix socket (``KGROUP_LISTEN=unix:///var/run/kgroup/sidecar.sock``, what the chart sets:
two hostNetwork pods on one node share the host's loopback ports, never a pod's volume)
or ``host:port`` on loopback; any other bind address is refused here, before anything
listens. The metrics may also be served on their own TCP address
(``KGROUP_METRICS_LISTEN=host:port``, e.g. the pod's IP, for a scraper outside the pod): an
IP address, never a wildcard (on a hostNetwork pod that would be every interface of the
node); empty or unset: only on the local API. Likewise the probe port
(``KGROUP_PROBE_LISTEN``, the kubelet's httpGet probes: ``/healthz``, ``/livez``,
``/readyz`` only), and ``KGROUP_PROBE_DIR``, where the sidecar keeps the files its exec
probes test (``kgroup_sidecar.probe_files``).
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kgroup.core.health import DEFAULT_STALL_AFTER_SECONDS
from kgroup.core.member.app_presence import DEFAULT_APP_TIMEOUT_SECONDS
from kgroup_sidecar.watchdog import DEFAULT_LIMIT_SECONDS

UNIX_SCHEME = "unix://"
IN_CLUSTER_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class SettingsError(Exception):
    """The environment does not describe a usable sidecar."""


def _loopback(name: str, host: str) -> str:
    if host == "localhost":
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise ValueError(f"{name} host {host!r} is not an IP address") from None
    if not address.is_loopback:
        raise ValueError(f"{name} host {host!r} is not a loopback address")
    return str(address)


def _specific(name: str, host: str | None) -> str | None:
    if host is None:
        return None
    if host == "localhost":
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        raise ValueError(f"{name} host {host!r} is not an IP address") from None
    if address.is_unspecified:
        raise ValueError(f"{name} host {host!r} is a wildcard: give the pod's IP "
                         "(status.podIP) or a loopback address")
    return str(address)


def _port(name: str, value: object) -> int:
    try:
        port = int(str(value))
    except ValueError:
        raise ValueError(f"{name} port {value!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{name} port {port} is not between 0 and 65535")
    return port


def _seconds(name: str, value: object, *, zero: bool = False) -> float:
    """A positive number of seconds (``zero``: or 0, which turns the setting off)."""
    try:
        seconds = float(str(value))
    except ValueError:
        raise ValueError(f"{name} {value!r} is not a number of seconds") from None
    if zero and seconds == 0:
        return 0.0
    if not seconds > 0 or not math.isfinite(seconds):
        raise ValueError(f"{name} must be a positive number of seconds"
                         f"{' or 0' if zero else ''}, not {value!r}")
    return seconds


@dataclass(frozen=True)
class Settings:
    """One field per variable; checked and normalised on construction (``ValueError``).
    A plain dataclass, not a pydantic model: the sidecar imports no pydantic (memory,
    docs/design.md)."""

    group: str  # KGROUP_GROUP: the ConsumerGroup name
    namespace: str  # KGROUP_NAMESPACE
    pod_name: str  # KGROUP_POD_NAME: the member id
    # KGROUP_POD_UID: the pod's uid, for Events on it and to acquire only locks marked for
    # this pod (not another pod of the same name); unset: the name alone is checked here
    pod_uid: str | None = None
    listen_host: str = "127.0.0.1"  # KGROUP_LISTEN host
    listen_port: int = 8470  # KGROUP_LISTEN port
    listen_socket: str | None = None  # KGROUP_LISTEN=unix://<path>: this Unix socket
    kubeconfig: str | None = None  # KUBECONFIG; None: in-cluster
    log_level: str = "INFO"  # KGROUP_LOG_LEVEL
    audit_file: str | None = None  # KGROUP_AUDIT_FILE: JSON lines
    metrics_host: str | None = None  # KGROUP_METRICS_LISTEN host (None: no own port)
    metrics_port: int = 9471  # KGROUP_METRICS_LISTEN port
    probe_host: str | None = None  # KGROUP_PROBE_LISTEN host (None: no probe port)
    probe_port: int = 8471  # KGROUP_PROBE_LISTEN port
    probe_dir: str | None = None  # KGROUP_PROBE_DIR: readiness/liveness files here
    log_format: str = "text"  # KGROUP_LOG_FORMAT: text or json
    termination_grace_seconds: float = 30.0  # KGROUP_TERMINATION_GRACE_SECONDS
    # KGROUP_STALL_AFTER_SECONDS: no progress with lag this long = stalled
    stall_after_seconds: float = field(default=DEFAULT_STALL_AFTER_SECONDS)
    # KGROUP_APP_TIMEOUT_SECONDS: the app's part (kgroup.core.member.app_presence): the
    # sidecar joins at its app's first ask and leaves when it is silent this long; 0: no
    # app gate (joins at start, never leaves for silence: a sidecar with no app)
    app_timeout_seconds: float = field(default=DEFAULT_APP_TIMEOUT_SECONDS)
    # KGROUP_WATCHDOG_SECONDS: exit (status 3, so the kubelet restarts the container) when
    # the event loop has not turned this long (kgroup_sidecar.watchdog); 0: no watchdog
    watchdog_seconds: float = field(default=DEFAULT_LIMIT_SECONDS)

    def __post_init__(self) -> None:
        for name in ("group", "namespace", "pod_name"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        level, fmt = self.log_level.upper(), self.log_format.lower()
        if level not in LEVELS:
            raise ValueError(f"KGROUP_LOG_LEVEL {level!r} is not a logging level")
        if fmt not in {"text", "json"}:
            raise ValueError(f"KGROUP_LOG_FORMAT {fmt!r} is not text or json")
        for name in ("listen_socket", "probe_dir"):
            path = getattr(self, name)
            if path is not None and not path.startswith("/"):
                raise ValueError(f"{name} {path!r} is not an absolute path")
        fixed = {
            "log_level": level, "log_format": fmt,
            "listen_host": _loopback("KGROUP_LISTEN", self.listen_host),
            "listen_port": _port("KGROUP_LISTEN", self.listen_port),
            "metrics_host": _specific("KGROUP_METRICS_LISTEN", self.metrics_host),
            "metrics_port": _port("KGROUP_METRICS_LISTEN", self.metrics_port),
            "probe_host": _specific("KGROUP_PROBE_LISTEN", self.probe_host),
            "probe_port": _port("KGROUP_PROBE_LISTEN", self.probe_port),
            "termination_grace_seconds": _seconds("KGROUP_TERMINATION_GRACE_SECONDS",
                                                  self.termination_grace_seconds),
            "stall_after_seconds": _seconds("KGROUP_STALL_AFTER_SECONDS",
                                            self.stall_after_seconds),
            "app_timeout_seconds": _seconds("KGROUP_APP_TIMEOUT_SECONDS",
                                            self.app_timeout_seconds, zero=True),
            "watchdog_seconds": _seconds("KGROUP_WATCHDOG_SECONDS", self.watchdog_seconds,
                                         zero=True),
        }
        for name, value in fixed.items():
            object.__setattr__(self, name, value)

    @property
    def listen(self) -> str:
        """The API's address as a client URL (what ``KGROUP_SIDECAR_URL`` takes)."""
        if self.listen_socket is not None:
            return f"unix://{self.listen_socket}"
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"http://{host}:{self.listen_port}"


def _split_listen(value: str) -> dict[str, str]:
    """``unix:///path`` or ``host:port`` (``http://`` in front is accepted too)."""
    if value.startswith(UNIX_SCHEME):
        return {"listen_socket": value[len(UNIX_SCHEME):]}
    host, sep, port = value.removeprefix("http://").rpartition(":")
    if not sep or not host:
        raise SettingsError(f"KGROUP_LISTEN={value!r}: expected unix:///path or host:port")
    return {"listen_host": host, "listen_port": port}


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read the settings from ``environ`` (default: the process environment)."""
    env = os.environ if environ is None else environ
    missing = [name for name in ("KGROUP_GROUP", "KGROUP_POD_NAME") if not env.get(name)]
    if missing:
        raise SettingsError(f"missing required environment variable(s): {', '.join(missing)}")
    namespace = env.get("KGROUP_NAMESPACE")
    if not namespace:
        try:
            namespace = IN_CLUSTER_NAMESPACE_FILE.read_text().strip() or "default"
        except OSError:
            namespace = "default"
    raw: dict[str, object] = {
        **_split_listen(env.get("KGROUP_LISTEN", "127.0.0.1:8470")),
        "group": env["KGROUP_GROUP"],
        "namespace": namespace,
        "pod_name": env["KGROUP_POD_NAME"],
        "kubeconfig": env.get("KUBECONFIG") or None,
        "log_level": env.get("KGROUP_LOG_LEVEL", "INFO"),
        "audit_file": env.get("KGROUP_AUDIT_FILE") or None,
        "pod_uid": env.get("KGROUP_POD_UID") or None,
    }
    if env.get("KGROUP_LOG_FORMAT"):
        raw["log_format"] = env["KGROUP_LOG_FORMAT"]
    for var, key in (("KGROUP_METRICS_LISTEN", "metrics"), ("KGROUP_PROBE_LISTEN", "probe")):
        if env.get(var):
            host, sep, port = env[var].removeprefix("http://").rpartition(":")
            if not sep or not host:
                raise SettingsError(f"{var}={env[var]!r}: expected host:port")
            raw[f"{key}_host"], raw[f"{key}_port"] = host, port
    if env.get("KGROUP_PROBE_DIR"):
        raw["probe_dir"] = env["KGROUP_PROBE_DIR"]
    if env.get("KGROUP_STALL_AFTER_SECONDS"):
        raw["stall_after_seconds"] = env["KGROUP_STALL_AFTER_SECONDS"]
    if env.get("KGROUP_APP_TIMEOUT_SECONDS"):
        raw["app_timeout_seconds"] = env["KGROUP_APP_TIMEOUT_SECONDS"]
    if env.get("KGROUP_WATCHDOG_SECONDS"):
        raw["watchdog_seconds"] = env["KGROUP_WATCHDOG_SECONDS"]
    if env.get("KGROUP_TERMINATION_GRACE_SECONDS"):
        raw["termination_grace_seconds"] = env["KGROUP_TERMINATION_GRACE_SECONDS"]
    try:
        return Settings(**raw)  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        raise SettingsError(f"bad sidecar settings: {exc}") from None
