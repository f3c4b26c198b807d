//! Export and import: what a selection covers, the order of an export's
//! parts, and the import's checking, staging and all-or-nothing apply.
//!
//! An export is pulled page by page as the client reads, so a slow reader
//! holds one page of server memory, not the tenant. An import checks each
//! line as it arrives and stages it; only when the stream has ended does
//! the store apply the staged lines, in one transaction (see the store's
//! `transfer/import.rs`), so a stream that breaks, a malformed line or a conflict
//! leaves nothing visible.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use futures::{Stream, StreamExt, TryStreamExt};
use tokio::sync::OwnedSemaphorePermit;

use super::records::{ENDED_FROM, End, Header, Record};
use super::{Data, DataStore};
use crate::context::CallerContext;
use crate::error::{Error, Reason, Result};
use crate::memory::Scope;
use crate::sessions::{Id, Name};

/// What an export covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Everything of the caller's tenant.
    Tenant,
    /// One memory scope.
    Scope(Scope),
    /// A session, its episodes and working memory, and the execution scope
    /// named by its id.
    Session(Id),
    /// An app's user: their sessions (as [`Selection::Session`]) and the
    /// facts they own.
    User { app: Name, user: Name },
}

/// The parts of an export, in the order they are written, which is an
/// order an import can apply them in (sessions before their episodes,
/// working memories before their tasks and files, facts before their
/// versions, episodes before the rules whose watermarks name them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Executions,
    Memory,
    Sessions,
    Episodes,
    Working,
    Tasks,
    CachedFiles,
    Facts,
    FactVersions,
    FactSources,
    Rules,
}

impl Part {
    /// Every part, in export order.
    pub const ALL: [Part; 11] = [
        Part::Executions,
        Part::Memory,
        Part::Sessions,
        Part::Episodes,
        Part::Working,
        Part::Tasks,
        Part::CachedFiles,
        Part::Facts,
        Part::FactVersions,
        Part::FactSources,
        Part::Rules,
    ];
}

/// Where the next page of a part starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum After {
    Start,
    /// After this id (executions, sessions, working memory, facts, rules).
    Id(String),
    /// After this memory version.
    Key {
        scope_type: i16,
        scope: String,
        key: String,
        version: i64,
    },
    /// After this episode cursor.
    Cursor(i64),
    /// After this item of an owner: a session's task, a fact's version.
    Numbered(String, i64),
    /// After this named item of an owner: a session's cached file, a
    /// fact's source.
    Named(String, String),
}

/// A page of a part, and where the next starts (none after the last).
#[derive(Debug, Clone)]
pub struct ExportPage {
    pub records: Vec<crate::data::records::Record>,
    pub next: Option<After>,
    /// How many rows the part's next page asks for (the store's choice,
    /// from how many this one held).
    pub next_rows: i64,
}

/// What an import wrote and found in place, by record kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportCounts {
    pub imported: BTreeMap<String, i64>,
    pub unchanged: BTreeMap<String, i64>,
    /// Lines read, header and blank lines included.
    pub lines: i64,
}

/// How long a never-finished import's staged lines are kept (the next
/// import of the tenant and the server's periodic pruning remove them).
pub const STALE_AFTER: Duration = Duration::days(1);

impl Selection {
    /// The parts the selection covers, in export order: each selection's
    /// are a beginning of [`Part::ALL`].
    pub fn parts(&self) -> &'static [Part] {
        let covered = match self {
            Selection::Tenant => Part::ALL.len(),
            // Not the rules.
            Selection::User { .. } => 10,
            // Nor the facts.
            Selection::Session(_) => 7,
            // Memory alone.
            Selection::Scope(_) => 2,
        };
        &Part::ALL[..covered]
    }

    /// The header's `selection`.
    pub fn describe(&self) -> String {
        match self {
            Selection::Tenant => "tenant".to_owned(),
            Selection::Scope(scope) => {
                format!(
                    "scope {}/{}",
                    scope.scope_type.as_str(),
                    scope.name.as_str()
                )
            }
            Selection::Session(id) => format!("session {id}"),
            Selection::User { app, user } => format!("user {app}/{user}"),
        }
    }
}

