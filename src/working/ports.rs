//! What working memory needs from persistence: goals, tasks and the
//! content cache of a session. The limits come in as
//! numbers; what reaching one means for the caller is the service's call.

use std::future::Future;

use chrono::{DateTime, Utc};

use super::types::{CachedFile, Task, TaskChange};
use crate::context::Tenant;
use crate::error::Result;
use crate::memory::ports::RequestStamp;

/// A cache write and the limits it must respect.
#[derive(Debug, Clone)]
pub struct CachePut<'a> {
    pub session_id: &'a str,
    pub path: &'a str,
    pub content: &'a str,
    pub now: DateTime<Utc>,
    pub max_files: i64,
    pub max_bytes: i64,
}

/// A task to add and the limit it must respect.
#[derive(Debug, Clone)]
pub struct NewTask<'a> {
    pub session_id: &'a str,
    pub subject: &'a str,
    pub description: &'a str,
    pub now: DateTime<Utc>,
    /// Most tasks the session may hold (0: no limit).
    pub max_tasks: i64,
    /// The request's idempotency key and fingerprint, kept with the task
    /// it creates.
    pub request: Option<RequestStamp<'a>>,
}

/// Every write (a goal, a task created or changed, a cached file) fails
/// with `SESSION_NOT_FOUND` or `SESSION_ENDED` when the session is gone or
/// has ended, and keeps it from going, ending or being cleaned up until it
/// is done.
pub trait WorkingStore: Clone + Send + Sync + 'static {
    fn set_goal(
        &self,
        tenant: &Tenant,
        session_id: &str,
        goal: &str,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// The goal; empty when none is set.
    fn goal(
        &self,
        tenant: &Tenant,
        session_id: &str,
    ) -> impl Future<Output = Result<String>> + Send;

    /// Adds a task with the session's next id, or answers with the task its
    /// request id added to the session before (as it is now, nothing
    /// written; `REQUEST_ID_REUSED` when that request's fingerprint
    /// differs); `None` (nothing written) when the session already holds
    /// `max_tasks`.
    fn create_task(
        &self,
        tenant: &Tenant,
        task: &NewTask<'_>,
    ) -> impl Future<Output = Result<Option<Task>>> + Send;

    /// `None` when there is no such task.
    fn update_task(
        &self,
        tenant: &Tenant,
        session_id: &str,
        number: i64,
        change: &TaskChange,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<Option<Task>>> + Send;

    /// The session's tasks numbered after `after`, in order, at most
    /// `limit` and read only as far as a page carries
    /// ([`crate::paging::Weighed`]).
    fn list_tasks(
        &self,
        tenant: &Tenant,
        session_id: &str,
        after: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Task>>> + Send;

    /// Caches content, then evicts the least recently cached other entries
    /// until the session is within both limits; returns the entry and the
    /// paths evicted, oldest first.
    fn cache_content(
        &self,
        tenant: &Tenant,
        put: &CachePut<'_>,
    ) -> impl Future<Output = Result<(CachedFile, Vec<String>)>> + Send;

    /// The cache without contents, least recently cached first.
    fn list_cache(
        &self,
        tenant: &Tenant,
        session_id: &str,
    ) -> impl Future<Output = Result<Vec<CachedFile>>> + Send;
}
