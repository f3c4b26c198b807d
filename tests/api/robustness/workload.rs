//! The clients: random operations over a small key space (so they
//! collide), each recorded with its outcome, and the consumers: watches and
//! tails that reconnect from the last position they received.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use engram::api::convert::{json_from_proto, json_to_proto};
use engram::proto::as_of;
use engram::proto::consolidation_service_client::ConsolidationServiceClient;
use engram::proto::data_service_client::DataServiceClient;
use engram::proto::episode_service_client::EpisodeServiceClient;
use engram::proto::memory_admin_service_client::MemoryAdminServiceClient;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::search_hit::Item;
use engram::proto::search_service_client::SearchServiceClient;
use engram::proto::working_memory_service_client::WorkingMemoryServiceClient;
use engram::proto::{
    AppendEpisodeRequest, AsOf, CreateTaskRequest, DeleteRequest, GetFactRequest, GetRequest,
    HistoryRequest, ImportRequest, ListEpisodesRequest, ListRequest, ListTasksRequest, MemoryEntry,
    PurgeRequest, RecentRequest, RunRuleRequest, ScopeType, SearchMode, SearchRequest,
    SearchSource, SetRequest, TailEpisodesRequest, WatchRequest,
};
use serde_json::json;
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint};

use super::history::{Call, Op, Outcome, Recorder, outcome_of};

pub const SCOPE: &str = "robust";
pub const APP: &str = "robust";
pub const RULE: &str = "promote";
pub const KEYS: [&str; 5] = ["k0", "k1", "k2", "k3", "k4"];
pub const SESSIONS: [&str; 3] = ["s0", "s1", "s2"];
/// The user of every session.
pub const USER: &str = "u";
/// The key and the episode written last, once the faults are over, so a
/// consumer knows it has caught up.
pub const SENTINEL: &str = "sentinel";
const NAMESPACE: i32 = ScopeType::Namespace as i32;

/// How long a call may take before the client gives up on it.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// How often a retried idempotent write is tried before giving up.
const RETRIES: usize = 40;

/// A small, seeded generator (xorshift64*), so a run can be repeated.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A lazily connecting channel to a server address, so a client finds a
/// restarted server on its own.
pub fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_millis(500))
        .connect_lazy()
}

fn number(value: Option<prost_types::Value>) -> Option<i64> {
    value
        .and_then(|v| json_from_proto(v).ok())
        .and_then(|v| v.as_i64())
}

fn entry_read(entry: Option<MemoryEntry>) -> Outcome {
    match entry {
        Some(entry) => match number(entry.value) {
            Some(value) => Outcome::Read {
                version: entry.version,
                value,
            },
            None => Outcome::Done,
        },
        None => Outcome::Done,
    }
}

/// What one client does until `deadline` (nanoseconds of the run).
pub struct Client {
    pub id: usize,
    pub channel: Channel,
    pub recorder: Arc<Recorder>,
    /// Percent of calls made with a deadline of a few milliseconds, which
    /// the client cancels mid-call.
    pub cancel_percent: u64,
    /// The newest revision the watch consumers received, for reads as of
    /// a revision.
    pub revisions: Arc<AtomicI64>,
}

