//! Reads of large items stop where their answer will: the store reads rows
//! only as far as a page (or an answer without pages) carries, so a list,
//! a `Recent`, a search, a fact's versions or an export over items of a
//! megabyte never holds them all.
//! Paging then cuts the last one read and gives a token for the rest.
//!
//! The cases run on a single-threaded runtime, where the `Recent` reads
//! asked in one poll are read together (one statement on Postgres).

use std::pin::pin;

use engram::consolidation::ports::FactTx;
use engram::context::Tenant;
use engram::data::{After, Part, Selection};
use engram::memory::KeyPrefix;
use engram::memory::ports::ListQuery;
use engram::ports::Store;
use engram::search::{Filters, Item, Query, Source};
use serde_json::json;

use super::consolidation::{insert, payload, provenance};
use super::fixtures::{episode, id, log, now, recent as query};
use super::writer;
use crate::helpers::TestDb;

/// The weight of one item: 64 KiB.
const BIG: usize = 64 * 1024;

/// How many items of [`BIG`] a page carries, about.
fn page() -> usize {
    engram::paging::PAGE_BYTES / BIG
}

/// About [`BIG`] bytes of words holding `needle` `n` times: the more
/// needles, the better the match.
fn needles(n: usize) -> String {
    let mut text = "needle ".repeat(n);
    while text.len() < BIG {
        text.push_str("lorem ipsum dolor sit amet ");
    }
    text
}

/// `n` items of each kind in tenant t1, each holding `text`: keys `k00`…,
/// episodes `e00`… of session `s` and facts of alice learned from them.
async fn of_each_kind<'a, S: Store>(store: &'a S, n: usize, text: &str) -> super::Writer<'a, S> {
    let w = writer(store, "t1");
    let l = log(store, "t1");
    l.create("s", "app", "alice", 0).await;
    let s = id("s");
    for n in 0..n {
        w.set(&format!("k{n:02}"), json!(text)).await;
        let name = format!("e{n:02}");
        l.append("s", &[episode(&s, Some(&name), None, None, json!(text))])
            .await;
        let mut fact = payload("alice", &format!("v{n}"));
        fact.content = json!(text);
        insert(store, &w.tenant, &fact, &[&name]).await;
    }
    w
}

/// Asserts `read` holds more than one but no more than a page (and the one
/// it cuts) of items.
fn a_page(what: &str, read: usize) {
    assert!(
        (2..=page() + 1).contains(&read),
        "{what}: {read} items of 64 KiB read for one answer"
    );
}

async fn lists_of_large_values_stop_at_a_page<S: Store>(store: S, _db: &TestDb) {
    let w = writer(&store, "t1");
    for i in 0..100 {
        w.set(&format!("k{i:03}"), json!("x".repeat(BIG))).await;
    }
    let listed = store
        .list(
            &w.tenant,
            &ListQuery {
                scope: &w.scope,
                prefix: &KeyPrefix::default(),
                after: None,
                limit: 101,
                include_reserved: false,
                descending: false,
            },
        )
        .await
        .expect("list");
    let keys: Vec<&str> = listed.iter().map(|e| e.key.as_str()).collect();
    a_page("list", keys.len());
    let first: Vec<String> = (0..keys.len()).map(|i| format!("k{i:03}")).collect();
    assert_eq!(keys, first);
}

/// A key's history of large versions is read a page's worth at a time.
async fn histories_of_large_versions_stop_at_a_page<S: Store>(store: S, _db: &TestDb) {
    let w = writer(&store, "t1");
    for _ in 0..40 {
        w.set("k", json!("x".repeat(BIG))).await;
    }
    let key = engram::memory::Key::parse("key", "k").expect("key");
    let read = store
        .history(&w.tenant, &w.scope, &key, 1, 500)
        .await
        .expect("history");
    a_page("history", read.len());
    let versions: Vec<i64> = read.iter().map(|e| e.version).collect();
    assert_eq!(versions, (1..=read.len() as i64).collect::<Vec<_>>());
}

