//! Working memory on Postgres. Task ids come from a counter on the
//! session's working-memory row, bumped in the statement that inserts the
//! task, so ids are dense per session under concurrent callers.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::PgStore;
use crate::consolidation::FactKind;
use crate::context::Tenant;
use crate::error::{Error, Result};
use crate::store::working::{CachePut, WorkingStore};
use crate::working::{CachedFile, Task, TaskChange, TaskStatus, limit_exceeded, task_id};

const TASK_COLUMNS: &str = "number, subject, description, status, create_time, update_time";

fn task_row(row: &PgRow) -> Result<Task> {
    let status: i16 = row.try_get(3)?;
    Ok(Task {
        id: task_id(row.try_get(0)?),
        subject: row.try_get(1)?,
        description: row.try_get(2)?,
        status: TaskStatus::from_i16(status)
            .ok_or_else(|| Error::internal(format!("unknown task status {status}")))?,
        create_time: row.try_get(4)?,
        update_time: row.try_get(5)?,
    })
}

impl WorkingStore for PgStore {
    async fn set_goal(
        &self,
        tenant: &Tenant,
        session_id: &str,
        goal: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let mut conn = self.session(tenant).await?;
        sqlx::query(
            "INSERT INTO working_memory AS w (tenant, session_id, goal, update_time) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (tenant, session_id) \
             DO UPDATE SET goal = EXCLUDED.goal, update_time = EXCLUDED.update_time",
        )
        .bind(tenant.as_str())
        .bind(session_id)
        .bind(goal)
        .bind(now)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn goal(&self, tenant: &Tenant, session_id: &str) -> Result<String> {
        let mut conn = self.session(tenant).await?;
        let goal: Option<String> = sqlx::query_scalar(
            "SELECT goal FROM working_memory WHERE tenant = $1 AND session_id = $2",
        )
        .bind(tenant.as_str())
        .bind(session_id)
        .fetch_optional(&mut *conn)
        .await?;
        Ok(goal.unwrap_or_default())
    }

    async fn create_task(
        &self,
        tenant: &Tenant,
        session_id: &str,
        subject: &str,
        description: &str,
        now: DateTime<Utc>,
        max_tasks: i64,
    ) -> Result<Task> {
        let mut tx = self.scoped(tenant).await?;
        // The counter row is the lock: creators of one session queue here.
        let number: i64 = sqlx::query_scalar(
            "INSERT INTO working_memory AS w (tenant, session_id, next_task, update_time) \
             VALUES ($1, $2, 1, $3) ON CONFLICT (tenant, session_id) \
             DO UPDATE SET next_task = w.next_task + 1, update_time = EXCLUDED.update_time \
             RETURNING next_task",
        )
        .bind(tenant.as_str())
        .bind(session_id)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let count: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM working_tasks WHERE tenant = $1 AND session_id = $2",
        )
        .bind(tenant.as_str())
        .bind(session_id)
        .fetch_one(&mut *tx)
        .await?;
        if max_tasks > 0 && count >= max_tasks {
            return Err(limit_exceeded(
                "max_tasks_per_session",
                max_tasks,
                "the session has as many tasks as it may hold",
            ));
        }
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO working_tasks (tenant, session_id, number, subject, description, status, \
             create_time, update_time) VALUES ($1, $2, $3, $4, $5, 1, $6, $6) RETURNING {TASK_COLUMNS}"
        )))
        .bind(tenant.as_str())
        .bind(session_id)
        .bind(number)
        .bind(subject)
        .bind(description)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let task = task_row(&row)?;
        tx.commit().await?;
        Ok(task)
    }

    async fn update_task(
        &self,
        tenant: &Tenant,
        session_id: &str,
        number: i64,
        change: &TaskChange,
        now: DateTime<Utc>,
    ) -> Result<Option<Task>> {
        let mut conn = self.session(tenant).await?;
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE working_tasks SET status = coalesce($4, status), \
             subject = coalesce($5, subject), description = coalesce($6, description), \
             update_time = $7 WHERE tenant = $1 AND session_id = $2 AND number = $3 \
             RETURNING {TASK_COLUMNS}"
        )))
        .bind(tenant.as_str())
        .bind(session_id)
        .bind(number)
        .bind(change.status.map(TaskStatus::as_i16))
        .bind(change.subject.as_deref())
        .bind(change.description.as_deref())
        .bind(now)
        .fetch_optional(&mut *conn)
        .await?;
        row.as_ref().map(task_row).transpose()
    }

    async fn list_tasks(&self, tenant: &Tenant, session_id: &str) -> Result<Vec<Task>> {
        let mut conn = self.session(tenant).await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {TASK_COLUMNS} FROM working_tasks WHERE tenant = $1 AND session_id = $2 \
             ORDER BY number"
        )))
        .bind(tenant.as_str())
        .bind(session_id)
        .fetch_all(&mut *conn)
        .await?;
        rows.iter().map(task_row).collect()
    }

    async fn cache_content(
        &self,
        tenant: &Tenant,
        put: &CachePut<'_>,
    ) -> Result<(CachedFile, Vec<String>)> {
        let mut tx = self.scoped(tenant).await?;
        // Serialise writers of one session's cache on its working row.
        sqlx::query(
            "INSERT INTO working_memory AS w (tenant, session_id, update_time) VALUES ($1, $2, $3) \
             ON CONFLICT (tenant, session_id) DO UPDATE SET update_time = EXCLUDED.update_time",
        )
        .bind(tenant.as_str())
        .bind(put.session_id)
        .bind(put.now)
        .execute(&mut *tx)
        .await?;
        let bytes = put.content.len() as i64;
        sqlx::query(
            "INSERT INTO working_cache (tenant, session_id, path, content, bytes, update_time) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (tenant, session_id, path) \
             DO UPDATE SET content = EXCLUDED.content, bytes = EXCLUDED.bytes, \
             update_time = EXCLUDED.update_time",
        )
        .bind(tenant.as_str())
        .bind(put.session_id)
        .bind(put.path)
        .bind(put.content)
        .bind(bytes)
        .bind(put.now)
        .execute(&mut *tx)
        .await?;
        // Everything else, newest first: keep while within both limits.
        let others = sqlx::query(
            "SELECT path, bytes FROM working_cache WHERE tenant = $1 AND session_id = $2 \
             AND path <> $3 ORDER BY update_time DESC, path DESC",
        )
        .bind(tenant.as_str())
        .bind(put.session_id)
        .bind(put.path)
        .fetch_all(&mut *tx)
        .await?;
        let (mut files, mut total) = (1, bytes);
        let mut evicted = Vec::new();
        for row in &others {
            let (path, size): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
            if files < put.max_files && total + size <= put.max_bytes {
                files += 1;
                total += size;
            } else {
                evicted.push(path);
            }
        }
        evicted.reverse();
        if !evicted.is_empty() {
            sqlx::query(
                "DELETE FROM working_cache WHERE tenant = $1 AND session_id = $2 AND path = ANY($3)",
            )
            .bind(tenant.as_str())
            .bind(put.session_id)
            .bind(&evicted)
            .execute(&mut *tx)
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
        let mut conn = self.session(tenant).await?;
        let rows = sqlx::query(
            "SELECT path, bytes, update_time FROM working_cache WHERE tenant = $1 \
             AND session_id = $2 ORDER BY update_time, path",
        )
        .bind(tenant.as_str())
        .bind(session_id)
        .fetch_all(&mut *conn)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(CachedFile {
                    path: row.try_get(0)?,
                    content: String::new(),
                    bytes: row.try_get(1)?,
                    update_time: row.try_get(2)?,
                })
            })
            .collect()
    }

    async fn count_facts(
        &self,
        tenant: &Tenant,
        app: &str,
        user: &str,
        kind: FactKind,
    ) -> Result<i64> {
        let mut conn = self.session(tenant).await?;
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM facts WHERE tenant = $1 AND app = $2 AND user_id = $3 \
             AND kind = $4 AND NOT deleted",
        )
        .bind(tenant.as_str())
        .bind(app)
        .bind(user)
        .bind(kind.as_i16())
        .fetch_one(&mut *conn)
        .await?)
    }
}
