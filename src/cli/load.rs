//! `engram episodes load`: a session's log appended from a file of JSON
//! Lines (a chat history, a recorded run), through `AppendEpisodes` in
//! batches.
//!
//! Every episode is sent with an id: its line's own, or one derived from
//! the session, the line's number and its text. So each batch is retried
//! like any keyed append after UNAVAILABLE, and a load that failed halfway
//! (or one run twice) can be run again: what was appended is answered as
//! a replay, and only the rest is added.

use serde::Deserialize;
use serde_json::{Map, Value};

use std::collections::HashSet;

use super::{CliError, CliResult, Connection, Output, Progress, print_json};
use crate::api::convert::{json_to_proto, object_to_proto, timestamp};
use crate::proto;
use crate::proto::episode_service_client::EpisodeServiceClient;
use crate::proto::session_service_client::SessionServiceClient;

/// Episodes sent per call, at most (the server takes up to 1,000).
const BATCH: usize = 500;

/// Bytes of lines sent per call, about: a batch ends before it would pass
/// this, so a call stays well under the 4 MiB a server takes by default.
const BATCH_BYTES: usize = 1 << 20;

/// One line of the file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    #[serde(default)]
    id: String,
    #[serde(rename = "type", default = "observation")]
    kind: String,
    content: Value,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    #[serde(default)]
    agent: String,
    /// RFC 3339; absent: when appended.
    #[serde(default)]
    timestamp: Option<String>,
}

fn observation() -> String {
    "observation".to_owned()
}

/// Where the episodes go.
pub struct Target {
    pub session_id: String,
    pub app: String,
    pub user: String,
    pub require_session: bool,
}

/// The episodes of a file's text, each with its id (see the module
/// comment); a usage error naming the first line that does not fit.
fn episodes(session: &str, text: &str) -> Result<Vec<(usize, proto::NewEpisode)>, CliError> {
    let mut read = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let number = n + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(raw)
            .map_err(|err| CliError::usage(format!("line {number}: {err}")))?;
        let id = match line.id.is_empty() {
            false => line.id,
            true => derived_id(session, number, raw),
        };
        let timestamp = line
            .timestamp
            .map(|text| {
                chrono::DateTime::parse_from_rfc3339(&text)
                    .map(|at| timestamp(at.to_utc()))
                    .map_err(|err| CliError::usage(format!("line {number}: timestamp: {err}")))
            })
            .transpose()?;
        let metadata = line.metadata.map(|object| object_to_proto(&object));
        read.push((
            raw.len(),
            proto::NewEpisode {
                id,
                r#type: line.kind,
                content: Some(json_to_proto(&line.content)),
                metadata,
                agent: line.agent,
                timestamp,
                ..proto::NewEpisode::default()
            },
        ));
    }
    Ok(read)
}

/// The id of a line that gives none: a UUID made of the SHA-256 of the
/// session, the line's number and its text, the same on every run.
fn derived_id(session: &str, number: usize, line: &str) -> String {
    let hash = crate::error::fingerprint(&[session, &number.to_string(), line]);
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&hash[..16]);
    uuid::Builder::from_custom_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// Appends the file's episodes in batches; prints how many were added and
/// how many were stored already (a rerun's), by their seqs: an episode
/// stored before the load began has a seq at or below the session's
/// `last_seq` then.
pub async fn load(channel: Connection, target: Target, text: &str, output: Output) -> CliResult {
    let all = episodes(&target.session_id, text)?;
    let total = all.len();
    let before = match SessionServiceClient::new(channel.clone())
        .get_session(proto::GetSessionRequest {
            session_id: target.session_id.clone(),
            app: target.app.clone(),
            user: target.user.clone(),
        })
        .await
    {
        Ok(found) => found.into_inner().session.map_or(0, |s| s.last_seq),
        Err(status) if status.code() == tonic::Code::NotFound => 0,
        Err(status) => return Err(status.into()),
    };
    let mut client = EpisodeServiceClient::new(channel);
    let progress = Progress::start("loading");
    let mut seqs = HashSet::new();
    let mut sent = 0;
    let mut rest = all.into_iter().peekable();
    while rest.peek().is_some() {
        let (mut batch, mut bytes) = (Vec::new(), 0);
        while let Some((size, _)) = rest.peek() {
            if batch.len() == BATCH || (!batch.is_empty() && bytes + size > BATCH_BYTES) {
                break;
            }
            bytes += size;
            if let Some((_, episode)) = rest.next() {
                batch.push(episode);
            }
        }
        sent += batch.len();
        let stored = client
            .append_episodes(proto::AppendEpisodesRequest {
                session_id: target.session_id.clone(),
                app: target.app.clone(),
                user: target.user.clone(),
                episodes: batch,
                require_session: target.require_session,
            })
            .await?
            .into_inner()
            .episodes;
        seqs.extend(stored.iter().map(|e| e.seq).filter(|&seq| seq > before));
        progress.update(&format!("loaded {sent} of {total} episodes"));
    }
    progress.finish();
    let added = seqs.len();
    let replayed = total - added;
    match output {
        Output::Json => print_json(&serde_json::json!({
            "session_id": target.session_id,
            "added": added,
            "replayed": replayed,
        })),
        Output::Text => outln!(
            "{added} episodes added to {}, {replayed} there already",
            target.session_id
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_become_episodes_with_ids_that_do_not_change() {
        let text = concat!(
            r#"{"id": "given", "type": "user_message", "content": "hi", "metadata": {"intent": "noop"}}"#,
            "\n\n",
            r#"{"content": {"tool": "grep"}, "agent": "coder", "timestamp": "2026-12-01T08:00:00Z"}"#,
            "\n",
            r#"{"content": "hi"}"#,
            "\n",
        );
        let read = episodes("chat-1", text).expect("reads");
        assert_eq!(read.len(), 3);
        let (_, first) = &read[0];
        assert_eq!(
            (first.id.as_str(), first.r#type.as_str()),
            ("given", "user_message")
        );
        let (_, second) = &read[1];
        assert_eq!(
            (second.r#type.as_str(), second.agent.as_str()),
            ("observation", "coder")
        );
        assert_eq!(
            second.timestamp.as_ref().map(|t| t.seconds),
            Some(1_796_112_000)
        );
        // Derived from the session, the line's number and its text.
        let again = episodes("chat-1", text).expect("reads");
        assert_eq!(read[1].1.id, again[1].1.id);
        assert_ne!(read[1].1.id, read[2].1.id);
        let elsewhere = episodes("chat-2", text).expect("reads");
        assert_ne!(read[2].1.id, elsewhere[2].1.id);
        assert!(uuid::Uuid::parse_str(&read[2].1.id).is_ok());
    }

    #[test]
    fn a_line_that_does_not_fit_is_named() {
        for (text, said) in [
            (
                "{\"content\": 1}\n{\"contents\": 2}",
                "line 2: unknown field `contents`",
            ),
            ("{\"type\": \"note\"}", "line 1: missing field `content`"),
            (
                "{\"content\": 1, \"timestamp\": \"noon\"}",
                "line 1: timestamp",
            ),
            ("[1]", "line 1:"),
        ] {
            let err = episodes("s", text).expect_err(text);
            assert!(err.message.contains(said), "{text}: {}", err.message);
        }
    }
}
