//! Search at the store level: each source finds only live items of the
//! caller's tenant, at their current version, best first, and what a call
//! removed is gone when it returns.

use engram::context::Tenant;
use engram::memory::audit::{AuditRecord, Operation};
use engram::memory::ports::{Mutation, Purge};
use engram::ports::Store;
use engram::search::{Filters, Hit, Item, Query, Source};
use serde_json::json;
use unicode_normalization::UnicodeNormalization;

use super::consolidation::{insert, payload};
use super::fixtures::{episode, id, log, name, owner};
use super::{key, writer};
use crate::helpers::TestDb;

async fn found<S: Store>(
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

fn described(hits: &[Hit]) -> Vec<String> {
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

/// Each query of `cases` finds `item` alone in `source` of tenant t1, with
/// the given words marked in its snippet.
async fn found_and_marked<S: Store>(store: &S, source: Source, item: &str, cases: &[(&str, &str)]) {
    for (query, marked) in cases {
        let hits = found(store, "t1", source, query, &Filters::default()).await;
        assert_eq!(described(&hits), [item], "{source:?} {query}");
        assert!(
            hits[0].snippet.contains(marked),
            "{source:?} {query}: {}",
            hits[0].snippet
        );
    }
}

/// Writes `text` to tenant t1 as episode `e1` of alice's session s1 and as
/// the value of `key`, and a fact of `ops@example.com` liking `object`.
async fn write_everywhere<S: Store>(store: &S, text: &str, key: &str, object: &str) {
    let l = log(store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    l.append("s1", &[episode(&s1, Some("e1"), None, None, json!(text))])
        .await;
    writer(store, "t1").set(key, json!({"text": text})).await;
    insert(
        store,
        &Tenant::new("t1"),
        &payload("ops@example.com", object),
        &[],
    )
    .await;
}

/// A file name, a host and an email are found by each of their parts and
/// whole, in memory, facts and episodes alike, and the snippet marks the
/// part found.
async fn compounds_are_found_by_their_parts<S: Store>(store: S, _db: &TestDb) {
    let any = Filters::default();
    let text = "fixed src/auth/validate.ts, README.md and config1.yaml; \
                mail ops-team@example.com about build 3.14 and covid-19";
    write_everywhere(&store, text, "notes/deploy.md", "validate.ts").await;
    let expected = [
        (Source::Episodes, "e1"),
        (Source::Memory, "notes/deploy.md@1"),
        (Source::Facts, "ops@example.com"),
    ];
    for (source, item) in expected {
        let cases = [
            ("validate", "**validate**"),
            ("ts", "**ts**"),
            ("validate.ts", "**validate.ts**"),
            ("example", "**example**"),
            ("example.com", "**example.com**"),
        ];
        found_and_marked(&store, source, item, &cases).await;
    }
    for (source, item) in &expected[..2] {
        for query in [
            "readme",
            "README.md",
            "yaml",
            "config1",
            "ops-team",
            "\"3.14\"",
            "19",
            "covid-19",
        ] {
            let hits = found(&store, "t1", *source, query, &any).await;
            assert_eq!(described(&hits), [*item], "{source:?} {query}");
        }
    }
    // The memory key's own parts.
    let hits = found(&store, "t1", Source::Memory, "deploy", &any).await;
    assert_eq!(described(&hits), ["notes/deploy.md@1"]);

    // A compound asked for is its parts side by side, not any of them.
    let s1 = id("s1");
    log(&store, "t1")
        .append(
            "s1",
            &[
                episode(&s1, Some("e2"), None, None, json!("user_42 logged in")),
                episode(&s1, Some("e3"), None, None, json!("a user with 42 keys")),
                episode(&s1, Some("e4"), None, None, json!("the ts of validate")),
            ],
        )
        .await;
    for (query, want) in [
        ("user_42", vec!["e2"]),
        ("user", vec!["e2", "e3"]),
        ("validate.ts", vec!["e1"]),
        ("validate.ts user_42", vec!["e1", "e2"]),
    ] {
        let mut hits = described(&found(&store, "t1", Source::Episodes, query, &any).await);
        hits.sort();
        assert_eq!(hits, want, "{query}");
    }
}

/// Letters with diacritics are found without them and with them (`café`
/// by `cafe`, `naive` by `naïve`), in memory, facts and episodes alike.
async fn diacritics_are_read_without_them<S: Store>(store: S, _db: &TestDb) {
    let any = Filters::default();
    write_everywhere(
        &store,
        "the café menu and naïve Bayes",
        "menu",
        "crème brûlée",
    )
    .await;
    for (source, item) in [(Source::Episodes, "e1"), (Source::Memory, "menu@1")] {
        let cases = [
            ("cafe", "**café**"),
            ("café", "**café**"),
            ("CAFÉ", "**café**"),
            ("naive", "**naïve**"),
            ("naïve", "**naïve**"),
        ];
        found_and_marked(&store, source, item, &cases).await;
    }
    for query in ["creme", "brûlée", "brulee"] {
        let hits = found(&store, "t1", Source::Facts, query, &any).await;
        assert_eq!(described(&hits), ["ops@example.com"], "{query}");
    }
}

/// Words are stemmed alike on both stores (Snowball's English stemmer,
/// as Postgres's `english` configuration): a word's other forms find it
/// and are marked, in memory, facts and episodes. FTS5's Porter stemmer,
/// which SQLite used before migration 0014, read `deploy` as `deploi` and
/// `deployment` as `deploy`, and `https` as `http`.
async fn word_forms_are_stemmed_as_postgres_stems_them<S: Store>(store: S, _db: &TestDb) {
    let any = Filters::default();
    write_everywhere(
        &store,
        "we deploy with Argo over https on Fridays",
        "setup",
        "deploy",
    )
    .await;
    for (source, item) in [
        (Source::Episodes, "e1"),
        (Source::Memory, "setup@1"),
        (Source::Facts, "ops@example.com"),
    ] {
        let cases = [
            ("deployment", "**deploy**"),
            ("deployments", "**deploy**"),
            ("deploying", "**deploy**"),
            ("deployed", "**deploy**"),
        ];
        found_and_marked(&store, source, item, &cases).await;
    }
    for (source, item) in [(Source::Episodes, "e1"), (Source::Memory, "setup@1")] {
        found_and_marked(&store, source, item, &[("friday", "**Fridays**")]).await;
        let hits = found(&store, "t1", source, "http", &any).await;
        assert!(hits.is_empty(), "{source:?}: http is not https");
    }
}

/// A query of stop words alone looks for nothing and finds nothing, and
/// a quoted phrase or an exclusion of stop words alone changes nothing,
/// on both stores (Postgres drops stop words from a query; FTS5 indexes
/// them, so SQLite once found every item holding "the").
async fn stop_words_alone_find_nothing<S: Store>(store: S, _db: &TestDb) {
    let any = Filters::default();
    write_everywhere(&store, "We deploy with Argo on Fridays", "setup", "deploy").await;
    for source in [Source::Episodes, Source::Memory, Source::Facts] {
        for query in ["we", "the with", "don't", "\"with the\"", "it's -on"] {
            let hits = found(&store, "t1", source, query, &any).await;
            assert!(
                hits.is_empty(),
                "{source:?} {query}: {:?}",
                described(&hits)
            );
        }
    }
    for query in ["deploy \"the\"", "deploy -with", "deploy -we"] {
        let hits = found(&store, "t1", Source::Episodes, query, &any).await;
        assert_eq!(described(&hits), ["e1"], "{query}");
    }
}

/// A session `session` of tenant `t1` holding an episode of each of
/// `said` (its id and its text); the filters that keep to it.
async fn said_in<S: Store>(store: &S, session: &str, said: &[(&str, &str)]) -> Filters {
    let l = log(store, "t1");
    let session_id = id(session);
    l.create(session, "app", "alice", 0).await;
    let episodes: Vec<_> = said
        .iter()
        .map(|(e, text)| episode(&session_id, Some(e), None, None, json!(text)))
        .collect();
    l.append(session, &episodes).await;
    Filters {
        session_id: Some(session_id),
        ..Filters::default()
    }
}

/// The episodes of tenant `t1` that `query` finds within `filters`: their
/// ids and their snippets, best first.
async fn episodes_found<S: Store>(
    store: &S,
    filters: &Filters,
    query: &str,
) -> (Vec<String>, Vec<String>) {
    let hits = found(store, "t1", Source::Episodes, query, filters).await;
    let snippets: Vec<String> = hits.iter().map(|h| h.snippet.clone()).collect();
    (described(&hits), snippets)
}

/// Chinese, Japanese and Korean characters are words of their own on both
/// stores, and a query word of them looks for its pairs of neighbouring
/// characters: `東京` finds "東京での会議は明日です" in memory, facts and
/// episodes (Postgres's parser, and SQLite's tokenizer before its reading
/// 5, read the run as one word, found only whole). The run itself ranks
/// above its characters scattered; a quoted run needs them side by side;
/// snippets mark the characters found. Thai, also written without
/// spaces, is still a word per run (the README says so).
async fn cjk_text_is_found_by_its_words<S: Store>(store: S, _db: &TestDb) {
    let text = "Café in Zürich. 東京での会議は明日です。";
    write_everywhere(&store, text, "notes/trip", "東京出張").await;
    let everywhere = ["e1", "notes/trip@1", "ops@example.com"];
    for query in ["東京", "東京での会議は明日です", "東京 zurich"] {
        assert_eq!(found_everywhere(&store, query).await, everywhere, "{query}");
    }
    for query in ["会議", "明日", "\"会議は明日\"", "は明"] {
        assert_eq!(
            found_everywhere(&store, query).await,
            ["e1", "notes/trip@1"],
            "{query}"
        );
    }
    for query in ["京都", "\"明日は会議\"", "日東"] {
        assert_eq!(
            found_everywhere(&store, query).await,
            Vec::<String>::new(),
            "{query}"
        );
    }

    let said = [
        ("dark", "深色模式已开启。"),
        ("scattered", "深夜里，颜色和模式都变了。"),
        ("light", "我喜欢浅色"),
        ("japanese", "GPT模型をデプロイする"),
        ("korean", "한국어 검색 기능"),
        ("thai", "สวัสดีครับ"),
        ("decimal", "第3.5章を読んだ"),
        ("thai-tone", "ผมไม่ชอบกาแฟ"),
    ];
    let s2_only = said_in(&store, "s2", &said).await;
    let search = async |query: &str| episodes_found(&store, &s2_only, query).await;
    let (hits, snippets) = search("深色模式").await;
    assert_eq!(hits, ["dark", "scattered"], "{snippets:?}");
    assert_eq!(snippets[0], "**深色模式**已开启。");
    assert_eq!(snippets[1], "深夜里，颜色和**模式**都变了。");
    assert_eq!(search("深色").await.0, ["dark"]);
    assert_eq!(search("\"色模\"").await.0, ["dark"]);
    assert_eq!(search("模式 -深色").await.0, ["scattered"]);
    assert_eq!(search("色").await.0.len(), 3);
    let (hits, snippets) = search("デプロイ").await;
    assert_eq!(hits, ["japanese"]);
    assert_eq!(snippets, ["GPT模型を**デプロイ**する"]);
    assert_eq!(search("gpt 模型").await.0, ["japanese"]);
    assert_eq!(search("국어").await.0, ["korean"]);
    assert_eq!(search("검색").await.1, ["한국어 **검색** 기능"]);
    assert_eq!(search("สวัสดีครับ").await.0, ["thai"]);
    // A tone mark (a combining mark, not a letter) is part of its
    // cluster, in the index and in the snippet: Postgres's snippet had cut
    // the run there and marked nothing.
    let (hits, snippets) = search("ผมไม่ชอบกาแฟ").await;
    assert_eq!(hits, ["thai-tone"]);
    assert_eq!(snippets, ["**ผมไม่ชอบกาแฟ**"]);
    // A number beside such characters is one word, as between spaces:
    // `3.5`, not `3` and `5` (SQLite's reading 5 split it, and neither
    // `3.5` nor the quoted run found it there).
    for query in ["3.5", "\"第3.5章\"", "第3.5章"] {
        assert_eq!(search(query).await.0, ["decimal"], "{query}");
    }
    assert_eq!(search("3.5").await.1, ["第**3.5**章を読んだ"]);
    assert_eq!(search("5").await.0, Vec::<String>::new());
}

/// Thai, Lao, Khmer and Burmese, written without spaces between words,
/// are found by any part of a run: each cluster (a letter and its marks)
/// is a word, and a query's run must stand whole, its clusters side by
/// side and in order. Until Postgres's 0030 and SQLite's 0021 a run was
/// one word, found only whole.
async fn cluster_scripts_are_found_by_their_words<S: Store>(store: S, _db: &TestDb) {
    let said = [
        ("coffee", "ผมไม่ชอบกาแฟ"),
        ("hello", "สวัสดีครับ ยินดีที่ได้รู้จัก"),
        ("price", "ราคา3.14บาท"),
        ("lao", "ສະບາຍດີ ຂ້ອຍມັກກາເຟ"),
        ("khmer", "ខ្ញុំមិនចូលចិត្តកាហ្វេទេ"),
        ("burmese", "ကျွန်တော် ကော်ဖီ မကြိုက်ဘူး"),
        ("mixed", "deploy ด้วย helm ที่ staging"),
    ];
    let s3_only = said_in(&store, "s3", &said).await;
    let search = async |query: &str| episodes_found(&store, &s3_only, query).await;
    let (hits, snippets) = search("กาแฟ").await;
    assert_eq!(hits, ["coffee"]);
    assert_eq!(snippets, ["ผมไม่ชอบ**กาแฟ**"]);
    assert_eq!(search("ไม่ชอบ").await.0, ["coffee"]);
    assert_eq!(search("สวัสดี").await.1, ["**สวัสดี**ครับ ยินดีที่ได้รู้จัก"]);
    assert_eq!(search("\"ยินดีที่ได้\"").await.0, ["hello"]);
    // Any of the words may match; the run must stand whole and in order.
    assert_eq!(search("กาแฟ สวัสดี").await.0.len(), 2);
    for query in ["แฟกา", "ไม่ชอบกาแฟครับ", "กาแฟ -ชอบ"]
    {
        assert_eq!(search(query).await.0, Vec::<String>::new(), "{query}");
    }
    // A tone mark is part of its cluster: without it, it is another one.
    assert_eq!(search("ไมชอบ").await.0, Vec::<String>::new());
    // A number beside clusters is one word, as between spaces.
    for query in ["3.14", "ราคา", "บาท", "\"ราคา3.14บาท\""] {
        assert_eq!(search(query).await.0, ["price"], "{query}");
    }
    assert_eq!(search("3.14").await.1, ["ราคา**3.14**บาท"]);
    assert_eq!(search("14").await.0, Vec::<String>::new());
    assert_eq!(search("ກາເຟ").await.0, ["lao"]);
    assert_eq!(search("កាហ្វេ").await.0, ["khmer"]);
    assert_eq!(search("ကော်ဖီ").await.0, ["burmese"]);
    assert_eq!(search("ကြိုက်").await.1, ["ကျွန်တော် ကော်ဖီ မ**ကြိုက်**ဘူး"]);
    let (hits, snippets) = search("helm ด้วย").await;
    assert_eq!(hits, ["mixed"]);
    assert_eq!(snippets, ["deploy **ด้วย** **helm** ที่ staging"]);
}

/// Scripts written with spaces between words are found by each word on
/// both stores, their marks and accents part of it: Devanagari, Arabic,
/// Hebrew, Greek, Cyrillic, Armenian, Georgian, Tamil, Bengali, Amharic,
/// and Vietnamese, whose accents fold away as French's do.
async fn spaced_scripts_are_found_by_each_word<S: Store>(store: S, _db: &TestDb) {
    let said = [
        ("hindi", "मुझे कॉफ़ी पसंद नहीं है"),
        ("arabic", "لا أحب القهوة كثيرا"),
        ("hebrew", "אני לא אוהב קפה"),
        ("greek", "Δεν μου αρέσει ο καφές"),
        ("russian", "Я не люблю кофе"),
        ("armenian", "Ես չեմ սիրում սուրճ"),
        ("georgian", "მე არ მიყვარს ყავა"),
        ("tamil", "எனக்கு காபி பிடிக்காது"),
        ("bengali", "আমি কফি পছন্দ করি না"),
        ("amharic", "ቡና አልወድም"),
        ("vietnamese", "Tôi không thích cà phê sữa"),
    ];
    let only = said_in(&store, "s4", &said).await;
    for (query, want, snippet) in [
        ("कॉफ़ी", "hindi", "मुझे **कॉफ़ी** पसंद नहीं है"),
        ("القهوة", "arabic", "لا أحب **القهوة** كثيرا"),
        ("קפה", "hebrew", "אני לא אוהב **קפה**"),
        ("καφές", "greek", "Δεν μου αρέσει ο **καφές**"),
        ("кофе", "russian", "Я не люблю **кофе**"),
        ("սուրճ", "armenian", "Ես չեմ սիրում **սուրճ**"),
        ("ყავა", "georgian", "მე არ მიყვარს **ყავა**"),
        ("காபி", "tamil", "எனக்கு **காபி** பிடிக்காது"),
        ("কফি", "bengali", "আমি **কফি** পছন্দ করি না"),
        ("ቡና", "amharic", "**ቡና** አልወድም"),
        // Vietnamese is found without its accents, as French is.
        (
            "\"ca phe\" sua",
            "vietnamese",
            "Tôi không thích **cà** **phê** **sữa**",
        ),
    ] {
        let (hits, snippets) = episodes_found(&store, &only, query).await;
        assert_eq!(hits, [want], "{query}");
        assert_eq!(snippets, [snippet], "{query}");
    }
}

/// Arabic's and Hebrew's vowel points (and the tatweel) are read as if
/// not written, on both stores: a vocalised word and the bare one find
/// each other, and the snippet marks the word as the item wrote it.
async fn vowel_points_are_read_as_if_not_written<S: Store>(store: S, _db: &TestDb) {
    let said = [
        ("vocalised", "أُحِبُّ القَهْوَةَ كَثِيرًا"),
        ("bare", "أحب القهوة كثيرا"),
        ("stretched", "القـــهوة"),
        ("niqqud", "שָׁלוֹם עֲלֵיכֶם"),
        ("plain-hebrew", "שלום לכולם"),
    ];
    let only = said_in(&store, "s5", &said).await;
    let (hits, snippets) = episodes_found(&store, &only, "القهوة").await;
    assert_eq!(hits.len(), 3, "{hits:?}");
    assert!(
        snippets.contains(&"أُحِبُّ **القَهْوَةَ** كَثِيرًا".to_owned()),
        "{snippets:?}"
    );
    assert!(
        snippets.contains(&"**القـــهوة**".to_owned()),
        "{snippets:?}"
    );
    assert_eq!(episodes_found(&store, &only, "القَهْوَةَ").await.0.len(), 3);
    assert_eq!(
        episodes_found(&store, &only, "\"أحب القهوة\"")
            .await
            .0
            .len(),
        2
    );
    let (hits, snippets) = episodes_found(&store, &only, "שלום").await;
    assert_eq!(hits.len(), 2, "{hits:?}");
    assert!(
        snippets.contains(&"**שָׁלוֹם** עֲלֵיכֶם".to_owned()),
        "{snippets:?}"
    );
    assert_eq!(episodes_found(&store, &only, "עֲלֵיכֶם").await.0, ["niqqud"]);
}

/// The Arabic script's letters written more than one way find each
/// other: an alef with or without its hamza or madda, a teh marbuta
/// written as a heh, an alef maksura as a yeh, the Persian and Urdu yeh,
/// kaf and heh as the Arabic ones; snippets mark the word as written. The
/// Urdu yeh barree stays a letter of its own. A word is found with or
/// without the article and what is written before it.
async fn arabic_words_are_read_alike<S: Store>(store: S, _db: &TestDb) {
    let said = [
        ("hamza", "ذهب أحمد إلى المدرسة"),
        ("bare", "ذهب احمد الى المدرسه"),
        ("persian", "این کتاب خوبی است"),
        ("arabic-letters", "هذا كتاب جيد"),
        ("urdu", "یہ کتاب ہے"),
        ("urdu-hi", "یہ کتاب ہی"),
        ("commitment", "نحن ملتزمون بالالتزام الكامل"),
        ("school", "مدرسة جديدة"),
    ];
    let only = said_in(&store, "s6", &said).await;
    for query in ["أحمد", "احمد", "\"إلى المدرسة\"", "\"الى المدرسه\""]
    {
        let (mut hits, _) = episodes_found(&store, &only, query).await;
        hits.sort();
        assert_eq!(hits, ["bare", "hamza"], "{query}");
    }
    for query in ["المدرسه", "مدرسة", "بالمدرسة"] {
        let (mut hits, snippets) = episodes_found(&store, &only, query).await;
        assert!(
            snippets.contains(&"ذهب أحمد إلى **المدرسة**".to_owned()),
            "{snippets:?}"
        );
        hits.sort();
        assert_eq!(hits, ["bare", "hamza", "school"], "{query}");
    }
    let (hits, snippets) = episodes_found(&store, &only, "التزام").await;
    assert_eq!(hits, ["commitment"]);
    assert_eq!(snippets, ["نحن ملتزمون **بالالتزام** الكامل"]);
    let (mut hits, _) = episodes_found(&store, &only, "كتاب").await;
    hits.sort();
    assert_eq!(hits, ["arabic-letters", "persian", "urdu", "urdu-hi"]);
    assert_eq!(episodes_found(&store, &only, "ہے").await.0, ["urdu"]);
    assert_eq!(
        episodes_found(&store, &only, "\"یه کتاب\"").await.0.len(),
        2
    );
}

/// Text in Unicode's decomposed form (a Korean syllable as its jamo, as
/// macOS writes file names; a kana and its combining voiced mark; a
/// letter and its accent; a waw and its hamza) reads as its composed form
/// in memory, facts and episodes: a query in either form finds text in
/// either, and snippets show the text composed.
async fn decomposed_text_reads_as_composed<S: Store>(store: S, _db: &TestDb) {
    let nfd = |text: &str| -> String { text.nfd().collect() };
    let text = "한국어 문서 がっこう Café رؤية";
    let decomposed = nfd(text);
    assert_ne!(decomposed, text);
    write_everywhere(&store, &decomposed, "notes/nfd", &decomposed).await;
    let everywhere = ["e1", "notes/nfd@1", "ops@example.com"];
    for query in ["한국어", "문서", "\"がっこう\"", "café", "رؤية", text] {
        assert_eq!(found_everywhere(&store, query).await, everywhere, "{query}");
        let query = nfd(query);
        assert_eq!(
            found_everywhere(&store, &query).await,
            everywhere,
            "{query}"
        );
    }
    let meeting = "회의는 내일입니다";
    let said = [("composed", meeting), ("decomposed", &nfd(meeting))];
    let only = said_in(&store, "s7", &said).await;
    for query in ["내일", &nfd("내일")] {
        let (mut hits, snippets) = episodes_found(&store, &only, query).await;
        hits.sort();
        assert_eq!(hits, ["composed", "decomposed"], "{query}");
        assert_eq!(snippets[0], snippets[1]);
        assert!(snippets[0].contains("**"), "{snippets:?}");
        assert_eq!(snippets[0].replace("**", ""), meeting);
    }
}

/// The Arabic script's digits, Arabic-Indic and the extended ones Persian
/// and Urdu write, read as ASCII digits: `٣٤` and `۳۴` find `34`, and
/// `34` finds them; a decimal is whole; snippets mark the digits as
/// written.
async fn arabic_digits_read_as_ascii<S: Store>(store: S, _db: &TestDb) {
    let said = [
        ("arabic", "الصفحة ٣٤ من الكتاب"),
        ("persian", "صفحه ۳۴ کتاب"),
        ("ascii", "page 34 of the book"),
        ("decimal", "السعر ٣.١٤ دينار"),
        ("other", "page 35"),
    ];
    let only = said_in(&store, "s8", &said).await;
    for query in ["34", "٣٤", "۳۴"] {
        let (mut hits, _) = episodes_found(&store, &only, query).await;
        hits.sort();
        assert_eq!(hits, ["arabic", "ascii", "persian"], "{query}");
    }
    for query in ["3.14", "٣.١٤", "\"السعر 3.14\""] {
        assert_eq!(
            episodes_found(&store, &only, query).await.0,
            ["decimal"],
            "{query}"
        );
    }
    let (mut hits, _) = episodes_found(&store, &only, "\"صفحة 34\"").await;
    hits.sort();
    assert_eq!(hits, ["arabic", "persian"]);
    let (hits, snippets) = episodes_found(&store, &only, "۳۴ کتاب").await;
    let persian = hits.iter().position(|h| h == "persian").expect("found");
    assert_eq!(snippets[persian], "صفحه **۳۴** **کتاب**");
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

/// The stop words a query word or phrase starts or ends with are dropped
/// from it, as Postgres drops them: "Lucia's" finds Lucia written without
/// her `'s`, and "the staging cluster" finds "a staging cluster". On
/// SQLite, which indexes every word, "Lucia's" looked for `lucia` followed
/// by `s`, and "Where is Lucia's wedding?" found nothing.
async fn stop_words_at_the_ends_of_a_phrase_are_dropped<S: Store>(store: S, _db: &TestDb) {
    let any = Filters::default();
    said(
        &store,
        &[
            ("lucia", "My cousin Lucia is getting married in Seville."),
            ("cluster", "a staging cluster went down at noon"),
            ("pepper", "Jon's cat is called Pepper."),
        ],
    )
    .await;
    for (query, want) in [
        ("Where is Lucia's wedding?", &["lucia"][..]),
        ("Lucia's", &["lucia"]),
        ("\"the staging cluster\"", &["cluster"]),
        ("\"a staging cluster, was it?\"", &["cluster"]),
        ("Jon's", &["pepper"]),
        ("Jon", &["pepper"]),
        ("pepper -Jon's", &[]),
    ] {
        let hits = found(&store, "t1", Source::Episodes, query, &any).await;
        assert_eq!(described(&hits), want, "{query}");
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

/// A Postgres store at the schema before migration 0020's reading.
async fn before_the_reading() -> (TestDb, engram::store::PgStore) {
    use engram::ports::Database;

    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    let store = db.pg_store().await;
    store
        .migrate_through(Some(19))
        .await
        .expect("the schema before");
    (db, store)
}

/// What a database held before migration 0020 read compounds whole; the
/// migration reads them again, so a memory value, a fact and an episode
/// written then are found by their parts after it, as before it only by
/// the whole compound.
#[tokio::test]
async fn compounds_written_before_their_reading_are_found_after_the_migration() {
    use engram::ports::Database;

    let (_db, store) = before_the_reading().await;
    // A `~` keeps the episode's text from the server's reader, so the
    // previous trigger builds its vector, as it did then.
    let text = "validate.ts takes ~1.5 s";
    write_everywhere(&store, text, "notes", "cats").await;
    let any = Filters::default();
    let everywhere = async |query: &str| {
        let mut hits = Vec::new();
        for source in [Source::Episodes, Source::Memory, Source::Facts] {
            hits.extend(described(&found(&store, "t1", source, query, &any).await));
        }
        hits
    };
    assert_eq!(everywhere("validate").await, Vec::<String>::new());
    assert_eq!(everywhere("example").await, Vec::<String>::new());

    store.migrate().await.expect("migrate");
    assert_eq!(everywhere("validate").await, ["e1", "notes@1"]);
    assert_eq!(everywhere("validate.ts").await, ["e1", "notes@1"]);
    assert_eq!(everywhere("example").await, ["ops@example.com"]);
}

/// What each source finds for `query` in tenant t1: episodes, then
/// memory, then facts.
async fn found_everywhere<S: Store>(store: &S, query: &str) -> Vec<String> {
    let mut hits = Vec::new();
    for source in [Source::Episodes, Source::Memory, Source::Facts] {
        hits.extend(described(
            &found(store, "t1", source, query, &Filters::default()).await,
        ));
    }
    hits
}

/// What a database held before the markup reading (Postgres's migration
/// 0027, SQLite's 0015) is read again by it: on Postgres a `<style>`
/// element had hidden the rest of its string and a closing tag's name was
/// a word; on SQLite every tag's name was. After it, in memory, facts and
/// episodes, the text is found on both and the markup on neither.
#[tokio::test]
async fn markup_written_before_its_reading_is_read_again_by_the_migration() {
    use engram::ports::Database;

    let text = "</div> <style>p {}</style> canary rollout";
    let all = ["e1", "notes@1", "ops@example.com"];
    let none = Vec::<String>::new();

    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    let pg = db.pg_store().await;
    pg.migrate_through(Some(26))
        .await
        .expect("the schema before");
    write_everywhere(&pg, text, "notes", text).await;
    assert_eq!(found_everywhere(&pg, "canary").await, none);
    assert_eq!(found_everywhere(&pg, "div").await, all);
    pg.migrate().await.expect("migrate");
    assert_eq!(found_everywhere(&pg, "canary").await, all);
    assert_eq!(found_everywhere(&pg, "div").await, none);

    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    let lite = db.sqlite_store().await;
    lite.migrate_through(Some(14))
        .await
        .expect("the schema before");
    write_everywhere(&lite, text, "notes", text).await;
    assert_eq!(found_everywhere(&lite, "canary").await, all);
    assert_eq!(found_everywhere(&lite, "div").await, all);
    lite.migrate().await.expect("migrate");
    assert_eq!(found_everywhere(&lite, "canary").await, all);
    assert_eq!(found_everywhere(&lite, "div").await, none);
}

/// What a SQLite database held before its strings were read alone
/// (migration 0016) is read again by it: a `<script>` left open in one
/// string of a value had hidden the strings after it, in memory and in
/// episodes.
#[tokio::test]
async fn strings_written_before_they_were_read_alone_are_read_again_by_the_migration() {
    use engram::ports::Database;

    let cut = json!({"a": "<script>var x = 1;", "b": "canary rollout"});
    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    let lite = db.sqlite_store().await;
    lite.migrate_through(Some(15))
        .await
        .expect("the schema before");
    let l = log(&lite, "t1");
    l.create("s1", "app", "alice", 0).await;
    l.append(
        "s1",
        &[episode(&id("s1"), Some("e1"), None, None, cut.clone())],
    )
    .await;
    writer(&lite, "t1").set("notes", cut).await;
    assert_eq!(
        found_everywhere(&lite, "canary").await,
        Vec::<String>::new()
    );
    lite.migrate().await.expect("migrate");
    assert_eq!(found_everywhere(&lite, "canary").await, ["e1", "notes@1"]);
}

/// What a SQLite database held before a number before letters was read
/// as Postgres reads it (migration 0017) is read again by it: `3.21s` had
/// been `3` and `21s`, in memory, facts and episodes alike.
#[tokio::test]
async fn numbers_before_letters_written_before_their_reading_are_read_again_by_the_migration() {
    use engram::ports::Database;

    let text = "the build took 3.21s";
    let all = ["e1", "notes@1", "ops@example.com"];
    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    let lite = db.sqlite_store().await;
    lite.migrate_through(Some(16))
        .await
        .expect("the schema before");
    write_everywhere(&lite, text, "notes", text).await;
    assert_eq!(found_everywhere(&lite, "3.21").await, Vec::<String>::new());
    assert_eq!(found_everywhere(&lite, "21s").await, all);
    lite.migrate().await.expect("migrate");
    assert_eq!(found_everywhere(&lite, "3.21").await, all);
    assert_eq!(found_everywhere(&lite, "21s").await, Vec::<String>::new());
    // A key written again leaves its old words (FTS5 reads the stored
    // text again to remove them), and what is written after is read so.
    writer(&lite, "t1").set("notes", json!("other words")).await;
    assert_eq!(
        found_everywhere(&lite, "3.21").await,
        ["e1", "ops@example.com"]
    );
    let l = log(&lite, "t1");
    l.append(
        "s1",
        &[episode(
            &id("s1"),
            Some("e2"),
            None,
            None,
            json!("took 4.5s"),
        )],
    )
    .await;
    assert_eq!(
        described(&found(&lite, "t1", Source::Episodes, "4.5", &Filters::default()).await),
        ["e2"]
    );
}

/// Text written before a reading's migration is read again by it: each
/// of `absent` finds nothing before it; each of `found`, and the text
/// itself, finds it after, in memory, facts and episodes; and the key
/// written again with `again` leaves its old words (`absent[0]` then finds
/// the other two only) and is found by `found_again`.
struct ReadAgain<'a> {
    text: &'a str,
    absent: &'a [&'a str],
    found: &'a [&'a str],
    again: &'a str,
    found_again: &'a str,
}

async fn read_again_by_the_migration<S>(store: S, before: i64, case: ReadAgain<'_>)
where
    S: Store + engram::ports::Database,
{
    let all = ["e1", "notes@1", "ops@example.com"];
    store
        .migrate_through(Some(before))
        .await
        .expect("the schema before");
    write_everywhere(&store, case.text, "notes", case.text).await;
    for query in case.absent {
        assert_eq!(
            found_everywhere(&store, query).await,
            Vec::<String>::new(),
            "{query}"
        );
    }
    store.migrate().await.expect("migrate");
    for query in case.found.iter().chain([&case.text]) {
        assert_eq!(found_everywhere(&store, query).await, all, "{query}");
    }
    // A key written again leaves its old words (FTS5 reads the stored text
    // again to remove them), and what is written after is read so.
    writer(&store, "t1").set("notes", json!(case.again)).await;
    assert_eq!(
        found_everywhere(&store, case.absent[0]).await,
        ["e1", "ops@example.com"]
    );
    assert_eq!(
        found_everywhere(&store, case.found_again).await,
        ["notes@2"]
    );
}

/// Chinese, Japanese and Korean written before they were read a
/// character at a time (Postgres's 0029, SQLite's 0018).
async fn cjk_text_is_read_again_by_the_migration<S>(store: S, before: i64)
where
    S: Store + engram::ports::Database,
{
    let case = ReadAgain {
        text: "東京での会議は明日です",
        absent: &["会議", "東京"],
        found: &["東京", "会議"],
        again: "明日は休み",
        found_again: "休み",
    };
    read_again_by_the_migration(store, before, case).await;
}

#[tokio::test]
async fn cjk_text_written_before_its_reading_is_read_again_on_postgres() {
    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    cjk_text_is_read_again_by_the_migration(db.pg_store().await, 28).await;
}

/// Thai, Lao, Khmer and Burmese written before they were read a cluster
/// at a time, and Arabic with its vowel points before they were left out
/// (Postgres's 0030, SQLite's 0021).
async fn cluster_text_is_read_again_by_the_migration<S>(store: S, before: i64)
where
    S: Store + engram::ports::Database,
{
    let case = ReadAgain {
        text: "ผมไม่ชอบกาแฟ ราคา3.14บาท القَهْوَة",
        absent: &["กาแฟ", "القهوة"],
        found: &["กาแฟ", "ไม่ชอบ", "3.14", "القهوة"],
        again: "สวัสดีครับ",
        found_again: "สวัสดี",
    };
    read_again_by_the_migration(store, before, case).await;
}

#[tokio::test]
async fn cluster_text_written_before_its_reading_is_read_again_on_postgres() {
    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    cluster_text_is_read_again_by_the_migration(db.pg_store().await, 29).await;
}

#[tokio::test]
async fn cluster_text_written_before_its_reading_is_read_again_on_sqlite() {
    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    cluster_text_is_read_again_by_the_migration(db.sqlite_store().await, 20).await;
}

/// The Arabic script's letter variants written before they were read
/// alike (Postgres's 0031, SQLite's 0022).
async fn arabic_text_is_read_again_by_the_migration<S>(store: S, before: i64)
where
    S: Store + engram::ports::Database,
{
    let case = ReadAgain {
        text: "ذهب أحمد إلى المدرسة مع کتاب",
        absent: &["احمد", "كتاب", "مدرسة"],
        found: &["احمد", "\"الى المدرسه\"", "كتاب", "أحمد", "مدرسة"],
        again: "مستشفى",
        found_again: "مستشفي",
    };
    read_again_by_the_migration(store, before, case).await;
}

#[tokio::test]
async fn arabic_text_written_before_its_reading_is_read_again_on_postgres() {
    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    arabic_text_is_read_again_by_the_migration(db.pg_store().await, 30).await;
}

#[tokio::test]
async fn arabic_text_written_before_its_reading_is_read_again_on_sqlite() {
    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    arabic_text_is_read_again_by_the_migration(db.sqlite_store().await, 21).await;
}

/// Text in Unicode's decomposed form written before it was read composed,
/// and the Arabic script's digits before they were read as ASCII ones
/// (Postgres's 0032, SQLite's 0023): Korean written as its jamo, `٣٤`.
async fn decomposed_text_is_read_again_by_the_migration<S>(store: S, before: i64)
where
    S: Store + engram::ports::Database,
{
    let text: String = "한국어 문서 がっこう صفحة ٣٤".nfd().collect();
    let again: String = "서울 날씨".nfd().collect();
    let case = ReadAgain {
        text: &text,
        absent: &["한국어", "문서", "34"],
        found: &["한국어", "문서", "\"がっこう\"", "34", "٣٤"],
        again: &again,
        found_again: "날씨",
    };
    read_again_by_the_migration(store, before, case).await;
}

#[tokio::test]
async fn decomposed_text_written_before_its_reading_is_read_again_on_postgres() {
    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    decomposed_text_is_read_again_by_the_migration(db.pg_store().await, 31).await;
}

#[tokio::test]
async fn decomposed_text_written_before_its_reading_is_read_again_on_sqlite() {
    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    decomposed_text_is_read_again_by_the_migration(db.sqlite_store().await, 22).await;
}

/// SQLite's migration 0019 reads again what was written before it: a
/// number beside a Chinese, Japanese or Korean character (`3.5` in
/// `第3.5章`) is found whole after it, in memory, facts and episodes, and
/// what is written after is read so.
#[tokio::test]
async fn numbers_beside_cjk_text_are_read_again_by_sqlite_0019() {
    use engram::ports::Database;

    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    let store = db.sqlite_store().await;
    store
        .migrate_through(Some(18))
        .await
        .expect("the schema before");
    let text = "第3.5章を読んだ";
    write_everywhere(&store, text, "notes", text).await;
    assert_eq!(found_everywhere(&store, "3.5").await, Vec::<String>::new());
    store.migrate().await.expect("migrate");
    let all = ["e1", "notes@1", "ops@example.com"];
    for query in ["3.5", "\"第3.5章\"", "章"] {
        assert_eq!(found_everywhere(&store, query).await, all, "{query}");
    }
    // A key written again leaves its old words (FTS5 reads the stored
    // text again to remove them).
    writer(&store, "t1").set("notes", json!("第4.5章")).await;
    assert_eq!(
        found_everywhere(&store, "3.5").await,
        ["e1", "ops@example.com"]
    );
    assert_eq!(found_everywhere(&store, "4.5").await, ["notes@2"]);
}

/// SQLite's migration 0020 reads again what was written before it: a
/// number beside markup (`<td>3.14</td>`, `&lt;-5&gt;`) or a mark
/// Postgres reads as a blank (`€7.25`), which `reading 6` split at its
/// point and `reading 7` reads whole, as Postgres does.
#[tokio::test]
async fn numbers_beside_markup_are_read_again_by_sqlite_0020() {
    use engram::ports::Database;

    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    let store = db.sqlite_store().await;
    store
        .migrate_through(Some(19))
        .await
        .expect("the schema before");
    let text = "<td>3.14</td> &lt;-5&gt; €7.25";
    write_everywhere(&store, text, "notes", text).await;
    assert_eq!(found_everywhere(&store, "3.14").await, Vec::<String>::new());
    store.migrate().await.expect("migrate");
    let all = ["e1", "notes@1", "ops@example.com"];
    for query in ["3.14", "\"-5\"", "\"3.14 -5\"", "7.25"] {
        assert_eq!(found_everywhere(&store, query).await, all, "{query}");
    }
    assert_eq!(found_everywhere(&store, "14").await, Vec::<String>::new());
    // A key written again leaves its old words (FTS5 reads the stored
    // text again to remove them).
    writer(&store, "t1").set("notes", json!("<b>4.5</b>")).await;
    assert_eq!(
        found_everywhere(&store, "3.14").await,
        ["e1", "ops@example.com"]
    );
    assert_eq!(found_everywhere(&store, "4.5").await, ["notes@2"]);
}

#[tokio::test]
async fn cjk_text_written_before_its_reading_is_read_again_on_sqlite() {
    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    cjk_text_is_read_again_by_the_migration(db.sqlite_store().await, 17).await;
}

/// In a database that lowercases as Rust does (the test cluster's), the
/// server builds plain episodes' vectors and normalises plain queries
/// itself. The check that decides it once compared a vector with
/// positions to one without, which never matched: every database looked
/// Turkish, and Postgres parsed every appended episode again.
#[tokio::test]
async fn the_server_reads_plain_text_itself_where_the_database_lowercases_alike() {
    use engram::ports::Database;
    use engram::search::english::Reading;

    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    let store = db.pg_store().await;
    store.migrate().await.expect("migrate");
    // The test cluster is C.UTF-8 (scripts/test), which reads punctuation
    // and emoji as breaks and the letters outside ASCII (Arabic's too) as
    // the server does.
    assert_eq!(
        store.text_in_rust().await.expect("the lowercasing check"),
        Some(Reading::Arabic)
    );
}

/// A migrated Postgres store on a database of `locale`, whose text the
/// server reads as `reading` says.
async fn migrated_with_locale(
    locale: &str,
    reading: Option<engram::search::english::Reading>,
) -> (TestDb, engram::store::PgStore) {
    use engram::ports::Database;

    let db = TestDb::postgres_with_locale(locale).await;
    let store = db.pg_store().await;
    store.migrate().await.expect("migrate");
    assert_eq!(
        store.text_in_rust().await.expect("the reading check"),
        reading,
        "{locale}"
    );
    (db, store)
}

/// In the `C` locale Postgres's parser reads every character outside
/// ASCII as a letter, so `don’t` is one word there: the server then reads
/// ASCII text alone, leaves an episode with a curly quote to Postgres, and
/// normalises such a query there too, so that the two meet. Elsewhere
/// (`C.UTF-8`) the quote is a break, as it is to the server.
#[tokio::test]
async fn a_c_locale_database_reads_punctuation_outside_ascii_itself() {
    use engram::search::english::Reading;

    let (db, store) = migrated_with_locale("C", Some(Reading::Ascii)).await;
    said(&store, &[("e1", "Don’t deploy on Fridays")]).await;
    let any = Filters::default();
    let hits = |query: &'static str| {
        let store = &store;
        let any = &any;
        async move { described(&found(store, "t1", Source::Episodes, query, any).await) }
    };
    assert_eq!(hits("don’t").await, ["e1"]);
    assert_eq!(hits("deploy").await, ["e1"]);
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .expect("connect");
    let (vector, same): (String, bool) = sqlx::query_as(
        "SELECT search::text, search = engram_episode_vector(content, metadata) FROM episodes",
    )
    .fetch_one(&mut conn)
    .await
    .expect("the episode's vector");
    // `unaccent` folds the curly quote into an ASCII one.
    assert!(same && vector.contains("'don''t'"), "{vector}");
}

/// Memory and fact vectors are indexed by tenant and words (migration
/// 0022), episodes' by tenant, user and words (0023), so a search looks
/// its tenant's matches up in the index and never reads another tenant's
/// rows; no index of the words alone is left for a plan to read every
/// tenant's matches through.
#[tokio::test]
async fn search_vectors_are_indexed_by_tenant() {
    use engram::ports::Database;
    use sqlx::Connection;

    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    db.pg_store().await.migrate().await.expect("migrate");
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT tablename::text, indexdef FROM pg_indexes \
         WHERE tablename IN ('memory_search', 'fact_search', 'episodes') \
         AND indexdef LIKE '%USING gin%' \
         ORDER BY tablename",
    )
    .fetch_all(&mut conn)
    .await
    .expect("the search indexes");
    let kept: Vec<(&str, bool)> = indexes
        .iter()
        .map(|(table, def)| {
            let columns = match table.as_str() {
                "episodes" => "(tenant, user_id, search)",
                _ => "(tenant, search)",
            };
            (
                table.as_str(),
                def.ends_with(&format!("USING gin {columns}")),
            )
        })
        .collect();
    assert_eq!(
        kept,
        [
            ("episodes", true),
            ("fact_search", true),
            ("memory_search", true)
        ],
        "{indexes:?}"
    );
}

/// Writes racing migration 0020 (memory sets and appends whose text the
/// previous reading kept whole) neither fail nor deadlock, and every one is
/// found by its parts afterwards: the migration holds the tables' writes
/// while it reads them again, so none lands under the old reading after
/// its table's pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_racing_the_reading_migration_are_read_the_new_way() {
    use engram::ports::Database;
    use engram::search::ports::SearchStore;

    const EACH: usize = 25;
    let (_db, store) = before_the_reading().await;
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    let w = writer(&store, "t1");
    let sets = async {
        for n in 0..EACH {
            w.set(&format!("k{n}"), json!(format!("file{n}.txt"))).await;
        }
    };
    let appends = async {
        for n in 0..EACH {
            // A `~` leaves the text to the trigger, as in the release
            // before this reading.
            let text = json!(format!("file{n}.txt is ~1.5 MB"));
            l.append(
                "s1",
                &[episode(&s1, Some(&format!("e{n}")), None, None, text)],
            )
            .await;
        }
    };
    let migrate = async { store.migrate().await.expect("migrate") };
    tokio::join!(sets, appends, migrate);

    let query = Query::parse("query", "txt").expect("query");
    for source in [Source::Memory, Source::Episodes] {
        let hits = store
            .search(
                &Tenant::new("t1"),
                &[source],
                &query,
                &Filters::default(),
                100,
            )
            .await
            .expect("search");
        assert_eq!(hits.len(), EACH, "{source:?}: {:?}", described(&hits));
    }
}

/// In a database whose text search lowercases `I` to a dotless `ı` (a
/// Turkish `LC_CTYPE`), Postgres normalises everything: an episode's
/// vector and a plain query are then made as the memory's vectors are, and
/// meet them. Built by the server, the episode held `invoic` and the query
/// asked for it, where Postgres indexed the memory key under `ınvoıc`.
#[tokio::test]
async fn a_turkish_database_normalises_text_in_postgres() {
    let (db, store) = migrated_with_locale("tr_TR.UTF-8", None).await;
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    l.append(
        "s1",
        &[episode(
            &s1,
            Some("e1"),
            None,
            None,
            json!("INVOICE overdue in İSTANBUL"),
        )],
    )
    .await;
    writer(&store, "t1")
        .set("billing", json!({"text": "INVOICE paid"}))
        .await;
    let any = Filters::default();
    let mut found_both = Vec::new();
    let mut snippets = Vec::new();
    for source in [Source::Memory, Source::Episodes] {
        let hits = found(&store, "t1", source, "INVOICE", &any).await;
        found_both.extend(described(&hits));
        snippets.extend(hits.into_iter().map(|hit| hit.snippet));
    }
    assert_eq!(found_both, ["billing@1", "e1"]);
    // Snippets read the words as the database does: `INVOICE` is its
    // `ınvoıc` there, and marked.
    assert_eq!(
        snippets,
        [
            "billing **INVOICE** paid",
            "**INVOICE** overdue in İSTANBUL"
        ]
    );
    // `unaccent` reads `İ` as `I` first, so `İSTANBUL` is `ıstanbul`.
    let hits = found(&store, "t1", Source::Episodes, "İSTANBUL", &any).await;
    assert_eq!(described(&hits), ["e1"]);
    assert_eq!(hits[0].snippet, "INVOICE overdue in **İSTANBUL**");
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .expect("connect");
    let vector: String = sqlx::query_scalar("SELECT search::text FROM episodes")
        .fetch_one(&mut conn)
        .await
        .expect("the episode's vector");
    assert!(vector.contains("'ınvoıc'"), "{vector}");
}

/// Appends each text as an episode of alice's session s1 of tenant t1,
/// under its name.
async fn said<S: Store>(store: &S, episodes: &[(&str, &str)]) {
    let l = log(store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    let episodes: Vec<_> = episodes
        .iter()
        .map(|(name, text)| episode(&s1, Some(name), None, None, json!(text)))
        .collect();
    l.append("s1", &episodes).await;
}

/// A hyphenated query word looks for its parts side by side: it finds the
/// compound and the words written apart, not the words in another order,
/// and excludes both alike.
async fn hyphenated_words_find_their_parts_written_apart<S: Store>(store: S, _db: &TestDb) {
    said(
        &store,
        &[
            ("joined", "a state-of-the-art parser"),
            ("apart", "the state of the art in parsing"),
            ("shuffled", "the art of the state"),
        ],
    )
    .await;
    let any = Filters::default();
    for query in [
        "state-of-the-art",
        "\"state-of-the-art\"",
        "\"state of the art\"",
    ] {
        let mut hits = described(&found(&store, "t1", Source::Episodes, query, &any).await);
        hits.sort();
        assert_eq!(hits, ["apart", "joined"], "{query}");
    }
    let rest = found(
        &store,
        "t1",
        Source::Episodes,
        "art -state-of-the-art",
        &any,
    )
    .await;
    assert_eq!(described(&rest), ["shuffled"]);
}

/// Each string of a JSON value is read alone, as Postgres's
/// `jsonb_to_tsvector` reads it: a `<script>` left open at the end of one
/// string hides nothing of the next, a tag begun in one string and ended
/// in the next is no tag, and a phrase does not run from one string into
/// the next. A key and its value are read as one text, so a phrase runs
/// from the key into the value. Snippets read each string alone too.
async fn each_string_is_read_alone<S: Store>(store: S, _db: &TestDb) {
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    let said = |name: &'static str, content: serde_json::Value| {
        episode(&s1, Some(name), None, None, content)
    };
    l.append(
        "s1",
        &[
            said(
                "cut",
                json!({"a": "<script>var x = 1;", "b": "canary rollout"}),
            ),
            said("split", json!({"a": "<b", "b": "kestrel=x> zebra"})),
            said("apart", json!({"a": "deploy", "b": "notes"})),
            said("together", json!({"a": "deploy notes"})),
        ],
    )
    .await;
    writer(&store, "t1")
        .set("deploy", json!({"text": "notes of the week"}))
        .await;
    let any = Filters::default();
    let episodes = |query: &'static str| {
        let store = &store;
        let any = &any;
        async move {
            let mut hits = described(&found(store, "t1", Source::Episodes, query, any).await);
            hits.sort();
            hits
        }
    };
    assert_eq!(episodes("canary").await, ["cut"]);
    // The snippet shows the string after the one cut short.
    let cut = found(&store, "t1", Source::Episodes, "canary", &any).await;
    assert_eq!(cut[0].snippet, "**canary** rollout");
    assert_eq!(episodes("kestrel").await, ["split"]);
    assert_eq!(episodes("zebra").await, ["split"]);
    assert_eq!(episodes("\"deploy notes\"").await, ["together"]);
    let mut both = episodes("deploy notes").await;
    both.sort();
    assert_eq!(both, ["apart", "together"]);
    let memory = found(&store, "t1", Source::Memory, "\"deploy notes\"", &any).await;
    assert_eq!(described(&memory), ["deploy@1"]);
}

