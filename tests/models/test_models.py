"""Model-based tests: random operations against a real server, each answer
checked against a small model of what the API documents.

The store conformance suite and the API tests check cases someone thought
of; these check the sequences nobody did. Each test keeps a plain Python
model of one part of the API (memory with purges, rollbacks and retention;
sessions with owners, replays, eviction and ends; working memory with its
task, fact and cache limits and creations repeated by their request ids), applies the same random operations to it and
to the server, and compares every answer. Seeds are fixed, so a failure
names the operation that diverged and replays exactly.

Found so far: the content cache kept an older small file while evicting a
newer large one (not least recently cached first).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import duration_pb2, struct_pb2

from conftest import Engram
from engram_client.v1 import (
    consolidation_pb2,
    episodes_pb2,
    memory_admin_pb2,
    memory_pb2,
    search_pb2,
    sessions_pb2,
    working_memory_pb2,
)

NS = memory_pb2.SCOPE_TYPE_NAMESPACE
OPS = 500


def text(value: str) -> struct_pb2.Value:
    return struct_pb2.Value(string_value=value)


# --- memory -------------------------------------------------------------


@dataclass
class Key:
    """A key's kept versions (number → value, None for a tombstone) and the
    newest number it was given."""

    versions: dict[int, str | None] = field(default_factory=dict)
    latest: int = 0

    def live(self) -> int:
        """The newest version when it holds a value, else 0."""
        value = self.versions.get(self.latest, None)
        return self.latest if self.latest in self.versions and value is not None else 0


def test_memory_follows_its_model(engram: Engram) -> None:
    rng = random.Random(7)
    keys: dict[str, Key] = {}

    def scope(**fields: Any) -> dict[str, Any]:
        return {"scope_type": NS, "scope": "model", **fields}

    for n in range(OPS):
        name = rng.choice(["a", "b", "c", "a/x"])
        key = keys.get(name)
        op = rng.randrange(11)
        where = f"op {n} ({op}) on {name}: {key}"
        if op <= 2:
            expected = rng.choice([None, None, 0, 1, 2, 3, key.latest if key else 0])
            given = {} if expected is None else {"expected_version": expected}
            got = engram.call(engram.memory.Set, memory_pb2.SetRequest(**scope(key=name, value=text(f"v{n}"), **given)))
            # The newest version's number, even a tombstone's, or 0 for no
            # live value.
            matches = expected is None or expected == (key.live() if key else 0) or (key and expected == key.latest)
            if not matches:
                assert got.code == "ABORTED", where
                continue
            assert got.ok, where
            key = keys.setdefault(name, Key())
            key.latest += 1
            assert int(got.answer["entry"]["version"]) == key.latest, where
            key.versions[key.latest] = f"v{n}"
        elif op == 3:
            got = engram.call(engram.memory.Delete, memory_pb2.DeleteRequest(**scope(key=name)))
            if not key or not key.live():
                assert got.code == "NOT_FOUND", where
                continue
            key.latest += 1
            key.versions[key.latest] = None
            assert got.ok and int(got.answer["entry"]["version"]) == key.latest, where
        elif op == 4:
            got = engram.call(engram.memory.Get, memory_pb2.GetRequest(**scope(key=name)))
            if not key or not key.live():
                assert got.code == "NOT_FOUND", where
            else:
                entry = got.answer["entry"]
                assert (int(entry["version"]), entry["value"]) == (key.live(), key.versions[key.live()]), where
        elif op == 5:
            version = rng.choice([1, 2, 3, key.latest if key else 1])
            got = engram.call(engram.memory.Get, memory_pb2.GetRequest(**scope(key=name, version=version)))
            if not key or version not in key.versions:
                assert got.code == "NOT_FOUND", where
            elif key.versions[version] is not None:
                assert got.answer["entry"].get("value") == key.versions[version], where
        elif op == 6:
            got = engram.call(engram.memory.History, memory_pb2.HistoryRequest(**scope(key=name)))
            if not key:
                assert got.code == "NOT_FOUND", where
                continue
            seen = [(int(h["entry"]["version"]), h["entry"].get("value")) for h in got.answer]
            assert seen == sorted(key.versions.items()), where
        elif op == 7:
            got = engram.call(engram.memory.List, memory_pb2.ListRequest(**scope(page_size=100)))
            listed = [(e["key"], e.get("value")) for e in got.answer.get("entries", [])]
            live = sorted((k, m.versions[m.live()]) for k, m in keys.items() if m.live())
            assert listed == live, f"op {n}: list"
        elif op == 8:
            keep = rng.choice([None, 1, 2, 3])
            given = {} if keep is None else {"keep": keep}
            got = engram.call(engram.admin.Purge, memory_admin_pb2.PurgeRequest(**scope(key=name, **given)))
            assert got.ok, where
            if key:
                kept = sorted(key.versions)[-keep:] if keep else []
                key.versions = {v: key.versions[v] for v in kept}
                if not key.versions:
                    del keys[name]
        elif op == 9:
            to = rng.choice([1, 2, 3, key.latest - 1 if key else 1])
            got = engram.call(engram.memory.Rollback, memory_pb2.RollbackRequest(**scope(key=name, to_version=to)))
            allowed = key and to < key.latest and key.versions.get(to) is not None
            if not allowed:
                assert not got.ok, where
                continue
            assert key is not None
            key.latest += 1
            key.versions[key.latest] = key.versions[to]
            assert got.ok and int(got.answer["entry"]["version"]) == key.latest, where
        else:
            newest_n = rng.choice([None, 1, 2, 3])
            policy = memory_admin_pb2.RetentionPolicy()
            if newest_n is not None:
                policy.keep_versions = newest_n
            by_age, by_grace = rng.random() < 0.3, rng.random() < 0.3
            if by_age:
                policy.max_age.CopyFrom(duration_pb2.Duration(nanos=1))
            if by_grace:
                policy.tombstone_grace.CopyFrom(duration_pb2.Duration(nanos=1))
            if newest_n is None and not by_age and not by_grace:
                continue
            assert engram.call(engram.admin.SetRetention, memory_admin_pb2.SetRetentionRequest(**scope(policy=policy))).ok
            assert engram.call(engram.admin.ApplyRetention, memory_admin_pb2.ApplyRetentionRequest(**scope())).ok
            for k, m in list(keys.items()):
                numbers = sorted(m.versions)
                newest = m.latest if m.latest in m.versions else None
                gone = set(numbers[: max(0, len(numbers) - newest_n)]) if newest_n else set()
                if by_age:
                    gone |= {v for v in numbers if v != newest}
                if by_grace and newest is not None and m.versions[newest] is None:
                    gone |= set(numbers)
                m.versions = {v: m.versions[v] for v in numbers if v not in gone}
                if not m.versions:
                    del keys[k]


# --- sessions and episodes ----------------------------------------------

OWNERS = {"s1": ("bot", "alice"), "s2": ("bot", "bob"), "s3": ("app2", "alice")}
MAX_EVENTS = 4


@dataclass
class Log:
    app: str
    user: str
    ended: bool = False
    last_seq: int = 0
    episodes: list[tuple[int, str]] = field(default_factory=list)
    evicted: int = 0


def test_sessions_follow_their_model(engram: Engram) -> None:
    rng = random.Random(11)
    logs: dict[str, Log] = {}
    stored: dict[str, tuple[str, str]] = {}  # episode id -> (session, content)

    def check(n: int, session: str) -> None:
        got = engram.call(engram.sessions.GetSession, sessions_pb2.GetSessionRequest(session_id=session))
        log = logs.get(session)
        if log is None:
            assert got.code == "NOT_FOUND", f"op {n}: {session} is gone"
            return
        found = got.answer["session"]
        counters = (
            int(found.get("lastSeq", 0)),
            int(found.get("episodeCount", 0)),
            int(found.get("episodesEvicted", 0)),
            "endTime" in found,
        )
        assert counters == (log.last_seq, len(log.episodes), log.evicted, log.ended), f"op {n}: {session}"
        listed = engram.call(engram.episodes.ListEpisodes, episodes_pb2.ListEpisodesRequest(session_id=session, page_size=100))
        seqs = [(int(e["seq"]), e["id"]) for e in listed.answer.get("episodes", [])]
        assert seqs == log.episodes, f"op {n}: episodes of {session}"

    def expect(session: str, owner: tuple[str, str] | None, batch: list[tuple[str, str]], require: bool) -> str:
        """The model's outcome of an append, applied when it is stored."""
        log = logs.get(session)
        if log is None:
            if require or owner is None:
                return "NOT_FOUND"
            log = Log(*owner)
        elif owner is not None and owner != (log.app, log.user) or log.ended:
            return "FAILED_PRECONDITION"
        if any(i in stored and stored[i] != (session, c) for i, c in batch):
            return "ALREADY_EXISTS"
        logs[session] = log
        for i, c in batch:
            if i not in stored:
                log.last_seq += 1
                log.episodes.append((log.last_seq, i))
                stored[i] = (session, c)
        gone = [e for e in log.episodes if e[0] <= log.last_seq - MAX_EVENTS]
        log.episodes = [e for e in log.episodes if e[0] > log.last_seq - MAX_EVENTS]
        log.evicted += len(gone)
        for _, i in gone:  # an evicted episode's id is free again
            stored.pop(i, None)
        return "ok"

    for n in range(OPS):
        session = rng.choice(list(OWNERS))
        op = rng.randrange(10)
        if op <= 4:
            owner = rng.choice([OWNERS[session], OWNERS[session], ("bot", "mallory"), None])
            ids = rng.sample([f"e{i}" for i in range(30)], rng.choice([1, 1, 2, 3]))
            batch = [(i, stored[i][1] if i in stored and rng.random() < 0.8 else f"c{rng.randrange(2)}") for i in ids]
            require = rng.random() < 0.2
            want = expect(session, owner, batch, require)
            fields: dict[str, Any] = {"session_id": session, "require_session": require}
            if owner:
                fields.update(app=owner[0], user=owner[1])
            new = [episodes_pb2.NewEpisode(id=i, type="message", content=text(c)) for i, c in batch]
            if len(new) == 1:
                got = engram.call(engram.episodes.AppendEpisode, episodes_pb2.AppendEpisodeRequest(**fields, episode=new[0]))
            else:
                got = engram.call(engram.episodes.AppendEpisodes, episodes_pb2.AppendEpisodesRequest(**fields, episodes=new))
            assert ("ok" if got.ok else got.code) == want, f"op {n}: append {batch} to {session} as {owner}"
        elif op == 5 and rng.random() < 0.3:
            drop = rng.random() < 0.3
            got = engram.call(engram.sessions.EndSession, sessions_pb2.EndSessionRequest(session_id=session, delete_episodes=drop))
            log = logs.get(session)
            assert got.ok == (log is not None), f"op {n}: end {session}"
            if log:
                log.ended = True
                if drop:
                    for _, i in log.episodes:
                        stored.pop(i, None)
                    log.episodes = []
        elif op == 6 and rng.random() < 0.3:
            engram.call(engram.sessions.DeleteSession, sessions_pb2.DeleteSessionRequest(session_id=session))
            gone = logs.pop(session, None)
            for _, i in gone.episodes if gone else []:
                stored.pop(i, None)
        elif op == 7:
            app, user = OWNERS[session]
            got = engram.call(
                engram.sessions.CreateSession, sessions_pb2.CreateSessionRequest(session_id=session, app=app, user=user)
            )
            if session in logs:
                assert got.code == "ALREADY_EXISTS", f"op {n}: create {session}"
            else:
                assert got.ok, f"op {n}: create {session}"
                logs[session] = Log(app, user)
        elif op == 8:
            stats = engram.call(engram.sessions.GetStats, sessions_pb2.GetStatsRequest()).answer
            counts = (int(stats.get("totalSessions", 0)), int(stats.get("totalEpisodes", 0)))
            assert counts == (len(logs), sum(len(log.episodes) for log in logs.values())), f"op {n}: stats"
        check(n, session)


