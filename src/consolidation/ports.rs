//! What consolidation needs from persistence: rules and facts to read and
//! store, and a transaction whose primitives ([`FactTx`], [`RuleTx`]) the
//! run and apply algorithms in `run.rs` are written over once for every
//! backend. The store supplies the primitives and never decides anything
//! about episodes or facts.

use std::collections::{HashMap, HashSet};
use std::future::Future;

use chrono::{DateTime, Utc};

use super::classify::FactKey;
use super::types::{Fact, FactKind, FactPayload, FactVersion, Provenance, Rule};
use crate::context::Tenant;
use crate::error::Result;
use crate::memory::ports::RequestStamp;
use crate::sessions::Episode;

/// Which facts a listing returns.
#[derive(Debug, Clone, Default)]
pub struct FactFilter {
    pub app: Option<String>,
    pub user: Option<String>,
    pub kind: Option<FactKind>,
    /// Newest first (`after` then means "before").
    pub newest_first: bool,
}

/// How a run waits for another run of the same rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLock {
    /// Wait for it to finish (a `RunRule` call).
    Wait,
    /// Give up at once (the scheduler: someone else is on it).
    Try,
}

#[derive(Debug, Clone)]
pub struct RunRequest<'a> {
    pub rule_id: &'a str,
    /// The settled episode horizon: the run reads no cursor beyond it.
    pub up_to: i64,
    /// The most episodes one run reads.
    pub limit: i64,
    pub dry_run: bool,
    pub now: DateTime<Utc>,
    pub lock: RunLock,
    /// With an embedder and a threshold: Adds near a live fact become
    /// Updates of it.
    pub dedup: Option<&'a Dedup>,
}

/// What merging near-duplicate facts needs inside a run: the vectors of
/// the Adds' texts (embedded before the run's transaction, so no model call
/// holds it open), the model the stored vectors must be of, and how similar
/// counts as the same fact.
#[derive(Debug, Clone, Default)]
pub struct Dedup {
    pub model: String,
    /// Cosine similarity, 0 to 1.
    pub threshold: f32,
    /// By the text of the Add's payload ([`FactPayload::text`]).
    pub vectors: HashMap<String, Vec<f32>>,
}

/// A rule taken for a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Locked {
    /// Held until the transaction ends, watermark as of now.
    Rule(Rule),
    /// Another run holds it (only with [`RunLock::Try`]).
    Busy,
    /// There is no such rule.
    Missing,
}

/// What [`ConsolidationStore::create_rule`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum RuleCreation {
    /// Stored the new rule.
    Created,
    /// The id is taken by a rule another request made (nothing written).
    Taken,
    /// The id is the rule an earlier request with the same `request_id`
    /// and fingerprint made, as it is now.
    Repeated(Rule),
}

