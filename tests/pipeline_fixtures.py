"""Fixtures of the pipeline tests: a private redis-server and a fresh stream name per test.

Test modules import them (``from pipeline_fixtures import redis_url, stream``) so this file
stays independent of any shared conftest.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from kgroup_pipeline.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


@pytest.fixture
def rclient(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def stream() -> str:
    return f"t{uuid.uuid4().hex[:10]}"
