//! The feeds' and the episodes' part of the checker: consumers against the
//! whole feed, stored episodes against their appends, and listings of a
//! session against both.

use std::collections::{BTreeMap, HashMap};

use super::{Anomaly, Final, anomaly};
use crate::robustness::history::{Call, Op, Outcome};

/// A consumer must have received exactly the whole feed, in order: no gap,
/// no duplicate, across its reconnects.
pub(super) fn feed<T: PartialEq + std::fmt::Debug>(
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

pub(super) fn episodes(ops: &[Op], end: &Final, found: &mut Vec<Anomaly>) {
    let mut by_id: HashMap<&str, (&str, i64)> = HashMap::new();
    // Where each episode sorts for `Recent`: (timestamp, cursor).
    let mut newness: HashMap<&str, (i64, i64)> = HashMap::new();
    let mut seqs: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for (cursor, id, session, seq, micros) in &end.episodes {
        newness.insert(id, (*micros, *cursor));
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

    // Listings: a session's episodes after a seq are dense from there, each
    // stored where it is listed, and they hold every append acknowledged
    // before the listing started.
    let appended: Vec<(&Op, &str, &str, i64)> = ops
        .iter()
        .filter_map(|op| match (&op.call, &op.outcome) {
            (Call::Append { session, id, .. }, Outcome::Appended { seq, .. }) => {
                Some((op, session.as_str(), id.as_str(), *seq))
            }
            _ => None,
        })
        .collect();
    for op in ops {
        let (Call::ListEpisodes { session, after_seq }, Outcome::Episodes(listed)) =
            (&op.call, &op.outcome)
        else {
            continue;
        };
        let seqs: Vec<i64> = listed.iter().map(|(seq, _)| *seq).collect();
        if seqs
            .iter()
            .zip(after_seq + 1..)
            .any(|(seq, want)| *seq != want)
        {
            found.push(anomaly(
                format!(
                    "a listing of {session} after seq {after_seq} gives seqs {seqs:?} (a gap \
                     or a reorder)"
                ),
                vec![op],
            ));
        }
        for (seq, id) in listed {
            let stored = by_id.get(id.as_str());
            if stored != Some(&(session.as_str(), *seq)) {
                found.push(anomaly(
                    format!(
                        "a listing of {session} gives {id} at seq {seq}; it is stored as {stored:?}"
                    ),
                    vec![op],
                ));
            }
        }
        for &(append, s, id, seq) in &appended {
            if s == session
                && seq > *after_seq
                && append.end < op.start
                && !listed
                    .iter()
                    .any(|(at, listed_id)| *at == seq && listed_id == id)
            {
                found.push(anomaly(
                    format!(
                        "a listing of {session} after seq {after_seq} misses {id}, acknowledged \
                         at seq {seq} before it started"
                    ),
                    vec![append, op],
                ));
            }
        }
    }
    recent(ops, &by_id, &newness, &appended, found);
}

/// `Recent` gives stored episodes of what it was asked for (a shared
/// statement must not hand one call another's rows), newest first, and
/// none newer than its oldest is missing of those acknowledged before it
/// started; when it gives fewer than its limit, none is missing at all.
fn recent(
    ops: &[Op],
    by_id: &HashMap<&str, (&str, i64)>,
    newness: &HashMap<&str, (i64, i64)>,
    appended: &[(&Op, &str, &str, i64)],
    found: &mut Vec<Anomaly>,
) {
    for op in ops {
        let (Call::Recent { session, limit }, Outcome::Recent(got)) = (&op.call, &op.outcome)
        else {
            continue;
        };
        let asked = session.as_deref().unwrap_or("the user");
        for (micros, cursor, id, s, seq) in got {
            if session.as_ref().is_some_and(|want| want != s) {
                found.push(anomaly(
                    format!("Recent of {asked} gives {id} of session {s}"),
                    vec![op],
                ));
            }
            let stored = (by_id.get(id.as_str()), newness.get(id.as_str()));
            if stored != (Some(&(s.as_str(), *seq)), Some(&(*micros, *cursor))) {
                found.push(anomaly(
                    format!(
                        "Recent of {asked} gives {id} of {s} at seq {seq}, cursor {cursor}, \
                         time {micros}; it is stored as {stored:?}"
                    ),
                    vec![op],
                ));
            }
        }
        let order: Vec<(i64, i64)> = got.iter().map(|e| (e.0, e.1)).collect();
        if order.windows(2).any(|pair| pair[1] >= pair[0]) {
            found.push(anomaly(
                format!("Recent of {asked} is not newest first: (time, cursor) {order:?}"),
                vec![op],
            ));
        }
        if got.len() as i64 > *limit {
            found.push(anomaly(
                format!(
                    "Recent of {asked} gives {} episodes for a limit of {limit}",
                    got.len()
                ),
                vec![op],
            ));
        }
        let full = got.len() as i64 >= *limit;
        let oldest = order.last().copied();
        for &(append, s, id, _) in appended {
            if append.end >= op.start || session.as_deref().is_some_and(|want| want != s) {
                continue;
            }
            let Some(&place) = newness.get(id) else {
                continue; // acknowledged and not stored: named above
            };
            let newer = !full || oldest.is_none_or(|oldest| place > oldest);
            if newer && !got.iter().any(|e| e.2 == id) {
                found.push(anomaly(
                    format!(
                        "Recent of {asked} (limit {limit}) misses {id}, acknowledged before it \
                         started and newer than the oldest it gave"
                    ),
                    vec![append, op],
                ));
            }
        }
    }
}
