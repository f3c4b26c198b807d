"""The Python client against a real engram server: every service."""

from __future__ import annotations

import hashlib
import json
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path
import threading

import pytest

from conftest import Server, start_server
import engram_client._requests
from engram_client import (
    AlreadyExists,
    Conflict,
    Engram,
    EngramError,
    Episode,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Rule,
    Unauthenticated,
    deltas,
)
from engram_client.v1 import (
    memory_admin_pb2,
    memory_pb2,
    working_memory_pb2,
)


def test_memory_round_trip(server: Server) -> None:
    with Engram(server.address) as client:
        client.memory.configure("customer_profiles", "namespace")
        first = client.memory.set("user_42/theme", {"mode": "dark", "n": 2})
        assert (first.version, first.value) == (1, {"mode": "dark", "n": 2})
        client.memory.set("user_42/theme", "light")
        client.memory.set("user_42/lang", 42)
        assert client.memory.get("user_42/theme") == "light"
        assert client.memory.get("user_42/theme", version=1) == {"mode": "dark", "n": 2}
        assert client.memory.get("user_42/lang") == 42
        assert client.memory.get("nope") is None
        assert [e.key for e in client.memory.list("user_42/")] == ["user_42/lang", "user_42/theme"]

        tombstone = client.memory.delete("user_42/theme", request_id="d-sync")
        assert (tombstone.version, tombstone.deleted) == (3, True)
        again = client.memory.delete("user_42/theme", request_id="d-sync")
        assert again.version == 3, "a replayed request_id answers with the first tombstone"
        assert client.memory.get("user_42/theme") is None
        restored = client.memory.rollback("user_42/theme", 1)
        assert (restored.version, restored.value) == (4, {"mode": "dark", "n": 2})
        client.memory.delete("user_42/theme")
        history = list(client.memory.history("user_42/theme"))
        assert [(e.version, e.deleted) for e in history] == [
            (1, False), (2, False), (3, True), (4, False), (5, True)
        ]


def test_time_travel_and_fork(server: Server) -> None:
    with Engram(server.address) as client:
        client.memory.configure("tt")
        client.memory.set("plan", {"step": 1})
        between = datetime.now(timezone.utc)
        client.memory.set("notes", "n1")
        client.memory.set("plan", {"step": 2})
        changes = client.memory.watch(from_revision=0)
        revisions = [next(changes).revision for _ in range(3)]
        changes.close()

        assert client.memory.get("plan", as_of=revisions[0]) == {"step": 1}
        assert client.memory.get("notes", as_of=revisions[0]) is None
        assert client.memory.get("plan", as_of=between) == {"step": 1}
        assert client.memory.get("plan", as_of=revisions[2]) == {"step": 2}
        # A timedelta is how long ago.
        assert client.memory.get("plan", as_of=timedelta(0)) == {"step": 2}
        assert client.memory.get("plan", as_of=timedelta(days=1)) is None
        with pytest.raises(ValueError, match="how long ago"):
            client.memory.get("plan", as_of=timedelta(seconds=-1))
        then = client.memory.snapshot(revisions[1])
        assert [(e.key, e.version, e.value) for e in then.entries] == [
            ("notes", 1, "n1"), ("plan", 1, {"step": 1})
        ]
        assert then.purged_keys == []

        fork = client.memory.fork("tt-replay", as_of=revisions[1])
        assert (fork.keys_copied, fork.revision) == (2, revisions[1])
        assert fork.audit_key.startswith("_compaction/")
        with pytest.raises(FailedPrecondition) as taken:
            client.memory.fork("tt-replay")
        assert taken.value.reason == "SCOPE_NOT_EMPTY"
        client.memory.configure("tt-replay")
        assert [(e.key, e.version, e.value) for e in client.memory.list()] == [
            ("notes", 1, "n1"), ("plan", 1, {"step": 1})
        ]

        # Purged since: an error with its reason, never a silent None.
        client.stubs.memory_admin.Purge(
            memory_admin_pb2.PurgeRequest(
                scope_type=memory_pb2.SCOPE_TYPE_NAMESPACE, scope="tt", key="plan", keep=1
            )
        )
        client.memory.configure("tt")
        with pytest.raises(NotFound) as purged:
            client.memory.get("plan", as_of=revisions[0])
        assert purged.value.reason == "VERSION_PURGED"
        assert client.memory.snapshot(revisions[1]).purged_keys == ["plan"]


def test_forget_user(server: Server) -> None:
    with Engram(server.address) as client:
        client.episodes.append("fg-a1", "alice was here", app="fg-bot", user="alice")
        client.episodes.append("fg-a2", "alice again", app="fg-bot", user="alice")
        client.episodes.append("fg-b1", "bob was here", app="fg-bot", user="bob")
        client.memory.configure("fg-a1", "execution")
        client.memory.set("plan", "alice's plan")

        dry = client.forget_user("fg-bot", "alice", dry_run=True)
        assert (dry.sessions, dry.episodes, dry.execution_scopes, dry.dry_run) == (2, 2, 1, True)
        assert client.sessions.get("fg-a1") is not None

        done = client.forget_user("fg-bot", "alice")
        assert (done.sessions, done.episodes, done.memory_versions) == (2, 2, 1)
        assert done.audit_key.startswith("_compaction/")
        assert client.sessions.get("fg-a1") is None
        assert client.memory.get("plan") is None
        assert client.sessions.get("fg-b1") is not None
        with pytest.raises(InvalidArgument) as bad:
            client.forget_user("fg-bot", "")
        assert "user" in bad.value.fields


