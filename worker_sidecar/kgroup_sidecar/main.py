"""``kgroup-sidecar``: settings from the environment, then the loop until SIGTERM.

Exit status: 0 after a graceful shutdown, 2 on bad settings, 1 on an unexpected error.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from kubernetes import client

from kgroup.logs import configure as configure_logging
from kgroup_sidecar import metrics as metrics_http
from kgroup_sidecar.events import EventPoster, Pod
from kgroup_sidecar.http_api import serve
from kgroup_sidecar.kube import KubeAdapter, make_configuration
from kgroup_sidecar.runtime import Sidecar
from kgroup_sidecar.settings import Settings, SettingsError, load_settings

log = logging.getLogger("kgroup_sidecar")


async def _run(settings: Settings) -> int:
    loop = asyncio.get_running_loop()
    sidecar = Sidecar(settings)
    runner = await serve(sidecar, settings)
    metrics_runner = None
    if settings.metrics_host is not None:
        try:
            metrics_runner = await metrics_http.serve(sidecar.metrics, settings.metrics_host,
                                                      settings.metrics_port)
        except BaseException:
            await runner.cleanup()
            raise
        log.info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)
    log.info("listening on %s; group %s/%s as member %s", settings.listen,
             settings.namespace, settings.group, settings.pod_name)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, sidecar.begin_shutdown)
    sidecar.events = EventPoster.for_client(
        client.ApiClient(make_configuration(settings)),
        Pod(settings.namespace, settings.pod_name, settings.pod_uid))
    kube = KubeAdapter(settings, loop=loop, on_list=sidecar.on_list,
                       on_event=sidecar.on_event, metrics=sidecar.metrics)
    try:
        await sidecar.run(kube)
    finally:
        await sidecar.events.drain(2.0)
        await runner.cleanup()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
    log.info("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"kgroup-sidecar: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    try:
        return asyncio.run(_run(settings))
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
