"""LangGraph's long-term memory store on Engram: ``EngramStore``, a ``BaseStore``.

    from engram_client.langgraph import EngramStore

    store = EngramStore("engram:50051", token)
    graph = builder.compile(checkpointer=saver, store=store)
    # in a node: store.put(("users", user_id, "memories"), "m1", {"text": "likes tea"})

Install with ``pip install engram-client[langgraph]``.

A store namespace is an Engram namespace scope: its labels joined by ``/``
under a root (``langgraph-store/users/alice/memories`` with the default
``root``), each label escaped into Engram's alphabet as the checkpointer
escapes identifiers; an item is a key holding the item's value as it is, so
the data reads the same from grpcurl and the CLI. ``search`` with a
``query`` asks Engram's SearchService (words, or meaning and words when
the server has an embedder) over the scopes under the namespace prefix; without one it lists the namespaces' items, newest first.
``filter`` compares values as LangGraph's in-memory store does: equality,
nested dicts matching the values that hold their keys, and the operators
``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte`` at any depth. An item's ``created_at`` and ``updated_at`` are
both the time of its current version. TTLs are not supported.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from .. import _plans
from .._results import Entry, Hit
from .._connect import Clients, Target
from .._keys import escape, unescape

#: How many hits a query asks SearchService for (its maximum).
_FIND_LIMIT = 100


class EngramStore(BaseStore):
    """A LangGraph store on an Engram server (see the module doc).

    Built from ``target``, ``token`` and keyword options as
    :class:`engram_client.Engram` is, or from a client of either flavour."""

    supports_ttl = False

    def __init__(
        self,
        target: Target,
        token: str | None = None,
        *,
        root: str = "langgraph-store",
        **client_options: Any,
    ) -> None:
        self._clients = Clients(target, token, client_options)
        self.root = root

    def batch(self, ops: Iterable[Op]) -> builtins.list[Result]:
        return _plans.run(self._clients.sync(), self._batch(ops))

    async def abatch(self, ops: Iterable[Op]) -> builtins.list[Result]:
        return await _plans.arun(self._clients.aio(), self._batch(ops))

    def close(self) -> None:
        self._clients.close()

    async def aclose(self) -> None:
        await self._clients.aclose()

    # --- namespaces and scopes -------------------------------------------

    def scope(self, namespace: tuple[str, ...]) -> str:
        """The Engram scope holding a namespace's items."""
        return "/".join([self.root, *(escape(label) for label in namespace)])

    def namespace(self, scope: str) -> tuple[str, ...] | None:
        """The namespace a scope holds, or None for a scope of no namespace."""
        head = self.root + "/"
        if not scope.startswith(head):
            return None
        return tuple(unescape(label) for label in scope[len(head) :].split("/"))

    def _item(self, namespace: tuple[str, ...], entry: Entry) -> Item:
        return Item(
            value=entry.value if isinstance(entry.value, dict) else {"value": entry.value},
            key=unescape(entry.key),
            namespace=namespace,
            created_at=entry.create_time,
            updated_at=entry.create_time,
        )

    # --- the batch --------------------------------------------------------

    def _batch(self, ops: Iterable[Op]) -> _plans.Plan[builtins.list[Result]]:
        results: builtins.list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                entry = yield _plans.Read(self.scope(op.namespace), escape(op.key))
                results.append(None if entry is None else self._item(op.namespace, entry))
            elif isinstance(op, PutOp):
                scope, key = self.scope(op.namespace), escape(op.key)
                if op.value is None:
                    yield _plans.Remove(scope, key)
                else:
                    yield _plans.Write(scope, key, op.value)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append((yield from self._search(op)))
            elif isinstance(op, ListNamespacesOp):
                scopes: builtins.list[str] = yield _plans.Scopes()
                results.append(_list_namespaces(op, self._namespaces(scopes)))
            else:
                raise ValueError(f"unknown store operation {op!r}")
        return results

    def _namespaces(self, scopes: builtins.list[str]) -> builtins.list[tuple[str, ...]]:
        found = (self.namespace(scope) for scope in scopes)
        return sorted({namespace for namespace in found if namespace is not None})

    def _search(self, op: SearchOp) -> _plans.Plan[builtins.list[SearchItem]]:
        prefix = op.namespace_prefix
        found: builtins.list[SearchItem] = []
        if op.query:
            # The namespace prefix as a scope-name prefix: one search over
            # exactly those scopes (and siblings sharing the characters,
            # e.g. alice2 for alice, dropped below).
            base = self.scope(prefix) if prefix else self.root + "/"
            hits: builtins.list[Hit] = yield _plans.Find(op.query, _FIND_LIMIT, base)
            for hit in hits:
                namespace = self.namespace(hit.entry.scope) if hit.entry else None
                if hit.entry is None or namespace is None or namespace[: len(prefix)] != prefix:
                    continue
                item = self._item(namespace, hit.entry)
                if _matches(item.value, op.filter):
                    found.append(_scored(item, hit.score))
        else:
            scopes: builtins.list[str] = yield _plans.Scopes()
            for namespace in self._namespaces(scopes):
                if namespace[: len(prefix)] != prefix:
                    continue
                entries: builtins.list[Entry] = yield _plans.Scan(self.scope(namespace), "")
                for entry in entries:
                    item = self._item(namespace, entry)
                    if _matches(item.value, op.filter):
                        found.append(_scored(item, None))
            found.sort(key=lambda item: item.updated_at, reverse=True)
        return found[op.offset : op.offset + op.limit]