def test_export_and_import(server: Server, tmp_path: Path) -> None:
    copy = start_server(f"sqlite://{tmp_path}/copy.db")
    try:
        with Engram(server.address) as source, Engram(copy.address) as target:
            source.episodes.append("ex-s1", "first", id="ex-e1", app="ex-bot", user="dora")
            source.episodes.append("ex-s1", {"n": 2}, id="ex-e2", app="ex-bot", user="dora")
            source.memory.configure("ex-scope")
            source.memory.set("k", {"v": 1})
            source.memory.set("k", {"v": 2})

            session = list(source.export(session_id="ex-s1"))
            scope = list(source.export(scope="ex-scope"))
            assert json.loads(session[0])["format"] == "engram.export"
            assert [json.loads(line)["kind"] for line in session[1:]] == [
                "session",
                "episode",
                "episode",
                "end",
            ]
            with pytest.raises(InvalidArgument) as cut:
                target.import_lines(session[:-1])  # cut short: no end line
            assert (cut.value.reason, list(cut.value.fields)) == ("IMPORT_MALFORMED", ["line 5.kind"])
            done = target.import_lines(session)
            assert (done.imported, done.lines) == ({"session": 1, "episode": 2}, 5)
            assert target.import_lines(scope).imported == {"memory_version": 2}
            assert target.import_lines(scope).unchanged == {"memory_version": 2}
            assert list(target.export(session_id="ex-s1"))[1:] == session[1:]
            target.memory.configure("ex-scope")
            assert target.memory.get("k") == {"v": 2}

            with pytest.raises(InvalidArgument) as bad:
                target.import_lines([session[0], '{"kind": "session"}'])
            assert bad.value.reason == "IMPORT_MALFORMED"
            assert "line 2" in bad.value.fields
    finally:
        copy.stop()


def test_compare_and_set_and_invalid_input(server: Server) -> None:
    with Engram(server.address) as client:
        # No scope and no flow: the error says how to give one here.
        with pytest.raises(InvalidArgument) as unscoped:
            client.memory.set("k", 1)
        assert unscoped.value.reason == "SCOPE_NOT_CONFIGURED"
        assert "call memory.configure(scope) first" in str(unscoped.value)
        client.memory.configure("prefs")
        client.memory.set("k", 1)
        with pytest.raises(Conflict) as lost:
            client.memory.set("k", 2, expected_version=5)
        assert lost.value.reason == "VERSION_MISMATCH"
        assert lost.value.metadata["current_version"] == "1"
        assert client.memory.set("k", 2, expected_version=1).version == 2
        with pytest.raises(Conflict) as exists:  # 0: only if the key has no live value
            client.memory.set("k", 3, expected_version=0)
        assert exists.value.metadata["current_version"] == "2"

        with pytest.raises(InvalidArgument) as bad:
            client.memory.set("has space", 1)
        assert bad.value.reason == "INVALID_IDENTIFIER"
        assert "key" in bad.value.fields

        with pytest.raises(NotFound) as missing:
            client.memory.delete("never-written")
        assert missing.value.reason == "KEY_NOT_FOUND"


def test_caller_context_and_admin(server: Server) -> None:
    with Engram(server.address, flow_name="research_agent", execution_id="run-1") as client:
        # No configure: the flow's scope, tagged with the execution.
        entry = client.memory.set("notes", ["found a bug"])
        assert (entry.scope_type, entry.scope, entry.execution_id) == (
            "SCOPE_TYPE_FLOW",
            "research_agent",
            "run-1",
        )
        client.memory.set("notes", ["found two bugs"])
        # A call the wrapper covers, through the generated stub: the path
        # for anything it does not.
        purged = client.call(
            client.stubs.memory_admin.Purge,
            memory_admin_pb2.PurgeRequest(
                scope_type=memory_pb2.SCOPE_TYPE_FLOW, scope="research_agent", key="notes", keep=1
            ),
        )
        assert purged.versions_deleted == 1


