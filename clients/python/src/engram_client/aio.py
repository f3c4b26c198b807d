"""The asyncio client: the surface of :class:`engram_client.Engram`, on
``grpc.aio``, for agent runners that are asynchronous.

    from engram_client.aio import AsyncEngram

    async with AsyncEngram("localhost:50051", token) as client:
        client.memory.configure("customer_profiles", "namespace")
        await client.memory.set("user_42/theme", {"mode": "dark"})
        async for entry in client.memory.list("user_42/"):
            ...
        async for episode in client.episodes.tail(app="support-bot", cursor=0):
            ...

Requests are built by the same code as the blocking client's
(``_requests``); errors are the same :class:`EngramError` subclasses with
the server's ``reason``; ``tail`` and ``watch`` are async iterators that
reconnect from the last position they yielded.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from . import _requests
from ._results import (
    Applied,
    AuditRecord,
    Cached,
    Compacted,
    Entry,
    Episode,
    Fork,
    Forgotten,
    Fact,
    FactVersion,
    Hit,
    Imported,
    MemoryBlock,
    Purged,
    Reindexed,
    Retention,
    Rule,
    RuleRun,
    ScopeSummary,
    Session,
    Snapshot,
    Task,
    Tool,
    ToolResult,
    WorkingSnapshot,
)
from ._errors import EngramError, NotFound, _absent, _no_retention, from_rpc_error
from ._requests import (
    FactKind,
    Page,
    ScopeType,
    SearchMode,
    SearchSource,
    TaskStatus,
    new_episode,
)
from .v1 import (
    consolidation_pb2,
    consolidation_pb2_grpc,
    data_pb2_grpc,
    episodes_pb2,
    episodes_pb2_grpc,
    memory_admin_pb2,
    memory_admin_pb2_grpc,
    memory_pb2,
    memory_pb2_grpc,
    search_pb2_grpc,
    sessions_pb2,
    sessions_pb2_grpc,
    working_memory_pb2,
    working_memory_pb2_grpc,
)

Resp = TypeVar("Resp")


class AsyncStubs:
    """The generated asyncio stubs of every service, for what the wrapper
    does not cover; pass their methods to :meth:`AsyncEngram.call`."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.memory = memory_pb2_grpc.MemoryServiceStub(channel)
        self.memory_admin = memory_admin_pb2_grpc.MemoryAdminServiceStub(channel)
        self.sessions = sessions_pb2_grpc.SessionServiceStub(channel)
        self.episodes = episodes_pb2_grpc.EpisodeServiceStub(channel)
        self.consolidation = consolidation_pb2_grpc.ConsolidationServiceStub(channel)
        self.working_memory = working_memory_pb2_grpc.WorkingMemoryServiceStub(channel)
        self.search = search_pb2_grpc.SearchServiceStub(channel)
        self.data = data_pb2_grpc.DataServiceStub(channel)


