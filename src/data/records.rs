//! The export format: JSON Lines, one [`Record`] per line, tagged by
//! `kind`, after a [`Header`] naming the format and its version.
//!
//! Every line is bounded: what grows without bound (a fact's versions and
//! sources, a session's tasks and cached files) has a line per item after
//! its owner's line, so no line outgrows a message or a page, however long a fact's
//! history. Version 1 files held them inside their owner's line; those
//! lines are still read.
//!
//! A record holds what a store keeps about a thing, less what the
//! importing store issues again (change-feed revisions, episode cursors)
//! and what it recomputes (search vectors). Everything here is checked on
//! import the way the API checks it ([`Record::check`]), so a file cannot
//! put into a store what a client could not.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::consolidation::{Cadence, FactKind, NewRule, validate_stored_rule};
use crate::error::{Error, Reason, Result, refuse_time_out_of_range};
use crate::memory::{Key, ScopeName, ScopeType};
use crate::sessions::{EpisodeType, Id, Name};
use crate::working::TaskStatus;

/// The `format` of the header line.
pub const FORMAT: &str = "engram.export";

/// The format version this server writes; it reads every version from 1.
pub const VERSION: u32 = 4;

/// The first format version whose files end with an [`End`] line.
pub const ENDED_FROM: u32 = 3;

/// One line of an export.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    Header(Header),
    Execution(Execution),
    MemoryVersion(MemoryVersion),
    Session(Session),
    Episode(Episode),
    WorkingMemory(WorkingMemory),
    /// A task of a working memory written earlier (version 2).
    Task(Task),
    /// A cached file of a working memory written earlier (version 2).
    CachedFile(Cached),
    Fact(Fact),
    /// A version of a fact written earlier (version 2).
    FactVersion(FactVersion),
    /// An episode a fact written earlier was derived from (version 2).
    FactSource(FactSource),
    Rule(Rule),
    /// The last line (version 3): what came before it, so that a file cut
    /// short (an export that broke, a partial copy) is refused whole.
    End(End),
}

/// The first line: what the file is and what it holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub format: String,
    pub version: u32,
    /// The tenant exported (informational: an import writes into the
    /// importer's tenant).
    pub tenant: String,
    /// What was exported: `tenant`, `scope TYPE/NAME`, `session ID` or
    /// `user APP/USER`.
    pub selection: String,
    pub export_time: DateTime<Utc>,
}

/// The last line of a file from version 3 on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct End {
    /// The lines before it, the header included (blank lines not).
    pub lines: i64,
}

/// An execution's flow, as the registry keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Execution {
    pub execution_id: String,
    pub flow_id: String,
    pub flow_name: String,
    pub create_time: DateTime<Utc>,
}

/// One version of a memory key: a value, or a tombstone (`value` null).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryVersion {
    /// `namespace`, `flow` or `execution`.
    pub scope_type: String,
    pub scope: String,
    pub key: String,
    pub version: i64,
    /// Null on a tombstone (and when the value is JSON null).
    pub value: Value,
    pub deleted: bool,
    #[serde(default)]
    pub execution_id: String,
    #[serde(default)]
    pub flow_id: String,
    #[serde(default)]
    pub flow_name: String,
    pub create_time: DateTime<Utc>,
}

/// The request a creation was keyed by (version 4): its `request_id` and
/// the fingerprint of what it asked for (hex), so that a retried creation
/// is still recognised after the import, as a retried append is by its
/// episode's fingerprint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreatedBy {
    pub request_id: String,
    pub fingerprint: String,
}

impl CreatedBy {
    /// The request columns of a row (`create_request_id`,
    /// `create_fingerprint`), when it was made keyed.
    pub fn of(request_id: Option<String>, fingerprint: Option<Vec<u8>>) -> Option<CreatedBy> {
        Some(CreatedBy {
            request_id: request_id?,
            fingerprint: to_hex(&fingerprint?),
        })
    }

    fn check(&self) -> Result<()> {
        crate::error::check_request_id("request.request_id", &self.request_id)?;
        hex("request.fingerprint", &self.fingerprint)?;
        if self.fingerprint.len() != 64 {
            return Err(invalid(
                "request.fingerprint",
                "must be a SHA-256 (64 hexadecimal digits)",
            ));
        }
        Ok(())
    }
}

