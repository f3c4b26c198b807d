"""What the client's calls return: frozen dataclasses read from the
server's messages, and the conversion of protobuf values to Python ones."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from google.protobuf import json_format, struct_pb2, timestamp_pb2

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


def _ints(obj: Any) -> Any:
    # JSON numbers travel as doubles; give back the integers people stored.
    if isinstance(obj, float) and obj.is_integer() and abs(obj) <= 2**53:
        return int(obj)
    if isinstance(obj, list):
        return [_ints(item) for item in obj]
    if isinstance(obj, dict):
        return {key: _ints(item) for key, item in obj.items()}
    return obj


def from_value(value: struct_pb2.Value) -> Any:
    """A protobuf Value as a Python value."""
    return _ints(json_format.MessageToDict(value))


def from_struct(value: struct_pb2.Struct) -> dict[str, Any]:
    result = _ints(json_format.MessageToDict(value))
    return result if isinstance(result, dict) else {}


def _time(ts: timestamp_pb2.Timestamp) -> datetime:
    return datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, tz=timezone.utc)


@dataclass(frozen=True)
class Entry:
    """One version of a key."""

    key: str
    version: int
    value: Any
    deleted: bool
    scope: str
    scope_type: str
    execution_id: str
    create_time: datetime

    @staticmethod
    def from_proto(entry: memory_pb2.MemoryEntry) -> Entry:
        return Entry(
            key=entry.key,
            version=entry.version,
            value=from_value(entry.value) if entry.HasField("value") else None,
            deleted=entry.deleted,
            scope=entry.scope,
            scope_type=memory_pb2.ScopeType.Name(entry.scope_type),
            execution_id=entry.execution_id,
            create_time=_time(entry.create_time),
        )


@dataclass(frozen=True)
class Forgotten:
    """What :meth:`Engram.forget_user` deleted (or, in a dry run, would)."""

    sessions: int
    episodes: int
    facts: int
    working_items: int
    execution_scopes: int
    memory_versions: int
    dry_run: bool
    #: The audit skeleton's key in the namespace scope ``engram.forgotten``.
    audit_key: str

    @staticmethod
    def from_proto(response: data_pb2.ForgetUserResponse) -> Forgotten:
        return Forgotten(
            sessions=response.sessions,
            episodes=response.episodes,
            facts=response.facts,
            working_items=response.working_items,
            execution_scopes=response.execution_scopes,
            memory_versions=response.memory_versions,
            dry_run=response.dry_run,
            audit_key=response.audit_key,
        )


@dataclass(frozen=True)
class Imported:
    """What :meth:`Engram.import_lines` wrote and found in place, by record
    kind (``memory_version``, ``session``, ``episode``, ...)."""

    imported: dict[str, int]
    unchanged: dict[str, int]
    #: Lines read, the header and blank lines included.
    lines: int

    @staticmethod
    def from_proto(response: data_pb2.ImportResponse) -> Imported:
        return Imported(
            imported=dict(response.imported),
            unchanged=dict(response.unchanged),
            lines=response.lines,
        )


@dataclass(frozen=True)
class Snapshot:
    """A scope as it was at a point (:meth:`Memory.snapshot`)."""

    #: The entries live then, in key order.
    entries: list[Entry]
    #: The keys whose value then has been purged since.
    purged_keys: list[str]


@dataclass(frozen=True)
class Fork:
    """What :meth:`Memory.fork` copied."""

    keys_copied: int
    #: The revision the source was read at.
    revision: int
    #: The reserved key of the fork's audit record in the new scope.
    audit_key: str

    @staticmethod
    def from_proto(response: memory_pb2.ForkScopeResponse) -> Fork:
        return Fork(response.keys_copied, response.revision, response.audit_key)


@dataclass(frozen=True)
class ScopeSummary:
    """One scope of the tenant (:meth:`Memory.scopes`)."""

    scope_type: str
    scope: str
    #: Keys with a live value (the audit records not counted).
    entry_count: int
    #: With ``as_of``: keys whose value then has been purged since.
    purged_count: int

    @staticmethod
    def from_proto(summary: memory_pb2.ScopeSummary) -> ScopeSummary:
        return ScopeSummary(
            scope_type=memory_pb2.ScopeType.Name(summary.scope_type),
            scope=summary.scope,
            entry_count=summary.entry_count,
            purged_count=summary.purged_count,
        )


@dataclass(frozen=True)
class AuditRecord:
    """One record of a scope's maintenance audit trail
    (:meth:`Memory.compaction_log`); the fields an operation does not use
    are empty."""

    #: ``compact``, ``purge``, ``retention``, ``rollback``, ``fork`` or ``forget``.
    operation: str
    scope_type: str
    scope: str
    create_time: datetime
    #: The reserved key the record is stored under.
    audit_key: str
    #: The keys read (compact) or purged (purge).
    source_keys: list[str]
    #: The versions read, in the order of ``source_keys`` (compact).
    source_versions: list[int]
    #: Where the summary went (compact).
    target_key: str
    target_version: int
    instruction: str
    model: str
    #: Keys that lost versions (purge, retention) or were copied (fork).
    keys_affected: int
    versions_deleted: int
    #: The purge's ``keep``, or the policy's ``keep_versions``; None when
    #: every version went.
    keep: int | None
    #: What was deleted by kind (forget).
    counts: dict[str, int]

    @staticmethod
    def from_proto(record: memory_admin_pb2.CompactionRecord) -> AuditRecord:
        return AuditRecord(
            operation=record.operation,
            scope_type=memory_pb2.ScopeType.Name(record.scope_type),
            scope=record.scope,
            create_time=_time(record.create_time),
            audit_key=record.audit_key,
            source_keys=list(record.source_keys),
            source_versions=list(record.source_versions),
            target_key=record.target_key,
            target_version=record.target_version,
            instruction=record.instruction,
            model=record.model,
            keys_affected=record.keys_affected,
            versions_deleted=record.versions_deleted,
            keep=record.keep if record.HasField("keep") else None,
            counts=dict(record.counts),
        )


_Reclaimed = (
    memory_admin_pb2.PurgeResponse
    | memory_admin_pb2.PurgeScopeResponse
    | memory_admin_pb2.ApplyRetentionResponse
)


@dataclass(frozen=True)
class Purged:
    """What a purge or a retention run deleted (or, in a dry run, would)."""

    versions_deleted: int
    keys_affected: int
    #: The audit record written; None in a dry run or when nothing went.
    record: AuditRecord | None

    @staticmethod
    def from_proto(response: _Reclaimed) -> Purged:
        record = AuditRecord.from_proto(response.record) if response.HasField("record") else None
        return Purged(response.versions_deleted, response.keys_affected, record)

    @staticmethod
    def previewed(response: memory_admin_pb2.SetRetentionResponse) -> Purged:
        """What a policy's dry run says it would delete."""
        return Purged(response.versions_to_delete, response.keys_to_affect, None)