impl Client {
    pub async fn run(self, deadline: u64) -> usize {
        let mut rng = Rng::new(self.id as u64 + 1);
        let mut written = 0i64;
        let mut seen_version = [0i64; KEYS.len()];
        let mut seen_seq = [0i64; SESSIONS.len()];
        let mut calls = 0;
        while self.recorder.now() < deadline {
            calls += 1;
            let k = rng.below(KEYS.len() as u64) as usize;
            let key = KEYS[k].to_owned();
            written += 1;
            let value = self.id as i64 * 1_000_000 + written;
            let call = match rng.below(100) {
                0..=15 => Call::Set {
                    key,
                    value,
                    expected: None,
                    request_id: None,
                },
                16..=19 => Call::Recent {
                    session: rng
                        .chance(50)
                        .then(|| SESSIONS[rng.below(SESSIONS.len() as u64) as usize].to_owned()),
                    limit: 1 + rng.below(30) as i64,
                },
                20..=24 => {
                    let s = rng.below(SESSIONS.len() as u64) as usize;
                    Call::ListEpisodes {
                        session: SESSIONS[s].to_owned(),
                        // The newest few the client knows of, and after.
                        after_seq: (seen_seq[s] - rng.below(20) as i64).max(0),
                    }
                }
                25..=34 => Call::Set {
                    key,
                    value,
                    expected: Some(seen_version[k]),
                    request_id: None,
                },
                35..=44 => Call::Set {
                    key,
                    value,
                    expected: None,
                    request_id: Some(format!("r-{}-{written}", self.id)),
                },
                45..=51 => Call::Delete { key },
                52..=57 => Call::Get { key },
                58..=61 => {
                    // Half of them among the newest revisions, whose
                    // versions are mostly kept; the rest anywhere, mostly
                    // purged since.
                    let newest = self.revisions.load(Ordering::Relaxed).max(1) as u64;
                    let back = if rng.chance(50) {
                        newest.min(20)
                    } else {
                        newest
                    };
                    Call::GetAt {
                        key,
                        revision: (newest - rng.below(back)) as i64,
                    }
                }
                62..=66 => Call::Search { key },
                67..=70 => Call::GetVersion {
                    key,
                    version: 1 + rng.below(seen_version[k].max(1) as u64) as i64,
                },
                71..=74 => Call::List,
                75..=78 => Call::History { key },
                79..=80 => Call::Purge { key, keep: 3 },
                81..=94 => Call::Append {
                    session: SESSIONS[rng.below(SESSIONS.len() as u64) as usize].to_owned(),
                    id: format!("e-{}-{written}", self.id),
                    value,
                },
                95..=96 => Call::CreateTask {
                    session: SESSIONS[rng.below(SESSIONS.len() as u64) as usize].to_owned(),
                    request_id: format!("t-{}-{written}", self.id),
                },
                97 => Call::Import {
                    id: format!("imp-{}-{written}", self.id),
                },
                _ => Call::RunRule,
            };
            let retried = matches!(
                call,
                Call::Append { .. }
                    | Call::CreateTask { .. }
                    | Call::Set {
                        request_id: Some(_),
                        ..
                    }
            );
            let mut attempts = 0;
            loop {
                let cancel = rng.chance(self.cancel_percent);
                let op = self.call(call.clone(), cancel, &mut rng).await;
                if let (Call::Set { .. } | Call::Delete { .. }, Outcome::Wrote { version }) =
                    (&op.call, &op.outcome)
                {
                    seen_version[k] = *version;
                }
                if let Outcome::Read { version, .. } = op.outcome {
                    seen_version[k] = seen_version[k].max(version);
                }
                if let (Call::Append { session, .. }, Outcome::Appended { seq, .. }) =
                    (&op.call, &op.outcome)
                    && let Some(s) = SESSIONS.iter().position(|name| name == session)
                {
                    seen_seq[s] = seen_seq[s].max(*seq);
                }
                let unknown = matches!(op.outcome, Outcome::Unknown { .. });
                self.recorder.record(op);
                attempts += 1;
                // A write with an id is retried with the same id until its
                // outcome is known: the point of the id.
                if !(retried && unknown) || attempts == RETRIES {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20 + rng.below(80))).await;
            }
        }
        calls
    }

    /// Makes one call and records it.
    async fn call(&self, call: Call, cancel: bool, rng: &mut Rng) -> Op {
        let limit = if cancel {
            Duration::from_millis(1 + rng.below(5))
        } else {
            CALL_TIMEOUT
        };
        let start = self.recorder.now();
        let outcome = match tokio::time::timeout(limit, self.send(&call)).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(status)) => outcome_of(&status),
            Err(_) => Outcome::Unknown {
                code: tonic::Code::Cancelled,
                transport: false,
            },
        };
        Op {
            client: self.id,
            start,
            end: self.recorder.now(),
            call,
            outcome,
        }
    }

    async fn send(&self, call: &Call) -> Result<Outcome, tonic::Status> {
        let mut memory = MemoryServiceClient::new(self.channel.clone());
        Ok(match call {
            Call::Set {
                key,
                value,
                expected,
                request_id,
            } => {
                let entry = memory
                    .set(SetRequest {
                        scope_type: NAMESPACE,
                        scope: SCOPE.into(),
                        key: key.clone(),
                        value: Some(json_to_proto(&json!(value))),
                        expected_version: *expected,
                        request_id: request_id.clone().unwrap_or_default(),
                    })
                    .await?
                    .into_inner()
                    .entry
                    .unwrap_or_default();
                Outcome::Wrote {
                    version: entry.version,
                }
            }
            Call::Delete { key } => {
                let entry = memory
                    .delete(DeleteRequest {
                        scope_type: NAMESPACE,
                        scope: SCOPE.into(),
                        key: key.clone(),
                        ..DeleteRequest::default()
                    })
                    .await?
                    .into_inner()
                    .entry
                    .unwrap_or_default();
                Outcome::Wrote {
                    version: entry.version,
                }
            }
            Call::Get { key } | Call::GetVersion { key, .. } | Call::GetAt { key, .. } => {
                let (version, as_of) = match call {
                    Call::GetVersion { version, .. } => (*version, None),
                    Call::GetAt { revision, .. } => (
                        0,
                        Some(AsOf {
                            point: Some(as_of::Point::Revision(*revision)),
                        }),
                    ),
                    _ => (0, None),
                };
                let entry = memory
                    .get(GetRequest {
                        scope_type: NAMESPACE,
                        scope: SCOPE.into(),
                        key: key.clone(),
                        version,
                        as_of,
                    })
                    .await?
                    .into_inner()
                    .entry;
                entry_read(entry)
            }
            Call::List => {
                let entries = memory
                    .list(ListRequest {
                        scope_type: NAMESPACE,
                        scope: SCOPE.into(),
                        page_size: 100,
                        ..ListRequest::default()
                    })
                    .await?
                    .into_inner()
                    .entries;
                Outcome::Listed(
                    entries
                        .into_iter()
                        .filter(|e| KEYS.contains(&e.key.as_str()))
                        .filter_map(|e| Some((e.key.clone(), e.version, number(e.value)?)))
                        .collect(),
                )
            }
            Call::Search { key } => match search(&self.channel, key).await? {
                Some((version, value)) => Outcome::Read { version, value },
                None => Outcome::Absent,
            },
            Call::History { key } => Outcome::Versions(history(&self.channel, key).await?),
            Call::Purge { key, keep } => {
                MemoryAdminServiceClient::new(self.channel.clone())
                    .purge(PurgeRequest {
                        scope_type: NAMESPACE,
                        scope: SCOPE.into(),
                        key: key.clone(),
                        keep: Some(*keep),
                        dry_run: false,
                    })
                    .await?;
                Outcome::Done
            }
            Call::Append { session, id, value } => {
                let response = append(&self.channel, session, id, *value).await?;
                Outcome::Appended {
                    seq: response.0,
                    replayed: response.1,
                }
            }
            Call::ListEpisodes { session, after_seq } => {
                Outcome::Episodes(list_episodes(&self.channel, session, *after_seq).await?)
            }
            Call::Recent { session, limit } => {
                Outcome::Recent(recent(&self.channel, session.as_deref(), *limit).await?)
            }
            Call::Import { id } => {
                // Two messages, so the lines are staged in two steps.
                let lines = import_lines(id);
                let (first, second) = lines.split_at(lines.len() / 2);
                let messages = [first, second].map(|lines| ImportRequest {
                    lines: lines.to_vec(),
                });
                DataServiceClient::new(self.channel.clone())
                    .import(tokio_stream::iter(messages))
                    .await?;
                Outcome::Done
            }
            Call::CreateTask {
                session,
                request_id,
            } => {
                let task = WorkingMemoryServiceClient::new(self.channel.clone())
                    .create_task(CreateTaskRequest {
                        session_id: session.clone(),
                        app: APP.into(),
                        user: USER.into(),
                        subject: request_id.clone(),
                        request_id: request_id.clone(),
                        ..CreateTaskRequest::default()
                    })
                    .await?
                    .into_inner()
                    .task
                    .unwrap_or_default();
                Outcome::Created { task: task.id }
            }
            Call::RunRule => {
                ConsolidationServiceClient::new(self.channel.clone())
                    .run_rule(RunRuleRequest {
                        rule_id: RULE.into(),
                        dry_run: false,
                        max_episodes: 50,
                    })
                    .await?;
                Outcome::Done
            }
        })
    }
}