class AsyncEngram(_requests.CallerContext):
    """An asyncio connection to an Engram server; the arguments are those of
    :class:`engram_client.Engram`. Use it as ``async with``, or call
    :meth:`close`."""

    def _connect(self, target: str, tls: grpc.ChannelCredentials | None) -> None:
        self._channel = (
            grpc.aio.secure_channel(target, tls, options=_requests.CHANNEL_OPTIONS)
            if tls is not None
            else grpc.aio.insecure_channel(target, options=_requests.CHANNEL_OPTIONS)
        )
        self.stubs = AsyncStubs(self._channel)
        self.memory = AsyncMemory(self)
        self.sessions = AsyncSessions(self)
        self.episodes = AsyncEpisodes(self)
        self.facts = AsyncFacts(self)
        self.rules = AsyncRules(self)
        self.working = AsyncWorking(self)

    async def call(self, method: Callable[..., Awaitable[Resp]], request: Message) -> Resp:
        """Calls a unary RPC, raising EngramError on failure, after the
        retries :class:`engram_client.Engram` describes."""
        attempts = _requests.Attempts(request, self.retries, self.timeout)
        while True:
            try:
                return await method(
                    request,
                    metadata=self.metadata(),
                    timeout=attempts.timeout(),
                    wait_for_ready=self.wait_for_ready or attempts.retrying,
                )
            except grpc.RpcError as error:
                failure = from_rpc_error(error)
            delay = attempts.wait(failure)
            if delay is None:
                raise attempts.final(failure)
            await asyncio.sleep(delay)

    async def pages(
        self, method: Callable[..., Awaitable[Page]], request: Callable[[str], Message]
    ) -> AsyncIterator[Page]:
        """Every page of a paged RPC (see :meth:`engram_client.Engram.pages`)."""
        token = ""
        while True:
            page = await self.call(method, request(token))
            yield page
            token = page.next_page_token
            if not token:
                return

    async def stream(
        self,
        method: Callable[..., AsyncIterable[Resp]],
        request: Message,
        *,
        wait_for_ready: bool | None = None,
    ) -> AsyncIterator[Resp]:
        """Calls a server-streaming RPC, raising EngramError on failure."""
        ready = self.wait_for_ready if wait_for_ready is None else wait_for_ready
        try:
            async for response in method(request, metadata=self.metadata(), wait_for_ready=ready):
                yield response
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    async def resumed(
        self,
        method: Callable[..., AsyncIterable[Resp]],
        request: Callable[[int], Message],
        start: int,
        after: Callable[[Resp], int],
    ) -> AsyncIterator[Resp]:
        """A server-streaming read resumed after a break (see
        :meth:`engram_client.Engram.resumed`)."""
        position = start
        attempts = _requests.Attempts(request(position), self.retries, None)
        while True:
            ready = self.wait_for_ready or attempts.retrying
            try:
                async for response in self.stream(method, request(position), wait_for_ready=ready):
                    position = after(response)
                    attempts.progressed()
                    yield response
                return
            except EngramError as failure:
                delay = attempts.wait(failure)
                if delay is None:
                    raise attempts.final(failure) from None
            await asyncio.sleep(delay)

    async def forget_user(
        self,
        app: str,
        user: str,
        *,
        execution_ids: Iterable[str] = (),
        dry_run: bool = False,
    ) -> Forgotten:
        """Deletes everything about one user of one app (see
        :meth:`engram_client.Engram.forget_user`)."""
        request = _requests.forget_user(app, user, execution_ids, dry_run)
        return Forgotten.from_proto(await self.call(self.stubs.data.ForgetUser, request))

    async def export(
        self,
        *,
        scope_type: ScopeType | None = None,
        scope: str = "",
        session_id: str = "",
        app: str = "",
        user: str = "",
    ) -> AsyncIterator[str]:
        """The tenant, or a part of it, as JSON Lines (see
        :meth:`engram_client.Engram.export`)."""
        request = _requests.export(scope_type, scope, session_id, app, user)
        async for chunk in self.stream(self.stubs.data.Export, request):
            for line in chunk.lines:
                yield line

    async def import_lines(self, lines: Iterable[str]) -> Imported:
        """Restores an export, all or nothing (see
        :meth:`engram_client.Engram.import_lines`)."""
        try:
            response = await self.stubs.data.Import(
                _requests.import_batches(lines),
                metadata=tuple(self.metadata()),
                timeout=self.timeout,
                wait_for_ready=self.wait_for_ready,
            )
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return Imported.from_proto(response)

    async def search(
        self,
        query: str,
        *,
        sources: Iterable[SearchSource] = (),
        mode: SearchMode | None = None,
        limit: int = 10,
        scope_type: ScopeType | None = None,
        scope: str = "",
        key_prefix: str = "",
        scope_prefix: str = "",
        app: str = "",
        user: str = "",
        session_id: str = "",
        agent: str = "",
        types: Iterable[str] = (),
        kind: FactKind | None = None,
        start_time: datetime | None = None,
        end_time: datetime | None = None,
        following_episodes: int = 0,
    ) -> builtins.list[Hit]:
        """Memory entries, facts and episodes matching ``query``, best first
        (see :meth:`engram_client.Engram.search`)."""
        request = _requests.search(
            query,
            sources=sources,
            mode=mode,
            limit=limit,
            scope_type=scope_type,
            scope=scope,
            key_prefix=key_prefix,
            scope_prefix=scope_prefix,
            app=app,
            user=user,
            session_id=session_id,
            agent=agent,
            types=types,
            kind=kind,
            start_time=start_time,
            end_time=end_time,
            following_episodes=following_episodes,
        )
        response = await self.call(self.stubs.search.Search, request)
        return [Hit.from_proto(hit) for hit in response.hits]

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncEngram:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


