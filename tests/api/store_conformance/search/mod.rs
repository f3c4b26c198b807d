//! Search at the store level: each source finds only live items of the
//! caller's tenant, at their current version, best first, and what a call
//! removed is gone when it returns.

use engram::context::Tenant;
use engram::memory::audit::{AuditRecord, Operation};
use engram::memory::ports::{Mutation, Purge};
use engram::ports::Store;
use engram::search::{Filters, Hit, Item, Query, Source};
use serde_json::json;

use super::consolidation::{insert, payload};
use super::fixtures::{episode, id, log, name, owner};
use super::{key, writer};
use crate::helpers::TestDb;

mod migrations;
mod reading;

pub(super) async fn found<S: Store>(
    store: &S,
    tenant: &str,
    source: Source,
    text: &str,
    filters: &Filters,
) -> Vec<Hit> {
    let query = Query::parse("query", text).expect("query");
    store
        .search(&Tenant::new(tenant), &[source], &query, filters, 10)
        .await
        .unwrap_or_else(|err| panic!("search {text:?} in {source:?}: {err}"))
}

pub(super) fn described(hits: &[Hit]) -> Vec<String> {
    hits.iter()
        .map(|hit| match &hit.item {
            Item::Entry(e) => format!("{}@{}", e.key.as_str(), e.version),
            Item::Fact(f) => f.current.subject.clone(),
            Item::Episode(e) => e.id.clone(),
        })
        .collect()
}

/// A key is found at its current version only; a tombstone and a purge
/// remove it, and another tenant's key with the same words is never seen.
async fn memory_finds_current_versions_only<S: Store>(store: S, _db: &TestDb) {
    let any = Filters::default();
    let w = writer(&store, "t1");
    w.set("plan", json!({"text": "migrate the orders database"}))
        .await;
    writer(&store, "t2")
        .set("plan", json!({"text": "migrate the orders database"}))
        .await;
    let hits = found(&store, "t1", Source::Memory, "orders database", &any).await;
    assert_eq!(described(&hits), vec!["plan@1"]);
    assert!(
        hits[0].score > 0.0 && hits[0].snippet.contains("**"),
        "{hits:?}"
    );

    w.set("plan", json!({"text": "archive the invoices"})).await;
    assert!(
        found(&store, "t1", Source::Memory, "orders", &any)
            .await
            .is_empty()
    );
    assert_eq!(
        described(&found(&store, "t1", Source::Memory, "invoices", &any).await),
        vec!["plan@2"]
    );
    w.stored("plan", Mutation::Delete, None, None).await;
    assert!(
        found(&store, "t1", Source::Memory, "invoices", &any)
            .await
            .is_empty()
    );

    w.set("other", json!("invoices again")).await;
    let k = key("other");
    let purge = Purge::keeping(&w.scope, Some(&k), None, false, false);
    store
        .purge(
            &w.tenant,
            &purge,
            AuditRecord::new(Operation::Purge, &w.scope, chrono::Utc::now()),
        )
        .await
        .expect("purge");
    assert!(
        found(&store, "t1", Source::Memory, "invoices", &any)
            .await
            .is_empty()
    );
    assert_eq!(
        described(&found(&store, "t2", Source::Memory, "orders", &any).await),
        vec!["plan@1"],
        "the other tenant keeps its own"
    );
}

