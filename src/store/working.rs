//! Working memory on both backends, one statement text each. Task ids come
//! from a counter on the session's working-memory row, bumped in the
//! statement that reads it, so ids are dense per session under concurrent
//! callers (on Postgres the row lock queues them; on SQLite the single
//! writer does).
//!
//! A write to a session's working memory (a goal, a task created or
//! changed, a cached file) first holds the session open ([`hold_open`]),
//! so that an `EndSession`, a delete or a cleanup racing it either waits
//! for it and then clears what it wrote (a cleanup then finds the session
//! active), or goes first and the write is refused: never a goal or a task
//! left on an ended session, a change answered for and then deleted, nor a
//! deadlock with a delete.

use chrono::{DateTime, Utc};

use super::sql::{
    Backend, Cols, Dialect, Param, Run, SENT_WHOLE_BYTES, Sql, Transaction, page_by_bytes, params,
};
use crate::context::Tenant;
use crate::error::{Error, Result, request_id_reused};
use crate::paging::Weighed;
use crate::sessions::{session_ended, session_not_found};
use crate::working::ports::{CachePut, NewTask, WorkingStore};
use crate::working::{CachedFile, Task, TaskChange, TaskStatus};

/// The session's end time, its row held until the transaction ends: on
/// Postgres by a key-share lock, which a delete and an `EndSession` (it
/// locks the row for update first) wait for, and which waits for them;
/// SQLite's single writer is alone anyway.
static SESSION_HELD_PG: Sql =
    Sql::new("SELECT end_time FROM sessions WHERE tenant = $1 AND id = $2 FOR KEY SHARE");

static SESSION_HELD: Sql = Sql::new("SELECT end_time FROM sessions WHERE tenant = $1 AND id = $2");

/// Refuses a write to a session that is gone or has ended, and keeps it
/// from going or ending until the transaction does.
async fn hold_open<T: Run>(tx: &mut T, tenant: &Tenant, session_id: &str) -> Result<()> {
    let sql = match T::DIALECT {
        Dialect::Postgres => &SESSION_HELD_PG,
        Dialect::Sqlite => &SESSION_HELD,
    };
    match tx
        .first(sql, params![tenant.as_str(), session_id], |row| {
            row.opt_time(0)
        })
        .await?
    {
        None => Err(session_not_found(session_id)),
        Some(None) => Ok(()),
        Some(Some(_)) => Err(session_ended(session_id)),
    }
}

static SET_GOAL: Sql = Sql::new(
    "INSERT INTO working_memory AS w (tenant, session_id, goal, update_time) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (tenant, session_id) \
     DO UPDATE SET goal = EXCLUDED.goal, update_time = EXCLUDED.update_time",
);

static GOAL: Sql =
    Sql::new("SELECT goal FROM working_memory WHERE tenant = $1 AND session_id = $2");

static NEXT_TASK: Sql = Sql::new(
    "INSERT INTO working_memory AS w (tenant, session_id, next_task, update_time) \
     VALUES ($1, $2, 1, $3) ON CONFLICT (tenant, session_id) \
     DO UPDATE SET next_task = w.next_task + 1, update_time = EXCLUDED.update_time \
     RETURNING next_task",
);

static COUNT_TASKS: Sql =
    Sql::new("SELECT count(*) FROM working_tasks WHERE tenant = $1 AND session_id = $2");

static INSERT_TASK: Sql = Sql::new(
    "INSERT INTO working_tasks (tenant, session_id, number, subject, description, status, \
     create_time, update_time) VALUES ($1, $2, $3, $4, $5, 1, $6, $6) \
     RETURNING number, subject, description, status, create_time, update_time",
);

/// [`INSERT_TASK`] keeping the request id that creates the task ($7) and
/// its fingerprint ($8).
/// (Apart, so that writes without one name no column a schema before
/// migration 0036 / 0026 lacks.)
static INSERT_KEYED_TASK: Sql = Sql::new(
    "INSERT INTO working_tasks (tenant, session_id, number, subject, description, status, \
     create_time, update_time, create_request_id, create_fingerprint) \
     VALUES ($1, $2, $3, $4, $5, 1, $6, $6, $7, $8) \
     RETURNING number, subject, description, status, create_time, update_time",
);

/// The task a request id created in a session. Parameters: $1 tenant, $2
/// session, $3 request id.
static TASK_OF_REQUEST: Sql = Sql::new(
    "SELECT number, subject, description, status, create_time, update_time, create_fingerprint \
     FROM working_tasks WHERE tenant = $1 AND session_id = $2 AND create_request_id = $3",
);