def test_maintenance(database_url: str) -> None:
    # The scheduler off, so that only this test applies the retention policy.
    server = start_server(database_url, env={"ENGRAM_RETENTION_INTERVAL_SECS": "0"})
    try:
        with Engram(server.address) as client:
            client.memory.configure("upkeep")
            for n in range(4):
                client.memory.set("notes", f"note {n}")
            client.memory.set("plan", "ship it")
            client.memory.set("gone", 1)
            client.memory.delete("gone")
            client.memory.configure("run-7", "execution")
            client.memory.set("scratch", 1)
            client.memory.configure("upkeep")

            scopes = [(s.scope_type, s.scope, s.entry_count) for s in client.memory.scopes()]
            assert ("SCOPE_TYPE_NAMESPACE", "upkeep", 2) in scopes
            assert ("SCOPE_TYPE_EXECUTION", "run-7", 1) in scopes
            assert [s.scope for s in client.memory.scopes("execution")] == ["run-7"]

            # Purge: a dry run counts, then one key keeps its newest two.
            preview = client.memory.purge("notes", keep=2, dry_run=True)
            assert (preview.versions_deleted, preview.keys_affected, preview.record) == (2, 1, None)
            purged = client.memory.purge("notes", keep=2)
            assert (purged.versions_deleted, purged.keys_affected) == (2, 1)
            assert purged.record is not None and purged.record.operation == "purge"
            assert (purged.record.source_keys, purged.record.keep) == (["notes"], 2)
            assert [e.version for e in client.memory.history("notes")] == [3, 4]
            with pytest.raises(InvalidArgument) as negative:
                client.memory.purge("notes", keep=-1)
            assert negative.value.fields == {"keep": "must not be negative, got -1"}

            # The whole scope: deleted keys only when asked for.
            kept = client.memory.purge_scope(keep=1)
            assert (kept.versions_deleted, kept.keys_affected) == (1, 1)
            tombstoned = client.memory.purge_scope(include_deleted=True, keep=0, dry_run=True)
            assert tombstoned.versions_deleted == 4  # notes, plan and both of gone's

            # Compaction: one key into itself, several into a target.
            summary = client.memory.compact("notes")
            assert (summary.entry.key, summary.entry.version) == ("notes", 5)
            assert [(e.key, e.version) for e in summary.sources] == [("notes", 4)]
            assert isinstance(summary.entry.value, str) and summary.entry.value
            both = client.memory.compact("notes", "plan", target_key="digest", instruction="short")
            assert (both.entry.key, both.entry.version) == ("digest", 1)
            assert both.record.source_keys == ["notes", "plan"]
            assert (both.record.target_key, both.record.instruction) == ("digest", "short")
            with pytest.raises(InvalidArgument) as no_target:
                client.memory.compact("notes", "plan")
            assert "target_key" in no_target.value.fields
            with pytest.raises(ValueError, match="at least one key"):
                client.memory.compact()

            # The audit trail, newest first.
            log = [(r.operation, r.target_key) for r in client.memory.compaction_log()]
            assert log == [("compact", "digest"), ("compact", "notes"), ("purge", ""), ("purge", "")]

            # Retention: none, a preview, the policy, a run, then removed.
            assert client.memory.retention() is None
            for n in range(3):
                client.memory.set("plan", f"plan {n}")
            # One version each: notes loses 1 of 2, plan 3 of 4, gone its
            # value under the tombstone; digest has one.
            preview = client.memory.preview_retention(keep_versions=1)
            assert (preview.versions_deleted, preview.keys_affected) == (5, 3)
            assert client.memory.retention() is None
            policy = client.memory.set_retention(
                keep_versions=1, tombstone_grace=timedelta(days=7)
            )
            assert policy is not None
            assert (policy.scope, policy.keep_versions, policy.max_age) == ("upkeep", 1, None)
            assert policy.tombstone_grace == timedelta(days=7)
            assert policy.last_run_time is None
            assert client.memory.apply_retention(dry_run=True).versions_deleted == 5
            applied = client.memory.apply_retention()
            assert (applied.versions_deleted, applied.keys_affected) == (5, 3)
            assert applied.record is not None and applied.record.operation == "retention"
            stored = client.memory.retention()
            assert stored is not None and stored.last_versions_deleted == 5
            assert stored.last_run_time is not None
            with pytest.raises(InvalidArgument) as zero:
                client.memory.set_retention(keep_versions=0)
            assert "policy.keep_versions" in zero.value.fields
            assert client.memory.set_retention() is None
            assert client.memory.retention() is None

            # Flow tags: a report, then the writing, then nothing left to do.
            report = client.memory.reindex()
            assert not report.applied
            done = client.memory.reindex(apply=True)
            assert done.applied and done.tags_added == report.tags_added
            assert client.memory.reindex(apply=True).tags_added == 0

            # Idle sessions: none an hour old; the one made here is older
            # than a microsecond by the time the next call arrives.
            client.sessions.create("support-bot", "alice", "idle-1")
            assert client.sessions.cleanup(timedelta(hours=1)) == 0
            tiny = timedelta(microseconds=1)
            assert client.sessions.cleanup(tiny, dry_run=True) == 1
            assert client.sessions.get("idle-1") is not None
            assert client.sessions.cleanup(tiny) == 1
            assert client.sessions.get("idle-1") is None
            with pytest.raises(InvalidArgument) as forever:
                client.sessions.cleanup(timedelta(0))
            assert "max_age" in forever.value.fields
    finally:
        server.stop()