/// A session with its counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Session {
    pub id: String,
    pub app: String,
    pub user: String,
    pub metadata: Value,
    pub create_time: DateTime<Utc>,
    pub update_time: DateTime<Utc>,
    pub end_time: Option<DateTime<Utc>>,
    pub last_seq: i64,
    pub episode_count: i64,
    pub episodes_evicted: i64,
    /// The `CreateSession` that made it, when keyed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<CreatedBy>,
}

/// An episode of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Episode {
    pub session_id: String,
    pub seq: i64,
    pub id: String,
    pub app: String,
    pub user: String,
    pub agent: String,
    #[serde(rename = "type")]
    pub episode_type: String,
    pub content: Value,
    pub metadata: Value,
    #[serde(default)]
    pub source_node: String,
    pub timestamp: DateTime<Utc>,
    pub create_time: DateTime<Utc>,
    /// The fingerprint of the append that wrote it (hex), so a retried
    /// append is still recognised after the import.
    pub fingerprint: String,
}

/// A session's working memory: its goal, and in a version 1 file its tasks
/// and cached files (version 2 writes each as a line of its own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkingMemory {
    pub session_id: String,
    pub goal: String,
    /// The number of the last task id handed out.
    pub next_task: i64,
    pub update_time: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<Task>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cache: Vec<Cached>,
}

/// A task: a `task` line, or one of a version 1 working memory's `tasks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// The session whose working memory holds it; empty inside its line.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub session_id: String,
    pub number: i64,
    pub subject: String,
    pub description: String,
    /// `pending`, `in_progress`, `completed` or `blocked`.
    pub status: String,
    pub create_time: DateTime<Utc>,
    pub update_time: DateTime<Utc>,
    /// The `CreateTask` that made it, when keyed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<CreatedBy>,
}

/// A cached file: a `cached_file` line, or one of a version 1 working
/// memory's `cache`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cached {
    /// The session whose working memory holds it; empty inside its line.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub session_id: String,
    pub path: String,
    pub content: String,
    pub bytes: i64,
    pub update_time: DateTime<Utc>,
}

/// A fact, and in a version 1 file its versions and sources (version 2
/// writes each as a `fact_version` or `fact_source` line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fact {
    pub id: String,
    pub app: String,
    /// Empty for an app-wide fact.
    pub user: String,
    /// `semantic` or `procedural`.
    pub fact_kind: String,
    pub subject: String,
    pub predicate: String,
    pub version: i64,
    pub deleted: bool,
    pub create_time: DateTime<Utc>,
    pub update_time: DateTime<Utc>,
    /// Oldest first; the last is `version`. Empty when the versions have
    /// lines of their own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<FactVersion>,
    /// The ids of the episodes it was derived from, sorted; in a version 2
    /// file each is a `fact_source` line of its own instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
    /// The `Remember` or `RecordProcedure` that made it, when keyed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<CreatedBy>,
}

/// An episode a fact was derived from (version 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FactSource {
    pub fact_id: String,
    pub episode_id: String,
}

/// A version of a fact: a `fact_version` line, or one of a version 1
/// fact's `versions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FactVersion {
    /// The fact; empty inside its line.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fact_id: String,
    pub version: i64,
    pub deleted: bool,
    pub subject: String,
    pub predicate: String,
    pub object: String,
    pub content: Value,
    pub confidence: f64,
    /// `remember` or the id of the rule that wrote it.
    pub source: String,
    pub source_episode_ids: Value,
    pub channels: Value,
    pub create_time: DateTime<Utc>,
}

/// A consolidation rule with its progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub id: String,
    pub filter: String,
    pub every_n_episodes: Option<i64>,
    pub cron: Option<String>,
    pub then_emits: Vec<String>,
    /// `semantic` or `procedural`.
    pub fact_kind: String,
    pub confidence: f64,
    pub enabled: bool,
    /// The newest episode the rule has read past (its watermark), by id;
    /// none when it has read nothing that still exists.
    pub watermark_episode: Option<String>,
    pub episodes_promoted: i64,
    pub create_time: DateTime<Utc>,
    pub last_run_time: Option<DateTime<Utc>>,
    /// The `CreateRule` that made it, when keyed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<CreatedBy>,
}

