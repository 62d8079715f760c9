"""The shared ``GET /metrics`` server (kgroup.metrics_http), on a real loopback socket."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client import CollectorRegistry, Counter

from kgroup.metrics_http import serve_registry

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


async def scrape(registry: CollectorRegistry) -> list[tuple[int, str, str]]:
    runner = await serve_registry(registry, "127.0.0.1", 0)
    try:
        host, port = runner.addresses[0][:2]
        assert host == "127.0.0.1"
        results = []
        async with aiohttp.ClientSession(trust_env=False) as session:
            for path, accept in (("/metrics", ""), ("/metrics", OPENMETRICS), ("/other", "")):
                async with session.get(f"http://127.0.0.1:{port}{path}",
                                       headers={"Accept": accept}) as response:
                    results.append((response.status, response.headers["Content-Type"],
                                    await response.text()))
        return results
    finally:
        await runner.cleanup()


def test_serves_the_registry_in_the_format_the_scraper_asks_for() -> None:
    registry = CollectorRegistry()
    Counter("kgroup_test_things", "Things counted.", registry=registry).inc(3)
    (text_status, text_type, text), (om_status, om_type, om), (other, _, _) = \
        asyncio.run(scrape(registry))
    assert text_status == 200 and text_type.startswith("text/plain")
    assert "kgroup_test_things_total 3.0" in text and "# EOF" not in text
    assert om_status == 200 and om_type.startswith("application/openmetrics-text")
    assert "kgroup_test_things_total 3.0" in om and om.endswith("# EOF\n")
    assert other == 404