/// About [`BIG`] bytes of JSON, weighed as numbers (9 bytes each and
/// framing) but stored larger: a random 17-digit fraction takes more as a
/// Postgres `numeric` (and as SQLite's text), and does not compress. The
/// statement's own cut by stored bytes then comes before paging's.
fn stored_larger_than_weighed(seed: u64) -> serde_json::Value {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let numbers: Vec<f64> = (0..BIG / 13)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let mantissa = 1.0 + (state >> 11) as f64 / (1u64 << 53) as f64;
            mantissa * 1e-5
        })
        .collect();
    json!(numbers)
}

/// Where the statement stops sending values before paging would cut, the
/// store reads on in parts after the last item held: a page of a list (now
/// or at a point), a history, the change feed, a session's episodes or the
/// tail still holds
/// what paging carries, and the
/// pages together hold every item once, in order.
async fn reads_cut_by_stored_bytes_read_on_in_parts<S: Store>(store: S, db: &TestDb) {
    let w = writer(&store, "t1");
    for i in 0..80 {
        w.set(&format!("k{i:03}"), stored_larger_than_weighed(i))
            .await;
    }
    let mut listed: Vec<String> = Vec::new();
    let mut pages = 0;
    loop {
        let after = listed.last().cloned();
        let page = store
            .list(
                &w.tenant,
                &ListQuery {
                    scope: &w.scope,
                    prefix: &KeyPrefix::default(),
                    after: after.as_deref(),
                    limit: 101,
                    include_reserved: false,
                    descending: false,
                },
            )
            .await
            .expect("list");
        if page.is_empty() {
            break;
        }
        pages += 1;
        let weighed = engram::paging::fitting(&page);
        assert!(
            engram::paging::more(&page, 101) || page.len() + listed.len() == 80,
            "page {pages}: {} items read, paging keeps {weighed}",
            page.len()
        );
        assert!(page.iter().all(|e| e.value.is_some()), "every value read");
        // Paging keeps what fits; the next page starts after it.
        listed.extend(page[..weighed].iter().map(|e| e.key.as_str().to_owned()));
    }
    let expected: Vec<String> = (0..80).map(|i| format!("k{i:03}")).collect();
    assert_eq!(listed, expected);
    assert!(pages > 2, "{pages} pages of 80 values of 64 KiB");

    // And at a point (`as_of`): the same keys, the same way.
    let at = engram::memory::ports::Point {
        revision: store
            .settled(engram::ports::Feed::Changes)
            .await
            .expect("settled"),
        time: chrono::Utc::now(),
    };
    let mut listed_at: Vec<String> = Vec::new();
    loop {
        let after = listed_at.last().cloned();
        let page = store
            .list_at(
                &w.tenant,
                &ListQuery {
                    scope: &w.scope,
                    prefix: &KeyPrefix::default(),
                    after: after.as_deref(),
                    limit: 101,
                    include_reserved: false,
                    descending: false,
                },
                at,
            )
            .await
            .expect("list at");
        if page.is_empty() {
            break;
        }
        let weighed = engram::paging::fitting(&page);
        assert!(
            engram::paging::more(&page, 101) || page.len() + listed_at.len() == 80,
            "a page at a point ends where paging cuts"
        );
        for past in &page[..weighed] {
            match past {
                engram::memory::ports::Past::Entry(entry) => {
                    assert!(entry.value.is_some(), "every value read");
                    listed_at.push(entry.key.as_str().to_owned());
                }
                engram::memory::ports::Past::Purged(key) => panic!("{key:?} purged"),
            }
        }
    }
    assert_eq!(listed_at, expected);

    let key = engram::memory::Key::parse("key", "h").expect("key");
    for i in 0..60 {
        w.set("h", stored_larger_than_weighed(1000 + i)).await;
    }
    let read = store
        .history(&w.tenant, &w.scope, &key, 1, 500)
        .await
        .expect("history");
    a_page("history", read.len());
    assert!(
        engram::paging::fitting(&read) + 1 >= read.len(),
        "a history read ends where paging cuts"
    );
    let versions: Vec<i64> = read.iter().map(|e| e.version).collect();
    assert_eq!(versions, (1..=read.len() as i64).collect::<Vec<_>>());

    // The change feed the same way: pages end where paging would cut, and
    // together hold every change once, in order, each with its value.
    let horizon = store
        .settled(engram::ports::Feed::Changes)
        .await
        .expect("settled");
    let mut revisions = Vec::new();
    let mut after = 0;
    let mut pages = 0;
    while after < horizon {
        let page = store
            .changes(
                &w.tenant,
                &w.scope,
                &KeyPrefix::default(),
                after,
                horizon,
                500,
            )
            .await
            .expect("changes")
            .changes;
        pages += 1;
        assert!(page.len() > 1, "page {pages}: {} changes", page.len());
        let weighed = engram::paging::fitting(&page);
        assert!(weighed + 1 >= page.len(), "a page ends where paging cuts");
        assert!(page.iter().all(|c| c.value.is_some()), "every value read");
        revisions.extend(page[..weighed].iter().map(|c| c.revision));
        after = *revisions.last().expect("a change");
        if revisions.len() == 140 {
            break;
        }
    }
    assert_eq!(revisions.len(), 140, "80 keys and 60 versions");
    assert!(revisions.windows(2).all(|p| p[0] < p[1]), "in order, once");

    // Episodes too: a session's list and the tail.
    let l = log(&store, "t1");
    l.create("s", "app", "alice", 0).await;
    let s = id("s");
    for i in 0..70 {
        let name = format!("e{i:02}");
        l.append(
            "s",
            &[episode(
                &s,
                Some(&name),
                None,
                None,
                stored_larger_than_weighed(2000 + i),
            )],
        )
        .await;
    }
    let mut seqs: Vec<i64> = Vec::new();
    loop {
        let page = store
            .list_episodes(
                &l.tenant,
                &engram::sessions::ports::EpisodeQuery {
                    session_id: &s,
                    types: &[],
                    after_seq: seqs.last().copied().unwrap_or(0),
                    limit: 101,
                },
            )
            .await
            .expect("list episodes");
        if page.is_empty() {
            break;
        }
        let weighed = engram::paging::fitting(&page);
        assert!(
            engram::paging::more(&page, 101) || page.len() + seqs.len() == 70,
            "a page ends where paging cuts"
        );
        seqs.extend(page[..weighed].iter().map(|e| e.seq));
    }
    assert_eq!(seqs, (1..=70).collect::<Vec<i64>>());
    let up_to = store
        .settled(engram::ports::Feed::Episodes)
        .await
        .expect("settled");
    let mut tailed: Vec<String> = Vec::new();
    let mut cursor = 0;
    while tailed.len() < 70 {
        let page = store
            .episodes_after(
                &l.tenant,
                &engram::sessions::TailFilter::default(),
                cursor,
                up_to,
                500,
            )
            .await
            .expect("tail");
        assert!(page.len() > 1, "{} episodes after {cursor}", page.len());
        let weighed = engram::paging::fitting(&page);
        assert!(weighed + 1 >= page.len(), "a page ends where paging cuts");
        cursor = page[weighed - 1].cursor;
        tailed.extend(page[..weighed].iter().map(|e| e.id.clone()));
    }
    let expected: Vec<String> = (0..70).map(|i| format!("e{i:02}")).collect();
    assert_eq!(tailed, expected);

    // And an export's pages: each ends where the statement stopped sending
    // values, or where paging cut, and the next starts after it.
    let mut snapshot = store.export_snapshot(&w.tenant).await.expect("snapshot");
    let (versions, cut) = export_part(&store, &mut snapshot, &w.tenant, Part::Memory, |r| {
        let engram::data::records::Record::MemoryVersion(v) = r else {
            panic!("{r:?} in the memory part");
        };
        v
    })
    .await;
    // SQLite stores these values as text, larger than they weigh, so its
    // statement cuts first. Postgres compresses them below their weight:
    // paging cuts first there, and the statement's cut bounds what is sent
    // after that.
    let statement_first = db.backend == crate::helpers::Backend::Sqlite;
    assert!(
        cut > 0 || !statement_first,
        "no memory page ended at the statement's cut"
    );
    for v in &versions {
        assert!(v.value.is_array(), "{}@{}: its value", v.key, v.version);
    }
    let versions: Vec<(&str, i64)> = versions
        .iter()
        .map(|v| (v.key.as_str(), v.version))
        .collect();
    let keys: Vec<String> = (0..80).map(|i| format!("k{i:03}")).collect();
    let expected: Vec<(&str, i64)> = (1..=60)
        .map(|v| ("h", v))
        .chain(keys.iter().map(|k| (k.as_str(), 1)))
        .collect();
    assert_eq!(versions, expected);
    let (episodes, cut) = export_part(&store, &mut snapshot, &w.tenant, Part::Episodes, |r| {
        let engram::data::records::Record::Episode(e) = r else {
            panic!("{r:?} in the episodes part");
        };
        e
    })
    .await;
    assert!(
        cut > 0 || !statement_first,
        "no episodes page ended at the statement's cut"
    );
    assert!(
        episodes.iter().all(|e| e.content.is_array()),
        "every content read"
    );
    let ids: Vec<&str> = episodes.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, tailed);
    store.export_done(snapshot).await.expect("done");

    // `Recent`, whose statements leave out the rows past twice a page's
    // stored bytes, still reads what paging carries: the newest, up to
    // the first that does not fit. Alone, and two read together (one
    // statement on Postgres).
    let newest: Vec<String> = (0..70).rev().map(|i| format!("e{i:02}")).collect();
    let asked = query("alice", Some("s"), None, vec![], 1000);
    let mut together = pin!(futures::future::join_all([
        store.recent(&l.tenant, &asked),
        store.recent(&l.tenant, &asked),
    ]));
    assert!(futures::poll!(together.as_mut()).is_pending());
    let mut answers = together.await;
    answers.push(store.recent(&l.tenant, &asked).await);
    for found in answers {
        let found = found.expect("recent");
        assert!(
            engram::paging::filled(&found),
            "{} of 70 episodes read, short of a page",
            found.len()
        );
        let ids: Vec<&str> = found.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, newest[..found.len()]);
    }

    // And the list of facts, each page ending where paging cuts, oldest
    // first and newest first.
    let mut inserted = Vec::new();
    for i in 0..60 {
        let mut fact = payload(&format!("subject {i:02}"), "long");
        fact.content = stored_larger_than_weighed(3000 + i);
        inserted.push(insert(&store, &l.tenant, &fact, &["e00"]).await);
    }
    inserted.sort();
    for newest_first in [false, true] {
        let filter = engram::consolidation::ports::FactFilter {
            newest_first,
            ..Default::default()
        };
        let mut listed: Vec<String> = Vec::new();
        loop {
            let page = store
                .list_facts(&l.tenant, &filter, listed.last().map(String::as_str), 101)
                .await
                .expect("list facts");
            if page.is_empty() {
                break;
            }
            let weighed = engram::paging::fitting(&page);
            // Full, by its count or by paging's bytes, unless it is the
            // last: a read that stopped at the statement's own cut reads on.
            assert!(
                engram::paging::more(&page, 101) || page.len() + listed.len() == 60,
                "a page of {} facts, paging keeps {weighed}",
                page.len()
            );
            assert!(page.iter().all(|f| f.current.content.is_array()));
            listed.extend(page[..weighed].iter().map(|f| f.id.clone()));
        }
        let mut expected = inserted.clone();
        if newest_first {
            expected.reverse();
        }
        assert_eq!(listed, expected, "newest first: {newest_first}");
    }

    // And a fact's versions, each page ending where paging cuts.
    let mut fact = payload("alice", "long");
    fact.content = stored_larger_than_weighed(4000);
    let id = insert(&store, &l.tenant, &fact, &[]).await;
    let mut tx = store.begin(&l.tenant).await.expect("begin");
    for n in 2..=60 {
        fact.content = stored_larger_than_weighed(4000 + n);
        tx.write_version(&l.tenant, &id, Some(&fact), &provenance(&[]), now())
            .await
            .expect("update");
    }
    tx.commit().await.expect("commit");
    let mut read: Vec<i64> = Vec::new();
    loop {
        let after = read.last().copied().unwrap_or(0);
        let (current, page) = store
            .get_fact(&l.tenant, &id, after, 101)
            .await
            .expect("get")
            .expect("the fact");
        assert_eq!(current.current.version, 60);
        if page.is_empty() {
            break;
        }
        let weighed = engram::paging::fitting(&page);
        assert!(
            engram::paging::more(&page, 101) || page.len() + read.len() == 60,
            "a page of {} versions, paging keeps {weighed}",
            page.len()
        );
        assert!(page.iter().all(|v| v.content.is_array()));
        read.extend(page[..weighed].iter().map(|v| v.version));
    }
    assert_eq!(read, (1..=60).collect::<Vec<_>>());

    // A history of small versions, then large ones: its first statement
    // sends each version whole up to its share of the read and stops at
    // the first large one; the read goes on from there by the running sum.
    let key = engram::memory::Key::parse("key", "mixed").expect("key");
    for i in 0..20 {
        w.set("mixed", json!(i)).await;
    }
    for i in 0..60 {
        w.set("mixed", stored_larger_than_weighed(5000 + i)).await;
    }
    let read = store
        .history(&w.tenant, &w.scope, &key, 1, 1000)
        .await
        .expect("history");
    assert!(
        engram::paging::filled(&read),
        "a history of {} versions, short of a page",
        read.len()
    );
    assert!(read.iter().all(|e| e.value.is_some()), "every value read");
    let versions: Vec<i64> = read.iter().map(|e| e.version).collect();
    assert_eq!(versions, (1..=read.len() as i64).collect::<Vec<_>>());
}