def test_sessions_and_episodes(server: Server) -> None:
    with Engram(server.address) as client:
        session = client.sessions.create("support-bot", "alice", "chat-1")
        assert (session.id, session.user, session.ended) == ("chat-1", "alice", False)
        with pytest.raises(AlreadyExists):
            client.sessions.create("support-bot", "alice", "chat-1")
        with pytest.raises(FailedPrecondition) as mismatch:
            client.sessions.get_or_create("support-bot", "mallory", "chat-1")
        assert mismatch.value.reason == "SESSION_OWNER_MISMATCH"

        hello = client.episodes.append("chat-1", "Hello!", type="user_message", id="e1")
        again = client.episodes.append("chat-1", "Hello!", type="user_message", id="e1")
        assert (hello.seq, again.seq, again.cursor) == (1, 1, hello.cursor)
        client.episodes.append_many(
            "chat-1",
            [
                client.episodes.new({"tool": "calc"}, type="tool_call"),
                client.episodes.new("Hi there!", type="agent_response"),
            ],
        )
        assert [e.seq for e in client.episodes.list("chat-1")] == [1, 2, 3]
        assert [e.type for e in client.episodes.list("chat-1", types=["tool_call"])] == ["tool_call"]
        assert client.episodes.context("chat-1") == "User: Hello!\nAssistant: Hi there!"
        assert client.episodes.recent("alice", limit=1)[0].content == "Hi there!"
        got = client.episodes.get("e1")
        assert (got.session_id, got.seq, got.content) == ("chat-1", 1, "Hello!")
        with pytest.raises(NotFound) as no_episode:
            client.episodes.get("no-such-episode")
        assert no_episode.value.reason == "EPISODE_NOT_FOUND"
        # One call in the episodic-store style creates the session, unless
        # the session is required.
        with pytest.raises(NotFound) as required:
            client.episodes.append("s-9", {"doc": 7}, app="rag", user="bob", require_session=True)
        assert required.value.reason == "SESSION_NOT_FOUND"
        with pytest.raises(NotFound):
            client.episodes.append_many(
                "s-9", [client.episodes.new(1)], app="rag", user="bob", require_session=True
            )
        assert client.sessions.get("s-9") is None
        client.episodes.append("s-9", {"doc": 7}, app="rag", user="bob")
        assert client.sessions.get("s-9") is not None
        assert {s.id for s in client.sessions.list(user="alice")} == {"chat-1"}
        assert client.sessions.stats()["total_episodes"] == 4
        assert client.sessions.end("chat-1").ended
        assert client.sessions.delete("chat-1") == 3
        assert client.sessions.get("chat-1") is None


def test_tail_resumes_across_a_server_restart(database_url: str) -> None:
    first = start_server(database_url)
    address = first.address
    seen: list[Episode] = []
    done = threading.Event()

    def follow() -> None:
        with Engram(address) as tailer:
            for episode in tailer.episodes.tail(app="app", cursor=0):
                seen.append(episode)
                if len(seen) == 10:
                    done.set()
                    return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    with Engram(address) as client:
        for i in range(5):
            client.episodes.append("s1", i, id=f"a{i}", app="app", user="u")
    first.stop()  # the tail ends with UNAVAILABLE and keeps reconnecting
    second = start_server(database_url, grpc_addr=address)
    try:
        with Engram(address, wait_for_ready=True) as client:
            for i in range(5, 10):
                client.episodes.append("s1", i, id=f"a{i}", app="app", user="u")
        assert done.wait(timeout=60), f"the tail saw only {len(seen)} episodes"
        assert [e.content for e in seen] == list(range(10)), "every episode once, in order"
        assert [e.cursor for e in seen] == sorted({e.cursor for e in seen})
    finally:
        second.stop()


