"""The sidecar's program: its listeners, probe files, Kubernetes adapter and loop, until
SIGTERM. ``kgroup_sidecar.main`` imports it once the settings are good (it imports aiohttp
and the rest, which a process refused for bad settings never needs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from kgroup import __version__
from kgroup.apiclient import ConfigError
from kgroup.logs import configure as configure_logging
from kgroup_sidecar import metrics as metrics_http
from kgroup_sidecar.events import EventPoster, Pod
from kgroup_sidecar.http_api import serve, serve_probes
from kgroup_sidecar.kube import KubeAdapter
from kgroup_sidecar.probe_files import HEARTBEAT_SECONDS, ProbeFiles
from kgroup_sidecar.runtime import Sidecar
from kgroup_sidecar.settings import Settings
from kgroup_sidecar.watchdog import LoopWatchdog

log = logging.getLogger("kgroup_sidecar")


async def _run(settings: Settings) -> int:
    loop = asyncio.get_running_loop()
    sidecar = Sidecar(settings)
    async with contextlib.AsyncExitStack() as stack:
        runner = await serve(sidecar, settings)
        stack.push_async_callback(runner.cleanup)
        if settings.metrics_host is not None:
            metrics_runner = await metrics_http.serve(sidecar.metrics, settings.metrics_host,
                                                      settings.metrics_port)
            stack.push_async_callback(metrics_runner.cleanup)
            log.info("metrics on http://%s:%d/metrics", settings.metrics_host,
                     settings.metrics_port)
        if settings.probe_host is not None:
            probe_runner = await serve_probes(sidecar, settings.probe_host, settings.probe_port)
            stack.push_async_callback(probe_runner.cleanup)
            log.info("probes on http://%s:%d/{livez,readyz}", settings.probe_host,
                     settings.probe_port)
        files: ProbeFiles | None = None
        if settings.probe_dir is not None:
            files = ProbeFiles(settings.probe_dir)
            files.start()
            stack.callback(files.stop)
            sidecar.probe_files = files
        # one task beats the watchdog and the probe files: a stuck loop stops both
        watchdog = LoopWatchdog(settings.watchdog_seconds) if settings.watchdog_seconds \
            else None
        beating = loop.create_task(_heartbeat(watchdog, files, sidecar))
        stack.callback(beating.cancel)
        if watchdog is not None:
            watchdog.start()
            stack.callback(watchdog.stop)
        log.info("listening on %s; group %s/%s as member %s (kgroup %s)", settings.listen,
                 settings.namespace, settings.group, settings.pod_name, __version__)
        if settings.pod_uid is None:
            log.warning("KGROUP_POD_UID is not set (downward API metadata.uid): the chart's "
                        "admission policies refuse this sidecar's Events, and locks are "
                        "taken on the name alone until the API server refuses them")
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, sidecar.begin_shutdown)
        kube = KubeAdapter(settings, loop=loop, on_list=sidecar.on_list,
                           on_event=sidecar.on_event, metrics=sidecar.metrics)
        stack.push_async_callback(kube.aclose)
        events = sidecar.events = EventPoster(
            kube.api, Pod(settings.namespace, settings.pod_name, settings.pod_uid))
        stack.push_async_callback(events.drain, 2.0)
        await sidecar.run(kube)
    log.info("stopped")
    return 0


async def _heartbeat(watchdog: LoopWatchdog | None, files: ProbeFiles | None,
                     sidecar: Sidecar) -> None:
    """Every :data:`kgroup_sidecar.probe_files.HEARTBEAT_SECONDS` on the loop: the
    watchdog's beat, the probe files' heartbeat (with the readiness verdict)."""
    while True:
        if watchdog is not None:
            watchdog.beat()
        if files is not None:
            files.tick(sidecar.readiness().ready)
        await asyncio.sleep(HEARTBEAT_SECONDS)


def run(settings: Settings) -> int:
    """Exit status: 0 after a graceful shutdown, 1 when it cannot start."""
    configure_logging(settings.log_level, settings.log_format)
    try:
        return asyncio.run(_run(settings))
    except (OSError, ConfigError) as exc:
        log.error("cannot start: %s", exc)
        return 1
