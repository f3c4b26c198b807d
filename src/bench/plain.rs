//! Plain BM25 over a data set's turns, as `recall-eval`'s reference row:
//! the baseline the built-in search is measured against on the same
//! questions, so that a data set's figures say how much the search adds
//! (the Search issue states its target against such a baseline).
//!
//! "Plain" means what the usual textbook setup does and nothing more:
//! lowercased runs of letters and digits as terms (no stemming, no stop
//! words, no phrases), Okapi BM25 with k1 = 1.2 and b = 0.75 and the
//! idf `ln(1 + (N - df + 0.5) / (df + 0.5))`, over the same texts the
//! search indexes (`"speaker: text"`) and within the same turns (the
//! question's conversation, or every turn). Written here because it is a
//! few lines of arithmetic over data already in memory; a search library
//! would bring its own tokenizer and scoring choices to explain.

use std::collections::HashMap;

const K1: f64 = 1.2;
const B: f64 = 0.75;

/// A plain BM25 index of some documents.
pub(super) struct PlainBm25 {
    /// Each document's term counts and length in terms.
    docs: Vec<(HashMap<String, u32>, usize)>,
    /// Documents holding each term.
    df: HashMap<String, usize>,
    average_length: f64,
}

/// The terms of a text: lowercased runs of letters and digits.
fn terms(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
}

impl PlainBm25 {
    pub(super) fn new<'a>(texts: impl IntoIterator<Item = &'a str>) -> Self {
        let mut df: HashMap<String, usize> = HashMap::new();
        let docs: Vec<(HashMap<String, u32>, usize)> = texts
            .into_iter()
            .map(|text| {
                let mut counts: HashMap<String, u32> = HashMap::new();
                let mut length = 0;
                for term in terms(text) {
                    *counts.entry(term).or_default() += 1;
                    length += 1;
                }
                for term in counts.keys() {
                    *df.entry(term.clone()).or_default() += 1;
                }
                (counts, length)
            })
            .collect();
        let total: usize = docs.iter().map(|(_, length)| length).sum();
        let average_length = total as f64 / docs.len().max(1) as f64;
        PlainBm25 {
            docs,
            df,
            average_length,
        }
    }

    /// The documents holding any of the query's terms, best first (by
    /// index; ties keep document order).
    pub(super) fn rank(&self, query: &str) -> Vec<usize> {
        let n = self.docs.len() as f64;
        // Each query term with its idf, once for all documents.
        let query: Vec<(String, f64)> = terms(query)
            .map(|term| {
                let df = self.df.get(&term).copied().unwrap_or(0) as f64;
                (term, (1.0 + (n - df + 0.5) / (df + 0.5)).ln())
            })
            .collect();
        let mut scored: Vec<(f64, usize)> = self
            .docs
            .iter()
            .enumerate()
            .filter_map(|(at, (counts, length))| {
                let norm = K1 * (1.0 - B + B * *length as f64 / self.average_length.max(1.0));
                let score: f64 = query
                    .iter()
                    .filter_map(|(term, idf)| {
                        let tf = f64::from(*counts.get(term)?);
                        Some(idf * tf * (K1 + 1.0) / (tf + norm))
                    })
                    .sum();
                (score > 0.0).then_some((score, at))
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.into_iter().map(|(_, at)| at).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_are_lowercased_runs_of_letters_and_digits() {
        let got: Vec<String> =
            terms("Jon: I signed up for the Porto half-marathon, in 2024!").collect();
        assert_eq!(
            got,
            [
                "jon", "i", "signed", "up", "for", "the", "porto", "half", "marathon", "in", "2024"
            ]
        );
    }

    #[test]
    fn rarer_words_and_shorter_turns_rank_first() {
        // "a" is in every turn and "porto" in one: porto decides; the
        // others tie on "a" and keep their order.
        let index = PlainBm25::new(["a b", "a porto", "a c", "a d"]);
        assert_eq!(index.rank("a porto"), [1, 0, 2, 3]);
        // The same word once: the shorter turn first.
        let index = PlainBm25::new(["porto x y z w v", "porto x"]);
        assert_eq!(index.rank("porto"), [1, 0]);
        // No term in common: no match at all, not a ranking of everything.
        assert_eq!(index.rank("lisbon"), Vec::<usize>::new());
    }
}
