"""The idiomatic layer over the generated stubs."""

from __future__ import annotations

import builtins
import functools
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from . import _requests
from ._errors import EngramError, NotFound, _absent, _no_retention, from_rpc_error
from ._requests import (
    FactKind,
    Page,
    SearchMode,
    SearchSource,
    ScopeType,
    TaskStatus,
    new_episode,
    to_value,
)
from ._results import (
    Applied,
    AuditRecord,
    Cached,
    CachedFile,
    Compacted,
    Entry,
    Episode,
    Fact,
    FactVersion,
    Forgotten,
    Fork,
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
    from_value,
)
from .v1 import (
    consolidation_pb2,
    consolidation_pb2_grpc,
    data_pb2,
    data_pb2_grpc,
    episodes_pb2,
    episodes_pb2_grpc,
    memory_admin_pb2,
    memory_admin_pb2_grpc,
    memory_pb2,
    memory_pb2_grpc,
    search_pb2,
    search_pb2_grpc,
    sessions_pb2,
    sessions_pb2_grpc,
    working_memory_pb2,
    working_memory_pb2_grpc,
)

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp")


class Stubs:
    """The generated stubs of every service, for what the wrapper does not
    cover; pass their methods to :meth:`Engram.call` to get EngramErrors."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.memory = memory_pb2_grpc.MemoryServiceStub(channel)
        self.memory_admin = memory_admin_pb2_grpc.MemoryAdminServiceStub(channel)
        self.sessions = sessions_pb2_grpc.SessionServiceStub(channel)
        self.episodes = episodes_pb2_grpc.EpisodeServiceStub(channel)
        self.consolidation = consolidation_pb2_grpc.ConsolidationServiceStub(channel)
        self.working_memory = working_memory_pb2_grpc.WorkingMemoryServiceStub(channel)
        self.search = search_pb2_grpc.SearchServiceStub(channel)
        self.data = data_pb2_grpc.DataServiceStub(channel)


class Engram(_requests.CallerContext):
    """A connection to an Engram server.

    ``Engram("localhost:50051")`` talks plaintext; pass ``secure=True`` for
    TLS (the system's roots, or ``root_certificates`` in PEM; for mTLS also
    ``private_key`` and ``certificate_chain``) and ``token`` for a bearer
    token. Caller context (execution, flow)
    is set once and sent with every call. With ``wait_for_ready`` calls wait
    (up to ``timeout``) for an unreachable server instead of failing fast.

    A call that fails with UNAVAILABLE (a database failover, a server
    restart) is tried again up to ``retries`` times (0 turns this off)
    within its ``timeout`` when repeating it is harmless: a read, or a
    write that carries its idempotency key (``request_id`` for
    ``memory.set`` and ``memory.delete``, the episodes' ``id`` for
    ``episodes.append``, the session id for ``sessions.get_or_create``).
    Other writes raise :class:`Unavailable` at once, since the first try
    may have been written. Any call is tried again after a failure whose
    reason says nothing was written: ``TRANSACTION_CONFLICT``,
    ``SESSION_CHANGED``, ``DATABASE_TIMEOUT``. A key's history, a
    stream, is read on after it breaks from the version after the last
    one yielded (:meth:`Memory.history`).
    """

    def _connect(self, target: str, tls: grpc.ChannelCredentials | None) -> None:
        self._channel = (
            grpc.secure_channel(target, tls, options=_requests.CHANNEL_OPTIONS)
            if tls is not None
            else grpc.insecure_channel(target, options=_requests.CHANNEL_OPTIONS)
        )
        self.stubs = Stubs(self._channel)
        self.memory = Memory(self)
        self.sessions = Sessions(self)
        self.episodes = Episodes(self)
        self.facts = Facts(self)
        self.rules = Rules(self)
        self.working = Working(self)

    def call(self, method: Callable[..., Resp], request: Message) -> Resp:
        """Calls a unary RPC, raising EngramError on failure, after the
        retries ``retries`` allows."""
        attempts = _requests.Attempts(request, self.retries, self.timeout)
        while True:
            try:
                return method(
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
            time.sleep(delay)

    def pages(self, method: Callable[..., Page], request: Callable[[str], Message]) -> Iterator[Page]:
        """Every page of a paged RPC, each asked for with ``request(token)``,
        from the empty token to the last page's."""
        token = ""
        while True:
            page = self.call(method, request(token))
            yield page
            token = page.next_page_token
            if not token:
                return

    def stream(
        self,
        method: Callable[..., Iterable[Resp]],
        request: Message,
        *,
        wait_for_ready: bool | None = None,
    ) -> Iterator[Resp]:
        """Calls a server-streaming RPC, raising EngramError on failure."""
        ready = self.wait_for_ready if wait_for_ready is None else wait_for_ready
        try:
            yield from method(request, metadata=self.metadata(), wait_for_ready=ready)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def resumed(
        self,
        method: Callable[..., Iterable[Resp]],
        request: Callable[[int], Message],
        start: int,
        after: Callable[[Resp], int],
    ) -> Iterator[Resp]:
        """Calls a server-streaming read that starts where ``request(n)``
        says. A failure a read is retried after (see :class:`Engram`) asks
        again from ``after(r)`` of the last response ``r`` yielded, so none
        is missed or repeated; ``retries`` counts breaks in a row."""
        position = start
        attempts = _requests.Attempts(request(position), self.retries, None)
        while True:
            ready = self.wait_for_ready or attempts.retrying
            try:
                for response in self.stream(method, request(position), wait_for_ready=ready):
                    position = after(response)
                    attempts.progressed()
                    yield response
                return
            except EngramError as failure:
                delay = attempts.wait(failure)
                if delay is None:
                    raise attempts.final(failure) from None
            time.sleep(delay)

    def forget_user(
        self,
        app: str,
        user: str,
        *,
        execution_ids: Iterable[str] = (),
        dry_run: bool = False,
    ) -> Forgotten:
        """Deletes everything about one user of one app: sessions, episodes,
        working memory, their facts and their runs' execution scopes (an
        admin token; ``dry_run`` only counts). Leaves an audit skeleton
        without content."""
        request = _requests.forget_user(app, user, execution_ids, dry_run)
        return Forgotten.from_proto(self.call(self.stubs.data.ForgetUser, request))

    def export(
        self,
        *,
        scope_type: ScopeType | None = None,
        scope: str = "",
        session_id: str = "",
        app: str = "",
        user: str = "",
    ) -> Iterator[str]:
        """The tenant (or one scope, one session, or ``app``'s ``user``) as
        JSON Lines, the header first and an ``end`` line last, streamed as
        the server reads it. Write each line with a newline to get an
        export file; one cut short (the stream broke) lacks its end line,
        and an import refuses it."""
        request = _requests.export(scope_type, scope, session_id, app, user)
        for chunk in self.stream(self.stubs.data.Export, request):
            yield from chunk.lines

    def import_lines(self, lines: Iterable[str]) -> Imported:
        """Restores an export (its lines, e.g. an open file) into this
        token's tenant, all or nothing (an admin token). Records stored and
        identical are left unchanged, so importing twice is harmless; a
        file cut short (no end line) raises :class:`InvalidArgument`,
        reason ``IMPORT_MALFORMED``."""
        try:
            response = self.stubs.data.Import(
                _requests.import_batches(lines),
                metadata=tuple(self.metadata()),
                timeout=self.timeout,
                wait_for_ready=self.wait_for_ready,
            )
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return Imported.from_proto(response)

    def search(
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
        """Memory entries, facts and episodes matching ``query``, best first.

        Words are alternatives, ``"quoted phrases"`` are required and
        ``-words`` excluded; a Chinese, Japanese or Korean word matches any
        pair of its neighbouring characters. Each filter narrows the sources it belongs to:
        ``scope_type``/``scope``/``scope_prefix``/``key_prefix`` memory, ``app``/``user``
        facts and episodes, ``session_id``/``agent``/``types`` episodes,
        ``kind`` facts; the time range narrows all of them.
        ``following_episodes`` (0 to 3) adds the turns after each episode
        hit, where a conversation's answer often is.
        """
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
        response = self.call(self.stubs.search.Search, request)
        return [Hit.from_proto(hit) for hit in response.hits]

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Engram:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class Memory:
    """Scoped, versioned key-value memory. Call :meth:`configure` first, or
    set a flow name in the caller context to use the flow's scope."""

    def __init__(self, client: Engram) -> None:
        self._client = client
        self._scope = _requests.Scope()

    def configure(self, scope: str, scope_type: ScopeType = "namespace") -> None:
        """Chooses the scope every later call works in."""
        self._scope.configure(scope, scope_type)

    def set(
        self,
        key: str,
        value: Any,
        *,
        expected_version: int | None = None,
        request_id: str | None = None,
    ) -> Entry:
        """Writes a new version; with ``expected_version`` a compare-and-set
        that raises :class:`Conflict` (reason ``VERSION_MISMATCH``) when it
        loses."""
        request = self._scope.set(key, value, expected_version, request_id)
        return Entry.from_proto(self._client.call(self._client.stubs.memory.Set, request).entry)

    def entry(
        self, key: str, *, version: int | None = None, as_of: _requests.Point | None = None
    ) -> Entry | None:
        """The newest version of a key, or a given one, or the one current
        ``as_of`` a revision, a time or a ``timedelta`` ago; None when there is none or it was
        deleted. A version purged since raises :class:`NotFound` (reason
        ``VERSION_PURGED``)."""
        request = self._scope.get(key, version, as_of)
        try:
            return Entry.from_proto(self._client.call(self._client.stubs.memory.Get, request).entry)
        except NotFound as error:
            if _absent(error):
                return None
            raise

    def get(
        self, key: str, *, version: int | None = None, as_of: _requests.Point | None = None
    ) -> Any:
        """The value of a key; None when it has none."""
        entry = self.entry(key, version=version, as_of=as_of)
        return None if entry is None else entry.value

    def list(self, prefix: str = "") -> Iterator[Entry]:
        """Every live entry under a prefix, in key order (all pages)."""
        request = functools.partial(self._scope.list, prefix)
        for page in self._client.pages(self._client.stubs.memory.List, request):
            yield from (Entry.from_proto(e) for e in page.entries)

    def snapshot(self, as_of: _requests.Point, prefix: str = "") -> Snapshot:
        """The scope as it was at a revision or a time: the entries live
        then, and the keys whose value then has been purged since."""
        entries: builtins.list[Entry] = []
        purged: builtins.list[str] = []
        request = functools.partial(self._scope.list, prefix, point=as_of)
        for page in self._client.pages(self._client.stubs.memory.List, request):
            entries.extend(Entry.from_proto(e) for e in page.entries)
            purged.extend(page.purged_keys)
        return Snapshot(entries, purged)

    def fork(
        self,
        target: str,
        *,
        target_type: ScopeType | None = None,
        as_of: _requests.Point | None = None,
    ) -> Fork:
        """Copies this scope's live entries (now, or ``as_of`` a revision or
        a time) into ``target``, a scope with no keys, e.g. to replay a run
        against the memory it saw."""
        request = self._scope.fork(target, target_type, as_of)
        return Fork.from_proto(self._client.call(self._client.stubs.memory.ForkScope, request))

    def history(self, key: str, *, from_version: int = 0) -> Iterator[Entry]:
        """Every version of a key, oldest first, tombstones included. A
        stream that breaks (a failover, a server restart) is read again
        from the version after the last one yielded, as a read is retried."""
        request = functools.partial(self._scope.history, key)
        stream = self._client.resumed(
            self._client.stubs.memory.History,
            request,
            from_version,
            lambda response: response.entry.version + 1,
        )
        for response in stream:
            yield Entry.from_proto(response.entry)

    def delete(
        self, key: str, *, expected_version: int | None = None, request_id: str | None = None
    ) -> Entry:
        """Writes a tombstone; returns it. A retry with the same
        ``request_id`` returns the first tombstone instead of failing."""
        request = self._scope.delete(key, expected_version, request_id)
        return Entry.from_proto(self._client.call(self._client.stubs.memory.Delete, request).entry)

    def rollback(self, key: str, to_version: int) -> Entry:
        """Writes a new version holding ``to_version``'s value (restoring a
        deleted key too), recorded in the scope's audit trail."""
        request = self._scope.rollback(key, to_version)
        return Entry.from_proto(self._client.call(self._client.stubs.memory.Rollback, request).entry)

    def watch(
        self,
        prefix: str = "",
        *,
        from_revision: int | None = None,
        reconnect: bool = True,
        max_reconnects: int | None = None,
    ) -> Generator[memory_pb2.WatchResponse, None, None]:
        """Follows the scope's changes in commit order: those after
        ``from_revision`` first (when given), then live ones. A broken
        stream reconnects from the last revision it yielded, so nothing is
        missed or repeated; ``reconnect=False`` raises instead."""
        resume = _requests.Resume(from_revision, reconnect, max_reconnects, "resume_revision")
        while True:
            request = self._scope.watch(prefix, resume.position)
            try:
                stream = self._client.stream(
                    self._client.stubs.memory.Watch, request, wait_for_ready=resume.failures > 0
                )
                for change in stream:
                    resume.delivered(change.revision)
                    yield change
                return
            except EngramError as error:
                time.sleep(resume.broke(error))

    def scopes(
        self,
        scope_type: ScopeType | None = None,
        *,
        flow_id: str = "",
        flow_name: str = "",
        as_of: _requests.Point | None = None,
    ) -> Iterator[ScopeSummary]:
        """Every scope of the tenant (not only the configured one) with its
        live key count, in order; ``flow_id``/``flow_name`` keep the
        execution scopes of one flow, ``as_of`` counts what was live then."""
        request = functools.partial(_requests.list_scopes, scope_type, flow_id, flow_name, as_of)
        for page in self._client.pages(self._client.stubs.memory.ListScopes, request):
            yield from (ScopeSummary.from_proto(s) for s in page.scopes)

    def purge(self, key: str, *, keep: int | None = None, dry_run: bool = False) -> Purged:
        """Hard-deletes all but the newest ``keep`` versions of a key
        (tombstones count); without ``keep`` every version, and the key is
        gone. Audited in the scope's :meth:`compaction_log`."""
        request = self._scope.purge(key, keep, dry_run)
        return Purged.from_proto(self._client.call(self._client.stubs.memory_admin.Purge, request))

    def purge_scope(
        self, *, keep: int | None = None, include_deleted: bool = False, dry_run: bool = False
    ) -> Purged:
        """Purges every key of the scope as :meth:`purge` does one; deleted
        keys only with ``include_deleted``."""
        request = self._scope.purge_scope(keep, include_deleted, dry_run)
        return Purged.from_proto(
            self._client.call(self._client.stubs.memory_admin.PurgeScope, request)
        )

    def compact(
        self,
        *keys: str,
        target_key: str = "",
        history: bool = False,
        instruction: str = "",
        model: str = "",
        max_tokens: int = 0,
    ) -> Compacted:
        """Summarises keys into a new version of ``target_key`` (one key:
        into itself by default), leaving the sources as they are; ``history``
        summarises one key's versions instead of its current value. A
        source written meanwhile raises :class:`Conflict` (reason
        ``SOURCE_CHANGED``) and nothing is written."""
        request = self._scope.compact(keys, target_key, history, instruction, model, max_tokens)
        return Compacted.from_proto(
            self._client.call(self._client.stubs.memory_admin.Compact, request)
        )

    def compaction_log(self) -> Iterator[AuditRecord]:
        """The scope's maintenance audit trail, newest first (all pages)."""
        method = self._client.stubs.memory_admin.GetCompactionLog
        for page in self._client.pages(method, self._scope.compaction_log):
            yield from (AuditRecord.from_proto(r) for r in page.records)

    def set_retention(
        self,
        *,
        keep_versions: int | None = None,
        max_age: timedelta | None = None,
        tombstone_grace: timedelta | None = None,
    ) -> Retention | None:
        """Replaces the scope's retention policy, which the server then
        applies on its own, first at once (see :meth:`preview_retention`);
        with every rule None the policy is removed and None returned."""
        policy = _requests.retention_policy(keep_versions, max_age, tombstone_grace)
        request = self._scope.set_retention(policy, dry_run=False)
        response = self._client.call(self._client.stubs.memory_admin.SetRetention, request)
        return Retention.from_proto(response.retention) if response.HasField("retention") else None

    def preview_retention(
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
            self._client.call(self._client.stubs.memory_admin.SetRetention, request)
        )

    def retention(self) -> Retention | None:
        """The scope's retention policy and its last run; None without one."""
        try:
            response = self._client.call(
                self._client.stubs.memory_admin.GetRetention, self._scope.get_retention()
            )
        except NotFound as error:
            if _no_retention(error):
                return None
            raise
        return Retention.from_proto(response.retention)

    def apply_retention(self, *, dry_run: bool = False) -> Purged:
        """Runs the scope's retention policy now."""
        request = self._scope.apply_retention(dry_run)
        return Purged.from_proto(
            self._client.call(self._client.stubs.memory_admin.ApplyRetention, request)
        )

    def reindex(self, *, apply: bool = False) -> Reindexed:
        """Backfills the flow tags of the tenant's execution-scoped versions
        (a report unless ``apply``); running it again changes nothing."""
        request = memory_admin_pb2.ReindexRequest(apply=apply)
        return Reindexed.from_proto(
            self._client.call(self._client.stubs.memory_admin.Reindex, request)
        )


class Sessions:
    """Sessions: one conversation of a user with an app."""

    def __init__(self, client: Engram) -> None:
        self._client = client

    def create(
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
        response = self._client.call(self._client.stubs.sessions.CreateSession, request)
        return Session.from_proto(response.session)

    def get_or_create(
        self, app: str, user: str, session_id: str, *, request_id: str | None = None
    ) -> tuple[Session, bool]:
        """The session ``session_id`` of ``app`` and ``user``, created when
        missing, and whether this call created it (also when a retry of it
        finds what its first try created: see ``create``)."""
        response = self._client.call(
            self._client.stubs.sessions.GetOrCreateSession,
            _requests.get_or_create_session(app, user, session_id, request_id),
        )
        return Session.from_proto(response.session), response.created

    def get(self, session_id: str) -> Session | None:
        try:
            response = self._client.call(
                self._client.stubs.sessions.GetSession,
                sessions_pb2.GetSessionRequest(session_id=session_id),
            )
        except NotFound:
            return None
        return Session.from_proto(response.session)

    def list(self, *, app: str = "", user: str = "") -> Iterator[Session]:
        request = functools.partial(_requests.list_sessions, app, user)
        for page in self._client.pages(self._client.stubs.sessions.ListSessions, request):
            yield from (Session.from_proto(s) for s in page.sessions)

    def end(self, session_id: str, *, delete_episodes: bool = False) -> Session:
        response = self._client.call(
            self._client.stubs.sessions.EndSession,
            sessions_pb2.EndSessionRequest(session_id=session_id, delete_episodes=delete_episodes),
        )
        return Session.from_proto(response.session)

    def delete(self, session_id: str) -> int:
        """Deletes a session with its episodes; returns how many episodes went."""
        response = self._client.call(
            self._client.stubs.sessions.DeleteSession,
            sessions_pb2.DeleteSessionRequest(session_id=session_id),
        )
        return response.episodes_deleted

    def stats(self) -> dict[str, float]:
        response = self._client.call(
            self._client.stubs.sessions.GetStats, sessions_pb2.GetStatsRequest()
        )
        return {
            "total_sessions": response.total_sessions,
            "total_episodes": response.total_episodes,
            "avg_episodes_per_session": response.avg_episodes_per_session,
        }

    def cleanup(self, max_age: timedelta, *, dry_run: bool = False) -> int:
        """Deletes the sessions idle for longer than ``max_age`` (nothing
        appended, nothing written to their working memory), with their
        episodes; returns how many went (or would, with ``dry_run``)."""
        request = _requests.cleanup_sessions(max_age, dry_run)
        response = self._client.call(self._client.stubs.sessions.CleanupSessions, request)
        return response.sessions_deleted


class Episodes:
    """Each session's event log, and the live tail."""

    def __init__(self, client: Engram) -> None:
        self._client = client

    #: Builds an episode for :meth:`append_many`.
    new = staticmethod(new_episode)

    def append(
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
            episode=self.new(content, type=type, id=id, agent=agent, metadata=metadata),
        )
        response = self._client.call(self._client.stubs.episodes.AppendEpisode, request)
        return Episode.from_proto(response.episode)

    def append_many(
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
        response = self._client.call(self._client.stubs.episodes.AppendEpisodes, request)
        return [Episode.from_proto(e) for e in response.episodes]

    def list(
        self, session_id: str, *, types: Iterable[str] = (), after_seq: int = 0
    ) -> Iterator[Episode]:
        request = functools.partial(_requests.list_episodes, session_id, builtins.list(types), after_seq)
        for page in self._client.pages(self._client.stubs.episodes.ListEpisodes, request):
            yield from (Episode.from_proto(e) for e in page.episodes)

    def get(self, episode_id: str) -> Episode:
        """One episode by id, in whichever session it is (a fact's
        ``source_episode_ids`` lead here); NotFound when there is none."""
        response = self._client.call(
            self._client.stubs.episodes.GetEpisode, episodes_pb2.GetEpisodeRequest(id=episode_id)
        )
        return Episode.from_proto(response.episode)

    def recent(
        self,
        user: str,
        *,
        session_id: str | None = None,
        agent: str | None = None,
        limit: int = 20,
        types: Iterable[str] = (),
    ) -> builtins.list[Episode]:
        response = self._client.call(
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

    def context(self, session_id: str, *, max_events: int = 20) -> str:
        """The conversation as "User: ...\\nAssistant: ..." text."""
        response = self._client.call(
            self._client.stubs.episodes.BuildContext,
            episodes_pb2.BuildContextRequest(session_id=session_id, max_events=max_events),
        )
        return response.context

    def tail(
        self,
        *,
        session_id: str = "",
        user: str = "",
        app: str = "",
        types: Iterable[str] = (),
        cursor: int | None = None,
        reconnect: bool = True,
        max_reconnects: int | None = None,
    ) -> Generator[Episode, None, None]:
        """Follows appended episodes: those after ``cursor`` first (when
        given), then live ones. When the stream breaks (the server restarts,
        the connection drops, the server sheds a slow consumer), it
        reconnects from the last cursor it yielded, so nothing is missed or
        repeated; ``reconnect=False`` raises instead."""
        resume = _requests.Resume(cursor, reconnect, max_reconnects)
        wanted = builtins.list(types)
        while True:
            request = _requests.tail(session_id, user, app, wanted, resume.position)
            try:
                # A reconnect waits for the server to be back, however long.
                stream = self._client.stream(
                    self._client.stubs.episodes.TailEpisodes, request, wait_for_ready=resume.failures > 0
                )
                for response in stream:
                    episode = Episode.from_proto(response.episode)
                    resume.delivered(episode.cursor)
                    yield episode
                return
            except EngramError as error:
                time.sleep(resume.broke(error))


class Facts:
    """The live facts consolidation (and ``Remember``) made of each app's
    users."""

    def __init__(self, client: Engram) -> None:
        self._client = client

    def list(
        self, *, app: str = "", user: str = "", kind: FactKind | None = None
    ) -> Iterator[Fact]:
        """Every live fact of ``app`` and ``user`` (each narrows when given),
        page by page."""
        request = functools.partial(_requests.list_facts, app, user, kind)
        for page in self._client.pages(self._client.stubs.consolidation.ListFacts, request):
            yield from (Fact.from_proto(f) for f in page.facts)

    def get(self, fact_id: str) -> Fact:
        """A fact at its newest version, a deleted one too (``deleted`` set);
        NotFound when there is none."""
        response = self._client.call(
            self._client.stubs.consolidation.GetFact,
            consolidation_pb2.GetFactRequest(fact_id=fact_id, page_size=1),
        )
        return Fact.from_proto(response.fact)

    def history(self, fact_id: str) -> Iterator[FactVersion]:
        """Every version of a fact with its lineage, oldest first, page by
        page; NotFound when there is no such fact."""
        request = functools.partial(_requests.fact_versions, fact_id)
        for page in self._client.pages(self._client.stubs.consolidation.GetFact, request):
            yield from (FactVersion.from_proto(v) for v in page.versions)

    def delete(self, fact_id: str) -> Fact:
        """Deletes a fact: it leaves :meth:`list`, and :meth:`get` still reads
        it. Returns the fact as deleted."""
        response = self._client.call(
            self._client.stubs.consolidation.DeleteFact,
            consolidation_pb2.DeleteFactRequest(fact_id=fact_id),
        )
        return Fact.from_proto(response.fact)

    def apply(self, deltas: Iterable[consolidation_pb2.MemoryDelta]) -> Applied:
        """Applies deltas (made with :mod:`engram_client.deltas`, or a dry
        run's) in order, all or nothing: 1 to 1000 of them."""
        request = consolidation_pb2.ApplyDeltasRequest(deltas=list(deltas))
        return Applied.from_proto(
            self._client.call(self._client.stubs.consolidation.ApplyDeltas, request)
        )


class Rules:
    """Consolidation rules: each promotes the episodes its filter selects
    into facts, exactly once, on its cadence or when run."""

    def __init__(self, client: Engram) -> None:
        self._client = client
        self._stub = client.stubs.consolidation

    def create(
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
        """Stores a rule; its first run reads every episode kept. Exactly one
        of ``every_n_episodes`` and ``cron`` (``*/5 * * * *``, ``@daily``);
        a bad filter is ``InvalidArgument`` (``INVALID_FILTER``), a taken id
        ``AlreadyExists`` (``RULE_EXISTS``). ``request_id`` (a new random one
        when not given) makes repeating the call safe: a repeat is answered
        with the rule the first call made, as it is now; give your own to
        make a script that creates its rules safe to run again."""
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
        return Rule.from_proto(self._client.call(self._stub.CreateRule, request).rule)

    def get(self, rule_id: str) -> Rule:
        """A rule with its watermark and last run; ``NotFound`` when none."""
        request = consolidation_pb2.GetRuleRequest(rule_id=rule_id)
        return Rule.from_proto(self._client.call(self._stub.GetRule, request).rule)

    def list(self) -> Iterator[Rule]:
        """Every rule in id order, page by page."""
        for page in self._client.pages(self._stub.ListRules, _requests.list_rules):
            yield from (Rule.from_proto(r) for r in page.rules)

    def delete(self, rule_id: str) -> None:
        """Deletes a rule; the facts it promoted stay."""
        request = consolidation_pb2.DeleteRuleRequest(rule_id=rule_id)
        self._client.call(self._stub.DeleteRule, request)

    def run(self, rule_id: str, *, dry_run: bool = False, max_episodes: int = 0) -> RuleRun:
        """Runs a rule now over the episodes after its watermark (at most
        ``max_episodes``; 0 takes the server's 1000). With ``dry_run`` it
        returns the deltas and writes nothing."""
        request = consolidation_pb2.RunRuleRequest(
            rule_id=rule_id, dry_run=dry_run, max_episodes=max_episodes
        )
        return RuleRun.from_proto(self._client.call(self._stub.RunRule, request))


class Working:
    """A session's working memory: its goal, todo list and content cache,
    the facts it remembers, and the MEMORY block they render into.

    Session-scoped calls take the session's ``app`` and ``user`` too: when
    given they are checked against the session (``FailedPrecondition``,
    reason ``SESSION_OWNER_MISMATCH``), and with both a session that does
    not exist yet is created. Text is stored after secret redaction."""

    def __init__(self, client: Engram) -> None:
        self._client = client
        self._stub = client.stubs.working_memory

    def set_goal(self, session_id: str, goal: str, *, app: str = "", user: str = "") -> str:
        """Sets or replaces the session's goal; returns it as stored."""
        request = working_memory_pb2.SetGoalRequest(
            session_id=session_id, app=app, user=user, goal=goal
        )
        return self._client.call(self._stub.SetGoal, request).goal

    def create_task(
        self,
        session_id: str,
        subject: str,
        description: str = "",
        *,
        app: str = "",
        user: str = "",
        request_id: str | None = None,
    ) -> Task:
        """Adds a pending task (ids ``t1``, ``t2``, … per session);
        ``ResourceExhausted`` (``LIMIT_EXCEEDED``) past the task limit.
        ``request_id`` (default: a new random one) makes a retry after a
        lost reply answer with the task the first try added."""
        request = _requests.create_task(
            session_id, subject, description, app=app, user=user, request_id=request_id
        )
        return Task.from_proto(self._client.call(self._stub.CreateTask, request).task)

    def update_task(
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
        """Changes what is given and keeps the rest; ``NotFound``
        (``TASK_NOT_FOUND``) for an unknown task."""
        request = _requests.update_task(
            session_id,
            task_id,
            app=app,
            user=user,
            status=status,
            subject=subject,
            description=description,
        )
        return Task.from_proto(self._client.call(self._stub.UpdateTask, request).task)

    def tasks(self, session_id: str, *, app: str = "", user: str = "") -> builtins.list[Task]:
        """The session's tasks in creation order (every page)."""
        request = functools.partial(_requests.tasks, session_id, app, user)
        pages = self._client.pages(self._stub.ListTasks, request)
        return [Task.from_proto(t) for page in pages for t in page.tasks]

    def remember(
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
        """Stores a fact about the session's user for its app; it outlives
        the session and shows in every later session's MEMORY block.
        ``request_id`` (default: a new random one) makes a retry after a
        lost reply answer with the fact the first try stored."""
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
        return Fact.from_proto(self._client.call(self._stub.Remember, request).fact)

    def record_procedure(
        self,
        app: str,
        content: str,
        *,
        subject: str = "",
        predicate: str = "",
        request_id: str | None = None,
    ) -> Fact:
        """Stores how the app's agents do something (a procedural fact, no
        user): every session of the app sees it. ``request_id`` as for
        ``remember``."""
        request = _requests.record_procedure(
            app, content, subject=subject, predicate=predicate, request_id=request_id
        )
        return Fact.from_proto(self._client.call(self._stub.RecordProcedure, request).fact)

    def cache(
        self, session_id: str, path: str, content: str, *, app: str = "", user: str = ""
    ) -> Cached:
        """Keeps ``content`` (a file the agent read, say) under ``path`` in
        the session's bounded cache, evicting the least recently cached."""
        request = working_memory_pb2.CacheContentRequest(
            session_id=session_id, app=app, user=user, path=path, content=content
        )
        return Cached.from_proto(self._client.call(self._stub.CacheContent, request))

    def snapshot(
        self,
        session_id: str,
        *,
        app: str = "",
        user: str = "",
        max_facts: int = 0,
        max_events: int = 0,
    ) -> WorkingSnapshot:
        """Everything the MEMORY block is made of, as data."""
        request = _requests.snapshot(
            session_id, app=app, user=user, max_facts=max_facts, max_events=max_events
        )
        return WorkingSnapshot.from_proto(self._client.call(self._stub.GetSnapshot, request))

    def render(
        self,
        session_id: str,
        *,
        query: str = "",
        app: str = "",
        user: str = "",
        max_facts: int = 0,
        max_events: int = 0,
    ) -> MemoryBlock:
        """The MEMORY block and the memory instructions for the session's
        next prompt. With ``query`` (the user's last message, say) the Facts
        section holds the facts most relevant to it instead of the newest;
        ``max_facts`` and ``max_events`` of 0 take the server's defaults."""
        request = _requests.render(
            session_id, app=app, user=user, query=query, max_facts=max_facts, max_events=max_events
        )
        return MemoryBlock.from_proto(self._client.call(self._stub.RenderMemoryBlock, request))

    def tools(self) -> builtins.list[Tool]:
        """The actions an LLM can call to keep its own working memory
        (TaskCreate, TaskUpdate, memory.set_goal, Remember)."""
        response = self._client.call(self._stub.ListTools, working_memory_pb2.ListToolsRequest())
        return [Tool.from_proto(t) for t in response.tools]

    def call_tool(
        self,
        session_id: str,
        name: str,
        arguments: Any = None,
        *,
        app: str = "",
        user: str = "",
        request_id: str | None = None,
    ) -> ToolResult:
        """Runs one tool call as the LLM emitted it (``arguments`` a dict or
        its JSON text) and returns what to hand back to the LLM.
        ``request_id`` (the tool call's own id, ``call_…`` or ``toolu_…``, is
        a good one; a new random one when not given) makes forwarding the
        call again safe: TaskCreate and Remember then answer with the task or
        fact the first call made."""
        request = _requests.call_tool(
            session_id, name, arguments, app=app, user=user, request_id=request_id
        )
        return ToolResult.from_proto(self._client.call(self._stub.CallTool, request))


__all__ = ["Engram", "Stubs"]