/// A decimal, a version and a signed number are each one word, as
/// Postgres's parser reads them: `14` does not find `3.14`, a version is
/// found whole, not by the version it starts with, one right before
/// letters is a word apart from them (`3.21s`), and the snippet marks the
/// number whole.
async fn numbers_are_read_whole<S: Store>(store: S, _db: &TestDb) {
    said(
        &store,
        &[
            ("pi", "pi is 3.14 today"),
            ("issue", "issue 14 closed"),
            ("host", "host 10.0.0.15 is up"),
            ("cold", "it fell to -5 overnight"),
            ("build", "the build took 3.21s, then 1.2.3rc1 shipped"),
            ("cell", "<td>2.71</td><td>&lt;-7&gt;</td>"),
            ("odds", "odds of 1@3.5 when x<9.25"),
            ("price", "lunch was €12.50, “cheap”"),
        ],
    )
    .await;
    let any = Filters::default();
    for (query, want) in [
        ("14", &["issue"][..]),
        ("3.14", &["pi"]),
        ("10.0.0.15", &["host"]),
        ("10.0.0.1", &[]),
        ("\"-5\"", &["cold"]),
        // Beside markup, as beside a blank.
        ("2.71", &["cell"]),
        ("\"-7\"", &["cell"]),
        ("71", &[]),
        ("3.5", &["odds"]),
        ("9.25", &["odds"]),
        ("12.50", &["price"]),
        ("50", &[]),
        ("5", &[]),
        ("3.21", &["build"]),
        ("1.2.3", &["build"]),
        ("rc1", &["build"]),
        ("\"3.21s\"", &["build"]),
        ("21s", &[]),
    ] {
        let hits = described(&found(&store, "t1", Source::Episodes, query, &any).await);
        assert_eq!(hits, want, "{query}");
    }
    // And marked whole in the snippet.
    for (query, snippet) in [
        ("3.14", "pi is **3.14** today"),
        ("10.0.0.15", "host **10.0.0.15** is up"),
        ("\"-5\"", "it fell to **-5** overnight"),
        ("\"-7\"", "2.71 <**-7**>"),
        ("9.25", "odds of 1@3.5 when x<**9.25**"),
        ("12.50", "lunch was €**12.50**, “cheap”"),
        ("3.21", "the build took **3.21**s, then 1.2.3rc1 shipped"),
        (
            "1.2.3 rc1",
            "the build took 3.21s, then **1.2.3rc1** shipped",
        ),
    ] {
        let hits = found(&store, "t1", Source::Episodes, query, &any).await;
        assert_eq!(hits[0].snippet, snippet, "{query}");
    }
}

