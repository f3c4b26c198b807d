//! The recorded history: every call a client made, when it started and
//! ended (nanoseconds since the run began) and how it ended.

use std::sync::Mutex;
use std::time::Instant;

use tonic::Code;

use super::workload::Recented;

/// What a client asked for. Values are unique per write (`client * 1e6 +
/// n`), so a value in the final state names the write that put it there.
#[derive(Debug, Clone)]
pub enum Call {
    Set {
        key: String,
        value: i64,
        expected: Option<i64>,
        request_id: Option<String>,
    },
    Delete {
        key: String,
    },
    Get {
        key: String,
    },
    GetVersion {
        key: String,
        version: i64,
    },
    /// `Get` with `as_of` a revision a watch consumer had received.
    GetAt {
        key: String,
        revision: i64,
    },
    List,
    /// `Search` of memory for the key's name, which only that key holds.
    Search {
        key: String,
    },
    History {
        key: String,
    },
    Purge {
        key: String,
        keep: i64,
    },
    Append {
        session: String,
        id: String,
        value: i64,
    },
    /// A session's episodes after a seq, every page.
    ListEpisodes {
        session: String,
        after_seq: i64,
    },
    /// `Recent` of the user, or of one of its sessions: the newest `limit`.
    Recent {
        session: Option<String>,
        limit: i64,
    },
    RunRule,
    /// `CreateTask` in a session, keyed by `request_id`, which is also the
    /// task's subject (so a task in the final state names its creation).
    CreateTask {
        session: String,
        request_id: String,
    },
    /// `Import` of a file of its own, everything in it named by `id`: two
    /// keys of the scope `id` and a fact `id` of two versions and a
    /// source. It must land whole or not at all.
    Import {
        id: String,
    },
}

impl Call {
    pub fn name(&self) -> &'static str {
        match self {
            Call::Set {
                expected: Some(_), ..
            } => "set-cas",
            Call::Set {
                request_id: Some(_),
                ..
            } => "set-idempotent",
            Call::Set { .. } => "set",
            Call::Delete { .. } => "delete",
            Call::Get { .. } => "get",
            Call::GetVersion { .. } => "get-version",
            Call::GetAt { .. } => "get-as-of",
            Call::List => "list",
            Call::Search { .. } => "search",
            Call::History { .. } => "history",
            Call::Purge { .. } => "purge",
            Call::Append { .. } => "append",
            Call::ListEpisodes { .. } => "list-episodes",
            Call::Recent { .. } => "recent",
            Call::RunRule => "run-rule",
            Call::Import { .. } => "import",
            Call::CreateTask { .. } => "create-task",
        }
    }
}

/// How a call ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// A write acknowledged at this version (or an append at this seq).
    Wrote {
        version: i64,
    },
    /// A read of a live value at this version.
    Read {
        version: i64,
        value: i64,
    },
    /// A search that answered without the key it asked for.
    Absent,
    /// A list: (key, version, value) of every live key.
    Listed(Vec<(String, i64, i64)>),
    /// A history: (version, value; None for a tombstone).
    Versions(Vec<(i64, Option<i64>)>),
    Appended {
        seq: i64,
        replayed: bool,
    },
    /// A session's episodes listed: (seq, id) of each, in the order given.
    Episodes(Vec<(i64, String)>),
    /// The newest episodes, in the order given.
    Recent(Vec<Recented>),
    /// Done, with nothing to check (purge, run rule).
    Done,
    /// A task created (or found by its request id): its id.
    Created {
        task: String,
    },
    /// Refused for certain: the call changed nothing.
    Refused {
        code: Code,
        reason: String,
    },
    /// The connection died or the client gave up: the write may or may
    /// not have happened.
    Unknown {
        code: Code,
        /// Made by the client of a broken connection (the status carries
        /// the transport error as its source), not sent by the server.
        transport: bool,
    },
}

/// One call.
#[derive(Debug, Clone)]
pub struct Op {
    pub client: usize,
    pub start: u64,
    pub end: u64,
    pub call: Call,
    pub outcome: Outcome,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "[client {} {:.3}s..{:.3}s] {:?} -> {:?}",
            self.client,
            self.start as f64 / 1e9,
            self.end as f64 / 1e9,
            self.call,
            self.outcome
        )
    }
}

/// The history of a run, appended to by every client.
pub struct Recorder {
    began: Instant,
    ops: Mutex<Vec<Op>>,
}

impl Recorder {
    pub fn new() -> Self {
        Recorder {
            began: Instant::now(),
            ops: Mutex::new(Vec::new()),
        }
    }

    /// Nanoseconds since the run began.
    pub fn now(&self) -> u64 {
        self.began.elapsed().as_nanos() as u64
    }

    pub fn record(&self, op: Op) {
        self.ops.lock().expect("history").push(op);
    }

    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().expect("history").clone()
    }
}

/// Sorts a failed call's status into refused (certainly not applied) and
/// unknown (may have been applied: the connection or the database went
/// away, or the client gave up).
pub fn outcome_of(status: &tonic::Status) -> Outcome {
    match status.code() {
        Code::Unavailable
        | Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Unknown
        | Code::Internal => Outcome::Unknown {
            code: status.code(),
            transport: std::error::Error::source(status).is_some(),
        },
        code => Outcome::Refused {
            code,
            reason: crate::helpers::reason(status),
        },
    }
}
