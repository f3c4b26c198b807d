"""The requests both clients send, built in one place.

The blocking client (``engram_client.Engram``) and the asyncio one
(``engram_client.aio.AsyncEngram``) differ only in how they wait; what they
ask for, and how a broken live stream decides to resume, is here.
"""

from __future__ import annotations

import builtins
import logging
import random
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, Protocol, TypeVar

import grpc
from google.protobuf import duration_pb2, json_format, struct_pb2, timestamp_pb2
from google.protobuf.message import Message

from ._errors import EngramError, ResourceExhausted, Unavailable

log = logging.getLogger("engram_client")
from .v1 import (
    consolidation_pb2,
    data_pb2,
    episodes_pb2,
    memory_admin_pb2,
    memory_pb2,
    search_pb2,
    sessions_pb2,
    working_memory_pb2,
)

ScopeType = Literal["namespace", "flow", "execution"]
SearchSource = Literal["memory", "facts", "episodes"]
SearchMode = Literal["lexical", "semantic", "hybrid"]
FactKind = Literal["semantic", "procedural"]
TaskStatus = Literal["pending", "in_progress", "completed", "blocked"]

SCOPE_TYPES: dict[str, memory_pb2.ScopeType.ValueType] = {
    "namespace": memory_pb2.SCOPE_TYPE_NAMESPACE,
    "flow": memory_pb2.SCOPE_TYPE_FLOW,
    "execution": memory_pb2.SCOPE_TYPE_EXECUTION,
}
SOURCES: dict[str, search_pb2.SearchSource.ValueType] = {
    "memory": search_pb2.SEARCH_SOURCE_MEMORY,
    "facts": search_pb2.SEARCH_SOURCE_FACTS,
    "episodes": search_pb2.SEARCH_SOURCE_EPISODES,
}
MODES: dict[str, search_pb2.SearchMode.ValueType] = {
    "lexical": search_pb2.SEARCH_MODE_LEXICAL,
    "semantic": search_pb2.SEARCH_MODE_SEMANTIC,
    "hybrid": search_pb2.SEARCH_MODE_HYBRID,
}
KINDS: dict[str, consolidation_pb2.FactKind.ValueType] = {
    "semantic": consolidation_pb2.FACT_KIND_SEMANTIC,
    "procedural": consolidation_pb2.FACT_KIND_PROCEDURAL,
}

TASK_STATUSES: dict[str, working_memory_pb2.TaskStatus.ValueType] = {
    "pending": working_memory_pb2.TASK_STATUS_PENDING,
    "in_progress": working_memory_pb2.TASK_STATUS_IN_PROGRESS,
    "completed": working_memory_pb2.TASK_STATUS_COMPLETED,
    "blocked": working_memory_pb2.TASK_STATUS_BLOCKED,
}

Value = TypeVar("Value", bound=int)


def choice(what: str, names: dict[str, Value], name: str | None, unset: Value) -> Value:
    """The enum value ``name`` stands for in ``names``, ``unset`` for None;
    a ValueError naming ``what`` and the choices for any other name."""
    if name is None:
        return unset
    if name not in names:
        raise ValueError(f"{what} must be one of {sorted(names)}")
    return names[name]


#: Items asked for per page when a method reads every page.
PAGE = 1000


class Paged(Protocol):
    """A response of a paged RPC: what tells whether another page follows."""

    @property
    def next_page_token(self) -> str: ...


Page = TypeVar("Page", bound=Paged)

#: How long a live stream waits before reconnecting, at first and at most.
RECONNECT_DELAY = (0.05, 2.0)


#: Reconnect quickly after a server restart (gRPC's default backoff grows
#: to two minutes).
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def credentials(
    secure: bool,
    root_certificates: bytes | None,
    private_key: bytes | None,
    certificate_chain: bytes | None,
) -> grpc.ChannelCredentials | None:
    """TLS credentials for the channel; None for plaintext."""
    if (private_key is None) != (certificate_chain is None):
        raise ValueError("private_key and certificate_chain go together")
    if secure or root_certificates is not None or private_key is not None:
        return grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
    return None


