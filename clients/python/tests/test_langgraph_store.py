"""The LangGraph store against a real engram server."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import PutOp
from langgraph.store.memory import InMemoryStore

from conftest import Server
from engram_client import Engram
from engram_client.aio import AsyncEngram
from engram_client.langgraph import EngramStore


def test_put_get_search_list_delete(server: Server) -> None:
    store = EngramStore(server.address, root=f"lgs-{uuid.uuid4().hex[:6]}")
    alice = ("users", "alice", "memories")
    store.put(alice, "m1", {"text": "likes green tea", "kind": "preference", "n": 1})
    store.put(alice, "m2", {"text": "works on the billing service", "kind": "fact", "n": 2})
    store.put(("users", "bob", "memories"), "m1", {"text": "prefers coffee", "kind": "preference", "n": 3})
    store.put(("users", "bob", "settings"), "tz", {"value": "Europe/Paris"})

    item = store.get(alice, "m1")
    assert item is not None and item.value["text"] == "likes green tea"
    assert (item.namespace, item.key) == (alice, "m1")
    assert store.get(alice, "nope") is None

    assert {i.key for i in store.search(("users", "alice"))} == {"m1", "m2"}
    prefs = store.search(("users",), filter={"kind": "preference"})
    assert sorted(i.namespace[1] for i in prefs) == ["alice", "bob"]
    assert [i.value["n"] for i in store.search(("users",), filter={"n": {"$gte": 2, "$lt": 3}})] == [2]
    assert len(store.search(("users",), limit=1)) == 1

    hits = store.search(("users", "alice"), query="tea")
    assert [h.key for h in hits] == ["m1"] and hits[0].score is not None
    # A busy scope elsewhere (more matches than one search returns) does not
    # crowd out the namespace asked for.
    store.batch(PutOp(("shop", "catalog"), f"tea-{n}", {"text": f"green tea, green tea ({n})"}) for n in range(120))
    hits = store.search(("users", "alice"), query="green tea")
    assert [h.key for h in hits] == ["m1"]

    assert store.list_namespaces(prefix=("users",)) == [
        ("users", "alice", "memories"),
        ("users", "bob", "memories"),
        ("users", "bob", "settings"),
    ]
    assert store.list_namespaces(suffix=("memories",), max_depth=2) == [("users", "alice"), ("users", "bob")]
    assert store.list_namespaces(prefix=("users", "*", "settings")) == [("users", "bob", "settings")]

    store.delete(alice, "m1")
    assert store.get(alice, "m1") is None
    assert [i.key for i in store.search(alice)] == ["m2"]
    # A namespace whose items are all deleted is no longer listed (as
    # LangGraph's Postgres store lists only namespaces holding items).
    store.delete(("users", "bob", "settings"), "tz")
    assert store.list_namespaces(prefix=("users",)) == [
        ("users", "alice", "memories"),
        ("users", "bob", "memories"),
    ]
    store.close()


def test_filters_match_as_langgraphs_own_store(server: Server) -> None:
    """The same items and filters in LangGraph's in-memory store and in
    Engram's find the same keys: nested dicts match what holds their keys,
    operators apply at any depth, lists match item by item."""
    items: dict[str, dict[str, Any]] = {
        "a": {"kind": "note", "meta": {"lang": "en", "score": 5, "tags": ["x", "y"]}, "n": 1},
        "b": {"kind": "note", "meta": {"lang": "fr", "score": 9}, "n": "10"},
        "c": {"kind": "todo", "meta": {"lang": "en", "score": 7, "owner": {"name": "alice"}}, "n": 2.5},
        "d": {"kind": "todo", "meta": "plain", "n": True, "list": [{"k": 1, "j": 2}, 3]},
        "e": {"kind": "note", "n": 0},
    }
    filters: list[dict[str, Any]] = [
        {"kind": "note"},
        {"meta": {"lang": "en"}},
        {"meta": {"lang": "en", "score": 5}},
        {"meta": {"score": {"$gt": 6}}},
        {"meta": {"score": {"$gte": 5, "$lt": 9}}},
        {"meta": {"owner": {"name": "alice"}}},
        {"meta": {"owner": {}}},
        {"meta": {}},
        {"meta": {"tags": ["x", "y"]}},
        {"meta": {"tags": ["x"]}},
        {"list": [{"k": 1}, 3]},
        {"n": {"$gt": 1.5}},
        {"n": {"$lte": 1}},
        {"n": {"$ne": 1}},
        {"kind": {"$eq": "todo"}, "meta": {"lang": "en"}},
        {"meta": "plain"},
    ]
    ns = ("filters",)
    reference = InMemoryStore()
    store = EngramStore(server.address, root=f"lgs-{uuid.uuid4().hex[:6]}")
    for key, value in items.items():
        reference.put(ns, key, value)
        store.put(ns, key, value)
    for wanted in filters:
        expected = sorted(i.key for i in reference.search(ns, filter=wanted))
        assert sorted(i.key for i in store.search(ns, filter=wanted)) == expected, wanted
    # Where LangGraph's store raises (an ordering of a missing value),
    # nothing matches.
    assert store.search(ns, filter={"meta": {"missing": {"$gt": 1}}}) == []
    store.close()


def test_async_methods(server: Server) -> None:
    async def run() -> None:
        # Built from a client this time.
        client = AsyncEngram(server.address)
        store = EngramStore(client, root=f"lgs-{uuid.uuid4().hex[:6]}")
        await store.aput(("docs", "team a/b"), "key with spaces", {"title": "Runbook: deploys"})
        item = await store.aget(("docs", "team a/b"), "key with spaces")
        assert item is not None and item.value == {"title": "Runbook: deploys"}
        assert await store.alist_namespaces() == [("docs", "team a/b")]
        await store.aput(("docs", "old"), "gone", {"title": "x"})
        await store.adelete(("docs", "old"), "gone")
        assert await store.alist_namespaces() == [("docs", "team a/b")]
        found = await store.asearch(("docs",), query="runbook")
        assert [i.key for i in found] == ["key with spaces"]
        await store.aclose()  # leaves the given client open
        assert (await client.sessions.stats())["total_sessions"] >= 0
        await client.close()

    asyncio.run(run())


class State(TypedDict, total=False):
    user: str
    said: str
    known: list[str]


def test_a_graph_node_reads_and_writes_the_store(server: Server) -> None:
    root = f"lgs-{uuid.uuid4().hex[:6]}"
    store = EngramStore(server.address, root=root)

    def remember(state: State, runtime: Runtime[None]) -> State:
        assert runtime.store is not None
        namespace = ("users", state["user"], "memories")
        known = [item.value["text"] for item in runtime.store.search(namespace)]
        runtime.store.put(namespace, str(uuid.uuid4()), {"text": state["said"]})
        return {"known": known}

    graph = StateGraph(State)
    graph.add_node("remember", remember)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", END)
    app = graph.compile(store=store)

    assert app.invoke({"user": "alice", "said": "I use Kubernetes 1.33"})["known"] == []
    second = app.invoke({"user": "alice", "said": "my cluster is in Frankfurt"})
    assert second["known"] == ["I use Kubernetes 1.33"]
    assert app.invoke({"user": "bob", "said": "hello"})["known"] == []

    # What the graph remembered is ordinary memory, readable from any client.
    with Engram(server.address) as client:
        client.memory.configure(f"{root}/users/alice/memories", "namespace")
        texts = sorted(entry.value["text"] for entry in client.memory.list())
    assert texts == ["I use Kubernetes 1.33", "my cluster is in Frankfurt"]
    store.close()
