"""A real `engram serve` per store, and MCP sessions over stdio and HTTP.

The client is the official MCP Python SDK (`mcp`), as an assistant would
use it: `stdio_client` spawning `engram mcp`, or `streamable_http_client`
against the server's `/mcp` with a bearer token. Every test runs on both
stores (SQLite file, and a fresh Postgres database when
ENGRAM_TEST_DATABASE_URL is set, as scripts/test does) and both transports.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
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

ENGRAM_BIN = os.environ.get(
    "ENGRAM_BIN", str(Path(__file__).resolve().parents[2] / "target" / "debug" / "engram")
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Server:
    process: subprocess.Popen[str]
    grpc: str
    http: str
    tokens: dict[str, str]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


def new_token(tenant: str, admin: bool) -> tuple[str, str]:
    """A token and its tokens-file line, from `engram token new`."""
    args = [ENGRAM_BIN, "token", "new", "--tenant", tenant, "--output", "json"]
    if admin:
        args.append("--admin")
    made = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    return made["token"], made["line"]


def start_server(database_url: str, directory: str) -> Server:
    tokens: dict[str, str] = {}
    lines = []
    for name, tenant, admin in [("admin", "acme", True), ("user", "acme", False), ("other", "globex", False)]:
        tokens[name], line = new_token(tenant, admin)
        lines.append(line)
    tokens_file = Path(directory) / "tokens"
    tokens_file.write_text("\n".join(lines) + "\n")
    process = subprocess.Popen(
        [ENGRAM_BIN, "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"],
        env={
            **os.environ,
            "ENGRAM_DATABASE_URL": database_url,
            "ENGRAM_TOKENS_FILE": str(tokens_file),
            "ENGRAM_LOG_FORMAT": "json",
            "ENGRAM_SHUTDOWN_GRACE_SECS": "2",
        },
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert process.stderr is not None
    for line in process.stderr:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if "grpc_addr" in event:
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return Server(process, event["grpc_addr"], event["http_addr"], tokens)
    raise RuntimeError(f"engram exited before listening (status {process.wait()})")


def fresh_postgres(url: str) -> str:
    """A new, empty database on the test cluster; its URL."""
    name = f"engram_mcp_{uuid.uuid4().hex[:12]}"
    psql = shutil.which("psql", path=os.environ.get("PG_BINDIR")) or "psql"
    subprocess.run([psql, url, "-qc", f"CREATE DATABASE {name}"], check=True, capture_output=True)
    return url.rsplit("/", 1)[0] + "/" + name


STORES = ["sqlite"] + (["postgres"] if os.environ.get("ENGRAM_TEST_DATABASE_URL") else [])


@pytest.fixture(scope="module", params=STORES)
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    with tempfile.TemporaryDirectory() as directory:
        if request.param == "sqlite":
            url = f"sqlite://{directory}/engram.db"
        else:
            url = fresh_postgres(os.environ["ENGRAM_TEST_DATABASE_URL"])
        running = start_server(url, directory)
        yield running
        running.stop()


Connect = Callable[..., contextlib.AbstractAsyncContextManager[ClientSession]]


@pytest.fixture(params=["stdio", "http"])
def connect(request: pytest.FixtureRequest, server: Server) -> Connect:
    """`async with connect("admin") as session:` an initialized MCP session
    with that token, over this test's transport."""

    @contextlib.asynccontextmanager
    async def session(token: str = "admin") -> AsyncIterator[ClientSession]:
        secret = server.tokens[token]
        if request.param == "stdio":
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

    return session


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
