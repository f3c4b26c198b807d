//! Import: lines staged while the client streams, then applied in one
//! transaction.

use chrono::{DateTime, Utc};

use super::rows::{
    cached_row, episode_row, execution_row, fact_of, fact_row, fact_version_row, memory_row,
    rule_of, rule_row, session_row, sources_of, task_row, working_of, working_row,
};
use crate::context::Tenant;
use crate::data::ImportCounts;
use crate::data::records::{self, MemoryVersion, Record};
use crate::error::{Error, Reason, Result};
use crate::memory::ChangeKind;
use crate::store::sql::{Cols, Dialect, Run, Sql, params, select};

/// Staged lines read back per page while applying.
const APPLY_PAGE: i64 = 500;

// ---- one record by its identity, as an import compares it ----

static EXECUTION: Sql = select!(
    execution_columns!(),
    " FROM memory_executions WHERE tenant = $1 AND execution_id = $2"
);

static MEMORY_VERSION: Sql = select!(
    memory_columns!(),
    " FROM memory_versions WHERE tenant = $1 AND scope_type = $2 AND scope = $3 AND key = $4 \
     AND version = $5"
);

static HEAD: Sql = Sql::new(
    "SELECT version FROM memory_heads WHERE tenant = $1 AND scope_type = $2 AND scope = $3 \
     AND key = $4",
);

static SESSION: Sql = select!(
    session_columns!(),
    " FROM sessions WHERE tenant = $1 AND id = $2"
);

static EPISODE: Sql = select!(
    episode_columns!(),
    " FROM episodes WHERE tenant = $1 AND id = $2"
);

static EPISODE_AT: Sql =
    Sql::new("SELECT id FROM episodes WHERE tenant = $1 AND session_id = $2 AND seq = $3");

/// A session's count of its episodes, and the episodes it holds.
static EPISODES_HELD: Sql = Sql::new(
    "SELECT s.episode_count, (SELECT count(*) FROM episodes e \
     WHERE e.tenant = s.tenant AND e.session_id = s.id) \
     FROM sessions s WHERE s.tenant = $1 AND s.id = $2",
);

static WORKING: Sql = select!(
    working_columns!(),
    " FROM working_memory WHERE tenant = $1 AND session_id = $2"
);

static FACT: Sql = select!(fact_columns!(), " FROM facts WHERE tenant = $1 AND id = $2");

static TASK: Sql = select!(
    task_columns!(),
    " FROM working_tasks WHERE tenant = $1 AND session_id = $2 AND number = $3"
);

static CACHED: Sql = select!(
    cached_columns!(),
    " FROM working_cache WHERE tenant = $1 AND session_id = $2 AND path = $3"
);

static FACT_VERSION: Sql = select!(
    fact_version_columns!(),
    " FROM fact_versions WHERE tenant = $1 AND fact_id = $2 AND version = $3"
);

static FACT_SOURCE: Sql =
    Sql::new("SELECT 1 FROM fact_sources WHERE tenant = $1 AND fact_id = $2 AND episode_id = $3");

static RULE: Sql = select!(
    rule_columns!(),
    " FROM consolidation_rules WHERE tenant = $1 AND id = $2"
);

// Whether a request id is held already, where it must be unique: a
// session's and a rule's in the tenant, a task's in its session, a fact's
// per owner and kind.

static SESSION_REQUEST_HELD: Sql =
    Sql::new("SELECT 1 FROM sessions WHERE tenant = $1 AND create_request_id = $2");

static TASK_REQUEST_HELD: Sql = Sql::new(
    "SELECT 1 FROM working_tasks WHERE tenant = $1 AND session_id = $2 \
     AND create_request_id = $3",
);

static FACT_REQUEST_HELD: Sql = Sql::new(
    "SELECT 1 FROM facts WHERE tenant = $1 AND app = $2 AND user_id = $3 AND kind = $4 \
     AND create_request_id = $5",
);

static RULE_REQUEST_HELD: Sql =
    Sql::new("SELECT 1 FROM consolidation_rules WHERE tenant = $1 AND create_request_id = $2");

// ---- the import's writes ----

/// Gives the Postgres transaction its id before it takes a revision or a
/// cursor (see migration 0003).
static TAKE_XID: Sql = Sql::new("SELECT pg_current_xact_id()");

