"""Google ADK on Engram: ``EngramSessionService`` and ``EngramMemoryService``.

    from engram_client.adk import EngramMemoryService, EngramSessionService

    runner = Runner(
        agent=agent,
        app_name="support",
        session_service=EngramSessionService("engram:50051", token),
        memory_service=EngramMemoryService("engram:50051", token),
    )

Install with ``pip install engram-client[adk]``.

An ADK session is an Engram session (app, user and id the same) and each of
its events an episode: the event's id is the episode's (so an append is
idempotent), its author decides the type (``user_message`` for the user,
``agent_response`` for an agent's text, ``tool_call``/``tool_result`` for
function calls and responses, ``adk_event`` otherwise), the content is the
event's text when it has any, and the whole event travels in the episode's
metadata (``adk_event``) so it comes back exactly. Engram's tail,
``BuildContext``, search and consolidation all see the conversation.

State follows ADK's prefixes. ``app:`` keys are shared by the app's
sessions, ``user:`` keys by a user's sessions in the app, ``temp:`` keys
are never stored, and the rest belong to the session. They are memory
entries in the namespace scope ``adk/<app>`` (keys ``app/<key>``,
``user/<user>/<key>``, ``session/<session>/<key>``, escaped as the LangGraph
integration escapes identifiers), one entry per state key.

Deleting a session needs a token with the admin role (Engram's
``DeleteSession``).

One difference from ADK's own services remains: an Engram session id is
unique in its tenant, where ADK's are unique per app and user. Creating a
session whose id another user (or app) already has raises
``AlreadyExistsError``, so give sessions ids of their own (ADK's default,
a UUID, is).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from google.genai import types

from . import _requests
from ._results import Episode, from_value
from ._results import Session as EngramSession
from ._errors import AlreadyExists, FailedPrecondition, NotFound
from ._connect import Clients, Target
from ._keys import escape, unescape
from .v1 import episodes_pb2, memory_pb2, sessions_pb2


def _state_scope(app_name: str) -> _requests.Scope:
    return _requests.Scope(f"adk/{escape(app_name)}", memory_pb2.SCOPE_TYPE_NAMESPACE)


def _state_key(app_name: str, user_id: str, session_id: str, key: str) -> str | None:
    """Where a state key lives; None for ``temp:`` keys (never stored)."""
    if key.startswith(State.TEMP_PREFIX):
        return None
    if key.startswith(State.APP_PREFIX):
        return f"app/{escape(key[len(State.APP_PREFIX) :])}"
    if key.startswith(State.USER_PREFIX):
        return f"user/{escape(user_id)}/{escape(key[len(State.USER_PREFIX) :])}"
    return f"session/{escape(session_id)}/{escape(key)}"


def _event_type(event: Event) -> str:
    parts = event.content.parts if event.content and event.content.parts else []
    if any(part.function_call for part in parts):
        return "tool_call"
    if any(part.function_response for part in parts):
        return "tool_result"
    if event.author == "user":
        return "user_message"
    if any(part.text for part in parts):
        return "agent_response"
    return "adk_event"


def _event_text(event: Event) -> str:
    parts = event.content.parts if event.content and event.content.parts else []
    return "".join(part.text for part in parts if part.text and not part.thought)


def _event(episode: Episode) -> Event:
    return Event.model_validate(episode.metadata["adk_event"])


def _time(moment: datetime) -> float:
    return moment.timestamp()


class EngramSessionService(BaseSessionService):
    """ADK sessions, events and state in Engram (see the module doc).
    Built from ``target``, ``token`` and keyword options as the clients
    are, or from a client."""

    def __init__(self, target: Target, token: str | None = None, **client_options: Any) -> None:
        self._connection = Clients(target, token, client_options)

    async def close(self) -> None:
        await self._connection.aclose()

    # --- state ------------------------------------------------------------

    async def _write_state(
        self, app_name: str, user_id: str, session_id: str, delta: Mapping[str, Any]
    ) -> None:
        client = self._connection.aio()
        scope = _state_scope(app_name)
        for key, value in delta.items():
            where = _state_key(app_name, user_id, session_id, key)
            if where is not None:
                # Keyed, so the client retries it through a failover.
                request = scope.set(where, value, None, uuid.uuid4().hex)
                await client.call(client.stubs.memory.Set, request)

    async def _entries(self, app_name: str, prefix: str) -> list[tuple[str, Any]]:
        """Each state entry under ``prefix``: the rest of its key, its value."""
        client = self._connection.aio()
        scope = _state_scope(app_name)
        entries: list[tuple[str, Any]] = []
        token = ""
        while True:
            page = await client.call(client.stubs.memory.List, scope.list(prefix, token))
            entries += [(e.key[len(prefix) :], from_value(e.value)) for e in page.entries]
            if not page.next_page_token:
                return entries
            token = page.next_page_token

    async def _read_state(self, app_name: str, prefix: str, label: str) -> dict[str, Any]:
        return {label + unescape(key): value for key, value in await self._entries(app_name, prefix)}

    async def _state(self, app_name: str, user_id: str, session_id: str) -> dict[str, Any]:
        return {
            **await self._read_state(app_name, f"session/{escape(session_id)}/", ""),
            **await self._read_state(app_name, "app/", State.APP_PREFIX),
            **await self._read_state(app_name, f"user/{escape(user_id)}/", State.USER_PREFIX),
        }

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return await self._read_state(app_name, f"user/{escape(user_id)}/", "")

    # --- sessions ---------------------------------------------------------

    def _session(self, session: EngramSession, state: dict[str, Any], events: list[Event]) -> Session:
        return Session(
            id=session.id,
            app_name=session.app,
            user_id=session.user,
            state=state,
            events=events,
            last_update_time=_time(session.update_time),
        )

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        client = self._connection.aio()
        session_id = (session_id or "").strip() or str(uuid.uuid4())
        try:
            created = await client.sessions.create(app_name, user_id, session_id)
        except AlreadyExists:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.") from None
        await self._write_state(app_name, user_id, session_id, state or {})
        return self._session(created, await self._state(app_name, user_id, session_id), [])

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        client = self._connection.aio()
        try:
            response = await client.call(
                client.stubs.sessions.GetSession,
                sessions_pb2.GetSessionRequest(session_id=session_id, app=app_name, user=user_id),
            )
        except (NotFound, FailedPrecondition):
            return None
        session = EngramSession.from_proto(response.session)
        events = await self._events(session, config)
        return self._session(session, await self._state(app_name, user_id, session_id), events)

    async def _events(self, session: EngramSession, config: GetSessionConfig | None) -> list[Event]:
        client = self._connection.aio()
        if config and config.num_recent_events == 0:
            return []
        if (
            config
            and config.num_recent_events is not None
            and config.num_recent_events <= 1000
            and config.after_timestamp is None
        ):
            # Only the newest: one Recent call instead of the whole log.
            newest = await client.episodes.recent(
                session.user, session_id=session.id, limit=config.num_recent_events
            )
            return [_event(e) for e in reversed(newest) if "adk_event" in e.metadata]
        events = [_event(e) async for e in client.episodes.list(session.id) if "adk_event" in e.metadata]
        if config and config.num_recent_events is not None:
            events = events[-config.num_recent_events :]
        if config and config.after_timestamp is not None:
            events = [e for e in events if e.timestamp >= config.after_timestamp]
        return events

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        client = self._connection.aio()
        found = [s async for s in client.sessions.list(app=app_name, user=user_id or "")]
        found.sort(key=lambda s: s.update_time)
        # Three reads whatever the number of sessions: the app's state, each
        # user's, and every session's at once.
        app_state = await self._read_state(app_name, "app/", State.APP_PREFIX)
        users = {
            user: await self._read_state(app_name, f"user/{escape(user)}/", State.USER_PREFIX)
            for user in {s.user for s in found}
        }
        own: dict[str, dict[str, Any]] = {}
        for key, value in await self._entries(app_name, "session/"):
            session, name = key.split("/", 1)
            own.setdefault(unescape(session), {})[unescape(name)] = value
        sessions = [
            self._session(s, {**own.get(s.id, {}), **app_state, **users[s.user]}, []) for s in found
        ]
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        client = self._connection.aio()
        try:
            await client.call(
                client.stubs.sessions.DeleteSession,
                sessions_pb2.DeleteSessionRequest(session_id=session_id, app=app_name, user=user_id),
            )
        except NotFound:
            return
        scope = _state_scope(app_name)
        prefix = f"session/{escape(session_id)}/"
        for key, _ in await self._entries(app_name, prefix):
            request = scope.delete(prefix + key, None, uuid.uuid4().hex)
            await client.call(client.stubs.memory.Delete, request)

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        # As ADK's own services: an event delivered again (a retried call)
        # is stored and applied to the session in hand once, and an event
        # for a session that is gone is SessionNotFoundError, before the
        # session in hand changes (the append never creates a session, so
        # a deleted one stays deleted).
        delivered = any(e == event for e in session.events if e.id == event.id)
        # What is stored: a copy without temp: state (ADK's own trimming).
        sent = self._trim_temp_delta_state(event.model_copy(deep=True))
        client = self._connection.aio()
        content = _event_text(sent) or sent.model_dump(mode="json", exclude_none=True)
        request = _append(
            session.id, session.app_name, session.user_id, sent, content, require_session=True
        )
        try:
            await client.call(client.stubs.episodes.AppendEpisode, request)
        except NotFound:
            raise SessionNotFoundError(f"Session {session.id} not found.") from None
        if sent.actions and sent.actions.state_delta:
            await self._write_state(
                session.app_name, session.user_id, session.id, sent.actions.state_delta
            )
        if not delivered:
            # Applies temp: state to the session in hand and drops it from
            # the event, then adds the rest of the delta and the event.
            event = await super().append_event(session=session, event=event)
        session.last_update_time = event.timestamp
        return event


def _append(
    session_id: str,
    app_name: str,
    user_id: str,
    event: Event,
    content: Any,
    *,
    require_session: bool,
) -> episodes_pb2.AppendEpisodeRequest:
    """An event as an episode: its id, its type by author and parts, the
    whole event in the metadata, its time. With ``require_session`` a
    missing session is NotFound instead of created."""
    request = episodes_pb2.AppendEpisodeRequest(
        session_id=session_id,
        app=app_name,
        user=user_id,
        require_session=require_session,
        episode=_requests.new_episode(
            content,
            type=_event_type(event),
            id=event.id,
            agent=event.author,
            metadata={"adk_event": event.model_dump(mode="json", exclude_none=True)},
        ),
    )
    request.episode.timestamp.FromDatetime(datetime.fromtimestamp(event.timestamp, tz=timezone.utc))
    return request


class EngramMemoryService(BaseMemoryService):
    """ADK's memory on Engram's search: a session's events are episodes
    (already, when the session service is :class:`EngramSessionService`),
    and ``search_memory`` finds a user's episodes and facts by what they
    say."""

    def __init__(self, target: Target, token: str | None = None, **client_options: Any) -> None:
        self._connection = Clients(target, token, client_options)

    async def close(self) -> None:
        await self._connection.aclose()

    async def add_session_to_memory(self, session: Session) -> None:
        await self.add_events_to_memory(
            app_name=session.app_name,
            user_id=session.user_id,
            events=session.events,
            session_id=session.id,
        )

    async def add_events_to_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        events: Sequence[Event],
        session_id: str | None = None,
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        # Appends are idempotent by event id: events already stored (by
        # EngramSessionService) are replays that write nothing.
        client = self._connection.aio()
        session_id = session_id or f"memory-{escape(user_id)}"
        for event in events:
            if event.partial or not _event_text(event):
                continue
            # The memory session is made by its first event.
            request = _append(
                session_id, app_name, user_id, event, _event_text(event), require_session=False
            )
            try:
                await client.call(client.stubs.episodes.AppendEpisode, request)
            except AlreadyExists:
                pass  # the same id holds the event as first stored

    async def search_memory(self, *, app_name: str, user_id: str, query: str) -> SearchMemoryResponse:
        client = self._connection.aio()
        hits = await client.search(query, sources=["episodes", "facts"], app=app_name, user=user_id, limit=20)
        memories: list[MemoryEntry] = []
        for hit in hits:
            if hit.episode is not None:
                text = hit.episode.content if isinstance(hit.episode.content, str) else str(hit.episode.content)
                memories.append(
                    MemoryEntry(
                        id=hit.episode.id,
                        author=hit.episode.agent or None,
                        content=types.Content(
                            role="user" if hit.episode.type == "user_message" else "model",
                            parts=[types.Part(text=text)],
                        ),
                        timestamp=hit.episode.timestamp.isoformat() if hit.episode.timestamp else None,
                    )
                )
            elif hit.fact is not None:
                memories.append(
                    MemoryEntry(
                        id=hit.fact.id,
                        content=types.Content(role="model", parts=[types.Part(text=_fact_text(hit.fact))]),
                    )
                )
        return SearchMemoryResponse(memories=memories)


def _fact_text(fact: Any) -> str:
    if fact.subject or fact.predicate or fact.object:
        return " ".join(p for p in (fact.subject, fact.predicate, fact.object) if p)
    return fact.content if isinstance(fact.content, str) else str(fact.content)


__all__ = ["EngramMemoryService", "EngramSessionService"]
