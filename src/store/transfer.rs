//! Export and import on both backends, one statement text each.
//!
//! An export reads one part of the tenant at a time ([`Part`]), a page at
//! a time, in an order that does not depend on server-assigned numbers
//! except where the numbers are the order (episodes, by cursor). Every
//! export statement takes the same six selection parameters: $1 tenant,
//! $2 scope type (0 for none), $3 scope, $4 session id, $5 app, $6 user,
//! and then its page position.
//!
//! An import stages checked lines in `import_lines` (short transactions,
//! while the client streams), then applies them in one transaction that
//! issues revisions and cursors as it goes and deletes the staged lines;
//! see migration 0012 for why.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::memory::MemoryWrites;
use super::sql::{Backend, Cols, Dialect, Run, Sql, Transaction, params, select};
use crate::context::Tenant;
use crate::data::records::{
    self, Cached, Episode, Execution, Fact, FactVersion, MemoryVersion, Record, Rule, Session,
    Task, WorkingMemory,
};
use crate::data::{After, DataStore, ExportPage, ImportCounts, Part, Selection};
use crate::error::{Error, Reason, Result};
use crate::memory::{ChangeKind, ScopeType};
use crate::ports::{Feed, Feeds};

/// Rows of a part read per page.
const PAGE: i64 = 500;

/// Staged lines read back per page while applying.
const APPLY_PAGE: i64 = 500;

// ---- what a selection chooses, for `concat!` (parameters $1..$6) ----

macro_rules! whole_tenant {
    () => {
        "($2 = 0 AND $4 = '' AND $5 = '')"
    };
}

macro_rules! user_sessions {
    () => {
        "(SELECT id FROM sessions WHERE tenant = $1 AND app = $5 AND user_id = $6)"
    };
}

/// Memory of the chosen scope, the session's execution scope or the
/// user's sessions' execution scopes.
macro_rules! chosen_memory {
    () => {
        concat!(
            "(",
            whole_tenant!(),
            " OR (scope_type = $2 AND scope = $3) OR (scope_type = 3 AND scope = $4) \
             OR ($5 <> '' AND scope_type = 3 AND scope IN ",
            user_sessions!(),
            "))"
        )
    };
}

macro_rules! chosen_executions {
    () => {
        concat!(
            "(",
            whole_tenant!(),
            " OR ($2 = 3 AND execution_id = $3) OR execution_id = $4 \
             OR ($5 <> '' AND execution_id IN ",
            user_sessions!(),
            "))"
        )
    };
}

/// Rows of sessions (`id`) or episodes (`session_id`) with their owner.
macro_rules! chosen_sessions {
    ($id:literal) => {
        concat!(
            "($2 = 0 AND length($3) >= 0 AND (($4 = '' AND $5 = '') OR ",
            $id,
            " = $4 OR (app = $5 AND user_id = $6)))"
        )
    };
}

macro_rules! chosen_working {
    () => {
        concat!(
            "($2 = 0 AND length($3) >= 0 AND (($4 = '' AND $5 = '') OR session_id = $4 \
             OR ($5 <> '' AND session_id IN ",
            user_sessions!(),
            ")))"
        )
    };
}

macro_rules! chosen_facts {
    () => {
        "($2 = 0 AND length($3) >= 0 AND $4 = '' AND ($5 = '' OR (app = $5 AND user_id = $6)))"
    };
}

macro_rules! chosen_rules {
    () => {
        "($2 = 0 AND length($3) >= 0 AND $4 = '' AND $5 = '' AND length($6) >= 0)"
    };
}

// ---- the columns each record is read from, for `concat!` ----

macro_rules! execution_columns {
    () => {
        "execution_id, flow_id, flow_name, create_time"
    };
}

macro_rules! memory_columns {
    () => {
        "scope_type, scope, key, version, value::text, deleted, execution_id, flow_id, \
         flow_name, create_time"
    };
}

macro_rules! session_columns {
    () => {
        "id, app, user_id, metadata::text, create_time, update_time, end_time, last_seq, \
         episode_count, episodes_evicted"
    };
}