/// The keys an import file writes in its scope.
pub const IMPORT_KEYS: [&str; 2] = ["a", "b"];

/// The versions of the fact an import file writes.
pub const IMPORT_VERSIONS: usize = 2;

/// An import file (format version 2) whose every record is named by `id`.
pub fn import_lines(id: &str) -> Vec<String> {
    // An hour ago, not a fixed day. The import's changes carry the file's
    // times; once a fixed day passed the change feed's retention (7 days),
    // the server's prune took them with every revision before them, and the
    // final watch from revision 0 was refused as pruned forever. The feed
    // is pruned as a prefix since (watch.rs,
    // `an_old_import_does_not_prune_the_feed_before_it`); a file's times
    // still should not decide what this harness exercises.
    let t0 = (chrono::Utc::now() - chrono::Duration::hours(1))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let t0 = t0.as_str();
    let mut records = vec![
        json!({"kind": "header", "format": "engram.export", "version": 2,
        "tenant": "elsewhere", "selection": "tenant", "export_time": t0}),
    ];
    for key in IMPORT_KEYS {
        records.push(
            json!({"kind": "memory_version", "scope_type": "namespace", "scope": id,
            "key": key, "version": 1, "value": key, "deleted": false, "create_time": t0}),
        );
    }
    records.push(json!({"kind": "fact", "id": id, "app": APP, "user": USER,
        "fact_kind": "semantic", "subject": id, "predicate": "imported",
        "version": IMPORT_VERSIONS, "deleted": false, "create_time": t0, "update_time": t0}));
    for version in 1..=IMPORT_VERSIONS {
        records.push(
            json!({"kind": "fact_version", "fact_id": id, "version": version,
            "deleted": false, "subject": id, "predicate": "imported", "object": "",
            "content": format!("{id} {version}"), "confidence": 1.0, "source": "remember",
            "source_episode_ids": [], "channels": [], "create_time": t0}),
        );
    }
    records.push(json!({"kind": "fact_source", "fact_id": id, "episode_id": id}));
    records.iter().map(ToString::to_string).collect()
}