@dataclass(frozen=True)
class Compacted:
    """What :meth:`Memory.compact` wrote and read."""

    #: The summary: a new version of the target key.
    entry: Entry
    #: The source versions it was made from, values included.
    sources: list[Entry]
    record: AuditRecord

    @staticmethod
    def from_proto(response: memory_admin_pb2.CompactResponse) -> Compacted:
        return Compacted(
            entry=Entry.from_proto(response.entry),
            sources=[Entry.from_proto(source) for source in response.sources],
            record=AuditRecord.from_proto(response.record),
        )


@dataclass(frozen=True)
class Retention:
    """A scope's retention policy and its schedule (a rule that is None is off)."""

    scope_type: str
    scope: str
    keep_versions: int | None
    max_age: timedelta | None
    tombstone_grace: timedelta | None
    #: When the server applies it next.
    next_run_time: datetime
    #: None before the first run.
    last_run_time: datetime | None
    last_versions_deleted: int

    @staticmethod
    def from_proto(retention: memory_admin_pb2.Retention) -> Retention:
        policy = retention.policy
        return Retention(
            scope_type=memory_pb2.ScopeType.Name(retention.scope_type),
            scope=retention.scope,
            keep_versions=policy.keep_versions if policy.HasField("keep_versions") else None,
            max_age=policy.max_age.ToTimedelta() if policy.HasField("max_age") else None,
            tombstone_grace=(
                policy.tombstone_grace.ToTimedelta() if policy.HasField("tombstone_grace") else None
            ),
            next_run_time=_time(retention.next_run_time),
            last_run_time=(
                _time(retention.last_run_time) if retention.HasField("last_run_time") else None
            ),
            last_versions_deleted=retention.last_versions_deleted,
        )


