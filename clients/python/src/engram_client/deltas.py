"""Deltas for :meth:`engram_client.Engram.facts`'s ``apply``: what a
consolidator of your own (an LLM that reads a session's episodes, say)
proposes to change in the facts, each with where it comes from.

    from engram_client import deltas

    made = deltas.Provenance(["e17", "e18"], rule_id="llm-extractor", confidence=0.8)
    client.facts.apply([
        deltas.add("support-bot", "alice", "alice prefers tea", made,
                   subject="alice", predicate="prefers", object="tea"),
        deltas.delete("support-bot", "alice", [old_fact_id], made),
    ])

The server applies a list in order and all or nothing, and refuses a
delta whose provenance lacks a part (``InvalidArgument``, reason
``MISSING_PROVENANCE``). A dry run's deltas (``client.rules.run(...,
dry_run=True).deltas``) are the same messages and can be applied as they
are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ._requests import KINDS, FactKind, choice, timestamp, to_value
from .v1 import consolidation_pb2

__all__ = ["Provenance", "add", "delete", "noop", "update"]


@dataclass(frozen=True)
class Provenance:
    """Where a delta comes from: the episodes it was made from (at least
    one), the rule (or consolidator) that made it, how sure it is (above 0,
    at most 1), and when (now, unless given)."""

    source_episode_ids: list[str]
    rule_id: str
    confidence: float = 1.0
    promotion_ts: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    def to_proto(self) -> consolidation_pb2.DeltaProvenance:
        return consolidation_pb2.DeltaProvenance(
            source_episode_ids=list(self.source_episode_ids),
            promotion_ts=timestamp(self.promotion_ts),
            rule_id=self.rule_id,
            confidence=self.confidence,
        )


def add(
    app: str,
    user: str,
    content: Any,
    provenance: Provenance,
    *,
    kind: FactKind | None = None,
    subject: str = "",
    predicate: str = "",
    object: str = "",
    channels: Iterable[str] = (),
) -> consolidation_pb2.MemoryDelta:
    """A new fact of ``app`` and ``user`` (empty for a procedural, app-wide
    one); ``content`` is any JSON."""
    payload = consolidation_pb2.FactPayload(
        app=app,
        user=user,
        kind=choice("kind", KINDS, kind, consolidation_pb2.FACT_KIND_UNSPECIFIED),
        subject=subject,
        predicate=predicate,
        object=object,
        content=to_value(content),
        channels=list(channels),
    )
    return consolidation_pb2.MemoryDelta(
        add=consolidation_pb2.AddDelta(fact_payload=payload, provenance=provenance.to_proto())
    )


def update(
    replaces: Iterable[str],
    app: str,
    user: str,
    content: Any,
    provenance: Provenance,
    *,
    kind: FactKind | None = None,
    subject: str = "",
    predicate: str = "",
    object: str = "",
    channels: Iterable[str] = (),
) -> consolidation_pb2.MemoryDelta:
    """A new version of the first live fact ``replaces`` names (fact ids, or
    ids of episodes facts came from); any other is merged into it, and with
    none found the update adds a fact."""
    new = add(
        app, user, content, provenance,
        kind=kind, subject=subject, predicate=predicate, object=object, channels=channels,
    ).add
    return consolidation_pb2.MemoryDelta(
        update=consolidation_pb2.UpdateDelta(
            fact_payload=new.fact_payload, replaces=list(replaces), provenance=new.provenance
        )
    )


def delete(
    app: str, user: str, replaces: Iterable[str], provenance: Provenance
) -> consolidation_pb2.MemoryDelta:
    """Tombstones the facts of ``app`` and ``user`` that ``replaces``
    names (fact ids, or ids of episodes facts came from)."""
    return consolidation_pb2.MemoryDelta(
        delete=consolidation_pb2.DeleteDelta(
            app=app, user=user, replaces=list(replaces), provenance=provenance.to_proto()
        )
    )


def noop(provenance: Provenance) -> consolidation_pb2.MemoryDelta:
    """Records that the source episodes were seen and deliberately not
    promoted."""
    return consolidation_pb2.MemoryDelta(
        noop=consolidation_pb2.NoopDelta(provenance=provenance.to_proto())
    )
