"""The LangGraph checkpointer against a real engram server: LangGraph's own
conformance suite, and a graph interrupted in one process and resumed in
another."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path

from langgraph.checkpoint.conformance import checkpointer_test, validate

from conftest import Server
from engram_client import Engram
from engram_client._keys import escape, unescape
from engram_client.langgraph import EngramSaver
from engram_client.langgraph.saver import _newest_first


def test_conformance(server: Server) -> None:
    @checkpointer_test(name="EngramSaver")
    async def saver() -> AsyncGenerator[EngramSaver, None]:
        # A scope of its own per suite: list(None) sees every thread in it.
        engram = EngramSaver(server.address, scope=f"lg-{uuid.uuid4().hex[:8]}")
        yield engram
        await engram.aclose()

    report = asyncio.run(validate(saver))
    report.print_report()
    assert report.passed_all_base()
    for extended in ("delete_for_runs", "copy_thread", "prune"):
        assert report.results[extended].passed, extended


def test_an_interrupted_graph_resumes_in_another_process(server: Server) -> None:
    scope, thread = f"lg-{uuid.uuid4().hex[:8]}", "chat/42:α"
    script = str(Path(__file__).with_name("langgraph_graph.py"))

    def run(step: str) -> dict[str, object]:
        done = subprocess.run(
            [sys.executable, script, server.address, scope, thread, step],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    started = run("start")
    assert started == {"interrupts": [{"question": "run the migration?"}]}
    resumed = run("resume")
    assert resumed["next_before"] == ["approve"]
    assert resumed["steps"] == ["planned the migration", "approved", "ran the migration (yes)"]

    # The checkpoints are ordinary memory: readable from any client.
    with Engram(server.address) as client:
        client.memory.configure(scope, "namespace")
        keys = [entry.key for entry in client.memory.list(f"t/{escape(thread)}/")]
    assert keys and all(key.startswith("t/chat_2F42_3A_CE_B1/_/") for key in keys)
    assert unescape(escape(thread)) == thread


def test_keys_escape_and_sort_newest_first() -> None:
    for text in ["", "a_b/c", "chat:1|child", "α β"]:
        assert unescape(escape(text)) == text
    assert escape("") == "_" and escape("a_b/c") == "a_5Fb_2Fc"
    older, newer = "1ef4f797-8335-6428-8001-8a1503f9b875", "1ef4f797-8335-6429-8000-000000000000"
    assert _newest_first(newer) < _newest_first(older)


def test_two_processes_writing_one_thread_lose_nothing(server: Server) -> None:
    script = str(Path(__file__).with_name("concurrent_writer.py"))
    writers = [
        subprocess.Popen([sys.executable, script, "langgraph", server.address, "shared", name, "20"])
        for name in ("a", "b")
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    saver = EngramSaver(server.address, scope="race")
    found = list(saver.list({"configurable": {"thread_id": "shared"}}))
    assert len(found) == 40
    for name in ("a", "b"):
        mine = [t for t in found if t.metadata.get("writer") == name]
        assert sorted(t.metadata["step"] for t in mine) == list(range(20))
        assert all([w[2] for w in t.pending_writes or []] == [f"{name} {t.metadata['step']}"] for t in mine)
    saver.close()