macro_rules! episode_columns {
    () => {
        "session_id, seq, id, app, user_id, agent, type, content::text, metadata::text, \
         source_node, timestamp, create_time, fingerprint, cursor"
    };
}

macro_rules! working_columns {
    () => {
        "session_id, goal, next_task, update_time"
    };
}

macro_rules! fact_columns {
    () => {
        "id, app, user_id, kind, subject, predicate, version, deleted, create_time, update_time"
    };
}

macro_rules! rule_columns {
    () => {
        "id, filter, every_n_episodes, cron, then_emits::text, kind, confidence, enabled, \
         watermark, episodes_promoted, create_time, last_run_time"
    };
}

// ---- export pages ----

static EXPORT_EXECUTIONS: Sql = Sql::new(concat!(
    "SELECT ",
    execution_columns!(),
    " FROM memory_executions WHERE tenant = $1 AND ",
    chosen_executions!(),
    " AND execution_id > $7 ORDER BY execution_id LIMIT $8"
));

static EXPORT_MEMORY: Sql = Sql::new(concat!(
    "SELECT ",
    memory_columns!(),
    " FROM memory_versions WHERE tenant = $1 AND ",
    chosen_memory!(),
    " AND (tenant, scope_type, scope, key, version) > ($1, $7, $8, $9, $10) \
     ORDER BY scope_type, scope, key, version LIMIT $11"
));

static EXPORT_SESSIONS: Sql = Sql::new(concat!(
    "SELECT ",
    session_columns!(),
    " FROM sessions WHERE tenant = $1 AND ",
    chosen_sessions!("id"),
    " AND id > $7 ORDER BY id LIMIT $8"
));

static EXPORT_EPISODES: Sql = Sql::new(concat!(
    "SELECT ",
    episode_columns!(),
    " FROM episodes WHERE tenant = $1 AND ",
    chosen_sessions!("session_id"),
    " AND cursor > $7 ORDER BY cursor LIMIT $8"
));

static EXPORT_WORKING: Sql = Sql::new(concat!(
    "SELECT ",
    working_columns!(),
    " FROM working_memory WHERE tenant = $1 AND ",
    chosen_working!(),
    " AND session_id > $7 ORDER BY session_id LIMIT $8"
));

static EXPORT_FACTS: Sql = Sql::new(concat!(
    "SELECT ",
    fact_columns!(),
    " FROM facts WHERE tenant = $1 AND ",
    chosen_facts!(),
    " AND id > $7 ORDER BY id LIMIT $8"
));

static EXPORT_RULES: Sql = Sql::new(concat!(
    "SELECT ",
    rule_columns!(),
    " FROM consolidation_rules WHERE tenant = $1 AND ",
    chosen_rules!(),
    " AND id > $7 ORDER BY id LIMIT $8"
));

static TASKS: Sql = Sql::new(
    "SELECT number, subject, description, status, create_time, update_time FROM working_tasks \
     WHERE tenant = $1 AND session_id = $2 ORDER BY number",
);

static CACHE: Sql = Sql::new(
    "SELECT path, content, bytes, update_time FROM working_cache \
     WHERE tenant = $1 AND session_id = $2 ORDER BY path",
);

static FACT_VERSIONS: Sql = Sql::new(
    "SELECT version, deleted, subject, predicate, object, content::text, confidence, source, \
     source_episode_ids::text, channels::text, create_time FROM fact_versions \
     WHERE tenant = $1 AND fact_id = $2 ORDER BY version",
);

static FACT_SOURCES: Sql = Sql::new(
    "SELECT episode_id FROM fact_sources WHERE tenant = $1 AND fact_id = $2 ORDER BY episode_id",
);

/// The newest episode at or below a watermark.
static WATERMARK_EPISODE: Sql = Sql::new(
    "SELECT id FROM episodes WHERE tenant = $1 AND cursor <= $2 ORDER BY cursor DESC LIMIT 1",
);

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

static WORKING: Sql = select!(
    working_columns!(),
    " FROM working_memory WHERE tenant = $1 AND session_id = $2"
);