/// Every page of an export's part, each record as `pick` takes it; and the
/// number of pages after the first that ended before paging would have
/// cut them (at the statement's own cut by stored bytes).
async fn export_part<S: Store, T: engram::paging::Weigh>(
    store: &S,
    snapshot: &mut S::Snapshot,
    tenant: &Tenant,
    part: Part,
    pick: impl Fn(engram::data::records::Record) -> T,
) -> (Vec<T>, usize) {
    let (mut after, mut rows, mut read, mut cut) = (After::Start, None, Vec::new(), 0);
    loop {
        let page = store
            .export_page(snapshot, tenant, &Selection::Tenant, part, &after, rows)
            .await
            .expect("export page");
        let records: Vec<T> = page.records.into_iter().map(&pick).collect();
        // Not full by count (of the rows a later page asked for), nor past
        // a page's bytes, yet followed by more.
        let held = records.len();
        if page.next.is_some()
            && rows.is_some_and(|asked| (held as i64) < asked)
            && engram::paging::fitting(&records) == held
        {
            cut += 1;
        }
        read.extend(records);
        match page.next {
            Some(next) => (after, rows) = (next, Some(page.next_rows)),
            None => return (read, cut),
        }
    }
}

/// `Recent` reads of sessions of large episodes, together and alone, each
/// read a page's worth of its newest.
async fn recents_of_large_episodes_stop_at_a_page<S: Store>(store: S, _db: &TestDb) {
    const EACH: usize = 40;
    let l = log(&store, "t1");
    for session in ["s1", "s2"] {
        l.create(session, "app", "alice", 0).await;
        let s = id(session);
        let episodes: Vec<_> = (0..EACH)
            .map(|i| {
                let name = format!("{session}-{i:02}");
                episode(&s, Some(&name), None, None, json!("x".repeat(BIG)))
            })
            .collect();
        l.append(session, &episodes).await;
    }
    let newest = |session: &str, n: usize| -> Vec<String> {
        (EACH - n..EACH)
            .rev()
            .map(|i| format!("{session}-{i:02}"))
            .collect()
    };
    let ids = |found: Vec<engram::sessions::Episode>| -> Vec<String> {
        found.into_iter().map(|e| e.id).collect()
    };
    let asked = [
        query("alice", Some("s1"), None, vec![], 1000),
        query("alice", Some("s2"), None, vec![], 1000),
    ];
    let mut together = pin!(futures::future::join_all(
        asked.iter().map(|q| store.recent(&l.tenant, q))
    ));
    assert!(futures::poll!(together.as_mut()).is_pending());
    for (found, session) in together.await.into_iter().zip(["s1", "s2"]) {
        let found = ids(found.expect("recent"));
        a_page("recent together", found.len());
        assert_eq!(found, newest(session, found.len()));
    }
    let alone = ids(store.recent(&l.tenant, &asked[0]).await.expect("recent"));
    a_page("recent alone", alone.len());
    assert_eq!(alone, newest("s1", alone.len()));
}

