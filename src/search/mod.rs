//! Recall: finding memory entries, facts and episodes by what they say.
//!
//! The domain parses the query ([`Query`]), checks the filters and the mode,
//! asks the store for the best live items of the sources
//! ([`ports::SearchStore`]) and merges them by score. The stores keep their
//! lexical indexes in the writing transaction (Postgres: stored `tsvector`
//! columns under GIN; SQLite: FTS5 tables kept by triggers; both ranked by
//! the same BM25 over the matches, with statistics of the caller's own
//! items pooled over the sources searched, so that hits of different
//! sources compare), so a write is
//! findable once its call returned, and a deleted key, a purged version,
//! an evicted episode or a deleted fact is gone in the same transaction
//! that removed it.

pub mod cjk;
pub mod embedder;
pub mod english;
pub mod markup;
pub mod numbers;
pub mod ports;
mod query;
mod service;
pub mod snippet;
pub mod spelling;
pub mod turns;
pub mod vector;
pub mod worker;

use std::collections::HashSet;

use chrono::{DateTime, Utc};

pub use query::{MAX_QUERY_BYTES, MAX_TERMS, Query};
pub use service::{DEFAULT_LIMIT, MAX_FOLLOWING, MAX_LIMIT, Search, SearchRequest};

use crate::consolidation::{Fact, FactKind};
use crate::memory::{Entry, KeyPrefix, ScopeName, ScopeType};
use crate::sessions::{Episode, EpisodeType, Id, Name};

/// A kind of item Search looks through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    Memory,
    Facts,
    Episodes,
}

impl Source {
    pub const ALL: [Source; 3] = [Source::Memory, Source::Facts, Source::Episodes];
}

/// How a query is matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Lexical,
    Semantic,
    Hybrid,
}

/// What narrows each source; a filter of one source leaves the others
/// alone.
#[derive(Debug, Clone, Default)]
pub struct Filters {
    /// Memory.
    pub scope_type: Option<ScopeType>,
    /// Memory; only with `scope_type`.
    pub scope: Option<ScopeName>,
    /// Memory: scope names starting with this (same alphabet as keys).
    pub scope_prefix: Option<KeyPrefix>,
    /// Memory.
    pub key_prefix: Option<KeyPrefix>,
    /// Facts and episodes.
    pub app: Option<Name>,
    /// Facts and episodes.
    pub user: Option<Name>,
    /// Episodes.
    pub session_id: Option<Id>,
    /// Episodes.
    pub agent: Option<Name>,
    /// Episodes; empty: any type.
    pub types: Vec<EpisodeType>,
    /// Facts.
    pub kind: Option<FactKind>,
    /// Every source: the item's time is at or after this.
    pub start: Option<DateTime<Utc>>,
    /// Every source: the item's time is before this.
    pub end: Option<DateTime<Utc>>,
}

/// An item found.
#[derive(Debug, Clone)]
pub enum Item {
    /// A memory entry at its current version.
    Entry(Entry),
    /// A live fact at its newest version.
    Fact(Fact),
    Episode(Episode),
}

impl Item {
    /// The item's identity at its version, as the outbox names it.
    pub fn reference(&self) -> ports::ItemRef {
        match self {
            Item::Entry(entry) => ports::ItemRef::Memory {
                scope_type: entry.scope.scope_type.as_i16(),
                scope: entry.scope.name.as_str().to_owned(),
                key: entry.key.as_str().to_owned(),
                version: entry.version,
            },
            Item::Fact(fact) => ports::ItemRef::Fact {
                id: fact.id.clone(),
                version: fact.current.version,
            },
            Item::Episode(episode) => ports::ItemRef::Episode {
                session_id: episode.session_id.clone(),
                seq: episode.seq,
            },
        }
    }

    /// The text the item is searched and embedded by: a memory entry's
    /// key and the strings and numbers in its value; a fact's subject,
    /// predicate, object and content; an episode's content and metadata
    /// values; space-separated.
    pub fn text(&self) -> String {
        let mut out = String::new();
        // An episode's text starts with a space, as it always has: the
        // embeddings already stored were made of it.
        let mut first = !matches!(self, Item::Episode(_));
        self.each_string(&mut |s| {
            if !first {
                out.push(' ');
            }
            first = false;
            out.push_str(s);
        });
        out
    }