/// One import of a tenant's at a time on Postgres (SQLite's single writer
/// already is), taken before the transaction has an id, so an import
/// waiting its turn holds back no tail: imports of one file at once then
/// end as they would one after another, the first writing and the rest
/// finding every record in place, where each found none, inserted, and all
/// but one failed on the records' keys.
static ONE_IMPORT: Sql =
    Sql::new("SELECT pg_advisory_xact_lock(hashtextextended('engram.import/' || $1, 0))");

static INSERT_EXECUTION: Sql = Sql::new(
    "INSERT INTO memory_executions (tenant, execution_id, flow_id, flow_name, create_time) \
     VALUES ($1, $2, $3, $4, $5)",
);

/// A new key's head; no row when a concurrent write created it first.
static INSERT_HEAD: Sql = Sql::new(
    "INSERT INTO memory_heads (tenant, scope_type, scope, key, version, deleted, update_time) \
     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
);

/// Moves a head from the version read ($8); no row when a write moved it.
static MOVE_HEAD: Sql = Sql::new(
    "UPDATE memory_heads SET version = $5, deleted = $6, update_time = $7 \
     WHERE tenant = $1 AND scope_type = $2 AND scope = $3 AND key = $4 AND version = $8",
);

static INSERT_CHANGE: Sql = Sql::new(
    "INSERT INTO memory_changes (tenant, scope_type, scope, key, kind, version, create_time) \
     VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING revision",
);

static INSERT_VERSION: Sql = Sql::new(
    "INSERT INTO memory_versions (tenant, scope_type, scope, key, version, value, deleted, \
     execution_id, flow_id, flow_name, create_time, revision) \
     VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10, $11, $12)",
);

static INSERT_SESSION: Sql = Sql::new(
    "INSERT INTO sessions (tenant, id, app, user_id, metadata, create_time, update_time, \
     end_time, last_seq, episode_count, episodes_evicted, create_request_id, \
     create_fingerprint) \
     VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, $11, $12, $13)",
);

static INSERT_EPISODE: Sql = Sql::new(
    "INSERT INTO episodes (tenant, session_id, seq, id, app, user_id, agent, type, content, \
     metadata, source_node, timestamp, create_time, fingerprint) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10::jsonb, $11, $12, $13, $14)",
);

static INSERT_WORKING: Sql = Sql::new(
    "INSERT INTO working_memory (tenant, session_id, goal, next_task, update_time) \
     VALUES ($1, $2, $3, $4, $5)",
);

static INSERT_TASK: Sql = Sql::new(
    "INSERT INTO working_tasks (tenant, session_id, number, subject, description, status, \
     create_time, update_time, create_request_id, create_fingerprint) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
);

static INSERT_CACHE: Sql = Sql::new(
    "INSERT INTO working_cache (tenant, session_id, path, content, bytes, update_time) \
     VALUES ($1, $2, $3, $4, $5, $6)",
);

static INSERT_FACT: Sql = Sql::new(
    "INSERT INTO facts (tenant, id, app, user_id, kind, subject, predicate, version, deleted, \
     create_time, update_time, create_request_id, create_fingerprint) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
);

static INSERT_FACT_VERSION: Sql = Sql::new(
    "INSERT INTO fact_versions (tenant, fact_id, version, deleted, subject, predicate, object, \
     content, confidence, source, source_episode_ids, channels, create_time) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9, $10, $11::jsonb, $12::jsonb, $13)",
);

static INSERT_FACT_SOURCE: Sql =
    Sql::new("INSERT INTO fact_sources (tenant, episode_id, fact_id) VALUES ($1, $2, $3)");

/// A rule, its watermark the cursor of the episode named ($10; 0 for none).
static INSERT_RULE: Sql = Sql::new(
    "INSERT INTO consolidation_rules (tenant, id, filter, every_n_episodes, cron, then_emits, \
     kind, confidence, enabled, watermark, episodes_promoted, create_time, last_run_time, \
     create_request_id, create_fingerprint) \
     VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, \
     coalesce((SELECT cursor FROM episodes WHERE tenant = $1 AND id = $10), 0), $11, $12, $13, \
     $14, $15)",
);

// ---- staging ----

pub(super) static STAGE: Sql = Sql::new(
    "INSERT INTO import_lines (tenant, import_id, line, body, create_time) \
     VALUES ($1, $2, $3, $4, $5)",
);