/// What of an import file's records the server holds: how many of its keys
/// and how many versions of its fact.
pub async fn imported(channel: &Channel, id: &str) -> Result<(usize, usize), tonic::Status> {
    let mut keys = 0;
    for key in IMPORT_KEYS {
        let got = MemoryServiceClient::new(channel.clone())
            .get(GetRequest {
                scope_type: NAMESPACE,
                scope: id.into(),
                key: key.into(),
                ..GetRequest::default()
            })
            .await;
        match got {
            Ok(_) => keys += 1,
            Err(status) if status.code() == tonic::Code::NotFound => {}
            Err(status) => return Err(status),
        }
    }
    let fact = ConsolidationServiceClient::new(channel.clone())
        .get_fact(GetFactRequest {
            fact_id: id.into(),
            page_size: 10,
            ..GetFactRequest::default()
        })
        .await;
    let versions = match fact {
        Ok(fact) => fact.into_inner().versions.len(),
        Err(status) if status.code() == tonic::Code::NotFound => 0,
        Err(status) => return Err(status),
    };
    Ok((keys, versions))
}

/// Every kept version of a key: (version, value; None for a tombstone).
/// A key's versions, none when it was never written (History is then
/// `NOT_FOUND`: a short run on a busy machine may not reach every key).
pub async fn history(
    channel: &Channel,
    key: &str,
) -> Result<Vec<(i64, Option<i64>)>, tonic::Status> {
    let never_written = |status: &tonic::Status| status.code() == tonic::Code::NotFound;
    let opened = MemoryServiceClient::new(channel.clone())
        .history(HistoryRequest {
            scope_type: NAMESPACE,
            scope: SCOPE.into(),
            key: key.into(),
            from_version: 0,
        })
        .await;
    let mut stream = match opened {
        Ok(stream) => stream.into_inner(),
        Err(status) if never_written(&status) => return Ok(Vec::new()),
        Err(status) => return Err(status),
    };
    let mut versions = Vec::new();
    while let Some(item) = stream.next().await {
        let item = match item {
            Err(status) if versions.is_empty() && never_written(&status) => return Ok(versions),
            item => item?,
        };
        let entry = item.entry.unwrap_or_default();
        let value = if entry.deleted {
            None
        } else {
            number(entry.value)
        };
        versions.push((entry.version, value));
    }
    Ok(versions)
}

/// Searches the scope's memory for a key's name (lexical, so a write is
/// findable once acknowledged): the version and value of the key's hit, or
/// None when the key is not among the hits.
pub async fn search(channel: &Channel, key: &str) -> Result<Option<(i64, i64)>, tonic::Status> {
    let hits = SearchServiceClient::new(channel.clone())
        .search(SearchRequest {
            query: key.into(),
            sources: vec![SearchSource::Memory as i32],
            mode: SearchMode::Lexical as i32,
            scope_type: NAMESPACE,
            scope: SCOPE.into(),
            ..SearchRequest::default()
        })
        .await?
        .into_inner()
        .hits;
    Ok(hits.into_iter().find_map(|hit| match hit.item {
        Some(Item::Entry(entry)) if entry.key == key => Some((entry.version, number(entry.value)?)),
        _ => None,
    }))
}