static FACT: Sql = select!(fact_columns!(), " FROM facts WHERE tenant = $1 AND id = $2");

static RULE: Sql = select!(
    rule_columns!(),
    " FROM consolidation_rules WHERE tenant = $1 AND id = $2"
);

// ---- the import's writes ----

/// Gives the Postgres transaction its id before it takes a revision or a
/// cursor (see migration 0003).
static TAKE_XID: Sql = Sql::new("SELECT pg_current_xact_id()");

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
     end_time, last_seq, episode_count, episodes_evicted) \
     VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, $11)",
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
     create_time, update_time) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
);

static INSERT_CACHE: Sql = Sql::new(
    "INSERT INTO working_cache (tenant, session_id, path, content, bytes, update_time) \
     VALUES ($1, $2, $3, $4, $5, $6)",
);

static INSERT_FACT: Sql = Sql::new(
    "INSERT INTO facts (tenant, id, app, user_id, kind, subject, predicate, version, deleted, \
     create_time, update_time) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
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
     kind, confidence, enabled, watermark, episodes_promoted, create_time, last_run_time) \
     VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, \
     coalesce((SELECT cursor FROM episodes WHERE tenant = $1 AND id = $10), 0), $11, $12, $13)",
);

// ---- staging ----

static STAGE: Sql = Sql::new(
    "INSERT INTO import_lines (tenant, import_id, line, body, create_time) \
     VALUES ($1, $2, $3, $4, $5)",
);

static STAGED: Sql = Sql::new(
    "SELECT line, body FROM import_lines WHERE tenant = $1 AND import_id = $2 AND line > $3 \
     ORDER BY line LIMIT $4",
);

/// An import's lines, and every line staged before $3 (imports that never
/// finished).
static DISCARD: Sql =
    Sql::new("DELETE FROM import_lines WHERE tenant = $1 AND (import_id = $2 OR create_time < $3)");

/// Every tenant's lines staged before $1.
static PRUNE_IMPORTS: Sql = Sql::new("DELETE FROM import_lines WHERE create_time < $1");

impl<B: Backend + MemoryWrites + Feeds> DataStore for B {
    async fn forget_user(
        &self,
        tenant: &Tenant,
        forget: &crate::data::Forgetting,
        record: crate::memory::audit::AuditRecord,
    ) -> Result<crate::data::ForgetCounts> {
        self.forget_with_record(tenant, forget, record).await
    }

    async fn export_page(
        &self,
        tenant: &Tenant,
        selection: &Selection,
        part: Part,
        after: &After,
    ) -> Result<ExportPage> {
        let mut conn = self.reader(tenant).await?;
        export_page(&mut conn, tenant, selection, part, after).await
    }

    async fn stage_import(
        &self,
        tenant: &Tenant,
        import_id: &str,
        lines: &[(i64, String)],
        now: DateTime<Utc>,
    ) -> Result<()> {
        let mut tx = self.begin(tenant).await?;
        for (line, body) in lines {
            tx.exec(
                &STAGE,
                params![tenant.as_str(), import_id, *line, body.as_str(), now],
            )
            .await?;
        }
        tx.commit().await
    }

    async fn apply_import(&self, tenant: &Tenant, import_id: &str) -> Result<ImportCounts> {
        let mut tx = self.begin(tenant).await?;
        let counts = apply_in(&mut tx, tenant, import_id).await?;
        tx.commit().await?;
        // Wakes this store's feeds now rather than at their next poll.
        self.settled(Feed::Changes).await?;
        self.settled(Feed::Episodes).await?;
        Ok(counts)
    }

    async fn discard_import(
        &self,
        tenant: &Tenant,
        import_id: &str,
        stale_before: DateTime<Utc>,
    ) -> Result<()> {
        let mut conn = self.writer(tenant).await?;
        conn.exec(&DISCARD, params![tenant.as_str(), import_id, stale_before])
            .await?;
        Ok(())
    }

