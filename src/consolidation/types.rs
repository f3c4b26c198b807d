//! Rules, deltas and facts.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::error::{Error, Reason, Result, refuse_nul, refuse_over};

/// What kind of knowledge a fact is. Stored as these numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FactKind {
    /// About a user: preferences, facts of their world.
    Semantic = 1,
    /// How an app does things; app-wide (no user).
    Procedural = 2,
}

impl FactKind {
    pub fn from_i16(n: i16) -> Option<Self> {
        match n {
            1 => Some(FactKind::Semantic),
            2 => Some(FactKind::Procedural),
            _ => None,
        }
    }

    pub fn as_i16(self) -> i16 {
        self as i16
    }
}

/// When the scheduler runs a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cadence {
    /// Once at least this many episodes arrived after the watermark.
    EveryNEpisodes(i64),
    /// A five-field cron schedule in UTC.
    Cron(String),
}

/// A consolidation rule as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub id: String,
    pub filter: String,
    pub cadence: Cadence,
    pub then_emits: Vec<String>,
    pub kind: FactKind,
    pub confidence: f64,
    pub enabled: bool,
    /// The cursor of the last episode a run has seen.
    pub watermark: i64,
    pub episodes_promoted: i64,
    pub create_time: DateTime<Utc>,
    pub last_run_time: Option<DateTime<Utc>>,
}

impl crate::paging::Weigh for Rule {
    fn weight(&self) -> usize {
        self.id.len()
            + self.filter.len()
            + self.then_emits.iter().map(String::len).sum::<usize>()
            + 96
    }
}

/// What a fact says, and whose it is.
#[derive(Debug, Clone, PartialEq)]
pub struct FactPayload {
    pub app: String,
    /// Empty for app-wide (procedural) facts.
    pub user: String,
    pub kind: FactKind,
    pub subject: String,
    pub predicate: String,
    pub object: String,
    pub content: Value,
    pub channels: Vec<String>,
}

/// The most bytes of a fact's subject, predicate or object. The subject
/// and predicate are a fact's key, indexed together on Postgres, whose
/// B-tree entries hold at most 2,704 bytes.
pub const MAX_TRIPLE_PART_BYTES: usize = 1024;

/// Checks one part of a fact's triple (`field` names it as the client
/// spelled it): at most [`MAX_TRIPLE_PART_BYTES`], and no NUL character,
/// which Postgres's text cannot hold.
pub fn check_triple_part(field: &str, value: &str) -> Result<()> {
    refuse_over(field, value, MAX_TRIPLE_PART_BYTES)?;
    refuse_nul(field, value)
}

impl FactPayload {
    /// Checks the triple of a payload at `field` ([`check_triple_part`]).
    pub fn check_triple(&self, field: &str) -> Result<()> {
        check_triple_part(&format!("{field}.subject"), &self.subject)?;
        check_triple_part(&format!("{field}.predicate"), &self.predicate)?;
        check_triple_part(&format!("{field}.object"), &self.object)
    }

    /// The text a fact is searched and embedded by: subject, predicate,
    /// object and the strings and numbers of its content.
    pub fn text(&self) -> String {
        fact_text(&self.subject, &self.predicate, &self.object, &self.content)
    }
}

/// A fact's text, from its parts (see [`FactPayload::text`]).
pub fn fact_text(subject: &str, predicate: &str, object: &str, content: &Value) -> String {
    let mut out = String::new();
    crate::search::fact_strings(subject, predicate, object, content, &mut |s| {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(s);
    });
    out
}

/// Where a delta comes from; every delta must carry all of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Provenance {
    pub source_episode_ids: Vec<String>,
    pub promotion_ts: DateTime<Utc>,
    /// The rule, or `remember` for facts stated directly.
    pub rule_id: String,
    pub confidence: f64,
}

impl Provenance {
    /// Refuses a provenance with a part missing.
    pub fn check(&self, field: &str) -> Result<()> {
        if self.source_episode_ids.is_empty() {
            return Err(Error::invalid(
                Reason::MissingProvenance,
                format!("{field}.source_episode_ids"),
                "must name at least one source episode",
            ));
        }
        if self.rule_id.is_empty() {
            return Err(Error::invalid(
                Reason::MissingProvenance,
                format!("{field}.rule_id"),
                "is required",
            ));
        }
        if !(self.confidence > 0.0 && self.confidence <= 1.0) {
            return Err(Error::invalid(
                Reason::MissingProvenance,
                format!("{field}.confidence"),
                format!("must be above 0 and at most 1, got {}", self.confidence),
            ));
        }
        Ok(())
    }
}

