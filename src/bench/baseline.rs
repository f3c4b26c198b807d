//! The baseline: the statements the server runs, straight against the same
//! database. On Postgres through pgbench (`-M prepared`, the same client
//! count); on SQLite by calling the store in-process (the same SQL, no gRPC
//! and no service layer in between).

use std::time::Instant;

use anyhow::Context;
use chrono::Utc;

use super::BenchArgs;
use super::workloads::{
    FIRST_RANK, KEYS, RECENT_APP, RECENT_SESSIONS, RECENT_USERS, Rng, VOCABULARY, Workload, key,
    set_value,
};
use crate::context::Tenant;
use crate::memory::ports::{MemoryStore, Mutation, Write};
use crate::memory::{ChangeKind, Key, Provenance, Scope, ScopeName, ScopeType, Value};
use crate::sessions::ports::{Append, SessionStore};
use crate::sessions::{EpisodeInput, Id, Name, NewEpisode, Owner, RecentQuery};
use crate::store::{SqliteStore, pg_statements};

/// The app (and user) of the sessions the raw statement appends to.
pub const RAW_APP: &str = "bench-raw";
/// The app (and user) of the sessions the in-process store appends to.
pub const INPROC_APP: &str = "bench-inproc";

/// The episodes `recent` and `search` run over.
pub struct Recent {
    /// The loaded set's episodes (1000 sessions of 100 users).
    pub loaded: i64,
    /// Every other episode in the store: runs' kept appends, say. Their
    /// words are in the same index lists as the loaded set's, so a search
    /// over a store that holds many of them reads longer lists.
    pub others: i64,
}

impl Recent {
    /// What a workload's note says of the episodes it ran over.
    pub fn described(&self) -> String {
        let mut out = format!("over {} episodes of {RECENT_USERS} users", self.loaded);
        if self.others > 0 {
            out.push_str(&format!(
                " (the store holds {} other episodes too)",
                self.others
            ));
        }
        out
    }
}

/// Counts the sessions' episodes outside the loaded set: `OTHERS` with
/// Postgres's parameters, `OTHERS_SQLITE` with SQLite's.
const OTHERS: &str = "SELECT coalesce(sum(episode_count), 0)::bigint FROM sessions \
                      WHERE NOT (tenant = 'default' AND app = $1)";
const OTHERS_SQLITE: &str = "SELECT coalesce(sum(episode_count), 0) FROM sessions \
                             WHERE NOT (tenant = 'default' AND app = ?1)";

/// Loads `n` episodes for `recent` straight into the database (1000
/// sessions of 100 users), once; says how many there are, and how many
/// others the store holds.
pub async fn ensure_recent(database_url: &str, n: i64) -> anyhow::Result<Recent> {
    let per = (n / RECENT_SESSIONS).max(1);
    if database_url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(database_url).await?;
        let loaded = load_recent_postgres(&pool, per).await?;
        let others = sqlx::query_scalar(OTHERS)
            .bind(RECENT_APP)
            .fetch_one(&pool)
            .await?;
        return Ok(Recent { loaded, others });
    }
    let pool = SqliteStore::direct_pool(database_url).await?;
    let loaded = load_recent_sqlite(&pool, per).await?;
    let others = sqlx::query_scalar(OTHERS_SQLITE)
        .bind(RECENT_APP)
        .fetch_one(&pool)
        .await?;
    Ok(Recent { loaded, others })
}

/// Whether `have` episodes are the whole set of `per` a session; says
/// that it is loaded when not.
fn loaded(have: i64, per: i64) -> bool {
    if have >= per * RECENT_SESSIONS {
        return true;
    }
    eprintln!(
        "engram bench: loading {} episodes for recent …",
        per * RECENT_SESSIONS
    );
    false
}