#: Requests that only read: retrying one can change nothing.
_READS: tuple[type[Message], ...] = (
    memory_pb2.GetRequest,
    memory_pb2.ListRequest,
    memory_pb2.HistoryRequest,
    memory_pb2.ListScopesRequest,
    memory_admin_pb2.GetCompactionLogRequest,
    memory_admin_pb2.GetRetentionRequest,
    search_pb2.SearchRequest,
    sessions_pb2.GetSessionRequest,
    sessions_pb2.ListSessionsRequest,
    sessions_pb2.GetStatsRequest,
    episodes_pb2.ListEpisodesRequest,
    episodes_pb2.GetEpisodeRequest,
    episodes_pb2.RecentRequest,
    episodes_pb2.BuildContextRequest,
    consolidation_pb2.GetRuleRequest,
    consolidation_pb2.ListRulesRequest,
    consolidation_pb2.GetFactRequest,
    consolidation_pb2.ListFactsRequest,
    working_memory_pb2.ListTasksRequest,
    working_memory_pb2.GetSnapshotRequest,
    working_memory_pb2.RenderMemoryBlockRequest,
    working_memory_pb2.ListToolsRequest,
)


#: Writes that set state to what they carry, so that a repeat leaves it as
#: the first left it: a session's goal, a task's fields, a cached file, a
#: session's end, a scope's retention policy, the reindex. (A repeat's
#: reply describes the repeat: a cached file that evicted others the first
#: time evicts nothing, an end that deleted episodes deletes none.)
_SETTERS: tuple[type[Message], ...] = (
    working_memory_pb2.SetGoalRequest,
    working_memory_pb2.UpdateTaskRequest,
    working_memory_pb2.CacheContentRequest,
    sessions_pb2.EndSessionRequest,
    memory_admin_pb2.SetRetentionRequest,
    memory_admin_pb2.ReindexRequest,
)


#: The LLM tools (names and aliases) that set what they carry, so that a
#: CallTool of one is harmless to repeat even with no ``request_id``.
_SETTING_TOOLS = frozenset({"TaskUpdate", "memory.task_update", "memory.set_goal"})


def idempotent(request: Message) -> bool:
    """Whether sending ``request`` twice has the effect of sending it once:
    a read, a write that sets state to what it carries (``_SETTERS``), or a
    write that carries its idempotency key (a ``request_id``;
    every episode's ``id``; the ``request_id`` of a session, rule, task or
    fact creation or of a tool call, or a session's id for GetOrCreateSession). Only
    these are retried after UNAVAILABLE, whose write may or may not have
    happened (a commit whose reply was lost)."""
    if isinstance(request, _READS + _SETTERS):
        return True
    if isinstance(request, (memory_pb2.SetRequest, memory_pb2.DeleteRequest)):
        return bool(request.request_id)
    if isinstance(request, episodes_pb2.AppendEpisodeRequest):
        return bool(request.episode.id)
    if isinstance(request, episodes_pb2.AppendEpisodesRequest):
        return bool(request.episodes) and all(episode.id for episode in request.episodes)
    if isinstance(
        request,
        (
            sessions_pb2.CreateSessionRequest,
            consolidation_pb2.CreateRuleRequest,
            working_memory_pb2.CreateTaskRequest,
            working_memory_pb2.RememberRequest,
            working_memory_pb2.RecordProcedureRequest,
        ),
    ):
        return bool(request.request_id)
    if isinstance(request, working_memory_pb2.CallToolRequest):
        return bool(request.request_id) or request.name in _SETTING_TOOLS
    if isinstance(request, sessions_pb2.GetOrCreateSessionRequest):
        return bool(request.session_id or request.request_id)
    return False


#: The reasons the server fails a call with only when nothing of it was
#: written (its transaction was rolled back), so that any call, keyed or
#: not, may be tried again after them: a deadlock Postgres broke, a
#: session made again under an append, a statement the database gave up on.
NOTHING_WRITTEN = frozenset({"TRANSACTION_CONFLICT", "SESSION_CHANGED", "DATABASE_TIMEOUT"})


#: The wait before a retry the server gave no delay for: the first, and
#: the most; each doubles the last, less up to half at random.
RETRY_BACKOFF = (0.1, 2.0)


