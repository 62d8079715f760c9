"""``GET /metrics`` for a prometheus-client registry: the operator's and the sidecar's
scrape endpoint (one aiohttp server each, on their own ``host:port``).

Needs the ``operator`` or ``sidecar`` extra (aiohttp, prometheus-client); the core
(``kgroup.core``, the app client) never imports it.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder


def exposition(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    """Body and content type for a scrape's ``Accept`` header: OpenMetrics when the scraper
    asks for it, else the Prometheus text format (0.0.4)."""
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


async def serve_registry(registry: CollectorRegistry, host: str, port: int) -> web.AppRunner:
    """Start ``GET /metrics`` alone on ``host:port``; the caller cleans the returned runner
    up (the runner is cleaned up here if the bind fails)."""

    async def handle(request: web.Request) -> web.Response:
        body, content_type = exposition(registry, request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