/// Bytes of lines an export sends per message: well under gRPC's usual
/// 4 MiB, however big the values of a page.
pub const EXPORT_CHUNK_BYTES: usize = 1 << 20;

/// Splits lines into chunks of about `budget` bytes, each with at least
/// one line.
fn chunks(lines: Vec<String>, budget: usize) -> Vec<Vec<String>> {
    let mut chunks = Vec::new();
    let (mut chunk, mut bytes) = (Vec::new(), 0);
    for line in lines {
        if !chunk.is_empty() && bytes + line.len() > budget {
            chunks.push(std::mem::take(&mut chunk));
            bytes = 0;
        }
        bytes += line.len();
        chunk.push(line);
    }
    if !chunk.is_empty() {
        chunks.push(chunk);
    }
    chunks
}

/// Where an export stream is.
enum Position<T> {
    Header,
    /// In a part, reading through the export's snapshot: the part, where
    /// its next page starts and how many rows it asks for (none at the
    /// part's start), and the lines sent so far.
    Part(usize, After, Option<i64>, T, i64),
}

impl<S: DataStore> Data<S> {
    /// The export as a stream of chunks of lines, the header first and an
    /// [`End`] line last; every
    /// page is read from one snapshot, taken when the header is sent, so
    /// the file is the tenant at one moment however long the export runs.
    /// A chunk holds about [`EXPORT_CHUNK_BYTES`] of lines (a page of big
    /// values would not fit one gRPC message), and at least one line.
    pub fn export(
        &self,
        ctx: &CallerContext,
        selection: Selection,
        now: DateTime<Utc>,
    ) -> impl Stream<Item = Result<Vec<String>>> + Send + 'static {
        let store = self.store.clone();
        let exports = self.exports.clone();
        let tenant = ctx.tenant.clone();
        let start: Position<(OwnedSemaphorePermit, S::Snapshot)> = Position::Header;
        futures::stream::try_unfold(Some(start), move |position| {
            let store = store.clone();
            let exports = exports.clone();
            let tenant = tenant.clone();
            let selection = selection.clone();
            async move {
                let (mut at, mut after, mut rows, mut reading, mut sent) = match position {
                    None => return Ok::<_, Error>(None),
                    Some(Position::Header) => {
                        let turn = exports
                            .acquire_owned()
                            .await
                            .map_err(|_| Error::internal("the export turns were closed"))?;
                        let snapshot = store.export_snapshot(&tenant).await?;
                        let header = Header::new(tenant.as_str(), selection.describe(), now);
                        let line = encode(&Record::Header(header))?;
                        let next = Position::Part(0, After::Start, None, (turn, snapshot), 1);
                        return Ok(Some((vec![vec![line]], Some(next))));
                    }
                    Some(Position::Part(at, after, rows, reading, sent)) => {
                        (at, after, rows, reading, sent)
                    }
                };
                // Skips empty parts, so every chunk sent carries lines.
                while let Some(&part) = selection.parts().get(at) {
                    let page = store
                        .export_page(&mut reading.1, &tenant, &selection, part, &after, rows)
                        .await?;
                    let lines = page
                        .records
                        .iter()
                        .map(encode)
                        .collect::<Result<Vec<_>>>()?;
                    (at, after, rows) = match page.next {
                        Some(next) => (at, next, Some(page.next_rows)),
                        None => (at + 1, After::Start, None),
                    };
                    if !lines.is_empty() {
                        sent += i64::try_from(lines.len()).unwrap_or(i64::MAX);
                        let next = Position::Part(at, after, rows, reading, sent);
                        return Ok(Some((chunks(lines, EXPORT_CHUNK_BYTES), Some(next))));
                    }
                }
                let (_turn, snapshot) = reading;
                store.export_done(snapshot).await?;
                let end = encode(&Record::End(End { lines: sent }))?;
                Ok(Some((vec![vec![end]], None)))
            }
        })
        .map_ok(|chunks| futures::stream::iter(chunks.into_iter().map(Ok)))
        .try_flatten()
    }

    /// Imports the lines of an export into the caller's tenant: checks and
    /// stages them as they arrive, then applies them all in one
    /// transaction. On any error nothing is imported and the staged lines
    /// are removed.
    pub async fn import(
        &self,
        ctx: &CallerContext,
        lines: impl Stream<Item = Result<Vec<String>>> + Send,
        now: DateTime<Utc>,
    ) -> Result<ImportCounts> {
        let import_id = Id::generate();
        let outcome = self
            .stage_and_apply(ctx, import_id.as_str(), lines, now)
            .await;
        if outcome.is_err() {
            // Best effort: what is left is removed by a later import.
            let stale = now - STALE_AFTER;
            if let Err(err) = self
                .store
                .discard_import(&ctx.tenant, import_id.as_str(), stale)
                .await
            {
                tracing::warn!(error = %crate::error::report(&err), "could not discard a failed import's staged lines");
            }
        }
        outcome
    }

    /// Refuses a value or episode content larger than a Set or an append
    /// may write on this server.
    fn check_size(&self, number: i64, record: &Record) -> Result<()> {
        let (field, value) = match record {
            Record::MemoryVersion(v) => ("value", &v.value),
            Record::Episode(e) => ("content", &e.content),
            _ => return Ok(()),
        };
        let bytes = value.to_string().len();
        if bytes > self.max_value_bytes {
            return Err(malformed(
                number,
                field,
                format!(
                    "is {bytes} bytes; this server stores at most {} (--max-value-bytes)",
                    self.max_value_bytes
                ),
            ));
        }
        Ok(())
    }

    async fn stage_and_apply(
        &self,
        ctx: &CallerContext,
        import_id: &str,
        lines: impl Stream<Item = Result<Vec<String>>> + Send,
        now: DateTime<Utc>,
    ) -> Result<ImportCounts> {
        self.store
            .discard_import(&ctx.tenant, import_id, now - STALE_AFTER)
            .await?;
        let mut lines = std::pin::pin!(lines);
        let mut file = Lines::default();
        while let Some(chunk) = lines.next().await {
            let mut staged = Vec::new();
            for text in chunk? {
                let Some((number, record)) = file.read(&text)? else {
                    continue;
                };
                self.check_size(number, &record)?;
                staged.push((number, encode(&record)?));
            }
            if !staged.is_empty() {
                self.store
                    .stage_import(&ctx.tenant, import_id, &staged, now)
                    .await?;
            }
        }
        let read = file.finish()?;
        let mut counts = self.store.apply_import(&ctx.tenant, import_id).await?;
        counts.lines = read.lines;
        Ok(counts)
    }
}