/// What the heavy records weigh in memory, about (their JSON values
/// counted as an answer would): export pages read them only as far as a
/// page carries ([`crate::paging::Weighed`]).
impl crate::paging::Weigh for MemoryVersion {
    fn weight(&self) -> usize {
        use crate::paging::json_weight;
        self.scope.len() + self.key.len() + json_weight(&self.value) + 96
    }
}

impl crate::paging::Weigh for Episode {
    fn weight(&self) -> usize {
        use crate::paging::json_weight;
        self.id.len() + json_weight(&self.content) + json_weight(&self.metadata) + 160
    }
}

impl crate::paging::Weigh for WorkingMemory {
    fn weight(&self) -> usize {
        let tasks: usize = self.tasks.iter().map(Task::weight).sum();
        let cache: usize = self.cache.iter().map(Cached::weight).sum();
        self.goal.len() + tasks + cache + 64
    }
}

impl crate::paging::Weigh for Task {
    fn weight(&self) -> usize {
        self.session_id.len() + self.subject.len() + self.description.len() + 64
    }
}

impl crate::paging::Weigh for Cached {
    fn weight(&self) -> usize {
        self.session_id.len() + self.path.len() + self.content.len() + 48
    }
}

impl crate::paging::Weigh for Fact {
    fn weight(&self) -> usize {
        let versions: usize = self.versions.iter().map(FactVersion::weight).sum();
        self.sources.iter().map(String::len).sum::<usize>() + versions + 160
    }
}

impl crate::paging::Weigh for FactVersion {
    fn weight(&self) -> usize {
        use crate::paging::json_weight;
        self.fact_id.len()
            + self.subject.len()
            + self.predicate.len()
            + self.object.len()
            + json_weight(&self.content)
            + json_weight(&self.source_episode_ids)
            + 96
    }
}

