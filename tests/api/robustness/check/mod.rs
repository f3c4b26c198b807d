//! The checker: validates a whole recorded history against what the
//! server finally holds, and names each anomaly with the fewest operations
//! that show it. Here: memory, search, as-of reads and imports; the feeds
//! and episodes in `episodes`, keyed creations in `tasks`.

use std::collections::{BTreeMap, HashMap};

use tonic::Code;

use super::history::{Call, Op, Outcome};
use super::workload::{Change, IMPORT_KEYS, IMPORT_VERSIONS, KEYS, Tailed};

mod episodes;
#[cfg(test)]
mod planted;
mod tasks;

use episodes::{episodes, feed};
use tasks::tasks;

/// What the server holds once the faults are over and everything caught
/// up.
pub struct Final {
    /// Every kept version of each key: (version, value; None for a
    /// tombstone).
    pub histories: BTreeMap<String, Vec<(i64, Option<i64>)>>,
    /// The scope's whole change feed, read by a fresh watch from 0.
    pub feed: Vec<Change>,
    /// Every episode of the app, read by a fresh tail from 0.
    pub episodes: Vec<Tailed>,
    /// What each consumer received across its reconnects.
    pub watched: Vec<Vec<Change>>,
    pub tailed: Vec<Vec<Tailed>>,
    /// The rule's count of promoted episodes after catch-up.
    pub promoted: i64,
    /// What a search for each key's name found once it was quiet: the hit's
    /// version and value, or None.
    pub searched: BTreeMap<String, Option<(i64, i64)>>,
    /// What the server holds of each import's file: how many of its keys
    /// and of its fact's versions.
    pub imports: BTreeMap<String, (usize, usize)>,
    /// Each session's tasks: (id, subject), the subject a creation's
    /// request id.
    pub tasks: BTreeMap<String, Vec<(String, String)>>,
}

/// An anomaly and the operations that show it.
pub struct Anomaly {
    pub what: String,
    pub ops: Vec<Op>,
}

impl std::fmt::Display for Anomaly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "ANOMALY: {}", self.what)?;
        for op in &self.ops {
            writeln!(f, "    {op}")?;
        }
        Ok(())
    }
}

fn anomaly(what: String, ops: Vec<&Op>) -> Anomaly {
    Anomaly {
        what,
        ops: ops.into_iter().cloned().collect(),
    }
}

/// Checks every guarantee; returns the anomalies (none is a pass).
pub fn check(ops: &[Op], end: &Final) -> Vec<Anomaly> {
    let mut found = Vec::new();
    memory(ops, end, &mut found);
    recall(end, &mut found);
    feed("watch", &end.feed, &end.watched, |c| c.0, &mut found);
    feed("tail", &end.episodes, &end.tailed, |e| e.0, &mut found);
    episodes(ops, end, &mut found);
    imports(ops, end, &mut found);
    tasks(ops, end, &mut found);
    let matched = end.episodes.len() as i64;
    if end.promoted != matched {
        found.push(anomaly(
            format!(
                "the rule promoted {} episodes after catch-up; {matched} exist (each must be \
                 promoted exactly once)",
                end.promoted
            ),
            vec![],
        ));
    }
    found
}

/// An import lands whole or not at all (whatever the fault, however it
/// ended for its client); one acknowledged lands whole, and one refused
/// not at all.
fn imports(ops: &[Op], end: &Final, found: &mut Vec<Anomaly>) {
    let whole = (IMPORT_KEYS.len(), IMPORT_VERSIONS);
    for op in ops {
        let Call::Import { id } = &op.call else {
            continue;
        };
        let held = end.imports.get(id).copied().unwrap_or_default();
        let wrong = match (&op.outcome, held) {
            (_, held) if held != whole && held != (0, 0) => "landed in part",
            (Outcome::Done, (0, 0)) => "was acknowledged and is missing",
            (Outcome::Refused { .. }, held) if held == whole => "was refused and landed",
            _ => continue,
        };
        found.push(anomaly(
            format!(
                "import {id} {wrong}: {} of {} keys, {} of {} fact versions",
                held.0, whole.0, held.1, whole.1
            ),
            vec![op],
        ));
    }
}

/// The key a call writes or reads, if one.
fn key_of(call: &Call) -> Option<&str> {
    match call {
        Call::Set { key, .. }
        | Call::Delete { key }
        | Call::Get { key }
        | Call::GetVersion { key, .. }
        | Call::GetAt { key, .. }
        | Call::Search { key }
        | Call::History { key }
        | Call::Purge { key, .. } => Some(key),
        _ => None,
    }
}