class AsyncMemory:
    """Scoped, versioned key-value memory (see :class:`engram_client._client.Memory`)."""

    def __init__(self, client: AsyncEngram) -> None:
        self._client = client
        self._scope = _requests.Scope()

    def configure(self, scope: str, scope_type: ScopeType = "namespace") -> None:
        """Chooses the scope every later call works in."""
        self._scope.configure(scope, scope_type)

    async def set(
        self,
        key: str,
        value: Any,
        *,
        expected_version: int | None = None,
        request_id: str | None = None,
    ) -> Entry:
        """Writes a new version; with ``expected_version`` a compare-and-set
        that raises :class:`Conflict` when it loses."""
        request = self._scope.set(key, value, expected_version, request_id)
        response = await self._client.call(self._client.stubs.memory.Set, request)
        return Entry.from_proto(response.entry)

    async def entry(
        self, key: str, *, version: int | None = None, as_of: _requests.Point | None = None
    ) -> Entry | None:
        """The newest (or a given, or the ``as_of``) version of a key; None
        when there is none or it was deleted (see :meth:`Memory.entry`)."""
        try:
            response = await self._client.call(
                self._client.stubs.memory.Get, self._scope.get(key, version, as_of)
            )
        except NotFound as error:
            if _absent(error):
                return None
            raise
        return Entry.from_proto(response.entry)

    async def get(
        self, key: str, *, version: int | None = None, as_of: _requests.Point | None = None
    ) -> Any:
        """The value of a key; None when it has none."""
        entry = await self.entry(key, version=version, as_of=as_of)
        return None if entry is None else entry.value

    async def snapshot(self, as_of: _requests.Point, prefix: str = "") -> Snapshot:
        """The scope as it was at a revision or a time (see
        :meth:`Memory.snapshot`)."""
        entries: builtins.list[Entry] = []
        purged: builtins.list[str] = []
        request = functools.partial(self._scope.list, prefix, point=as_of)
        async for page in self._client.pages(self._client.stubs.memory.List, request):
            entries.extend(Entry.from_proto(e) for e in page.entries)
            purged.extend(page.purged_keys)
        return Snapshot(entries, purged)

    async def fork(
        self,
        target: str,
        *,
        target_type: ScopeType | None = None,
        as_of: _requests.Point | None = None,
    ) -> Fork:
        """Copies this scope's live entries into a new scope (see
        :meth:`Memory.fork`)."""
        request = self._scope.fork(target, target_type, as_of)
        return Fork.from_proto(await self._client.call(self._client.stubs.memory.ForkScope, request))

    async def list(self, prefix: str = "") -> AsyncIterator[Entry]:
        """Every live entry under a prefix, in key order (all pages)."""
        request = functools.partial(self._scope.list, prefix)
        async for page in self._client.pages(self._client.stubs.memory.List, request):
            for entry in page.entries:
                yield Entry.from_proto(entry)

    async def history(self, key: str, *, from_version: int = 0) -> AsyncIterator[Entry]:
        """Every version of a key, oldest first, tombstones included; a
        broken stream resumes (see :meth:`Memory.history`)."""
        request = functools.partial(self._scope.history, key)
        stream = self._client.resumed(
            self._client.stubs.memory.History,
            request,
            from_version,
            lambda response: response.entry.version + 1,
        )
        async for response in stream:
            yield Entry.from_proto(response.entry)

    async def delete(
        self, key: str, *, expected_version: int | None = None, request_id: str | None = None
    ) -> Entry:
        """Writes a tombstone; returns it (see :meth:`Memory.delete`)."""
        request = self._scope.delete(key, expected_version, request_id)
        response = await self._client.call(self._client.stubs.memory.Delete, request)
        return Entry.from_proto(response.entry)

    async def rollback(self, key: str, to_version: int) -> Entry:
        """Writes a new version holding ``to_version``'s value (see
        :meth:`Memory.rollback`)."""
        request = self._scope.rollback(key, to_version)
        response = await self._client.call(self._client.stubs.memory.Rollback, request)
        return Entry.from_proto(response.entry)

    async def watch(
        self,
        prefix: str = "",
        *,
        from_revision: int | None = None,
        reconnect: bool = True,
        max_reconnects: int | None = None,
    ) -> AsyncGenerator[memory_pb2.WatchResponse, None]:
        """Follows the scope's changes in commit order, reconnecting from
        the last revision it yielded (see :meth:`Memory.watch`)."""
        resume = _requests.Resume(from_revision, reconnect, max_reconnects, "resume_revision")
        while True:
            request = self._scope.watch(prefix, resume.position)
            try:
                stream = self._client.stream(
                    self._client.stubs.memory.Watch, request, wait_for_ready=resume.failures > 0
                )
                async for change in stream:
                    resume.delivered(change.revision)
                    yield change
                return
            except EngramError as error:
                await asyncio.sleep(resume.broke(error))

    async def scopes(
        self,
        scope_type: ScopeType | None = None,
        *,
        flow_id: str = "",
        flow_name: str = "",
        as_of: _requests.Point | None = None,
    ) -> AsyncIterator[ScopeSummary]:
        """Every scope of the tenant with its live key count (see
        :meth:`Memory.scopes`)."""
        request = functools.partial(_requests.list_scopes, scope_type, flow_id, flow_name, as_of)
        async for page in self._client.pages(self._client.stubs.memory.ListScopes, request):
            for summary in page.scopes:
                yield ScopeSummary.from_proto(summary)

    async def purge(self, key: str, *, keep: int | None = None, dry_run: bool = False) -> Purged:
        """Hard-deletes all but the newest ``keep`` versions of a key (see
        :meth:`Memory.purge`)."""
        request = self._scope.purge(key, keep, dry_run)
        return Purged.from_proto(
            await self._client.call(self._client.stubs.memory_admin.Purge, request)
        )

    async def purge_scope(
        self, *, keep: int | None = None, include_deleted: bool = False, dry_run: bool = False
    ) -> Purged:
        """Purges every key of the scope (see :meth:`Memory.purge_scope`)."""
        request = self._scope.purge_scope(keep, include_deleted, dry_run)
        return Purged.from_proto(
            await self._client.call(self._client.stubs.memory_admin.PurgeScope, request)
        )

    async def compact(
        self,
        *keys: str,
        target_key: str = "",
        history: bool = False,
        instruction: str = "",
        model: str = "",
        max_tokens: int = 0,
    ) -> Compacted:
        """Summarises keys into a new version of ``target_key`` (see
        :meth:`Memory.compact`)."""
        request = self._scope.compact(keys, target_key, history, instruction, model, max_tokens)
        return Compacted.from_proto(
            await self._client.call(self._client.stubs.memory_admin.Compact, request)
        )

    async def compaction_log(self) -> AsyncIterator[AuditRecord]:
        """The scope's maintenance audit trail, newest first (all pages)."""
        method = self._client.stubs.memory_admin.GetCompactionLog
        async for page in self._client.pages(method, self._scope.compaction_log):
            for record in page.records:
                yield AuditRecord.from_proto(record)

    async def set_retention(
        self,
        *,
        keep_versions: int | None = None,
        max_age: timedelta | None = None,
        tombstone_grace: timedelta | None = None,
    ) -> Retention | None:
        """Replaces the scope's retention policy (see
        :meth:`Memory.set_retention`)."""
        policy = _requests.retention_policy(keep_versions, max_age, tombstone_grace)
        request = self._scope.set_retention(policy, dry_run=False)
        response = await self._client.call(self._client.stubs.memory_admin.SetRetention, request)
        return Retention.from_proto(response.retention) if response.HasField("retention") else None

    async def preview_retention(
        self,
        *,
        keep_versions: int | None = None,
        max_age: timedelta | None = None,
        tombstone_grace: timedelta | None = None,
    ) -> Purged:
        """What a policy would delete if it ran now; stores nothing."""
        policy = _requests.retention_policy(keep_versions, max_age, tombstone_grace)
        request = self._scope.set_retention(policy, dry_run=True)
        return Purged.previewed(
            await self._client.call(self._client.stubs.memory_admin.SetRetention, request)
        )

    async def retention(self) -> Retention | None:
        """The scope's retention policy and its last run; None without one."""
        try:
            response = await self._client.call(
                self._client.stubs.memory_admin.GetRetention, self._scope.get_retention()
            )
        except NotFound as error:
            if _no_retention(error):
                return None
            raise
        return Retention.from_proto(response.retention)

    async def apply_retention(self, *, dry_run: bool = False) -> Purged:
        """Runs the scope's retention policy now."""
        request = self._scope.apply_retention(dry_run)
        return Purged.from_proto(
            await self._client.call(self._client.stubs.memory_admin.ApplyRetention, request)
        )

    async def reindex(self, *, apply: bool = False) -> Reindexed:
        """Backfills the flow tags of execution-scoped versions (see
        :meth:`Memory.reindex`)."""
        request = memory_admin_pb2.ReindexRequest(apply=apply)
        return Reindexed.from_proto(
            await self._client.call(self._client.stubs.memory_admin.Reindex, request)
        )


