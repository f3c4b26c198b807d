"""Engram's MCP surface, through the official MCP Python SDK."""

from __future__ import annotations

import asyncio
import json
import random
from datetime import datetime, timezone

import httpx2
import pytest
from engram_client import Engram
from engram_client.v1 import working_memory_pb2
from mcp.shared.exceptions import MCPError

from conftest import Connect, Server, error, structured, unique

pytestmark = pytest.mark.anyio

ADMIN_TOOLS = {
    "forget_user",
    "data_import",
    "memory_retention",
    "memory_retention_apply",
    "memory_purge",
    "memory_purge_scope",
    "memory_compact",
    "memory_compaction_log",
    "memory_reindex",
}
EVERYONE_TOOLS = {
    "memory_get",
    "memory_set",
    "memory_delete",
    "memory_list",
    "memory_history",
    "memory_scopes",
    "memory_rollback",
    "memory_fork",
    "data_export",
    "episode_append",
    "episodes_recent",
    "episodes_list",
    "episode_get",
    "sessions_list",
    "session_context",
    "memory_render",
    "search",
    "TaskCreate",
    "TaskUpdate",
    "memory.set_goal",
    "Remember",
}


async def test_tools_are_listed_with_schemas_and_instructions(connect: Connect) -> None:
    async with connect("admin") as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(tools) == EVERYONE_TOOLS | ADMIN_TOOLS
        for tool in tools.values():
            assert tool.description, tool.name
            assert tool.input_schema["type"] == "object", tool.name
        get = tools["memory_get"].input_schema
        assert {"scope_type", "scope", "key"} <= set(get["required"])
        assert "session_id" in tools["TaskCreate"].input_schema["required"]
        templates = await session.list_resource_templates()
        assert {t.uri_template for t in templates.resource_templates} == {
            "engram://memory/{scope_type}/{scope}/{key}",
            "engram://sessions/{session_id}/memory-block",
        }


