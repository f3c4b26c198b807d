"""The real engram binary on an ephemeral port, on each store in turn."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import pytest

from engram_server import STORES, Server, database_url as fresh_database, start_server

__all__ = ["Server", "start_server"]


@pytest.fixture(params=STORES)
def database_url(request: pytest.FixtureRequest) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        yield fresh_database(request.param, directory)


@pytest.fixture
def server(database_url: str) -> Iterator[Server]:
    running = start_server(database_url)
    yield running
    running.stop()