class AsyncSessions:
    """Sessions: one conversation of a user with an app."""

    def __init__(self, client: AsyncEngram) -> None:
        self._client = client

    async def create(
        self,
        app: str,
        user: str,
        session_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        *,
        request_id: str | None = None,
    ) -> Session:
        """Creates a session (``session_id``, or a server-made UUIDv7). A
        taken id raises AlreadyExists. ``request_id`` (default: a new random
        one) makes a retry after a lost reply answer with the session the
        first try made; pass your own to repeat the call safely later."""
        request = _requests.create_session(app, user, session_id, metadata, request_id)
        response = await self._client.call(self._client.stubs.sessions.CreateSession, request)
        return Session.from_proto(response.session)

    async def get_or_create(
        self, app: str, user: str, session_id: str, *, request_id: str | None = None
    ) -> tuple[Session, bool]:
        """The session ``session_id`` of ``app`` and ``user``, created when
        missing, and whether this call created it (also when a retry of it
        finds what its first try created: see ``create``)."""
        response = await self._client.call(
            self._client.stubs.sessions.GetOrCreateSession,
            _requests.get_or_create_session(app, user, session_id, request_id),
        )
        return Session.from_proto(response.session), response.created

    async def get(self, session_id: str) -> Session | None:
        try:
            response = await self._client.call(
                self._client.stubs.sessions.GetSession,
                sessions_pb2.GetSessionRequest(session_id=session_id),
            )
        except NotFound:
            return None
        return Session.from_proto(response.session)

    async def list(self, *, app: str = "", user: str = "") -> AsyncIterator[Session]:
        request = functools.partial(_requests.list_sessions, app, user)
        async for page in self._client.pages(self._client.stubs.sessions.ListSessions, request):
            for session in page.sessions:
                yield Session.from_proto(session)

    async def end(self, session_id: str, *, delete_episodes: bool = False) -> Session:
        response = await self._client.call(
            self._client.stubs.sessions.EndSession,
            sessions_pb2.EndSessionRequest(session_id=session_id, delete_episodes=delete_episodes),
        )
        return Session.from_proto(response.session)

    async def delete(self, session_id: str) -> int:
        """Deletes a session with its episodes; returns how many episodes went."""
        response = await self._client.call(
            self._client.stubs.sessions.DeleteSession,
            sessions_pb2.DeleteSessionRequest(session_id=session_id),
        )
        return response.episodes_deleted

    async def stats(self) -> dict[str, float]:
        response = await self._client.call(
            self._client.stubs.sessions.GetStats, sessions_pb2.GetStatsRequest()
        )
        return {
            "total_sessions": response.total_sessions,
            "total_episodes": response.total_episodes,
            "avg_episodes_per_session": response.avg_episodes_per_session,
        }

    async def cleanup(self, max_age: timedelta, *, dry_run: bool = False) -> int:
        """Deletes the sessions idle for longer than ``max_age`` (see
        :meth:`Sessions.cleanup`)."""
        request = _requests.cleanup_sessions(max_age, dry_run)
        response = await self._client.call(self._client.stubs.sessions.CleanupSessions, request)
        return response.sessions_deleted