async def test_memory_tools(connect: Connect) -> None:
    scope = {"scope_type": "namespace", "scope": unique("prefs")}
    async with connect("user") as session:
        first = structured(
            await session.call_tool("memory_set", {**scope, "key": "user/theme", "value": {"dark": True}})
        )["entry"]
        assert first["version"] == 1 and first["value"] == {"dark": True}
        second = structured(
            await session.call_tool(
                "memory_set", {**scope, "key": "user/theme", "value": "light", "expected_version": 1}
            )
        )["entry"]
        assert second["version"] == 2

        got = structured(await session.call_tool("memory_get", {**scope, "key": "user/theme"}))
        assert got["entry"]["value"] == "light" and got["entry"]["version"] == 2
        old = structured(await session.call_tool("memory_get", {**scope, "key": "user/theme", "version": 1}))
        assert old["entry"]["value"] == {"dark": True}

        for n in range(3):
            await session.call_tool("memory_set", {**scope, "key": f"notes/{n}", "value": n})
        page = structured(await session.call_tool("memory_list", {**scope, "key_prefix": "notes/", "page_size": 2}))
        assert [e["key"] for e in page["entries"]] == ["notes/0", "notes/1"]
        rest = structured(
            await session.call_tool(
                "memory_list", {**scope, "key_prefix": "notes/", "page_token": page["next_page_token"]}
            )
        )
        assert [e["key"] for e in rest["entries"]] == ["notes/2"] and rest["next_page_token"] == ""

        # Request ids are the tenant's, and every transport's run shares it.
        delete = {**scope, "key": "user/theme", "request_id": unique("d")}
        deleted = structured(await session.call_tool("memory_delete", delete))
        assert deleted["entry"]["deleted"] is True and deleted["entry"]["version"] == 3
        retried = structured(await session.call_tool("memory_delete", delete))
        assert retried == deleted, "a retried delete answers with the first tombstone"
        gone = error(await session.call_tool("memory_get", {**scope, "key": "user/theme"}))
        assert gone["code"] == "NOT_FOUND"

        history = structured(await session.call_tool("memory_history", {**scope, "key": "user/theme", "limit": 2}))
        assert [v["version"] for v in history["versions"]] == [1, 2]
        assert history["next_from_version"] == 3
        tail = structured(
            await session.call_tool("memory_history", {**scope, "key": "user/theme", "from_version": 3})
        )
        assert [(v["version"], v["deleted"]) for v in tail["versions"]] == [(3, True)]
        assert tail["next_from_version"] is None
        # Large versions: about 2 MiB of them at a time, then where to go on.
        big = {**scope, "scope": unique("big"), "key": "big"}
        for n in range(4):
            structured(await session.call_tool("memory_set", {**big, "value": f"v{n} " + "x" * (768 * 1024)}))
        first = structured(await session.call_tool("memory_history", big))
        shown = [v["version"] for v in first["versions"]]
        assert 1 <= len(shown) < 4 and first["next_from_version"] == len(shown) + 1, (shown, first["next_from_version"])
        rest = structured(
            await session.call_tool("memory_history", {**big, "from_version": first["next_from_version"]})
        )
        assert shown + [v["version"] for v in rest["versions"]] == [1, 2, 3, 4]

        rolled = structured(await session.call_tool("memory_rollback", {**scope, "key": "user/theme", "to_version": 1}))
        assert (rolled["entry"]["version"], rolled["entry"]["value"]) == (4, {"dark": True})
        tombstone = error(await session.call_tool("memory_rollback", {**scope, "key": "user/theme", "to_version": 3}))
        assert tombstone["reason"] == "ROLLBACK_TO_TOMBSTONE"

        scopes = structured(await session.call_tool("memory_scopes", {"scope_type": "namespace", "page_size": 100}))
        counts = {s["scope"]: s["entry_count"] for s in scopes["scopes"]}
        assert counts[scope["scope"]] == 4

        value = await session.read_resource(f"engram://memory/namespace/{scope['scope']}/notes%2F1")
        assert json.loads(value.contents[0].text) == 1


async def test_reads_as_of_a_time_and_forks(connect: Connect) -> None:
    scope = {"scope_type": "namespace", "scope": unique("tt")}
    target = unique("tt-copy")
    async with connect("user") as session:
        await session.call_tool("memory_set", {**scope, "key": "plan", "value": 1})
        between = datetime.now(timezone.utc).isoformat()
        await session.call_tool("memory_set", {**scope, "key": "plan", "value": 2})

        then = structured(await session.call_tool("memory_get", {**scope, "key": "plan", "as_of": between}))
        assert (then["entry"]["version"], then["entry"]["value"]) == (1, 1)
        listed = structured(await session.call_tool("memory_list", {**scope, "as_of": between}))
        assert [(e["key"], e["value"]) for e in listed["entries"]] == [("plan", 1)]
        assert listed["purged_keys"] == []

        forked = structured(
            await session.call_tool(
                "memory_fork",
                {**scope, "target_scope_type": "namespace", "target_scope": target, "as_of": between},
            )
        )
        assert forked["keys_copied"] == 1
        copy = structured(
            await session.call_tool("memory_get", {"scope_type": "namespace", "scope": target, "key": "plan"})
        )
        assert (copy["entry"]["version"], copy["entry"]["value"]) == (1, 1)
        again = error(
            await session.call_tool(
                "memory_fork", {**scope, "target_scope_type": "namespace", "target_scope": target}
            )
        )
        assert again["reason"] == "SCOPE_NOT_EMPTY"
        bad = error(await session.call_tool("memory_get", {**scope, "key": "plan", "as_of": "yesterday"}))
        assert bad["code"] == "INVALID_ARGUMENT"
        # A duration reads that long ago: an hour ago the key did not exist.
        hour_ago = error(await session.call_tool("memory_get", {**scope, "key": "plan", "as_of": "1h"}))
        assert hour_ago["reason"] == "KEY_NOT_FOUND" and "did not exist at time" in hour_ago["message"]
        now = structured(await session.call_tool("memory_get", {**scope, "key": "plan", "as_of": "0s"}))
        assert now["entry"]["version"] == 2