impl Record {
    /// The record's kind, as the `kind` field and the import counts name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Record::Header(_) => "header",
            Record::Execution(_) => "execution",
            Record::MemoryVersion(_) => "memory_version",
            Record::Session(_) => "session",
            Record::Episode(_) => "episode",
            Record::WorkingMemory(_) => "working_memory",
            Record::Task(_) => "task",
            Record::CachedFile(_) => "cached_file",
            Record::Fact(_) => "fact",
            Record::FactVersion(_) => "fact_version",
            Record::FactSource(_) => "fact_source",
            Record::Rule(_) => "rule",
            Record::End(_) => "end",
        }
    }

    /// Every time the record holds, with its field's name.
    fn times(&self) -> Vec<(String, DateTime<Utc>)> {
        let named = |field: &str, time: &DateTime<Utc>| (field.to_owned(), *time);
        match self {
            Record::Header(h) => vec![named("export_time", &h.export_time)],
            Record::Execution(e) => vec![named("create_time", &e.create_time)],
            Record::MemoryVersion(v) => vec![named("create_time", &v.create_time)],
            Record::Session(s) => {
                let mut times = vec![
                    named("create_time", &s.create_time),
                    named("update_time", &s.update_time),
                ];
                times.extend(s.end_time.iter().map(|t| named("end_time", t)));
                times
            }
            Record::Episode(e) => vec![
                named("timestamp", &e.timestamp),
                named("create_time", &e.create_time),
            ],
            Record::WorkingMemory(w) => {
                let mut times = vec![named("update_time", &w.update_time)];
                for (n, task) in w.tasks.iter().enumerate() {
                    times.push(named(&format!("tasks[{n}].create_time"), &task.create_time));
                    times.push(named(&format!("tasks[{n}].update_time"), &task.update_time));
                }
                for (n, cached) in w.cache.iter().enumerate() {
                    times.push(named(
                        &format!("cache[{n}].update_time"),
                        &cached.update_time,
                    ));
                }
                times
            }
            Record::Fact(f) => {
                let mut times = vec![
                    named("create_time", &f.create_time),
                    named("update_time", &f.update_time),
                ];
                for (n, version) in f.versions.iter().enumerate() {
                    times.push(named(
                        &format!("versions[{n}].create_time"),
                        &version.create_time,
                    ));
                }
                times
            }
            Record::Task(t) => vec![
                named("create_time", &t.create_time),
                named("update_time", &t.update_time),
            ],
            Record::CachedFile(c) => vec![named("update_time", &c.update_time)],
            Record::FactVersion(v) => vec![named("create_time", &v.create_time)],
            Record::FactSource(_) | Record::End(_) => Vec::new(),
            Record::Rule(r) => {
                let mut times = vec![named("create_time", &r.create_time)];
                times.extend(r.last_run_time.iter().map(|t| named("last_run_time", t)));
                times
            }
        }
    }

    /// Checks every field the way the API checks a request's, naming the
    /// field in the error.
    pub fn check(&self) -> Result<()> {
        for (field, time) in self.times() {
            refuse_time_out_of_range(&field, time)?;
        }
        match self {
            Record::Header(header) => header.check(),
            Record::Execution(e) => {
                ScopeName::parse("execution_id", e.execution_id.as_str())?;
                optional_scope_name("flow_id", &e.flow_id)?;
                optional_scope_name("flow_name", &e.flow_name)
            }
            Record::MemoryVersion(v) => v.check(),
            Record::Session(s) => {
                Id::parse("id", s.id.as_str())?;
                Name::parse("app", s.app.as_str())?;
                Name::parse("user", s.user.as_str())?;
                object("metadata", &s.metadata)?;
                counts(&[
                    ("last_seq", s.last_seq),
                    ("episode_count", s.episode_count),
                    ("episodes_evicted", s.episodes_evicted),
                ])?;
                s.request.as_ref().map_or(Ok(()), CreatedBy::check)
            }
            Record::Episode(e) => {
                Id::parse("session_id", e.session_id.as_str())?;
                Id::parse("id", e.id.as_str())?;
                Name::parse("app", e.app.as_str())?;
                Name::parse("user", e.user.as_str())?;
                Name::parse("agent", e.agent.as_str())?;
                EpisodeType::parse("type", e.episode_type.as_str())?;
                object("metadata", &e.metadata)?;
                hex("fingerprint", &e.fingerprint)?;
                positive("seq", e.seq)
            }
            Record::WorkingMemory(w) => {
                Id::parse("session_id", w.session_id.as_str())?;
                counts(&[("next_task", w.next_task)])?;
                for (n, task) in w.tasks.iter().enumerate() {
                    task.check(&format!("tasks[{n}]."), Some(&w.session_id))?;
                    if task.number > w.next_task {
                        return Err(invalid(
                            &format!("tasks[{n}].number"),
                            format!("is past next_task ({})", w.next_task),
                        ));
                    }
                }
                for (n, cached) in w.cache.iter().enumerate() {
                    cached.check(&format!("cache[{n}]."), Some(&w.session_id))?;
                }
                Ok(())
            }
            Record::Task(t) => t.check("", None),
            Record::CachedFile(c) => c.check("", None),
            Record::Fact(f) => f.check(),
            Record::FactVersion(v) => v.check("", None),
            Record::FactSource(source) => {
                Id::parse("fact_id", source.fact_id.as_str())?;
                Id::parse("episode_id", source.episode_id.as_str())?;
                Ok(())
            }
            Record::Rule(r) => {
                let cadence = match (r.every_n_episodes, &r.cron) {
                    (Some(n), None) => Cadence::EveryNEpisodes(n),
                    (None, Some(cron)) => Cadence::Cron(cron.clone()),
                    _ => {
                        return Err(invalid(
                            "every_n_episodes",
                            "exactly one of every_n_episodes and cron is set",
                        ));
                    }
                };
                validate_stored_rule(
                    NewRule {
                        id: r.id.clone(),
                        filter: r.filter.clone(),
                        cadence: Some(cadence),
                        then_emits: r.then_emits.clone(),
                        kind: Some(fact_kind("fact_kind", &r.fact_kind)?),
                        confidence: r.confidence,
                        enabled: r.enabled,
                    },
                    r.create_time,
                )?;
                if let Some(id) = &r.watermark_episode {
                    Id::parse("watermark_episode", id.as_str())?;
                }
                counts(&[("episodes_promoted", r.episodes_promoted)])?;
                r.request.as_ref().map_or(Ok(()), CreatedBy::check)
            }
            Record::End(e) => counts(&[("lines", e.lines)]),
        }
    }
}