static STAGED: Sql = Sql::new(
    "SELECT line, body FROM import_lines WHERE tenant = $1 AND import_id = $2 AND line > $3 \
     ORDER BY line LIMIT $4",
);

/// An import's lines, and every line staged before $3 (imports that never
/// finished).
pub(super) static DISCARD: Sql =
    Sql::new("DELETE FROM import_lines WHERE tenant = $1 AND (import_id = $2 OR create_time < $3)");

/// Every tenant's lines staged before $1.
pub(super) static PRUNE_IMPORTS: Sql = Sql::new("DELETE FROM import_lines WHERE create_time < $1");

// ---- applying an import ----

/// What applying one record did.
enum Applied {
    Imported,
    Unchanged,
    /// Imported a fact whose versions follow as lines of their own: the
    /// current one (the number) must come before the import ends.
    FactAwaitingVersions(String, i64),
    /// Imported a session or one of its episodes: the session's count of
    /// episodes must match those it holds when the import ends.
    EpisodesToCount(String),
}

/// Applies every staged line of the import, in order, inside the caller's
/// transaction, and deletes them.
pub(super) async fn apply_in<C: Run>(
    conn: &mut C,
    tenant: &Tenant,
    import_id: &str,
) -> Result<ImportCounts> {
    if C::DIALECT == Dialect::Postgres {
        conn.exec(&ONE_IMPORT, params![tenant.as_str()]).await?;
        conn.exec(&TAKE_XID, &[]).await?;
    }
    let mut counts = ImportCounts::default();
    let mut awaiting = Vec::new();
    // Each session to count, with the first line that touched it.
    let mut to_count = std::collections::HashMap::new();
    let mut after = 0;
    loop {
        // Up to APPLY_PAGE lines and about 2 MiB of them: lines of large
        // values are not read back hundreds at a time.
        let staged = conn
            .all_weighed(
                &STAGED,
                params![tenant.as_str(), import_id, after, APPLY_PAGE],
                |row| {
                    Ok(Staged {
                        line: row.int(0)?,
                        body: row.text(1)?,
                    })
                },
            )
            .await?;
        let more = crate::paging::more(&staged, APPLY_PAGE);
        for Staged { line, body } in &staged {
            let record: Record = serde_json::from_str(body).map_err(Error::internal)?;
            let kind = record.kind();
            let applied = match apply(conn, tenant, *line, record).await {
                // Another writer stored the record's key after the read
                // that found it free (not another import: see ONE_IMPORT),
                // or holds it and waits for a key the import wrote before:
                // writers take keys in key order, and so does an import of
                // an export, but a file whose memory lines go in another
                // order takes them in its own, and Postgres breaks the
                // deadlock by failing one of the two (a group of sets runs
                // its writes again one by one).
                Err(err)
                    if crate::store::unique_violation(&err) || crate::store::conflicted(&err) =>
                {
                    return Err(Error::Conflict {
                        reason: Reason::SourceChanged,
                        message: format!(
                            "line {line}: the {kind} was written while the import ran; \
                             import again"
                        ),
                    });
                }
                applied => applied?,
            };
            let tally = match applied {
                Some(Applied::Imported) => &mut counts.imported,
                Some(Applied::FactAwaitingVersions(id, version)) => {
                    awaiting.push((*line, id, version));
                    &mut counts.imported
                }
                Some(Applied::EpisodesToCount(session)) => {
                    to_count.entry(session).or_insert(*line);
                    &mut counts.imported
                }
                Some(Applied::Unchanged) => &mut counts.unchanged,
                None => continue,
            };
            *tally.entry(kind.to_owned()).or_insert(0) += 1;
        }
        match staged.last() {
            Some(last) if more => after = last.line,
            _ => break,
        }
    }
    // A fact's line without versions is whole once its current version's
    // line has come; a file cut short must not leave a fact without one.
    for (line, id, version) in awaiting {
        let present = conn
            .first(
                &FACT_VERSION,
                params![tenant.as_str(), id.as_str(), version],
                |_| Ok(()),
            )
            .await?;
        if present.is_none() {
            return Err(refused(
                line,
                format!("fact {id:?}, whose current version {version} no line of the file holds"),
            ));
        }
    }
    // A session's episode count is what eviction and the statistics go
    // by: it must be the episodes the session holds once the file is in.
    // Checked in file order, so the refusal names the first line wrong.
    let mut to_count: Vec<(String, i64)> = to_count.into_iter().collect();
    to_count.sort_by_key(|(_, line)| *line);
    for (session, line) in to_count {
        let held = conn
            .first(
                &EPISODES_HELD,
                params![tenant.as_str(), session.as_str()],
                |row| Ok((row.int(0)?, row.int(1)?)),
            )
            .await?;
        if let Some((count, held)) = held
            && count != held
        {
            return Err(refused(
                line,
                format!(
                    "session {session:?} would hold {held} episodes, but its episode_count \
                     is {count}"
                ),
            ));
        }
    }
    conn.exec(
        &DISCARD,
        params![tenant.as_str(), import_id, DateTime::<Utc>::UNIX_EPOCH],
    )
    .await?;
    Ok(counts)
}

