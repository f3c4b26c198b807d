//! A summarizer that asks any OpenAI-compatible chat-completions endpoint
//! through the shared client (`crate::openai`: timeouts, retries, the key
//! kept out of logs).

use std::fmt;

use futures::future::BoxFuture;
use serde_json::json;

use super::{Summarizer, SummarizerError, Summary, SummaryRequest};
use crate::openai::{Client, HttpConfig};

const SYSTEM_PROMPT: &str = "You compact the memory of an AI agent. Summarise the entries you are given \
into one concise note that keeps the facts, decisions and open questions and drops chatter. \
Reply with the note only.";

/// Settings of the HTTP summarizer.
#[derive(Clone)]
pub struct OpenAiConfig {
    pub http: HttpConfig,
    /// The model asked when a request names none.
    pub model: String,
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("http", &self.http)
            .field("model", &self.model)
            .finish()
    }
}

pub struct OpenAi {
    client: Client,
    model: String,
}

impl OpenAi {
    pub fn new(config: OpenAiConfig) -> Result<Self, String> {
        Ok(OpenAi {
            client: Client::new(config.http, "/chat/completions", "summarizer")?,
            model: config.model,
        })
    }

    fn body(&self, request: &SummaryRequest, model: &str) -> serde_json::Value {
        let mut prompt = String::new();
        if !request.instruction.is_empty() {
            prompt.push_str(&format!("Instruction: {}\n\n", request.instruction));
        }
        for source in &request.sources {
            prompt.push_str(&format!(
                "### {} (version {})\n{}\n\n",
                source.key, source.version, source.text
            ));
        }
        json!({
            "model": model,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": prompt.trim_end()},
            ],
            "max_tokens": request.max_tokens,
            "temperature": 0,
        })
    }
}

impl Summarizer for OpenAi {
    fn summarize(
        &self,
        request: SummaryRequest,
    ) -> BoxFuture<'_, Result<Summary, SummarizerError>> {
        Box::pin(async move {
            let model = if request.model.is_empty() {
                self.model.clone()
            } else {
                request.model.clone()
            };
            let answer = self
                .client
                .post(&self.body(&request, &model))
                .await
                .map_err(SummarizerError)?;
            match answer["choices"][0]["message"]["content"].as_str() {
                Some(text) => Ok(Summary {
                    text: text.trim().to_owned(),
                    model: answer["model"].as_str().unwrap_or(&model).to_owned(),
                }),
                None => Err(SummarizerError(
                    "the answer has no choices[0].message.content".to_owned(),
                )),
            }
        })
    }
}
