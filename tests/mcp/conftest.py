"""A real `engram serve` per store, and MCP sessions over stdio and HTTP.

The client is the official MCP Python SDK (`mcp`), as an assistant would
use it: `stdio_client` spawning `engram mcp`, or `streamable_http_client`
against the server's `/mcp` with a bearer token. Every test runs on both
stores (SQLite file, and a fresh Postgres database when
ENGRAM_TEST_DATABASE_URL is set, as scripts/test does) and both transports.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

# The server starter is the Python client's test harness.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python" / "tests"))

from engram_server import ENGRAM_BIN, STORES, database_url, start_with_tokens  # noqa: E402
from engram_server import Server as Running  # noqa: E402


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Server:
    running: Running
    tokens: dict[str, str]

    @property
    def grpc(self) -> str:
        return self.running.address

    @property
    def http(self) -> str:
        return self.running.http_address


def start(store: str, directory: str, env: dict[str, str] | None = None) -> Server:
    """A server on a fresh store with three tokens: `admin` and `user` of
    tenant acme, `other` of globex."""
    roster = [("admin", "acme", True), ("user", "acme", False), ("other", "globex", False)]
    running, tokens = start_with_tokens(database_url(store, directory), directory, roster, env)
    return Server(running, tokens)


@pytest.fixture(scope="module", params=STORES)
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    with tempfile.TemporaryDirectory() as directory:
        started = start(request.param, directory)
        yield started
        started.running.stop()


@contextlib.asynccontextmanager
async def session(transport: str, server: Server, token: str = "admin") -> AsyncIterator[ClientSession]:
    """An initialized MCP session with that token, over `stdio` (spawning
    `engram mcp`) or `http` (the server's /mcp)."""
    secret = server.tokens[token]
    if transport == "stdio":
        parameters = StdioServerParameters(
            command=ENGRAM_BIN,
            args=["mcp", "--server", f"http://{server.grpc}", "--token", secret],
        )
        async with stdio_client(parameters) as (read, write, *_):
            async with ClientSession(read, write) as mcp_session:
                await mcp_session.initialize()
                yield mcp_session
    else:
        headers = {"authorization": f"Bearer {secret}"}
        async with httpx2.AsyncClient(headers=headers) as client:
            async with streamable_http_client(f"http://{server.http}/mcp", http_client=client) as (
                read,
                write,
                *_,
            ):
                async with ClientSession(read, write) as mcp_session:
                    await mcp_session.initialize()
                    yield mcp_session


Connect = Callable[..., contextlib.AbstractAsyncContextManager[ClientSession]]


@pytest.fixture(params=["stdio", "http"])
def connect(request: pytest.FixtureRequest, server: Server) -> Connect:
    """`async with connect("admin") as session:` an initialized MCP session
    with that token, over this test's transport."""

    def connected(token: str = "admin") -> contextlib.AbstractAsyncContextManager[ClientSession]:
        return session(request.param, server, token)

    return connected


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def structured(result: Any) -> Any:
    """A successful tool result's JSON; fails the test on an error result."""
    assert not result.is_error, result.content
    return result.structured_content


def error(result: Any) -> dict[str, str]:
    """An error result's code, reason and message."""
    assert result.is_error, result.structured_content
    reported = (result.structured_content or {}).get("error")
    # Working-memory actions report {"error": "..."} as the LLM reads it.
    found: dict[str, str] = dict(reported) if isinstance(reported, dict) else {"message": reported or ""}
    found["text"] = result.content[0].text
    return found
