"""Python client for Engram: durable memory for AI agents, over gRPC.

    from engram_client import Engram

    with Engram("localhost:50051") as client:
        client.memory.configure("customer_profiles", "namespace")
        client.memory.set("user_42/theme", {"mode": "dark"})
        client.memory.get("user_42/theme")            # {'mode': 'dark'}
        client.episodes.append("chat-1", "Hello!", type="user_message",
                               app="support-bot", user="alice")
        for episode in client.episodes.tail(app="support-bot", cursor=0):
            ...
        client.search("deployment setup", user="alice", sources=["episodes"])
        client.working.render("chat-1", query="deployment setup").memory_block
        client.working.create_task("chat-1", "Read the deploy logs")
        for fact in client.facts.list(app="support-bot", user="alice"):
            ...
        client.rules.create("prefs", "metadata.subject:*", every_n_episodes=5)

Maintenance is on ``client.memory`` too (``purge``, ``compact``,
``set_retention``, ``compaction_log``, ``scopes``), and
``client.sessions.cleanup`` deletes idle sessions.
A consolidator of your own sends facts through ``client.facts.apply``
with deltas from ``engram_client.deltas``. Every service's generated
stubs are in ``engram_client.v1`` and on ``client.stubs``; errors are
:class:`EngramError` subclasses carrying the server's stable ``reason``.
"""

from . import deltas
from ._client import Engram, Stubs
from ._errors import (
    AlreadyExists,
    Conflict,
    EngramError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from ._requests import to_value
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
    Fork,
    Forgotten,
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

__all__ = [
    "AlreadyExists",
    "Applied",
    "AuditRecord",
    "Cached",
    "CachedFile",
    "Compacted",
    "Conflict",
    "Engram",
    "EngramError",
    "Entry",
    "Episode",
    "FailedPrecondition",
    "Fact",
    "FactVersion",
    "Fork",
    "Forgotten",
    "Hit",
    "Imported",
    "InvalidArgument",
    "MemoryBlock",
    "NotFound",
    "PermissionDenied",
    "Purged",
    "Reindexed",
    "ResourceExhausted",
    "Retention",
    "Rule",
    "RuleRun",
    "ScopeSummary",
    "Session",
    "Snapshot",
    "Stubs",
    "Task",
    "Tool",
    "ToolResult",
    "Unauthenticated",
    "Unavailable",
    "WorkingSnapshot",
    "deltas",
    "from_value",
    "to_value",
]