/// A staged line read back: its number and its canonical JSON.
struct Staged {
    line: i64,
    body: String,
}

impl crate::paging::Weigh for Staged {
    fn weight(&self) -> usize {
        self.body.len() + 16
    }
}

/// A stored record that differs from the file's.
fn differs(line: i64, what: String) -> Error {
    Error::AlreadyExists {
        reason: Reason::ImportConflict,
        message: format!("line {line}: {what} exists with different content"),
    }
}

fn refused(line: i64, why: String) -> Error {
    Error::FailedPrecondition {
        reason: Reason::ImportConflict,
        message: format!("line {line}: {why}"),
    }
}

/// Compares a stored record with the file's: unchanged when identical,
/// refused when different, `None` when nothing is stored.
fn compare<T: PartialEq>(
    stored: Option<T>,
    imported: &T,
    line: i64,
    what: impl FnOnce() -> String,
) -> Result<Option<Applied>> {
    match stored {
        None => Ok(None),
        Some(stored) if stored == *imported => Ok(Some(Applied::Unchanged)),
        Some(_) => Err(differs(line, what())),
    }
}

/// Applies one record; `None` for the header.
async fn apply(
    conn: &mut impl Run,
    tenant: &Tenant,
    line: i64,
    record: Record,
) -> Result<Option<Applied>> {
    let t = tenant.as_str();
    let applied = match record {
        Record::Header(_) | Record::End(_) => return Ok(None),
        Record::Execution(e) => {
            let stored = conn
                .first(
                    &EXECUTION,
                    params![t, e.execution_id.as_str()],
                    execution_row,
                )
                .await?;
            if let Some(done) = compare(stored, &e, line, || {
                format!("execution {:?}", e.execution_id)
            })? {
                return Ok(Some(done));
            }
            conn.exec(
                &INSERT_EXECUTION,
                params![
                    t,
                    e.execution_id.as_str(),
                    e.flow_id.as_str(),
                    e.flow_name.as_str(),
                    e.create_time
                ],
            )
            .await?;
            Applied::Imported
        }
        Record::MemoryVersion(v) => apply_version(conn, tenant, line, v).await?,
        Record::Session(s) => {
            let stored = conn
                .first(&SESSION, params![t, s.id.as_str()], session_row)
                .await?
                .map(|stored| as_told(stored, &s));
            if let Some(done) = compare(stored, &s, line, || format!("session {:?}", s.id))? {
                return Ok(Some(done));
            }
            let metadata = s.metadata.to_string();
            let (request_id, fingerprint) =
                request_free(conn, &SESSION_REQUEST_HELD, params![t], s.request()).await?;
            conn.exec(
                &INSERT_SESSION,
                params![
                    t,
                    s.id.as_str(),
                    s.app.as_str(),
                    s.user.as_str(),
                    metadata.as_str(),
                    s.create_time,
                    s.update_time,
                    s.end_time,
                    s.last_seq,
                    s.episode_count,
                    s.episodes_evicted,
                    request_id,
                    fingerprint.as_deref()
                ],
            )
            .await?;
            Applied::EpisodesToCount(s.id)
        }
        Record::Episode(e) => {
            let stored = conn
                .first(&EPISODE, params![t, e.id.as_str()], episode_row)
                .await?
                .map(|(_, stored)| stored);
            if let Some(done) = compare(stored, &e, line, || format!("episode {:?}", e.id))? {
                return Ok(Some(done));
            }
            let session = conn
                .first(&SESSION, params![t, e.session_id.as_str()], session_row)
                .await?;
            let Some(session) = session else {
                return Err(refused(
                    line,
                    format!(
                        "episode {:?} belongs to session {:?}, which is neither stored nor \
                         earlier in the file",
                        e.id, e.session_id
                    ),
                ));
            };
            // An append takes its session's owner and the next seq: an
            // episode of another owner, or past the session's last seq
            // (which the next append would be given again), is not one
            // the session could hold.
            if (e.app.as_str(), e.user.as_str()) != (session.app.as_str(), session.user.as_str()) {
                return Err(refused(
                    line,
                    format!(
                        "episode {:?} is of app {:?} and user {:?}, but its session {:?} is of \
                         app {:?} and user {:?}",
                        e.id, e.app, e.user, e.session_id, session.app, session.user
                    ),
                ));
            }
            if e.seq > session.last_seq {
                return Err(refused(
                    line,
                    format!(
                        "episode {:?} has seq {}, past the last seq {} of its session {:?}",
                        e.id, e.seq, session.last_seq, e.session_id
                    ),
                ));
            }
            let taken = conn
                .first(
                    &EPISODE_AT,
                    params![t, e.session_id.as_str(), e.seq],
                    |row| row.text(0),
                )
                .await?;
            if let Some(other) = taken {
                return Err(differs(
                    line,
                    format!(
                        "seq {} of session {:?} (episode {other:?})",
                        e.seq, e.session_id
                    ),
                ));
            }
            let content = e.content.to_string();
            let metadata = e.metadata.to_string();
            let fingerprint = records::unhex(&e.fingerprint);
            conn.exec(
                &INSERT_EPISODE,
                params![
                    t,
                    e.session_id.as_str(),
                    e.seq,
                    e.id.as_str(),
                    e.app.as_str(),
                    e.user.as_str(),
                    e.agent.as_str(),
                    e.episode_type.as_str(),
                    content.as_str(),
                    metadata.as_str(),
                    e.source_node.as_str(),
                    e.timestamp,
                    e.create_time,
                    fingerprint.as_slice()
                ],
            )
            .await?;
            Applied::EpisodesToCount(e.session_id)
        }
        Record::WorkingMemory(w) => {
            // A version 1 line holds its tasks and files: compare them too.
            let stored = match conn
                .first(&WORKING, params![t, w.session_id.as_str()], working_row)
                .await?
            {
                Some(head) if w.tasks.is_empty() && w.cache.is_empty() => Some(head),
                Some(head) => Some(working_of(conn, tenant, head).await?),
                None => None,
            };
            let what = || format!("working memory of session {:?}", w.session_id);
            if let Some(done) = compare(stored, &w, line, what)? {
                return Ok(Some(done));
            }
            let session = conn
                .first(&SESSION, params![t, w.session_id.as_str()], session_row)
                .await?;
            if session.is_none() {
                return Err(refused(
                    line,
                    format!(
                        "working memory of session {:?}, which is neither stored nor earlier \
                         in the file",
                        w.session_id
                    ),
                ));
            }
            let s = w.session_id.as_str();
            conn.exec(
                &INSERT_WORKING,
                params![t, s, w.goal.as_str(), w.next_task, w.update_time],
            )
            .await?;
            for task in &w.tasks {
                insert_task(conn, tenant, s, task).await?;
            }
            for cached in &w.cache {
                insert_cached(conn, tenant, s, cached).await?;
            }
            Applied::Imported
        }
        Record::Task(task) => {
            let s = task.session_id.as_str();
            let stored = conn
                .first(&TASK, params![t, s, task.number], task_row)
                .await?
                .map(|stored| as_told(stored, &task));
            let what = || format!("task {} of session {s:?}", task.number);
            if let Some(done) = compare(stored, &task, line, what)? {
                return Ok(Some(done));
            }
            let head = owned_by_working(conn, tenant, line, s, "a task").await?;
            // The next task created is numbered after `next_task`.
            if task.number > head.next_task {
                return Err(refused(
                    line,
                    format!(
                        "task {} of session {s:?}, past the last task number {} its working \
                         memory handed out",
                        task.number, head.next_task
                    ),
                ));
            }
            insert_task(conn, tenant, s, &task).await?;
            Applied::Imported
        }
        Record::CachedFile(cached) => {
            let s = cached.session_id.as_str();
            let stored = conn
                .first(&CACHED, params![t, s, cached.path.as_str()], cached_row)
                .await?;
            let what = || format!("cached file {:?} of session {s:?}", cached.path);
            if let Some(done) = compare(stored, &cached, line, what)? {
                return Ok(Some(done));
            }
            owned_by_working(conn, tenant, line, s, "a cached file").await?;
            insert_cached(conn, tenant, s, &cached).await?;
            Applied::Imported
        }
        Record::Fact(f) => {
            // A version 1 line holds its versions and sources: compare them
            // too.
            let stored = match conn
                .first(&FACT, params![t, f.id.as_str()], fact_row)
                .await?
            {
                Some(head) if f.versions.is_empty() && f.sources.is_empty() => Some(head),
                Some(head) if f.versions.is_empty() => Some(sources_of(conn, tenant, head).await?),
                Some(head) => Some(fact_of(conn, tenant, head).await?),
                None => None,
            }
            .map(|stored| as_told(stored, &f));
            if let Some(done) = compare(stored, &f, line, || format!("fact {:?}", f.id))? {
                return Ok(Some(done));
            }
            let kind = records::fact_kind("fact_kind", &f.fact_kind)?;
            let owner = params![t, f.app.as_str(), f.user.as_str(), kind.as_i16()];
            let (request_id, fingerprint) =
                request_free(conn, &FACT_REQUEST_HELD, owner, f.request()).await?;
            conn.exec(
                &INSERT_FACT,
                params![
                    t,
                    f.id.as_str(),
                    f.app.as_str(),
                    f.user.as_str(),
                    kind.as_i16(),
                    f.subject.as_str(),
                    f.predicate.as_str(),
                    f.version,
                    f.deleted,
                    f.create_time,
                    f.update_time,
                    request_id,
                    fingerprint.as_deref()
                ],
            )
            .await?;
            for v in &f.versions {
                insert_fact_version(conn, tenant, &f.id, v).await?;
            }
            for episode in &f.sources {
                conn.exec(
                    &INSERT_FACT_SOURCE,
                    params![t, episode.as_str(), f.id.as_str()],
                )
                .await?;
            }
            if f.versions.is_empty() {
                return Ok(Some(Applied::FactAwaitingVersions(f.id, f.version)));
            }
            Applied::Imported
        }
        Record::FactVersion(v) => {
            let id = v.fact_id.as_str();
            let stored = conn
                .first(&FACT_VERSION, params![t, id, v.version], fact_version_row)
                .await?;
            let what = || format!("version {} of fact {id:?}", v.version);
            if let Some(done) = compare(stored, &v, line, what)? {
                return Ok(Some(done));
            }
            let head = conn.first(&FACT, params![t, id], fact_row).await?;
            match head {
                None => {
                    return Err(refused(
                        line,
                        format!(
                            "a version of fact {id:?}, which is neither stored nor earlier in \
                             the file"
                        ),
                    ));
                }
                Some(head) if v.version > head.version => {
                    return Err(refused(
                        line,
                        format!(
                            "version {} of fact {id:?}, whose current version is {}",
                            v.version, head.version
                        ),
                    ));
                }
                Some(head) if v.version == head.version => current_agrees(line, &head, &v)?,
                Some(_) => {}
            }
            insert_fact_version(conn, tenant, id, &v).await?;
            Applied::Imported
        }
        Record::FactSource(source) => {
            let (id, episode) = (source.fact_id.as_str(), source.episode_id.as_str());
            let stored = conn
                .first(&FACT_SOURCE, params![t, id, episode], |_| Ok(()))
                .await?;
            if stored.is_some() {
                return Ok(Some(Applied::Unchanged));
            }
            if conn.first(&FACT, params![t, id], fact_row).await?.is_none() {
                return Err(refused(
                    line,
                    format!(
                        "a source of fact {id:?}, which is neither stored nor earlier in the file"
                    ),
                ));
            }
            conn.exec(&INSERT_FACT_SOURCE, params![t, episode, id])
                .await?;
            Applied::Imported
        }
        Record::Rule(r) => {
            let stored = match conn
                .first(&RULE, params![t, r.id.as_str()], rule_row)
                .await?
            {
                Some((rule, watermark)) => Some(rule_of(conn, tenant, rule, watermark).await?),
                None => None,
            }
            .map(|stored| as_told(stored, &r));
            if let Some(done) = compare(stored, &r, line, || format!("rule {:?}", r.id))? {
                return Ok(Some(done));
            }
            let kind = records::fact_kind("fact_kind", &r.fact_kind)?;
            let then_emits = serde_json::to_string(&r.then_emits).map_err(Error::internal)?;
            let (request_id, fingerprint) =
                request_free(conn, &RULE_REQUEST_HELD, params![t], r.request()).await?;
            conn.exec(
                &INSERT_RULE,
                params![
                    t,
                    r.id.as_str(),
                    r.filter.as_str(),
                    r.every_n_episodes,
                    r.cron.as_deref(),
                    then_emits.as_str(),
                    kind.as_i16(),
                    r.confidence,
                    r.enabled,
                    r.watermark_episode.as_deref().unwrap_or(""),
                    r.episodes_promoted,
                    r.create_time,
                    r.last_run_time,
                    request_id,
                    fingerprint.as_deref()
                ],
            )
            .await?;
            Applied::Imported
        }
    };
    Ok(Some(applied))
}