class AsyncEpisodes:
    """Each session's event log, and the live tail."""

    #: Builds an episode for :meth:`append_many`.
    new = staticmethod(new_episode)

    def __init__(self, client: AsyncEngram) -> None:
        self._client = client

    async def append(
        self,
        session_id: str,
        content: Any,
        *,
        type: str = "observation",
        id: str | None = None,
        app: str | None = None,
        user: str | None = None,
        agent: str | None = None,
        metadata: dict[str, Any] | None = None,
        require_session: bool = False,
    ) -> Episode:
        """Appends one episode; with ``app`` and ``user`` a missing session is
        created, unless ``require_session`` (then it is NotFound). Appending
        the same ``id`` again returns the stored episode."""
        request = episodes_pb2.AppendEpisodeRequest(
            session_id=session_id,
            app=app or "",
            user=user or "",
            require_session=require_session,
            episode=new_episode(content, type=type, id=id, agent=agent, metadata=metadata),
        )
        response = await self._client.call(self._client.stubs.episodes.AppendEpisode, request)
        return Episode.from_proto(response.episode)

    async def append_many(
        self,
        session_id: str,
        episodes: Iterable[episodes_pb2.NewEpisode],
        *,
        app: str | None = None,
        user: str | None = None,
        require_session: bool = False,
    ) -> builtins.list[Episode]:
        """Appends episodes atomically (build them with :meth:`new`); a
        missing session is created as :meth:`append` says. When they pass
        about 2 MiB the episodes returned carry no content and metadata (the
        answer must fit one message)."""
        request = episodes_pb2.AppendEpisodesRequest(
            session_id=session_id,
            app=app or "",
            user=user or "",
            require_session=require_session,
            episodes=builtins.list(episodes),
        )
        response = await self._client.call(self._client.stubs.episodes.AppendEpisodes, request)
        return [Episode.from_proto(e) for e in response.episodes]

    async def list(
        self, session_id: str, *, types: Iterable[str] = (), after_seq: int = 0
    ) -> AsyncIterator[Episode]:
        request = functools.partial(
            _requests.list_episodes, session_id, builtins.list(types), after_seq
        )
        async for page in self._client.pages(self._client.stubs.episodes.ListEpisodes, request):
            for episode in page.episodes:
                yield Episode.from_proto(episode)

    async def get(self, episode_id: str) -> Episode:
        """One episode by id, in whichever session it is (a fact's
        ``source_episode_ids`` lead here); NotFound when there is none."""
        response = await self._client.call(
            self._client.stubs.episodes.GetEpisode, episodes_pb2.GetEpisodeRequest(id=episode_id)
        )
        return Episode.from_proto(response.episode)

    async def recent(
        self,
        user: str,
        *,
        session_id: str | None = None,
        agent: str | None = None,
        limit: int = 20,
        types: Iterable[str] = (),
    ) -> builtins.list[Episode]:
        response = await self._client.call(
            self._client.stubs.episodes.Recent,
            episodes_pb2.RecentRequest(
                user=user,
                session_id=session_id or "",
                agent=agent or "",
                limit=limit,
                types=builtins.list(types),
            ),
        )
        return [Episode.from_proto(e) for e in response.episodes]

    async def context(self, session_id: str, *, max_events: int = 20) -> str:
        """The conversation as "User: ...\\nAssistant: ..." text."""
        response = await self._client.call(
            self._client.stubs.episodes.BuildContext,
            episodes_pb2.BuildContextRequest(session_id=session_id, max_events=max_events),
        )
        return response.context

    async def tail(
        self,
        *,
        session_id: str = "",
        user: str = "",
        app: str = "",
        types: Iterable[str] = (),
        cursor: int | None = None,
        reconnect: bool = True,
        max_reconnects: int | None = None,
    ) -> AsyncGenerator[Episode, None]:
        """Follows appended episodes: those after ``cursor`` first (when
        given), then live ones, reconnecting from the last cursor it yielded
        when the stream breaks (see :meth:`Episodes.tail`)."""
        resume = _requests.Resume(cursor, reconnect, max_reconnects)
        wanted = builtins.list(types)
        while True:
            request = _requests.tail(session_id, user, app, wanted, resume.position)
            try:
                stream = self._client.stream(
                    self._client.stubs.episodes.TailEpisodes,
                    request,
                    wait_for_ready=resume.failures > 0,
                )
                async for response in stream:
                    episode = Episode.from_proto(response.episode)
                    resume.delivered(episode.cursor)
                    yield episode
                return
            except EngramError as error:
                await asyncio.sleep(resume.broke(error))