def test_consolidation_rules(server: Server) -> None:
    with Engram(server.address) as client:
        client.episodes.append(
            "chat-1",
            "prefers dark mode",
            app="support-bot",
            user="alice",
            metadata={"subject": "alice", "predicate": "prefers", "object": "dark mode"},
        )
        made = client.rules.create(
            "prefs", "metadata.subject:*", every_n_episodes=1, emits=["profile"], enabled=False
        )
        assert (made.id, made.every_n_episodes, made.cron, made.emits, made.kind) == (
            "prefs", 1, None, ["profile"], "semantic"
        )
        assert (made.watermark, made.enabled, made.last_run_time) == (0, False, None)
        nightly = client.rules.create("nightly", cron="@daily", kind="procedural", confidence=0.5)
        assert (nightly.cron, nightly.every_n_episodes, nightly.kind) == ("@daily", None, "procedural")
        assert [r.id for r in client.rules.list()] == ["nightly", "prefs"]

        preview = client.rules.run("prefs", dry_run=True)
        assert (preview.episodes_matched, preview.facts_added, len(preview.deltas)) == (1, 0, 1)
        assert preview.deltas[0].add.fact_payload.object == "dark mode"
        assert client.rules.get("prefs").watermark == 0, "a dry run keeps the watermark"
        run = client.rules.run("prefs")
        assert (run.episodes_scanned, run.facts_added, run.more) == (1, 1, False)
        assert client.rules.run("prefs").episodes_scanned == 0, "no episode is promoted twice"
        after = client.rules.get("prefs")
        assert (after.watermark, after.episodes_promoted) == (run.watermark, 1)
        assert after.last_run_time is not None
        assert [f.id for f in client.facts.list(app="support-bot")] == run.fact_ids

        with pytest.raises(AlreadyExists) as taken:
            client.rules.create("prefs", every_n_episodes=5)
        assert taken.value.reason == "RULE_EXISTS"
        # A script that creates its rules under its own request ids can run
        # again: each repeat is answered with the rule as it is now.
        def setup(filter: str) -> Rule:
            return client.rules.create("triage", filter, every_n_episodes=10, request_id="setup-triage")

        triage = setup("type = error")
        assert setup("type = error") == triage
        with pytest.raises(InvalidArgument) as reused:
            setup("type = observation")
        assert reused.value.reason == "REQUEST_ID_REUSED"
        client.rules.delete("triage")
        with pytest.raises(InvalidArgument) as bad:
            client.rules.create("bad", "type = ", every_n_episodes=1)
        assert bad.value.reason == "INVALID_FILTER"
        with pytest.raises(ValueError):
            client.rules.create("both", every_n_episodes=1, cron="@daily")
        client.rules.delete("nightly")
        with pytest.raises(NotFound):
            client.rules.get("nightly")

        block = client.working.render("chat-1")
        assert "## Facts (1)\n- prefers dark mode\n" in block.memory_block


def test_a_consolidator_of_your_own(server: Server) -> None:
    with Engram(server.address) as client:
        client.episodes.append("chat-d", "I switched to tea", app="bot", user="ivy", id="e1")
        client.episodes.append("chat-d", "actually, coffee again", app="bot", user="ivy", id="e2")
        made = deltas.Provenance(["e1"], rule_id="llm-extractor", confidence=0.8)
        added = client.facts.apply([
            deltas.add("bot", "ivy", "ivy drinks tea", made, subject="ivy", predicate="drinks", object="tea"),
            deltas.noop(deltas.Provenance(["e1"], rule_id="llm-extractor")),
        ])
        assert (added.facts_added, added.facts_updated, len(added.fact_ids)) == (1, 0, 1)
        tea = client.facts.get(added.fact_ids[0])
        assert (tea.subject, tea.object, tea.content, tea.version) == ("ivy", "tea", "ivy drinks tea", 1)

        later = deltas.Provenance(["e2"], rule_id="llm-extractor", confidence=0.9)
        updated = client.facts.apply([
            deltas.update([tea.id], "bot", "ivy", "ivy drinks coffee", later, object="coffee")
        ])
        assert (updated.facts_updated, updated.fact_ids) == (1, [tea.id])
        assert client.facts.get(tea.id).object == "coffee"

        # All or nothing: an add before a delta without provenance is not kept.
        with pytest.raises(InvalidArgument) as refused:
            client.facts.apply([
                deltas.add("bot", "ivy", "ivy likes rain", later),
                deltas.noop(deltas.Provenance([], rule_id="llm-extractor")),
            ])
        assert refused.value.reason == "MISSING_PROVENANCE"
        assert [f.id for f in client.facts.list(app="bot", user="ivy")] == [tea.id]
        with pytest.raises(ValueError):
            deltas.add("bot", "ivy", "x", later, kind="episodic")  # type: ignore[arg-type]

        # A rule's dry run proposes; a consolidator may apply what it keeps.
        client.rules.create("all", "content:coffee", every_n_episodes=100, enabled=False)
        preview = client.rules.run("all", dry_run=True)
        assert client.facts.apply(preview.deltas).facts_added == 1

        removed = client.facts.apply([deltas.delete("bot", "ivy", [tea.id], later)])
        assert removed.facts_deleted == 1
        assert client.facts.get(tea.id).deleted

        # Every version with its lineage, oldest first.
        history = list(client.facts.history(tea.id))
        assert [(v.version, v.deleted, v.object) for v in history] == [
            (1, False, "tea"),
            (2, False, "coffee"),
            (3, True, ""),
        ]
        assert [v.source_episode_ids for v in history[:2]] == [["e1"], ["e2"]]
        assert history[0].source == "llm-extractor" and history[0].confidence == pytest.approx(0.8)
        with pytest.raises(NotFound):
            list(client.facts.history("01a217d0-16f4-77f7-b943-07089ac8712b"))