/// The working memory an item belongs to; refuses an item whose working
/// memory is neither stored nor earlier in the file.
async fn owned_by_working(
    conn: &mut impl Run,
    tenant: &Tenant,
    line: i64,
    session: &str,
    what: &str,
) -> Result<records::WorkingMemory> {
    let head = conn
        .first(&WORKING, params![tenant.as_str(), session], working_row)
        .await?;
    match head {
        Some(head) => Ok(head),
        None => Err(refused(
            line,
            format!(
                "{what} of the working memory of session {session:?}, which is neither stored \
                 nor earlier in the file"
            ),
        )),
    }
}

/// Refuses a fact's current version that contradicts the fact's own line
/// ([`records::Fact::disagreement`]).
fn current_agrees(line: i64, fact: &records::Fact, current: &records::FactVersion) -> Result<()> {
    let Some(field) = fact.disagreement(current) else {
        return Ok(());
    };
    Err(refused(
        line,
        format!(
            "version {} of fact {:?} is its current version, and its {field} differs from the \
             fact's",
            current.version, fact.id
        ),
    ))
}

async fn insert_task(
    conn: &mut impl Run,
    tenant: &Tenant,
    session: &str,
    task: &records::Task,
) -> Result<()> {
    let status = crate::working::TaskStatus::parse("status", &task.status)?;
    let held_in = params![tenant.as_str(), session];
    let (request_id, fingerprint) =
        request_free(conn, &TASK_REQUEST_HELD, held_in, task.request()).await?;
    conn.exec(
        &INSERT_TASK,
        params![
            tenant.as_str(),
            session,
            task.number,
            task.subject.as_str(),
            task.description.as_str(),
            status.as_i16(),
            task.create_time,
            task.update_time,
            request_id,
            fingerprint.as_deref()
        ],
    )
    .await?;
    Ok(())
}