class AsyncFacts:
    """:class:`engram_client.Engram`'s ``facts``, awaited."""

    def __init__(self, client: AsyncEngram) -> None:
        self._client = client

    async def list(
        self, *, app: str = "", user: str = "", kind: FactKind | None = None
    ) -> AsyncIterator[Fact]:
        request = functools.partial(_requests.list_facts, app, user, kind)
        async for page in self._client.pages(self._client.stubs.consolidation.ListFacts, request):
            for fact in page.facts:
                yield Fact.from_proto(fact)

    async def get(self, fact_id: str) -> Fact:
        response = await self._client.call(
            self._client.stubs.consolidation.GetFact,
            consolidation_pb2.GetFactRequest(fact_id=fact_id, page_size=1),
        )
        return Fact.from_proto(response.fact)

    async def history(self, fact_id: str) -> AsyncIterator[FactVersion]:
        request = functools.partial(_requests.fact_versions, fact_id)
        async for page in self._client.pages(self._client.stubs.consolidation.GetFact, request):
            for version in page.versions:
                yield FactVersion.from_proto(version)

    async def delete(self, fact_id: str) -> Fact:
        response = await self._client.call(
            self._client.stubs.consolidation.DeleteFact,
            consolidation_pb2.DeleteFactRequest(fact_id=fact_id),
        )
        return Fact.from_proto(response.fact)

    async def apply(self, deltas: Iterable[consolidation_pb2.MemoryDelta]) -> Applied:
        request = consolidation_pb2.ApplyDeltasRequest(deltas=list(deltas))
        return Applied.from_proto(
            await self._client.call(self._client.stubs.consolidation.ApplyDeltas, request)
        )


