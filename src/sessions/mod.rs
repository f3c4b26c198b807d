//! Sessions and their event logs (episodes): the types, and the rules that
//! sit between a request and the store (ownership, defaults, limits,
//! idempotency fingerprints, the conversation text).

mod conversation;
mod service;
mod types;

pub use conversation::render_conversation;
pub use service::{CreateRequest, Sessions, TAIL_BATCH, TailStart};
pub use types::*;

/// The episode an append stored, built from the request and the positions
/// the store gave it (so the answer needs no read back).
pub(crate) fn stored_episode(
    new: &NewEpisode,
    session: &Session,
    seq: i64,
    cursor: i64,
    now: chrono::DateTime<chrono::Utc>,
) -> Episode {
    Episode {
        id: new.id.as_str().to_owned(),
        session_id: session.id.clone(),
        seq,
        cursor,
        app: session.app.clone(),
        user: session.user.clone(),
        agent: new
            .agent
            .as_ref()
            .map_or_else(|| session.app.clone(), |a| a.as_str().to_owned()),
        kind: new.kind.as_str().to_owned(),
        content: new.content.clone(),
        metadata: new.metadata.clone(),
        source_node: new.source_node.clone(),
        timestamp: new.timestamp.unwrap_or(now),
        create_time: now,
    }
}