@dataclass(frozen=True)
class Reindexed:
    """What :meth:`Memory.reindex` found and (with ``apply``) wrote."""

    versions_scanned: int
    tags_added: int
    #: What could not be fixed, e.g. executions whose flow is unknown.
    issues: list[str]
    applied: bool

    @staticmethod
    def from_proto(response: memory_admin_pb2.ReindexResponse) -> Reindexed:
        return Reindexed(
            response.versions_scanned, response.tags_added, list(response.issues), response.applied
        )


@dataclass(frozen=True)
class Session:
    id: str
    app: str
    user: str
    metadata: dict[str, Any]
    episode_count: int
    last_seq: int
    ended: bool
    create_time: datetime
    #: When the session last changed (an append, an end).
    update_time: datetime

    @staticmethod
    def from_proto(session: sessions_pb2.Session) -> Session:
        return Session(
            id=session.id,
            app=session.app,
            user=session.user,
            metadata=from_struct(session.metadata),
            episode_count=session.episode_count,
            last_seq=session.last_seq,
            ended=session.HasField("end_time"),
            create_time=_time(session.create_time),
            update_time=_time(session.update_time),
        )


@dataclass(frozen=True)
class Episode:
    id: str
    session_id: str
    seq: int
    cursor: int
    type: str
    content: Any
    agent: str
    user: str
    app: str
    metadata: dict[str, Any] = field(default_factory=dict)
    timestamp: datetime | None = None

    @staticmethod
    def from_proto(episode: episodes_pb2.Episode) -> Episode:
        return Episode(
            id=episode.id,
            session_id=episode.session_id,
            seq=episode.seq,
            cursor=episode.cursor,
            type=episode.type,
            content=from_value(episode.content),
            agent=episode.agent,
            user=episode.user,
            app=episode.app,
            metadata=from_struct(episode.metadata),
            timestamp=_time(episode.timestamp),
        )


@dataclass(frozen=True)
class FactVersion:
    """One version of a fact with its lineage: what wrote it (``source``: a
    rule id, ``remember``, ``delta`` or ``delete``) from which episodes.
    ``deleted`` marks the tombstone a delete wrote."""

    version: int
    deleted: bool
    subject: str
    predicate: str
    object: str
    content: Any
    confidence: float
    source: str
    source_episode_ids: list[str]
    channels: list[str]
    create_time: datetime

    @staticmethod
    def from_proto(version: consolidation_pb2.FactVersion) -> FactVersion:
        return FactVersion(
            version=version.version,
            deleted=version.deleted,
            subject=version.subject,
            predicate=version.predicate,
            object=version.object,
            content=from_value(version.content) if version.HasField("content") else None,
            confidence=version.confidence,
            source=version.lineage.source,
            source_episode_ids=list(version.lineage.source_episode_ids),
            channels=list(version.channels),
            create_time=_time(version.create_time),
        )