class AsyncRules:
    """:class:`engram_client.Engram`'s ``rules``, awaited."""

    def __init__(self, client: AsyncEngram) -> None:
        self._client = client
        self._stub = client.stubs.consolidation

    async def create(
        self,
        rule_id: str,
        filter: str = "",
        *,
        every_n_episodes: int | None = None,
        cron: str | None = None,
        emits: Iterable[str] = (),
        kind: FactKind | None = None,
        confidence: float = 0.0,
        enabled: bool = True,
        request_id: str | None = None,
    ) -> Rule:
        request = _requests.rule(
            rule_id,
            filter,
            every_n_episodes=every_n_episodes,
            cron=cron,
            emits=emits,
            kind=kind,
            confidence=confidence,
            enabled=enabled,
            request_id=request_id,
        )
        return Rule.from_proto((await self._client.call(self._stub.CreateRule, request)).rule)

    async def get(self, rule_id: str) -> Rule:
        request = consolidation_pb2.GetRuleRequest(rule_id=rule_id)
        return Rule.from_proto((await self._client.call(self._stub.GetRule, request)).rule)

    async def list(self) -> AsyncIterator[Rule]:
        async for page in self._client.pages(self._stub.ListRules, _requests.list_rules):
            for rule in page.rules:
                yield Rule.from_proto(rule)

    async def delete(self, rule_id: str) -> None:
        request = consolidation_pb2.DeleteRuleRequest(rule_id=rule_id)
        await self._client.call(self._stub.DeleteRule, request)

    async def run(self, rule_id: str, *, dry_run: bool = False, max_episodes: int = 0) -> RuleRun:
        request = consolidation_pb2.RunRuleRequest(
            rule_id=rule_id, dry_run=dry_run, max_episodes=max_episodes
        )
        return RuleRun.from_proto(await self._client.call(self._stub.RunRule, request))