def _scored(item: Item, score: float | None) -> SearchItem:
    return SearchItem(
        namespace=item.namespace,
        key=item.key,
        value=item.value,
        created_at=item.created_at,
        updated_at=item.updated_at,
        score=score,
    )


def _compare(operator: str, actual: Any, wanted: Any) -> bool:
    """One operator, as LangGraph's own stores apply it: ``$eq`` and ``$ne``
    by equality, the orderings on numbers (numeric strings too); values
    that are not numbers compare among their own kind, and a missing
    value or one of another kind matches no ordering."""
    if operator == "$eq":
        return bool(actual == wanted)
    if operator == "$ne":
        return bool(actual != wanted)
    if operator not in _ORDERINGS:
        raise ValueError(f"Unsupported operator: {operator}")
    if actual is None:
        return False
    try:
        return bool(_ORDERINGS[operator](float(actual), float(wanted)))
    except (TypeError, ValueError):
        if type(actual) is not type(wanted) or not isinstance(actual, str):
            return False
        return bool(_ORDERINGS[operator](actual, wanted))


_ORDERINGS: dict[str, Callable[[Any, Any], bool]] = {
    "$gt": lambda a, b: a > b,
    "$gte": lambda a, b: a >= b,
    "$lt": lambda a, b: a < b,
    "$lte": lambda a, b: a <= b,
}


def _matches(value: dict[str, Any], filter: dict[str, Any] | None) -> bool:
    """Whether a value passes a search filter."""
    return all(_agrees(value.get(field), wanted) for field, wanted in (filter or {}).items())


def _agrees(actual: Any, wanted: Any) -> bool:
    """A value against one filter entry, as LangGraph's in-memory store
    compares them: a dict with ``$`` keys applies its operators; any other
    dict matches a dict holding each of its keys with a value that agrees
    (other keys may be there too), at any depth; a list matches a list of
    as many items agreeing in order; anything else, an equal value."""
    if isinstance(wanted, dict):
        if any(key.startswith("$") for key in wanted):
            return all(_compare(op, actual, operand) for op, operand in wanted.items())
        return isinstance(actual, dict) and all(
            _agrees(actual.get(key), inner) for key, inner in wanted.items()
        )
    if isinstance(wanted, (list, tuple)):
        return (
            isinstance(actual, (list, tuple))
            and len(actual) == len(wanted)
            and all(_agrees(a, w) for a, w in zip(actual, wanted))
        )
    return bool(actual == wanted)


def _list_namespaces(
    op: ListNamespacesOp, namespaces: builtins.list[tuple[str, ...]]
) -> builtins.list[tuple[str, ...]]:
    matching = [
        namespace
        for namespace in namespaces
        if all(_condition(condition, namespace) for condition in op.match_conditions or ())
    ]
    if op.max_depth is not None:
        matching = sorted({namespace[: op.max_depth] for namespace in matching})
    return matching[op.offset : op.offset + op.limit]


def _condition(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(path) > len(namespace):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    return all(want == "*" or want == have for want, have in zip(path, part))


__all__ = ["EngramStore"]