/// [`ensure_recent`]'s set on Postgres, `per` episodes a session, loaded
/// unless it is there; returns its size.
async fn load_recent_postgres(pool: &sqlx::PgPool, per: i64) -> anyhow::Result<i64> {
    let have: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(episode_count), 0)::bigint FROM sessions \
         WHERE tenant = 'default' AND app = $1",
    )
    .bind(RECENT_APP)
    .fetch_one(pool)
    .await?;
    if loaded(have, per) {
        return Ok(have);
    }
    sqlx::query("DELETE FROM sessions WHERE tenant = 'default' AND app = $1")
        .bind(RECENT_APP)
        .execute(pool)
        .await?;
    sqlx::query(
        "INSERT INTO sessions (tenant, id, app, user_id, create_time, update_time, last_seq, episode_count) \
         SELECT 'default', 'bench-s' || s, $1, 'bench-u' || (s % $2), now(), now(), $3, $3 \
         FROM generate_series(0, $4 - 1) s",
    )
    .bind(RECENT_APP)
    .bind(RECENT_USERS as i64)
    .bind(per)
    .bind(RECENT_SESSIONS)
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO episodes (tenant, session_id, seq, id, app, user_id, agent, type, content, \
         metadata, source_node, timestamp, create_time, fingerprint) \
         SELECT 'default', 'bench-s' || s, e, 'bench-e' || s || '-' || e, $1, 'bench-u' || (s % $2), \
         $1, 'observation', to_jsonb((SELECT string_agg('w' || floor($6 * power($5::float8 / $6, \
         (abs(hashtext(s || '.' || e || '.' || k)) % 1000003) / 1000003.0))::int, ' ') \
         FROM generate_series(1, 30) k)), '{}', '', \
         now() - ((s * $3 + e) * interval '1 millisecond'), now(), '\\x00'::bytea \
         FROM generate_series(0, $4 - 1) s, generate_series(1, $3) e",
    )
    .bind(RECENT_APP)
    .bind(RECENT_USERS as i64)
    .bind(per)
    .bind(RECENT_SESSIONS)
    .bind(VOCABULARY as i64)
    .bind(FIRST_RANK as i64)
    .execute(pool)
    .await?;
    // Vacuumed as well as analyzed, as a table in service would be by
    // autovacuum: the first reads of freshly inserted rows otherwise
    // write each page's hint bits, and the first `search` after a
    // load ran at 841 ops/s (p99 75 ms) against 1,062-1,074 after a
    // vacuum.
    eprintln!("engram bench: vacuuming the loaded episodes …");
    sqlx::query("VACUUM (ANALYZE) episodes, sessions")
        .execute(pool)
        .await?;
    Ok(per * RECENT_SESSIONS)
}

