//! The clock of the server's periodic tasks (the scheduler, the database
//! health check, the reloads of TLS files and tokens): a tick on an
//! interval, the first at once, until shutdown. A tick missed while the
//! task was busy is not made up; the next comes a full interval later.

use std::time::Duration;

use tokio::time::{Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

pub struct Ticks {
    ticker: Interval,
    shutdown: CancellationToken,
}

impl Ticks {
    pub fn new(interval: Duration, shutdown: CancellationToken) -> Ticks {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Ticks { ticker, shutdown }
    }

    /// Waits for the next tick: `false` once shutdown has begun.
    pub async fn next(&mut self) -> bool {
        tokio::select! {
            () = self.shutdown.cancelled() => false,
            _ = self.ticker.tick() => true,
        }
    }
}