class AsyncWorking:
    """:class:`engram_client.Engram`'s ``working``, awaited."""

    def __init__(self, client: AsyncEngram) -> None:
        self._client = client
        self._stub = client.stubs.working_memory

    async def set_goal(self, session_id: str, goal: str, *, app: str = "", user: str = "") -> str:
        request = working_memory_pb2.SetGoalRequest(
            session_id=session_id, app=app, user=user, goal=goal
        )
        return (await self._client.call(self._stub.SetGoal, request)).goal

    async def create_task(
        self,
        session_id: str,
        subject: str,
        description: str = "",
        *,
        app: str = "",
        user: str = "",
        request_id: str | None = None,
    ) -> Task:
        request = _requests.create_task(
            session_id, subject, description, app=app, user=user, request_id=request_id
        )
        return Task.from_proto((await self._client.call(self._stub.CreateTask, request)).task)

    async def update_task(
        self,
        session_id: str,
        task_id: str,
        *,
        status: TaskStatus | None = None,
        subject: str | None = None,
        description: str | None = None,
        app: str = "",
        user: str = "",
    ) -> Task:
        request = _requests.update_task(
            session_id,
            task_id,
            app=app,
            user=user,
            status=status,
            subject=subject,
            description=description,
        )
        return Task.from_proto((await self._client.call(self._stub.UpdateTask, request)).task)

    async def tasks(self, session_id: str, *, app: str = "", user: str = "") -> builtins.list[Task]:
        request = functools.partial(_requests.tasks, session_id, app, user)
        return [
            Task.from_proto(t)
            async for page in self._client.pages(self._stub.ListTasks, request)
            for t in page.tasks
        ]

    async def remember(
        self,
        session_id: str,
        content: str,
        *,
        subject: str = "",
        predicate: str = "",
        object: str = "",
        app: str = "",
        user: str = "",
        request_id: str | None = None,
    ) -> Fact:
        request = _requests.remember(
            session_id,
            content,
            app=app,
            user=user,
            subject=subject,
            predicate=predicate,
            object=object,
            request_id=request_id,
        )
        return Fact.from_proto((await self._client.call(self._stub.Remember, request)).fact)

    async def record_procedure(
        self,
        app: str,
        content: str,
        *,
        subject: str = "",
        predicate: str = "",
        request_id: str | None = None,
    ) -> Fact:
        request = _requests.record_procedure(
            app, content, subject=subject, predicate=predicate, request_id=request_id
        )
        return Fact.from_proto((await self._client.call(self._stub.RecordProcedure, request)).fact)

    async def cache(
        self, session_id: str, path: str, content: str, *, app: str = "", user: str = ""
    ) -> Cached:
        request = working_memory_pb2.CacheContentRequest(
            session_id=session_id, app=app, user=user, path=path, content=content
        )
        return Cached.from_proto(await self._client.call(self._stub.CacheContent, request))

    async def snapshot(
        self,
        session_id: str,
        *,
        app: str = "",
        user: str = "",
        max_facts: int = 0,
        max_events: int = 0,
    ) -> WorkingSnapshot:
        request = _requests.snapshot(
            session_id, app=app, user=user, max_facts=max_facts, max_events=max_events
        )
        return WorkingSnapshot.from_proto(await self._client.call(self._stub.GetSnapshot, request))

    async def render(
        self,
        session_id: str,
        *,
        query: str = "",
        app: str = "",
        user: str = "",
        max_facts: int = 0,
        max_events: int = 0,
    ) -> MemoryBlock:
        request = _requests.render(
            session_id, app=app, user=user, query=query, max_facts=max_facts, max_events=max_events
        )
        return MemoryBlock.from_proto(
            await self._client.call(self._stub.RenderMemoryBlock, request)
        )

    async def tools(self) -> builtins.list[Tool]:
        request = working_memory_pb2.ListToolsRequest()
        response = await self._client.call(self._stub.ListTools, request)
        return [Tool.from_proto(t) for t in response.tools]

    async def call_tool(
        self,
        session_id: str,
        name: str,
        arguments: Any = None,
        *,
        app: str = "",
        user: str = "",
        request_id: str | None = None,
    ) -> ToolResult:
        request = _requests.call_tool(
            session_id, name, arguments, app=app, user=user, request_id=request_id
        )
        return ToolResult.from_proto(await self._client.call(self._stub.CallTool, request))


#: The asyncio client under the blocking client's name, as ``grpc.aio``
#: does: ``from engram_client.aio import Engram``.
Engram = AsyncEngram


__all__ = ["AsyncEngram", "AsyncStubs", "Engram"]