    /// The text a reader sees, for snippets: each string of [`text`]
    /// through [`markup::visible`] alone, as the indexes read each alone,
    /// so that markup left open in one string (a `<script>` cut short)
    /// hides nothing of the next. A fact's is its content, led by the
    /// parts of its triple whose words the content does not hold.
    ///
    /// [`text`]: Item::text
    pub fn visible_text(&self) -> String {
        let mut strings = Vec::new();
        match self {
            // The triple's parts the content already says would be shown
            // twice: "alice prefers dark mode Alice prefers dark mode".
            Item::Fact(fact) => {
                let current = &fact.current;
                each_json_string(&current.content, &mut |s| {
                    strings.push(markup::visible(s).into_owned())
                });
                let said: HashSet<String> = strings
                    .iter()
                    .flat_map(|s| {
                        snippet::word_ranges(s)
                            .into_iter()
                            .map(|w| english::lexeme(&s[w]))
                    })
                    .collect();
                let parts = [&current.subject, &current.predicate, &current.object];
                let unsaid = parts.into_iter().filter(|part| {
                    snippet::word_ranges(part)
                        .into_iter()
                        .any(|w| !said.contains(&english::lexeme(&part[w])))
                });
                let unsaid: Vec<&str> = unsaid.map(String::as_str).collect();
                if !unsaid.is_empty() {
                    let unsaid = markup::visible(&unsaid.join(" ")).into_owned();
                    strings = match strings.iter().any(|s| !s.is_empty()) {
                        true => vec![unsaid, "—".into(), strings.join(" ")],
                        false => vec![unsaid],
                    };
                }
            }
            _ => self.each_string(&mut |s| strings.push(markup::visible(s).into_owned())),
        }
        strings.retain(|s| !s.is_empty());
        strings.join(" ")
    }

    /// Each string the item is searched by, in order, as the indexes read
    /// them one by one (a fact's subject, predicate and object are one).
    fn each_string(&self, each: &mut dyn FnMut(&str)) {
        match self {
            Item::Entry(entry) => {
                each(entry.key.as_str());
                if let Some(value) = &entry.value {
                    each_json_string(value.json(), each);
                }
            }
            Item::Fact(fact) => {
                let current = &fact.current;
                fact_strings(
                    &current.subject,
                    &current.predicate,
                    &current.object,
                    &current.content,
                    each,
                );
            }
            Item::Episode(episode) => {
                each_json_string(&episode.content, each);
                for value in episode.metadata.values() {
                    each_json_string(value, each);
                }
            }
        }
    }
}

/// An item found, how well it matched, and an excerpt with the matched
/// words marked `**like this**`.
#[derive(Debug, Clone)]
pub struct Hit {
    pub score: f64,
    pub snippet: String,
    pub item: Item,
}

impl crate::paging::Weigh for Item {
    fn weight(&self) -> usize {
        match self {
            Item::Entry(entry) => entry.weight(),
            Item::Fact(fact) => fact.weight(),
            Item::Episode(episode) => episode.weight(),
        }
    }
}

/// A hit weighs more than its item, so the store, reading items best
/// first, reads at least as many as the answer then keeps.
impl crate::paging::Weigh for Hit {
    fn weight(&self) -> usize {
        self.snippet.len() + self.item.weight() + 16
    }
}

impl Hit {
    pub fn source(&self) -> Source {
        match self.item {
            Item::Entry(_) => Source::Memory,
            Item::Fact(_) => Source::Facts,
            Item::Episode(_) => Source::Episodes,
        }
    }
}

/// Each string a fact is searched by, in order: its subject, predicate
/// and object as one, then the strings and numbers of its content.
pub fn fact_strings(
    subject: &str,
    predicate: &str,
    object: &str,
    content: &serde_json::Value,
    each: &mut dyn FnMut(&str),
) {
    each(&format!("{subject} {predicate} {object}"));
    each_json_string(content, each);
}

/// Each string and number inside a JSON value, in order.
fn each_json_string(value: &serde_json::Value, each: &mut dyn FnMut(&str)) {
    match value {
        serde_json::Value::String(s) => each(s),
        serde_json::Value::Number(n) => each(&n.to_string()),
        serde_json::Value::Array(items) => items.iter().for_each(|v| each_json_string(v, each)),
        serde_json::Value::Object(map) => map.values().for_each(|v| each_json_string(v, each)),
        serde_json::Value::Bool(_) | serde_json::Value::Null => {}
    }
}

/// A character class of Postgres's regular expressions holding `chars`
/// (given in order): each run of neighbouring code points as a range,
/// `\uXXXX` escapes, `\UXXXXXXXX` past the Basic Multilingual Plane. How
/// the search migrations write the classes the Rust readers hold (tests
/// compare the two: [`cjk::postgres_class`], [`spelling::postgres_class`]).
pub fn postgres_class(chars: impl IntoIterator<Item = char>) -> String {
    let chars: Vec<char> = chars.into_iter().collect();
    let mut out = String::from("[");
    for run in chars.chunk_by(|a, b| u32::from(*a) + 1 == u32::from(*b)) {
        let (first, last) = (run[0], run[run.len() - 1]);
        out.push_str(&postgres_escape(first));
        if last != first {
            out.push('-');
            out.push_str(&postgres_escape(last));
        }
    }
    out.push(']');
    out
}

/// `c` as Postgres's regular expressions and `E''` strings write it:
/// `\uXXXX`, or `\UXXXXXXXX` past the Basic Multilingual Plane.
pub fn postgres_escape(c: char) -> String {
    let code = u32::from(c);
    if code > 0xffff {
        format!("\\U{code:08x}")
    } else {
        format!("\\u{code:04x}")
    }
}