/// A word at the start of any text is found, alone, and marked in the
/// snippet, whatever follows it, on both stores; and any such text asked
/// as a query answers (hits or none), never fails. Each episode and
/// memory value holds its own word (`quokka` and a number: a word of
/// letters alone would be stemmed, and two could share a stem) and then
/// generated text.
async fn any_text_around_a_word_leaves_it_findable<S: Store>(store: S, _db: &TestDb) {
    let texts = crate::search_reading::generated(
        crate::search_properties::TRICKY,
        16,
        150,
        0x5851_f42d_4c95_7f2d,
    );
    let word = |at: usize| format!("quokka{at}");
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    let w = writer(&store, "t1");
    for (at, text) in texts.iter().enumerate() {
        let text = format!("{} {text}", word(at));
        let name = format!("e{at}");
        l.append("s1", &[episode(&s1, Some(&name), None, None, json!(text))])
            .await;
        w.set(&format!("k{at}"), json!({ "text": text })).await;
    }
    let any = Filters::default();
    for (at, text) in texts.iter().enumerate() {
        let word = word(at);
        let hits = found(&store, "t1", Source::Episodes, &word, &any).await;
        assert_eq!(described(&hits), [format!("e{at}")], "{word} {text:?}");
        assert!(
            hits[0].snippet.starts_with(&format!("**{word}**")),
            "{:?} for {text:?}",
            hits[0].snippet
        );
        let hits = found(&store, "t1", Source::Memory, &word, &any).await;
        assert_eq!(described(&hits), [format!("k{at}@1")], "{word} {text:?}");
        if Query::parse("query", text).is_ok() {
            for source in [Source::Memory, Source::Episodes] {
                found(&store, "t1", source, text, &any).await;
            }
        }
    }
}

store_suite!(
    any_text_around_a_word_leaves_it_findable,
    memory_finds_current_versions_only,
    each_string_is_read_alone,
    numbers_are_read_whole,
    hyphenated_words_find_their_parts_written_apart,
    scores_do_not_depend_on_other_tenants,
    sources_are_ranked_on_one_scale,
    episodes_rank_and_filter,
    long_items_rank_by_their_length,
    pending_search_entries_merge,
    compounds_are_found_by_their_parts,
    diacritics_are_read_without_them,
    word_forms_are_stemmed_as_postgres_stems_them,
    stop_words_alone_find_nothing,
    stop_words_at_the_ends_of_a_phrase_are_dropped,
    fact_snippets_say_the_triple_once,
    cjk_text_is_found_by_its_words,
    cluster_scripts_are_found_by_their_words,
    spaced_scripts_are_found_by_each_word,
    vowel_points_are_read_as_if_not_written,
    arabic_words_are_read_alike,
    decomposed_text_reads_as_composed,
    arabic_digits_read_as_ascii,
);