/// A typed change to the facts, as a rule run or a client proposes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    Add {
        payload: FactPayload,
        provenance: Provenance,
    },
    /// Supersedes the facts named by `replaces` (fact ids, or ids of the
    /// episodes they came from) with a new version.
    Update {
        payload: FactPayload,
        replaces: Vec<String>,
        provenance: Provenance,
    },
    /// Tombstones the facts named by `replaces`.
    Delete {
        app: String,
        user: String,
        replaces: Vec<String>,
        provenance: Provenance,
    },
    /// Audit only: the episode was seen and deliberately not promoted.
    Noop { provenance: Provenance },
}

impl Delta {
    /// The variant's name, as the proto oneof spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Delta::Add { .. } => "add",
            Delta::Update { .. } => "update",
            Delta::Delete { .. } => "delete",
            Delta::Noop { .. } => "noop",
        }
    }

    /// The owner (app, user) whose stored facts the delta changes: none
    /// for an add, which only inserts, nor for a noop.
    pub fn owner(&self) -> Option<(&str, &str)> {
        match self {
            Delta::Update { payload, .. } => Some((&payload.app, &payload.user)),
            Delta::Delete { app, user, .. } => Some((app, user)),
            Delta::Add { .. } | Delta::Noop { .. } => None,
        }
    }

    pub fn provenance(&self) -> &Provenance {
        match self {
            Delta::Add { provenance, .. }
            | Delta::Update { provenance, .. }
            | Delta::Delete { provenance, .. }
            | Delta::Noop { provenance } => provenance,
        }
    }
}

/// One version of a fact.
#[derive(Debug, Clone, PartialEq)]
pub struct FactVersion {
    pub version: i64,
    pub deleted: bool,
    pub subject: String,
    pub predicate: String,
    pub object: String,
    pub content: Value,
    pub confidence: f64,
    /// `remember` or the rule id.
    pub source: String,
    pub source_episode_ids: Vec<String>,
    pub channels: Vec<String>,
    pub create_time: DateTime<Utc>,
}

/// A fact at its newest version.
#[derive(Debug, Clone, PartialEq)]
pub struct Fact {
    pub id: String,
    pub app: String,
    pub user: String,
    pub kind: FactKind,
    pub current: FactVersion,
    pub create_time: DateTime<Utc>,
}

impl crate::paging::Weigh for FactVersion {
    fn weight(&self) -> usize {
        [&self.subject, &self.predicate, &self.object, &self.source]
            .iter()
            .map(|text| text.len())
            .sum::<usize>()
            + self
                .source_episode_ids
                .iter()
                .map(String::len)
                .sum::<usize>()
            + self.channels.iter().map(String::len).sum::<usize>()
            + crate::paging::json_weight(&self.content)
            + 64
    }
}

impl crate::paging::Weigh for Fact {
    fn weight(&self) -> usize {
        self.id.len() + self.app.len() + self.user.len() + self.current.weight() + 32
    }
}

/// What applying deltas did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    pub facts_added: i64,
    pub facts_updated: i64,
    pub facts_deleted: i64,
    /// The facts written, in delta order.
    pub fact_ids: Vec<String>,
}

/// What a rule run saw and did.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    pub deltas: Vec<Delta>,
    pub episodes_scanned: i64,
    pub episodes_matched: i64,
    /// The watermark after the run (unchanged on a dry run).
    pub watermark: i64,
    /// More episodes wait beyond this batch.
    pub more: bool,
    pub applied: Applied,
}

pub fn rule_not_found(id: &str) -> Error {
    Error::NotFound {
        reason: Reason::RuleNotFound,
        message: format!("rule {id:?} does not exist"),
        metadata: vec![("rule_id", id.to_owned())],
    }
}

pub fn rule_exists(id: &str) -> Error {
    Error::AlreadyExists {
        reason: Reason::RuleExists,
        message: format!("rule {id:?} already exists"),
    }
}
