//! Embedders: text to vectors, for semantic search. The one built in asks
//! any OpenAI-compatible `/embeddings` endpoint (OpenAI, Ollama, vLLM,
//! TEI) through the shared client (`crate::openai`: timeouts, retries on
//! 429 and 5xx, the key kept out of logs).
//!
//! Vectors are stored normalised to unit length as little-endian `f32`s,
//! so cosine similarity is a dot product.

use std::fmt;

use futures::future::BoxFuture;
use serde_json::json;

use crate::openai::{Client, HttpConfig};

/// The longest text sent for one item, in characters: past it the start is
/// embedded (models truncate far below this anyway).
pub const MAX_TEXT_CHARS: usize = 8_000;

/// Why texts could not be embedded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EmbedderError(pub String);

pub trait Embedder: Send + Sync + 'static {
    /// The model's name, stored with each vector: vectors of another model
    /// are never compared with this one's.
    fn model(&self) -> &str;

    /// One vector per text, in order, each of unit length.
    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedderError>>;
}

/// Settings of the HTTP embedder.
#[derive(Clone)]
pub struct EmbedderConfig {
    pub http: HttpConfig,
    pub model: String,
    /// Asked of models that can shorten their vectors (`dimensions`);
    /// `None`: the model's own. Every vector must have it.
    pub dimensions: Option<u32>,
    /// The most texts sent in one call.
    pub batch: usize,
}

impl fmt::Debug for EmbedderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbedderConfig")
            .field("http", &self.http)
            .field("model", &self.model)
            .field("dimensions", &self.dimensions)
            .field("batch", &self.batch)
            .finish()
    }
}

impl EmbedderConfig {
    /// How long a worker's claim on a batch holds: one call with every
    /// retry and its backoff, and a margin for storing the vectors.
    pub fn lease(&self) -> std::time::Duration {
        let retries = self.http.retries;
        self.http.timeout * (retries + 1)
            + std::time::Duration::from_secs(10) * retries
            + std::time::Duration::from_secs(30)
    }
}

pub struct OpenAiEmbedder {
    client: Client,
    model: String,
    dimensions: Option<u32>,
}

impl OpenAiEmbedder {
    pub fn new(config: EmbedderConfig) -> Result<Self, String> {
        Ok(OpenAiEmbedder {
            client: Client::new(config.http, "/embeddings", "embedder")?,
            model: config.model,
            dimensions: config.dimensions,
        })
    }
}

impl Embedder for OpenAiEmbedder {
    fn model(&self) -> &str {
        &self.model
    }

    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedderError>> {
        Box::pin(async move {
            let input: Vec<&str> = texts.iter().map(|t| clip(t)).collect();
            let mut body = json!({"model": self.model, "input": input});
            if let Some(dimensions) = self.dimensions {
                body["dimensions"] = json!(dimensions);
            }
            let answer = self.client.post(&body).await.map_err(EmbedderError)?;
            vectors(&answer, texts.len(), self.dimensions)
        })
    }
}

/// The start of a text, at most [`MAX_TEXT_CHARS`] characters, trimmed;
/// never empty (endpoints refuse an empty input). Clipping a clipped text
/// changes nothing, so a caller may clip before it holds many texts.
pub fn clip(text: &str) -> &str {
    let text = text.trim_start();
    let text = match text.char_indices().nth(MAX_TEXT_CHARS) {
        Some((at, _)) => &text[..at],
        None => text,
    };
    let text = text.trim_end();
    if text.is_empty() { " " } else { text }
}

/// What an item is embedded as: the start of its text, as [`clip`] keeps
/// it. The worker and the backfill hold these, not the items, so a batch
/// of megabyte values holds kilobytes.
pub fn input(item: &crate::search::Item) -> String {
    clip(&item.text()).to_owned()
}