/// An export's lines read in order as an import reads them, whatever
/// store they go to (and with none: `engram import --check`): each line
/// parsed and checked ([`parse_line`]), the header first and once, and in
/// a file of version 3 or later the end line last, counting the lines
/// before it.
#[derive(Debug, Default)]
pub struct Lines {
    /// The lines read so far, blank ones included (line numbers are the
    /// file's).
    number: i64,
    /// The header's format version, once read.
    version: Option<u32>,
    /// The records read (blank lines and the end line not).
    records: i64,
    ended: bool,
}

/// What [`Lines::finish`] found: a file an import can read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// Lines read, the header, the end line and blank lines included.
    pub lines: i64,
    /// The header's format version.
    pub version: u32,
}

impl Lines {
    /// The next line's record, with its line number: `None` for a blank
    /// line and for the end line, which is checked, not imported.
    pub fn read(&mut self, text: &str) -> Result<Option<(i64, Record)>> {
        self.number += 1;
        let number = self.number;
        if text.trim().is_empty() {
            return Ok(None);
        }
        let record = parse_line(number, text)?;
        if self.ended {
            return Err(malformed(
                number,
                "kind",
                "a line after the end line: import one export at a time",
            ));
        }
        match (&record, self.version) {
            (Record::Header(h), None) => self.version = Some(h.version),
            (Record::Header(_), Some(_)) => {
                let why = "a second header: import one export at a time";
                return Err(malformed(number, "kind", why));
            }
            (_, None) => {
                let why = "the first line must be the export's header";
                return Err(malformed(number, "kind", why));
            }
            (Record::End(end), Some(_)) => {
                if end.lines != self.records {
                    return Err(malformed(
                        number,
                        "lines",
                        format!(
                            "says {} lines came before it, but {} did: the file was cut or \
                             changed; export it again",
                            end.lines, self.records
                        ),
                    ));
                }
                self.ended = true;
                return Ok(None);
            }
            (_, Some(_)) => {}
        }
        self.records += 1;
        Ok(Some((number, record)))
    }

