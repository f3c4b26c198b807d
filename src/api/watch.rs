//! The transport side of `MemoryService.Watch`: a producer task reads the
//! scope's changes from the store up to the settled horizon and pushes them
//! into a small bounded buffer; the stream handed to tonic drains it.
//!
//! Server memory per watcher is the buffer plus one page (and the HTTP/2
//! send buffer, bounded by hyper), whatever the write rate. A consumer that leaves the buffer full for longer than the
//! stall timeout is cut off with CONSUMER_TOO_SLOW, and shutdown ends the
//! stream with UNAVAILABLE; both say which revision to resume after (the
//! last one actually handed to the client), and both jump the queue so the
//! client learns at once instead of after a stale backlog.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::convert::{json_to_proto, timestamp};
use super::error::{ERROR_DOMAIN, to_status};
use crate::context::CallerContext;
use crate::error::{Error, Reason};
use crate::memory::{Change, ChangeKind, Memory, WATCH_BATCH, WatchStart};
use crate::proto;
use crate::store::Store;

/// Why the producer stopped early.
enum Ending {
    TooSlow,
    ShuttingDown,
    Failed(Error),
}

/// Shared between the producer and the stream.
#[derive(Default)]
struct Shared {
    ending: Mutex<Option<Ending>>,
}

impl Shared {
    fn end(&self, ending: Ending) {
        if let Ok(mut slot) = self.ending.lock() {
            slot.get_or_insert(ending);
        }
    }

    fn take(&self) -> Option<Ending> {
        self.ending.lock().ok().and_then(|mut slot| slot.take())
    }
}

fn resume_status(code: Code, reason: Reason, message: &str, resume_revision: i64) -> Status {
    let details = ErrorDetails::with_error_info(
        reason.as_str(),
        ERROR_DOMAIN,
        HashMap::from([("resume_revision".to_owned(), resume_revision.to_string())]),
    );
    Status::with_error_details(
        code,
        format!("{message}; resume after revision {resume_revision}"),
        details,
    )
}

pub struct WatchStream {
    changes: mpsc::Receiver<Change>,
    shared: Arc<Shared>,
    /// The last revision handed to tonic: where a client should resume.
    last: i64,
    done: bool,
}

impl WatchStream {
    fn ending(&mut self) -> Option<Status> {
        let ending = self.shared.take()?;
        self.done = true;
        Some(match ending {
            Ending::TooSlow => resume_status(
                Code::ResourceExhausted,
                Reason::ConsumerTooSlow,
                "the client did not read the change feed fast enough",
                self.last,
            ),
            Ending::ShuttingDown => resume_status(
                Code::Unavailable,
                Reason::ShuttingDown,
                "the server is shutting down",
                self.last,
            ),
            Ending::Failed(err) => to_status(err),
        })
    }
}

impl Stream for WatchStream {
    type Item = Result<proto::WatchResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(status) = self.ending() {
            return Poll::Ready(Some(Err(status)));
        }
        match self.changes.poll_recv(cx) {
            Poll::Ready(Some(change)) => {
                self.last = change.revision;
                Poll::Ready(Some(Ok(change_to_proto(change))))
            }
            Poll::Ready(None) => {
                self.done = true;
                let status = self.ending();
                Poll::Ready(status.map(Err))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

fn change_to_proto(change: Change) -> proto::WatchResponse {
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

/// Starts the producer and returns the stream for tonic.
pub fn spawn<S: Store>(
    memory: Memory<S>,
    ctx: CallerContext,
    start: WatchStart,
    shutdown: CancellationToken,
    stall: Duration,
    buffer: usize,
) -> WatchStream {
    let (sender, changes) = mpsc::channel(buffer);
    let shared = Arc::new(Shared::default());
    let last = start.after;
    tokio::spawn(produce(
        memory,
        ctx,
        start,
        sender,
        shared.clone(),
        shutdown,
        stall,
    ));
    WatchStream {
        changes,
        shared,
        last,
        done: false,
    }
}

async fn produce<S: Store>(
    memory: Memory<S>,
    ctx: CallerContext,
    mut start: WatchStart,
    sender: mpsc::Sender<Change>,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    stall: Duration,
) {
    let mut cursor = start.after;
    loop {
        let up_to = *start.horizon.borrow_and_update();
        while cursor < up_to {
            let page = match memory.changes(&ctx, &start, cursor, up_to).await {
                Ok(page) => page,
                Err(err) => return shared.end(Ending::Failed(err)),
            };
            let complete = (page.len() as i64) < WATCH_BATCH;
            for change in page {
                let revision = change.revision;
                tokio::select! {
                    sent = tokio::time::timeout(stall, sender.send(change)) => match sent {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => return, // the client went away
                        Err(_) => return shared.end(Ending::TooSlow),
                    },
                    () = shutdown.cancelled() => return shared.end(Ending::ShuttingDown),
                }
                cursor = revision;
            }
            if complete {
                cursor = up_to;
            }
        }
        tokio::select! {
            changed = start.horizon.changed() => if changed.is_err() {
                return shared.end(Ending::Failed(Error::internal("the change horizon stopped")));
            },
            () = shutdown.cancelled() => return shared.end(Ending::ShuttingDown),
            () = sender.closed() => return,
        }
    }
}