fn memory(ops: &[Op], end: &Final, found: &mut Vec<Anomaly>) {
    // Where each value is finally kept: value -> (key, version).
    let mut kept: HashMap<i64, (String, i64)> = HashMap::new();
    for (key, versions) in &end.histories {
        for pair in versions.windows(2) {
            if pair[1].0 != pair[0].0 + 1 {
                found.push(anomaly(
                    format!(
                        "key {key}: version {} follows {} (versions must be dense)",
                        pair[1].0, pair[0].0
                    ),
                    vec![],
                ));
            }
        }
        for (version, value) in versions {
            if let Some(value) = value
                && let Some((other_key, other)) = kept.insert(*value, (key.clone(), *version))
            {
                found.push(anomaly(
                    format!(
                        "value {value} is stored twice: {other_key} v{other} and {key} v{version} \
                         (a retried write made a second version)"
                    ),
                    ops.iter()
                        .filter(|op| matches!(&op.call, Call::Set { value: v, .. } if v == value))
                        .collect(),
                ));
            }
        }
    }
    let stored = |key: &str, version: i64| -> Option<Option<Option<i64>>> {
        let versions = end.histories.get(key)?;
        let oldest = versions.first()?.0;
        if version < oldest {
            return None; // purged
        }
        Some(versions.iter().find(|v| v.0 == version).map(|v| v.1))
    };

    // Every value in the final state was written by some call.
    let written: HashMap<i64, &Op> = ops
        .iter()
        .filter_map(|op| match op.call {
            Call::Set { value, .. } if !matches!(op.outcome, Outcome::Refused { .. }) => {
                Some((value, op))
            }
            _ => None,
        })
        .collect();
    for (value, (key, version)) in &kept {
        if !written.contains_key(value) {
            found.push(anomaly(
                format!("{key} v{version} holds {value}, which no call wrote"),
                vec![],
            ));
        }
    }

    // Acknowledged writes are kept where they were acknowledged.
    let mut by_request: HashMap<&str, Vec<&Op>> = HashMap::new();
    for op in ops {
        let Outcome::Wrote { version } = op.outcome else {
            continue;
        };
        let (key, expect) = match &op.call {
            Call::Set {
                key,
                value,
                request_id,
                ..
            } => {
                if let Some(id) = request_id {
                    by_request.entry(id).or_default().push(op);
                }
                (key, Some(*value))
            }
            Call::Delete { key } => (key, None),
            _ => continue,
        };
        match stored(key, version) {
            None => {}
            Some(None) => found.push(anomaly(
                format!("{key} v{version} was acknowledged and is gone (not purged)"),
                vec![op],
            )),
            Some(Some(now)) if now != expect => found.push(anomaly(
                format!("{key} v{version} was acknowledged as {expect:?} and holds {now:?}"),
                vec![op],
            )),
            Some(Some(_)) => {}
        }
    }
    for (id, acks) in by_request {
        if acks.windows(2).any(|pair| {
            matches!((&pair[0].outcome, &pair[1].outcome),
                (Outcome::Wrote { version: a }, Outcome::Wrote { version: b }) if a != b)
        }) {
            found.push(anomaly(
                format!("request id {id} was acknowledged at two versions"),
                acks,
            ));
        }
    }

    // Reads: a value read is the one written at that version, and no read
    // is older than a write acknowledged before it started.
    let mut acked: HashMap<&str, Vec<(u64, i64, &Op)>> = HashMap::new();
    for op in ops {
        if let (Call::Set { key, .. } | Call::Delete { key }, Outcome::Wrote { version }) =
            (&op.call, &op.outcome)
        {
            acked.entry(key).or_default().push((op.end, *version, op));
        }
    }
    let newest_before = |key: &str, start: u64| -> Option<(i64, &Op)> {
        acked
            .get(key)?
            .iter()
            .filter(|(end, _, _)| *end < start)
            .max_by_key(|(_, version, _)| *version)
            .map(|(_, version, op)| (*version, *op))
    };
    // A read that finds no live value: some delete must have been able to
    // land after the newest write acknowledged before it started (a
    // purge keeps the current version, and nothing else removes one).
    let mut missed = |op: &Op, key: &str| {
        let Some((newest, writer)) = newest_before(key, op.start) else {
            return;
        };
        if !matches!(writer.call, Call::Set { .. }) {
            return;
        }
        // An acknowledged delete landed before it returned; one whose
        // outcome is unknown may land at any time after it began, also
        // after its client gave up on it (a cancelled call already in a
        // group is committed with it), which the first long runs showed.
        let deleted = ops.iter().any(|d| {
            matches!(&d.call, Call::Delete { key: k } if k == key)
                && d.start < op.end
                && match d.outcome {
                    Outcome::Refused { .. } => false,
                    Outcome::Unknown { .. } => true,
                    _ => d.end > writer.start,
                }
        });
        if !deleted {
            found.push(anomaly(
                format!(
                    "a {} of {key} found no value after v{newest} was acknowledged, with no \
                     delete that could land between (a write not found once acknowledged)",
                    op.call.name()
                ),
                vec![writer, op],
            ));
        }
    };
    for op in ops {
        match (&op.call, &op.outcome) {
            (Call::Search { key }, Outcome::Absent) => missed(op, key),
            (Call::Get { key }, Outcome::Refused { code, .. }) if *code == Code::NotFound => {
                missed(op, key)
            }
            _ => {}
        }
    }
    let mut read = |op: &Op, key: &str, version: i64, value: i64, fresh: bool| {
        if let Some(Some(now)) = stored(key, version)
            && now != Some(value)
        {
            found.push(anomaly(
                format!("{key} v{version} was read as {value} but holds {now:?}"),
                vec![op],
            ));
        }
        if let Some(writer) = written.get(&value)
            && let Some(k) = key_of(&writer.call)
            && k != key
        {
            found.push(anomaly(
                format!("{key} v{version} was read as {value}, written to {k}"),
                vec![writer, op],
            ));
        }
        if fresh
            && let Some((newest, writer)) = newest_before(key, op.start)
            && version < newest
        {
            found.push(anomaly(
                format!(
                    "a read of {key} returned v{version} after v{newest} was acknowledged \
                     (a stale read)"
                ),
                vec![writer, op],
            ));
        }
    };
    let mut skipped = Vec::new();
    let mut as_of_anomalies = Vec::new();
    for op in ops {
        match (&op.call, &op.outcome) {
            (Call::Get { key } | Call::Search { key }, Outcome::Read { version, value }) => {
                read(op, key, *version, *value, true);
            }
            (Call::GetVersion { key, .. }, Outcome::Read { version, value }) => {
                read(op, key, *version, *value, false);
            }
            (Call::GetAt { key, revision }, outcome) => {
                if let Outcome::Read { version, value } = outcome {
                    read(op, key, *version, *value, false);
                }
                if let Some(what) = as_of_disagrees(end, key, *revision, outcome) {
                    as_of_anomalies.push(anomaly(what, vec![op]));
                }
            }
            (Call::List, Outcome::Listed(entries)) => {
                for (key, version, value) in entries {
                    read(op, key, *version, *value, true);
                }
            }
            (Call::History { key }, Outcome::Versions(versions)) => {
                if versions.windows(2).any(|pair| pair[1].0 != pair[0].0 + 1) {
                    skipped.push(op);
                }
                for (version, value) in versions {
                    if let Some(value) = value {
                        read(op, key, *version, *value, false);
                    }
                }
            }
            _ => {}
        }
    }
    for op in skipped {
        found.push(anomaly("a history skips a version".to_owned(), vec![op]));
    }
    found.extend(as_of_anomalies);
    for key in KEYS {
        if !end.histories.contains_key(key) && acked.contains_key(key) {
            let deleted_by_purge = ops
                .iter()
                .any(|op| matches!(&op.call, Call::Purge { key: k, .. } if k == key));
            if !deleted_by_purge {
                found.push(anomaly(format!("key {key} vanished"), vec![]));
            }
        }
    }
}