def test_working_memory(database_url: str) -> None:
    server = start_server(
        database_url,
        env={"ENGRAM_MAX_TASKS_PER_SESSION": "2", "ENGRAM_MAX_CACHED_FILES": "2"},
    )
    try:
        with Engram(server.address) as client:
            goal = client.working.set_goal(
                "chat-w", "ship the fix; password=hunter2", app="bot", user="gil"
            )
            assert goal == "ship the fix; password=[REDACTED]"
            first = client.working.create_task("chat-w", "Reply to gil", "about the deploy")
            assert (first.id, first.subject, first.description, first.status) == (
                "t1", "Reply to gil", "about the deploy", "pending"
            )
            second = client.working.create_task("chat-w", "Check the logs")
            with pytest.raises(ResourceExhausted) as full:
                client.working.create_task("chat-w", "A third")
            assert full.value.reason == "LIMIT_EXCEEDED"

            done = client.working.update_task("chat-w", "t1", status="completed")
            assert (done.status, done.subject, done.description) == (
                "completed", "Reply to gil", "about the deploy"
            )
            renamed = client.working.update_task("chat-w", "t2", subject="Read the logs")
            assert (renamed.status, renamed.subject) == ("pending", "Read the logs")
            cleared = client.working.update_task("chat-w", "t1", description="")
            assert (cleared.status, cleared.description) == ("completed", "")
            assert [(t.id, t.status) for t in client.working.tasks("chat-w")] == [
                ("t1", "completed"),
                ("t2", "pending"),
            ]
            with pytest.raises(NotFound) as unknown:
                client.working.update_task("chat-w", "t9", status="blocked")
            assert unknown.value.reason == "TASK_NOT_FOUND"
            with pytest.raises(ValueError):
                client.working.update_task("chat-w", "t1", status="done")  # type: ignore[arg-type]
            with pytest.raises(FailedPrecondition) as owner:
                client.working.tasks("chat-w", user="someone-else")
            assert owner.value.reason == "SESSION_OWNER_MISMATCH"

            fact = client.working.remember(
                "chat-w", "gil deploys on fridays", subject="gil", predicate="deploys", object="fridays"
            )
            assert (fact.app, fact.user, fact.kind, fact.subject, fact.object, fact.version) == (
                "bot", "gil", "semantic", "gil", "fridays", 1
            )
            procedure = client.working.record_procedure("bot", "run the tests before a deploy")
            assert (procedure.app, procedure.user, procedure.kind) == ("bot", "", "procedural")

            client.working.cache("chat-w", "a.txt", "alpha")
            client.working.cache("chat-w", "b.txt", "bravo")
            cached = client.working.cache("chat-w", "c.txt", "charlie")
            assert (cached.file.path, cached.file.content, cached.file.bytes) == ("c.txt", "charlie", 7)
            assert cached.evicted == ["a.txt"]

            client.episodes.append("chat-w", "gil asked about the deploy", app="bot", user="gil")
            snapshot = client.working.snapshot("chat-w")
            assert snapshot.goal == goal
            assert [t.subject for t in snapshot.tasks] == ["Reply to gil", "Read the logs"]
            assert [f.id for f in snapshot.facts] == [fact.id]
            assert [p.id for p in snapshot.procedures] == [procedure.id]
            assert [e.content for e in snapshot.recent] == ["gil asked about the deploy"]
            assert [c.path for c in snapshot.cache] == ["b.txt", "c.txt"]
            block = client.working.render("chat-w").memory_block
            assert "- [completed] t1: Reply to gil" in block
            assert "run the tests before a deploy" in block

            tools = {t.name: t for t in client.working.tools()}
            assert set(tools) == {"TaskCreate", "TaskUpdate", "memory.set_goal", "Remember"}
            assert tools["TaskCreate"].parameters["type"] == "object"
            # Bad arguments come back for the LLM to read, not as an error.
            bad = client.working.call_tool("chat-w", "TaskUpdate", {"taskId": "t9"})
            assert bad.is_error and "error" in bad.result
            # Arguments as the JSON text a model API hands over.
            moved = client.working.call_tool(
                "chat-w", "TaskUpdate", '{"taskId": "t2", "status": "in_progress"}'
            )
            assert not moved.is_error
            assert client.working.tasks("chat-w")[1].status == "in_progress"
            assert client.working.call_tool("chat-w", "NoSuchTool").is_error
            broken = client.working.call_tool("chat-w", "TaskUpdate", '{"taskId": "t2",')
            assert broken.is_error and "not valid JSON" in broken.result["error"]
            with pytest.raises(NotFound):
                client.working.snapshot("no-such-session")
    finally:
        server.stop()


def test_facts_and_the_memory_block(server: Server) -> None:
    with Engram(server.address) as client:
        client.episodes.append("chat-f", "hello", app="bot", user="dana")
        for content in ("dana deploys with helm", "dana drinks green tea"):
            client.working.remember("chat-f", content, app="bot", user="dana")
        facts = list(client.facts.list(app="bot", user="dana"))
        assert sorted(f.content for f in facts) == ["dana deploys with helm", "dana drinks green tea"]
        assert {(f.app, f.user, f.kind, f.version) for f in facts} == {("bot", "dana", "semantic", 1)}
        assert list(client.facts.list(app="bot", user="dana", kind="procedural")) == []
        assert list(client.facts.list(app="bot", user="erin")) == []
        helm, tea = sorted(facts, key=lambda f: str(f.content))
        assert client.facts.get(tea.id) == tea

        block = client.working.render("chat-f", query="helm", max_facts=1)
        assert "- dana deploys with helm" in block.memory_block
        assert "green tea" not in block.memory_block
        assert block.instructions != ""
        assert "green tea" in client.working.render("chat-f").memory_block

        deleted = client.facts.delete(tea.id)
        assert (deleted.id, deleted.version, deleted.deleted) == (tea.id, 2, True)
        assert client.facts.get(tea.id) == deleted
        assert [f.id for f in client.facts.list(app="bot", user="dana")] == [helm.id]
        with pytest.raises(NotFound):
            client.facts.delete(tea.id)
        with pytest.raises(NotFound):
            client.working.render("no-such-session")


