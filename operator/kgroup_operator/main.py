"""``kgroup-operator``: parse flags, elect a leader, run kopf with the handlers module.

Everything listens on 127.0.0.1 by default (kopf's liveness endpoint, the metrics port).
The metrics endpoint starts first, before leader election, so a standby serves
``kgroup_operator_leader 0`` and its process metrics. A standby replica (waiting for the
leader Lease) answers ``GET /healthz`` on the liveness port itself with
``{"state": "standby"}``, so a probe tells a live standby from a dead process; that
endpoint closes just before kopf opens its own on the same port.
Exit status: 0 on a clean stop (SIGTERM/SIGINT), 2 when leadership was lost (the pod
restarts and waits as a standby).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from typing import TYPE_CHECKING

import kopf
from aiohttp import web

from kgroup import __version__
from kgroup.apiclient import ApiClient, ConfigError, default_config
from kgroup.logs import FORMATS, LEVELS

from .groups import GroupLoops
from .kube import CONNECTIONS, Kube
from .leader import LeaseElector
from .metrics import Metrics, serve
from .settings import OperatorSettings

if TYPE_CHECKING:
    from .injector import Injector

log = logging.getLogger("kgroup_operator")


def parse_args(argv: list[str] | None, settings: OperatorSettings) -> OperatorSettings:
    p = argparse.ArgumentParser(prog="kgroup-operator", description=__doc__)
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=None,
        help="watch only this namespace (repeatable; env KGROUP_NAMESPACES)",
    )
    scope.add_argument(
        "--all-namespaces", "-A", action="store_true", help="watch every namespace (the default)"
    )
    p.add_argument(
        "--peering",
        choices=["lease", "kopf", "none"],
        default=settings.peering,
        help="how exactly one replica is active (env KGROUP_PEERING)",
    )
    p.add_argument("--leader-lease", default=settings.leader_lease_name)
    p.add_argument("--leader-namespace", default=settings.leader_lease_namespace)
    p.add_argument("--leader-lease-seconds", type=float, default=settings.leader_lease_seconds)
    p.add_argument(
        "--liveness-port",
        type=int,
        default=settings.liveness_port,
        help="kopf liveness endpoint on 127.0.0.1 (0 = off)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=settings.metrics_port,
        help="Prometheus /metrics on KGROUP_METRICS_HOST (default 127.0.0.1; 0 = off)",
    )
    p.add_argument("--status-min-interval", type=float, default=settings.status_min_interval)
    p.add_argument("--verbose", "-v", action="store_true", default=settings.verbose)
    p.add_argument("--log-level", choices=LEVELS, type=str.upper, default=settings.log_level,
                   help="env KGROUP_LOG_LEVEL")
    p.add_argument("--log-format", choices=FORMATS, type=str.lower, default=settings.log_format,
                   help="text or json lines (env KGROUP_LOG_FORMAT)")
    a = p.parse_args(argv)
    if a.all_namespaces:
        settings.namespaces = []
    elif a.namespace:
        settings.namespaces = list(a.namespace)
    settings.peering = a.peering
    settings.leader_lease_name = a.leader_lease
    settings.leader_lease_namespace = a.leader_namespace
    settings.leader_lease_seconds = a.leader_lease_seconds
    settings.liveness_port = a.liveness_port
    settings.metrics_port = a.metrics_port
    settings.status_min_interval = a.status_min_interval
    if a.log_level.upper() not in LEVELS or a.log_format.lower() not in FORMATS:
        p.error(f"KGROUP_LOG_LEVEL {a.log_level!r} / KGROUP_LOG_FORMAT {a.log_format!r}: "
                f"expected one of {', '.join(LEVELS)} / {', '.join(FORMATS)}")
    settings.log_level = "DEBUG" if a.verbose else a.log_level.upper()
    settings.log_format = a.log_format.lower()
    settings.verbose = settings.log_level == "DEBUG"
    return settings


async def serve_standby_health(port: int, identity: str) -> web.AppRunner | None:
    """``GET /healthz`` → 200 ``{"state": "standby"}`` on 127.0.0.1:``port`` while this
    replica waits for the leader Lease. None when the port cannot be bound (logged: the
    probe then fails, which is the truth about an unreachable endpoint)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"state": "standby", "identity": identity})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
    except OSError as exc:
        log.warning("standby health endpoint on 127.0.0.1:%d: %s", port, exc)
        await runner.cleanup()
        return None
    return runner