impl Header {
    pub fn new(tenant: &str, selection: String, export_time: DateTime<Utc>) -> Self {
        Header {
            format: FORMAT.to_owned(),
            version: VERSION,
            tenant: tenant.to_owned(),
            selection,
            export_time,
        }
    }

    fn check(&self) -> Result<()> {
        if self.format != FORMAT {
            return Err(invalid(
                "format",
                format!("must be {FORMAT:?}, got {:?}", self.format),
            ));
        }
        if !(1..=VERSION).contains(&self.version) {
            return Err(invalid(
                "version",
                format!(
                    "this server reads versions 1 to {VERSION} of the format, got {}",
                    self.version
                ),
            ));
        }
        Ok(())
    }
}

impl MemoryVersion {
    /// The scope type named in the record.
    pub fn scope_type(&self) -> Result<ScopeType> {
        [ScopeType::Namespace, ScopeType::Flow, ScopeType::Execution]
            .into_iter()
            .find(|t| t.as_str() == self.scope_type)
            .ok_or_else(|| {
                invalid(
                    "scope_type",
                    format!(
                        "must be namespace, flow or execution, got {:?}",
                        self.scope_type
                    ),
                )
            })
    }

    fn check(&self) -> Result<()> {
        self.scope_type()?;
        ScopeName::parse("scope", self.scope.as_str())?;
        // Reserved keys (`_compaction/…`, the audit trail) are exported
        // and imported like any other.
        Key::parse("key", self.key.as_str())?;
        positive("version", self.version)?;
        if self.deleted && !self.value.is_null() {
            return Err(invalid("value", "a tombstone (deleted) has no value"));
        }
        optional_scope_name("execution_id", &self.execution_id)?;
        optional_scope_name("flow_id", &self.flow_id)?;
        optional_scope_name("flow_name", &self.flow_name)
    }
}

impl Fact {
    /// The first field in which `current`, the fact's current version,
    /// differs from the fact's own line (a write keeps the fact's subject,
    /// predicate and deletion those of its newest version); `None` when
    /// they agree.
    pub fn disagreement(&self, current: &FactVersion) -> Option<&'static str> {
        [
            ("deleted", current.deleted == self.deleted),
            ("subject", current.subject == self.subject),
            ("predicate", current.predicate == self.predicate),
        ]
        .into_iter()
        .find_map(|(field, agrees)| (!agrees).then_some(field))
    }

    fn check(&self) -> Result<()> {
        Id::parse("id", self.id.as_str())?;
        Name::parse("app", self.app.as_str())?;
        // As a write has them: an app's procedure has no user, a fact
        // about a user names one.
        match fact_kind("fact_kind", &self.fact_kind)? {
            FactKind::Procedural if !self.user.is_empty() => {
                return Err(invalid(
                    "user",
                    "must be empty for a procedural (app-wide) fact",
                ));
            }
            FactKind::Procedural => {}
            FactKind::Semantic => {
                Name::parse("user", self.user.as_str())?;
            }
        }
        positive("version", self.version)?;
        // Without versions, they follow as lines of their own; the import
        // checks that the current one came.
        if !self.versions.is_empty()
            && self.versions.last().map(|v| v.version) != Some(self.version)
        {
            return Err(invalid(
                "versions",
                "must end with the fact's current version",
            ));
        }
        if let Some(field) = self.versions.last().and_then(|v| self.disagreement(v)) {
            let n = self.versions.len() - 1;
            return Err(invalid(
                &format!("versions[{n}].{field}"),
                format!("must be the fact's {field}: it is the current version"),
            ));
        }
        for (n, pair) in self.versions.windows(2).enumerate() {
            if pair[1].version <= pair[0].version {
                return Err(invalid(
                    &format!("versions[{}].version", n + 1),
                    "versions must ascend",
                ));
            }
        }
        for (n, version) in self.versions.iter().enumerate() {
            version.check(&format!("versions[{n}]."), Some(&self.id))?;
        }
        for (n, id) in self.sources.iter().enumerate() {
            Id::parse(&format!("sources[{n}]"), id.as_str())?;
        }
        self.request.as_ref().map_or(Ok(()), CreatedBy::check)
    }
}