/// [`ensure_recent`]'s set on SQLite, likewise. SQLite has no `power()`
/// here (the bundled build leaves out its math functions), so a word's
/// rank, `FIRST_RANK * 2^t` for `t` uniform in `[0, log2(VOCABULARY /
/// FIRST_RANK))`, takes `2^t`'s whole part as a shift and its fraction
/// from a quadratic (within 0.3%); `t` comes from a quadratic of the
/// word's place, deterministic like Postgres's `hashtext`.
async fn load_recent_sqlite(pool: &sqlx::SqlitePool, per: i64) -> anyhow::Result<i64> {
    let have: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(episode_count), 0) FROM sessions WHERE tenant = 'default' AND app = ?1",
    )
    .bind(RECENT_APP)
    .fetch_one(pool)
    .await?;
    if loaded(have, per) {
        return Ok(have);
    }
    let now = Utc::now().timestamp_micros();
    let mut tx = pool.begin().await?;
    sqlx::query("DELETE FROM sessions WHERE tenant = 'default' AND app = ?1")
        .bind(RECENT_APP)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i + 1 < ?4) \
         INSERT INTO sessions (tenant, id, app, user_id, create_time, update_time, last_seq, episode_count) \
         SELECT 'default', 'bench-s' || i, ?1, 'bench-u' || (i % ?2), ?5, ?5, ?3, ?3 FROM s",
    )
    .bind(RECENT_APP)
    .bind(RECENT_USERS as i64)
    .bind(per)
    .bind(RECENT_SESSIONS)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i + 1 < ?4), \
         e(j) AS (SELECT 1 UNION ALL SELECT j + 1 FROM e WHERE j < ?3), \
         w(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM w WHERE k < 30) \
         INSERT INTO episodes (tenant, session_id, seq, id, app, user_id, agent, type, content, \
         metadata, source_node, timestamp, create_time, fingerprint) \
         SELECT 'default', 'bench-s' || i, j, 'bench-e' || i || '-' || j, ?1, 'bench-u' || (i % ?2), \
         ?1, 'observation', json_quote((SELECT group_concat('w' || min(?6, \
         CAST(?7 * (1 << n) * (1 + f * (0.6565 + 0.3435 * f)) AS INTEGER)), ' ') \
         FROM (SELECT CAST(t AS INTEGER) AS n, t - CAST(t AS INTEGER) AS f \
         FROM (SELECT ((h * h + h) % 1000003) / 1000003.0 * ?8 AS t \
         FROM (SELECT (i * 7919 + j * 104729 + k * 15485863) % 1000003 AS h FROM w))))), \
         '{}', '', ?5 - (i * ?3 + j) * 1000, ?5, x'00' \
         FROM s, e",
    )
    .bind(RECENT_APP)
    .bind(RECENT_USERS as i64)
    .bind(per)
    .bind(RECENT_SESSIONS)
    .bind(now)
    .bind(VOCABULARY as i64)
    .bind(FIRST_RANK as i64)
    .bind(((VOCABULARY / FIRST_RANK) as f64).log2())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    sqlx::query("ANALYZE").execute(pool).await?;
    Ok(per * RECENT_SESSIONS)
}

/// Ops/s (and average latency in ms, when known) of the baseline, or `None`
/// for a workload without one.
pub async fn run(
    workload: Workload,
    args: &BenchArgs,
) -> anyhow::Result<Option<(f64, Option<f64>)>> {
    if !matches!(
        workload,
        Workload::Set | Workload::Get | Workload::Append | Workload::Recent
    ) {
        return Ok(None);
    }
    if args.database().starts_with("postgres") {
        pgbench(workload, args).await.map(Some)
    } else {
        in_process(workload, args)
            .await
            .map(|ops| Some((ops, None)))
    }
}

/// Turns a statement with $n parameters into a pgbench line: each $n is
/// replaced (highest first, so $12 is not read as $1) by an expression.
fn substitute(sql: &str, values: &[(usize, &str)]) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
    let mut out = sql.to_owned();
    for (n, value) in sorted {
        out = out.replace(&format!("${n}"), value);
    }
    out
}