/// A search for 100 hits of large items reads only the best a page
/// carries, best first.
async fn search_hits_of_large_items_stop_at_a_page<S: Store>(store: S, _db: &TestDb) {
    const ITEMS: usize = 100;
    let w = writer(&store, "t1");
    let l = log(&store, "t1");
    l.create("s", "app", "alice", 0).await;
    let s = id("s");
    for i in 0..ITEMS {
        w.set(&format!("k{i:03}"), json!(needles(i + 1))).await;
        let name = format!("e{i:03}");
        l.append(
            "s",
            &[episode(&s, Some(&name), None, None, json!(needles(i + 1)))],
        )
        .await;
    }
    let query = Query::parse("query", "needle").expect("query");
    for source in [Source::Memory, Source::Episodes] {
        let hits = store
            .search(
                &Tenant::new("t1"),
                &[source],
                &query,
                &Filters::default(),
                ITEMS,
            )
            .await
            .expect("search");
        a_page(&format!("{source:?}"), hits.len());
        let found: Vec<String> = hits
            .iter()
            .map(|hit| match &hit.item {
                Item::Entry(entry) => entry.key.as_str().to_owned(),
                Item::Episode(episode) => episode.id.clone(),
                Item::Fact(fact) => fact.id.clone(),
            })
            .collect();
        let prefix = if source == Source::Memory { "k" } else { "e" };
        let best: Vec<String> = (ITEMS - hits.len()..ITEMS)
            .rev()
            .map(|i| format!("{prefix}{i:03}"))
            .collect();
        assert_eq!(found, best, "{source:?}: the best hits, best first");
    }
}