class Attempts:
    """The tries of one unary call: the deadline they share (``timeout``
    after the first), and whether and when to try again after a failure.

    A call is retried on UNAVAILABLE (the database or the server is
    briefly out of reach: a failover, a restart) when it is
    :func:`idempotent`, and after a failure whose reason says nothing was
    written (:data:`NOTHING_WRITTEN`) whatever it is, up to ``retries``
    times, waiting what the server's
    ``RetryInfo`` asks or else a growing backoff, and never past the
    deadline. A retry waits for the server to be reachable (gRPC's
    ``wait_for_ready``), so a call whose first try met a restarting server
    is answered once it is back, within the deadline. Each retry is logged
    (logger ``engram_client``, INFO).

    Written here rather than as a gRPC service-config retry policy: such a
    policy is per method, so it cannot retry a ``Set`` that carries a
    ``request_id`` and refuse one that does not, and it ignores RetryInfo.
    """

    def __init__(self, request: Message, retries: int, timeout: float | None) -> None:
        self._idempotent = idempotent(request)
        self._retries = retries
        self._left = retries
        self._tried = 0
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._backoff = RETRY_BACKOFF[0]
        self._name = type(request).__name__.removesuffix("Request")
        #: The failure the last retry was made after.
        self._retried: EngramError | None = None

    @property
    def retrying(self) -> bool:
        """Whether a try has failed already: the next waits for the server
        to be reachable rather than failing fast."""
        return self._tried > 0

    def progressed(self) -> None:
        """A resumed stream delivered: its next failure is retried as if
        it were the first (the retries count breaks in a row)."""
        self._left, self._tried, self._backoff = self._retries, 0, RETRY_BACKOFF[0]
        self._retried = None

    def timeout(self) -> float | None:
        """What is left of the call's deadline for the next try."""
        if self._deadline is None:
            return None
        return max(self._deadline - time.monotonic(), 0.0)

    def wait(self, error: EngramError) -> float | None:
        """How long to wait before trying again after ``error``; None to
        give up and raise it."""
        self._tried += 1
        if self._left <= 0 or not self._retryable(error):
            return None
        delay = error.retry_delay
        if delay is None:
            delay = self._backoff * random.uniform(0.5, 1.0)
            self._backoff = min(self._backoff * 2, RETRY_BACKOFF[1])
        left = self.timeout()
        if left is not None and delay >= left:
            return None
        self._left -= 1
        self._retried = error
        log.info(
            "retrying %s in %.2fs after try %d failed: %s",
            self._name,
            delay,
            self._tried,
            error,
        )
        return delay

    def _retryable(self, error: EngramError) -> bool:
        if error.reason in NOTHING_WRITTEN:
            return True
        return self._idempotent and isinstance(error, Unavailable)

    def final(self, error: EngramError) -> EngramError:
        """What the call raises when it gives up after ``error``: a retry
        that reached the deadline waiting for an unreachable server says
        why it waited (the UNAVAILABLE before it), not just that time ran
        out."""
        if self._retried is not None and error.code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return self._retried
        return error


@dataclass(frozen=True)
class Settings:
    """What a client was made from, so that an integration can make the
    other flavour (blocking or asyncio) of the same connection."""

    target: str
    token: str | None
    options: dict[str, Any]