/// Episodes: the filters narrow, an exact neighbourhood ranks first, and a
/// deleted session takes its episodes out of the index.
async fn episodes_rank_and_filter<S: Store>(store: S, _db: &TestDb) {
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    l.append(
        "s1",
        &[
            episode(
                &s1,
                Some("far"),
                Some("user_message"),
                None,
                json!("the setup was long, the deployment later"),
            ),
            episode(
                &s1,
                Some("near"),
                Some("user_message"),
                None,
                json!("our deployment setup is documented"),
            ),
            episode(
                &s1,
                Some("tool"),
                Some("tool_call"),
                Some("tools"),
                json!({"args": ["deployment"]}),
            ),
        ],
    )
    .await;
    let any = Filters::default();
    let hits = found(&store, "t1", Source::Episodes, "deployment setup", &any).await;
    assert_eq!(described(&hits), vec!["near", "far", "tool"]);
    // Asked again, the same hits with the same scores: plain queries are
    // normalised by Postgres's store in Rust, the others (punctuation) by
    // Postgres and then kept by the store, phrases and exclusions too.
    for text in [
        "deployment setup",
        "\"deployment setup\" -long",
        "setup -\"was long\"",
        "setup, deployment.",
        "\"deployment: setup\" -\"long,\"",
    ] {
        let first = found(&store, "t1", Source::Episodes, text, &any).await;
        let again = found(&store, "t1", Source::Episodes, text, &any).await;
        let scores = |hits: &[Hit]| hits.iter().map(|h| h.score).collect::<Vec<_>>();
        assert_eq!(described(&again), described(&first), "{text}");
        assert_eq!(scores(&again), scores(&first), "{text}");
    }
    assert_eq!(
        described(
            &found(
                &store,
                "t1",
                Source::Episodes,
                "\"deployment setup\" -long",
                &any
            )
            .await
        ),
        vec!["near"]
    );
    assert_eq!(
        described(&found(&store, "t1", Source::Episodes, "setup -\"was long\"", &any).await),
        vec!["near"]
    );
    let tools = Filters {
        agent: Some(name("agent", "tools")),
        ..Filters::default()
    };
    assert_eq!(
        described(&found(&store, "t1", Source::Episodes, "deployment", &tools).await),
        vec!["tool"]
    );
    let bob = Filters {
        user: Some(name("user", "bob")),
        ..Filters::default()
    };
    assert!(
        found(&store, "t1", Source::Episodes, "deployment", &bob)
            .await
            .is_empty()
    );
    assert!(
        found(&store, "t2", Source::Episodes, "deployment", &any)
            .await
            .is_empty()
    );

    store
        .delete_session(&Tenant::new("t1"), &s1, &owner("app", "alice"))
        .await
        .expect("delete");
    assert!(
        found(&store, "t1", Source::Episodes, "deployment", &any)
            .await
            .is_empty()
    );
}