/// A fact's versions of large content are read a page's worth at a time,
/// oldest first, with the fact at its newest version.
async fn fact_versions_of_large_content_stop_at_a_page<S: Store>(store: S, _db: &TestDb) {
    const VERSIONS: i64 = 40;
    let tenant = Tenant::new("t1");
    let big = |n: i64| {
        let mut big = payload("alice", &format!("v{n}"));
        big.content = json!("x".repeat(BIG));
        big
    };
    let fact = insert(&store, &tenant, &big(1), &["ep-1"]).await;
    let mut tx = store.begin(&tenant).await.expect("begin");
    for n in 2..=VERSIONS {
        tx.write_version(&tenant, &fact, Some(&big(n)), &provenance(&[]), now())
            .await
            .expect("update");
    }
    tx.commit().await.expect("commit");
    let (mut read, mut after) = (Vec::new(), 0);
    loop {
        let (newest, versions) = store
            .get_fact(&tenant, &fact, after, 1000)
            .await
            .expect("get")
            .expect("the fact");
        assert_eq!(newest.current.version, VERSIONS);
        let Some(last) = versions.last() else {
            break;
        };
        a_page("fact versions", versions.len());
        after = last.version;
        read.extend(versions.into_iter().map(|v| v.version));
        if after == VERSIONS {
            break;
        }
    }
    assert_eq!(read, (1..=VERSIONS).collect::<Vec<_>>());

    // A first version weighing more than a page comes alone, and the page
    // still leads on to the versions after it.
    let mut huge = payload("alice", "huge");
    huge.content = json!(vec![1.5; engram::paging::PAGE_BYTES / 7]);
    let fact = insert(&store, &tenant, &huge, &[]).await;
    let mut tx = store.begin(&tenant).await.expect("begin");
    for n in 2..=3 {
        tx.write_version(&tenant, &fact, Some(&big(n)), &provenance(&[]), now())
            .await
            .expect("update");
    }
    tx.commit().await.expect("commit");
    assert_eq!(every_version(&store, &tenant, &fact).await, [1, 2, 3]);
}