async def test_bad_input_comes_back_as_error_results(connect: Connect) -> None:
    scope = {"scope_type": "namespace", "scope": unique("errors")}
    async with connect("user") as session:
        bad_scope = error(await session.call_tool("memory_get", {"scope_type": "team", "scope": "x", "key": "k"}))
        assert "team" in bad_scope["text"]
        missing = error(await session.call_tool("memory_get", {"scope_type": "namespace", "key": "k"}))
        assert "scope" in missing["text"]
        empty_scope = error(await session.call_tool("memory_get", {"scope_type": "namespace", "scope": "", "key": "k"}))
        assert empty_scope["code"] == "INVALID_ARGUMENT" and "scope" in empty_scope["message"]

        await session.call_tool("memory_set", {**scope, "key": "k", "value": 1})
        lost = error(await session.call_tool("memory_set", {**scope, "key": "k", "value": 2, "expected_version": 7}))
        assert lost["code"] == "ABORTED" and lost["reason"] == "VERSION_MISMATCH"

        too_many = error(await session.call_tool("memory_list", {**scope, "page_size": 101}))
        assert too_many["code"] == "INVALID_ARGUMENT"
        assert too_many["message"] == "page_size must be at most 100, got 101"

        with pytest.raises(MCPError):
            await session.read_resource("engram://nowhere/at/all")

        # The session survived every refusal.
        assert structured(await session.call_tool("memory_get", {**scope, "key": "k"}))["entry"]["value"] == 1


async def test_admin_tools_need_an_admin_token(connect: Connect) -> None:
    scope = {"scope_type": "namespace", "scope": unique("admin")}
    async with connect("user") as session:
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert names == EVERYONE_TOOLS
        refused = error(await session.call_tool("memory_purge", {**scope, "key": "k"}))
        assert refused["code"] == "PERMISSION_DENIED" and refused["reason"] == "ADMIN_REQUIRED"
        for value in ["a", "b", "c"]:
            await session.call_tool("memory_set", {**scope, "key": "k", "value": value})

    async with connect("admin") as session:
        preview = structured(await session.call_tool("memory_purge", {**scope, "key": "k", "keep": 1, "dry_run": True}))
        assert preview["versions_deleted"] == 2
        done = structured(await session.call_tool("memory_purge", {**scope, "key": "k", "keep": 1}))
        assert done["versions_deleted"] == 2 and done["record"]["operation"] == "purge"
        log = structured(await session.call_tool("memory_compaction_log", scope))
        assert [r["operation"] for r in log["records"]] == ["purge"]

        # Retention: preview, declare, apply.
        await session.call_tool("memory_set", {**scope, "key": "k", "value": "d"})
        preview = structured(await session.call_tool("memory_retention", {**scope, "keep_versions": 1, "dry_run": True}))
        assert preview["retention"] is None and preview["versions_to_delete"] == 1
        declared = structured(await session.call_tool("memory_retention", {**scope, "keep_versions": 1}))
        assert declared["retention"]["keep_versions"] == 1
        bad = error(await session.call_tool("memory_retention", {**scope, "keep_versions": 0}))
        assert bad["code"] == "INVALID_ARGUMENT"
        structured(await session.call_tool("memory_retention_apply", scope))
        # Applied now (or already by the server's scheduler): one version left.
        history = structured(await session.call_tool("memory_history", {**scope, "key": "k"}))
        assert [v["version"] for v in history["versions"]] == [4]