/// A record a creation made, which may have kept its request.
trait Created {
    fn request(&self) -> Option<&records::CreatedBy>;
    fn request_mut(&mut self) -> &mut Option<records::CreatedBy>;
}

macro_rules! created {
    ($($record:ty),*) => {$(
        impl Created for $record {
            fn request(&self) -> Option<&records::CreatedBy> {
                self.request.as_ref()
            }
            fn request_mut(&mut self) -> &mut Option<records::CreatedBy> {
                &mut self.request
            }
        }
    )*};
}

created!(
    records::Session,
    records::Task,
    records::Fact,
    records::Rule
);

/// A stored record as the file can tell of it: a request on one side only
/// (a file before version 4, or a creation made unkeyed, or imported from
/// such a file) is nothing the two disagree on.
fn as_told<T: Created>(mut stored: T, imported: &T) -> T {
    if stored.request().is_none() || imported.request().is_none() {
        *stored.request_mut() = imported.request().cloned();
    }
    stored
}

/// The request an imported record keeps: the file's, unless its id is
/// held already where it must be unique (`held`, with `at` the parameters
/// before the id), where the store's own answers a repeat of it.
async fn request_free<'r>(
    conn: &mut impl Run,
    held: &'static Sql,
    at: &[crate::store::sql::Param<'_>],
    request: Option<&'r records::CreatedBy>,
) -> Result<(Option<&'r str>, Option<Vec<u8>>)> {
    let Some(request) = request else {
        return Ok((None, None));
    };
    let id = request.request_id.as_str();
    let taken = conn
        .first(held, &[at, params![id]].concat(), |_| Ok(()))
        .await?
        .is_some();
    Ok(match taken {
        true => (None, None),
        false => (Some(id), Some(records::unhex(&request.fingerprint))),
    })
}