# --- working memory -----------------------------------------------------

MAX_TASKS, MAX_FACTS, MAX_FILES, MAX_BYTES = 3, 3, 3, 40
STATUS = {
    working_memory_pb2.TASK_STATUS_PENDING: "TASK_STATUS_PENDING",
    working_memory_pb2.TASK_STATUS_IN_PROGRESS: "TASK_STATUS_IN_PROGRESS",
    working_memory_pb2.TASK_STATUS_COMPLETED: "TASK_STATUS_COMPLETED",
    working_memory_pb2.TASK_STATUS_BLOCKED: "TASK_STATUS_BLOCKED",
}


def test_working_memory_follows_its_model(engram: Engram) -> None:
    rng = random.Random(13)
    tasks: dict[str, list[list[str]]] = {s: [] for s in OWNERS}  # [id, subject, status]
    numbered = dict.fromkeys(OWNERS, 0)
    facts: dict[tuple[str, str], list[str]] = {}
    cache: dict[str, list[tuple[str, int]]] = {s: [] for s in OWNERS}  # oldest first
    # Creations made with a request id: the id → (what was made, what was asked).
    keyed_tasks: dict[str, dict[str, tuple[str, str]]] = {s: {} for s in OWNERS}
    keyed_facts: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
    for session, (app, user) in OWNERS.items():
        assert engram.call(
            engram.sessions.CreateSession, sessions_pb2.CreateSessionRequest(session_id=session, app=app, user=user)
        ).ok

    for n in range(OPS):
        session = rng.choice(list(OWNERS))
        app, user = OWNERS[session]
        at = {"session_id": session, "app": app, "user": user}
        op = rng.randrange(8)
        if op == 1 and keyed_tasks[session] and rng.random() < 0.6:
            # A repeat of a keyed creation (a retry after a lost reply):
            # the task as it is now, nothing added, even at the limit; the
            # id with another subject is refused.
            request_id, (task_id, subject) = rng.choice(sorted(keyed_tasks[session].items()))
            reused = rng.random() < 0.2
            asked = f"{subject} (other)" if reused else subject
            got = engram.call(
                engram.working.CreateTask,
                working_memory_pb2.CreateTaskRequest(**at, subject=asked, request_id=request_id),
            )
            if reused:
                assert got.code == "INVALID_ARGUMENT", f"op {n}: {request_id} reused in {session}"
                continue
            stored = next(t for t in tasks[session] if t[0] == task_id)
            seen = [got.answer["task"]["id"], got.answer["task"]["subject"], got.answer["task"]["status"]]
            assert got.ok and seen == stored, f"op {n}: repeat of {request_id} in {session}"
        elif op <= 1:
            request_id = f"task-{n}" if rng.random() < 0.5 else ""
            got = engram.call(
                engram.working.CreateTask,
                working_memory_pb2.CreateTaskRequest(**at, subject=f"task {n}", request_id=request_id),
            )
            if len(tasks[session]) >= MAX_TASKS:
                assert got.code == "RESOURCE_EXHAUSTED", f"op {n}: a task past the limit"
                continue
            numbered[session] += 1
            task_id = f"t{numbered[session]}"
            assert got.ok and got.answer["task"]["id"] == task_id, f"op {n}: create in {session}"
            tasks[session].append([task_id, f"task {n}", "TASK_STATUS_PENDING"])
            if request_id:
                keyed_tasks[session][request_id] = (task_id, f"task {n}")
        elif op == 2:
            task_id = rng.choice([t[0] for t in tasks[session]] + ["t99"])
            status = rng.choice(list(STATUS))
            got = engram.call(
                engram.working.UpdateTask, working_memory_pb2.UpdateTaskRequest(**at, task_id=task_id, status=status)
            )
            task = next((t for t in tasks[session] if t[0] == task_id), None)
            assert got.ok == (task is not None), f"op {n}: update {task_id} of {session}"
            if task:
                task[2] = STATUS[status]
        elif op == 3:
            listed = engram.call(engram.working.ListTasks, working_memory_pb2.ListTasksRequest(**at, page_size=100))
            seen = [[t["id"], t["subject"], t["status"]] for t in listed.answer.get("tasks", [])]
            assert seen == tasks[session], f"op {n}: tasks of {session}"
        elif op == 4 and keyed_facts.get((app, user)) and rng.random() < 0.4:
            # A repeat of a keyed Remember: the fact as it is now (deleted
            # since, perhaps), nothing added.
            request_id, (fact_id, content) = rng.choice(sorted(keyed_facts[(app, user)].items()))
            got = engram.call(
                engram.working.Remember,
                working_memory_pb2.RememberRequest(**at, content=content, request_id=request_id),
            )
            assert got.ok and got.answer["fact"]["id"] == fact_id, f"op {n}: repeat of {request_id}"
            deleted = got.answer["fact"]["current"].get("deleted", False)
            assert deleted == (fact_id not in facts.get((app, user), [])), f"op {n}: {fact_id} as it is now"
        elif op == 4:
            request_id = f"fact-{n}" if rng.random() < 0.5 else ""
            got = engram.call(
                engram.working.Remember,
                working_memory_pb2.RememberRequest(**at, content=f"fact {n}", request_id=request_id),
            )
            live = facts.setdefault((app, user), [])
            if len(live) >= MAX_FACTS:
                assert got.code == "RESOURCE_EXHAUSTED", f"op {n}: a fact past the limit"
            else:
                assert got.ok, f"op {n}: remember"
                live.append(got.answer["fact"]["id"])
                if request_id:
                    keyed = keyed_facts.setdefault((app, user), {})
                    keyed[request_id] = (got.answer["fact"]["id"], f"fact {n}")
        elif op == 5:
            live = facts.setdefault((app, user), [])
            if live:
                fact = live.pop(rng.randrange(len(live)))
                assert engram.call(engram.consolidation.DeleteFact, consolidation_pb2.DeleteFactRequest(fact_id=fact)).ok
            listed = engram.call(
                engram.consolidation.ListFacts,
                consolidation_pb2.ListFactsRequest(
                    app=app, user=user, kind=consolidation_pb2.FACT_KIND_SEMANTIC, page_size=100
                ),
            )
            assert sorted(f["id"] for f in listed.answer.get("facts", [])) == sorted(live), f"op {n}: facts"
        else:
            path = rng.choice(["a", "b", "c", "d", "e"])
            size = rng.choice([1, 5, 10, 20, 35])
            got = engram.call(
                engram.working.CacheContent, working_memory_pb2.CacheContentRequest(**at, path=path, content="x" * size)
            )
            assert got.ok, f"op {n}: cache"
            # Least recently cached first: newest first, keep while both
            # limits hold; the first that does not fit goes with all older.
            entries = [e for e in cache[session] if e[0] != path] + [(path, size)]
            kept: list[tuple[str, int]] = [entries[-1]]
            evicted: list[str] = []
            for entry in reversed(entries[:-1]):
                fits = not evicted and len(kept) < MAX_FILES and sum(s for _, s in kept) + entry[1] <= MAX_BYTES
                if fits:
                    kept.insert(0, entry)
                else:
                    evicted.insert(0, entry[0])
            cache[session] = kept
            assert got.answer.get("evicted", []) == evicted, f"op {n}: evicted from {session}'s cache"


