"""The sidecar's settings, read once from the environment (names in docs/protocol.md).

One pydantic model with a documented field per variable; a bad value is a clear message
and exit status 2 (see ``main``), never a traceback. The local API must stay on loopback:
any other bind address is refused here, before anything listens.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

IN_CLUSTER_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class SettingsError(Exception):
    """The environment does not describe a usable sidecar."""


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    group: str = Field(min_length=1, description="KGROUP_GROUP: the ConsumerGroup name")
    namespace: str = Field(min_length=1, description="KGROUP_NAMESPACE")
    pod_name: str = Field(min_length=1, description="KGROUP_POD_NAME: the member id")
    listen_host: str = Field(default="127.0.0.1", description="KGROUP_LISTEN host")
    listen_port: int = Field(default=8470, ge=0, le=65535, description="KGROUP_LISTEN port")
    kubeconfig: str | None = Field(default=None, description="KUBECONFIG; None: in-cluster")
    log_level: str = Field(default="INFO", description="KGROUP_LOG_LEVEL")
    audit_file: str | None = Field(default=None, description="KGROUP_AUDIT_FILE: JSON lines")
    termination_grace_seconds: float = Field(
        default=30.0, gt=0, description="KGROUP_TERMINATION_GRACE_SECONDS: SIGTERM budget"
    )

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

    @property
    def listen(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"


def _split_listen(value: str) -> tuple[str, str]:
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise SettingsError(f"KGROUP_LISTEN={value!r}: expected host:port")
    return host, port


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
    host, port = _split_listen(env.get("KGROUP_LISTEN", "127.0.0.1:8470"))
    raw: dict[str, object] = {
        "group": env["KGROUP_GROUP"],
        "namespace": namespace,
        "pod_name": env["KGROUP_POD_NAME"],
        "listen_host": host,
        "listen_port": port,
        "kubeconfig": env.get("KUBECONFIG") or None,
        "log_level": env.get("KGROUP_LOG_LEVEL", "INFO"),
        "audit_file": env.get("KGROUP_AUDIT_FILE") or None,
    }
    if env.get("KGROUP_TERMINATION_GRACE_SECONDS"):
        raw["termination_grace_seconds"] = env["KGROUP_TERMINATION_GRACE_SECONDS"]
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise SettingsError(f"bad sidecar settings: {problems}") from None