async def test_export_and_import(connect: Connect) -> None:
    sid, user = unique("xs"), unique("xu")
    async with connect("user") as session:
        structured(
            await session.call_tool(
                "episode_append",
                {"session_id": sid, "app": "mcp-bot", "user": user, "type": "observation", "content": "keep me"},
            )
        )
        exported = structured(await session.call_tool("data_export", {"session_id": sid}))
        records = exported["records"]
        assert [r["kind"] for r in records] == ["header", "session", "episode", "end"]
        assert records[3]["lines"] == 3
        assert (exported["truncated"], records[2]["content"]) == (False, "keep me")
        short = structured(await session.call_tool("data_export", {"session_id": sid, "limit": 1}))
        assert (len(short["records"]), short["truncated"]) == (1, True)
        # Large records: about 2 MiB of them come, and the rest is said to wait.
        big_sid = unique("xb")
        for n in range(4):
            structured(
                await session.call_tool(
                    "episode_append",
                    {"session_id": big_sid, "app": "mcp-bot", "user": user, "type": "observation",
                     "content": f"big {n} " + "x" * (768 * 1024)},
                )
            )
        large = structured(await session.call_tool("data_export", {"session_id": big_sid}))
        kinds = [r["kind"] for r in large["records"]]
        assert large["truncated"] and kinds[:2] == ["header", "session"], kinds
        assert 1 <= kinds.count("episode") < 4, kinds
        refused = error(await session.call_tool("data_import", {"records": records}))
        assert refused["reason"] == "ADMIN_REQUIRED"
    async with connect("admin") as session:
        again = structured(await session.call_tool("data_import", {"records": records}))
        assert (again["imported"], again["unchanged"]) == ({}, {"session": 1, "episode": 1})
        # What a truncated export gives lacks its end line: refused whole.
        cut = error(await session.call_tool("data_import", {"records": records[:3]}))
        assert cut["reason"] == "IMPORT_MALFORMED", cut
        changed = [dict(r, content="edited") if r["kind"] == "episode" else r for r in records]
        conflict = error(await session.call_tool("data_import", {"records": changed}))
        assert conflict["reason"] == "IMPORT_CONFLICT"


async def test_forget_user_is_for_admins(connect: Connect) -> None:
    sid, user = unique("fs"), unique("fu")
    async with connect("user") as session:
        structured(
            await session.call_tool(
                "episode_append",
                {"session_id": sid, "app": "mcp-bot", "user": user, "type": "observation", "content": "forget me"},
            )
        )
        refused = error(await session.call_tool("forget_user", {"app": "mcp-bot", "user": user}))
        assert refused["reason"] == "ADMIN_REQUIRED"
    async with connect("admin") as session:
        dry = structured(await session.call_tool("forget_user", {"app": "mcp-bot", "user": user, "dry_run": True}))
        assert (dry["sessions"], dry["episodes"], dry["dry_run"]) == (1, 1, True)
        done = structured(await session.call_tool("forget_user", {"app": "mcp-bot", "user": user}))
        assert (done["sessions"], done["episodes"], done["dry_run"]) == (1, 1, False)
        assert done["audit_key"].startswith("_compaction/")