/// Every version of `fact`, paged as `GetFact` pages them: its pages of a
/// thousand, each cut where paging cuts it, the next after the token.
async fn every_version<S: Store>(store: &S, tenant: &Tenant, fact: &str) -> Vec<i64> {
    let (mut read, mut after) = (Vec::new(), 0);
    loop {
        let (_, mut versions) = store
            .get_fact(tenant, fact, after, 1001)
            .await
            .expect("get")
            .expect("the fact");
        let token = engram::paging::next_token(&mut versions, 1000, |v| v.version.to_string());
        read.extend(versions.iter().map(|v| v.version));
        if token.is_empty() {
            return read;
        }
        after = token.parse().expect("a version");
    }
}

/// An export reads its parts a page's worth of large records at a time,
/// and its pages together hold every record once. A fact's versions are
/// records of their own, so a fact with many large versions is paged like
/// the rest.
async fn exports_of_large_items_read_a_page_at_a_time<S: Store>(store: S, _db: &TestDb) {
    const EACH: usize = 40;
    let tenant = Tenant::new("t1");
    of_each_kind(&store, EACH, &"x".repeat(BIG)).await;
    // One more fact, of EACH versions of BIG.
    let mut big = payload("bob", "long");
    big.content = json!("x".repeat(BIG));
    let fact = insert(&store, &tenant, &big, &["e00"]).await;
    let mut tx = store.begin(&tenant).await.expect("begin");
    for _ in 1..EACH {
        tx.write_version(&tenant, &fact, Some(&big), &provenance(&[]), now())
            .await
            .expect("update");
    }
    tx.commit().await.expect("commit");
    let mut snapshot = store.export_snapshot(&tenant).await.expect("snapshot");
    for (part, expected) in [
        (Part::Memory, EACH),
        (Part::Episodes, EACH),
        (Part::Facts, EACH + 1),
        (Part::FactVersions, 2 * EACH),
    ] {
        let (mut after, mut rows, mut records, mut pages) = (After::Start, None, 0, 0);
        loop {
            let page = store
                .export_page(
                    &mut snapshot,
                    &tenant,
                    &Selection::Tenant,
                    part,
                    &after,
                    rows,
                )
                .await
                .expect("export page");
            pages += 1;
            records += page.records.len();
            match page.next {
                Some(next) => {
                    a_page(&format!("{part:?}"), page.records.len());
                    // A page cut by its bytes has the next ask for about
                    // as many rows, not the hundreds Postgres would send
                    // and the server drain unread.
                    assert!(
                        page.next_rows <= 2 * page.records.len() as i64,
                        "{part:?}: a page of {} large records asks for {} next",
                        page.records.len(),
                        page.next_rows
                    );
                    (after, rows) = (next, Some(page.next_rows));
                }
                None => break,
            }
        }
        assert_eq!(records, expected, "{part:?}: every record once");
        if part != Part::Facts {
            assert!(pages > 1, "{part:?}: 40 records of 64 KiB in one page");
        }
    }
    store.export_done(snapshot).await.expect("done");
}