static UPDATE_TASK: Sql = Sql::new(
    "UPDATE working_tasks SET status = coalesce($4, status), \
     subject = coalesce($5, subject), description = coalesce($6, description), \
     update_time = $7 WHERE tenant = $1 AND session_id = $2 AND number = $3 \
     RETURNING number, subject, description, status, create_time, update_time",
);

/// $1 tenant, $2 session, $3 the number to read after, $4 limit, $5
/// [`SENT_WHOLE_BYTES`]: a task's text past that comes without its
/// subject and description (a description holds up to 64 KiB, and a page
/// up to a thousand tasks), and the store reads on after the last task it
/// kept.
static TASKS: Sql = page_by_bytes!(
    "number, CASE WHEN past THEN NULL ELSE subject END, \
     CASE WHEN past THEN NULL ELSE description END, status, create_time, update_time",
    "number, subject, description, status, create_time, update_time",
    "pg_column_size(subject) + pg_column_size(description)",
    "number",
    "$5",
    "FROM working_tasks WHERE tenant = $1 AND session_id = $2 AND number > $3 \
     ORDER BY number LIMIT $4"
);

static TOUCH_CACHE: Sql = Sql::new(
    "INSERT INTO working_memory AS w (tenant, session_id, update_time) VALUES ($1, $2, $3) \
     ON CONFLICT (tenant, session_id) DO UPDATE SET update_time = EXCLUDED.update_time",
);

static PUT_CACHE: Sql = Sql::new(
    "INSERT INTO working_cache (tenant, session_id, path, content, bytes, update_time) \
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant, session_id, path) \
     DO UPDATE SET content = EXCLUDED.content, bytes = EXCLUDED.bytes, \
     update_time = EXCLUDED.update_time",
);

static OTHER_CACHED: Sql = Sql::new(
    "SELECT path, bytes FROM working_cache WHERE tenant = $1 AND session_id = $2 \
     AND path <> $3 ORDER BY update_time DESC, path DESC",
);

static EVICT_CACHED: Sql =
    Sql::new("DELETE FROM working_cache WHERE tenant = $1 AND session_id = $2 AND path = $3");

static CACHED: Sql = Sql::new(
    "SELECT path, bytes, update_time FROM working_cache WHERE tenant = $1 \
     AND session_id = $2 ORDER BY update_time, path",
);

fn task_row(row: &impl Cols) -> Result<Task> {
    let status = row.small(3)?;
    Ok(Task {
        id: Task::id_for(row.int(0)?),
        subject: row.text(1)?,
        description: row.text(2)?,
        status: TaskStatus::from_i16(status)
            .ok_or_else(|| Error::internal(format!("unknown task status {status}")))?,
        create_time: row.time(4)?,
        update_time: row.time(5)?,
    })
}

impl<B: Backend> WorkingStore for B {
    async fn set_goal(
        &self,
        tenant: &Tenant,
        session_id: &str,
        goal: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let mut tx = self.begin(tenant).await?;
        hold_open(&mut tx, tenant, session_id).await?;
        tx.exec(&SET_GOAL, params![tenant.as_str(), session_id, goal, now])
            .await?;
        tx.commit().await
    }

    async fn goal(&self, tenant: &Tenant, session_id: &str) -> Result<String> {
        let mut conn = self.reader(tenant).await?;
        let row = conn
            .row(&GOAL, params![tenant.as_str(), session_id])
            .await?;
        Ok(row
            .map(|row| row.opt_text(0))
            .transpose()?
            .flatten()
            .unwrap_or_default())
    }

    async fn create_task(&self, tenant: &Tenant, task: &NewTask<'_>) -> Result<Option<Task>> {
        let session_id = task.session_id;
        let mut tx = self.begin(tenant).await?;
        hold_open(&mut tx, tenant, session_id).await?;
        // The counter row is the lock: creators of one session queue here,
        // so a repeat finds the task of a concurrent first try committed.
        let number = tx
            .row(&NEXT_TASK, params![tenant.as_str(), session_id, task.now])
            .await?
            .ok_or_else(|| Error::internal("the task counter was not returned"))?
            .int(0)?;
        if let Some(request) = &task.request {
            let first = tx
                .row(
                    &TASK_OF_REQUEST,
                    params![tenant.as_str(), session_id, request.id],
                )
                .await?;
            if let Some(first) = first {
                // Nothing written: the counter's bump is rolled back.
                if first.bytes(6)?[..] != request.fingerprint[..] {
                    return Err(request_id_reused(request.id));
                }
                return task_row(&first).map(Some);
            }
        }
        let count = tx
            .count(&COUNT_TASKS, params![tenant.as_str(), session_id])
            .await?;
        if task.max_tasks > 0 && count >= task.max_tasks {
            return Ok(None);
        }
        let row: &[Param<'_>] = params![
            tenant.as_str(),
            session_id,
            number,
            task.subject,
            task.description,
            task.now
        ];
        let inserted = match &task.request {
            None => tx.row(&INSERT_TASK, row).await?,
            Some(request) => {
                let keyed = &[row, params![request.id, &request.fingerprint[..]]].concat();
                tx.row(&INSERT_KEYED_TASK, keyed).await?
            }
        };
        let row = inserted.ok_or_else(|| Error::internal("an inserted task was not returned"))?;
        let task = task_row(&row)?;
        tx.commit().await?;
        Ok(Some(task))
    }