async def test_sessions_and_episodes(connect: Connect) -> None:
    sid, user, eid = unique("s"), unique("u"), unique("e")
    owner = {"session_id": sid, "app": "support", "user": user}
    async with connect("user") as session:
        first = structured(
            await session.call_tool(
                "episode_append", {**owner, "type": "user_message", "content": "my deploy fails", "id": eid}
            )
        )
        assert first["episode"]["seq"] == 1 and first["replayed"] is False
        again = structured(
            await session.call_tool(
                "episode_append", {**owner, "type": "user_message", "content": "my deploy fails", "id": eid}
            )
        )
        assert again["replayed"] is True and again["episode"]["seq"] == 1
        await session.call_tool(
            "episode_append", {**owner, "type": "agent_response", "content": "which cluster?"}
        )

        recent = structured(await session.call_tool("episodes_recent", {"user": user, "limit": 1}))
        assert [e["content"] for e in recent["episodes"]] == ["which cluster?"]
        listed = structured(await session.call_tool("episodes_list", {"session_id": sid, "page_size": 1}))
        assert [e["seq"] for e in listed["episodes"]] == [1] and listed["next_page_token"]
        got = structured(await session.call_tool("episode_get", {"id": eid}))["episode"]
        assert (got["session_id"], got["seq"], got["content"]) == (sid, 1, "my deploy fails")
        gone = error(await session.call_tool("episode_get", {"id": unique("none")}))
        assert gone["reason"] == "EPISODE_NOT_FOUND"
        sessions = structured(await session.call_tool("sessions_list", {"user": user}))
        assert [s["id"] for s in sessions["sessions"]] == [sid]
        context = structured(await session.call_tool("session_context", {"session_id": sid}))
        assert context["context"] == "User: my deploy fails\nAssistant: which cluster?"
        missing = error(await session.call_tool("episode_append", {"session_id": unique("none"), "type": "t", "content": 1}))
        assert missing["reason"] == "SESSION_NOT_FOUND"
        # With app and user the session would be made, unless it is required.
        required = {"session_id": unique("none"), "app": "support", "user": user, "require_session": True}
        refused = error(await session.call_tool("episode_append", {**required, "type": "t", "content": 1}))
        assert refused["reason"] == "SESSION_NOT_FOUND"
        sessions = structured(await session.call_tool("sessions_list", {"user": user}))
        assert [s["id"] for s in sessions["sessions"]] == [sid]


async def test_working_memory(connect: Connect, server: Server) -> None:
    sid, user = unique("s"), unique("u")
    owner = {"session_id": sid, "app": "support", "user": user}
    async with connect("user") as session:
        await session.call_tool("episode_append", {**owner, "type": "user_message", "content": "hello"})
        goal = await session.call_tool("memory.set_goal", {**owner, "goal": "fix the deploy"})
        assert not goal.is_error, goal.content
        task = structured(await session.call_tool("TaskCreate", {**owner, "subject": "read the logs"}))
        task_id = task["taskId"]
        updated = await session.call_tool("TaskUpdate", {**owner, "taskId": task_id, "status": "in_progress"})
        assert not updated.is_error, updated.content
        remembered = await session.call_tool("Remember", {**owner, "content": "the user runs Kubernetes 1.33"})
        assert not remembered.is_error, remembered.content

        rendered = structured(await session.call_tool("memory_render", owner))
        block = rendered["memory_block"]
        assert "fix the deploy" in block and "read the logs" in block and "Kubernetes 1.33" in block
        resource = await session.read_resource(f"engram://sessions/{sid}/memory-block")
        assert resource.contents[0].text == block

        # What MCP set is what RenderMemoryBlock renders for a gRPC client.
        with Engram(server.grpc, server.tokens["user"]) as client:
            request = working_memory_pb2.RenderMemoryBlockRequest(session_id=sid, app="support", user=user)
            assert client.call(client.stubs.working_memory.RenderMemoryBlock, request).memory_block == block

        refused = error(await session.call_tool("TaskUpdate", {**owner, "taskId": "nope", "status": "completed"}))
        assert "nope" in refused["message"]
        no_session = error(await session.call_tool("TaskCreate", {"subject": "x"}))
        assert "session_id" in no_session["text"]
        # A name that is no tool is refused as one, with or without a session.
        for arguments in ({}, owner):
            with pytest.raises(MCPError, match='unknown tool "TaskDelete"'):
                await session.call_tool("TaskDelete", arguments)
        # A long one is quoted back in part.
        with pytest.raises(MCPError) as refused_long:
            await session.call_tool("T" * 5000, owner)
        assert str(refused_long.value) == 'unknown tool "' + "T" * 64 + '…"'