async fn insert_cached(
    conn: &mut impl Run,
    tenant: &Tenant,
    session: &str,
    cached: &records::Cached,
) -> Result<()> {
    conn.exec(
        &INSERT_CACHE,
        params![
            tenant.as_str(),
            session,
            cached.path.as_str(),
            cached.content.as_str(),
            cached.bytes,
            cached.update_time
        ],
    )
    .await?;
    Ok(())
}

async fn insert_fact_version(
    conn: &mut impl Run,
    tenant: &Tenant,
    fact: &str,
    v: &records::FactVersion,
) -> Result<()> {
    let content = v.content.to_string();
    let sources = v.source_episode_ids.to_string();
    let channels = v.channels.to_string();
    conn.exec(
        &INSERT_FACT_VERSION,
        params![
            tenant.as_str(),
            fact,
            v.version,
            v.deleted,
            v.subject.as_str(),
            v.predicate.as_str(),
            v.object.as_str(),
            content.as_str(),
            v.confidence,
            v.source.as_str(),
            sources.as_str(),
            channels.as_str(),
            v.create_time
        ],
    )
    .await?;
    Ok(())
}

/// Applies a memory version: unchanged when stored (or purged here since),
/// written when it follows the key's head, refused when it would leave a
/// gap.
async fn apply_version(
    conn: &mut impl Run,
    tenant: &Tenant,
    line: i64,
    v: MemoryVersion,
) -> Result<Applied> {
    let t = tenant.as_str();
    let scope_type = v.scope_type()?.as_i16();
    let at = params![t, scope_type, v.scope.as_str(), v.key.as_str()];
    let head = conn.first(&HEAD, at, |row| row.int(0)).await?;
    let what = || {
        format!(
            "version {} of key {:?} in scope {:?}",
            v.version, v.key, v.scope
        )
    };
    if let Some(head) = head
        && v.version <= head
    {
        let stored = conn
            .first(
                &MEMORY_VERSION,
                params![t, scope_type, v.scope.as_str(), v.key.as_str(), v.version],
                memory_row,
            )
            .await?;
        // A version missing below the head was purged here: the store has
        // moved past it, so it is left out rather than put back.
        return Ok(compare(stored, &v, line, what)?.unwrap_or(Applied::Unchanged));
    }
    if let Some(head) = head
        && v.version != head + 1
    {
        return Err(refused(
            line,
            format!(
                "{} would follow the stored version {head}: a key's versions must follow \
                 without a gap",
                what()
            ),
        ));
    }
    let moved = match head {
        None => {
            conn.exec(
                &INSERT_HEAD,
                params![
                    t,
                    scope_type,
                    v.scope.as_str(),
                    v.key.as_str(),
                    v.version,
                    v.deleted,
                    v.create_time
                ],
            )
            .await?
        }
        Some(head) => {
            conn.exec(
                &MOVE_HEAD,
                params![
                    t,
                    scope_type,
                    v.scope.as_str(),
                    v.key.as_str(),
                    v.version,
                    v.deleted,
                    v.create_time,
                    head
                ],
            )
            .await?
        }
    };
    if moved != 1 {
        return Err(Error::Conflict {
            reason: Reason::SourceChanged,
            message: format!(
                "line {line}: key {:?} in scope {:?} was written while the import ran; \
                 import again",
                v.key, v.scope
            ),
        });
    }
    let kind = if v.deleted {
        ChangeKind::Delete
    } else {
        ChangeKind::Set
    }
    .as_i16();
    let revision = conn
        .first(
            &INSERT_CHANGE,
            params![
                t,
                scope_type,
                v.scope.as_str(),
                v.key.as_str(),
                kind,
                v.version,
                v.create_time
            ],
            |row| row.int(0),
        )
        .await?
        .ok_or_else(|| Error::internal("a change without its revision"))?;
    let value = (!v.deleted).then(|| v.value.to_string());
    conn.exec(
        &INSERT_VERSION,
        params![
            t,
            scope_type,
            v.scope.as_str(),
            v.key.as_str(),
            v.version,
            value.as_deref(),
            v.deleted,
            v.execution_id.as_str(),
            v.flow_id.as_str(),
            v.flow_name.as_str(),
            v.create_time,
            revision
        ],
    )
    .await?;
    Ok(Applied::Imported)
}