/// A session's episodes after `after_seq`, every page: (seq, id) of each.
pub async fn list_episodes(
    channel: &Channel,
    session: &str,
    after_seq: i64,
) -> Result<Vec<(i64, String)>, tonic::Status> {
    let mut episodes = EpisodeServiceClient::new(channel.clone());
    let mut listed = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = episodes
            .list_episodes(ListEpisodesRequest {
                session_id: session.into(),
                after_seq,
                page_size: 1000,
                page_token,
                ..ListEpisodesRequest::default()
            })
            .await?
            .into_inner();
        listed.extend(page.episodes.into_iter().map(|e| (e.seq, e.id)));
        if page.next_page_token.is_empty() {
            return Ok(listed);
        }
        page_token = page.next_page_token;
    }
}

/// The user's newest episodes (of one session, if given), newest first.
pub async fn recent(
    channel: &Channel,
    session: Option<&str>,
    limit: i64,
) -> Result<Vec<Recented>, tonic::Status> {
    let episodes = EpisodeServiceClient::new(channel.clone())
        .recent(RecentRequest {
            user: USER.into(),
            session_id: session.unwrap_or_default().into(),
            limit: limit as i32,
            ..RecentRequest::default()
        })
        .await?
        .into_inner()
        .episodes;
    Ok(episodes
        .into_iter()
        .map(|e| (micros(e.timestamp), e.cursor, e.id, e.session_id, e.seq))
        .collect())
}

/// A timestamp in microseconds since the epoch (0 when absent).
fn micros(time: Option<prost_types::Timestamp>) -> i64 {
    time.map_or(0, |t| t.seconds * 1_000_000 + i64::from(t.nanos) / 1_000)
}

/// What each episode's metadata carries beside its facts: 8 KiB, so that
/// pages of hundreds of episodes (a tail catching up, a listing, a rule's
/// run) end at their bytes rather than their count, and those cuts are
/// read under faults too.
fn pad() -> &'static str {
    static PAD: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PAD.get_or_init(|| "p".repeat(8 * 1024))
}

/// Appends one episode; its seq and whether it was a replay.
pub async fn append(
    channel: &Channel,
    session: &str,
    id: &str,
    value: i64,
) -> Result<(i64, bool), tonic::Status> {
    let response = EpisodeServiceClient::new(channel.clone())
        .append_episode(AppendEpisodeRequest {
            session_id: session.into(),
            app: APP.into(),
            user: USER.into(),
            episode: Some(engram::proto::NewEpisode {
                id: id.into(),
                r#type: "observation".into(),
                content: Some(json_to_proto(&json!(value))),
                metadata: match json_to_proto(&json!({"learn": true, "subject": id, "pad": pad()}))
                    .kind
                {
                    Some(prost_types::value::Kind::StructValue(s)) => Some(s),
                    _ => None,
                },
                ..engram::proto::NewEpisode::default()
            }),
            require_session: false,
        })
        .await?
        .into_inner();
    let episode = response.episode.unwrap_or_default();
    Ok((episode.seq, response.replayed))
}

/// Every task of a session: (id, subject), in id order.
pub async fn tasks(
    channel: &Channel,
    session: &str,
) -> Result<Vec<(String, String)>, tonic::Status> {
    let mut working = WorkingMemoryServiceClient::new(channel.clone());
    let mut tasks = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = working
            .list_tasks(ListTasksRequest {
                session_id: session.into(),
                app: APP.into(),
                user: USER.into(),
                page_size: 1000,
                page_token,
            })
            .await?
            .into_inner();
        tasks.extend(page.tasks.into_iter().map(|t| (t.id, t.subject)));
        if page.next_page_token.is_empty() {
            return Ok(tasks);
        }
        page_token = page.next_page_token;
    }
}

/// One change as a watch delivered it: revision, kind, key, version.
pub type Change = (i64, i32, String, i64);

/// An episode as a tail receives it: (cursor, id, session, seq, timestamp
/// in µs).
pub type Tailed = (i64, String, String, i64, i64);

/// An episode of a tail as the checker keeps it.
pub fn tailed(episode: engram::proto::Episode) -> Tailed {
    let micros = micros(episode.timestamp);
    (
        episode.cursor,
        episode.id,
        episode.session_id,
        episode.seq,
        micros,
    )
}