async def test_search(connect: Connect) -> None:
    scope = {"scope_type": "namespace", "scope": unique("kb")}
    async with connect("user") as session:
        await session.call_tool("memory_set", {**scope, "key": "deploy", "value": "helm upgrade needs the staging kubeconfig"})
        await session.call_tool("memory_set", {**scope, "key": "lunch", "value": "pizza on fridays"})
        found = structured(
            await session.call_tool("search", {"query": "kubeconfig", "sources": ["memory"], "scope_type": "namespace", "scope": scope["scope"]})
        )
        assert [h["item"]["entry"]["key"] for h in found["hits"]] == ["deploy"]
        prefixed = structured(await session.call_tool("search", {"query": "kubeconfig", "scope_prefix": scope["scope"][:6]}))
        assert [h["item"]["entry"]["key"] for h in prefixed["hits"]] == ["deploy"]
        assert "**kubeconfig**" in found["hits"][0]["snippet"]
        bad = error(await session.call_tool("search", {"query": ""}))
        assert bad["code"] == "INVALID_ARGUMENT"


async def test_tenants_are_kept_apart(connect: Connect) -> None:
    scope = {"scope_type": "namespace", "scope": unique("secret")}
    async with connect("user") as session:
        structured(await session.call_tool("memory_set", {**scope, "key": "k", "value": "acme only"}))
    async with connect("other") as session:
        hidden = error(await session.call_tool("memory_get", {**scope, "key": "k"}))
        assert hidden["code"] == "NOT_FOUND"