/// What writes left aside in the search indexes (Postgres's pending
/// lists, SQLite's FTS5 segments, one per write transaction) is merged on
/// demand, and found the same before and after.
async fn pending_search_entries_merge<S: Store>(store: S, db: &TestDb) {
    let writes_before = store.search_writes().await.expect("write count");
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    let episodes: Vec<_> = (0..20)
        .map(|n| {
            episode(
                &s1,
                Some(&format!("e{n}")),
                Some("user_message"),
                None,
                json!(format!("kubernetes cluster number {n}")),
            )
        })
        .collect();
    for batch in episodes.chunks(5) {
        l.append("s1", batch).await;
    }
    writer(&store, "t1")
        .set("runbook", json!({"text": "kubernetes upgrade"}))
        .await;
    let tenant = Tenant::new("t1");
    insert(&store, &tenant, &payload("alice", "kubernetes"), &[]).await;
    let any = Filters::default();
    let before = described(&found(&store, "t1", Source::Episodes, "kubernetes", &any).await);
    assert_eq!(before.len(), 10);

    let merged = store.merge_search_pending().await.expect("merge");
    assert!(merged > 0, "{merged} pages merged");
    assert_eq!(store.merge_search_pending().await.expect("merge"), 0);
    let after = described(&found(&store, "t1", Source::Episodes, "kubernetes", &any).await);
    assert_eq!(after, before);
    let memory = found(&store, "t1", Source::Memory, "kubernetes", &any).await;
    assert_eq!(described(&memory), vec!["runbook@1"]);

    // The write count the server watches for a pause, facts' included.
    // Postgres's own, which the writing connections report within a
    // second or so (idle ones within about ten); SQLite's is the store's,
    // exact at once.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let writes = store.search_writes().await.expect("write count");
        if writes >= writes_before + 22 {
            break;
        }
        assert!(
            db.backend == crate::helpers::Backend::Postgres && std::time::Instant::now() < deadline,
            "the write count stayed at {writes} (from {writes_before}) after 22 writes"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Long items are ranked like short ones: a match deep in a long value or
/// episode (its search vector far past a few hundred bytes) is found, with
/// its words marked, and ranks below a short item holding the same word
/// once; an exact phrase at the end of a long item beats the same words
/// apart in another as long.
async fn long_items_rank_by_their_length<S: Store>(store: S, _db: &TestDb) {
    let filler: Vec<String> = (0..150).map(|n| format!("filler{n}")).collect();
    let long = format!("{} invoices overdue", filler.join(" "));
    let apart = format!("invoices {} overdue", filler.join(" "));
    let w = writer(&store, "t1");
    w.set("billing/long", json!({"text": long})).await;
    w.set("billing/short", json!({"text": "invoices sent"}))
        .await;
    w.set("billing/apart", json!({"text": apart})).await;
    let any = Filters::default();
    let hits = found(&store, "t1", Source::Memory, "invoices", &any).await;
    let mut order = described(&hits);
    assert_eq!(order[0], "billing/short@1", "{hits:?}");
    order[1..].sort();
    assert_eq!(order[1..], ["billing/apart@1", "billing/long@1"]);
    assert!(hits[2].score > 0.0, "{hits:?}");
    assert!(hits[1].score < hits[0].score, "{hits:?}");
    assert_eq!(
        hits[1].score, hits[2].score,
        "the same words, the same length"
    );
    assert!(
        hits.iter().all(|h| h.snippet.contains("**invoices**")),
        "{hits:?}"
    );
    let phrase = found(&store, "t1", Source::Memory, "\"invoices overdue\"", &any).await;
    assert_eq!(described(&phrase), vec!["billing/long@1"]);
    let words = found(&store, "t1", Source::Memory, "invoices overdue", &any).await;
    assert_eq!(
        described(&words),
        ["billing/long@1", "billing/apart@1", "billing/short@1"],
        "of two items alike in length, the words side by side first: {words:?}"
    );

    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    l.append(
        "s1",
        &[
            episode(&s1, Some("long"), None, None, json!(long)),
            episode(&s1, Some("short"), None, None, json!("invoices sent")),
        ],
    )
    .await;
    let hits = found(&store, "t1", Source::Episodes, "invoices", &any).await;
    assert_eq!(described(&hits), vec!["short", "long"]);
    assert!(hits[1].snippet.contains("**invoices**"), "{hits:?}");
}

/// A tenant's scores come from its own items alone: another tenant writing
/// the same words under the same names (app, user, session, keys) changes
/// neither the order nor a single score of its hits. (FTS5's `bm25()`
/// counted every tenant's rows in its statistics; SQLite now scores as
/// Postgres does.)
async fn scores_do_not_depend_on_other_tenants<S: Store>(store: S, _db: &TestDb) {
    let any = Filters::default();
    let alice = Filters {
        user: Some(name("user", "alice")),
        ..Filters::default()
    };
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    let mine = [
        "deploy the billing service tonight",
        "billing invoices are overdue",
        "deploy went fine, billing untouched",
        "lunch plans for friday",
    ];
    let episodes: Vec<_> = (0..)
        .zip(mine)
        .map(|(n, text)| episode(&s1, Some(&format!("e{n}")), None, None, json!(text)))
        .collect();
    l.append("s1", &episodes).await;
    let w = writer(&store, "t1");
    w.set("runbook", json!({"text": "deploy billing with care"}))
        .await;
    w.set("notes", json!({"text": "billing questions go to finance"}))
        .await;

    let scored = |hits: Vec<Hit>| -> Vec<(String, f64)> {
        let names = described(&hits);
        names
            .into_iter()
            .zip(hits.iter().map(|h| h.score))
            .collect()
    };
    let searches = [
        (Source::Episodes, "billing deploy", &any),
        (Source::Episodes, "deploy billing", &alice),
        (Source::Memory, "billing deploy", &any),
    ];
    let mut before = Vec::new();
    for (source, text, filters) in searches {
        before.push(scored(found(&store, "t1", source, text, filters).await));
    }
    assert_eq!(before[0].len(), 3, "{before:?}");
    assert_eq!(before[2].len(), 2, "{before:?}");

    // Another tenant, the same names, many more items with the words.
    let other = log(&store, "t2");
    other.create("s1", "app", "alice", 0).await;
    let theirs: Vec<_> = (0..60)
        .map(|n| {
            let text = if n % 3 == 0 {
                format!("billing run {n}")
            } else {
                format!("deploy billing billing step {n}")
            };
            episode(&s1, Some(&format!("e{n}")), None, None, json!(text))
        })
        .collect();
    for batch in theirs.chunks(20) {
        other.append("s1", batch).await;
    }
    let w2 = writer(&store, "t2");
    for n in 0..30 {
        w2.set(&format!("k{n}"), json!({"text": format!("billing {n}")}))
            .await;
    }
    w2.set("runbook", json!("deploy")).await;
    store.merge_search_pending().await.expect("merge");

    for ((source, text, filters), before) in searches.into_iter().zip(&before) {
        let after = scored(found(&store, "t1", source, text, filters).await);
        assert_eq!(&after, before, "{source:?} {text}");
    }
}

/// Hits of different sources are ranked on one scale: a term weighs what
/// it weighs among every item searched, so a fact holding both words of
/// the question outranks an episode holding one of them, although among
/// the few facts both words are common and among the many episodes the
/// one word is rare. Scored by each source's own statistics, the episode
/// came first.
async fn sources_are_ranked_on_one_scale<S: Store>(store: S, _db: &TestDb) {
    let t1 = Tenant::new("t1");
    for (subject, object) in [
        ("alice", "the kubernetes cluster on gke"),
        ("bob", "kubernetes upgrades"),
        ("carol", "kubernetes dashboards"),
    ] {
        insert(&store, &t1, &payload(subject, object), &[]).await;
    }
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    let mut said: Vec<_> = (0..39)
        .map(|n| {
            let text = format!("lunch plans for day {n}");
            episode(&s1, Some(&format!("e{n}")), None, None, json!(text))
        })
        .collect();
    said.push(episode(
        &s1,
        Some("slow"),
        None,
        None,
        json!("the cluster was slow this morning"),
    ));
    l.append("s1", &said).await;

    let query = Query::parse("query", "kubernetes cluster").expect("query");
    let search = |sources: &'static [Source]| {
        let (store, query, t1) = (&store, &query, &t1);
        async move {
            let mut hits = store
                .search(t1, sources, query, &Filters::default(), 10)
                .await
                .expect("search");
            // Best first, as the service merges them.
            hits.sort_by(|a, b| b.score.total_cmp(&a.score));
            described(&hits)
        }
    };
    let both = search(&[Source::Facts, Source::Episodes]).await;
    assert_eq!(both.len(), 4, "{both:?}");
    assert_eq!(both[0], "alice", "{both:?}");
    let at = |name: &str| both.iter().position(|n| n == name);
    assert!(at("alice") < at("slow"), "{both:?}");
    // Each source alone keeps its own order.
    assert_eq!(search(&[Source::Facts]).await[0], "alice");
    assert_eq!(search(&[Source::Episodes]).await, ["slow"]);
}

/// A fact's snippet shows its content, led by the parts of its triple the
/// content does not say: a fact restating its triple showed it twice
/// ("alice likes tea alice likes tea").
async fn fact_snippets_say_the_triple_once<S: Store>(store: S, _db: &TestDb) {
    let t1 = Tenant::new("t1");
    insert(&store, &t1, &payload("alice", "green tea"), &[]).await;
    let mut terse = payload("maya", "Postgres");
    terse.predicate = "migrates_to".into();
    terse.content = json!("Moving the data platform's pipelines off Hadoop");
    insert(&store, &t1, &terse, &[]).await;
    let mut bare = payload("jon", "chemistry");
    bare.predicate = "teaches".into();
    bare.content = json!(null);
    insert(&store, &t1, &bare, &[]).await;
    let any = Filters::default();
    for (query, snippet) in [
        ("tea", "alice likes green **tea**"),
        ("alice", "**alice** likes green tea"),
        (
            "pipelines",
            "maya migrates_to Postgres — Moving the data platform's **pipelines** off Hadoop",
        ),
        ("teaches", "jon **teaches** chemistry"),
    ] {
        let hits = found(&store, "t1", Source::Facts, query, &any).await;
        assert_eq!(hits.len(), 1, "{query}: {:?}", described(&hits));
        assert_eq!(hits[0].snippet, snippet, "{query}");
    }
}

/// Both stores find the same episodes, memory entries and facts for the
/// same queries over the same conversations: the labeled set's 72 turns
/// (as episodes, memory values and facts), asked its 40 questions and
/// queries made from every turn (its opening words, a quoted phrase from
/// it, a word with another excluded) and a list of awkward forms
/// (contractions, possessives, hyphens, addresses), each by session and
/// by user (memory and facts without a filter). The stores read queries differently (Postgres a tsquery,
/// SQLite an FTS5 expression), so a reading that differs shows here as
/// a different set of hits; SQLite's reading of `Lucia's` did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_stores_find_the_same_episodes_for_the_same_queries() {
    use engram::ports::Database;
    use engram::search::ports::SearchStore;

    let sqlite_db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    let sqlite = sqlite_db.sqlite_store().await;
    sqlite.migrate().await.expect("migrate");
    let pg_db = TestDb::new(crate::helpers::Backend::Postgres).await;
    let pg = pg_db.pg_store().await;
    pg.migrate().await.expect("migrate");

    let data = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/recall.jsonl"
    ))
    .expect("the labeled set");
    let mut queries: Vec<(String, &str)> = Vec::new();
    let mut conversations: Vec<(String, Vec<(String, String)>)> = Vec::new();
    for line in data.lines().filter(|l| !l.trim().is_empty()) {
        let record: serde_json::Value = serde_json::from_str(line).expect("json line");
        let conversation = record["conversation"].as_str().expect("conversation");
        let session = if conversation == "c1" { "c1" } else { "c2" };
        if let Some(question) = record["question"].as_str() {
            queries.push((question.to_owned(), session));
            continue;
        }
        let mut turns = Vec::new();
        for turn in record["turns"].as_array().expect("turns") {
            let text = turn["text"].as_str().expect("text");
            let words: Vec<&str> = text.split_whitespace().collect();
            let middle = words.len() / 2;
            queries.push((words[..words.len().min(3)].join(" "), session));
            if words.len() > 3 {
                queries.push((format!("\"{}\"", words[1..3].join(" ")), session));
                queries.push((format!("{} -{}", words[middle], words[0]), session));
            }
            let id = turn["id"].as_str().expect("id");
            turns.push((format!("{session}-{id}"), text.to_owned()));
        }
        conversations.push((session.to_owned(), turns));
    }
    for awkward in [
        "don't",
        "it's",
        "I'm",
        "Jon's cat",
        "half-marathon",
        "state-of-the-art",
        "e-mail",
        "Porto's",
        "-the cat",
        "cat -Pepper",
        "GR10",
        "10",
        "2pm",
        "o'clock",
        "U.S.",
        "co-op",
        "Hadoop's",
        "'quoted'",
        "(Pepper)",
        "#hashtag",
        "@maya",
        "maya@example.com",
        "what's up",
        "you'll",
        "isn't it",
        "\"the twins\"",
    ] {
        queries.push((awkward.to_owned(), "c1"));
        queries.push((awkward.to_owned(), "c2"));
    }
    for (session, turns) in &conversations {
        let sid = id(session);
        let episodes: Vec<_> = turns
            .iter()
            .map(|(name, text)| episode(&sid, Some(name), None, None, json!(text)))
            .collect();
        let l = log(&sqlite, "t1");
        l.create(session, "app", "alice", 0).await;
        l.append(session, &episodes).await;
        let l = log(&pg, "t1");
        l.create(session, "app", "alice", 0).await;
        l.append(session, &episodes).await;
        // And each turn as a memory value under the turn's name, and as
        // a fact whose subject is that name.
        let t1 = Tenant::new("t1");
        for (name, text) in turns {
            writer(&sqlite, "t1")
                .set(name, json!({ "text": text }))
                .await;
            writer(&pg, "t1").set(name, json!({ "text": text })).await;
            insert(&sqlite, &t1, &payload(name, text), &[]).await;
            insert(&pg, &t1, &payload(name, text), &[]).await;
        }
    }

    let t1 = Tenant::new("t1");
    let mut differ = Vec::new();
    let mut found_in = std::collections::HashMap::new();
    for (text, session) in &queries {
        let Ok(query) = Query::parse("query", text) else {
            continue; // refused alike: the parse is shared
        };
        let by_session = Filters {
            session_id: Some(id(session)),
            ..Filters::default()
        };
        let by_user = Filters {
            user: Some(name("user", "alice")),
            ..Filters::default()
        };
        let any = Filters::default();
        for (source, filters) in [
            (Source::Episodes, &by_session),
            (Source::Episodes, &by_user),
            (Source::Memory, &any),
            (Source::Facts, &any),
        ] {
            let mut found = Vec::new();
            for hits in [
                sqlite.search(&t1, &[source], &query, filters, 100).await,
                pg.search(&t1, &[source], &query, filters, 100).await,
            ] {
                let mut ids = described(&hits.unwrap_or_else(|e| panic!("{text:?}: {e}")));
                ids.sort();
                found.push(ids);
            }
            *found_in.entry(source).or_insert(0) += usize::from(!found[1].is_empty());
            if found[0] != found[1] {
                differ.push(format!(
                    "{text:?} in {source:?}: SQLite {:?}, Postgres {:?}",
                    found[0], found[1]
                ));
            }
        }
    }
    assert!(queries.len() > 250, "{}", queries.len());
    // Most queries find something, in either source.
    for source in [Source::Episodes, Source::Memory, Source::Facts] {
        assert!(found_in[&source] > queries.len() / 2, "{found_in:?}");
    }
    assert!(
        differ.is_empty(),
        "{} of {} differ:\n{}",
        differ.len(),
        queries.len(),
        differ.join("\n")
    );
}

/// What each source finds for `query` in tenant t1: episodes, then
/// memory, then facts.
pub(super) async fn found_everywhere<S: Store>(store: &S, query: &str) -> Vec<String> {
    let mut hits = Vec::new();
    for source in [Source::Episodes, Source::Memory, Source::Facts] {
        hits.extend(described(
            &found(store, "t1", source, query, &Filters::default()).await,
        ));
    }
    hits
}

store_suite!(
    memory_finds_current_versions_only,
    scores_do_not_depend_on_other_tenants,
    sources_are_ranked_on_one_scale,
    episodes_rank_and_filter,
    long_items_rank_by_their_length,
    pending_search_entries_merge,
    fact_snippets_say_the_triple_once,
);
