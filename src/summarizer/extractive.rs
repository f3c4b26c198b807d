//! The built-in summarizer: picks the sentences that carry the most
//! frequent words (a classic extractive summary), keeps them in their
//! original order and stops at the token budget. The same input always
//! gives the same output.

use futures::future::BoxFuture;

use super::{Summarizer, SummarizerError, Summary, SummaryRequest, frequencies, words};

/// The model name recorded in audit records for this summarizer.
pub const MODEL: &str = "engram-extractive-v1";

#[derive(Debug, Clone, Copy, Default)]
pub struct Extractive;

struct Sentence {
    position: usize,
    text: String,
    score: f64,
    tokens: usize,
}

/// Sentences of a text: split after `.`, `!`, `?` and at line breaks.
fn sentences(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        if c == '\n' {
            push_sentence(&mut out, &mut current);
            continue;
        }
        current.push(c);
        if matches!(c, '.' | '!' | '?') {
            push_sentence(&mut out, &mut current);
        }
    }
    push_sentence(&mut out, &mut current);
    out
}

fn push_sentence(out: &mut Vec<String>, current: &mut String) {
    let sentence = current.trim();
    if !sentence.is_empty() {
        out.push(sentence.to_owned());
    }
    current.clear();
}

impl Extractive {
    pub fn summarize_now(&self, request: &SummaryRequest) -> Summary {
        let counts = frequencies(&request.sources);
        let instruction_words: Vec<String> = words(&request.instruction).collect();
        let mut candidates: Vec<Sentence> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for source in &request.sources {
            for text in sentences(&source.text) {
                if !seen.insert(text.clone()) {
                    continue; // the same sentence in two versions counts once
                }
                let sentence_words: Vec<String> = words(&text).collect();
                let mut score: f64 = sentence_words
                    .iter()
                    .map(|w| counts.get(w).copied().unwrap_or(0) as f64)
                    .sum::<f64>()
                    / (sentence_words.len().max(1) as f64).sqrt();
                // Sentences that speak to the instruction come first.
                if sentence_words.iter().any(|w| instruction_words.contains(w)) {
                    score *= 2.0;
                }
                candidates.push(Sentence {
                    position: candidates.len(),
                    tokens: text.split_whitespace().count(),
                    text,
                    score,
                });
            }
        }
        // Best first; ties go to the earlier sentence, so the order is total.
        candidates.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then(a.position.cmp(&b.position))
        });
        let budget = request.max_tokens.max(1) as usize;
        let mut used = 0;
        let mut chosen: Vec<&Sentence> = Vec::new();
        for sentence in &candidates {
            if used + sentence.tokens > budget && !chosen.is_empty() {
                continue;
            }
            used += sentence.tokens;
            chosen.push(sentence);
            if used >= budget {
                break;
            }
        }
        chosen.sort_by_key(|s| s.position);
        let mut text = chosen
            .iter()
            .map(|s| s.text.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        // A single sentence longer than the whole budget is cut at the budget.
        if used > budget {
            text = text
                .split_whitespace()
                .take(budget)
                .collect::<Vec<_>>()
                .join(" ");
        }
        Summary {
            text,
            model: MODEL.to_owned(),
        }
    }
}

impl Summarizer for Extractive {
    fn summarize(
        &self,
        request: SummaryRequest,
    ) -> BoxFuture<'_, Result<Summary, SummarizerError>> {
        Box::pin(async move { Ok(self.summarize_now(&request)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summarizer::Source;

    fn request(texts: &[&str], max_tokens: u32, instruction: &str) -> SummaryRequest {
        SummaryRequest {
            sources: texts
                .iter()
                .enumerate()
                .map(|(i, t)| Source {
                    key: "k".to_owned(),
                    version: i as i64 + 1,
                    text: (*t).to_owned(),
                })
                .collect(),
            instruction: instruction.to_owned(),
            model: String::new(),
            max_tokens,
        }
    }

    #[test]
    fn keeps_the_sentences_about_what_recurs_in_their_order() {
        let texts = [
            "The deploy failed on Monday. Lunch was pizza.",
            "The deploy failed again because the deploy key expired. Someone said hello.",
            "We rotated the deploy key and the deploy passed.",
        ];
        let summary = Extractive.summarize_now(&request(&texts, 25, ""));
        assert_eq!(
            summary.text,
            "The deploy failed on Monday. The deploy failed again because the deploy key expired. \
             We rotated the deploy key and the deploy passed."
        );
        assert_eq!(summary.model, MODEL);
        // Deterministic.
        assert_eq!(Extractive.summarize_now(&request(&texts, 25, "")), summary);
    }

    #[test]
    fn respects_the_budget_and_the_instruction() {
        let texts = ["Alpha beta gamma delta. Pizza pizza pizza is lunch. Alpha beta again."];
        let short = Extractive.summarize_now(&request(&texts, 3, ""));
        assert!(short.text.split_whitespace().count() <= 3, "{}", short.text);
        let lunch = Extractive.summarize_now(&request(&texts, 5, "what was lunch"));
        assert_eq!(lunch.text, "Pizza pizza pizza is lunch.");
        assert_eq!(Extractive.summarize_now(&request(&[""], 10, "")).text, "");
    }
}
