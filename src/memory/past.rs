//! Memory as it was: `Get`, `List` and `ListScopes` at a point in the past
//! (`as_of`), and `ForkScope`, which copies a scope's state at a point into
//! a new scope.
//!
//! A point is a time or a revision of the change feed. A revision is only
//! answered once the feed has settled up to it, so two reads at the same
//! revision always agree, however many writers were racing when it was
//! taken; a time names what had committed by then. What was current at a
//! point but has been purged since is reported as purged, never skipped.

use chrono::{DateTime, NaiveDate, Utc};

use super::audit::{AuditRecord, Operation};
use super::ports::{Fork, Forked, ListQuery, MemoryStore, Past, Point};
use super::service::{ScopeSelector, key_deleted, refuse_in_checkpoint};
use super::types::{AsOf, Entry, Key, KeyPrefix, Scope};
use super::{Memory, now_micros};
use crate::context::CallerContext;
use crate::error::{Error, Reason, Result};
use crate::paging::{self, ListPage};
use crate::ports::{Feed, Feeds};

/// The time bound of a read at a revision: later than any write.
fn end_of_time() -> DateTime<Utc> {
    NaiveDate::from_ymd_opt(9999, 12, 31)
        .and_then(|day| day.and_hms_opt(0, 0, 0))
        .map_or(DateTime::<Utc>::MAX_UTC, |at| at.and_utc())
}

/// What a fork did.
#[derive(Debug, Clone)]
pub struct ForkOutcome {
    /// The keys copied.
    pub keys: i64,
    /// The revision the source was read at.
    pub revision: i64,
    /// The audit record written in the target scope.
    pub record: AuditRecord,
}

impl<S: MemoryStore + Feeds> Memory<S> {
    /// The bounds the store reads at. A revision beyond the settled feed is
    /// `OUT_OF_RANGE`: what it names could still change.
    pub(super) async fn point(&self, as_of: AsOf) -> Result<Point> {
        match as_of {
            AsOf::Time(time) => Ok(Point {
                revision: i64::MAX,
                time,
            }),
            AsOf::Revision(revision) => {
                let settled = self.store().settled(Feed::Changes).await?;
                if revision > settled {
                    return Err(Error::OutOfRange {
                        reason: Reason::RevisionNotReached,
                        message: format!(
                            "as_of.revision {revision} has not been reached; the newest revision is {settled}"
                        ),
                    });
                }
                Ok(Point {
                    revision,
                    time: end_of_time(),
                })
            }
        }
    }

    /// A key's value at a point. `NOT_FOUND` with `KEY_NOT_FOUND` when it
    /// had none, `KEY_DELETED` when it was a tombstone, `VERSION_PURGED`
    /// when the version current then has been purged since.
    pub async fn get_as_of(
        &self,
        ctx: &CallerContext,
        selector: ScopeSelector,
        key: &Key,
        as_of: AsOf,
    ) -> Result<Entry> {
        refuse_in_checkpoint(ctx)?;
        let scope = selector.resolve(ctx)?;
        let at = self.point(as_of).await?;
        match self.store().get_at(&ctx.tenant, &scope, key, at).await? {
            Some(Past::Entry(entry)) if entry.deleted => Err(key_deleted(key, entry.version)),
            Some(Past::Entry(entry)) => Ok(entry),
            Some(Past::Purged(_)) => Err(purged_since(key, as_of)),
            None => Err(Error::NotFound {
                reason: Reason::KeyNotFound,
                message: format!("key {:?} did not exist at {as_of}", key.as_str()),
                metadata: vec![("key", key.as_str().to_owned())],
            }),
        }
    }