# --- search -------------------------------------------------------------


def test_search_finds_exactly_what_is_live(engram: Engram) -> None:
    """Every item carries a word of its own; a search for a word finds
    exactly the live items holding it, whatever removed or restored the
    rest: deletes, purges, rollbacks, evictions, ended sessions with their
    episodes dropped, deleted sessions, deleted facts."""
    rng = random.Random(17)
    values: dict[str, Key] = {}  # memory key -> its versions' words
    episodes: dict[str, list[tuple[int, str]]] = {}  # session -> (seq, word), live
    last_seq: dict[str, int] = {}
    facts: dict[str, str] = {}  # live fact id -> word
    words: list[str] = []
    kinds_found: set[str] = set()

    def word(n: int) -> str:
        words.append(f"zq{n}x")
        return words[-1]

    def live_hits(w: str) -> set[str]:
        found = {f"memory:{k}" for k, m in values.items() if m.live() and m.versions[m.live()] == w}
        found |= {f"episode:{s}/{seq}" for s, log in episodes.items() for seq, v in log if v == w}
        found |= {f"fact:{f}" for f, v in facts.items() if v == w}
        return found

    for n in range(OPS):
        op = rng.randrange(10)
        name = rng.choice(["a", "b", "c"])
        session = rng.choice(["s1", "s2"])
        at: dict[str, Any] = {"scope_type": NS, "scope": "found", "key": name}
        key = values.get(name)
        if op <= 1:
            w = word(n)
            assert engram.call(engram.memory.Set, memory_pb2.SetRequest(**at, value=text(w))).ok
            key = values.setdefault(name, Key())
            key.latest += 1
            key.versions[key.latest] = w
        elif op == 2 and key and key.live():
            assert engram.call(engram.memory.Delete, memory_pb2.DeleteRequest(**at)).ok
            key.latest += 1
            key.versions[key.latest] = None
        elif op == 3 and key:
            to = rng.choice(sorted(key.versions))
            got = engram.call(engram.memory.Rollback, memory_pb2.RollbackRequest(**at, to_version=to))
            if to < key.latest and key.versions[to] is not None:
                assert got.ok, f"op {n}: rollback"
                key.latest += 1
                key.versions[key.latest] = key.versions[to]
        elif op == 4 and key:
            assert engram.call(engram.admin.Purge, memory_admin_pb2.PurgeRequest(**at, keep=1)).ok
            key.versions = {key.latest: key.versions[key.latest]} if key.latest in key.versions else {}
        elif op <= 6:
            w = word(n)
            got = engram.call(
                engram.episodes.AppendEpisode,
                episodes_pb2.AppendEpisodeRequest(
                    session_id=session, app="bot", user="alice",
                    episode=episodes_pb2.NewEpisode(type="message", content=text(w)),
                ),
            )
            if got.code == "FAILED_PRECONDITION":  # ended
                continue
            assert got.ok, f"op {n}: append"
            last_seq[session] = last_seq.get(session, 0) + 1
            log = episodes.setdefault(session, [])
            log.append((last_seq[session], w))
            episodes[session] = [e for e in log if e[0] > last_seq[session] - MAX_EVENTS]
        elif op == 7:
            if rng.random() < 0.5:
                engram.call(engram.sessions.EndSession, sessions_pb2.EndSessionRequest(session_id=session, delete_episodes=True))
                if session in episodes:
                    episodes[session] = []
            else:
                engram.call(engram.sessions.DeleteSession, sessions_pb2.DeleteSessionRequest(session_id=session))
                episodes.pop(session, None)
                last_seq.pop(session, None)
        elif op == 8:
            if facts and rng.random() < 0.5:
                fact = rng.choice(sorted(facts))
                assert engram.call(engram.consolidation.DeleteFact, consolidation_pb2.DeleteFactRequest(fact_id=fact)).ok
                del facts[fact]
            elif len(facts) < MAX_FACTS:
                w = word(n)
                got = engram.call(
                    engram.working.Remember,
                    working_memory_pb2.RememberRequest(session_id="facts", app="bot", user="alice", content=w),
                )
                assert got.ok, f"op {n}: remember"
                facts[got.answer["fact"]["id"]] = w
        elif words:
            w = rng.choice(words[-20:])
            got = engram.call(engram.search.Search, search_pb2.SearchRequest(query=w, limit=100))
            assert got.ok, f"op {n}: search"
            hits = set()
            for hit in got.answer.get("hits", []):
                if "entry" in hit:
                    hits.add(f"memory:{hit['entry']['key']}")
                elif "episode" in hit:
                    hits.add(f"episode:{hit['episode']['sessionId']}/{hit['episode']['seq']}")
                else:
                    hits.add(f"fact:{hit['fact']['id']}")
            assert hits == live_hits(w), f"op {n}: search for {w}"
            kinds_found |= {hit.split(":")[0] for hit in hits}
    assert kinds_found == {"memory", "episode", "fact"}, "every source was found at least once"