/// The owner of an item: on its own line it names it; inside its owner's
/// line (`inside`) it names nothing or the same.
fn owner(field: &str, owner: &str, inside: Option<&str>) -> Result<()> {
    match inside {
        None => Id::parse(field, owner).map(|_| ()),
        Some(id) if owner.is_empty() || owner == id => Ok(()),
        Some(id) => Err(invalid(field, format!("must be empty or {id:?}"))),
    }
}

impl Task {
    /// Checks the task's fields, named after `prefix`; `inside` is the
    /// session of the line holding it.
    fn check(&self, prefix: &str, inside: Option<&str>) -> Result<()> {
        owner(&format!("{prefix}session_id"), &self.session_id, inside)?;
        positive(&format!("{prefix}number"), self.number)?;
        TaskStatus::parse(&format!("{prefix}status"), &self.status)?;
        self.request.as_ref().map_or(Ok(()), CreatedBy::check)
    }
}

impl Cached {
    fn check(&self, prefix: &str, inside: Option<&str>) -> Result<()> {
        owner(&format!("{prefix}session_id"), &self.session_id, inside)?;
        if self.path.is_empty() {
            return Err(invalid(&format!("{prefix}path"), "must not be empty"));
        }
        Ok(())
    }
}

impl FactVersion {
    fn check(&self, prefix: &str, inside: Option<&str>) -> Result<()> {
        owner(&format!("{prefix}fact_id"), &self.fact_id, inside)?;
        positive(&format!("{prefix}version"), self.version)?;
        if !self.source_episode_ids.is_array() {
            return Err(invalid(
                &format!("{prefix}source_episode_ids"),
                "must be an array",
            ));
        }
        Ok(())
    }
}

/// The stored number of a fact kind's name.
pub fn fact_kind(field: &str, name: &str) -> Result<FactKind> {
    match name {
        "semantic" => Ok(FactKind::Semantic),
        "procedural" => Ok(FactKind::Procedural),
        other => Err(invalid(
            field,
            format!("must be semantic or procedural, got {other:?}"),
        )),
    }
}

/// The export name of a stored fact kind.
pub fn fact_kind_name(kind: FactKind) -> &'static str {
    match kind {
        FactKind::Semantic => "semantic",
        FactKind::Procedural => "procedural",
    }
}

fn optional_scope_name(field: &str, text: &str) -> Result<()> {
    if !text.is_empty() {
        ScopeName::parse(field, text)?;
    }
    Ok(())
}

fn object(field: &str, value: &Value) -> Result<()> {
    if value.is_object() {
        Ok(())
    } else {
        Err(invalid(field, "must be a JSON object"))
    }
}

fn hex(field: &str, text: &str) -> Result<()> {
    if text.len().is_multiple_of(2) && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(invalid(field, "must be hexadecimal"))
    }
}

fn positive(field: &str, n: i64) -> Result<()> {
    if n >= 1 {
        Ok(())
    } else {
        Err(invalid(field, format!("must be at least 1, got {n}")))
    }
}

fn counts(fields: &[(&str, i64)]) -> Result<()> {
    match fields.iter().find(|(_, n)| *n < 0) {
        Some((field, n)) => Err(invalid(field, format!("must not be negative, got {n}"))),
        None => Ok(()),
    }
}

fn invalid(field: &str, description: impl Into<String>) -> Error {
    Error::invalid(Reason::InvalidArgument, field, description)
}

/// Decodes the hex of a fingerprint checked by [`Record::check`].
pub fn unhex(text: &str) -> Vec<u8> {
    text.as_bytes()
        .chunks(2)
        .filter_map(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        })
        .collect()
}