/// The pgbench script of a workload; `vector` is the set's or the
/// append's search vector as `tsvector` text (the server sends the same
/// one, built in Rust, in binary; a set's is one key's, each key's the
/// same size).
fn pgbench_script(workload: Workload, vector: &str, run: &str) -> String {
    let key_expr = "('k' || lpad(:n::text, 5, '0'))";
    let value = set_value(1).to_string().replace('\'', "''");
    match workload {
        Workload::Set => format!(
            "\\set n random(0, {})\n{};\n",
            KEYS - 1,
            substitute(
                pg_statements::SET_ANY,
                &[
                    (1, "'default'"),
                    (2, "1::smallint"),
                    (3, "'bench'"),
                    (4, key_expr),
                    (5, "now()"),
                    (7, &format!("'{value}'")),
                    (8, "false"),
                    (9, "''"),
                    (10, "''"),
                    (11, "''"),
                    (12, "1::smallint"),
                    (13, &format!("'{}'", vector.replace('\'', "''"))),
                ],
            )
        ),
        Workload::Get => format!(
            "\\set n random(0, {})\n{};\n",
            KEYS - 1,
            substitute(
                pg_statements::get_current_sql(),
                &[
                    (1, "'default'"),
                    (2, "1::smallint"),
                    (3, "'bench'"),
                    (4, key_expr)
                ],
            )
        ),
        Workload::Recent => format!(
            "\\set u random(0, {})\n{};\n",
            RECENT_USERS - 1,
            substitute(
                pg_statements::recent_sql(false, false),
                &[
                    (1, "'default'"),
                    (2, "('bench-u' || :u)"),
                    (5, "'{}'::text[]"),
                    (6, "20"),
                    (7, &pg_statements::recent_row_bytes(20).to_string()),
                ],
            )
        ),
        // The statement of an append of one new episode to a live session
        // (PgStore's blind first try): bump the counter and insert.
        _ => {
            let content = format!("\"{}\"", raw_append_text());
            let session = format!(
                "('{}' || :client_id)",
                super::workloads::session_prefix(RAW_APP, run)
            );
            let app = format!("'{RAW_APP}'");
            let id = "('raw-' || :client_id || '-' || :r)";
            format!(
                "\\set r random(1, 9000000000000000000)\n{};\n",
                substitute(
                    pg_statements::APPEND_SQL,
                    &[
                        (1, "'default'"),
                        (2, &session),
                        (3, "1"),
                        (4, "now()"),
                        (5, &app),
                        (6, &app),
                        (7, &format!("ARRAY[{id}]")),
                        (8, &format!("ARRAY[{app}]")),
                        (9, "ARRAY['observation']"),
                        (10, &format!("ARRAY['{content}']")),
                        (11, "ARRAY['{}']"),
                        (12, "ARRAY['']"),
                        (13, "ARRAY[now()]"),
                        (14, "ARRAY['\\x00'::bytea]"),
                        (
                            15,
                            &format!("ARRAY['{}'::tsvector]", vector.replace('\'', "''"))
                        ),
                        // A random id, as a server-generated one: not looked up.
                        (16, "true"),
                    ],
                )
            )
        }
    }
}

/// The content of the raw statement's appends.
fn raw_append_text() -> String {
    super::workloads::text(&mut Rng::new(11), 1024)
}

fn pgbench_binary() -> String {
    let found = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path().join("bin/pgbench"))
        .filter(|path| path.exists())
        .max();
    found.map_or_else(|| "pgbench".to_owned(), |p| p.display().to_string())
}