/// The persistence of rules and facts. Every method is scoped to one tenant.
pub trait ConsolidationStore: Clone + Send + Sync + 'static {
    /// The transaction runs, applies and fact deletes happen in.
    type Tx: RuleTx + Send;

    /// Begins a transaction confined to one tenant; dropped without
    /// [`FactTx::commit`], it is rolled back.
    fn begin(&self, tenant: &Tenant) -> impl Future<Output = Result<Self::Tx>> + Send;

    /// Stores a new rule, keyed by `request` when given (a request id is
    /// unique in its tenant). When the rule's id or the request id is
    /// taken nothing is written, and the rule an earlier request with the
    /// same request id made is told from another's (the request id with
    /// another fingerprint is `REQUEST_ID_REUSED`).
    fn create_rule(
        &self,
        tenant: &Tenant,
        rule: &Rule,
        request: Option<RequestStamp<'_>>,
    ) -> impl Future<Output = Result<RuleCreation>> + Send;

    fn get_rule(
        &self,
        tenant: &Tenant,
        id: &str,
    ) -> impl Future<Output = Result<Option<Rule>>> + Send;

    /// Rules in id order, after `after`.
    fn list_rules(
        &self,
        tenant: &Tenant,
        after: Option<&str>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Rule>>> + Send;

    /// Deletes a rule (its facts stay); false when there was none.
    fn delete_rule(&self, tenant: &Tenant, id: &str) -> impl Future<Output = Result<bool>> + Send;

    /// Every enabled rule of every tenant, for the scheduler.
    fn enabled_rules(&self) -> impl Future<Output = Result<Vec<(Tenant, Rule)>>> + Send;

    /// How many episodes (at most `at_most`) wait after a cursor.
    fn pending_episodes(
        &self,
        tenant: &Tenant,
        after: i64,
        up_to: i64,
        at_most: i64,
    ) -> impl Future<Output = Result<i64>> + Send;

    /// Live facts in id order (creation order), after `after`.
    fn list_facts(
        &self,
        tenant: &Tenant,
        filter: &FactFilter,
        after: Option<&str>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Fact>>> + Send;

    /// A fact (live or tombstoned) at its current version, with up to
    /// `limit` of its versions after version `after`, oldest first, read
    /// only as far as a page carries (up to the first version
    /// [`paging::next_token`](crate::paging::next_token) would cut).
    fn get_fact(
        &self,
        tenant: &Tenant,
        id: &str,
        after: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Option<(Fact, Vec<FactVersion>)>>> + Send;
}

/// The fact primitives a backend runs inside one transaction.
pub trait FactTx: Send {
    /// Keeps every other transaction that changes these owners' facts
    /// (applying deltas, a rule run, forgetting a user) out until this one
    /// ends, so that two never hold facts the other waits for. `owners` are
    /// (app, user), in any order; taken again within a transaction, only
    /// owners it already holds.
    fn hold_owners(
        &mut self,
        tenant: &Tenant,
        owners: &[(&str, &str)],
    ) -> impl Future<Output = Result<()>> + Send;

    /// Live facts of an owner named by `ids`: fact ids, or ids of episodes
    /// a version of the fact came from. Distinct, in the order named, and
    /// held against other writers (a `DeleteFact`) until the transaction
    /// ends, so each is still live when its new version is written.
    fn resolve(
        &mut self,
        tenant: &Tenant,
        app: &str,
        user: &str,
        ids: &[String],
    ) -> impl Future<Output = Result<Vec<String>>> + Send;

    /// The ids of the live facts with these keys (the newest one per key).
    fn live_facts(
        &mut self,
        tenant: &Tenant,
        keys: &[FactKey],
    ) -> impl Future<Output = Result<HashMap<FactKey, String>>> + Send;

    /// The ids and stored vectors (of `model`) of an owner's live facts of
    /// one kind, at most 20,000 of the newest: what an Add is compared
    /// with when consolidation merges near-duplicates.
    fn fact_vectors(
        &mut self,
        tenant: &Tenant,
        owner: (&str, &str),
        kind: FactKind,
        model: &str,
    ) -> impl Future<Output = Result<Vec<(String, Vec<u8>)>>> + Send;

    /// How many live facts of a kind an owner has; until the transaction
    /// ends, no other transaction counting the same owner's facts gets
    /// past this, so a count checked against a limit stays true for the
    /// insert that follows.
    fn count_owned_facts(
        &mut self,
        tenant: &Tenant,
        owner: (&str, &str),
        kind: FactKind,
    ) -> impl Future<Output = Result<i64>> + Send;

    /// Stores a new fact at version 1.
    fn insert_fact(
        &mut self,
        tenant: &Tenant,
        id: &str,
        payload: &FactPayload,
        provenance: &Provenance,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// A new version of a fact: the payload, or a tombstone (`None`).
    fn write_version(
        &mut self,
        tenant: &Tenant,
        id: &str,
        payload: Option<&FactPayload>,
        provenance: &Provenance,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Locks a live fact against concurrent writers until the transaction
    /// ends; `false` when there is no live fact by that id.
    fn lock_live_fact(
        &mut self,
        tenant: &Tenant,
        id: &str,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// The id of the fact of an owner and kind that `request_id` created,
    /// with the fingerprint kept (see [`FactTx::keep_request`]).
    fn fact_of_request(
        &mut self,
        tenant: &Tenant,
        owner: (&str, &str),
        kind: FactKind,
        request_id: &str,
    ) -> impl Future<Output = Result<Option<(String, Vec<u8>)>>> + Send;

    /// Keeps the request (its id and fingerprint) that created fact `id`,
    /// so that a repeat of the request finds it.
    fn keep_request(
        &mut self,
        tenant: &Tenant,
        id: &str,
        request: &RequestStamp<'_>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// A fact at its newest version (live or tombstoned).
    fn fact(
        &mut self,
        tenant: &Tenant,
        id: &str,
    ) -> impl Future<Output = Result<Option<Fact>>> + Send;

    fn commit(self) -> impl Future<Output = Result<()>> + Send;

    fn rollback(self) -> impl Future<Output = Result<()>> + Send;
}

/// The rule primitives a backend runs inside the transaction of a run.
pub trait RuleTx: FactTx {
    /// Locks the rule against other runs and reads it.
    fn lock_rule(
        &mut self,
        tenant: &Tenant,
        id: &str,
        lock: RunLock,
    ) -> impl Future<Output = Result<Locked>> + Send;

    /// Episodes with `after < cursor <= up_to`, in cursor order: up to
    /// `limit`, and only as far as a page carries (see
    /// [`paging::filled`](crate::paging::filled)), so a run over large
    /// episodes holds a few megabytes of them, not a gigabyte.
    fn episodes(
        &mut self,
        tenant: &Tenant,
        after: i64,
        up_to: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<Episode>>> + Send;

    /// Which of these episodes (by id) are stored now. A run asks once
    /// it holds its owners, so an episode that a forget removed after
    /// `episodes` read it (the forget holds the same owners first) is not
    /// made a fact of a forgotten user. On SQLite the single writer read
    /// them in this same transaction alone: all of them.
    fn still_stored(
        &mut self,
        tenant: &Tenant,
        ids: &[String],
    ) -> impl Future<Output = Result<HashSet<String>>> + Send;

    /// Moves the rule's watermark and counts what it promoted.
    fn advance(
        &mut self,
        tenant: &Tenant,
        id: &str,
        watermark: i64,
        promoted: i64,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;
}