    async fn prune_imports(&self, before: DateTime<Utc>) -> Result<u64> {
        let mut conn = self.system_writer().await?;
        conn.exec(&PRUNE_IMPORTS, params![before]).await
    }
}

/// The selection as the six parameters every export statement takes.
fn selection_params<'a>(
    tenant: &'a Tenant,
    selection: &'a Selection,
) -> [super::sql::Param<'a>; 6] {
    use super::sql::Param;
    let (scope_type, scope, session, app, user) = match selection {
        Selection::Tenant => (0, "", "", "", ""),
        Selection::Scope(scope) => (scope.scope_type.as_i16(), scope.name.as_str(), "", "", ""),
        Selection::Session(id) => (0, "", id.as_str(), "", ""),
        Selection::User { app, user } => (0, "", "", app.as_str(), user.as_str()),
    };
    [
        Param::Text(tenant.as_str()),
        Param::Small(scope_type),
        Param::Text(scope),
        Param::Text(session),
        Param::Text(app),
        Param::Text(user),
    ]
}

/// One page of a part, and where the next one starts (none after the last).
async fn export_page(
    conn: &mut impl Run,
    tenant: &Tenant,
    selection: &Selection,
    part: Part,
    after: &After,
) -> Result<ExportPage> {
    let chosen = selection_params(tenant, selection);
    let id_after = match after {
        After::Id(id) => id.as_str(),
        _ => "",
    };
    let at_id: &[super::sql::Param<'_>] = params![id_after, PAGE];
    let with_id = [&chosen[..], at_id].concat();
    let (records, next) = match part {
        Part::Executions => {
            let rows = conn
                .all(&EXPORT_EXECUTIONS, &with_id, execution_row)
                .await?;
            let next = rows.last().map(|e| After::Id(e.execution_id.clone()));
            (rows.into_iter().map(Record::Execution).collect(), next)
        }
        Part::Memory => {
            let (scope_type, scope, key, version) = match after {
                After::Key {
                    scope_type,
                    scope,
                    key,
                    version,
                } => (*scope_type, scope.as_str(), key.as_str(), *version),
                _ => (0, "", "", 0),
            };
            let at: &[super::sql::Param<'_>] = params![scope_type, scope, key, version, PAGE];
            let rows = conn
                .all(&EXPORT_MEMORY, &[&chosen[..], at].concat(), |row| {
                    Ok((row.small(0)?, memory_row(row)?))
                })
                .await?;
            let next = rows.last().map(|(scope_type, v)| After::Key {
                scope_type: *scope_type,
                scope: v.scope.clone(),
                key: v.key.clone(),
                version: v.version,
            });
            let records = rows.into_iter().map(|(_, v)| Record::MemoryVersion(v));
            (records.collect(), next)
        }
        Part::Sessions => {
            let rows = conn.all(&EXPORT_SESSIONS, &with_id, session_row).await?;
            let next = rows.last().map(|s| After::Id(s.id.clone()));
            (rows.into_iter().map(Record::Session).collect(), next)
        }
        Part::Episodes => {
            let cursor = match after {
                After::Cursor(cursor) => *cursor,
                _ => 0,
            };
            let at: &[super::sql::Param<'_>] = params![cursor, PAGE];
            let rows = conn
                .all(&EXPORT_EPISODES, &[&chosen[..], at].concat(), episode_row)
                .await?;
            let next = rows.last().map(|(cursor, _)| After::Cursor(*cursor));
            let records = rows.into_iter().map(|(_, e)| Record::Episode(e));
            (records.collect(), next)
        }
        Part::Working => {
            let heads = conn.all(&EXPORT_WORKING, &with_id, working_row).await?;
            let next = heads.last().map(|w| After::Id(w.session_id.clone()));
            let mut records = Vec::with_capacity(heads.len());
            for head in heads {
                records.push(Record::WorkingMemory(working_of(conn, tenant, head).await?));
            }
            (records, next)
        }
        Part::Facts => {
            let heads = conn.all(&EXPORT_FACTS, &with_id, fact_row).await?;
            let next = heads.last().map(|f| After::Id(f.id.clone()));
            let mut records = Vec::with_capacity(heads.len());
            for head in heads {
                records.push(Record::Fact(fact_of(conn, tenant, head).await?));
            }
            (records, next)
        }
        Part::Rules => {
            let rows = conn.all(&EXPORT_RULES, &with_id, rule_row).await?;
            let next = rows.last().map(|(r, _)| After::Id(r.id.clone()));
            let mut records = Vec::with_capacity(rows.len());
            for (rule, watermark) in rows {
                records.push(Record::Rule(rule_of(conn, tenant, rule, watermark).await?));
            }
            (records, next)
        }
    };
    let full = records.len() as i64 == PAGE;
    Ok(ExportPage {
        records,
        next: next.filter(|_| full),
    })
}

// ---- rows to records ----

fn json(text: String) -> Result<Value> {
    serde_json::from_str(&text).map_err(Error::internal)
}

fn execution_row(row: &impl Cols) -> Result<Execution> {
    Ok(Execution {
        execution_id: row.text(0)?,
        flow_id: row.text(1)?,
        flow_name: row.text(2)?,
        create_time: row.time(3)?,
    })
}

fn memory_row(row: &impl Cols) -> Result<MemoryVersion> {
    let scope_type = ScopeType::from_i32(row.small(0)?.into())
        .ok_or_else(|| Error::internal("stored scope type out of range"))?;
    Ok(MemoryVersion {
        scope_type: scope_type.as_str().to_owned(),
        scope: row.text(1)?,
        key: row.text(2)?,
        version: row.int(3)?,
        value: row
            .opt_text(4)?
            .map(json)
            .transpose()?
            .unwrap_or(Value::Null),
        deleted: row.boolean(5)?,
        execution_id: row.text(6)?,
        flow_id: row.text(7)?,
        flow_name: row.text(8)?,
        create_time: row.time(9)?,
    })
}

fn session_row(row: &impl Cols) -> Result<Session> {
    Ok(Session {
        id: row.text(0)?,
        app: row.text(1)?,
        user: row.text(2)?,
        metadata: json(row.text(3)?)?,
        create_time: row.time(4)?,
        update_time: row.time(5)?,
        end_time: row.opt_time(6)?,
        last_seq: row.int(7)?,
        episode_count: row.int(8)?,
        episodes_evicted: row.int(9)?,
    })
}

/// An episode and its cursor.
fn episode_row(row: &impl Cols) -> Result<(i64, Episode)> {
    Ok((
        row.int(13)?,
        Episode {
            session_id: row.text(0)?,
            seq: row.int(1)?,
            id: row.text(2)?,
            app: row.text(3)?,
            user: row.text(4)?,
            agent: row.text(5)?,
            episode_type: row.text(6)?,
            content: json(row.text(7)?)?,
            metadata: json(row.text(8)?)?,
            source_node: row.text(9)?,
            timestamp: row.time(10)?,
            create_time: row.time(11)?,
            fingerprint: records::to_hex(&row.bytes(12)?),
        },
    ))
}

/// Working memory without its tasks and cache, which [`working_of`] adds.
fn working_row(row: &impl Cols) -> Result<WorkingMemory> {
    Ok(WorkingMemory {
        session_id: row.text(0)?,
        goal: row.text(1)?,
        next_task: row.int(2)?,
        update_time: row.time(3)?,
        tasks: Vec::new(),
        cache: Vec::new(),
    })
}

async fn working_of(
    conn: &mut impl Run,
    tenant: &Tenant,
    mut working: WorkingMemory,
) -> Result<WorkingMemory> {
    let at = params![tenant.as_str(), working.session_id.as_str()];
    working.tasks = conn
        .all(&TASKS, at, |row| {
            let status = crate::working::TaskStatus::from_i16(row.small(3)?)
                .ok_or_else(|| Error::internal("stored task status out of range"))?;
            Ok(Task {
                number: row.int(0)?,
                subject: row.text(1)?,
                description: row.text(2)?,
                status: status.name().to_owned(),
                create_time: row.time(4)?,
                update_time: row.time(5)?,
            })
        })
        .await?;
    working.cache = conn
        .all(&CACHE, at, |row| {
            Ok(Cached {
                path: row.text(0)?,
                content: row.text(1)?,
                bytes: row.int(2)?,
                update_time: row.time(3)?,
            })
        })
        .await?;
    Ok(working)
}

/// A fact without its versions and sources, which [`fact_of`] adds.
fn fact_row(row: &impl Cols) -> Result<Fact> {
    let kind = crate::consolidation::FactKind::from_i16(row.small(3)?)
        .ok_or_else(|| Error::internal("stored fact kind out of range"))?;
    Ok(Fact {
        id: row.text(0)?,
        app: row.text(1)?,
        user: row.text(2)?,
        fact_kind: records::fact_kind_name(kind).to_owned(),
        subject: row.text(4)?,
        predicate: row.text(5)?,
        version: row.int(6)?,
        deleted: row.boolean(7)?,
        create_time: row.time(8)?,
        update_time: row.time(9)?,
        versions: Vec::new(),
        sources: Vec::new(),
    })
}

async fn fact_of(conn: &mut impl Run, tenant: &Tenant, mut fact: Fact) -> Result<Fact> {
    let at = params![tenant.as_str(), fact.id.as_str()];
    fact.versions = conn
        .all(&FACT_VERSIONS, at, |row| {
            Ok(FactVersion {
                version: row.int(0)?,
                deleted: row.boolean(1)?,
                subject: row.text(2)?,
                predicate: row.text(3)?,
                object: row.text(4)?,
                content: json(row.text(5)?)?,
                confidence: row.float(6)?,
                source: row.text(7)?,
                source_episode_ids: json(row.text(8)?)?,
                channels: json(row.text(9)?)?,
                create_time: row.time(10)?,
            })
        })
        .await?;
    fact.sources = conn.all(&FACT_SOURCES, at, |row| row.text(0)).await?;
    Ok(fact)
}

/// A rule and its watermark (a cursor), which [`rule_of`] names by episode.
fn rule_row(row: &impl Cols) -> Result<(Rule, i64)> {
    let kind = crate::consolidation::FactKind::from_i16(row.small(5)?)
        .ok_or_else(|| Error::internal("stored fact kind out of range"))?;
    let then_emits: Vec<String> = serde_json::from_str(&row.text(4)?).map_err(Error::internal)?;
    Ok((
        Rule {
            id: row.text(0)?,
            filter: row.text(1)?,
            every_n_episodes: row.opt_int(2)?,
            cron: row.opt_text(3)?,
            then_emits,
            fact_kind: records::fact_kind_name(kind).to_owned(),
            confidence: row.float(6)?,
            enabled: row.boolean(7)?,
            watermark_episode: None,
            episodes_promoted: row.int(9)?,
            create_time: row.time(10)?,
            last_run_time: row.opt_time(11)?,
        },
        row.int(8)?,
    ))
}

async fn rule_of(
    conn: &mut impl Run,
    tenant: &Tenant,
    mut rule: Rule,
    watermark: i64,
) -> Result<Rule> {
    if watermark > 0 {
        rule.watermark_episode = conn
            .first(
                &WATERMARK_EPISODE,
                params![tenant.as_str(), watermark],
                |row| row.text(0),
            )
            .await?;
    }
    Ok(rule)
}

// ---- applying an import ----

/// What applying one record did.
enum Applied {
    Imported,
    Unchanged,
}

/// Applies every staged line of the import, in order, inside the caller's
/// transaction, and deletes them.
async fn apply_in<C: Run>(conn: &mut C, tenant: &Tenant, import_id: &str) -> Result<ImportCounts> {
    if C::DIALECT == Dialect::Postgres {
        conn.exec(&TAKE_XID, &[]).await?;
    }
    let mut counts = ImportCounts::default();
    let mut after = 0;
    loop {
        let staged = conn
            .all(
                &STAGED,
                params![tenant.as_str(), import_id, after, APPLY_PAGE],
                |row| Ok((row.int(0)?, row.text(1)?)),
            )
            .await?;
        for (line, body) in &staged {
            let record: Record = serde_json::from_str(body).map_err(Error::internal)?;
            let kind = record.kind();
            let tally = match apply(conn, tenant, *line, record).await? {
                Some(Applied::Imported) => &mut counts.imported,
                Some(Applied::Unchanged) => &mut counts.unchanged,
                None => continue,
            };
            *tally.entry(kind.to_owned()).or_insert(0) += 1;
        }
        match staged.last() {
            Some((line, _)) if staged.len() as i64 == APPLY_PAGE => after = *line,
            _ => break,
        }
    }
    conn.exec(
        &DISCARD,
        params![tenant.as_str(), import_id, DateTime::<Utc>::UNIX_EPOCH],
    )
    .await?;
    Ok(counts)
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
        Record::Header(_) => return Ok(None),
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
                .await?;
            if let Some(done) = compare(stored, &s, line, || format!("session {:?}", s.id))? {
                return Ok(Some(done));
            }
            let metadata = s.metadata.to_string();
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
                    s.episodes_evicted
                ],
            )
            .await?;
            Applied::Imported
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
            if session.is_none() {
                return Err(refused(
                    line,
                    format!(
                        "episode {:?} belongs to session {:?}, which is neither stored nor \
                         earlier in the file",
                        e.id, e.session_id
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
            Applied::Imported
        }
        Record::WorkingMemory(w) => {
            let stored = match conn
                .first(&WORKING, params![t, w.session_id.as_str()], working_row)
                .await?
            {
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
            for (n, task) in w.tasks.iter().enumerate() {
                let status =
                    crate::working::TaskStatus::parse(&format!("tasks[{n}].status"), &task.status)?;
                conn.exec(
                    &INSERT_TASK,
                    params![
                        t,
                        s,
                        task.number,
                        task.subject.as_str(),
                        task.description.as_str(),
                        status.as_i16(),
                        task.create_time,
                        task.update_time
                    ],
                )
                .await?;
            }
            for cached in &w.cache {
                conn.exec(
                    &INSERT_CACHE,
                    params![
                        t,
                        s,
                        cached.path.as_str(),
                        cached.content.as_str(),
                        cached.bytes,
                        cached.update_time
                    ],
                )
                .await?;
            }
            Applied::Imported
        }
        Record::Fact(f) => {
            let stored = match conn
                .first(&FACT, params![t, f.id.as_str()], fact_row)
                .await?
            {
                Some(head) => Some(fact_of(conn, tenant, head).await?),
                None => None,
            };
            if let Some(done) = compare(stored, &f, line, || format!("fact {:?}", f.id))? {
                return Ok(Some(done));
            }
            let kind = records::fact_kind("fact_kind", &f.fact_kind)?;
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
                    f.update_time
                ],
            )
            .await?;
            for v in &f.versions {
                let content = v.content.to_string();
                let sources = v.source_episode_ids.to_string();
                let channels = v.channels.to_string();
                conn.exec(
                    &INSERT_FACT_VERSION,
                    params![
                        t,
                        f.id.as_str(),
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
            }
            for episode in &f.sources {
                conn.exec(
                    &INSERT_FACT_SOURCE,
                    params![t, episode.as_str(), f.id.as_str()],
                )
                .await?;
            }
            Applied::Imported
        }
        Record::Rule(r) => {
            let stored = match conn
                .first(&RULE, params![t, r.id.as_str()], rule_row)
                .await?
            {
                Some((rule, watermark)) => Some(rule_of(conn, tenant, rule, watermark).await?),
                None => None,
            };
            if let Some(done) = compare(stored, &r, line, || format!("rule {:?}", r.id))? {
                return Ok(Some(done));
            }
            let kind = records::fact_kind("fact_kind", &r.fact_kind)?;
            let then_emits = serde_json::to_string(&r.then_emits).map_err(Error::internal)?;
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
                    r.last_run_time
                ],
            )
            .await?;
            Applied::Imported
        }
    };
    Ok(Some(applied))
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
