//! Keyed creations: a task created with a request id is created once
//! however many times its creation was tried, through whatever faults.

use std::collections::{BTreeMap, HashMap};

use super::{Anomaly, Final, anomaly};
use crate::robustness::history::{Call, Op, Outcome};

/// Each request id is at most one task, in the session it named; an
/// acknowledged creation's task is kept under the id every answer gave; a
/// creation refused on every try left nothing; and every task is some
/// creation's.
pub(super) fn tasks(ops: &[Op], end: &Final, found: &mut Vec<Anomaly>) {
    // The tries of each request id, in the order they were recorded.
    let mut tries: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        if let Call::CreateTask { request_id, .. } = &op.call {
            tries.entry(request_id).or_default().push(op);
        }
    }
    // Where each subject is held: subject -> [(session, id)].
    let mut held: HashMap<&str, Vec<(&str, &str)>> = HashMap::new();
    for (session, tasks) in &end.tasks {
        for (id, subject) in tasks {
            held.entry(subject).or_default().push((session, id));
        }
    }
    for (subject, places) in &held {
        let Some(ops) = tries.get(subject) else {
            found.push(anomaly(
                format!("task {subject} at {places:?} was never asked for"),
                vec![],
            ));
            continue;
        };
        if places.len() > 1 {
            found.push(anomaly(
                format!(
                    "request {subject} created {} tasks ({places:?}); a repeat must find the first",
                    places.len()
                ),
                ops.clone(),
            ));
        }
    }
    for (request_id, ops) in &tries {
        let places = held.get(request_id).map(Vec::as_slice).unwrap_or_default();
        for op in ops {
            let Call::CreateTask { session, .. } = &op.call else {
                continue;
            };
            if let Outcome::Created { task } = &op.outcome
                && !places.contains(&(session.as_str(), task.as_str()))
            {
                found.push(anomaly(
                    format!(
                        "request {request_id} was acknowledged as {session}/{task}, but the \
                         server holds it at {places:?}"
                    ),
                    vec![op],
                ));
            }
        }
        let refused = ops
            .iter()
            .all(|op| matches!(op.outcome, Outcome::Refused { .. }));
        if refused && !places.is_empty() {
            found.push(anomaly(
                format!("request {request_id} was refused on every try and created {places:?}"),
                ops.clone(),
            ));
        }
    }
}
