"""Retries through a real outage of a real server's database.

The database refuses writes (SQLite: another process holds its write
lock; Postgres: it fails over to read-only, as after a failover to a
standby) or every connection (Postgres), the server answers UNAVAILABLE
with a RetryInfo of one second, and the test ends the outage once the
client has logged its first retry: the call then lands, once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import Server, start_server
from engram_server import Injected, Outage
from engram_client import Conflict, Engram, Unavailable
from engram_client._requests import idempotent
from engram_client.aio import AsyncEngram
from engram_client.v1 import (
    consolidation_pb2,
    episodes_pb2,
    memory_admin_pb2,
    memory_pb2,
    sessions_pb2,
    working_memory_pb2,
)

#: A write waits this long for SQLite's lock before UNAVAILABLE.
ACQUIRE_MS = "300"


class RetryLog(logging.Handler):
    """The client's retry lines, and an event set by the first."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.first = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self.first.set()


@pytest.fixture
def slow_lock_server(database_url: str) -> Iterator[Server]:
    running = start_server(database_url, env={"ENGRAM_DB_ACQUIRE_TIMEOUT_MS": ACQUIRE_MS})
    yield running
    running.stop()


@pytest.fixture
def retry_log() -> Iterator[RetryLog]:
    handler = RetryLog()
    logger = logging.getLogger("engram_client")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def through_outage(outage: Outage, retry_log: RetryLog, call: Any) -> Any:
    """Runs ``call`` while the outage lasts, ends it at the first retry,
    and returns what the call returned."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = call()
        except Exception as error:  # handed to the test's thread
            result["error"] = error

    caller = threading.Thread(target=run)
    caller.start()
    try:
        assert retry_log.first.wait(30), "the client never retried"
    finally:
        outage.end()
        caller.join(30)
    assert not caller.is_alive()
    if "error" in result:
        raise result["error"]
    return result["value"]


def test_a_write_with_its_request_id_lands_once_through_an_outage(
    slow_lock_server: Server, retry_log: RetryLog
) -> None:
    outage = Outage(slow_lock_server.database_url)
    with Engram(slow_lock_server.address, timeout=30) as client:
        client.memory.configure("retries")
        outage.writes()
        entry = through_outage(
            outage, retry_log, lambda: client.memory.set("plan", "a", request_id="plan-1")
        )
        assert (entry.version, entry.value) == (1, "a")
        assert "retrying Set in 1.00s after try 1 failed" in retry_log.lines[0]
        assert "DATABASE_UNAVAILABLE" in retry_log.lines[0]
        assert [e.version for e in client.memory.history("plan")] == [1]
        # The same request again is answered from the first write.
        assert client.memory.set("plan", "a", request_id="plan-1").version == 1


def test_an_append_with_ids_lands_once_through_an_outage(
    slow_lock_server: Server, retry_log: RetryLog
) -> None:
    outage = Outage(slow_lock_server.database_url)
    with Engram(slow_lock_server.address, timeout=30) as client:
        outage.writes()
        episode = through_outage(
            outage,
            retry_log,
            lambda: client.episodes.append("rt-1", "hello", id="ep-1", app="rt", user="ann"),
        )
        assert (episode.id, episode.seq) == ("ep-1", 1)
        assert [e.id for e in client.episodes.list("rt-1")] == ["ep-1"]


def test_a_session_is_created_once_through_an_outage(
    slow_lock_server: Server, retry_log: RetryLog
) -> None:
    """Creating a session carries a request id of its own, so the client
    retries it like any keyed write, and the retry finds what a try that
    landed made: one session, reported as created."""
    outage = Outage(slow_lock_server.database_url)
    with Engram(slow_lock_server.address, timeout=30) as client:
        outage.writes()
        session = through_outage(outage, retry_log, lambda: client.sessions.create("rt", "cy"))
        assert "retrying CreateSession" in retry_log.lines[0]
        assert [s.id for s in client.sessions.list(user="cy")] == [session.id]
        # What a retry after a lost reply sends: the same request again.
        again = client.sessions.create("rt", "cy", request_id="create-cy")
        assert client.sessions.create("rt", "cy", request_id="create-cy") == again
        found, created = client.sessions.get_or_create("rt", "cy", "", request_id="create-cy")
        assert (found, created) == (again, True)
        found, created = client.sessions.get_or_create("rt", "cy", again.id)
        assert (found, created) == (again, False)
        assert len(list(client.sessions.list(user="cy"))) == 2


def test_working_memory_rides_out_an_outage_and_creates_once(
    slow_lock_server: Server, retry_log: RetryLog
) -> None:
    """Setting a goal leaves the state as one call would, so it is retried
    with no key; a task and a remembered fact carry a request id of their
    own, so a retry adds no second one."""
    outage = Outage(slow_lock_server.database_url)
    with Engram(slow_lock_server.address, timeout=30) as client:
        client.working.set_goal("wm-1", "draft", app="rt", user="ann")
        outage.writes()
        goal = through_outage(outage, retry_log, lambda: client.working.set_goal("wm-1", "ship it"))
        assert goal == "ship it"
        assert "retrying SetGoal" in retry_log.lines[0]
        outage.writes()
        task = through_outage(outage, retry_log, lambda: client.working.create_task("wm-1", "read the logs"))
        outage.writes()
        fact = through_outage(outage, retry_log, lambda: client.working.remember("wm-1", "prefers tea"))
        outage.writes()
        called = through_outage(
            outage, retry_log, lambda: client.working.call_tool("wm-1", "TaskCreate", {"subject": "fix it"})
        )
        snapshot = client.working.snapshot("wm-1")
        assert (snapshot.goal, [t.id for t in snapshot.tasks]) == (
            "ship it",
            [task.id, called.result["taskId"]],
        )
        assert [f.id for f in snapshot.facts] == [fact.id]
        # What a retry after a lost reply sends: the same request id again.
        again = client.working.create_task("wm-1", "read the logs", request_id="task-7")
        assert client.working.create_task("wm-1", "read the logs", request_id="task-7") == again
        # A runtime forwarding the LLM's tool call twice, under its call id.
        call = ("wm-1", "Remember", {"content": "deploys on fridays"})
        first = client.working.call_tool(*call, request_id="call_abc123")
        assert client.working.call_tool(*call, request_id="call_abc123") == first
        snapshot = client.working.snapshot("wm-1")
        assert (len(snapshot.tasks), len(snapshot.facts)) == (3, 2)


def test_a_write_without_its_key_is_not_retried(
    slow_lock_server: Server, retry_log: RetryLog
) -> None:
    outage = Outage(slow_lock_server.database_url)
    with Engram(slow_lock_server.address, timeout=30) as client:
        client.memory.configure("retries")
        outage.writes()
        try:
            with pytest.raises(Unavailable) as refused:
                client.memory.set("plan", "a")
            with pytest.raises(Unavailable):
                client.episodes.append("rt-2", "hello", app="rt", user="ann")
        finally:
            outage.end()
        assert refused.value.reason == "DATABASE_UNAVAILABLE"
        assert refused.value.retry_delay == 1.0
        assert retry_log.lines == []
        # Nothing of the refused write was kept.
        assert client.memory.set("plan", "b").version == 1


@pytest.mark.parametrize(
    ("sqlstate", "reason"), [("40P01", "TRANSACTION_CONFLICT"), ("57014", "DATABASE_TIMEOUT")]
)
def test_a_write_is_retried_after_a_failure_that_wrote_nothing(
    database_url: str, retry_log: RetryLog, sqlstate: str, reason: str
) -> None:
    """A deadlock Postgres broke, or a statement it canceled, rolls the
    call's transaction back, and the server says so by its reason: even a
    write with no idempotency key is then tried again, and lands once."""
    if database_url.startswith("sqlite://"):
        pytest.skip("a Postgres failure")
    running = start_server(database_url)
    injected = Injected(database_url)
    try:
        with Engram(running.address, timeout=30) as client:
            injected.fail("episodes", sqlstate)
            episode = client.episodes.append("conflict-1", "hello", app="rt", user="ann")
            assert episode.seq == 1
            assert "retrying AppendEpisode in" in retry_log.lines[0]
            assert reason in retry_log.lines[0]
            assert [e.content for e in client.episodes.list("conflict-1")] == ["hello"]
        with Engram(running.address, timeout=30, retries=0) as client:
            injected.end()
            injected.fail("episodes", sqlstate)
            error = Conflict if reason == "TRANSACTION_CONFLICT" else Unavailable
            with pytest.raises(error) as refused:
                client.episodes.append("conflict-1", "again", app="rt", user="ann")
            assert refused.value.reason == reason
            assert len(retry_log.lines) == 1
            assert [e.content for e in client.episodes.list("conflict-1")] == ["hello"]
    finally:
        injected.end()
        running.stop()


def test_retries_end_at_their_count_and_at_the_deadline(
    slow_lock_server: Server, retry_log: RetryLog
) -> None:
    outage = Outage(slow_lock_server.database_url)
    outage.writes()
    try:
        with Engram(slow_lock_server.address, timeout=30, retries=1) as client:
            client.memory.configure("retries")
            with pytest.raises(Unavailable):
                client.memory.set("plan", "a", request_id="plan-2")
            assert len(retry_log.lines) == 1
        # A deadline too near for the server's one-second wait: no retry.
        with Engram(slow_lock_server.address, timeout=0.9) as client:
            client.memory.configure("retries")
            with pytest.raises(Unavailable):
                client.memory.set("plan", "a", request_id="plan-3")
            assert len(retry_log.lines) == 1
        with Engram(slow_lock_server.address, timeout=30, retries=0) as client:
            client.memory.configure("retries")
            with pytest.raises(Unavailable):
                client.memory.set("plan", "a", request_id="plan-4")
            assert len(retry_log.lines) == 1
    finally:
        outage.end()
    with pytest.raises(ValueError):
        Engram(slow_lock_server.address, retries=-1)


def test_reads_are_retried_while_the_database_is_out_of_reach(
    slow_lock_server: Server, retry_log: RetryLog
) -> None:
    outage = Outage(slow_lock_server.database_url)
    if outage.sqlite:
        pytest.skip("SQLite's readers cannot be shut out")
    with Engram(slow_lock_server.address, timeout=30) as client:
        client.memory.configure("retries")
        client.memory.set("plan", "a")
        outage.connections()
        assert through_outage(outage, retry_log, lambda: client.memory.get("plan")) == "a"
        assert "retrying Get" in retry_log.lines[0]


def test_the_asyncio_client_retries_the_same_way(
    slow_lock_server: Server, retry_log: RetryLog
) -> None:
    outage = Outage(slow_lock_server.database_url)

    async def run() -> None:
        async with AsyncEngram(slow_lock_server.address, timeout=30) as client:
            client.memory.configure("retries-aio")
            outage.writes()
            write = asyncio.ensure_future(client.memory.set("plan", "a", request_id="aio-1"))
            try:
                assert await asyncio.to_thread(retry_log.first.wait, 30), "no retry"
            finally:
                outage.end()
            entry = await write
            assert entry.version == 1
            outage.writes()
            try:
                with pytest.raises(Unavailable):
                    await client.memory.set("plan", "b")
            finally:
                outage.end()
            assert len(retry_log.lines) == 1
            assert [e.version async for e in client.memory.history("plan")] == [1]

    asyncio.run(run())


@pytest.mark.parametrize(
    ("request_", "retried"),
    [
        (memory_pb2.GetRequest(key="k"), True),
        (memory_pb2.HistoryRequest(key="k"), True),
        (memory_pb2.SetRequest(key="k"), False),
        (memory_pb2.SetRequest(key="k", request_id="r"), True),
        (memory_pb2.DeleteRequest(key="k"), False),
        (memory_pb2.DeleteRequest(key="k", request_id="r"), True),
        (episodes_pb2.AppendEpisodeRequest(episode=episodes_pb2.NewEpisode()), False),
        (episodes_pb2.AppendEpisodeRequest(episode=episodes_pb2.NewEpisode(id="e")), True),
        (episodes_pb2.AppendEpisodesRequest(), False),
        (
            episodes_pb2.AppendEpisodesRequest(
                episodes=[episodes_pb2.NewEpisode(id="e"), episodes_pb2.NewEpisode()]
            ),
            False,
        ),
        (
            episodes_pb2.AppendEpisodesRequest(
                episodes=[episodes_pb2.NewEpisode(id="e"), episodes_pb2.NewEpisode(id="f")]
            ),
            True,
        ),
        (sessions_pb2.GetOrCreateSessionRequest(app="a", user="u"), False),
        (sessions_pb2.GetOrCreateSessionRequest(app="a", user="u", session_id="s"), True),
        (sessions_pb2.GetOrCreateSessionRequest(app="a", user="u", request_id="r"), True),
        (sessions_pb2.CreateSessionRequest(app="a", user="u", session_id="s"), False),
        (sessions_pb2.CreateSessionRequest(app="a", user="u", request_id="r"), True),
        (memory_pb2.RollbackRequest(key="k"), False),
        (working_memory_pb2.SetGoalRequest(goal="g"), True),
        (working_memory_pb2.UpdateTaskRequest(task_id="t1"), True),
        (working_memory_pb2.CacheContentRequest(path="p"), True),
        (working_memory_pb2.CreateTaskRequest(subject="s"), False),
        (working_memory_pb2.RememberRequest(content="c"), False),
        (working_memory_pb2.CreateTaskRequest(subject="s", request_id="r"), True),
        (working_memory_pb2.RememberRequest(content="c", request_id="r"), True),
        (working_memory_pb2.RecordProcedureRequest(content="c", request_id="r"), True),
        (consolidation_pb2.CreateRuleRequest(), False),
        (consolidation_pb2.CreateRuleRequest(request_id="r"), True),
        (working_memory_pb2.CallToolRequest(name="TaskCreate"), False),
        (working_memory_pb2.CallToolRequest(name="Remember", request_id="call_1"), True),
        (working_memory_pb2.CallToolRequest(name="memory.set_goal"), True),
        (working_memory_pb2.CallToolRequest(name="memory.task_update"), True),
        (sessions_pb2.EndSessionRequest(session_id="s"), True),
        (sessions_pb2.DeleteSessionRequest(session_id="s"), False),
        (memory_admin_pb2.SetRetentionRequest(scope="s"), True),
        (memory_admin_pb2.ReindexRequest(apply=True), True),
    ],
)
def test_what_is_retried(request_: Any, retried: bool) -> None:
    assert idempotent(request_) is retried


def test_calls_go_on_while_the_server_ages_connections_out(database_url: str) -> None:
    """The chart has the server end each connection after a while (a
    GOAWAY); the channel reconnects on its own, so no call fails, retries
    off and writes unkeyed. Writes for three seconds over one-second-old
    connections."""
    server = start_server(database_url, env={"ENGRAM_MAX_CONNECTION_AGE_SECS": "1"})
    try:
        with Engram(server.address, timeout=30, retries=0) as client:
            client.memory.configure("aged")
            written = 0
            ends = time.monotonic() + 3
            while time.monotonic() < ends:
                written += 1
                assert client.memory.set("k", written).version == written
            assert client.memory.get("k") == written
    finally:
        server.stop()


def test_the_integrations_writes_ride_out_an_outage(
    slow_lock_server: Server, retry_log: RetryLog
) -> None:
    """The LangGraph store and checkpointer (and ADK's services) key their
    writes, so the client retries them: a put through an outage is stored
    once."""
    from engram_client.langgraph import EngramStore

    outage = Outage(slow_lock_server.database_url)
    store = EngramStore(slow_lock_server.address, root="retries-lg", timeout=30)
    try:
        outage.writes()
        through_outage(outage, retry_log, lambda: store.put(("users", "ann"), "m1", {"text": "tea"}))
        assert "retrying Set" in retry_log.lines[0]
        item = store.get(("users", "ann"), "m1")
        assert item is not None and item.value == {"text": "tea"}
        with Engram(slow_lock_server.address) as client:
            client.memory.configure("retries-lg/users/ann")
            history = [e.version for e in client.memory.history("m1")]
        assert history == [1], "stored once"
    finally:
        store.close()


def test_a_retry_waits_for_a_restarting_server(database_url: str, retry_log: RetryLog) -> None:
    """A read whose first try finds no server (a pod restarting) is retried
    once the server listens again on the same address, within the
    deadline; the first try fails fast, as without retries."""
    first = start_server(database_url)
    address = first.address
    with Engram(address) as client:
        client.memory.configure("restart")
        client.memory.set("k", "kept")
    first.stop()
    second: list[Server] = []
    try:
        with Engram(address, timeout=60) as client:
            client.memory.configure("restart")

            def restart() -> None:
                assert retry_log.first.wait(30), "the client never retried"
                second.append(start_server(database_url, grpc_addr=address))

            restarter = threading.Thread(target=restart)
            restarter.start()
            assert client.memory.get("k") == "kept"
            restarter.join(30)
            assert "retrying Get" in retry_log.lines[0]
            assert len(retry_log.lines) == 1, "one retry, which waited for the server"
    finally:
        for server in second:
            server.stop()


def test_a_server_that_stays_away_is_reported_unavailable(
    database_url: str, retry_log: RetryLog
) -> None:
    """A retry waits for the server only until the deadline, and the call
    then says why it waited (UNAVAILABLE), not only that time ran out."""
    gone = start_server(database_url)
    gone.stop()
    with Engram(gone.address, timeout=2) as client:
        client.memory.configure("gone")
        with pytest.raises(Unavailable):
            client.memory.get("k")
    assert len(retry_log.lines) == 1


#: Versions of about 900 KB each: more than gRPC's flow control lets a
#: server send ahead of a reader that has taken one (it was seen to hold
#: under two), so a server killed then has not sent the rest. (Punctuation: the search index has no words
#: in it, so the writes are quick.)
VERSIONS = 10
PADDING = "." * 900_000


@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_a_broken_history_resumes_after_the_last_version_read(
    database_url: str, retry_log: RetryLog, flavour: str
) -> None:
    """A History stream that breaks (its server killed after the first
    version was read, then back on the same address) is read on from the
    version after the last one yielded: every version once, in order."""
    first = start_server(database_url)
    address = first.address
    second: list[Server] = []

    def restart() -> None:
        first.process.kill()
        first.process.wait(timeout=30)
        second.append(start_server(database_url, grpc_addr=address))

    try:
        with Engram(address) as client:
            client.memory.configure("resume")
            for i in range(1, VERSIONS + 1):
                client.memory.set("big", {"i": i, "padding": PADDING})
            if flavour == "sync":
                versions = client.memory.history("big")
                read = [next(versions)]
                restart()
                read.extend(versions)
            else:

                async def run() -> list[Any]:
                    async with AsyncEngram(address) as reader:
                        reader.memory.configure("resume")
                        versions = reader.memory.history("big")
                        read = [await versions.__anext__()]
                        await asyncio.to_thread(restart)
                        return read + [entry async for entry in versions]

                read = asyncio.run(run())
        assert [entry.version for entry in read] == list(range(1, VERSIONS + 1))
        assert [entry.value["i"] for entry in read] == list(range(1, VERSIONS + 1))
        assert retry_log.lines and "retrying History" in retry_log.lines[0], retry_log.lines
    finally:
        first.stop()
        for server in second:
            server.stop()