async fn pgbench(workload: Workload, args: &BenchArgs) -> anyhow::Result<(f64, Option<f64>)> {
    let mut vector = String::new();
    if workload == Workload::Set {
        let pool = sqlx::PgPool::connect(args.database()).await?;
        // Built by Postgres here; the server builds the same in Rust.
        vector = sqlx::query_scalar("SELECT engram_memory_vector('k00000', $1::jsonb)::text")
            .bind(set_value(1).to_string())
            .fetch_one(&pool)
            .await?;
    }
    if workload == Workload::Append {
        let pool = sqlx::PgPool::connect(args.database()).await?;
        sqlx::query(
            "INSERT INTO sessions (tenant, id, app, user_id, create_time, update_time) \
             SELECT 'default', $3 || c, $2, $2, now(), now() \
             FROM generate_series(0, $1) c ON CONFLICT DO NOTHING",
        )
        .bind(args.clients as i64)
        .bind(RAW_APP)
        .bind(super::workloads::session_prefix(RAW_APP, &args.run))
        .execute(&pool)
        .await?;
        // Built by Postgres here; the server builds the same in Rust.
        vector = sqlx::query_scalar(
            "SELECT jsonb_to_tsvector('english', to_jsonb($1::text), '[\"string\", \"numeric\"]')::text",
        )
        .bind(raw_append_text())
        .fetch_one(&pool)
        .await?;
    }
    let dir = tempfile_dir()?;
    let script = dir.join(format!("{}.sql", workload.name()));
    std::fs::write(&script, pgbench_script(workload, &vector, &args.run))?;
    let seconds = args.duration.as_secs().max(1).to_string();
    let clients = args.clients.to_string();
    let threads = args.clients.min(2).to_string();
    let output = tokio::process::Command::new(pgbench_binary())
        .args([
            "-n", "-M", "prepared", "-c", &clients, "-j", &threads, "-T", &seconds, "-f",
        ])
        .arg(&script)
        .arg(args.database())
        .output()
        .await
        .context("cannot run pgbench (install postgresql-client)")?;
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "pgbench failed: {}",
        String::from_utf8_lossy(&output.stderr)
            .lines()
            .last()
            .unwrap_or("")
    );
    let field = |prefix: &str| {
        stdout
            .lines()
            .find_map(|line| line.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
    };
    let tps = field("tps = ").context("pgbench printed no tps")?;
    Ok((tps, field("latency average = ")))
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("engram-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The store called straight from `--clients` tasks on the same SQLite
/// file: the same SQL as the server, without gRPC or the service layer.
async fn in_process(workload: Workload, args: &BenchArgs) -> anyhow::Result<f64> {
    let store =
        SqliteStore::connect(args.database(), &crate::config::Config::defaults().store).await?;
    let deadline = Instant::now() + args.duration;
    let mut tasks = Vec::new();
    for client in 0..args.clients {
        let store = store.clone();
        let session = super::workloads::session_id(INPROC_APP, &args.run, client);
        tasks.push(tokio::spawn(async move {
            let tenant = Tenant::default();
            let scope = Scope {
                scope_type: ScopeType::Namespace,
                name: ScopeName::parse("scope", "bench")?,
            };
            let provenance = Provenance::default();
            let mut rng = Rng::new(client as u64 + 11);
            let session = Id::parse("session_id", session)?;
            let owner = Owner {
                app: Some(Name::parse("app", INPROC_APP)?),
                user: Some(Name::parse("user", INPROC_APP)?),
            };
            let mut ops = 0u64;
            while Instant::now() < deadline {
                let n = rng.below(KEYS);
                let key = Key::parse("key", key(n))?;
                match workload {
                    Workload::Set => {
                        let value = Value::new(set_value(n), 1 << 20)?;
                        store
                            .write(
                                &tenant,
                                &Write {
                                    scope: &scope,
                                    key: &key,
                                    mutation: Mutation::Set(&value),
                                    expected_version: None,
                                    request: None,
                                    provenance: &provenance,
                                    now: Utc::now(),
                                    change: ChangeKind::Set,
                                },
                            )
                            .await?;
                    }
                    Workload::Get => {
                        store.get(&tenant, &scope, &key, None).await?;
                    }
                    Workload::Append => {
                        let episode = NewEpisode::new(
                            "episode",
                            &session,
                            EpisodeInput {
                                id: None,
                                agent: None,
                                kind: None,
                                content: serde_json::Value::String(super::workloads::text(
                                    &mut Rng::new(11),
                                    1024,
                                )),
                                metadata: serde_json::Map::new(),
                                source_node: String::new(),
                                timestamp: None,
                            },
                            1 << 20,
                        )?;
                        store
                            .append(
                                &tenant,
                                &Append {
                                    session_id: &session,
                                    owner: &owner,
                                    create: true,
                                    episodes: std::slice::from_ref(&episode),
                                    now: Utc::now(),
                                    max_sessions: 0,
                                    max_events: 0,
                                },
                            )
                            .await?;
                    }
                    _ => {
                        let query = RecentQuery {
                            user: Name::parse("user", format!("bench-u{}", n % RECENT_USERS))?,
                            session_id: None,
                            agent: None,
                            types: Vec::new(),
                            limit: 20,
                        };
                        store.recent(&tenant, &query).await?;
                    }
                }
                ops += 1;
            }
            Ok::<_, anyhow::Error>(ops)
        }));
    }
    let mut ops = 0;
    for task in tasks {
        ops += task.await??;
    }
    Ok(ops as f64 / args.duration.as_secs_f64())
}
