"""The sidecar's settings, read once from the environment (names in docs/protocol.md).

One pydantic model with a documented field per variable; a bad value is a clear message
and exit status 2 (see ``main``), never a traceback. The local API must stay local: either
a Unix socket (``KGROUP_LISTEN=unix:///var/run/kgroup/sidecar.sock``, what the chart sets:
two hostNetwork pods on one node share the host's loopback ports, never a pod's volume)
or ``host:port`` on loopback; any other bind address is refused here, before anything
listens. The metrics may also be served on their own TCP address
(``KGROUP_METRICS_LISTEN=host:port``, e.g. the pod's IP, for a scraper outside the pod): an
IP address, never a wildcard (on a hostNetwork pod that would be every interface of the
node); empty or unset: only on the local API.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kgroup.core.health import DEFAULT_STALL_AFTER_SECONDS

UNIX_SCHEME = "unix://"
IN_CLUSTER_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class SettingsError(Exception):
    """The environment does not describe a usable sidecar."""


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    group: str = Field(min_length=1, description="KGROUP_GROUP: the ConsumerGroup name")
    namespace: str = Field(min_length=1, description="KGROUP_NAMESPACE")
    pod_name: str = Field(min_length=1, description="KGROUP_POD_NAME: the member id")
    pod_uid: str | None = Field(
        default=None, description="KGROUP_POD_UID: the pod's uid, for Events on it")
    listen_host: str = Field(default="127.0.0.1", description="KGROUP_LISTEN host")
    listen_port: int = Field(default=8470, ge=0, le=65535, description="KGROUP_LISTEN port")
    listen_socket: str | None = Field(
        default=None, description="KGROUP_LISTEN=unix://<path>: serve on this Unix socket"
    )
    kubeconfig: str | None = Field(default=None, description="KUBECONFIG; None: in-cluster")
    log_level: str = Field(default="INFO", description="KGROUP_LOG_LEVEL")
    audit_file: str | None = Field(default=None, description="KGROUP_AUDIT_FILE: JSON lines")
    metrics_host: str | None = Field(
        default=None, description="KGROUP_METRICS_LISTEN host (None: no own metrics port)")
    metrics_port: int = Field(default=9471, ge=0, le=65535,
                              description="KGROUP_METRICS_LISTEN port")
    log_format: str = Field(default="text", description="KGROUP_LOG_FORMAT: text or json")
    termination_grace_seconds: float = Field(
        default=30.0, gt=0, description="KGROUP_TERMINATION_GRACE_SECONDS: SIGTERM budget"
    )

    stall_after_seconds: float = Field(
        default=DEFAULT_STALL_AFTER_SECONDS, gt=0,
        description="KGROUP_STALL_AFTER_SECONDS: no progress with lag this long = stalled")

    @field_validator("listen_host")
    @classmethod
    def _loopback_only(cls, host: str) -> str:
        if host == "localhost":
            return "127.0.0.1"
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            raise ValueError(f"KGROUP_LISTEN host {host!r} is not an IP address") from None
        if not address.is_loopback:
            raise ValueError(f"KGROUP_LISTEN host {host!r} is not a loopback address")
        return str(address)

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, level: str) -> str:
        level = level.upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError(f"KGROUP_LOG_LEVEL {level!r} is not a logging level")
        return level

    @field_validator("metrics_host")
    @classmethod
    def _specific_address(cls, host: str | None) -> str | None:
        if host is None:
            return None
        if host == "localhost":
            return "127.0.0.1"
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            raise ValueError(f"KGROUP_METRICS_LISTEN host {host!r} is not an IP address") from None
        if address.is_unspecified:
            raise ValueError(f"KGROUP_METRICS_LISTEN host {host!r} is a wildcard: give the "
                             "pod's IP (status.podIP) or a loopback address")
        return str(address)

    @field_validator("log_format")
    @classmethod
    def _known_format(cls, fmt: str) -> str:
        fmt = fmt.lower()
        if fmt not in {"text", "json"}:
            raise ValueError(f"KGROUP_LOG_FORMAT {fmt!r} is not text or json")
        return fmt

    @field_validator("listen_socket")
    @classmethod
    def _absolute_socket(cls, path: str | None) -> str | None:
        if path is not None and not path.startswith("/"):
            raise ValueError(f"KGROUP_LISTEN socket {path!r} is not an absolute path")
        return path

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
    if env.get("KGROUP_METRICS_LISTEN"):
        host, sep, port = env["KGROUP_METRICS_LISTEN"].removeprefix("http://").rpartition(":")
        if not sep or not host:
            raise SettingsError(
                f"KGROUP_METRICS_LISTEN={env['KGROUP_METRICS_LISTEN']!r}: expected host:port")
        raw["metrics_host"], raw["metrics_port"] = host, port
    if env.get("KGROUP_STALL_AFTER_SECONDS"):
        raw["stall_after_seconds"] = env["KGROUP_STALL_AFTER_SECONDS"]
    if env.get("KGROUP_TERMINATION_GRACE_SECONDS"):
        raw["termination_grace_seconds"] = env["KGROUP_TERMINATION_GRACE_SECONDS"]
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise SettingsError(f"bad sidecar settings: {problems}") from None