async def run(settings: OperatorSettings) -> int:
    # Import registers the kopf handlers in kopf's default registry.
    from . import handlers  # noqa: F401

    log.info("kgroup-operator %s starting as %s", __version__, settings.identity)
    injector = injector_settings(settings)
    try:
        config = default_config()
    except (ConfigError, OSError, KeyError, ValueError) as exc:
        raise SystemExit(f"kgroup-operator: no API server configuration: {exc}") from None
    api = ApiClient(config, connections=CONNECTIONS)  # kopf has its own session
    metrics = Metrics()
    metrics.set_leader(False)
    served = (await serve(metrics, settings.metrics_host, settings.metrics_port)
              if settings.metrics_port else None)
    if injector is not None:  # every replica, from now on, whatever its role
        from .injector import start as start_injector

        start_injector(injector, api)
    try:
        return await _run(settings, api, metrics)
    finally:
        if injector is not None:
            from .injector import stop as stop_injector

            await stop_injector(injector)
        await api.close()
        if served is not None:
            await served.cleanup()


def injector_settings(settings: OperatorSettings) -> Injector | None:
    """The injector's state when ``KGROUP_INJECTOR`` is on (its module imported, which
    registers its webhook handler); bad sidecar values stop the operator at start, with
    the reason, rather than at the first pod."""
    if not settings.injector:
        return None
    from kgroup.core.operator.injection import InjectionRefused, defaults_from_values

    from .injector import Injector

    if settings.injector_host in ("", "0.0.0.0", "::"):
        raise SystemExit(f"KGROUP_INJECTOR_HOST {settings.injector_host!r}: "
                         "an address, never a wildcard")
    try:
        values = json.loads(settings.injector_sidecar or "null")
        return Injector(settings, defaults_from_values(values or {}))
    except (ValueError, TypeError, KeyError, InjectionRefused) as exc:
        raise SystemExit(f"KGROUP_INJECTOR_SIDECAR: {exc}") from None


async def _run(settings: OperatorSettings, api: ApiClient, metrics: Metrics) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    elector: LeaseElector | None = None
    hold: asyncio.Task[None] | None = None
    if settings.peering == "lease":
        elector = LeaseElector(
            api,
            namespace=settings.leader_lease_namespace,
            name=settings.leader_lease_name,
            identity=settings.identity,
            duration=settings.leader_lease_seconds,
        )
        standby = (await serve_standby_health(settings.liveness_port, settings.identity)
                   if settings.liveness_port else None)
        try:
            acquiring = asyncio.create_task(elector.acquire())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if standby is not None:
                await standby.cleanup()  # frees the port for kopf's endpoint
        if stop.is_set():
            acquiring.cancel()
            return 0
        stopping.cancel()
        hold = asyncio.create_task(elector.hold(stop))
    metrics.set_leader(True)
    kube = Kube(api, identity=settings.identity)
    groups = GroupLoops(kube=kube, settings=settings, metrics=metrics)
    memo = kopf.Memo(groups=groups)
    lost = False
    try:
        await kopf.operator(
            clusterwide=not settings.namespaces,
            namespaces=settings.namespaces,
            standalone=settings.peering != "kopf",
            peering_name="kgroup-operator" if settings.peering == "kopf" else None,
            liveness_endpoint=(
                f"http://127.0.0.1:{settings.liveness_port}/healthz"
                if settings.liveness_port
                else None
            ),
            stop_flag=stop,
            memo=memo,
        )
    finally:
        metrics.set_leader(False)
        lost = hold is not None and hold.done() and stop.is_set()
        if hold is not None:
            hold.cancel()
        if elector is not None:
            await elector.release()
    return 2 if lost and not _signalled(stop) else 0


def _signalled(stop: asyncio.Event) -> bool:
    return bool(getattr(stop, "by_signal", False))


def configure_logging(settings: OperatorSettings) -> None:
    """kopf's one stderr handler (its text or JSON formatter), then the level asked for:
    kopf.configure knows only DEBUG and INFO, so the root level is set after it."""
    kopf.configure(verbose=settings.verbose,
                   log_format=kopf.LogFormat.JSON if settings.log_format == "json"
                   else kopf.LogFormat.FULL)
    logging.getLogger().setLevel(settings.log_level)
    if not settings.verbose:
        # "Handler 'pod_event' succeeded." for every pod update is noise at INFO
        logging.getLogger("kopf.objects").setLevel(
            max(logging.WARNING, logging.getLogger().level))
        # one access line per admitted pod (the injector's webhook) is noise too
        logging.getLogger("aiohttp.access").setLevel(
            max(logging.WARNING, logging.getLogger().level))


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv, OperatorSettings.from_env())
    configure_logging(settings)

    sys.exit(asyncio.run(run(settings)))


if __name__ == "__main__":
    main()
