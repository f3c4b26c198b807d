//! The embedding outbox at the store level: writes queue their items only
//! once an embedder is recorded, claims never hand one entry to two
//! workers, a lease that ends frees its entries, a release delays them,
//! stored vectors are found only on live items, a claim that was taken
//! over cannot remove the entry, and a vector is stored only on an item
//! that still reads as the input it was computed from.

use std::time::Duration;

use chrono::Utc;
use engram::context::Tenant;
use engram::memory::ports::Mutation;
use engram::ports::Store;
use engram::search::embedder::{encode, normalized};
use engram::search::ports::{Embedded, ItemRef, Stored, Vector};
use engram::search::{Filters, Source};
use serde_json::json;

use super::writer;
use crate::helpers::TestDb;

fn vector(x: f32) -> Vec<u8> {
    encode(&normalized(vec![x, 1.0]))
}

async fn claims_leases_and_live_vectors<S: Store>(store: S, _db: &TestDb) {
    let w = writer(&store, "t1");
    w.set("before", json!("written before any embedder")).await;
    let now = Utc::now();
    let lease = now + Duration::from_secs(60);
    assert!(
        store
            .claim_pending("a", now, lease, 10)
            .await
            .expect("claim")
            .is_empty(),
        "nothing is queued without an embedder"
    );

    store.set_embedder("m1").await.expect("set embedder");
    w.set("one", json!("first")).await;
    w.set("two", json!("second")).await;
    w.stored("two", Mutation::Delete, None, None).await; // a tombstone queues nothing
    let now = Utc::now();
    let first = store
        .claim_pending("a", now, now + Duration::from_secs(60), 1)
        .await
        .expect("claim");
    let second = store
        .claim_pending("b", now, now + Duration::from_secs(60), 10)
        .await
        .expect("claim");
    assert_eq!(first.len(), 1);
    assert_eq!(second.len(), 1, "each entry to one claimant: {second:?}");
    assert_ne!(first[0].id, second[0].id);
    assert!(
        store
            .claim_pending("c", now, now + Duration::from_secs(60), 10)
            .await
            .expect("claim")
            .is_empty(),
        "both entries are held"
    );
    assert_eq!(store.pending_count().await.expect("count"), 2);

    // b gives its entry back for later; a's lease ends and c takes it over.
    store
        .release_pending("b", &second, now + Duration::from_secs(3600))
        .await
        .expect("release");
    let later = now + Duration::from_secs(120);
    let taken = store
        .claim_pending("c", later, later + Duration::from_secs(60), 10)
        .await
        .expect("claim");
    assert_eq!(taken.len(), 1, "only the expired lease: {taken:?}");
    assert_eq!(taken[0].id, first[0].id);
    assert_eq!(taken[0].attempts, 2);

    // a, no longer the holder, stores its vector but cannot remove the
    // entry; c can.
    let t1 = Tenant::new("t1");
    let input = store
        .inputs(&t1, &[first[0].item.clone()])
        .await
        .expect("inputs")
        .remove(0)
        .expect("the item is live");
    let done = |claimed: &engram::search::ports::Pending| Embedded {
        tenant: claimed.tenant.clone(),
        item: claimed.item.clone(),
        vector: Some(Vector {
            input: input.clone(),
            encoded: vector(1.0),
        }),
        outbox: Some(claimed.id),
    };
    store
        .store_vectors(Some("a"), "m1", &[done(&first[0])])
        .await
        .expect("store");
    assert_eq!(store.pending_count().await.expect("count"), 2);
    store
        .store_vectors(Some("c"), "m1", &[done(&taken[0])])
        .await
        .expect("store");
    assert_eq!(store.pending_count().await.expect("count"), 1);

    let found = store
        .vectors(&t1, &[Source::Memory], "m1", &Filters::default())
        .await
        .expect("vectors");
    assert_eq!(found.len(), 1);
    assert!(matches!(&found[0].0, ItemRef::Memory { key, version: 1, .. } if key == "one"));
    assert!(
        store
            .vectors(&t1, &[Source::Memory], "m2", &Filters::default())
            .await
            .expect("vectors")
            .is_empty(),
        "another model's vectors are not candidates"
    );
    assert!(
        store
            .vectors(
                &Tenant::new("t2"),
                &[Source::Memory],
                "m1",
                &Filters::default()
            )
            .await
            .expect("vectors")
            .is_empty(),
        "nor another tenant's"
    );
    let items = store
        .items(&t1, &[found[0].0.clone()])
        .await
        .expect("items");
    assert!(items[0].is_some());

    // A new version: the old vector no longer counts, the new one is
    // queued; a delete takes the key out of the candidates at once.
    w.set("one", json!("first, again")).await;
    assert!(
        store
            .vectors(&t1, &[Source::Memory], "m1", &Filters::default())
            .await
            .expect("vectors")
            .is_empty()
    );
    assert!(
        store
            .items(&t1, &[found[0].0.clone()])
            .await
            .expect("items")[0]
            .is_none()
    );
    assert_eq!(store.pending_count().await.expect("count"), 2);

    // The backfill sees what was written before the embedder.
    let unembedded = store
        .unembedded(Source::Memory, "m1", None, 10)
        .await
        .expect("unembedded");
    let keys: Vec<String> = unembedded
        .iter()
        .filter_map(|(_, item, _)| match item {
            ItemRef::Memory { key, .. } => Some(key.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(keys, vec!["before"], "queued items are the worker's");
    assert_eq!(
        store
            .count_unembedded(Source::Memory, "m1")
            .await
            .expect("count"),
        2
    );

    // A vector computed from what the place held before (the key's
    // previous text at its version now) is not stored; its own input is.
    let ItemRef::Memory {
        scope_type, scope, ..
    } = found[0].0.clone()
    else {
        panic!("a memory item: {found:?}");
    };
    let again = ItemRef::Memory {
        scope_type,
        scope,
        key: "one".to_owned(),
        version: 2,
    };
    let computed = |input: &str| Embedded {
        tenant: t1.clone(),
        item: again.clone(),
        vector: Some(Vector {
            input: input.to_owned(),
            encoded: vector(2.0),
        }),
        outbox: None,
    };
    let stored = store
        .store_vectors(None, "m1", &[computed(&input)])
        .await
        .expect("store");
    assert_eq!(stored, Stored::default(), "nothing stored, nothing busy");
    assert!(
        store
            .vectors(&t1, &[Source::Memory], "m1", &Filters::default())
            .await
            .expect("vectors")
            .is_empty(),
        "a vector of another text is not stored"
    );
    let current = store
        .inputs(&t1, std::slice::from_ref(&again))
        .await
        .expect("inputs")
        .remove(0)
        .expect("the new version is live");
    let stored = store
        .store_vectors(None, "m1", &[computed(&current)])
        .await
        .expect("store");
    assert_eq!(
        stored,
        Stored {
            vectors: 1,
            busy: Vec::new()
        }
    );
    let found = store
        .vectors(&t1, &[Source::Memory], "m1", &Filters::default())
        .await
        .expect("vectors");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0, again);
}

store_suite!(claims_leases_and_live_vectors);
