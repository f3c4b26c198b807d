"""A tool call through a database outage: the MCP server runs a
read-only tool, or a write carrying its idempotency key (the model's, or
one the MCP server made for the call), again after UNAVAILABLE (the
server asks for a second), and answers any other write's UNAVAILABLE at
once, with the delay the server asked for. Any tool is run
again after a failure that wrote nothing (a deadlock Postgres broke).

The database refuses writes while the test holds SQLite's write lock (or
Postgres is failed over to read-only); the test ends the outage once the
server's metrics show the first refusal.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import time

import httpx2
import pytest

from conftest import Server, error, session, start, structured, unique
from engram_server import STORES, Injected, Outage

pytestmark = pytest.mark.anyio


async def refusals(server: Server, method: str) -> int:
    """How many calls of `method` the server has answered UNAVAILABLE."""
    async with httpx2.AsyncClient() as client:
        text = (await client.get(f"http://{server.http}/metrics")).text
    pattern = re.compile(
        r'^grpc_server_handled_total\{[^}]*grpc_method="' + method + r'"[^}]*grpc_code="Unavailable"\} (\d+)$',
        re.MULTILINE,
    )
    return sum(int(n) for n in pattern.findall(text))


async def until_refused(server: Server, method: str, before: int) -> None:
    """Waits (at most 30 s) for the server to refuse one more call of `method`."""
    deadline = time.monotonic() + 30
    while await refusals(server, method) <= before:
        assert time.monotonic() < deadline, f"the server never refused {method}"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_keyed_write_rides_out_an_outage_and_an_unkeyable_one_does_not(
    transport: str, store: str
) -> None:
    """memory_set with the model's request_id, and one without (the MCP
    server keys it for its tries), wait out the outage and are stored
    once each; memory_rollback, whose call takes no key, answers at once."""
    scope = {"scope_type": "namespace", "scope": unique("outage")}
    with tempfile.TemporaryDirectory() as directory:
        server = start(store, directory, {"ENGRAM_DB_ACQUIRE_TIMEOUT_MS": "300"})
        outage = Outage(server.running.database_url)
        try:
            async with session(transport, server) as mcp:
                for value, keyed in (("a", {"request_id": "r-1"}), ("b", {})):
                    before = await refusals(server, "Set")
                    outage.writes()
                    try:
                        write = asyncio.ensure_future(
                            mcp.call_tool("memory_set", {**scope, "key": "k", "value": value, **keyed})
                        )
                        await until_refused(server, "Set", before)
                    finally:
                        outage.end()
                    assert structured(await write)["entry"]["value"] == value

                outage.writes()
                try:
                    refused = await mcp.call_tool("memory_rollback", {**scope, "key": "k", "to_version": 1})
                finally:
                    outage.end()
                assert error(refused)["code"] == "UNAVAILABLE"
                assert error(refused)["reason"] == "DATABASE_UNAVAILABLE"
                assert (refused.structured_content or {})["error"]["retry_delay_ms"] == 1000

                history = structured(await mcp.call_tool("memory_history", {**scope, "key": "k"}))
                assert [v["version"] for v in history["versions"]] == [1, 2], "each write stored once"
        finally:
            server.running.stop()


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_an_unkeyed_append_is_run_again_after_a_deadlock(transport: str) -> None:
    """Postgres broke a deadlock by rolling the append's transaction back
    (TRANSACTION_CONFLICT): nothing was written, so the tool runs again,
    and the episode is stored once."""
    if "postgres" not in STORES:
        pytest.skip("a Postgres failure")
    with tempfile.TemporaryDirectory() as directory:
        server = start("postgres", directory)
        injected = Injected(server.running.database_url)
        session_id = unique("conflict")
        try:
            async with session(transport, server) as mcp:
                injected.fail("episodes", "40P01")
                appended = structured(
                    await mcp.call_tool(
                        "episode_append",
                        {"session_id": session_id, "app": "rt", "user": "ann", "type": "message", "content": "hello"},
                    )
                )
                assert appended["episode"]["seq"] == 1
                listed = structured(await mcp.call_tool("episodes_list", {"session_id": session_id}))
                assert [e["content"] for e in listed["episodes"]] == ["hello"]
        finally:
            injected.end()
            server.running.stop()


@pytest.mark.parametrize("store", STORES)
async def test_a_working_memory_action_rides_out_an_outage(store: str) -> None:
    """Setting the goal or a task's status leaves the state as one run
    would, and creating a task is keyed for the call, so each runs again
    after UNAVAILABLE, and the task is created once."""
    owner = {"session_id": unique("goal"), "app": "rt", "user": "ann"}
    with tempfile.TemporaryDirectory() as directory:
        server = start(store, directory, {"ENGRAM_DB_ACQUIRE_TIMEOUT_MS": "300"})
        outage = Outage(server.running.database_url)
        try:
            async with session("stdio", server) as mcp:
                task = structured(await mcp.call_tool("TaskCreate", {**owner, "subject": "read the logs"}))
                before = await refusals(server, "CallTool")
                outage.writes()
                try:
                    goal = asyncio.ensure_future(mcp.call_tool("memory.set_goal", {**owner, "goal": "fix the deploy"}))
                    await until_refused(server, "CallTool", before)
                finally:
                    outage.end()
                assert structured(await goal) == {"goal": "fix the deploy"}

                before = await refusals(server, "CallTool")
                outage.writes()
                try:
                    update = {**owner, "taskId": task["taskId"], "status": "completed"}
                    updated = asyncio.ensure_future(mcp.call_tool("TaskUpdate", update))
                    await until_refused(server, "CallTool", before)
                finally:
                    outage.end()
                assert structured(await updated)["status"] == "completed"

                # A creation's CallTool carries a key made for the call, so
                # it runs again too, and the task is created once.
                before = await refusals(server, "CallTool")
                outage.writes()
                try:
                    again = asyncio.ensure_future(mcp.call_tool("TaskCreate", {**owner, "subject": "again"}))
                    await until_refused(server, "CallTool", before)
                finally:
                    outage.end()
                assert structured(await again)["taskId"] == "t2"
                rendered = structured(await mcp.call_tool("memory_render", owner))
                assert rendered["memory_block"].count("again") == 1
                assert "## Todos (2)" in rendered["memory_block"]
        finally:
            server.running.stop()


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_working_memory_action_is_run_again_after_a_deadlock(transport: str) -> None:
    """The working-memory actions go through the same rule as the other
    tools: a task whose creation Postgres rolled back to break a deadlock
    (nothing written) is created on the next run, once."""
    if "postgres" not in STORES:
        pytest.skip("a Postgres failure")
    owner = {"session_id": unique("deadlock"), "app": "rt", "user": "ann"}
    with tempfile.TemporaryDirectory() as directory:
        server = start("postgres", directory)
        injected = Injected(server.running.database_url)
        try:
            async with session(transport, server) as mcp:
                await mcp.call_tool("memory.set_goal", {**owner, "goal": "fix the deploy"})
                injected.fail("working_tasks", "40P01")
                task = structured(await mcp.call_tool("TaskCreate", {**owner, "subject": "read the logs"}))
                assert task["taskId"] == "t1"
                rendered = structured(await mcp.call_tool("memory_render", owner))
                assert rendered["memory_block"].count("read the logs") == 1
        finally:
            injected.end()
            server.running.stop()
