"""The ADK session and memory services against a real engram server, and a
real ADK Runner whose scripted model holds a conversation that a second
process resumes from Engram."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.genai import types

from conftest import Server
from engram_client import Engram
from engram_client.adk import EngramSessionService


def _event(text: str, author: str = "user", delta: dict[str, object] | None = None) -> Event:
    return Event(
        author=author,
        invocation_id="inv",
        content=types.Content(role="user" if author == "user" else "model", parts=[types.Part(text=text)]),
        actions=EventActions(state_delta=dict(delta or {})),
    )


def _texts(events: list[Event]) -> list[str]:
    return [part.text or "" for e in events if e.content and e.content.parts for part in e.content.parts[:1]]


def test_session_service(server: Server) -> None:
    async def run() -> None:
        service = EngramSessionService(server.address)
        app, user = f"app-{uuid.uuid4().hex[:6]}", "alice"
        session = await service.create_session(
            app_name=app, user_id=user, session_id="s1", state={"topic": "trip", "user:lang": "fr", "app:v": 1, "temp:x": 0}
        )
        assert session.state == {"topic": "trip", "user:lang": "fr", "app:v": 1}
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name=app, user_id=user, session_id="s1")

        stamps = []
        for n in range(4):
            event = _event(f"message {n}", delta={"step": n, "temp:t": n, "user:seen": n})
            stamps.append(event.timestamp)
            await service.append_event(session, event)
            assert session.state["step"] == n and session.state["temp:t"] == n
        await service.append_event(session, _event("reply", author="helper"))

        got = await service.get_session(app_name=app, user_id=user, session_id="s1")
        assert got is not None
        assert _texts(got.events) == [
            "message 0", "message 1", "message 2", "message 3", "reply"
        ]
        assert got.events[0].id == session.events[0].id
        assert got.state == {"topic": "trip", "step": 3, "user:lang": "fr", "user:seen": 3, "app:v": 1}

        recent = await service.get_session(
            app_name=app, user_id=user, session_id="s1", config=GetSessionConfig(num_recent_events=2)
        )
        assert recent is not None and _texts(recent.events) == ["message 3", "reply"]
        after = await service.get_session(
            app_name=app, user_id=user, session_id="s1", config=GetSessionConfig(after_timestamp=stamps[2])
        )
        assert after is not None and _texts(after.events) == ["message 2", "message 3", "reply"]
        none = await service.get_session(
            app_name=app, user_id=user, session_id="s1", config=GetSessionConfig(num_recent_events=0)
        )
        assert none is not None and none.events == []

        # Another session of the same user shares user: and app: state.
        other = await service.create_session(app_name=app, user_id=user, session_id="s2")
        assert other.state == {"user:lang": "fr", "user:seen": 3, "app:v": 1}
        assert await service.get_user_state(app_name=app, user_id=user) == {"lang": "fr", "seen": 3}
        listed = await service.list_sessions(app_name=app, user_id=user)
        assert [s.id for s in listed.sessions] == ["s1", "s2"]
        assert [s.state for s in listed.sessions] == [
            {"topic": "trip", "step": 3, "user:lang": "fr", "user:seen": 3, "app:v": 1},
            {"user:lang": "fr", "user:seen": 3, "app:v": 1},
        ]
        assert all(s.events == [] for s in listed.sessions)
        assert await service.get_session(app_name=app, user_id="mallory", session_id="s1") is None

        await service.delete_session(app_name=app, user_id=user, session_id="s1")
        assert await service.get_session(app_name=app, user_id=user, session_id="s1") is None
        assert [s.id for s in (await service.list_sessions(app_name=app)).sessions] == ["s2"]
        await service.close()

    asyncio.run(run())


def test_appends_behave_as_adks_own_services(server: Server) -> None:
    """What ADK's InMemorySessionService does, Engram's does: an event
    delivered again (a retried call) is stored and applied once, and an
    event for a session that is gone is SessionNotFoundError, the session
    left deleted and the session in hand unchanged."""

    async def run(service: BaseSessionService) -> list[object]:
        seen: list[object] = []
        session = await service.create_session(app_name="app", user_id="u", session_id="s1")
        event = _event("one", delta={"x": 1, "temp:t": 1})
        await service.append_event(session, event)
        await service.append_event(session, event)
        stored = await service.get_session(app_name="app", user_id="u", session_id="s1")
        assert stored is not None
        seen += [len(session.events), len(stored.events), stored.events[0].id == event.id]
        seen += [session.state, stored.state]

        gone = await service.create_session(app_name="app", user_id="u", session_id="s2")
        await service.delete_session(app_name="app", user_id="u", session_id="s2")
        with pytest.raises(SessionNotFoundError):
            await service.append_event(gone, _event("late", delta={"y": 2}))
        seen += [len(gone.events), gone.state]
        seen.append(await service.get_session(app_name="app", user_id="u", session_id="s2"))
        listed = await service.list_sessions(app_name="app", user_id="u")
        seen.append([s.id for s in listed.sessions])
        return seen

    async def both() -> None:
        engram = EngramSessionService(server.address)
        ours = await run(engram)
        await engram.close()
        assert ours == await run(InMemorySessionService())
        assert ours[:3] == [1, 1, True]

    asyncio.run(both())


def test_a_runner_conversation_resumes_in_another_process(server: Server) -> None:
    session_id = f"trip-{uuid.uuid4().hex[:8]}"
    script = str(Path(__file__).with_name("adk_agent.py"))

    def run(step: str) -> dict[str, object]:
        done = subprocess.run(
            [sys.executable, script, server.address, session_id, step],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    started = run("start")
    assert started["replies"] == [
        "Noted; I see 1 messages of history.",
        "It is sunny and 21 C in Paris.",
    ]
    resumed = run("resume")
    # user, reply, user, tool call, tool result, reply: everything, from Engram.
    assert resumed["events"] == [
        ["user", False, False],
        ["helper", False, False],
        ["user", False, False],
        ["helper", True, False],
        ["helper", False, True],
        ["helper", False, False],
    ]
    state = resumed["state"]
    assert isinstance(state, dict)
    assert state["last_reply"] == "It is sunny and 21 C in Paris."
    assert state["user:home_city"] == "Paris" and state["app:weather_calls"] == 1
    assert "temp:scratch" not in state
    # The resumed run's model saw the whole conversation Engram kept.
    assert resumed["replies"] == ["Noted; I see 7 messages of history."]
    memory = resumed["memory"]
    assert isinstance(memory, list) and any("sunny" in text for text in memory)

    # The conversation is an ordinary Engram session: BuildContext reads it.
    with Engram(server.address) as client:
        context = client.episodes.context(session_id)
    assert context.startswith("User: hello\nAssistant: Noted;")


def test_two_processes_appending_to_one_session_lose_nothing(server: Server) -> None:
    async def create() -> None:
        service = EngramSessionService(server.address)
        await service.create_session(app_name="race", user_id="u", session_id="shared")
        await service.close()

    asyncio.run(create())
    script = str(Path(__file__).with_name("concurrent_writer.py"))
    writers = [
        subprocess.Popen([sys.executable, script, "adk", server.address, "shared", name, "25"])
        for name in ("a", "b")
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]

    async def read() -> None:
        service = EngramSessionService(server.address)
        session = await service.get_session(app_name="race", user_id="u", session_id="shared")
        assert session is not None
        texts = _texts(session.events)
        for name in ("a", "b"):
            mine = [t for t in texts if t.startswith(f"{name} ")]
            assert mine == [f"{name} {n}" for n in range(25)], "every event once, in its writer's order"
        assert session.state == {"last_a": 24, "last_b": 24}
        await service.close()

    asyncio.run(read())
