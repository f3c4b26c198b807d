//! A consumer that stops reading: a Watch and a TailEpisodes stream left
//! unread while 90 MiB of values and episodes are written. The server's
//! memory must stay bounded (it buffers `--watch-buffer` items per stream,
//! then ends the stream with CONSUMER_TOO_SLOW), and once the consumers
//! read again they resume from their last position and receive everything
//! once, in order.

use std::time::Duration;

use engram::api::convert::json_to_proto;
use engram::proto::episode_service_client::EpisodeServiceClient;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::{
    AppendEpisodeRequest, NewEpisode, ScopeType, SetRequest, TailEpisodesRequest, WatchRequest,
};
use serde_json::json;
use tokio_stream::StreamExt;

use super::workload::{self, APP, SCOPE, SENTINEL, channel};
use crate::helpers::{Backend, ChildServer, TestDb};
use crate::on_both_stores;

const WRITES: usize = 1200;
const VALUE_BYTES: usize = 40 * 1024;
const WRITERS: usize = 4;

async fn stalled_consumers_keep_memory_bounded(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = ChildServer::spawn(
        &[],
        &[
            ("ENGRAM_DATABASE_URL", db.url.as_str()),
            ("ENGRAM_WATCH_STALL_TIMEOUT_MS", "500"),
            // 16 buffered items of 40 KiB per stream: a bound far below
            // what is written, so growth beyond it would show.
            ("ENGRAM_WATCH_BUFFER", "16"),
        ],
        None,
    )
    .await;
    let addr = server.grpc_addr;
    let channel = channel(addr);

    // The stalled consumers: opened, then not read.
    let mut watch = MemoryServiceClient::new(channel.clone())
        .watch(WatchRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: SCOPE.into(),
            key_prefix: String::new(),
            from_revision: Some(0),
        })
        .await
        .expect("watch")
        .into_inner();
    let mut tail = EpisodeServiceClient::new(channel.clone())
        .tail_episodes(TailEpisodesRequest {
            app: APP.into(),
            cursor: Some(0),
            ..TailEpisodesRequest::default()
        })
        .await
        .expect("tail")
        .into_inner();

    let big = "x".repeat(VALUE_BYTES);
    let write = |n: usize| {
        let channel = channel.clone();
        let big = big.clone();
        async move {
            MemoryServiceClient::new(channel.clone())
                .set(SetRequest {
                    scope_type: ScopeType::Namespace as i32,
                    scope: SCOPE.into(),
                    key: format!("k{}", n % 50),
                    value: Some(json_to_proto(&json!(format!("{n}{big}")))),
                    ..SetRequest::default()
                })
                .await
                .expect("set");
            EpisodeServiceClient::new(channel)
                .append_episode(AppendEpisodeRequest {
                    session_id: format!("s{}", n % 10),
                    app: APP.into(),
                    user: "u".into(),
                    episode: Some(NewEpisode {
                        r#type: "observation".into(),
                        content: Some(json_to_proto(&json!(big))),
                        ..NewEpisode::default()
                    }),
                    require_session: false,
                })
                .await
                .expect("append");
        }
    };
    // Warm up, then take the baseline.
    for n in 0..WRITERS * 5 {
        write(n).await;
    }
    let baseline = server.memory_kib("VmRSS");
    let mut peak = baseline;
    for round in 0..WRITES / WRITERS {
        let batch: Vec<_> = (0..WRITERS)
            .map(|w| tokio::spawn(write(round * WRITERS + w)))
            .collect();
        for writer in batch {
            writer.await.expect("writer");
        }
        if round % 20 == 0 {
            peak = peak.max(server.memory_kib("VmRSS"));
        }
    }
    peak = peak.max(server.memory_kib("VmRSS"));
    let written_mib = 2 * WRITES * VALUE_BYTES / (1024 * 1024);
    let growth_mib = peak.saturating_sub(baseline) / 1024;
    println!(
        "stalled consumers ({backend:?}): {written_mib} MiB written, server RSS {baseline} KiB -> \
         peak {peak} KiB"
    );
    assert!(
        growth_mib < 32,
        "server RSS grew by {growth_mib} MiB while {written_mib} MiB went to stalled consumers"
    );

    // Reading again: what was buffered, then CONSUMER_TOO_SLOW, then a
    // resume from the last position, up to the sentinels.
    let mut memory = MemoryServiceClient::new(channel.clone());
    memory
        .set(SetRequest {
            scope_type: ScopeType::Namespace as i32,
            scope: SCOPE.into(),
            key: SENTINEL.into(),
            value: Some(json_to_proto(&json!(0))),
            ..SetRequest::default()
        })
        .await
        .expect("sentinel");
    workload::append(&channel, "s0", SENTINEL, 0)
        .await
        .expect("sentinel episode");
    let mut watched = Vec::new();
    let mut cut = false;
    while let Some(item) = watch.next().await {
        match item {
            Ok(change) => watched.push((change.revision, change.kind, change.key, change.version)),
            Err(status) => {
                assert_eq!(crate::helpers::reason(&status), "CONSUMER_TOO_SLOW");
                cut = true;
                break;
            }
        }
    }
    assert!(cut, "the stalled watch was ended as too slow");
    let mut tailed = Vec::new();
    while let Some(item) = tail.next().await {
        match item {
            Ok(item) => {
                tailed.push(workload::tailed(item.episode.unwrap_or_default()));
            }
            Err(status) => {
                assert_eq!(crate::helpers::reason(&status), "CONSUMER_TOO_SLOW");
                break;
            }
        }
    }
    let resumed = tokio::time::timeout(Duration::from_secs(120), async {
        let rest = workload::watch_from(addr, watched.last().map_or(0, |c| c.0)).await;
        watched.extend(rest);
        let rest = workload::tail_from(addr, tailed.last().map_or(0, |e| e.0)).await;
        tailed.extend(rest);
    })
    .await;
    assert!(resumed.is_ok(), "the consumers caught up after resuming");
    let (feed, _) = workload::watch(addr, None).await;
    let (episodes, _) = workload::tail(addr).await;
    assert_eq!(watched.len(), WRITES + WRITERS * 5 + 1);
    assert!(
        watched == feed,
        "the resumed watch has the whole feed once, in order"
    );
    assert!(
        tailed == episodes,
        "the resumed tail has every episode once, in order"
    );
    server.kill().await;
}

on_both_stores!(stalled_consumers_keep_memory_bounded);
