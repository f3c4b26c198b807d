//! `MemoryService.Watch` as a feed: a scope's changes by revision.

use super::convert::{json_to_proto, timestamp};
use super::feed::Feed;
use crate::context::CallerContext;
use crate::error::Result;
use crate::memory::{Change, ChangeKind, Memory, WATCH_BATCH, WatchStart};
use crate::ports::Store;
use crate::proto;

/// The changes of one watched scope.
pub struct Changes<S> {
    pub memory: Memory<S>,
    pub ctx: CallerContext,
    pub start: WatchStart,
}

impl<S: Store> Feed for Changes<S> {
    type Item = Change;
    type Message = proto::WatchResponse;
    const POSITION: &'static str = "revision";
    const BATCH: i64 = WATCH_BATCH;

    fn position(change: &Change) -> i64 {
        change.revision
    }

    async fn page(&self, after: i64, up_to: i64) -> Result<Vec<Change>> {
        self.memory
            .changes(&self.ctx, &self.start, after, up_to)
            .await
    }

    fn message(change: Change) -> proto::WatchResponse {
        proto::WatchResponse {
            revision: change.revision,
            kind: match change.kind {
                ChangeKind::Set => proto::ChangeKind::Set,
                ChangeKind::Delete => proto::ChangeKind::Delete,
                ChangeKind::Purge => proto::ChangeKind::Purge,
                ChangeKind::Compact => proto::ChangeKind::Compact,
            } as i32,
            key: change.key.as_str().to_owned(),
            version: change.version,
            value: change.value.as_ref().map(|v| json_to_proto(v.json())),
            versions_deleted: change.versions_deleted,
            create_time: Some(timestamp(change.create_time)),
        }
    }
}