@dataclass(frozen=True)
class Fact:
    """A fact at its newest version; ``deleted`` once it was deleted (only
    :meth:`Facts.get` returns those)."""

    id: str
    app: str
    user: str
    kind: str
    subject: str
    predicate: str
    object: str
    content: Any
    version: int
    deleted: bool = False

    @staticmethod
    def from_proto(fact: consolidation_pb2.Fact) -> Fact:
        current = fact.current
        return Fact(
            id=fact.id,
            app=fact.app,
            user=fact.user,
            kind=consolidation_pb2.FactKind.Name(fact.kind).removeprefix("FACT_KIND_").lower(),
            subject=current.subject,
            predicate=current.predicate,
            object=current.object,
            content=from_value(current.content) if current.HasField("content") else None,
            version=current.version,
            deleted=current.deleted,
        )


@dataclass(frozen=True)
class Applied:
    """What :meth:`Facts.apply` wrote: counts, and the facts written in
    delta order."""

    facts_added: int
    facts_updated: int
    facts_deleted: int
    fact_ids: list[str]

    @staticmethod
    def from_proto(response: consolidation_pb2.ApplyDeltasResponse) -> Applied:
        return Applied(
            facts_added=response.facts_added,
            facts_updated=response.facts_updated,
            facts_deleted=response.facts_deleted,
            fact_ids=list(response.fact_ids),
        )


@dataclass(frozen=True)
class Rule:
    """A consolidation rule: which episodes it promotes into facts, on
    which cadence (``every_n_episodes`` or ``cron``), and how far its runs
    have read (``watermark``, an episode cursor)."""

    id: str
    filter: str
    every_n_episodes: int | None
    cron: str | None
    emits: list[str]
    kind: str
    confidence: float
    enabled: bool
    watermark: int
    episodes_promoted: int
    create_time: datetime
    last_run_time: datetime | None

    @staticmethod
    def from_proto(rule: consolidation_pb2.ConsolidationRule) -> Rule:
        cadence = rule.WhichOneof("cadence")
        return Rule(
            id=rule.id,
            filter=rule.filter,
            every_n_episodes=rule.every_n_episodes if cadence == "every_n_episodes" else None,
            cron=rule.cron if cadence == "cron" else None,
            emits=list(rule.then_emits),
            kind=consolidation_pb2.FactKind.Name(rule.kind).removeprefix("FACT_KIND_").lower(),
            confidence=rule.confidence,
            enabled=rule.enabled,
            watermark=rule.watermark,
            episodes_promoted=rule.episodes_promoted,
            create_time=_time(rule.create_time),
            last_run_time=_time(rule.last_run_time) if rule.HasField("last_run_time") else None,
        )


@dataclass(frozen=True)
class RuleRun:
    """What a run of a rule saw and wrote. ``deltas`` are the generated
    ``MemoryDelta`` messages, one per matching episode in cursor order;
    ``more`` says episodes wait past the run's ``max_episodes``."""

    episodes_scanned: int
    episodes_matched: int
    watermark: int
    more: bool
    facts_added: int
    facts_updated: int
    facts_deleted: int
    fact_ids: list[str]
    deltas: list[consolidation_pb2.MemoryDelta]

    @staticmethod
    def from_proto(response: consolidation_pb2.RunRuleResponse) -> RuleRun:
        return RuleRun(
            episodes_scanned=response.episodes_scanned,
            episodes_matched=response.episodes_matched,
            watermark=response.watermark,
            more=response.more,
            facts_added=response.facts_added,
            facts_updated=response.facts_updated,
            facts_deleted=response.facts_deleted,
            fact_ids=list(response.fact_ids),
            deltas=list(response.deltas),
        )


@dataclass(frozen=True)
class Hit:
    """One item :meth:`Engram.search` found: exactly one of ``entry``,
    ``fact`` and ``episode`` is set, as ``source`` says."""

    score: float
    source: str
    snippet: str
    entry: Entry | None = None
    fact: Fact | None = None
    episode: Episode | None = None

    @staticmethod
    def from_proto(hit: search_pb2.SearchHit) -> Hit:
        which = hit.WhichOneof("item")
        return Hit(
            score=hit.score,
            source=search_pb2.SearchSource.Name(hit.source).removeprefix("SEARCH_SOURCE_").lower(),
            snippet=hit.snippet,
            entry=Entry.from_proto(hit.entry) if which == "entry" else None,
            fact=Fact.from_proto(hit.fact) if which == "fact" else None,
            episode=Episode.from_proto(hit.episode) if which == "episode" else None,
        )