/// The vectors of an `/embeddings` answer, by their `index`, normalised.
fn vectors(
    answer: &serde_json::Value,
    expected: usize,
    dimensions: Option<u32>,
) -> Result<Vec<Vec<f32>>, EmbedderError> {
    let data = answer["data"]
        .as_array()
        .ok_or_else(|| EmbedderError("the answer has no data array".to_owned()))?;
    if data.len() != expected {
        return Err(EmbedderError(format!(
            "asked for {expected} vectors, got {}",
            data.len()
        )));
    }
    let mut out = vec![Vec::new(); expected];
    for (position, entry) in data.iter().enumerate() {
        let index = entry["index"]
            .as_u64()
            .map_or(position, |i| usize::try_from(i).unwrap_or(usize::MAX));
        let slot = out
            .get_mut(index)
            .ok_or_else(|| EmbedderError(format!("vector index {index} out of range")))?;
        let values = entry["embedding"]
            .as_array()
            .ok_or_else(|| EmbedderError(format!("data[{position}] has no embedding")))?;
        let vector: Vec<f32> = values
            .iter()
            .map(|v| v.as_f64().map(|v| v as f32))
            .collect::<Option<_>>()
            .ok_or_else(|| EmbedderError(format!("data[{position}] holds a non-number")))?;
        if vector.is_empty() {
            return Err(EmbedderError(format!("data[{position}] is empty")));
        }
        if let Some(d) = dimensions
            && vector.len() != d as usize
        {
            return Err(EmbedderError(format!(
                "expected {d} dimensions, got {}",
                vector.len()
            )));
        }
        *slot = normalized(vector);
    }
    if out.iter().any(Vec::is_empty) {
        return Err(EmbedderError("the answer repeats an index".to_owned()));
    }
    Ok(out)
}

/// The vector scaled to unit length (a zero vector stays zero).
pub fn normalized(mut vector: Vec<f32>) -> Vec<f32> {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|x| *x /= norm);
    }
    vector
}

/// A vector as it is stored: little-endian `f32`s.
pub fn encode(vector: &[f32]) -> Vec<u8> {
    vector.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The cosine similarity of a unit query vector and a stored unit vector;
/// `None` when their dimensions differ.
pub fn similarity(query: &[f32], stored: &[u8]) -> Option<f32> {
    if stored.len() != query.len() * 4 {
        return None;
    }
    Some(
        stored
            .chunks_exact(4)
            .zip(query)
            .map(|(bytes, q)| f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) * q)
            .sum(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_by_index_and_normalised() {
        let answer = json!({"data": [
            {"index": 1, "embedding": [0.0, 2.0]},
            {"index": 0, "embedding": [3.0, 4.0]},
        ]});
        let got = vectors(&answer, 2, None).expect("valid");
        assert_eq!(got, vec![vec![0.6, 0.8], vec![0.0, 1.0]]);
        assert!(vectors(&answer, 3, None).is_err(), "a missing vector");
        assert!(vectors(&answer, 2, Some(3)).is_err(), "wrong dimensions");
        let repeated = json!({"data": [
            {"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]},
        ]});
        assert!(vectors(&repeated, 2, None).is_err());
    }

    #[test]
    fn similarity_is_the_dot_product_of_unit_vectors() {
        let a = normalized(vec![1.0, 1.0]);
        let stored = encode(&normalized(vec![1.0, 0.0]));
        let s = similarity(&a, &stored).expect("same dimensions");
        assert!((s - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6);
        assert_eq!(similarity(&[1.0], &stored), None);
    }

    #[test]
    fn texts_are_clipped_and_never_empty() {
        assert_eq!(clip("  "), " ");
        assert_eq!(
            clip(&"é".repeat(MAX_TEXT_CHARS + 5)).chars().count(),
            MAX_TEXT_CHARS
        );
        // Cut where a space falls, the clipped text ends with a word, and
        // clipping it again changes nothing.
        let text = format!("  {} tail", "ab ".repeat(MAX_TEXT_CHARS));
        let clipped = clip(&text);
        assert!(clipped.starts_with("ab") && clipped.ends_with("ab"));
        assert_eq!(clip(clipped), clipped);
    }
}