def test_a_large_batch_is_appended_whole(server: Server) -> None:
    """A batch of 6 MB is appended whole; its answer leaves out the content
    (it must fit one message), which reads give back."""
    with Engram(server.address) as client:
        outputs = [
            client.episodes.new("x" * 512 * 1024, type="tool_output", id=f"big-{n}")
            for n in range(12)
        ]
        big = client.episodes.append_many("chat-big", outputs, app="bot", user="dana")
        assert [(e.id, e.seq, e.content) for e in big] == [
            (f"big-{n}", n + 1, None) for n in range(12)
        ]
        assert client.episodes.get("big-11").content == "x" * 512 * 1024


def test_lists_read_every_page(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engram_client._requests, "PAGE", 2)
    with Engram(server.address) as client:
        client.memory.configure("paged")
        for i in range(5):
            client.memory.set(f"k{i}", i)
            client.episodes.append(f"p-{i % 3}", f"note {i}", app="bot", user="fay")
            client.working.remember("p-0", f"fay fact {i}")
            client.working.create_task("p-0", f"task {i}")
        assert [e.value for e in client.memory.list()] == [0, 1, 2, 3, 4]
        assert [t.id for t in client.working.tasks("p-0")] == ["t1", "t2", "t3", "t4", "t5"]
        assert len(client.memory.snapshot(as_of=datetime.now(timezone.utc)).entries) == 5
        assert sorted(s.id for s in client.sessions.list(user="fay")) == ["p-0", "p-1", "p-2"]
        assert [e.content for e in client.episodes.list("p-0")] == ["note 0", "note 3"]
        assert len(list(client.facts.list(user="fay"))) == 5


def test_search(server: Server) -> None:
    with Engram(server.address) as client:
        client.episodes.append(
            "chat-1", "the deployment setup uses helm", app="bot", user="alice",
            type="user_message",
        )
        client.episodes.append(
            "chat-2", "a deployment elsewhere", app="bot", user="bob", type="user_message"
        )
        client.memory.configure("ops")
        client.memory.set("deploy/notes", {"text": "deployment checklist"})
        client.working.remember("chat-1", "alice runs deployment drills", app="bot", user="alice")

        hits = client.search("deployment setup")
        assert [hit.source for hit in hits][0] == "episodes"
        assert {hit.source for hit in hits} == {"episodes", "memory", "facts"}
        assert hits[0].episode is not None and hits[0].episode.user == "alice"
        assert "**" in hits[0].snippet
        assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))

        bob = client.search("deployment", sources=["episodes"], user="bob")
        assert [hit.episode.session_id for hit in bob if hit.episode] == ["chat-2"]
        memory = client.search("checklist", sources=["memory"], scope_type="namespace", scope="ops")
        assert memory[0].entry is not None and memory[0].entry.key == "deploy/notes"
        by_prefix = client.search("checklist", sources=["memory"], scope_prefix="op")
        assert [hit.entry.scope for hit in by_prefix if hit.entry] == ["ops"]
        assert client.search("checklist", sources=["memory"], scope_prefix="nope") == []
        facts = client.search("drills", sources=["facts"], kind="semantic")
        assert facts[0].fact is not None and facts[0].fact.user == "alice"
        assert client.search("deployment", limit=1, start_time=datetime.now(timezone.utc)) == []
        client.episodes.append("chat-3", "what is for dinner?", app="bot", user="carol")
        client.episodes.append("chat-3", "pasta with pesto", app="bot", user="carol")
        dinner = client.search("dinner", user="carol", following_episodes=1)
        assert [hit.episode.content for hit in dinner if hit.episode] == [
            "what is for dinner?",
            "pasta with pesto",
        ]

        # Chinese is found by its words inside a sentence written without
        # spaces, with the characters found marked.
        client.episodes.append("chat-4", "我喜欢深色模式", app="bot", user="dave")
        dark = client.search("深色", user="dave")
        assert [hit.snippet for hit in dark] == ["我喜欢**深色**模式"]

        # A call without a wrapper, through the stubs, answers the same.
        block = client.call(
            client.stubs.working_memory.RenderMemoryBlock,
            working_memory_pb2.RenderMemoryBlockRequest(
                session_id="chat-1", app="bot", user="alice", query="deployment drills"
            ),
        )
        assert "- alice runs deployment drills" in block.memory_block

        with pytest.raises(InvalidArgument) as empty:
            client.search("")
        assert empty.value.reason == "INVALID_QUERY"
        with pytest.raises(FailedPrecondition) as semantic:
            client.search("deployment", mode="semantic")
        assert semantic.value.reason == "EMBEDDER_NOT_CONFIGURED"