/// An episode as `Recent` gives it: (timestamp in µs, cursor, id, session,
/// seq).
pub type Recented = (i64, i64, String, String, i64);

/// Watches the scope from the start, reconnecting from the last revision
/// received after any error, until it sees the sentinel key. `pause`
/// makes it a slow reader (the server may cut it off as too slow, and it
/// resumes). Returns what it received, and how often it reconnected.
pub async fn watch(addr: SocketAddr, pause: Option<Duration>) -> (Vec<Change>, usize) {
    watch_after(addr, 0, pause, None).await
}

/// [`watch`], keeping `revisions` at the newest revision received.
pub async fn watch_publishing(
    addr: SocketAddr,
    pause: Option<Duration>,
    revisions: Arc<AtomicI64>,
) -> (Vec<Change>, usize) {
    watch_after(addr, 0, pause, Some(&revisions)).await
}

/// What a watch receives after `revision`, up to the sentinel.
pub async fn watch_from(addr: SocketAddr, revision: i64) -> Vec<Change> {
    watch_after(addr, revision, None, None).await.0
}

async fn watch_after(
    addr: SocketAddr,
    revision: i64,
    pause: Option<Duration>,
    revisions: Option<&AtomicI64>,
) -> (Vec<Change>, usize) {
    let channel = channel(addr);
    let mut seen: Vec<Change> = Vec::new();
    let mut reconnects = 0;
    loop {
        let from = seen.last().map_or(revision, |c| c.0);
        let opened = MemoryServiceClient::new(channel.clone())
            .watch(WatchRequest {
                scope_type: NAMESPACE,
                scope: SCOPE.into(),
                key_prefix: String::new(),
                from_revision: Some(from),
            })
            .await;
        let mut stream = match opened {
            Ok(stream) => stream.into_inner(),
            Err(status) => {
                refused_for_good("a watch", from, &status);
                reconnects += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        while let Some(received) = stream.next().await {
            let change = match received {
                Ok(change) => change,
                Err(status) => {
                    refused_for_good("a watch", from, &status);
                    break;
                }
            };
            let done = change.key == SENTINEL;
            if let Some(revisions) = revisions {
                revisions.fetch_max(change.revision, Ordering::Relaxed);
            }
            seen.push((change.revision, change.kind, change.key, change.version));
            if done {
                return (seen, reconnects);
            }
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
        }
        reconnects += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Tails the app's episodes from the start, reconnecting from the last
/// cursor received, until it sees the sentinel episode.
pub async fn tail(addr: SocketAddr) -> (Vec<Tailed>, usize) {
    tail_after(addr, 0).await
}

/// What a tail receives after `cursor`, up to the sentinel.
pub async fn tail_from(addr: SocketAddr, cursor: i64) -> Vec<Tailed> {
    tail_after(addr, cursor).await.0
}

async fn tail_after(addr: SocketAddr, cursor: i64) -> (Vec<Tailed>, usize) {
    let channel = channel(addr);
    let mut seen: Vec<Tailed> = Vec::new();
    let mut reconnects = 0;
    loop {
        let from = seen.last().map_or(cursor, |e| e.0);
        let opened = EpisodeServiceClient::new(channel.clone())
            .tail_episodes(TailEpisodesRequest {
                app: APP.into(),
                cursor: Some(from),
                ..TailEpisodesRequest::default()
            })
            .await;
        let mut stream = match opened {
            Ok(stream) => stream.into_inner(),
            Err(status) => {
                refused_for_good("a tail", from, &status);
                reconnects += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        while let Some(received) = stream.next().await {
            let item = match received {
                Ok(item) => item,
                Err(status) => {
                    refused_for_good("a tail", from, &status);
                    break;
                }
            };
            let episode = item.episode.unwrap_or_default();
            let done = episode.id == SENTINEL;
            seen.push(tailed(episode));
            if done {
                return (seen, reconnects);
            }
        }
        reconnects += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Panics on a refusal that reconnecting cannot mend (a pruned position, a
/// request the server rejects): a consumer retrying it would wait forever,
/// and the run would hang instead of naming what went wrong. Unavailable,
/// cut-off and too-slow streams are what the faults cause; those retry.
fn refused_for_good(what: &str, from: i64, status: &tonic::Status) {
    use tonic::Code;
    if matches!(
        status.code(),
        Code::OutOfRange
            | Code::InvalidArgument
            | Code::NotFound
            | Code::FailedPrecondition
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
    ) {
        panic!("{what} from {from} was refused for good: {status:?}");
    }
}