/// The hex of a fingerprint.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_their_line() {
        let line = r#"{"kind":"memory_version","scope_type":"namespace","scope":"team","key":"a/b","version":2,"value":{"x":[1,"y"]},"deleted":false,"create_time":"2026-11-23T10:00:00.123456Z"}"#;
        let record: Record = serde_json::from_str(line).expect("parses");
        record.check().expect("valid");
        assert_eq!(record.kind(), "memory_version");
        let again: Record = serde_json::from_str(&serde_json::to_string(&record).expect("encodes"))
            .expect("parses");
        assert_eq!(again, record);
    }

    #[test]
    fn unknown_fields_and_bad_values_are_refused_by_name() {
        let extra = r#"{"kind":"execution","execution_id":"r1","flow_id":"","flow_name":"","create_time":"2026-11-23T10:00:00Z","colour":"red"}"#;
        let err = serde_json::from_str::<Record>(extra).expect_err("unknown field");
        assert!(err.to_string().contains("colour"), "{err}");

        let tombstone_with_value = r#"{"kind":"memory_version","scope_type":"namespace","scope":"team","key":"a","version":1,"value":1,"deleted":true,"create_time":"2026-11-23T10:00:00Z"}"#;
        let record: Record = serde_json::from_str(tombstone_with_value).expect("parses");
        assert!(
            matches!(record.check(), Err(Error::InvalidArgument { field, .. }) if field == "value")
        );

        let bad_scope = r#"{"kind":"memory_version","scope_type":"galaxy","scope":"team","key":"a","version":1,"value":1,"deleted":false,"create_time":"2026-11-23T10:00:00Z"}"#;
        let record: Record = serde_json::from_str(bad_scope).expect("parses");
        assert!(
            matches!(record.check(), Err(Error::InvalidArgument { field, .. }) if field == "scope_type")
        );
    }

    #[test]
    fn items_name_their_owner_on_their_own_line_and_nothing_else_inside_it() {
        let task = r#"{"kind":"task","number":1,"subject":"s","description":"","status":"pending","create_time":"2026-11-23T10:00:00Z","update_time":"2026-11-23T10:00:00Z"}"#;
        let record: Record = serde_json::from_str(task).expect("parses");
        assert!(
            matches!(record.check(), Err(Error::InvalidArgument { field, .. }) if field == "session_id")
        );
        let inside = r#"{"kind":"working_memory","session_id":"s1","goal":"","next_task":1,"update_time":"2026-11-23T10:00:00Z","cache":[{"session_id":"s2","path":"a","content":"","bytes":0,"update_time":"2026-11-23T10:00:00Z"}]}"#;
        let record: Record = serde_json::from_str(inside).expect("parses");
        assert!(
            matches!(record.check(), Err(Error::InvalidArgument { field, .. }) if field == "cache[0].session_id")
        );
        let version = r#"{"kind":"fact_version","fact_id":"f1","version":2,"deleted":false,"subject":"","predicate":"","object":"","content":"x","confidence":1.0,"source":"remember","source_episode_ids":[],"channels":[],"create_time":"2026-11-23T10:00:00Z"}"#;
        let record: Record = serde_json::from_str(version).expect("parses");
        record.check().expect("valid");
        assert_eq!(record.kind(), "fact_version");
    }

    #[test]
    fn a_fact_has_a_user_as_its_kind_says() {
        let fact = |kind: &str, user: &str| {
            let line = format!(
                r#"{{"kind":"fact","id":"f1","app":"bot","user":"{user}","fact_kind":"{kind}","subject":"","predicate":"","version":1,"deleted":false,"create_time":"2026-11-23T10:00:00Z","update_time":"2026-11-23T10:00:00Z"}}"#
            );
            serde_json::from_str::<Record>(&line)
                .expect("parses")
                .check()
        };
        fact("semantic", "alice").expect("a user's fact");
        fact("procedural", "").expect("an app's procedure");
        for (kind, user) in [("semantic", ""), ("procedural", "alice")] {
            assert!(
                matches!(fact(kind, user), Err(Error::InvalidArgument { field, .. }) if field == "user"),
                "{kind} of {user:?}"
            );
        }
    }

    #[test]
    fn headers_of_every_version_read_are_accepted() {
        let header = |version: u32| {
            let mut header = Header::new("t", "tenant".to_owned(), Utc::now());
            header.version = version;
            Record::Header(header).check()
        };
        header(1).expect("version 1");
        header(VERSION).expect("this version");
        assert!(
            matches!(header(VERSION + 1), Err(Error::InvalidArgument { field, .. }) if field == "version")
        );
        assert!(header(0).is_err());
    }

    #[test]
    fn fingerprints_survive_hex() {
        let bytes = [0u8, 1, 127, 128, 255];
        assert_eq!(unhex(&to_hex(&bytes)), bytes);
        assert!(hex("f", "0g").is_err());
    }
}
