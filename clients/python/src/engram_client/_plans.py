"""Operations on memory written once for the blocking and asyncio clients.

An integration (the LangGraph checkpointer and store) writes each of its
operations as a *plan*: a generator that yields store operations
(:class:`Scan`, :class:`First`, :class:`Read`, :class:`Write`,
:class:`Remove`, :class:`Scopes`, :class:`Find`) and receives their results.
:func:`run` carries a plan out with an :class:`~engram_client.Engram`,
:func:`arun` with an :class:`~engram_client.aio.AsyncEngram`; the logic
exists once, so the sync and async methods cannot drift apart.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from . import _requests
from ._client import Engram
from ._results import Entry, Hit
from ._errors import Conflict, NotFound
from .aio import AsyncEngram
from .v1 import memory_pb2

T = TypeVar("T")


@dataclass(frozen=True)
class Scan:
    """Every live entry of a namespace scope under a key prefix, in key order."""

    scope: str
    prefix: str


@dataclass(frozen=True)
class First:
    """The first live entry under a prefix, or None."""

    scope: str
    prefix: str


@dataclass(frozen=True)
class Read:
    """A key's live entry, or None."""

    scope: str
    key: str


@dataclass(frozen=True)
class Write:
    scope: str
    key: str
    value: Any
    #: Only if the key has no live value; a taken key is left as it is.
    create: bool = False


@dataclass(frozen=True)
class Remove:
    """Tombstones a key; a key without a live value is left as it is."""

    scope: str
    key: str


@dataclass(frozen=True)
class Scopes:
    """The names of every namespace scope with live entries."""


@dataclass(frozen=True)
class Find:
    """Memory entries matching a query, best first (SearchService), in the
    namespace scopes whose names start with ``scope_prefix``."""

    query: str
    limit: int
    scope_prefix: str = ""


Op = Scan | First | Read | Write | Remove | Scopes | Find
Plan = Generator[Op, Any, T]


def _scope(name: str) -> _requests.Scope:
    return _requests.Scope(name, memory_pb2.SCOPE_TYPE_NAMESPACE)


def _write(op: Write) -> memory_pb2.SetRequest:
    """A write's request, with a request id of its own: the client then
    retries it through a database failover, and a retry whose first try
    was stored answers with that first result instead of writing again."""
    return _scope(op.scope).set(op.key, op.value, 0 if op.create else None, uuid.uuid4().hex)


def _remove(op: Remove) -> memory_pb2.DeleteRequest:
    """A removal's request, keyed as :func:`_write`'s."""
    return _scope(op.scope).delete(op.key, None, uuid.uuid4().hex)


def run(client: Engram, plan: Plan[T]) -> T:
    """Carries out a plan with the blocking client."""
    result: Any = None
    try:
        while True:
            result = _sync(client, plan.send(result))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def arun(client: AsyncEngram, plan: Plan[T]) -> T:
    """Carries out a plan with the asyncio client."""
    result: Any = None
    try:
        while True:
            result = await _async(client, plan.send(result))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _scan(op: Scan | First) -> Generator[memory_pb2.ListRequest, memory_pb2.ListResponse, None]:
    """The List calls of a scan (a first is a scan of one page of one)."""
    token = ""
    while True:
        request = _scope(op.scope).list(op.prefix, token)
        if isinstance(op, First):
            request.page_size = 1
        page = yield request
        if isinstance(op, First) or not page.next_page_token:
            return
        token = page.next_page_token


def _sync(client: Engram, op: Op) -> Any:
    stubs = client.stubs
    if isinstance(op, (Scan, First)):
        entries: builtins.list[Entry] = []
        pages = _scan(op)
        page: Any = None
        try:
            while True:
                page = client.call(stubs.memory.List, pages.send(page))
                entries += [Entry.from_proto(e) for e in page.entries]
        except StopIteration:
            pass
        return entries if isinstance(op, Scan) else next(iter(entries), None)
    if isinstance(op, Read):
        try:
            return Entry.from_proto(client.call(stubs.memory.Get, _scope(op.scope).get(op.key, None)).entry)
        except NotFound:
            return None
    if isinstance(op, Write):
        try:
            return Entry.from_proto(client.call(stubs.memory.Set, _write(op)).entry)
        except Conflict:
            return None
    if isinstance(op, Remove):
        try:
            client.call(stubs.memory.Delete, _remove(op))
        except NotFound:
            pass
        return None
    if isinstance(op, Scopes):
        return [s.scope for s in client.memory.scopes("namespace") if s.entry_count > 0]
    return client.search(
        op.query,
        sources=["memory"],
        scope_type="namespace",
        scope_prefix=op.scope_prefix,
        limit=op.limit,
    )


async def _async(client: AsyncEngram, op: Op) -> Any:
    stubs = client.stubs
    if isinstance(op, (Scan, First)):
        entries: builtins.list[Entry] = []
        pages = _scan(op)
        page: Any = None
        try:
            while True:
                page = await client.call(stubs.memory.List, pages.send(page))
                entries += [Entry.from_proto(e) for e in page.entries]
        except StopIteration:
            pass
        return entries if isinstance(op, Scan) else next(iter(entries), None)
    if isinstance(op, Read):
        try:
            response = await client.call(stubs.memory.Get, _scope(op.scope).get(op.key, None))
        except NotFound:
            return None
        return Entry.from_proto(response.entry)
    if isinstance(op, Write):
        try:
            return Entry.from_proto((await client.call(stubs.memory.Set, _write(op))).entry)
        except Conflict:
            return None
    if isinstance(op, Remove):
        try:
            await client.call(stubs.memory.Delete, _remove(op))
        except NotFound:
            pass
        return None
    if isinstance(op, Scopes):
        return [s.scope async for s in client.memory.scopes("namespace") if s.entry_count > 0]
    hits: builtins.list[Hit] = await client.search(
        op.query,
        sources=["memory"],
        scope_type="namespace",
        scope_prefix=op.scope_prefix,
        limit=op.limit,
    )
    return hits