async def test_http_refuses_requests_without_a_valid_token(server: Server) -> None:
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    headers = {"accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient() as client:
        missing = await client.post(f"http://{server.http}/mcp", json=hello, headers=headers)
        assert missing.status_code == 401 and missing.json()["reason"] == "TOKEN_MISSING"
        wrong = await client.post(
            f"http://{server.http}/mcp", json=hello, headers={**headers, "authorization": "Bearer nope"}
        )
        assert wrong.status_code == 401 and wrong.json()["reason"] == "TOKEN_INVALID"
        ok = await client.post(
            f"http://{server.http}/mcp",
            json=hello,
            headers={**headers, "authorization": f"Bearer {server.tokens['user']}"},
        )
        assert ok.status_code == 200



async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response with a content-length: status, headers, body."""
    status = int((await reader.readline()).split()[1])
    headers = {}
    while (line := (await reader.readline()).decode().strip()) != "":
        name, value = line.split(":", 1)
        headers[name.lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def test_a_refused_request_leaves_its_connection_usable(server: Server) -> None:
    # A client that waits for "100 Continue" before sending the body (curl
    # does for big bodies) gets it: the body is read before the 401, so the
    # connection carries the next request instead of being closed under it.
    host, port = server.http.rsplit(":", 1)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
    head = f"POST /mcp HTTP/1.1\r\nhost: {server.http}\r\ncontent-type: application/json\r\n"
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"{head}content-length: {len(body)}\r\nexpect: 100-continue\r\n\r\n".encode())
        status, _, _ = await read_response(reader)
        assert status == 100
        writer.write(body)
        status, headers, answer = await read_response(reader)
        assert status == 401 and json.loads(answer)["reason"] == "TOKEN_MISSING"
        assert headers.get("connection") != "close"
        writer.write(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
        status, _, answer = await read_response(reader)
        assert status == 401 and json.loads(answer)["reason"] == "TOKEN_MISSING"
    finally:
        writer.close()
    # A body that stops arriving is waited for a few seconds, not for ever.
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body[:5])
        status, headers, _ = await read_response(reader)
        assert status == 401 and headers["connection"] == "close"
    finally:
        writer.close()
    # A body past the server's bound is not read, and the 401 says so.
    big = {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"pad": "x" * 128 * 1024}}
    async with httpx2.AsyncClient() as client:
        refused = await client.post(f"http://{server.http}/mcp", json=big)
        assert refused.status_code == 401 and refused.headers["connection"] == "close"
        again = await client.post(f"http://{server.http}/mcp", json=big)
        assert again.status_code == 401 and again.json()["reason"] == "TOKEN_MISSING"


# Strings a hostile or careless model sends, and some a careful one does.
HOSTILE_STRINGS = [
    "",
    " ",
    "alice",
    "notes/a",
    "s1",
    "'; DROP TABLE memory_versions; --",
    "%",
    "\\",
    "../../etc/passwd",
    "a\u0000b",
    "\u202eevil",
    "😀",
    "第3.5章",
    "<script>alert(1)</script>",
    "\"unterminated",
    "NaN",
    "2026-11-28T12:00:00Z",
    "x" * 5000,
    "工" * 1500,
]
HOSTILE_NUMBERS = [0, 1, -1, 101, 2**31, -(2**63), 2**63 - 1, 1.5, float("inf")]
# What no answer may say: SQL, the stores' internals, the server's source.
LEAKS = ["sqlx", "SQL", "syntax error", "violates", 'relation "', "pg_", ".rs:", "panicked", "src/"]


def hostile_value(rng: random.Random, schema: object) -> object:
    """A value for one property: often of its declared type, sometimes not."""
    schema = schema if isinstance(schema, dict) else {}
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if rng.random() < 0.15:
        kind = rng.choice(["string", "integer", "object", "array", "boolean", None])
    if kind == "string":
        return rng.choice(HOSTILE_STRINGS + list(schema.get("enum", [])))
    if kind in ("integer", "number"):
        return rng.choice(HOSTILE_NUMBERS)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [hostile_value(rng, schema.get("items", {"type": "string"})) for _ in range(rng.randrange(3))]
    if kind == "object":
        return {rng.choice(HOSTILE_STRINGS[:8]) or "k": rng.choice(HOSTILE_STRINGS)}
    return None


async def test_hostile_arguments_come_back_as_client_errors(connect: Connect) -> None:
    """Every tool, called with arguments generated from its own schema
    (hostile strings, extreme numbers, wrong types, missing and unknown
    properties), answers with a result or an error result a model can act
    on: never an internal error, never SQL or the server's source."""
    rng = random.Random(0x9E3779B9)
    wrong = []
    answered = {"ok": 0, "error": 0}
    async with connect("admin") as session:
        tools = (await session.list_tools()).tools
        for _ in range(10):
            for tool in tools:
                properties = tool.input_schema.get("properties", {})
                arguments = {
                    name: hostile_value(rng, schema)
                    for name, schema in properties.items()
                    if rng.random() < 0.7
                }
                if rng.random() < 0.1:
                    arguments["unexpected"] = "x"
                try:
                    result = await session.call_tool(tool.name, arguments)
                except MCPError as refused:
                    # Only a refusal of the arguments themselves.
                    if refused.error.code != -32602:
                        wrong.append(f"{tool.name} {arguments!r:.200}: JSON-RPC {refused.error}")
                    continue
                text = " ".join(getattr(c, "text", "") for c in result.content)
                leak = [leak for leak in LEAKS if leak in text]
                if result.is_error:
                    answered["error"] += 1
                    reported = (result.structured_content or {}).get("error")
                    code = reported.get("code") if isinstance(reported, dict) else None
                    if code in ("INTERNAL", "UNKNOWN", "DATA_LOSS", "UNAVAILABLE") or leak:
                        wrong.append(f"{tool.name} {arguments!r:.200}: {code} {text:.300}")
                else:
                    answered["ok"] += 1
                    if leak:
                        wrong.append(f"{tool.name} {arguments!r:.200}: leaks {leak}")
        # The session still serves.
        assert not (await session.call_tool("memory_scopes", {})).is_error
    assert not wrong, "\n".join(wrong)
    # Both kinds of answer were reached.
    assert answered["ok"] >= 5 and answered["error"] > 50, answered