    /// A page of the keys live at a point, with the keys whose value then
    /// was purged since, in key order.
    #[allow(clippy::too_many_arguments)]
    pub async fn list_as_of(
        &self,
        ctx: &CallerContext,
        selector: ScopeSelector,
        prefix: &KeyPrefix,
        include_reserved: bool,
        as_of: AsOf,
        page_size: i32,
        page_token: &str,
    ) -> Result<ListPage<Past>> {
        refuse_in_checkpoint(ctx)?;
        let scope = selector.resolve(ctx)?;
        let limit = paging::page_size(page_size)?;
        let query = paging::query_digest(&[
            "list",
            scope.scope_type.as_str(),
            scope.name.as_str(),
            prefix.as_str(),
            if include_reserved { "reserved" } else { "" },
            &as_of.to_string(),
        ]);
        let after: Option<String> = paging::decode_token(&query, page_token)?;
        let at = self.point(as_of).await?;
        let mut items = self
            .store()
            .list_at(
                &ctx.tenant,
                &ListQuery {
                    scope: &scope,
                    prefix,
                    after: after.as_deref(),
                    limit: limit + 1,
                    include_reserved,
                    descending: false,
                },
                at,
            )
            .await?;
        let next_page_token = paging::next_token(&mut items, limit, |last| {
            let key = match last {
                Past::Entry(entry) => entry.key.as_str(),
                Past::Purged(key) => key.as_str(),
            };
            paging::encode_token(&query, key)
        });
        Ok(ListPage {
            items,
            next_page_token,
        })
    }

    /// Copies the live keys of `source` at a point (now when `as_of` is
    /// unset) into `target`, which must have no keys, as version 1 of each,
    /// and records the fork in the target's audit trail. Refused, writing
    /// nothing, when a key's value at the point has been purged since.
    pub async fn fork_scope(
        &self,
        ctx: &CallerContext,
        source: ScopeSelector,
        target: Scope,
        as_of: Option<AsOf>,
    ) -> Result<ForkOutcome> {
        refuse_in_checkpoint(ctx)?;
        let source = source.resolve(ctx)?;
        if source == target {
            return Err(Error::invalid(
                Reason::InvalidArgument,
                "target_scope",
                "must differ from the source scope",
            ));
        }
        // Read at a settled revision, so the copy is one consistent state:
        // the one given, else the newest (with the time's bound, if any).
        let at = match as_of {
            Some(revision @ AsOf::Revision(_)) => self.point(revision).await?,
            Some(AsOf::Time(time)) => Point {
                revision: self.store().settled(Feed::Changes).await?,
                time,
            },
            None => Point {
                revision: self.store().settled(Feed::Changes).await?,
                time: end_of_time(),
            },
        };
        let as_of = as_of.unwrap_or(AsOf::Revision(at.revision));
        let now = now_micros();
        let mut record = AuditRecord::new(Operation::Fork, &target, now);
        record.source_scope_type = source.scope_type.as_str().to_owned();
        record.source_scope = source.name.as_str().to_owned();
        record.as_of_revision = at.revision;
        if let AsOf::Time(time) = as_of {
            record.as_of_time = Some(time);
        }
        let fork = Fork {
            source: &source,
            target: &target,
            at,
            now,
        };
        match self.store().fork(&ctx.tenant, &fork, record).await? {
            Forked::Copied(record) => Ok(ForkOutcome {
                keys: record.keys_affected,
                revision: at.revision,
                record: *record,
            }),
            Forked::TargetNotEmpty => Err(Error::FailedPrecondition {
                reason: Reason::ScopeNotEmpty,
                message: format!(
                    "the target scope {} {:?} already has keys; fork into a new scope",
                    target.scope_type.as_str(),
                    target.name.as_str()
                ),
            }),
            Forked::Purged(keys) => Err(Error::FailedPrecondition {
                reason: Reason::VersionPurged,
                message: format!(
                    "the values at {as_of} of {} have been purged since; nothing was copied",
                    keys.iter()
                        .map(|key| format!("{key:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
            Forked::SourceChanged => Err(Error::Conflict {
                reason: Reason::SourceChanged,
                message: "the source was purged or the target written while the fork ran; \
                          nothing was copied, retry"
                    .to_owned(),
            }),
        }
    }
}

fn purged_since(key: &Key, as_of: AsOf) -> Error {
    Error::NotFound {
        reason: Reason::VersionPurged,
        message: format!(
            "the version of key {:?} current at {as_of} has been purged since",
            key.as_str()
        ),
        metadata: vec![("key", key.as_str().to_owned())],
    }
}
