"""The asyncio client against a real engram server."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import datetime, timedelta, timezone

import pytest

from conftest import Server, start_server
import engram_client._requests
from engram_client import (
    Conflict,
    EngramError,
    Episode,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unauthenticated,
    deltas,
)
from engram_client.aio import AsyncEngram, Engram
from engram_client.v1 import memory_pb2, working_memory_pb2


def test_time_travel_and_fork(server: Server) -> None:
    async def run() -> None:
        async with AsyncEngram(server.address) as client:
            client.memory.configure("tt-aio")
            await client.memory.set("plan", 1)
            await client.memory.set("plan", 2)
            revisions = []
            async for change in client.memory.watch(from_revision=0):
                revisions.append(change.revision)
                if len(revisions) == 2:
                    break
            assert await client.memory.get("plan", as_of=revisions[0]) == 1
            assert await client.memory.get("plan", as_of=timedelta(0)) == 2
            then = await client.memory.snapshot(revisions[0])
            assert [(e.key, e.value) for e in then.entries] == [("plan", 1)]
            fork = await client.memory.fork("tt-aio-copy", as_of=revisions[0])
            assert (fork.keys_copied, fork.revision) == (1, revisions[0])
            client.memory.configure("tt-aio-copy")
            assert await client.memory.get("plan") == 1
            with pytest.raises(EngramError) as ahead:
                await client.memory.get("plan", as_of=10**12)
            assert ahead.value.reason == "REVISION_NOT_REACHED"

    asyncio.run(run())


def test_forget_user(server: Server) -> None:
    async def run() -> None:
        async with AsyncEngram(server.address) as client:
            await client.episodes.append("fg-aio-1", "hi", app="fg-aio", user="carol")
            dry = await client.forget_user("fg-aio", "carol", dry_run=True)
            assert (dry.sessions, dry.episodes, dry.dry_run) == (1, 1, True)
            done = await client.forget_user("fg-aio", "carol")
            assert (done.sessions, done.episodes, done.dry_run) == (1, 1, False)
            assert await client.sessions.get("fg-aio-1") is None

    asyncio.run(run())


def test_export_and_import(server: Server) -> None:
    async def run() -> None:
        async with AsyncEngram(server.address) as client:
            await client.episodes.append("ex-aio-1", "hi", app="ex-aio", user="erin")
            lines = [line async for line in client.export(app="ex-aio", user="erin")]
            assert len(lines) == 4  # header, session, episode, end
            again = await client.import_lines(lines)
            assert (again.imported, again.unchanged) == ({}, {"session": 1, "episode": 1})

    asyncio.run(run())


def test_memory(server: Server) -> None:
    async def run() -> None:
        assert Engram is AsyncEngram  # engram_client.aio.Engram, as grpc.aio names it
        async with Engram(server.address) as client:
            client.memory.configure("customer_profiles", "namespace")
            first = await client.memory.set("user_42/theme", {"mode": "dark"})
            assert (first.version, first.value) == (1, {"mode": "dark"})
            await client.memory.set("user_42/theme", "light", expected_version=1)
            await client.memory.set("user_42/lang", 42, request_id="r1")
            again = await client.memory.set("user_42/lang", 42, request_id="r1")
            assert again.version == 1, "a replayed request_id writes nothing"
            assert await client.memory.get("user_42/theme") == "light"
            assert await client.memory.get("user_42/theme", version=1) == {"mode": "dark"}
            assert await client.memory.get("nope") is None
            assert [e.key async for e in client.memory.list("user_42/")] == [
                "user_42/lang",
                "user_42/theme",
            ]
            with pytest.raises(Conflict) as lost:
                await client.memory.set("user_42/theme", "x", expected_version=1)
            assert lost.value.reason == "VERSION_MISMATCH"
            assert lost.value.metadata["current_version"] == "2"

            tombstone = await client.memory.delete("user_42/theme", request_id="d-aio")
            assert (tombstone.version, tombstone.deleted) == (3, True)
            again = await client.memory.delete("user_42/theme", request_id="d-aio")
            assert again.version == 3, "a replayed request_id writes nothing"
            history = [(e.version, e.deleted) async for e in client.memory.history("user_42/theme")]
            assert history == [(1, False), (2, False), (3, True)]
            restored = await client.memory.rollback("user_42/theme", 1)
            assert (restored.version, restored.value) == (4, {"mode": "dark"})
            with pytest.raises(InvalidArgument) as refused:
                await client.memory.rollback("user_42/theme", 3)
            assert refused.value.reason == "ROLLBACK_TO_TOMBSTONE"
            await client.memory.delete("user_42/theme")
            with pytest.raises(NotFound):
                await client.memory.delete("user_42/theme")

            client.memory.configure("")
            with pytest.raises(InvalidArgument) as unscoped:
                await client.memory.get("k")
            assert unscoped.value.reason == "SCOPE_NOT_CONFIGURED"

    asyncio.run(run())


def test_watch_resumes_from_a_revision(server: Server) -> None:
    async def run() -> None:
        async with AsyncEngram(server.address) as client:
            client.memory.configure("watched")
            for n in range(3):
                await client.memory.set(f"k{n}", n)
            changes: list[memory_pb2.WatchResponse] = []
            async for change in client.memory.watch(from_revision=0):
                changes.append(change)
                if len(changes) == 3:
                    break
            assert [c.key for c in changes] == ["k0", "k1", "k2"]
            # Resuming after the second change gives the third, then live ones.
            await client.memory.set("k3", 3)
            resumed = client.memory.watch(from_revision=changes[1].revision)
            assert [(await anext(resumed)).key for _ in range(2)] == ["k2", "k3"]
            await resumed.aclose()

    asyncio.run(run())


def test_sessions_episodes_and_search(server: Server) -> None:
    async def run() -> None:
        async with AsyncEngram(server.address) as client:
            session = await client.sessions.create("support", "alice", "chat-1", {"channel": "web"})
            assert (session.id, session.metadata) == ("chat-1", {"channel": "web"})
            _, created = await client.sessions.get_or_create("support", "alice", "chat-1")
            assert created is False
            with pytest.raises(NotFound) as required:
                await client.episodes.append(
                    "chat-9", "x", app="support", user="alice", require_session=True
                )
            assert required.value.reason == "SESSION_NOT_FOUND"
            with pytest.raises(NotFound):
                await client.episodes.append_many(
                    "chat-9", [client.episodes.new("x")], app="support", user="alice", require_session=True
                )
            await client.episodes.append(
                "chat-1", "my deploy fails", type="user_message", id="e1", require_session=True
            )
            await client.episodes.append_many(
                "chat-1",
                [
                    client.episodes.new("which cluster?", type="agent_response"),
                    client.episodes.new("staging kubeconfig", type="user_message"),
                ],
            )
            seqs = [e.seq async for e in client.episodes.list("chat-1")]
            assert seqs == [1, 2, 3]
            recent = await client.episodes.recent("alice", limit=1)
            assert [e.content for e in recent] == ["staging kubeconfig"]
            got = await client.episodes.get("e1")
            assert (got.session_id, got.seq, got.content) == ("chat-1", 1, "my deploy fails")
            with pytest.raises(NotFound) as no_episode:
                await client.episodes.get("no-such-episode")
            assert no_episode.value.reason == "EPISODE_NOT_FOUND"
            context = await client.episodes.context("chat-1")
            assert context.startswith("User: my deploy fails\nAssistant: which cluster?")
            assert [s.id async for s in client.sessions.list(user="alice")] == ["chat-1"]
            assert (await client.sessions.stats())["total_episodes"] == 3

            hits = await client.search("kubeconfig", sources=["episodes"], user="alice")
            assert [h.episode.content for h in hits if h.episode] == ["staging kubeconfig"]
            client.memory.configure("kb-aio")
            await client.memory.set("k8s", "the kubeconfig lives in the vault")
            prefixed = await client.search("kubeconfig", sources=["memory"], scope_prefix="kb-")
            assert [h.entry.key for h in prefixed if h.entry] == ["k8s"]
            assert await client.search("kubeconfig", sources=["memory"], scope_prefix="zz") == []


            assert await client.working.set_goal("chat-1", "fix the deploy") == "fix the deploy"
            task = await client.working.create_task("chat-1", "Find the kubeconfig")
            moved = await client.working.update_task("chat-1", task.id, status="in_progress")
            assert (moved.id, moved.status) == ("t1", "in_progress")
            with pytest.raises(NotFound) as unknown:
                await client.working.update_task("chat-1", "t7", status="completed")
            assert unknown.value.reason == "TASK_NOT_FOUND"
            remembered = await client.working.remember(
                "chat-1", "alice keeps the kubeconfig in the vault"
            )
            procedure = await client.working.record_procedure("support", "ask before deleting")
            cached = await client.working.cache("chat-1", "notes.md", "vault path: /kv/k8s")
            assert (cached.file.bytes, cached.evicted) == (19, [])
            snapshot = await client.working.snapshot("chat-1")
            assert (snapshot.goal, [t.status for t in snapshot.tasks]) == (
                "fix the deploy", ["in_progress"]
            )
            assert [f.id for f in snapshot.facts] == [remembered.id]
            assert [p.id for p in snapshot.procedures] == [procedure.id]
            assert [c.path for c in snapshot.cache] == ["notes.md"]
            assert "Remember" in [t.name for t in await client.working.tools()]
            done = await client.working.call_tool(
                "chat-1", "TaskUpdate", {"taskId": "t1", "status": "completed"}
            )
            assert not done.is_error and done.result["status"] == "completed"
            assert [t.status for t in await client.working.tasks("chat-1")] == ["completed"]
            call = ("chat-1", "TaskCreate", {"subject": "write it up"})
            forwarded = await client.working.call_tool(*call, request_id="call_9")
            assert await client.working.call_tool(*call, request_id="call_9") == forwarded
            assert [t.id for t in await client.working.tasks("chat-1")] == ["t1", "t2"]
            made = deltas.Provenance(["e1"], rule_id="triage")
            applied = await client.facts.apply([deltas.add("support", "alice", "alice's deploy fails", made)])
            assert applied.facts_added == 1
            await client.facts.delete(applied.fact_ids[0])
            rule = await client.rules.create("vault", "content:vault", every_n_episodes=10, request_id="setup-vault")
            again = await client.rules.create("vault", "content:vault", every_n_episodes=10, request_id="setup-vault")
            assert again == rule, "a repeat under its request id is the rule, not RULE_EXISTS"
            assert [r.id async for r in client.rules.list()] == [rule.id]
            assert (await client.rules.run("vault", dry_run=True)).episodes_matched == 0
            await client.rules.delete("vault")
            with pytest.raises(NotFound):
                await client.rules.get("vault")
            # Calls without a wrapper are on the stubs, with the same errors.
            with pytest.raises(FailedPrecondition) as stored:
                await client.call(
                    client.stubs.working_memory.SetGoal,
                    working_memory_pb2.SetGoalRequest(session_id="chat-1", user="mallory", goal="x"),
                )
            assert stored.value.reason == "SESSION_OWNER_MISMATCH"
            block = await client.working.render("chat-1", query="vault")
            assert "fix the deploy" in block.memory_block
            assert "- alice keeps the kubeconfig in the vault" in block.memory_block
            facts = [f async for f in client.facts.list(user="alice")]
            assert facts == [remembered]
            assert await client.facts.get(facts[0].id) == facts[0]
            deleted = await client.facts.delete(facts[0].id)
            assert (deleted.id, deleted.version, deleted.deleted) == (facts[0].id, 2, True)
            assert [f async for f in client.facts.list(user="alice", kind="semantic")] == []
            assert await client.facts.get(facts[0].id) == deleted
            history = [v async for v in client.facts.history(facts[0].id)]
            assert [(v.version, v.deleted, v.source) for v in history] == [
                (1, False, "remember"),
                (2, True, "delete"),
            ]
            with pytest.raises(NotFound):
                await client.facts.get("01a217d0-16f4-77f7-b943-07089ac8712b")
            with pytest.raises(NotFound):
                [v async for v in client.facts.history("01a217d0-16f4-77f7-b943-07089ac8712b")]

            ended = await client.sessions.end("chat-1")
            assert ended.ended
            assert await client.sessions.delete("chat-1") == 3
            assert await client.sessions.get("chat-1") is None

    asyncio.run(run())


def test_creations_repeated_with_their_request_id_make_nothing(server: Server) -> None:
    """What a retry after a lost reply sends, the same request id again, is
    answered with what the first call made, through the asyncio wrappers."""

    async def run() -> None:
        async with AsyncEngram(server.address) as client:
            session = await client.sessions.create("support", "rex", request_id="s-1")
            assert await client.sessions.create("support", "rex", request_id="s-1") == session
            # The same request as GetOrCreate: as created.
            found, created = await client.sessions.get_or_create("support", "rex", "", request_id="s-1")
            assert (found, created) == (session, True)
            task = await client.working.create_task(session.id, "read the logs", request_id="t-1")
            again = await client.working.create_task(session.id, "read the logs", request_id="t-1")
            assert again == task
            fact = await client.working.remember(session.id, "prefers tea", request_id="f-1")
            assert (await client.working.remember(session.id, "prefers tea", request_id="f-1")).id == fact.id
            procedure = await client.working.record_procedure("support", "page on-call", request_id="p-1")
            repeat = await client.working.record_procedure("support", "page on-call", request_id="p-1")
            assert repeat.id == procedure.id
            # Without one, each call is its own (a random id each).
            other = await client.working.create_task(session.id, "read the logs")
            assert other.id != task.id
            assert [t.id for t in await client.working.tasks(session.id)] == [task.id, other.id]

    asyncio.run(run())


def test_lists_read_every_page(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engram_client._requests, "PAGE", 2)

    async def run() -> None:
        async with AsyncEngram(server.address) as client:
            client.memory.configure("paged")
            for i in range(5):
                await client.memory.set(f"k{i}", i)
                await client.episodes.append(f"p-{i % 3}", f"note {i}", app="bot", user="fay")
                await client.working.remember("p-0", f"fact {i}")
                await client.working.create_task("p-0", f"task {i}")
            assert [e.value async for e in client.memory.list()] == [0, 1, 2, 3, 4]
            tasks = [t.id for t in await client.working.tasks("p-0")]
            assert tasks == ["t1", "t2", "t3", "t4", "t5"]
            snapshot = await client.memory.snapshot(as_of=datetime.now(timezone.utc))
            assert len(snapshot.entries) == 5
            sessions = sorted([s.id async for s in client.sessions.list(user="fay")])
            assert sessions == ["p-0", "p-1", "p-2"]
            assert [e.content async for e in client.episodes.list("p-0")] == ["note 0", "note 3"]
            assert len([f async for f in client.facts.list(user="fay")]) == 5

    asyncio.run(run())


def test_maintenance(database_url: str) -> None:
    running = start_server(database_url, env={"ENGRAM_RETENTION_INTERVAL_SECS": "0"})

    async def run() -> None:
        async with AsyncEngram(running.address) as client:
            client.memory.configure("upkeep-aio")
            for n in range(3):
                await client.memory.set("notes", n)
            await client.memory.set("plan", "ship")
            assert [(s.scope, s.entry_count) async for s in client.memory.scopes()] == [
                ("upkeep-aio", 2)
            ]
            purged = await client.memory.purge("notes", keep=2)
            assert (purged.versions_deleted, purged.keys_affected) == (1, 1)
            assert (await client.memory.purge_scope(keep=1, dry_run=True)).versions_deleted == 1
            summary = await client.memory.compact("notes", "plan", target_key="digest")
            assert [(e.key, e.version) for e in summary.sources] == [("notes", 3), ("plan", 1)]
            log = [r.operation async for r in client.memory.compaction_log()]
            assert log == ["compact", "purge"]

            assert await client.memory.retention() is None
            preview = await client.memory.preview_retention(keep_versions=1)
            assert (preview.versions_deleted, preview.keys_affected) == (1, 1)
            policy = await client.memory.set_retention(keep_versions=1, max_age=timedelta(days=30))
            assert policy is not None and policy.max_age == timedelta(days=30)
            applied = await client.memory.apply_retention()
            assert applied.record is not None and applied.record.versions_deleted == 1
            stored = await client.memory.retention()
            assert stored is not None and stored.last_versions_deleted == 1
            assert await client.memory.set_retention() is None
            assert (await client.memory.reindex()).applied is False

            await client.sessions.create("bot", "ann", "idle-aio")
            assert await client.sessions.cleanup(timedelta(hours=1)) == 0
            assert await client.sessions.cleanup(timedelta(microseconds=1)) == 1
            with pytest.raises(InvalidArgument) as negative:
                await client.memory.purge("notes", keep=-1)
            assert "keep" in negative.value.fields

    try:
        asyncio.run(run())
    finally:
        running.stop()


def test_tail_resumes_across_a_server_restart(database_url: str) -> None:
    first = start_server(database_url)
    address = first.address

    async def run() -> list[Episode]:
        seen: list[Episode] = []
        async with AsyncEngram(address) as tailer, AsyncEngram(address, wait_for_ready=True) as writer:
            tail = tailer.episodes.tail(app="app", cursor=0)
            for i in range(5):
                await writer.episodes.append("s1", i, id=f"a{i}", app="app", user="u")
            for _ in range(5):
                seen.append(await asyncio.wait_for(anext(tail), timeout=30))
            first.stop()  # the tail ends with UNAVAILABLE and keeps reconnecting
            second = start_server(database_url, grpc_addr=address)
            try:
                for i in range(5, 10):
                    await writer.episodes.append("s1", i, id=f"a{i}", app="app", user="u")
                for _ in range(5):
                    seen.append(await asyncio.wait_for(anext(tail), timeout=60))
                await tail.aclose()
            finally:
                second.stop()
        return seen

    seen = asyncio.run(run())
    assert [e.content for e in seen] == list(range(10)), "every episode once, in order"
    assert [e.cursor for e in seen] == sorted({e.cursor for e in seen})


def test_tokens(database_url: str) -> None:
    token = "aio-secret"
    line = f"{hashlib.sha256(token.encode()).hexdigest()} acme"
    running = start_server(database_url, env={"ENGRAM_TOKENS": line})

    async def run() -> None:
        async with AsyncEngram(running.address) as anonymous:
            anonymous.memory.configure("prefs")
            with pytest.raises(Unauthenticated) as refused:
                await anonymous.memory.get("k")
            assert refused.value.reason == "TOKEN_MISSING"
        async with AsyncEngram(running.address, token) as client:
            client.memory.configure("prefs")
            await client.memory.set("k", "v")
            assert await client.memory.get("k") == "v"

    try:
        asyncio.run(run())
    finally:
        running.stop()
