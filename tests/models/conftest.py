"""A real `engram serve` per store with small limits, and a caller of its
generated stubs, for the model-based tests (test_models.py).

Every test runs on both stores (a SQLite file, and a fresh Postgres
database when ENGRAM_TEST_DATABASE_URL is set, as scripts/test does).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import grpc
import pytest
from google.protobuf import json_format

# The server starter is the Python client's test harness.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python" / "tests"))

from engram_server import STORES, database_url, start_server  # type: ignore[import-not-found]  # noqa: E402
from engram_client import Stubs  # noqa: E402

#: Small limits, so that the operations reach them often.
LIMITS = {
    "ENGRAM_MAX_EVENTS_PER_SESSION": "4",
    "ENGRAM_MAX_TASKS_PER_SESSION": "3",
    "ENGRAM_MAX_FACTS_PER_USER": "3",
    "ENGRAM_MAX_CACHED_FILES": "3",
    "ENGRAM_MAX_CACHE_BYTES": "40",
}


@dataclass
class Outcome:
    """What a call gave: the answer as protobuf JSON, or the status code."""

    answer: Any = None
    code: str | None = None

    @property
    def ok(self) -> bool:
        return self.code is None


class Engram(Stubs):
    """The server's generated stubs (the client's :class:`Stubs`), and
    :meth:`call`, which turns a status into an :class:`Outcome` instead of
    raising."""

    def __init__(self, address: str) -> None:
        super().__init__(grpc.insecure_channel(address))
        self.admin = self.memory_admin
        self.working = self.working_memory

    @staticmethod
    def call(method: Callable[..., Any], request: Any) -> Outcome:
        try:
            response = method(request, timeout=30)
            if hasattr(response, "ListFields"):
                return Outcome(answer=json_format.MessageToDict(response))
            # A stream: its status comes while it is read.
            return Outcome(answer=[json_format.MessageToDict(r) for r in response])
        except grpc.RpcError as err:
            return Outcome(code=err.code().name)


@pytest.fixture(params=STORES)
def engram(request: pytest.FixtureRequest) -> Iterator[Engram]:
    with tempfile.TemporaryDirectory() as directory:
        server = start_server(database_url(request.param, directory), env=LIMITS)
        try:
            yield Engram(server.address)
        finally:
            server.stop()