@dataclass(frozen=True)
class MemoryBlock:
    """The two prompt sections :meth:`Working.render` returns: the MEMORY
    block (goal, todos, facts, procedures, recent activity) and the
    instructions that tell the agent how it keeps its memory."""

    memory_block: str
    instructions: str

    @staticmethod
    def from_proto(response: working_memory_pb2.RenderMemoryBlockResponse) -> MemoryBlock:
        return MemoryBlock(memory_block=response.memory_block, instructions=response.instructions)


@dataclass(frozen=True)
class Task:
    """One entry of a session's todo list; ``status`` is ``pending``,
    ``in_progress``, ``completed`` or ``blocked``."""

    id: str
    subject: str
    description: str
    status: str
    create_time: datetime
    update_time: datetime

    @staticmethod
    def from_proto(task: working_memory_pb2.Task) -> Task:
        return Task(
            id=task.id,
            subject=task.subject,
            description=task.description,
            status=working_memory_pb2.TaskStatus.Name(task.status)
            .removeprefix("TASK_STATUS_")
            .lower(),
            create_time=_time(task.create_time),
            update_time=_time(task.update_time),
        )


@dataclass(frozen=True)
class CachedFile:
    """One entry of a session's content cache (``content`` is empty in a
    :class:`WorkingSnapshot`)."""

    path: str
    content: str
    bytes: int
    update_time: datetime

    @staticmethod
    def from_proto(file: working_memory_pb2.CachedFile) -> CachedFile:
        return CachedFile(
            path=file.path, content=file.content, bytes=file.bytes, update_time=_time(file.update_time)
        )


@dataclass(frozen=True)
class Cached:
    """What :meth:`Working.cache` stored, and the paths it evicted to make
    room, least recently cached first."""

    file: CachedFile
    evicted: list[str]

    @staticmethod
    def from_proto(response: working_memory_pb2.CacheContentResponse) -> Cached:
        return Cached(file=CachedFile.from_proto(response.file), evicted=list(response.evicted))


@dataclass(frozen=True)
class WorkingSnapshot:
    """Everything a session's MEMORY block is made of."""

    goal: str
    tasks: list[Task]
    facts: list[Fact]
    procedures: list[Fact]
    recent: list[Episode]
    cache: list[CachedFile]

    @staticmethod
    def from_proto(response: working_memory_pb2.GetSnapshotResponse) -> WorkingSnapshot:
        return WorkingSnapshot(
            goal=response.goal,
            tasks=[Task.from_proto(t) for t in response.tasks],
            facts=[Fact.from_proto(f) for f in response.facts],
            procedures=[Fact.from_proto(f) for f in response.procedures],
            recent=[Episode.from_proto(e) for e in response.recent],
            cache=[CachedFile.from_proto(c) for c in response.cache],
        )


@dataclass(frozen=True)
class Tool:
    """An action an LLM can call, as a JSON-schema tool definition: hand
    ``name``, ``description`` and ``parameters`` to the model's tool list."""

    name: str
    aliases: list[str]
    description: str
    parameters: dict[str, Any]

    @staticmethod
    def from_proto(tool: working_memory_pb2.ToolDefinition) -> Tool:
        return Tool(
            name=tool.name,
            aliases=list(tool.aliases),
            description=tool.description,
            parameters=from_struct(tool.parameters),
        )


@dataclass(frozen=True)
class ToolResult:
    """What a tool call returns, to hand back to the LLM as the tool's
    result. Bad arguments are not raised: ``is_error`` is set and
    ``result`` is ``{"error": "..."}``, so the model can read it and retry."""

    result: dict[str, Any]
    is_error: bool

    @staticmethod
    def from_proto(response: working_memory_pb2.CallToolResponse) -> ToolResult:
        return ToolResult(result=from_struct(response.result), is_error=response.is_error)
