//! The checker: validates a whole recorded history against what the
//! server finally holds, and names each anomaly with the fewest operations
//! that show it.

use std::collections::{BTreeMap, HashMap};

use tonic::Code;

use super::history::{Call, Op, Outcome};
use super::workload::{Change, KEYS, Tailed};

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

/// The key a call writes or reads, if one.
fn key_of(call: &Call) -> Option<&str> {
    match call {
        Call::Set { key, .. }
        | Call::Delete { key }
        | Call::Get { key }
        | Call::GetVersion { key, .. }
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
        let deleted = ops.iter().any(|d| {
            matches!(&d.call, Call::Delete { key: k } if k == key)
                && !matches!(d.outcome, Outcome::Refused { .. })
                && d.start < op.end
                && d.end > writer.start
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
    for op in ops {
        match (&op.call, &op.outcome) {
            (Call::Get { key } | Call::Search { key }, Outcome::Read { version, value }) => {
                read(op, key, *version, *value, true);
            }
            (Call::GetVersion { key, .. }, Outcome::Read { version, value }) => {
                read(op, key, *version, *value, false);
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

/// A consumer must have received exactly the whole feed, in order: no gap,
/// no duplicate, across its reconnects.
fn feed<T: PartialEq + std::fmt::Debug>(
    name: &str,
    whole: &[T],
    consumers: &[Vec<T>],
    position: impl Fn(&T) -> i64,
    found: &mut Vec<Anomaly>,
) {
    for pair in whole.windows(2) {
        if position(&pair[1]) <= position(&pair[0]) {
            found.push(anomaly(
                format!(
                    "the {name} feed goes from {} back to {}",
                    position(&pair[0]),
                    position(&pair[1])
                ),
                vec![],
            ));
        }
    }
    for (n, got) in consumers.iter().enumerate() {
        if let Some(at) = (0..whole.len().max(got.len())).find(|&i| whole.get(i) != got.get(i)) {
            found.push(anomaly(
                format!(
                    "{name} consumer {n} diverges at item {at}: expected {:?}, received {:?} \
                     (a gap, a duplicate or a reorder across reconnects)",
                    whole.get(at),
                    got.get(at)
                ),
                vec![],
            ));
        }
    }
}

fn episodes(ops: &[Op], end: &Final, found: &mut Vec<Anomaly>) {
    let mut by_id: HashMap<&str, (&str, i64)> = HashMap::new();
    let mut seqs: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for (_, id, session, seq) in &end.episodes {
        if by_id.insert(id, (session, *seq)).is_some() {
            found.push(anomaly(format!("episode {id} is stored twice"), vec![]));
        }
        seqs.entry(session).or_default().push(*seq);
    }
    for (session, seqs) in seqs {
        let dense = seqs.iter().enumerate().all(|(i, seq)| *seq == i as i64 + 1);
        if !dense {
            found.push(anomaly(
                format!("session {session}: seqs {seqs:?} are not 1..n in cursor order"),
                vec![],
            ));
        }
    }
    let mut acked: HashMap<&str, i64> = HashMap::new();
    let mut tried: HashMap<&str, usize> = HashMap::new();
    for op in ops {
        let Call::Append { id, .. } = &op.call else {
            continue;
        };
        let attempts = tried.entry(id).or_default();
        *attempts += 1;
        let Outcome::Appended { seq, replayed } = &op.outcome else {
            continue;
        };
        if *replayed && *attempts == 1 {
            found.push(anomaly(
                format!("episode {id} was answered as a replay on its first attempt"),
                vec![op],
            ));
        }
        if let Some(first) = acked.insert(id, *seq)
            && first != *seq
        {
            found.push(anomaly(
                format!("episode {id} was acknowledged at seq {first} and at seq {seq}"),
                vec![op],
            ));
        }
        match by_id.get(id.as_str()) {
            None => found.push(anomaly(
                format!("episode {id} was acknowledged and is not stored"),
                vec![op],
            )),
            Some((_, stored)) if stored != seq => found.push(anomaly(
                format!("episode {id} was acknowledged at seq {seq} and is stored at {stored}"),
                vec![op],
            )),
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(start: u64, end: u64, call: Call, outcome: Outcome) -> Op {
        Op {
            client: 0,
            start,
            end,
            call,
            outcome,
        }
    }

    fn set(key: &str, value: i64) -> Call {
        Call::Set {
            key: key.into(),
            value,
            expected: None,
            request_id: None,
        }
    }

    fn quiet_end(histories: BTreeMap<String, Vec<(i64, Option<i64>)>>) -> Final {
        let searched = histories
            .iter()
            .map(|(key, versions)| {
                let live = versions.last().and_then(|&(v, value)| Some((v, value?)));
                (key.clone(), live)
            })
            .collect();
        Final {
            searched,
            histories,
            feed: vec![(1, 1, "k0".into(), 1), (2, 1, "k0".into(), 2)],
            episodes: vec![],
            watched: vec![vec![(1, 1, "k0".into(), 1), (2, 1, "k0".into(), 2)]],
            tailed: vec![],
            promoted: 0,
        }
    }

    /// The checker must see each kind of anomaly it claims to: a test of
    /// the test.
    #[test]
    fn the_checker_finds_planted_anomalies() {
        let ops = vec![
            op(0, 10, set("k0", 1), Outcome::Wrote { version: 1 }),
            op(20, 30, set("k0", 2), Outcome::Wrote { version: 2 }),
        ];
        let good = BTreeMap::from([("k0".to_owned(), vec![(1, Some(1)), (2, Some(2))])]);
        assert!(check(&ops, &quiet_end(good.clone())).is_empty());

        // A lost acknowledged write.
        let lost = BTreeMap::from([("k0".to_owned(), vec![(1, Some(1)), (2, Some(9))])]);
        let found = check(&ops, &quiet_end(lost));
        assert!(found.iter().any(|a| a.what.contains("acknowledged as")));

        // A gap in the versions.
        let gap = BTreeMap::from([("k0".to_owned(), vec![(1, Some(1)), (3, Some(2))])]);
        assert!(
            check(&ops, &quiet_end(gap))
                .iter()
                .any(|a| a.what.contains("dense"))
        );

        // A stale read: v1 read after v2 was acknowledged.
        let mut stale = ops.clone();
        stale.push(op(
            40,
            50,
            Call::Get { key: "k0".into() },
            Outcome::Read {
                version: 1,
                value: 1,
            },
        ));
        let found = check(&stale, &quiet_end(good.clone()));
        assert!(
            found
                .iter()
                .any(|a| a.what.contains("stale read") && a.ops.len() == 2)
        );

        // A stale search hit, and a search and a get that miss a write
        // acknowledged before they started.
        for (call, outcome) in [
            (
                Call::Search { key: "k0".into() },
                Outcome::Read {
                    version: 1,
                    value: 1,
                },
            ),
            (Call::Search { key: "k0".into() }, Outcome::Absent),
            (
                Call::Get { key: "k0".into() },
                Outcome::Refused {
                    code: Code::NotFound,
                    reason: "KEY_NOT_FOUND".into(),
                },
            ),
        ] {
            let mut missed = ops.clone();
            missed.push(op(40, 50, call, outcome));
            let found = check(&missed, &quiet_end(good.clone()));
            assert!(
                found.iter().any(|a| (a.what.contains("stale read")
                    || a.what.contains("not found once acknowledged"))
                    && a.ops.len() == 2),
                "{:?}",
                found.iter().map(|a| &a.what).collect::<Vec<_>>()
            );
        }
        // A miss is no anomaly when a delete could have landed before it.
        let mut deleted = ops.clone();
        deleted.push(op(
            35,
            45,
            Call::Delete { key: "k0".into() },
            Outcome::Wrote { version: 3 },
        ));
        deleted.push(op(
            40,
            50,
            Call::Search { key: "k0".into() },
            Outcome::Absent,
        ));
        let tombstoned =
            BTreeMap::from([("k0".to_owned(), vec![(1, Some(1)), (2, Some(2)), (3, None)])]);
        assert!(check(&deleted, &quiet_end(tombstoned)).is_empty());
        // The search index disagreeing with the data once quiet.
        let mut disagrees = quiet_end(good.clone());
        disagrees.searched.insert("k0".into(), Some((1, 1)));
        assert!(
            check(&ops, &disagrees)
                .iter()
                .any(|a| a.what.contains("disagrees"))
        );

        // A value stored twice (a retried write applied twice).
        let twice = BTreeMap::from([("k0".to_owned(), vec![(1, Some(1)), (2, Some(1))])]);
        assert!(
            check(&ops, &quiet_end(twice))
                .iter()
                .any(|a| a.what.contains("twice"))
        );

        // A watch consumer that missed a change.
        let mut gap_in_watch = quiet_end(good);
        gap_in_watch.watched = vec![vec![(2, 1, "k0".into(), 2)]];
        assert!(
            check(&ops, &gap_in_watch)
                .iter()
                .any(|a| a.what.contains("diverges"))
        );

        // An episode promoted twice.
        let mut twice_promoted = quiet_end(BTreeMap::new());
        twice_promoted.episodes = vec![(1, "e1".into(), "s0".into(), 1)];
        twice_promoted.tailed = vec![twice_promoted.episodes.clone()];
        twice_promoted.promoted = 2;
        assert!(
            check(&[], &twice_promoted)
                .iter()
                .any(|a| a.what.contains("promoted"))
        );
    }
}
