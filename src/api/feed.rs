//! The transport side of the ordered feeds (`MemoryService.Watch`,
//! `EpisodeService.TailEpisodes`): a producer task reads pages from the
//! store up to the feed's settled horizon and pushes them into a small
//! bounded buffer; the stream handed to tonic drains it.
//!
//! Server memory per stream is the buffer (at most `buffer` items and
//! about 2 MiB of them) plus one page (at most `BATCH` items and about
//! 2 MiB of them) and the HTTP/2 send buffer, bounded by hyper, whatever
//! the write rate. A consumer that
//! leaves the buffer full for longer than the stall timeout is cut off with
//! CONSUMER_TOO_SLOW, and shutdown ends the stream with UNAVAILABLE; both
//! say where to resume (the last position actually handed to the client),
//! and both jump the queue so the client learns at once instead of after a
//! stale backlog.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::error::{ERROR_DOMAIN, to_status};
use crate::error::{Error, Reason, Result};

/// One ordered feed: how to read a page of it and how to send an item.
pub trait Feed: Send + 'static {
    type Item: Send + crate::paging::Weigh + 'static;
    type Message: Send + 'static;
    /// What a position is called (`revision`, `cursor`): the ErrorInfo
    /// metadata key is `resume_<this>`.
    const POSITION: &'static str;
    /// The most items `page` returns; fewer means the range is exhausted,
    /// unless the page stopped at the bytes a page holds
    /// ([`paging::more`](crate::paging::more)).
    const BATCH: i64;

    fn position(item: &Self::Item) -> i64;

    /// Items with `after < position <= up_to`, in order, at most `BATCH`
    /// and about a page's bytes of them.
    fn page(&self, after: i64, up_to: i64) -> impl Future<Output = Result<Vec<Self::Item>>> + Send;

    fn message(item: Self::Item) -> Self::Message;
}

/// How a stream is bounded.
#[derive(Debug, Clone)]
pub struct FeedOptions {
    /// Cancelled when the server starts shutting down.
    pub shutdown: CancellationToken,
    /// How long the producer waits for a client that does not read.
    pub stall: Duration,
    /// Items buffered per stream.
    pub buffer: usize,
}

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

fn resume_status(code: Code, reason: Reason, message: &str, position: &str, last: i64) -> Status {
    let details = ErrorDetails::with_error_info(
        reason.as_str(),
        ERROR_DOMAIN,
        HashMap::from([(format!("resume_{position}"), last.to_string())]),
    );
    Status::with_error_details(
        code,
        format!("{message}; resume after {position} {last}"),
        details,
    )
}

/// The bytes of items a stream buffers, at most (an item bigger than this
/// is buffered alone): with values of a megabyte, `buffer` items would
/// otherwise be hundreds of megabytes per slow client.
const BUFFER_BYTES: usize = crate::paging::PAGE_BYTES;

/// A buffered item with its share of [`BUFFER_BYTES`], given back when the
/// item is handed to tonic.
type Buffered<T> = (T, OwnedSemaphorePermit);

pub struct FeedStream<F: Feed> {
    items: mpsc::Receiver<Buffered<F::Item>>,
    shared: Arc<Shared>,
    /// The last position handed to tonic: where a client should resume.
    last: i64,
    done: bool,
}

impl<F: Feed> FeedStream<F> {
    fn ending(&mut self) -> Option<Status> {
        let ending = self.shared.take()?;
        self.done = true;
        Some(match ending {
            Ending::TooSlow => resume_status(
                Code::ResourceExhausted,
                Reason::ConsumerTooSlow,
                "the client did not read the stream fast enough",
                F::POSITION,
                self.last,
            ),
            Ending::ShuttingDown => resume_status(
                Code::Unavailable,
                Reason::ShuttingDown,
                "the server is shutting down",
                F::POSITION,
                self.last,
            ),
            Ending::Failed(err) => to_status(err),
        })
    }
}

impl<F: Feed> Stream for FeedStream<F> {
    type Item = Result<F::Message, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(status) = self.ending() {
            return Poll::Ready(Some(Err(status)));
        }
        match self.items.poll_recv(cx) {
            Poll::Ready(Some((item, bytes))) => {
                drop(bytes);
                self.last = F::position(&item);
                Poll::Ready(Some(Ok(F::message(item))))
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

/// Starts the producer after position `after` and returns the stream for
/// tonic.
pub fn spawn<F: Feed>(
    feed: F,
    after: i64,
    horizon: watch::Receiver<i64>,
    options: FeedOptions,
) -> FeedStream<F> {
    let (sender, items) = mpsc::channel(options.buffer.max(1));
    let shared = Arc::new(Shared::default());
    let bytes = Arc::new(Semaphore::new(BUFFER_BYTES));
    tokio::spawn(produce(
        feed,
        after,
        horizon,
        (sender, bytes),
        shared.clone(),
        options,
    ));
    FeedStream {
        items,
        shared,
        last: after,
        done: false,
    }
}

async fn produce<F: Feed>(
    feed: F,
    mut cursor: i64,
    mut horizon: watch::Receiver<i64>,
    (sender, bytes): (mpsc::Sender<Buffered<F::Item>>, Arc<Semaphore>),
    shared: Arc<Shared>,
    options: FeedOptions,
) {
    loop {
        let up_to = *horizon.borrow_and_update();
        while cursor < up_to {
            let page = match feed.page(cursor, up_to).await {
                Ok(page) => page,
                Err(err) => return shared.end(Ending::Failed(err)),
            };
            // A page that stopped for its bytes is not the range's end:
            // skipping to `up_to` then would leave a gap in the feed.
            let complete = !crate::paging::more(&page, F::BATCH);
            for item in page {
                let position = F::position(&item);
                // Room for the item in the buffer's count and its bytes.
                let weight = crate::paging::Weigh::weight(&item).min(BUFFER_BYTES);
                let share = u32::try_from(weight).unwrap_or(u32::MAX);
                let send = async {
                    let permit = bytes.clone().acquire_many_owned(share).await.ok()?;
                    sender.send((item, permit)).await.ok()
                };
                tokio::select! {
                    sent = tokio::time::timeout(options.stall, send) => match sent {
                        Ok(Some(())) => {}
                        Ok(None) => return, // the client went away
                        Err(_) => return shared.end(Ending::TooSlow),
                    },
                    () = options.shutdown.cancelled() => return shared.end(Ending::ShuttingDown),
                }
                cursor = position;
            }
            if complete {
                cursor = up_to;
            }
        }
        tokio::select! {
            changed = horizon.changed() => if changed.is_err() {
                return shared.end(Ending::Failed(Error::internal("the feed horizon stopped")));
            },
            () = options.shutdown.cancelled() => return shared.end(Ending::ShuttingDown),
            () = sender.closed() => return,
        }
    }
}