def test_tokens_tenants_and_roles(database_url: str) -> None:
    def sha256(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    tokens = f"{sha256('acme-admin')} acme admin; {sha256('acme')} acme; {sha256('globex')} globex"
    server = start_server(database_url, env={"ENGRAM_TOKENS": tokens})
    try:
        with Engram(server.address) as anonymous:
            anonymous.memory.configure("prefs")
            with pytest.raises(Unauthenticated) as missing:
                anonymous.memory.get("k")
            assert missing.value.reason == "TOKEN_MISSING"
        with Engram(server.address, token="wrong") as wrong:
            wrong.memory.configure("prefs")
            with pytest.raises(Unauthenticated) as invalid:
                wrong.memory.get("k")
            assert invalid.value.reason == "TOKEN_INVALID"

        with Engram(server.address, token="acme") as acme, Engram(
            server.address, token="globex"
        ) as globex:
            acme.memory.configure("prefs")
            globex.memory.configure("prefs")
            acme.memory.set("theme", "dark")
            assert acme.memory.get("theme") == "dark"
            assert globex.memory.get("theme") is None, "another tenant's key"
            with pytest.raises(PermissionDenied) as denied:
                acme.call(
                    acme.stubs.memory_admin.Purge,
                    memory_admin_pb2.PurgeRequest(
                        scope_type=memory_pb2.SCOPE_TYPE_NAMESPACE,
                        scope="prefs",
                        key="theme",
                    ),
                )
            assert denied.value.reason == "ADMIN_REQUIRED"

        with Engram(server.address, token="acme-admin") as admin:
            admin.call(
                admin.stubs.memory_admin.Purge,
                memory_admin_pb2.PurgeRequest(
                    scope_type=memory_pb2.SCOPE_TYPE_NAMESPACE, scope="prefs", key="theme"
                ),
            )
            admin.memory.configure("prefs")
            assert admin.memory.get("theme") is None, "purged"
    finally:
        server.stop()


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(directory: Path) -> None:
    """A CA, a server certificate for localhost and a client certificate."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-subj", "/CN=test-ca", "-days", "1",
            "-keyout", str(directory / "ca.key"), "-out", str(directory / "ca.crt"))
    for name, extension in (("server", "subjectAltName=DNS:localhost"),
                            ("client", "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-subj", f"/CN={name}", "-keyout", str(directory / f"{name}.key"),
                "-out", str(directory / f"{name}.csr"))
        (directory / f"{name}.ext").write_text(extension + "\n")
        openssl("x509", "-req", "-in", str(directory / f"{name}.csr"), "-days", "1",
                "-CA", str(directory / "ca.crt"), "-CAkey", str(directory / "ca.key"),
                "-CAcreateserial", "-extfile", str(directory / f"{name}.ext"),
                "-out", str(directory / f"{name}.crt"))


def test_tls_and_client_certificates(database_url: str, tmp_path: Path) -> None:
    make_pki(tmp_path)
    server = start_server(database_url, env={
        "ENGRAM_TLS_CERT_FILE": str(tmp_path / "server.crt"),
        "ENGRAM_TLS_KEY_FILE": str(tmp_path / "server.key"),
        "ENGRAM_TLS_CLIENT_CA_FILE": str(tmp_path / "ca.crt"),
    })
    target = "localhost:" + server.address.rsplit(":", 1)[1]
    ca = (tmp_path / "ca.crt").read_bytes()
    try:
        with Engram(target, root_certificates=ca,
                    private_key=(tmp_path / "client.key").read_bytes(),
                    certificate_chain=(tmp_path / "client.crt").read_bytes(),
                    timeout=10) as client:
            client.memory.configure("tls")
            assert client.memory.set("k", "over mTLS").version == 1
            assert client.memory.get("k") == "over mTLS"
        with Engram(target, root_certificates=ca, timeout=10) as anonymous:
            anonymous.memory.configure("tls")
            with pytest.raises(EngramError):
                anonymous.memory.get("k")
        with pytest.raises(ValueError):
            Engram(target, root_certificates=ca, private_key=b"key only")
    finally:
        server.stop()


def test_watch_resumes_from_a_revision(server: Server) -> None:
    with Engram(server.address) as client:
        client.memory.configure("watched")
        client.memory.set("a", 1)
        client.memory.set("b", 2)
        client.memory.delete("a")
        changes = client.memory.watch(from_revision=0)
        seen = [next(changes) for _ in range(3)]
        changes.close()
        assert [(c.key, c.kind) for c in seen] == [
            ("a", memory_pb2.CHANGE_KIND_SET),
            ("b", memory_pb2.CHANGE_KIND_SET),
            ("a", memory_pb2.CHANGE_KIND_DELETE),
        ]
        resumed = client.memory.watch(from_revision=seen[0].revision)
        assert [next(resumed).key for _ in range(2)] == ["b", "a"]
        resumed.close()
