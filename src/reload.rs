//! Files a running server re-reads: TLS certificates and the tokens file,
//! which Kubernetes rewrites under a running pod when a Secret changes.
//! One loop serves both: read on an interval, and when the content differs
//! from what was last seen, hand it over to be applied. Content that cannot
//! be read or applied is logged once and the configuration in use stays.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Spawns the loop. `seen` is the content already in use; `read` fetches
/// the content now; `apply` puts changed content into use (or says why
/// it cannot).
pub fn spawn<T>(
    what: &'static str,
    interval: Duration,
    shutdown: CancellationToken,
    mut seen: T,
    read: impl Fn() -> Result<T, String> + Send + 'static,
    apply: impl Fn(&T) -> Result<(), String> + Send + 'static,
) where
    T: PartialEq + Send + 'static,
{
    tokio::spawn(async move {
        let mut ticks = crate::ticks::Ticks::new(interval, shutdown);
        while ticks.next().await {
            let now = match read() {
                Ok(now) => now,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot read the {what}; keeping the ones in use");
                    continue;
                }
            };
            if now == seen {
                continue;
            }
            match apply(&now) {
                Ok(()) => tracing::info!("{what} reloaded"),
                Err(err) => tracing::warn!(
                    error = %err,
                    "the {what} changed but cannot be used; keeping the ones in use"
                ),
            }
            seen = now;
        }
    });
}