class CallerContext:
    """What both clients are made of: the settings they were made from
    (:class:`Settings`), TLS, deadlines, and the bearer token and caller
    context sent with every call. A client adds its channel in
    :meth:`_connect`."""

    def __init__(
        self,
        target: str,
        token: str | None = None,
        *,
        secure: bool = False,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        execution_id: str | None = None,
        flow_id: str | None = None,
        flow_name: str | None = None,
        timeout: float | None = 30.0,
        wait_for_ready: bool = False,
        retries: int = 3,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be 0 or more")
        #: What this client was made from.
        self.settings = Settings(
            target,
            token,
            {
                "secure": secure,
                "root_certificates": root_certificates,
                "private_key": private_key,
                "certificate_chain": certificate_chain,
                "execution_id": execution_id,
                "flow_id": flow_id,
                "flow_name": flow_name,
                "timeout": timeout,
                "wait_for_ready": wait_for_ready,
                "retries": retries,
            },
        )
        self._token = token
        self._context: dict[str, str] = {}
        self.set_context(execution_id=execution_id, flow_id=flow_id, flow_name=flow_name)
        self.wait_for_ready = wait_for_ready
        self.timeout = timeout
        self.retries = retries
        self._connect(target, credentials(secure, root_certificates, private_key, certificate_chain))

    def _connect(self, target: str, tls: grpc.ChannelCredentials | None) -> None:
        raise NotImplementedError

    def set_context(
        self,
        *,
        execution_id: str | None = None,
        flow_id: str | None = None,
        flow_name: str | None = None,
    ) -> None:
        """Sets the caller context sent with every later call."""
        for key, value in (
            ("engram-execution-id", execution_id),
            ("engram-flow-id", flow_id),
            ("engram-flow-name", flow_name),
        ):
            if value:
                self._context[key] = value
            else:
                self._context.pop(key, None)

    def metadata(self) -> list[tuple[str, str]]:
        pairs = list(self._context.items())
        if self._token:
            pairs.append(("authorization", f"Bearer {self._token}"))
        return pairs


def to_value(obj: Any) -> struct_pb2.Value:
    """A JSON-able Python value as a protobuf Value."""
    value = struct_pb2.Value()
    json_format.ParseDict(obj, value)
    return value


#: A point in the past: a change-feed revision (as ``watch`` yields them), a
#: time, or how long ago (a ``timedelta``, from this machine's clock).
Point = int | datetime | timedelta


def as_of(point: Point | None) -> memory_pb2.AsOf | None:
    """The ``as_of`` message naming a revision or a time."""
    if point is None:
        return None
    if isinstance(point, timedelta):
        if point < timedelta(0):
            raise ValueError(f"as_of: a timedelta is how long ago, not {point}")
        return memory_pb2.AsOf(time=timestamp(datetime.now(timezone.utc) - point))
    if isinstance(point, datetime):
        return memory_pb2.AsOf(time=timestamp(point))
    return memory_pb2.AsOf(revision=point)


def timestamp(moment: datetime | None) -> timestamp_pb2.Timestamp | None:
    if moment is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(moment.astimezone(timezone.utc))
    return ts


def duration(span: timedelta | None) -> duration_pb2.Duration | None:
    if span is None:
        return None
    value = duration_pb2.Duration()
    value.FromTimedelta(span)
    return value


def retention_policy(
    keep_versions: int | None, max_age: timedelta | None, tombstone_grace: timedelta | None
) -> memory_admin_pb2.RetentionPolicy:
    """A retention policy; a rule left None is off."""
    policy = memory_admin_pb2.RetentionPolicy(
        max_age=duration(max_age), tombstone_grace=duration(tombstone_grace)
    )
    if keep_versions is not None:
        policy.keep_versions = keep_versions
    return policy


def list_scopes(
    scope_type: ScopeType | None, flow_id: str, flow_name: str, point: Point | None, token: str
) -> memory_pb2.ListScopesRequest:
    return memory_pb2.ListScopesRequest(
        scope_type=choice("scope_type", SCOPE_TYPES, scope_type, memory_pb2.SCOPE_TYPE_UNSPECIFIED),
        flow_id=flow_id,
        flow_name=flow_name,
        as_of=as_of(point),
        page_size=PAGE,
        page_token=token,
    )


def cleanup_sessions(max_age: timedelta, dry_run: bool) -> sessions_pb2.CleanupSessionsRequest:
    return sessions_pb2.CleanupSessionsRequest(max_age=duration(max_age), dry_run=dry_run)


@dataclass
class Scope:
    """The scope a memory namespace works in (:meth:`configure`)."""

    scope: str = ""
    scope_type: memory_pb2.ScopeType.ValueType = memory_pb2.SCOPE_TYPE_UNSPECIFIED

    def configure(self, scope: str, scope_type: ScopeType = "namespace") -> None:
        self.scope_type = choice(
            "scope_type", SCOPE_TYPES, scope_type, memory_pb2.SCOPE_TYPE_UNSPECIFIED
        )
        self.scope = scope

    def set(
        self, key: str, value: Any, expected_version: int | None, request_id: str | None
    ) -> memory_pb2.SetRequest:
        request = memory_pb2.SetRequest(
            scope_type=self.scope_type,
            scope=self.scope,
            key=key,
            value=to_value(value),
            request_id=request_id or "",
        )
        if expected_version is not None:
            request.expected_version = expected_version
        return request

    def get(
        self, key: str, version: int | None, point: Point | None = None
    ) -> memory_pb2.GetRequest:
        return memory_pb2.GetRequest(
            scope_type=self.scope_type,
            scope=self.scope,
            key=key,
            version=version or 0,
            as_of=as_of(point),
        )

    def list(self, prefix: str, token: str, point: Point | None = None) -> memory_pb2.ListRequest:
        return memory_pb2.ListRequest(
            scope_type=self.scope_type,
            scope=self.scope,
            key_prefix=prefix,
            page_size=PAGE,
            page_token=token,
            as_of=as_of(point),
        )

    def fork(
        self, target: str, target_type: ScopeType | None, point: Point | None
    ) -> memory_pb2.ForkScopeRequest:
        return memory_pb2.ForkScopeRequest(
            source_scope_type=self.scope_type,
            source_scope=self.scope,
            target_scope_type=choice("target_type", SCOPE_TYPES, target_type, self.scope_type),
            target_scope=target,
            as_of=as_of(point),
        )

    def history(self, key: str, from_version: int) -> memory_pb2.HistoryRequest:
        return memory_pb2.HistoryRequest(
            scope_type=self.scope_type, scope=self.scope, key=key, from_version=from_version
        )

    def delete(
        self, key: str, expected_version: int | None, request_id: str | None = None
    ) -> memory_pb2.DeleteRequest:
        request = memory_pb2.DeleteRequest(
            scope_type=self.scope_type, scope=self.scope, key=key, request_id=request_id or ""
        )
        if expected_version is not None:
            request.expected_version = expected_version
        return request

    def rollback(self, key: str, to_version: int) -> memory_pb2.RollbackRequest:
        return memory_pb2.RollbackRequest(
            scope_type=self.scope_type, scope=self.scope, key=key, to_version=to_version
        )

    def watch(self, prefix: str, from_revision: int | None) -> memory_pb2.WatchRequest:
        request = memory_pb2.WatchRequest(
            scope_type=self.scope_type, scope=self.scope, key_prefix=prefix
        )
        if from_revision is not None:
            request.from_revision = from_revision
        return request

    def purge(self, key: str, keep: int | None, dry_run: bool) -> memory_admin_pb2.PurgeRequest:
        request = memory_admin_pb2.PurgeRequest(
            scope_type=self.scope_type, scope=self.scope, key=key, dry_run=dry_run
        )
        if keep is not None:
            request.keep = keep
        return request

    def purge_scope(
        self, keep: int | None, include_deleted: bool, dry_run: bool
    ) -> memory_admin_pb2.PurgeScopeRequest:
        request = memory_admin_pb2.PurgeScopeRequest(
            scope_type=self.scope_type,
            scope=self.scope,
            include_deleted=include_deleted,
            dry_run=dry_run,
        )
        if keep is not None:
            request.keep = keep
        return request

    def compact(
        self,
        keys: tuple[str, ...],
        target_key: str,
        history: bool,
        instruction: str,
        model: str,
        max_tokens: int,
    ) -> memory_admin_pb2.CompactRequest:
        """One key goes as ``key`` (its target defaulting to itself on the
        server), several as ``keys``; the server checks the combinations."""
        if not keys:
            raise ValueError("compact needs at least one key")
        request = memory_admin_pb2.CompactRequest(
            scope_type=self.scope_type,
            scope=self.scope,
            target_key=target_key,
            source_mode=(
                memory_admin_pb2.SOURCE_MODE_HISTORY if history else memory_admin_pb2.SOURCE_MODE_CURRENT
            ),
            instruction=instruction,
            model=model,
            max_tokens=max_tokens,
        )
        if len(keys) == 1:
            request.key = keys[0]
        else:
            request.keys.extend(keys)
        return request

    def compaction_log(self, token: str) -> memory_admin_pb2.GetCompactionLogRequest:
        return memory_admin_pb2.GetCompactionLogRequest(
            scope_type=self.scope_type, scope=self.scope, page_size=PAGE, page_token=token
        )

    def set_retention(
        self, policy: memory_admin_pb2.RetentionPolicy, dry_run: bool
    ) -> memory_admin_pb2.SetRetentionRequest:
        return memory_admin_pb2.SetRetentionRequest(
            scope_type=self.scope_type, scope=self.scope, policy=policy, dry_run=dry_run
        )

    def get_retention(self) -> memory_admin_pb2.GetRetentionRequest:
        return memory_admin_pb2.GetRetentionRequest(scope_type=self.scope_type, scope=self.scope)

    def apply_retention(self, dry_run: bool) -> memory_admin_pb2.ApplyRetentionRequest:
        return memory_admin_pb2.ApplyRetentionRequest(
            scope_type=self.scope_type, scope=self.scope, dry_run=dry_run
        )


def forget_user(
    app: str, user: str, execution_ids: Iterable[str], dry_run: bool
) -> data_pb2.ForgetUserRequest:
    return data_pb2.ForgetUserRequest(
        app=app, user=user, execution_ids=list(execution_ids), dry_run=dry_run
    )


def export(
    scope_type: ScopeType | None, scope: str, session_id: str, app: str, user: str
) -> data_pb2.ExportRequest:
    if scope and scope_type is None:
        scope_type = "namespace"
    return data_pb2.ExportRequest(
        scope_type=choice("scope_type", SCOPE_TYPES, scope_type, memory_pb2.SCOPE_TYPE_UNSPECIFIED),
        scope=scope,
        session_id=session_id,
        app=app,
        user=user,
    )


#: Bytes of lines sent per import message, well under gRPC's 4 MiB.
IMPORT_BATCH_BYTES = 1 << 20


def import_batches(lines: Iterable[str]) -> Iterator[data_pb2.ImportRequest]:
    """The lines of an export as import messages of about a mebibyte."""
    batch: list[str] = []
    size = 0
    for line in lines:
        line = line.rstrip("\r\n")
        batch.append(line)
        size += len(line)
        if size >= IMPORT_BATCH_BYTES:
            yield data_pb2.ImportRequest(lines=batch)
            batch, size = [], 0
    if batch:
        yield data_pb2.ImportRequest(lines=batch)


def create_session(
    app: str,
    user: str,
    session_id: str | None,
    metadata: dict[str, Any] | None,
    request_id: str | None,
) -> sessions_pb2.CreateSessionRequest:
    """A CreateSession with its idempotency key: ``request_id``, or a new
    random one, so that retrying it after a lost reply finds the session
    the first try made instead of making another."""
    request = sessions_pb2.CreateSessionRequest(
        app=app, user=user, session_id=session_id or "", request_id=request_id or _new_key()
    )
    if metadata is not None:
        json_format.ParseDict(metadata, request.metadata)
    return request


def get_or_create_session(
    app: str, user: str, session_id: str | None, request_id: str | None
) -> sessions_pb2.GetOrCreateSessionRequest:
    """A GetOrCreateSession with its idempotency key (as
    :func:`create_session`), so that a retry of a try that created the
    session still answers ``created``."""
    return sessions_pb2.GetOrCreateSessionRequest(
        app=app, user=user, session_id=session_id or "", request_id=request_id or _new_key()
    )


def _new_key() -> str:
    return uuid.uuid4().hex


def new_episode(
    content: Any,
    *,
    type: str = "observation",
    id: str | None = None,
    agent: str | None = None,
    metadata: dict[str, Any] | None = None,
    source_node: str | None = None,
) -> episodes_pb2.NewEpisode:
    """An episode to append (for ``append_many``)."""
    episode = episodes_pb2.NewEpisode(
        id=id or "",
        type=type,
        agent=agent or "",
        content=to_value(content),
        source_node=source_node or "",
    )
    if metadata is not None:
        json_format.ParseDict(metadata, episode.metadata)
    return episode


def list_sessions(app: str, user: str, token: str) -> sessions_pb2.ListSessionsRequest:
    return sessions_pb2.ListSessionsRequest(app=app, user=user, page_size=PAGE, page_token=token)


def list_episodes(
    session_id: str, types: Iterable[str], after_seq: int, token: str
) -> episodes_pb2.ListEpisodesRequest:
    return episodes_pb2.ListEpisodesRequest(
        session_id=session_id,
        types=builtins.list(types),
        after_seq=after_seq,
        page_size=PAGE,
        page_token=token,
    )


def tail(
    session_id: str, user: str, app: str, types: builtins.list[str], cursor: int | None
) -> episodes_pb2.TailEpisodesRequest:
    request = episodes_pb2.TailEpisodesRequest(
        session_id=session_id, user=user, app=app, types=types
    )
    if cursor is not None:
        request.cursor = cursor
    return request


def search(
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
) -> search_pb2.SearchRequest:
    return search_pb2.SearchRequest(
        query=query,
        sources=[
            choice("sources", SOURCES, s, search_pb2.SEARCH_SOURCE_UNSPECIFIED) for s in sources
        ],
        mode=choice("mode", MODES, mode, search_pb2.SEARCH_MODE_UNSPECIFIED),
        limit=limit,
        scope_type=choice("scope_type", SCOPE_TYPES, scope_type, memory_pb2.SCOPE_TYPE_UNSPECIFIED),
        scope=scope,
        key_prefix=key_prefix,
        scope_prefix=scope_prefix,
        app=app,
        user=user,
        session_id=session_id,
        agent=agent,
        types=builtins.list(types),
        kind=choice("kind", KINDS, kind, consolidation_pb2.FACT_KIND_UNSPECIFIED),
        start_time=timestamp(start_time),
        end_time=timestamp(end_time),
        following_episodes=following_episodes,
    )


def rule(
    rule_id: str,
    filter: str,
    *,
    every_n_episodes: int | None,
    cron: str | None,
    emits: Iterable[str],
    kind: FactKind | None,
    confidence: float,
    enabled: bool,
    request_id: str | None,
) -> consolidation_pb2.CreateRuleRequest:
    """A CreateRule with its idempotency key (``request_id``, or a new
    random one)."""
    # The cadence is a oneof: setting both would keep the second silently.
    if every_n_episodes is not None and cron is not None:
        raise ValueError("a rule runs on every_n_episodes or on cron, not both")
    made = consolidation_pb2.ConsolidationRule(
        id=rule_id,
        filter=filter,
        then_emits=builtins.list(emits),
        kind=choice("kind", KINDS, kind, consolidation_pb2.FACT_KIND_UNSPECIFIED),
        confidence=confidence,
        enabled=enabled,
    )
    if every_n_episodes is not None:
        made.every_n_episodes = every_n_episodes
    if cron is not None:
        made.cron = cron
    return consolidation_pb2.CreateRuleRequest(rule=made, request_id=request_id or _new_key())


def list_rules(token: str) -> consolidation_pb2.ListRulesRequest:
    return consolidation_pb2.ListRulesRequest(page_size=PAGE, page_token=token)


def list_facts(
    app: str, user: str, kind: FactKind | None, token: str
) -> consolidation_pb2.ListFactsRequest:
    return consolidation_pb2.ListFactsRequest(
        app=app,
        user=user,
        kind=choice("kind", KINDS, kind, consolidation_pb2.FACT_KIND_UNSPECIFIED),
        page_size=PAGE,
        page_token=token,
    )


def tasks(session_id: str, app: str, user: str, token: str) -> working_memory_pb2.ListTasksRequest:
    return working_memory_pb2.ListTasksRequest(
        session_id=session_id, app=app, user=user, page_size=PAGE, page_token=token
    )


def fact_versions(fact_id: str, token: str) -> consolidation_pb2.GetFactRequest:
    return consolidation_pb2.GetFactRequest(fact_id=fact_id, page_size=PAGE, page_token=token)


def render(
    session_id: str, *, app: str, user: str, query: str, max_facts: int, max_events: int
) -> working_memory_pb2.RenderMemoryBlockRequest:
    return working_memory_pb2.RenderMemoryBlockRequest(
        session_id=session_id,
        app=app,
        user=user,
        query=query,
        max_facts=max_facts,
        max_events=max_events,
    )


def update_task(
    session_id: str,
    task_id: str,
    *,
    app: str,
    user: str,
    status: TaskStatus | None,
    subject: str | None,
    description: str | None,
) -> working_memory_pb2.UpdateTaskRequest:
    request = working_memory_pb2.UpdateTaskRequest(
        session_id=session_id,
        app=app,
        user=user,
        task_id=task_id,
        status=choice("status", TASK_STATUSES, status, working_memory_pb2.TASK_STATUS_UNSPECIFIED),
    )
    # Unset keeps the task's own; an empty string clears it.
    if subject is not None:
        request.subject = subject
    if description is not None:
        request.description = description
    return request


def create_task(
    session_id: str,
    subject: str,
    description: str,
    *,
    app: str,
    user: str,
    request_id: str | None,
) -> working_memory_pb2.CreateTaskRequest:
    """A CreateTask with its idempotency key (``request_id``, or a new
    random one), so that a retry after a lost reply adds no second task."""
    return working_memory_pb2.CreateTaskRequest(
        session_id=session_id,
        app=app,
        user=user,
        subject=subject,
        description=description,
        request_id=request_id or _new_key(),
    )


def remember(
    session_id: str,
    content: str,
    *,
    app: str,
    user: str,
    subject: str,
    predicate: str,
    object: str,
    request_id: str | None,
) -> working_memory_pb2.RememberRequest:
    """A Remember with its idempotency key (as :func:`create_task`)."""
    return working_memory_pb2.RememberRequest(
        session_id=session_id,
        app=app,
        user=user,
        content=content,
        subject=subject,
        predicate=predicate,
        object=object,
        request_id=request_id or _new_key(),
    )


def record_procedure(
    app: str, content: str, *, subject: str, predicate: str, request_id: str | None
) -> working_memory_pb2.RecordProcedureRequest:
    """A RecordProcedure with its idempotency key (as :func:`create_task`)."""
    return working_memory_pb2.RecordProcedureRequest(
        app=app,
        content=content,
        subject=subject,
        predicate=predicate,
        request_id=request_id or _new_key(),
    )


def snapshot(
    session_id: str, *, app: str, user: str, max_facts: int, max_events: int
) -> working_memory_pb2.GetSnapshotRequest:
    return working_memory_pb2.GetSnapshotRequest(
        session_id=session_id, app=app, user=user, max_facts=max_facts, max_events=max_events
    )


def call_tool(
    session_id: str, name: str, arguments: Any, *, app: str, user: str, request_id: str | None
) -> working_memory_pb2.CallToolRequest:
    """A tool call as the LLM emitted it: ``arguments`` a dict, or the JSON
    text of one as model APIs hand it over (the server parses it, and
    answers text that is not JSON as an error for the model to read); keyed
    by ``request_id`` (the tool call's own id is a good one), or a new
    random one."""
    if isinstance(arguments, bytes):
        arguments = arguments.decode()
    request = working_memory_pb2.CallToolRequest(
        session_id=session_id, app=app, user=user, name=name, request_id=request_id or _new_key()
    )
    if arguments is not None:
        request.arguments.CopyFrom(to_value(arguments))
    return request


@dataclass
class Resume:
    """Where a live stream (tail, watch) stands, and whether a broken one
    reconnects: from the last position it delivered, so nothing is missed
    or repeated."""

    position: int | None
    reconnect: bool = True
    max_reconnects: int | None = None
    #: The ErrorInfo metadata key holding where a stream started "now" stood.
    resume_key: str = "resume_cursor"
    failures: int = 0
    delay: float = RECONNECT_DELAY[0]

    def delivered(self, position: int) -> None:
        self.position = position
        self.failures, self.delay = 0, RECONNECT_DELAY[0]

    def broke(self, error: EngramError) -> float:
        """How long to wait before reconnecting after ``error``; raises it
        when the stream should not resume."""
        if not isinstance(error, (Unavailable, ResourceExhausted)):
            raise error
        if not self.reconnect or (
            self.max_reconnects is not None and self.failures >= self.max_reconnects
        ):
            raise error
        if isinstance(error, ResourceExhausted) and error.reason != "CONSUMER_TOO_SLOW":
            raise error
        if self.position is None and self.resume_key in error.metadata:
            # Started "now" and saw nothing yet: resume where the server
            # says the stream stood.
            self.position = int(error.metadata[self.resume_key])
        self.failures += 1
        wait = self.delay
        self.delay = min(self.delay * 2, RECONNECT_DELAY[1])
        return wait