    /// After the last line: refuses a file with no header, and one of
    /// version 3 or later that ends before its end line.
    pub fn finish(&self) -> Result<Read> {
        let Some(version) = self.version else {
            return Err(malformed(
                self.number.max(1),
                "kind",
                "the file is empty: an export starts with its header line",
            ));
        };
        if version >= ENDED_FROM && !self.ended {
            return Err(malformed(
                self.number + 1,
                "kind",
                "the file ends before its end line: it was cut short (an export \
                 that broke, or a partial copy); export it again",
            ));
        }
        Ok(Read {
            lines: self.number,
            version,
        })
    }
}

fn encode(record: &Record) -> Result<String> {
    serde_json::to_string(record).map_err(Error::internal)
}

/// Parses and checks one line, naming the line (and the field) in the
/// error.
pub fn parse_line(number: i64, text: &str) -> Result<Record> {
    let record: Record = serde_json::from_str(text).map_err(|err| {
        let message = err.to_string();
        // serde_json ends its message with the position in the text, which
        // is always line 1 here: keep the column only.
        let message = message
            .rsplit_once(" at line ")
            .map_or(message.as_str(), |(message, _)| message);
        // A line that is not JSON at all (a truncated file, a log line,
        // another format) says so before serde's own words for where it
        // broke ("expected ident"); a record of the wrong shape is named
        // by serde well enough ("unknown field `colour`").
        let not_json = match err.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                "is not JSON: "
            }
            _ => "",
        };
        malformed(
            number,
            "",
            format!("{not_json}{message} (at column {})", err.column()),
        )
    })?;
    // Rare enough to read twice: a NUL escape, which Postgres's jsonb and
    // text cannot store.
    if text.contains("u0000")
        && serde_json::from_str::<serde_json::Value>(text)
            .is_ok_and(|json| crate::memory::holds_nul(&json))
    {
        return Err(malformed(number, "", crate::error::NUL_REFUSED));
    }
    record.check().map_err(|err| match err {
        Error::InvalidArgument {
            field, description, ..
        } => malformed(number, &field, description),
        other => other,
    })?;
    Ok(record)
}

