//! Following a live stream (`episodes tail`, `memory watch`) until Ctrl-C
//! or `--limit`. When the stream breaks (the server shuts down for a
//! rolling upgrade or is killed, the connection drops, the server sheds a
//! consumer too slow to keep up) it is opened again from the last position
//! printed, after a pause that doubles from 50 ms to 2 s while the server
//! stays away, as the Python and Go clients do: nothing is missed or
//! printed twice. `--no-reconnect` stops at the break instead. Either way
//! the position to resume from is printed on stderr when it stops.

use std::time::Duration;

use tonic::codec::Streaming;
use tonic::{Code, Status};
use tonic_types::StatusExt;

use super::{CliResult, retry};

/// The first pause before reconnecting, and the longest.
const DELAY: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));

/// How one live stream resumes.
pub(crate) struct Follow {
    /// The flag a later command resumes with (`--cursor`).
    pub flag: &'static str,
    /// The `ErrorInfo` metadata key where a stream that started "now" says
    /// where it stood when it broke (`resume_cursor`).
    pub resume_key: &'static str,
    /// Whether a broken stream is opened again.
    pub reconnect: bool,
    /// Stop after this many items.
    pub limit: Option<usize>,
}

/// Whether opening the stream again can mend `status`: the server is
/// unavailable (shutting down, restarting, unreachable), it shed this
/// consumer as too slow, or the connection broke under the call
/// ([`retry::broken`]).
fn mendable(status: &Status) -> bool {
    let reason = status.get_details_error_info().map(|info| info.reason);
    match status.code() {
        Code::Unavailable => true,
        Code::ResourceExhausted => reason.as_deref() == Some("CONSUMER_TOO_SLOW"),
        _ => retry::broken(status),
    }
}

impl Follow {
    /// Opens the stream from `position` (`None`: from now) with `open`,
    /// prints each item with `print`, and opens it again from the last
    /// position printed when it breaks (see the module comment).
    /// `position_of` is an item's position, `None` for one that carries
    /// nothing to print.
    pub(crate) async fn run<T, Fut>(
        &self,
        mut position: Option<i64>,
        mut open: impl FnMut(Option<i64>) -> Fut,
        position_of: impl Fn(&T) -> Option<i64>,
        mut print: impl FnMut(&T),
    ) -> CliResult
    where
        Fut: Future<Output = Result<tonic::Response<Streaming<T>>, Status>>,
    {
        let mut seen = 0;
        let mut delay = DELAY.0;
        let done = |seen: usize| self.limit.is_some_and(|limit| seen >= limit);
        let resume = |position: Option<i64>| {
            if let Some(position) = position {
                eprintln!("resume with {} {position}", self.flag);
            }
        };
        // The status of the break being mended, until the stream is open
        // again (said once, not at each try).
        let mut broken: Option<Status> = None;
        'open: while !done(seen) {
            let opened = tokio::select! {
                opened = open(position) => opened,
                _ = tokio::signal::ctrl_c() => break,
            };
            let failed = match opened {
                Ok(stream) => {
                    if broken.take().is_some() {
                        eprintln!("engram: reconnected");
                    }
                    let mut stream = stream.into_inner();
                    loop {
                        if done(seen) {
                            break 'open;
                        }
                        let next = tokio::select! {
                            next = stream.message() => next,
                            _ = tokio::signal::ctrl_c() => break 'open,
                        };
                        match next {
                            Ok(Some(item)) => {
                                delay = DELAY.0;
                                if let Some(at) = position_of(&item) {
                                    position = Some(at);
                                    seen += 1;
                                    print(&item);
                                }
                            }
                            Ok(None) => break 'open,
                            Err(status) => break status,
                        }
                    }
                }
                Err(status) => status,
            };
            if position.is_none() {
                // Started "now" and saw nothing yet: resume where the
                // server says the stream stood.
                position = failed
                    .get_details_error_info()
                    .and_then(|info| info.metadata.get(self.resume_key)?.parse().ok());
            }
            if !self.reconnect || !mendable(&failed) {
                resume(position);
                return Err(failed.into());
            }
            if broken.is_none() {
                let from = position.map_or("now".to_owned(), |p| format!("{} {p}", self.flag));
                eprintln!(
                    "engram: the stream broke ({:?}: {}); reconnecting from {from}",
                    failed.code(),
                    failed.message()
                );
            }
            broken = Some(failed);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = tokio::signal::ctrl_c() => break,
            }
            delay = (delay * 2).min(DELAY.1);
        }
        resume(position);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_reconnecting_mends() {
        assert!(mendable(&Status::unavailable("shutting down")));
        assert!(!mendable(&Status::invalid_argument("bad cursor")));
        assert!(!mendable(&Status::unknown("the server said so")));
        assert!(!mendable(&Status::resource_exhausted("too many streams")));
        let shed = Status::with_error_details(
            Code::ResourceExhausted,
            "too slow",
            tonic_types::ErrorDetails::with_error_info(
                "CONSUMER_TOO_SLOW",
                "engram",
                std::collections::HashMap::new(),
            ),
        );
        assert!(mendable(&shed));
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(mendable(&Status::from_error(Box::new(reset))));
    }
}
