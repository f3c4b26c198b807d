//! Summarizers behind `Compact`. The built-in one is extractive and
//! deterministic (no network, the default); others talk to a model. A
//! summarizer only produces text: whether and where it is written is the
//! caller's business, so a failure here never leaves anything half-written.

use std::collections::HashMap;

use futures::future::BoxFuture;

mod extractive;
mod openai;

pub use extractive::Extractive;
pub use openai::{OpenAi, OpenAiConfig};

/// One piece of text to summarise, with where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub key: String,
    pub version: i64,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryRequest {
    pub sources: Vec<Source>,
    /// Extra guidance, e.g. "keep only decisions"; may be empty.
    pub instruction: String,
    /// The model to ask; empty means the summarizer's default.
    pub model: String,
    /// Upper bound on the summary length, in tokens.
    pub max_tokens: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub text: String,
    /// The model that actually produced the text.
    pub model: String,
}

/// Why a summary could not be made; shown to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SummarizerError(pub String);

pub trait Summarizer: Send + Sync + 'static {
    fn summarize(&self, request: SummaryRequest)
    -> BoxFuture<'_, Result<Summary, SummarizerError>>;
}

/// Lowercased words of a text, for scoring.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.len() > 2)
        .map(str::to_lowercase)
}

/// How often each word appears across all sources.
fn frequencies(sources: &[Source]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for source in sources {
        for word in words(&source.text) {
            *counts.entry(word).or_insert(0) += 1;
        }
    }
    counts
}