    async fn update_task(
        &self,
        tenant: &Tenant,
        session_id: &str,
        number: i64,
        change: &TaskChange,
        now: DateTime<Utc>,
    ) -> Result<Option<Task>> {
        // Held open as well: a cleanup that found the session idle would
        // otherwise delete the task this call answers for.
        let mut tx = self.begin(tenant).await?;
        hold_open(&mut tx, tenant, session_id).await?;
        let task = tx
            .first(
                &UPDATE_TASK,
                params![
                    tenant.as_str(),
                    session_id,
                    number,
                    change.status.map(TaskStatus::as_i16),
                    change.subject.as_deref(),
                    change.description.as_deref(),
                    now,
                ],
                task_row,
            )
            .await?;
        tx.commit().await?;
        Ok(task)
    }

    async fn list_tasks(
        &self,
        tenant: &Tenant,
        session_id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Task>> {
        let mut conn = self.reader(tenant).await?;
        let mut read = Weighed::default();
        loop {
            // Read on after the last task an earlier part held.
            let after = read.items.last().map_or(after, |(number, _)| *number);
            let params = params![
                tenant.as_str(),
                session_id,
                after,
                limit - read.items.len() as i64,
                SENT_WHOLE_BYTES,
            ];
            let cut = conn
                .weigh_into(&TASKS, params, &mut read, |row| {
                    if row.boolean(6)? {
                        return Ok(None);
                    }
                    Ok(Some((row.int(0)?, task_row(row)?)))
                })
                .await?;
            if !cut || read.full {
                return Ok(read.items.into_iter().map(|(_, task)| task).collect());
            }
        }
    }

    async fn cache_content(
        &self,
        tenant: &Tenant,
        put: &CachePut<'_>,
    ) -> Result<(CachedFile, Vec<String>)> {
        let mut tx = self.begin(tenant).await?;
        hold_open(&mut tx, tenant, put.session_id).await?;
        // Serialise writers of one session's cache on its working row.
        tx.exec(
            &TOUCH_CACHE,
            params![tenant.as_str(), put.session_id, put.now],
        )
        .await?;
        let bytes = put.content.len() as i64;
        tx.exec(
            &PUT_CACHE,
            params![
                tenant.as_str(),
                put.session_id,
                put.path,
                put.content,
                bytes,
                put.now
            ],
        )
        .await?;
        // Everything else, newest first: keep while within both limits;
        // the first that does not fit goes, and every older one with it
        // (least recently cached first, never a newer before an older).
        let others = tx
            .rows(
                &OTHER_CACHED,
                params![tenant.as_str(), put.session_id, put.path],
            )
            .await?;
        let (mut files, mut total) = (1, bytes);
        let mut evicted = Vec::new();
        for row in &others {
            let (path, size) = (row.text(0)?, row.int(1)?);
            if evicted.is_empty() && files < put.max_files && total + size <= put.max_bytes {
                files += 1;
                total += size;
            } else {
                evicted.push(path);
            }
        }
        evicted.reverse();
        for path in &evicted {
            tx.exec(
                &EVICT_CACHED,
                params![tenant.as_str(), put.session_id, path],
            )
            .await?;
        }
        tx.commit().await?;
        let file = CachedFile {
            path: put.path.to_owned(),
            content: put.content.to_owned(),
            bytes,
            update_time: put.now,
        };
        Ok((file, evicted))
    }

    async fn list_cache(&self, tenant: &Tenant, session_id: &str) -> Result<Vec<CachedFile>> {
        let mut conn = self.reader(tenant).await?;
        let rows = conn
            .rows(&CACHED, params![tenant.as_str(), session_id])
            .await?;
        rows.iter()
            .map(|row| {
                Ok(CachedFile {
                    path: row.text(0)?,
                    content: String::new(),
                    bytes: row.int(1)?,
                    update_time: row.time(2)?,
                })
            })
            .collect()
    }
}
