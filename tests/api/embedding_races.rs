//! The embedding worker against the writers whose rows it shares on
//! Postgres. It never waits for a row another transaction holds while it
//! holds rows of its own. Before it did, a purge deleting a key's versions
//! from the oldest and the worker (holding the newest, clearing the older
//! vectors) each waited for the other, and Postgres failed one of them:
//! often the client's `PurgeScope`, as `INTERNAL`. A forget deleting the
//! outbox, then episodes, met the worker the same way. Here a test's own
//! transaction holds the rows such a writer would, at the moment the
//! worker reaches them, and the worker must finish without it.

use std::time::Duration;

use engram::proto::{SearchMode, SearchRequest, SearchSource};
use serde_json::json;
use sqlx::Connection;

use crate::helpers::{Backend, until_reads};
use crate::search::{append, episode, set};
use crate::semantic::{OUTBOX, eventually, has, request, server_with, start_fake};

macro_rules! hold_version {
    () => {
        "SELECT 1 FROM memory_versions WHERE key = 'car' AND version = $1 FOR UPDATE"
    };
}
const HOLD_VERSION: &str = hold_version!();

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedding_worker_waits_for_no_row_another_writer_holds() {
    let (fake, addr) = start_fake().await;
    let server = server_with(Backend::Postgres, addr).await;
    let mut db = server.db_connection("the test").await;
    let mut writer = server.db_connection("the other writer").await;
    let mut memory = server.memory();
    // Holds the next call with `word` in the embedder until released,
    // once that call has arrived.
    let gate = |word: &str| *fake.gate.lock().expect("gate") = Some(word.to_owned());
    let arrives = || async {
        tokio::time::timeout(Duration::from_secs(30), fake.arrived.notified())
            .await
            .expect("the version reaches the embedder");
        *fake.gate.lock().expect("gate") = None;
    };
    let memory_search = |text: &str| SearchRequest {
        sources: vec![SearchSource::Memory as i32],
        ..request(text, SearchMode::Semantic)
    };

    memory
        .set(set("notes", "car", json!("the sedan is blue")))
        .await
        .expect("set version 1");
    until_reads(&mut db, OUTBOX, 0, "version 1 is embedded").await;

    // 1. A purge has deleted version 1, which still has its vector, and
    // goes on to version 2 once the worker has stored its vector there.
    gate("bicycle");
    memory
        .set(set("notes", "car", json!("the bicycle is red")))
        .await
        .expect("set version 2");
    arrives().await;
    let mut purge = writer.begin().await.expect("begin");
    sqlx::query(HOLD_VERSION)
        .bind(1_i64)
        .execute(&mut *purge)
        .await
        .expect("hold version 1");
    fake.release.notify_one();
    until_reads(
        &mut db,
        OUTBOX,
        0,
        "the worker stores version 2's vector while version 1 is held",
    )
    .await;
    sqlx::query(concat!(hold_version!(), " NOWAIT"))
        .bind(2_i64)
        .execute(&mut *purge)
        .await
        .expect("the worker holds version 2 no longer");
    purge.rollback().await.expect("roll back");
    eventually(&server, memory_search("bicycle"), has("memory:notes/car@2")).await;

    // 2. A purge holds the version the worker embedded: the worker gives
    // the entry back and stores the vector once the row is free.
    gate("scooter");
    memory
        .set(set("notes", "car", json!("the scooter is green")))
        .await
        .expect("set version 3");
    arrives().await;
    let mut purge = writer.begin().await.expect("begin");
    sqlx::query(HOLD_VERSION)
        .bind(3_i64)
        .execute(&mut *purge)
        .await
        .expect("hold version 3");
    fake.release.notify_one();
    until_reads(
        &mut db,
        "SELECT count(*) FROM embedding_outbox WHERE claim IS NULL",
        1,
        "the worker gives back the entry of a version another writer holds",
    )
    .await;
    purge.rollback().await.expect("roll back");
    until_reads(&mut db, OUTBOX, 0, "version 3 is embedded once free").await;
    eventually(&server, memory_search("scooter"), has("memory:notes/car@3")).await;

    // 3. A forget has deleted an episode's outbox entry and goes on to the
    // episode, which the worker holds as it stores the vector.
    gate("kayak");
    server
        .episodes()
        .append_episodes(append(
            "s1",
            "alice",
            vec![episode(
                "e1",
                "user_message",
                "",
                json!("a kayak on the lake"),
            )],
        ))
        .await
        .expect("append");
    arrives().await;
    let mut forget = writer.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM embedding_outbox FOR UPDATE")
        .execute(&mut *forget)
        .await
        .expect("hold the outbox entry");
    fake.release.notify_one();
    until_reads(
        &mut db,
        "SELECT count(*) FROM episodes WHERE embedding IS NOT NULL",
        1,
        "the worker stores the episode's vector while its entry is held",
    )
    .await;
    sqlx::query("SELECT 1 FROM episodes FOR UPDATE NOWAIT")
        .execute(&mut *forget)
        .await
        .expect("the worker holds the episode no longer");
    forget.rollback().await.expect("roll back");
}

/// Two outbox entries for one place (an episode written, its session
/// deleted, and an episode written again at the same seq) in one batch:
/// the worker writes the place once. Written twice, its row was one the
/// worker's own transaction had written, which Postgres checks against
/// the session again, and that waited for whoever held the session (an
/// eviction deleting it, which in turn waited for the episode).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedding_worker_writes_a_place_once_a_batch() {
    let (fake, addr) = start_fake().await;
    let server = server_with(Backend::Postgres, addr).await;
    let mut db = server.db_connection("the test").await;
    let mut evictor = server.db_connection("the evictor").await;
    let mut episodes = server.episodes();
    let write = |session: &str, id: &str, text: &str| {
        append(
            session,
            "alice",
            vec![episode(id, "user_message", "", json!(text))],
        )
    };
    // The worker waits in its call for another session's episode while
    // both entries of the place queue behind it.
    *fake.gate.lock().expect("gate") = Some("gatekeeper".to_owned());
    episodes
        .append_episodes(write("g", "g1", "the gatekeeper's note"))
        .await
        .expect("append to g");
    tokio::time::timeout(Duration::from_secs(30), fake.arrived.notified())
        .await
        .expect("the first batch reaches the embedder");
    *fake.gate.lock().expect("gate") = None;
    episodes
        .append_episodes(write("s", "e1", "a kayak on the lake"))
        .await
        .expect("append e1");
    server
        .sessions()
        .delete_session(engram::proto::DeleteSessionRequest {
            session_id: "s".to_owned(),
            ..Default::default()
        })
        .await
        .expect("delete s");
    episodes
        .append_episodes(write("s", "e2", "a canoe on the river"))
        .await
        .expect("append e2 at the same seq");
    let mut eviction = evictor.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM sessions WHERE id = 's' FOR UPDATE")
        .execute(&mut *eviction)
        .await
        .expect("hold session s");
    fake.release.notify_one();
    until_reads(
        &mut db,
        OUTBOX,
        0,
        "the worker stores the place's vector while its session is held",
    )
    .await;
    eviction.rollback().await.expect("roll back");
    let boats = SearchRequest {
        sources: vec![SearchSource::Episodes as i32],
        ..request("canoe", SearchMode::Semantic)
    };
    eventually(&server, boats, has("episode:e2")).await;
}