fn malformed(number: i64, field: &str, description: impl Into<String>) -> Error {
    let field = if field.is_empty() {
        format!("line {number}")
    } else {
        format!("line {number}.{field}")
    };
    Error::invalid(Reason::ImportMalformed, field, description)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_hold_about_the_budget_and_at_least_one_line() {
        let lines =
            |sizes: &[usize]| -> Vec<String> { sizes.iter().map(|n| "x".repeat(*n)).collect() };
        let sizes = |chunks: Vec<Vec<String>>| -> Vec<Vec<usize>> {
            chunks
                .into_iter()
                .map(|c| c.iter().map(String::len).collect())
                .collect()
        };
        assert_eq!(
            sizes(chunks(lines(&[4, 4, 4, 12, 1]), 10)),
            [vec![4, 4], vec![4], vec![12], vec![1]]
        );
        assert_eq!(sizes(chunks(lines(&[10, 10]), 10)), [vec![10], vec![10]]);
        assert!(chunks(Vec::new(), 10).is_empty());
    }

    #[test]
    fn a_bad_line_is_named_with_its_column_or_field() {
        let err = parse_line(7, r#"{"kind":"session","id":"#).expect_err("truncated");
        match err {
            Error::InvalidArgument {
                reason,
                field,
                description,
            } => {
                assert_eq!(reason, Reason::ImportMalformed);
                assert_eq!(field, "line 7");
                assert!(description.contains("column"), "{description}");
                assert!(!description.contains("line 1"), "{description}");
            }
            other => panic!("{other:?}"),
        }
        let err = parse_line(
            3,
            r#"{"kind":"execution","execution_id":"has space","flow_id":"","flow_name":"","create_time":"2026-11-23T00:00:00Z"}"#,
        )
        .expect_err("bad id");
        assert!(
            matches!(err, Error::InvalidArgument { field, .. } if field == "line 3.execution_id")
        );
        let err = parse_line(4, r#"{"kind":"comet"}"#).expect_err("unknown kind");
        assert!(matches!(err, Error::InvalidArgument { field, .. } if field == "line 4"));
    }

    #[test]
    fn a_time_outside_the_years_1_to_9999_is_refused_by_its_field() {
        let execution = |time: &str| {
            format!(
                r#"{{"kind":"execution","execution_id":"e1","flow_id":"","flow_name":"","create_time":"{time}"}}"#
            )
        };
        parse_line(1, &execution("0001-01-01T00:00:00Z")).expect("the first second kept");
        parse_line(1, &execution("9999-12-31T23:59:59.999999Z")).expect("the last");
        for time in ["0000-12-31T23:59:59Z", "+10000-01-01T00:00:00Z"] {
            let err = parse_line(5, &execution(time)).expect_err(time);
            // A time chrono reads is refused by its field; one it does not
            // (a year of five digits) by the line.
            assert!(
                matches!(&err, Error::InvalidArgument { field, .. } if field.starts_with("line 5")),
                "{time}: {err:?}"
            );
        }
        let err = parse_line(5, &execution("0000-12-31T23:59:59Z")).expect_err("year 0");
        assert!(
            matches!(&err, Error::InvalidArgument { field, description, .. }
                if field == "line 5.create_time" && description.contains("years 1 and 9999")),
            "{err:?}"
        );
    }

    #[test]
    fn every_selection_exports_parts_in_an_order_an_import_can_apply() {
        let at = |part| Part::ALL.iter().position(|p| *p == part);
        for (before, after) in [
            (Part::Sessions, Part::Episodes),
            (Part::Episodes, Part::Working),
            (Part::Working, Part::Tasks),
            (Part::Working, Part::CachedFiles),
            (Part::Facts, Part::FactVersions),
            (Part::Facts, Part::FactSources),
            (Part::Episodes, Part::Rules),
        ] {
            assert!(at(before) < at(after), "{before:?} before {after:?}");
        }
        use Part::*;
        let user = Selection::User {
            app: Name::parse("app", "a").expect("app"),
            user: Name::parse("user", "u").expect("user"),
        };
        let session = Selection::Session(Id::parse("id", "s").expect("id"));
        let scope = Selection::Scope(crate::memory::Scope {
            scope_type: crate::memory::ScopeType::Namespace,
            name: crate::memory::ScopeName::parse("scope", "s").expect("scope"),
        });
        assert_eq!(Selection::Tenant.parts(), &Part::ALL[..]);
        assert_eq!(
            user.parts(),
            [
                Executions,
                Memory,
                Sessions,
                Episodes,
                Working,
                Tasks,
                CachedFiles,
                Facts,
                FactVersions,
                FactSources
            ]
        );
        assert_eq!(
            session.parts(),
            [
                Executions,
                Memory,
                Sessions,
                Episodes,
                Working,
                Tasks,
                CachedFiles
            ]
        );
        assert_eq!(scope.parts(), [Executions, Memory]);
    }
}
