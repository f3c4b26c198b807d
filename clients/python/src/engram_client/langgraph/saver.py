"""LangGraph checkpoints in Engram: ``EngramSaver``, a ``BaseCheckpointSaver``.

    from engram_client.langgraph import EngramSaver

    saver = EngramSaver("engram:50051", token)
    graph = builder.compile(checkpointer=saver)
    await graph.ainvoke(inputs, {"configurable": {"thread_id": "chat-1"}})

Install with ``pip install engram-client[langgraph]``.

Everything lives in one memory scope (namespace ``langgraph`` unless
``scope=`` says otherwise), so it is readable from grpcurl and the CLI too.
Keys are ``t/<thread>/<checkpoint_ns>/c/<checkpoint>`` for a checkpoint
(its channel values, metadata and parent) and
``t/<thread>/<checkpoint_ns>/w/<checkpoint>/<task>/<idx>`` for a pending
write. Identifiers are escaped into Engram's key alphabet (``_XX`` per
byte outside ``[A-Za-z0-9.-]``, a lone ``_`` for an empty one), and a
checkpoint's id is stored with each hex digit complemented, so that key
order is newest first: the latest checkpoint is the first key of its
prefix. Values hold LangGraph's typed serialization, base64-encoded.

Each checkpoint's record holds all its channel values (they are not shared
between checkpoints as blobs are in the Postgres saver), so one record must
fit the server's value limit (``ENGRAM_MAX_VALUE_BYTES``). Deleting a thread
or a run writes tombstones: the data is gone for LangGraph, and its history
stays in Engram until an admin purges the scope.

Every operation is written once, as a plan of store operations that a
blocking and an asyncio driver carry out (``_plans``), so the sync and
async methods cannot drift apart.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from .. import _plans
from .._results import Entry
from .._connect import Clients, Target
from .._keys import escape, unescape

T = TypeVar("T")


# --- Keys -------------------------------------------------------------------

_FLIP = str.maketrans("0123456789abcdef", "fedcba9876543210")


def _newest_first(checkpoint_id: str) -> str:
    """A checkpoint id as a key segment that sorts newest first (LangGraph's
    ids are time-ordered UUIDs: complementing each hex digit reverses their
    order)."""
    return escape(checkpoint_id.lower().translate(_FLIP))


def _thread(thread_id: str) -> str:
    return f"t/{escape(thread_id)}/"


def _namespace(thread_id: str, checkpoint_ns: str) -> str:
    return f"{_thread(thread_id)}{escape(checkpoint_ns)}/"


def _checkpoint_key(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> str:
    return f"{_namespace(thread_id, checkpoint_ns)}c/{_newest_first(checkpoint_id)}"


def _writes_prefix(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> str:
    return f"{_namespace(thread_id, checkpoint_ns)}w/{_newest_first(checkpoint_id)}/"


def _typed(serialized: tuple[str, bytes]) -> dict[str, str]:
    kind, data = serialized
    return {"type": kind, "data": base64.b64encode(data).decode()}


def _untyped(value: dict[str, str]) -> tuple[str, bytes]:
    return value["type"], base64.b64decode(value["data"])


class EngramSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer on an Engram server (see the module doc).

    Built from ``target``, ``token`` and keyword options as
    :class:`engram_client.Engram` is, or from a client of either flavour.
    The blocking client serves the sync methods, an asyncio client (one per
    event loop) the async ones.
    """

    def __init__(
        self,
        target: Target,
        token: str | None = None,
        *,
        scope: str = "langgraph",
        serde: SerializerProtocol | None = None,
        **client_options: Any,
    ) -> None:
        super().__init__(serde=serde)
        self._clients = Clients(target, token, client_options)
        self.scope = scope

    def _run(self, plan: _plans.Plan[T]) -> T:
        return _plans.run(self._clients.sync(), plan)

    async def _arun(self, plan: _plans.Plan[T]) -> T:
        return await _plans.arun(self._clients.aio(), plan)

    # --- plans ------------------------------------------------------------

    def _tuple(
        self, thread_id: str, checkpoint_ns: str, record: dict[str, Any], writes: list[Entry]
    ) -> CheckpointTuple:
        checkpoint_id = record["checkpoint_id"]
        parent = record.get("parent_checkpoint_id")
        stored = [w.value for w in writes]
        stored.sort(key=lambda w: writes_sort_key(w["task_path"], w["task_id"], w["idx"]))

        def config(cid: str) -> RunnableConfig:
            return {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": checkpoint_ns,
                    "checkpoint_id": cid,
                }
            }

        return CheckpointTuple(
            config=config(checkpoint_id),
            checkpoint=self.serde.loads_typed(_untyped(record["checkpoint"])),
            metadata=self.serde.loads_typed(_untyped(record["metadata"])),
            parent_config=config(parent) if parent else None,
            pending_writes=[
                (w["task_id"], w["channel"], self.serde.loads_typed(_untyped(w["value"])))
                for w in stored
            ],
        )

    def _get_tuple(self, config: RunnableConfig) -> _plans.Plan[CheckpointTuple | None]:
        thread_id = str(config["configurable"]["thread_id"])
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            entry = yield _plans.Read(self.scope, _checkpoint_key(thread_id, checkpoint_ns, checkpoint_id))
        else:
            entry = yield _plans.First(self.scope, f"{_namespace(thread_id, checkpoint_ns)}c/")
        if entry is None:
            return None
        record = entry.value
        writes = yield _plans.Scan(self.scope, _writes_prefix(thread_id, checkpoint_ns, record["checkpoint_id"]))
        return self._tuple(thread_id, checkpoint_ns, record, writes)

    def _list(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> _plans.Plan[list[CheckpointTuple]]:
        configurable = config["configurable"] if config else {}
        thread_id = configurable.get("thread_id")
        checkpoint_ns = configurable.get("checkpoint_ns")
        if thread_id is None:
            prefix = "t/"
        elif checkpoint_ns is None:
            prefix = _thread(str(thread_id))
        else:
            prefix = _namespace(str(thread_id), checkpoint_ns)
        entries: list[Entry] = yield _plans.Scan(self.scope, prefix)
        wanted_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        records: list[tuple[str, str, dict[str, Any]]] = []
        writes: dict[tuple[str, str, str], list[Entry]] = {}
        for entry in entries:
            head, kind, rest = _split(entry.key)
            thread, ns = head[2:-1].split("/")
            where = (unescape(thread), unescape(ns))
            if kind == "c":
                records.append((*where, entry.value))
            else:
                writes.setdefault((*where, rest.split("/", 1)[0]), []).append(entry)
        # Newest first across threads and namespaces, as LangGraph lists.
        records.sort(key=lambda r: r[2]["checkpoint_id"], reverse=True)
        found: list[CheckpointTuple] = []
        for thread, ns, record in records:
            cid = record["checkpoint_id"]
            if wanted_id and cid != wanted_id:
                continue
            if before_id and cid >= before_id:
                continue
            if limit is not None and len(found) >= limit:
                break
            metadata = self.serde.loads_typed(_untyped(record["metadata"]))
            if filter and not all(metadata.get(k) == v for k, v in filter.items()):
                continue
            group = writes.get((thread, ns, _newest_first(cid)), [])
            found.append(self._tuple(thread, ns, record, group))
        return found

    def _put(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> _plans.Plan[RunnableConfig]:
        thread_id = str(config["configurable"]["thread_id"])
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        stored_metadata = get_checkpoint_metadata(config, metadata)
        record = {
            "checkpoint_id": checkpoint["id"],
            "parent_checkpoint_id": config["configurable"].get("checkpoint_id"),
            "run_id": stored_metadata.get("run_id"),
            "checkpoint": _typed(self.serde.dumps_typed(checkpoint)),
            "metadata": _typed(self.serde.dumps_typed(stored_metadata)),
        }
        yield _plans.Write(self.scope, _checkpoint_key(thread_id, checkpoint_ns, checkpoint["id"]), record)
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> _plans.Plan[None]:
        thread_id = str(config["configurable"]["thread_id"])
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        prefix = _writes_prefix(thread_id, checkpoint_ns, config["configurable"]["checkpoint_id"])
        for position, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, position)
            record = {
                "task_id": task_id,
                "task_path": task_path,
                "idx": idx,
                "channel": channel,
                "value": _typed(self.serde.dumps_typed(value)),
            }
            # A regular write is kept as first stored (a retried task writes
            # the same); special ones (errors, interrupts) are replaced.
            yield _plans.Write(self.scope, f"{prefix}{escape(task_id)}/{idx}", record, create=idx >= 0)

    def _delete_thread(self, thread_id: str) -> _plans.Plan[None]:
        entries: list[Entry] = yield _plans.Scan(self.scope, _thread(thread_id))
        for entry in entries:
            yield _plans.Remove(self.scope, entry.key)

    def _delete_for_runs(self, run_ids: Sequence[str]) -> _plans.Plan[None]:
        runs = set(run_ids)
        if not runs:
            return
        entries: list[Entry] = yield _plans.Scan(self.scope, "t/")
        doomed: set[str] = set()  # (namespace prefix, checkpoint segment)
        for entry in entries:
            head, kind, rest = _split(entry.key)
            if kind == "c" and entry.value.get("run_id") in runs:
                doomed.add(f"{head}{rest}")
        for entry in entries:
            head, _, rest = _split(entry.key)
            if f"{head}{rest.split('/', 1)[0]}" in doomed:
                yield _plans.Remove(self.scope, entry.key)

    def _copy_thread(self, source: str, target: str) -> _plans.Plan[None]:
        entries: list[Entry] = yield _plans.Scan(self.scope, _thread(source))
        old, new = _thread(source), _thread(target)
        for entry in entries:
            yield _plans.Write(self.scope, new + entry.key[len(old) :], entry.value)

    def _prune(self, thread_ids: Sequence[str], strategy: str) -> _plans.Plan[None]:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: keep_latest or delete")
        for thread_id in thread_ids:
            entries: list[Entry] = yield _plans.Scan(self.scope, _thread(thread_id))
            if strategy == "delete":
                for entry in entries:
                    yield _plans.Remove(self.scope, entry.key)
                continue
            latest: dict[str, str] = {}  # namespace prefix -> newest checkpoint segment
            for entry in entries:
                head, kind, rest = _split(entry.key)
                if kind == "c":
                    latest.setdefault(head, rest)  # key order: newest first
            for entry in entries:
                head, kind, rest = _split(entry.key)
                if rest.split("/", 1)[0] != latest.get(head):
                    yield _plans.Remove(self.scope, entry.key)

    # --- BaseCheckpointSaver ----------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._run(self._get_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        yield from self._run(self._list(config, filter, before, limit))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._run(self._put(config, checkpoint, metadata))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._run(self._put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._run(self._delete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._run(self._delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run(self._copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._run(self._prune(thread_ids, strategy))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._arun(self._get_tuple(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for found in await self._arun(self._list(config, filter, before, limit)):
            yield found

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._arun(self._put(config, checkpoint, metadata))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._arun(self._put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._arun(self._delete_thread(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._arun(self._delete_for_runs(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._arun(self._copy_thread(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._arun(self._prune(thread_ids, strategy))

    def close(self) -> None:
        self._clients.close()

    async def aclose(self) -> None:
        await self._clients.aclose()


def _split(key: str) -> tuple[str, str, str]:
    """A key as (its thread and namespace prefix, "c" or "w", the rest)."""
    thread, ns, kind, rest = key[2:].split("/", 3)
    return f"t/{thread}/{ns}/", kind, rest


__all__ = ["EngramSaver"]
