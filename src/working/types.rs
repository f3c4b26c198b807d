//! Tasks, cache entries and limits.

use chrono::{DateTime, Utc};

use crate::error::{Error, Reason, Result};

/// Where a task stands. Stored as these numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    Pending = 1,
    InProgress = 2,
    Completed = 3,
    Blocked = 4,
}

impl TaskStatus {
    pub const NAMES: [&'static str; 4] = ["pending", "in_progress", "completed", "blocked"];

    pub fn from_i16(n: i16) -> Option<Self> {
        match n {
            1 => Some(TaskStatus::Pending),
            2 => Some(TaskStatus::InProgress),
            3 => Some(TaskStatus::Completed),
            4 => Some(TaskStatus::Blocked),
            _ => None,
        }
    }

    pub fn as_i16(self) -> i16 {
        self as i16
    }

    /// The name the LLM tools and the MEMORY block use.
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize - 1]
    }

    pub fn parse(field: &str, text: &str) -> Result<Self> {
        match text {
            "pending" => Ok(TaskStatus::Pending),
            "in_progress" => Ok(TaskStatus::InProgress),
            "completed" => Ok(TaskStatus::Completed),
            "blocked" => Ok(TaskStatus::Blocked),
            other => Err(Error::invalid(
                Reason::InvalidArgument,
                field,
                format!("{other:?} is not one of pending, in_progress, completed, blocked"),
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// `t1`, `t2`, ...
    pub id: String,
    pub subject: String,
    pub description: String,
    pub status: TaskStatus,
    pub create_time: DateTime<Utc>,
    pub update_time: DateTime<Utc>,
}

impl crate::paging::Weigh for Task {
    fn weight(&self) -> usize {
        self.id.len() + self.subject.len() + self.description.len() + 48
    }
}

/// A change to a task; `None` keeps a part.
#[derive(Debug, Clone, Default)]
pub struct TaskChange {
    pub status: Option<TaskStatus>,
    pub subject: Option<String>,
    pub description: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CachedFile {
    pub path: String,
    /// Empty in listings.
    pub content: String,
    pub bytes: i64,
    pub update_time: DateTime<Utc>,
}

impl crate::paging::Weigh for CachedFile {
    fn weight(&self) -> usize {
        self.path.len() + self.content.len() + 32
    }
}

/// Limits from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkingLimits {
    pub max_tasks_per_session: i64,
    pub max_facts_per_user: i64,
    pub max_cached_files: i64,
    pub max_cache_bytes: i64,
}

impl Task {
    /// The task id for a number: `t1`, `t2`, …
    pub fn id_for(number: i64) -> String {
        format!("t{number}")
    }
}

/// The number in a task id, if it is one.
pub fn task_number(id: &str) -> Option<i64> {
    id.strip_prefix('t')?.parse().ok().filter(|n| *n > 0)
}

pub fn task_not_found(id: &str) -> Error {
    Error::NotFound {
        reason: Reason::TaskNotFound,
        message: format!("task {id:?} does not exist in this session"),
        metadata: vec![("task_id", id.to_owned())],
    }
}

pub fn limit_exceeded(limit: &'static str, value: i64, what: &str) -> Error {
    Error::ResourceExhausted {
        reason: Reason::LimitExceeded,
        message: format!("{what}: the limit {limit} is {value}"),
        limit,
        value,
    }
}