/// The backfill and the embedding worker hold what they embed, not the
/// items: an item of 64 KiB comes back as the start of its text, at most
/// what the embedder is sent, and a page is its whole limit.
async fn embedding_reads_hold_clipped_inputs<S: Store>(store: S, _db: &TestDb) {
    use engram::search::embedder::MAX_TEXT_CHARS;
    const EACH: usize = 30;
    let clipped = |what: &str, text: &str| {
        assert!(
            text.chars().count() <= MAX_TEXT_CHARS && text.contains("needle lorem ipsum"),
            "{what}: an input of {} bytes",
            text.len()
        );
    };
    let tenant = Tenant::new("t1");
    let w = of_each_kind(&store, EACH, &needles(1)).await;
    for source in Source::ALL {
        let page = store
            .unembedded(source, "m1", None, 100)
            .await
            .expect("unembedded");
        assert_eq!(page.len(), EACH, "{source:?}: the whole limit");
        for (_, _, text) in &page {
            clipped(&format!("{source:?}"), text);
        }
    }

    store.set_embedder("m1").await.expect("set embedder");
    for n in 0..EACH {
        w.set(&format!("q{n:02}"), json!(needles(1))).await;
    }
    let now = chrono::Utc::now();
    let claimed = store
        .claim_pending("w", now, now + std::time::Duration::from_secs(60), 100)
        .await
        .expect("claim");
    assert_eq!(claimed.len(), EACH);
    let refs: Vec<_> = claimed.iter().map(|p| p.item.clone()).collect();
    let inputs = store.inputs(&tenant, &refs).await.expect("inputs");
    assert_eq!(inputs.len(), EACH);
    for input in inputs {
        clipped("worker", input.as_deref().unwrap_or_default());
    }
}

store_suite!(
    single_threaded;
    lists_of_large_values_stop_at_a_page,
    histories_of_large_versions_stop_at_a_page,
    reads_cut_by_stored_bytes_read_on_in_parts,
    recents_of_large_episodes_stop_at_a_page,
    search_hits_of_large_items_stop_at_a_page,
    fact_versions_of_large_content_stop_at_a_page,
    exports_of_large_items_read_a_page_at_a_time,
    embedding_reads_hold_clipped_inputs,
);