/// What a read of `key` as of `revision` should have answered, by the
/// whole change feed: the version of the newest set or delete at or before
/// the revision, `KEY_DELETED` for a tombstone, `KEY_NOT_FOUND` before any,
/// `VERSION_PURGED` only for a version (or tombstone) since purged; a
/// revision not yet settled may be refused. Says how the answer differs,
/// if it does.
fn as_of_disagrees(end: &Final, key: &str, revision: i64, outcome: &Outcome) -> Option<String> {
    const DELETE: i32 = 2;
    const PURGE: i32 = 3;
    let then = end
        .feed
        .iter()
        .filter(|c| c.2 == key && c.0 <= revision && c.1 != PURGE)
        .max_by_key(|c| c.0);
    let purged = |version: i64| {
        end.histories
            .get(key)
            .and_then(|versions| versions.first())
            .is_none_or(|oldest| version < oldest.0)
    };
    let fits = match (outcome, then) {
        (Outcome::Read { version, .. }, Some(c)) => c.1 != DELETE && c.3 == *version,
        (Outcome::Refused { code, reason }, then) if *code == Code::NotFound => {
            match (reason.as_str(), then) {
                ("KEY_NOT_FOUND", None) => true,
                ("KEY_DELETED", Some(c)) => c.1 == DELETE,
                // The version current then, a tombstone too, is gone.
                ("VERSION_PURGED", Some(c)) => purged(c.3),
                _ => false,
            }
        }
        (Outcome::Refused { code, .. }, _) => *code == Code::OutOfRange,
        (Outcome::Unknown { .. }, _) => true,
        _ => false,
    };
    (!fits).then(|| {
        format!(
            "a read of {key} as of revision {revision} answered {outcome:?}; the feed's newest \
             change of it by then is {then:?} (revision, kind, key, version)"
        )
    })
}

/// Once quiet, a search for each key finds exactly its current version, and
/// nothing for a deleted key: the search index agrees with the data after
/// every fault.
fn recall(end: &Final, found: &mut Vec<Anomaly>) {
    for key in KEYS {
        let holds = end
            .histories
            .get(key)
            .and_then(|versions| versions.last())
            .and_then(|&(version, value)| Some((version, value?)));
        let searched = end.searched.get(key).copied().flatten();
        if searched != holds {
            found.push(anomaly(
                format!(
                    "after the faults a search for {key} finds {searched:?} (version, value) \
                     where the key holds {holds:?}: the search index disagrees with the data"
                ),
                vec![],
            ));
        }
    }
}
