//! `engram recall-eval`: how well Search finds the turns that answer a
//! question, on a labeled conversational data set.
//!
//! The data set is JSON Lines, one object per line, of two kinds:
//!
//! ```text
//! {"conversation": "c1", "user": "alice", "turns": [
//!     {"id": "t1", "speaker": "alice", "text": "I moved to Lisbon in May."}, ...]}
//! {"conversation": "c1", "question": "Where does alice live now?", "answers": ["t1"]}
//! ```
//!
//! A conversation line lists its turns in order (`user` is optional and
//! defaults to the conversation id; `speaker` is optional). A question line
//! names its conversation and the ids of the turns that hold the answer;
//! a question with no answers is skipped (unanswerable). Each conversation
//! becomes a session of episodes (`type: turn`, content `"speaker: text"`,
//! id `conversation:turn`), appended idempotently, so a rerun on the same
//! database loads nothing twice. Each question is asked through Search over
//! episodes, within its conversation by default (`--within all` searches
//! every conversation), and the report gives recall@1/5/10 (the share of
//! questions with an answer turn among the first k hits), MRR and the
//! search latency, beside the same figures for plain BM25 over the same
//! turns ([`super::plain`]) as the reference.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tonic::service::interceptor::InterceptedService;

use super::Latency;
use super::plain::PlainBm25;
use super::server::Spawned;
use crate::api::convert::json_to_proto;
use crate::cli::{Bearer, CliError, CliResult, Output, Progress, exit, print_json};
use crate::proto;
use crate::proto::episode_service_client::EpisodeServiceClient;
use crate::proto::search_service_client::SearchServiceClient;

/// Questions asked at once.
const CONCURRENCY: usize = 8;

/// Turns per append.
const BATCH: usize = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Within {
    /// Search only the question's conversation (its session).
    Conversation,
    /// Search every conversation loaded.
    All,
}

/// The data set's format, after the options in `engram recall-eval
/// --help`.
const FORMAT: &str = r#"The data set (--data) is JSON Lines, one object per line, of two kinds:

  {"conversation": "c1", "user": "alice", "turns": [
      {"id": "t1", "speaker": "alice", "text": "I moved to Lisbon in May."}, ...]}
  {"conversation": "c1", "question": "Where does alice live now?", "answers": ["t1"]}

A conversation lists its turns in order ("user" defaults to the conversation id,
"speaker" is optional). A question names its conversation and the ids of the turns
that answer it; a question with no answers is skipped. tests/data/recall.jsonl in
the repository is an example."#;

/// Arguments of `engram recall-eval`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_long_help = FORMAT)]
pub struct RecallArgs {
    /// The labeled data set (JSON Lines; its format is at the end of `engram
    /// recall-eval --help`)
    #[arg(long)]
    pub data: PathBuf,

    /// A running server (http://host:port); without it one is started on
    /// --database-url
    #[arg(long)]
    pub server: Option<String>,

    /// The bearer token for a --server that requires one
    #[arg(long, env = "ENGRAM_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// The database the started server uses
    #[arg(
        long,
        env = "ENGRAM_DATABASE_URL",
        default_value = "sqlite://engram-recall.db"
    )]
    pub database_url: String,

    /// Where each question is searched
    #[arg(long, value_enum, default_value_t = Within::Conversation)]
    pub within: Within,

    /// The app the conversations are loaded under
    #[arg(long, default_value = "recall-eval")]
    pub app: String,

    /// Also ask with this many following episodes per hit (1 to 3) and
    /// report both; 0 asks only the plain search
    #[arg(long, default_value_t = 1)]
    pub following: i32,

    /// Also print each question whose answer was not in the top 10, with
    /// the best hit it got instead (to see what the search misses)
    #[arg(long)]
    pub show_misses: bool,

    /// text for people, json for keeping figures over time
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

#[derive(Debug, Deserialize)]
struct Turn {
    id: String,
    #[serde(default)]
    speaker: String,
    text: String,
}

impl Turn {
    /// What the turn's episode holds, and so what is searched:
    /// `"speaker: text"`.
    fn content(&self) -> String {
        if self.speaker.is_empty() {
            self.text.clone()
        } else {
            format!("{}: {}", self.speaker, self.text)
        }
    }
}

/// One line of the data set.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Line {
    Conversation {
        conversation: String,
        #[serde(default)]
        user: Option<String>,
        turns: Vec<Turn>,
    },
    Question {
        conversation: String,
        question: String,
        answers: Vec<String>,
    },
}

struct Question {
    conversation: String,
    text: String,
    answers: HashSet<String>,
}

struct DataSet {
    /// Conversation id to its user and turns.
    conversations: BTreeMap<String, (String, Vec<Turn>)>,
    questions: Vec<Question>,
}

fn read(path: &PathBuf) -> CliResult<DataSet> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| CliError::usage(format!("cannot read {}: {err}", path.display())))?;
    let mut data = DataSet {
        conversations: BTreeMap::new(),
        questions: Vec::new(),
    };
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let parsed: Line = serde_json::from_str(line).map_err(|err| {
            CliError::usage(format!(
                "{}:{}: not a conversation or question line: {err}",
                path.display(),
                n + 1
            ))
        })?;
        match parsed {
            Line::Conversation {
                conversation,
                user,
                turns,
            } => {
                let user = user.unwrap_or_else(|| conversation.clone());
                data.conversations.insert(conversation, (user, turns));
            }
            Line::Question {
                conversation,
                question,
                answers,
            } => {
                if !answers.is_empty() {
                    data.questions.push(Question {
                        conversation,
                        text: question,
                        answers: answers.into_iter().collect(),
                    });
                }
            }
        }
    }
    if let Some(q) = data
        .questions
        .iter()
        .find(|q| !data.conversations.contains_key(&q.conversation))
    {
        return Err(CliError::usage(format!(
            "question {:?} names conversation {:?}, which the file does not hold",
            q.text, q.conversation
        )));
    }
    Ok(data)
}

/// How well the answers ranked.
#[derive(Debug, Serialize)]
struct Figures {
    recall_at_1: f64,
    recall_at_5: f64,
    recall_at_10: f64,
    mrr: f64,
}

impl Figures {
    /// From each question's rank of its first answer turn (from 0; none
    /// when no answer turn was found).
    fn of(ranks: &[Option<usize>]) -> Figures {
        let n = ranks.len().max(1) as f64;
        let recall =
            |k: usize| ranks.iter().filter(|r| r.is_some_and(|r| r < k)).count() as f64 / n;
        let mrr = ranks
            .iter()
            .map(|r| r.map_or(0.0, |r| 1.0 / (r + 1) as f64))
            .sum::<f64>()
            / n;
        Figures {
            recall_at_1: recall(1),
            recall_at_5: recall(5),
            recall_at_10: recall(10),
            mrr,
        }
    }
}

/// Some conversations' turns under plain BM25, each named by its
/// conversation and id.
struct Turns<'a> {
    names: Vec<(&'a String, &'a String)>,
    index: PlainBm25,
}

impl<'a> Turns<'a> {
    fn of(data: &'a DataSet, conversations: impl IntoIterator<Item = &'a String>) -> Self {
        let turns: Vec<(&String, &Turn)> = conversations
            .into_iter()
            .flat_map(|c| data.conversations[c].1.iter().map(move |turn| (c, turn)))
            .collect();
        let contents: Vec<String> = turns.iter().map(|(_, turn)| turn.content()).collect();
        Turns {
            names: turns.iter().map(|(c, turn)| (*c, &turn.id)).collect(),
            index: PlainBm25::new(contents.iter().map(String::as_str)),
        }
    }
}

/// The figures of one way of asking.
#[derive(Debug, Serialize)]
struct Scores {
    /// Following episodes asked for with each hit (0: the plain search).
    following_episodes: i32,
    #[serde(flatten)]
    figures: Figures,
    search_latency_ms: Latency,
}

#[derive(Debug, Serialize)]
struct RecallReport {
    date: String,
    data: String,
    within: String,
    conversations: usize,
    turns: usize,
    questions: usize,
    results: Vec<Scores>,
    /// Plain BM25 over the same turns, in the same scope.
    plain_bm25: Figures,
}

impl RecallArgs {
    pub async fn run(self) -> CliResult {
        let data = read(&self.data)?;
        if !(0..=crate::search::MAX_FOLLOWING).contains(&self.following) {
            return Err(CliError::usage(format!(
                "--following must be from 0 to {}",
                crate::search::MAX_FOLLOWING
            )));
        }
        let (started, address) =
            Spawned::or_given(self.server.as_deref(), &self.database_url).await?;
        let result = self.evaluate(&data, &address).await;
        if let Some(spawned) = started {
            spawned.stop().await;
        }
        let report = result.map_err(|err| CliError {
            message: format!("recall-eval failed: {err:#}"),
            code: exit::FAILURE,
        })?;
        match self.output {
            Output::Json => print_json(&serde_json::to_value(&report).unwrap_or_default()),
            Output::Text => {
                outln!(
                    "engram recall-eval: {} ({} conversations, {} turns, {} questions, within {}, \
                     {CONCURRENCY} searches at a time, {})",
                    report.data,
                    report.conversations,
                    report.turns,
                    report.questions,
                    report.within,
                    report.date
                );
                outln!(
                    "{:<22} {:>9} {:>9} {:>10} {:>7} {:>8} {:>8}",
                    "search",
                    "recall@1",
                    "recall@5",
                    "recall@10",
                    "MRR",
                    "p50 ms",
                    "p99 ms"
                );
                let row = |name: &str, f: &Figures, latency: Option<&Latency>| {
                    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
                    outln!(
                        "{:<22} {:>9.3} {:>9.3} {:>10.3} {:>7.3} {:>8} {:>8}",
                        name,
                        f.recall_at_1,
                        f.recall_at_5,
                        f.recall_at_10,
                        f.mrr,
                        ms(latency.map(|l| l.p50)),
                        ms(latency.map(|l| l.p99)),
                    );
                };
                for r in &report.results {
                    let name = match r.following_episodes {
                        0 => "lexical".to_owned(),
                        n => format!("lexical, following {n}"),
                    };
                    row(&name, &r.figures, Some(&r.search_latency_ms));
                }
                row("plain BM25 (reference)", &report.plain_bm25, None);
            }
        }
        Ok(())
    }

    async fn evaluate(&self, data: &DataSet, address: &str) -> anyhow::Result<RecallReport> {
        let channel = tonic::transport::Endpoint::from_shared(address.to_owned())?
            .connect()
            .await
            .with_context(|| format!("cannot connect to {address}"))?;
        let bearer = Bearer::new(self.token.as_deref()).map_err(|e| anyhow::anyhow!(e.message))?;
        let channel = InterceptedService::new(channel, bearer);
        let total = self
            .load(data, EpisodeServiceClient::new(channel.clone()))
            .await?;
        let search = SearchServiceClient::new(channel);
        let mut results = vec![self.ask(data, &search, 0).await?];
        if self.following > 0 {
            results.push(self.ask(data, &search, self.following).await?);
        }
        Ok(RecallReport {
            date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            data: self.data.display().to_string(),
            within: match self.within {
                Within::Conversation => "conversation".to_owned(),
                Within::All => "all".to_owned(),
            },
            conversations: data.conversations.len(),
            turns: total,
            questions: data.questions.len(),
            results,
            plain_bm25: self.plain_bm25(data),
        })
    }

    /// The figures of plain BM25 over the turns each question is asked
    /// within.
    fn plain_bm25(&self, data: &DataSet) -> Figures {
        let everything = match self.within {
            Within::All => Some(Turns::of(data, data.conversations.keys())),
            Within::Conversation => None,
        };
        let mut each: BTreeMap<&String, Turns> = BTreeMap::new();
        let ranks: Vec<Option<usize>> = data
            .questions
            .iter()
            .map(|question| {
                let turns = match &everything {
                    Some(all) => all,
                    None => each
                        .entry(&question.conversation)
                        .or_insert_with(|| Turns::of(data, [&question.conversation])),
                };
                turns.index.rank(&question.text).iter().position(|&at| {
                    let (conversation, id) = turns.names[at];
                    *conversation == question.conversation && question.answers.contains(id)
                })
            })
            .collect();
        Figures::of(&ranks)
    }

    /// Appends every conversation (idempotently); returns the turns.
    async fn load(
        &self,
        data: &DataSet,
        mut episodes: EpisodeServiceClient<InterceptedService<tonic::transport::Channel, Bearer>>,
    ) -> anyhow::Result<usize> {
        let total: usize = data.conversations.values().map(|(_, t)| t.len()).sum();
        let progress = Progress::start("loading conversations");
        let mut loaded = 0;
        for (conversation, (user, turns)) in &data.conversations {
            for chunk in turns.chunks(BATCH) {
                let batch = chunk
                    .iter()
                    .map(|turn| proto::NewEpisode {
                        id: format!("{conversation}:{}", turn.id),
                        r#type: "turn".to_owned(),
                        content: Some(json_to_proto(&serde_json::Value::String(turn.content()))),
                        ..proto::NewEpisode::default()
                    })
                    .collect();
                episodes
                    .append_episodes(proto::AppendEpisodesRequest {
                        session_id: conversation.clone(),
                        app: self.app.clone(),
                        user: user.clone(),
                        episodes: batch,
                        require_session: false,
                    })
                    .await
                    .with_context(|| format!("loading conversation {conversation}"))?;
                loaded += chunk.len();
                progress.update(&format!("loaded {loaded} of {total} turns"));
            }
        }
        progress.finish();
        Ok(total)
    }

    /// Asks every question; the rank of each first answer turn.
    async fn ask(
        &self,
        data: &DataSet,
        search: &SearchServiceClient<InterceptedService<tonic::transport::Channel, Bearer>>,
        following: i32,
    ) -> anyhow::Result<Scores> {
        let progress = Progress::start("asking questions");
        let outcomes: Vec<anyhow::Result<(Option<usize>, u64)>> =
            futures::stream::iter(&data.questions)
                .map(|question| {
                    let mut search = search.clone();
                    async move {
                        let request = proto::SearchRequest {
                            query: question.text.clone(),
                            sources: vec![proto::SearchSource::Episodes as i32],
                            limit: 10,
                            app: self.app.clone(),
                            session_id: match self.within {
                                Within::Conversation => question.conversation.clone(),
                                Within::All => String::new(),
                            },
                            following_episodes: following,
                            ..proto::SearchRequest::default()
                        };
                        let start = Instant::now();
                        let hits = search
                            .search(request)
                            .await
                            .with_context(|| format!("searching {:?}", question.text))?
                            .into_inner()
                            .hits;
                        let micros = start.elapsed().as_micros() as u64;
                        let rank = hits.iter().position(|hit| match &hit.item {
                            Some(proto::search_hit::Item::Episode(e)) => {
                                e.id.split_once(':').is_some_and(|(c, t)| {
                                    c == question.conversation && question.answers.contains(t)
                                })
                            }
                            _ => false,
                        });
                        if self.show_misses && rank.is_none() {
                            let best = hits.first().map(|h| h.snippet.as_str()).unwrap_or("");
                            eprintln!(
                                "missed (following {following}): {:?}\n  best: {best}",
                                question.text
                            );
                        }
                        Ok((rank, micros))
                    }
                })
                .buffered(CONCURRENCY)
                .collect()
                .await;
        progress.finish();

        let mut ranks = Vec::new();
        let mut latencies = Vec::new();
        for outcome in outcomes {
            let (rank, micros) = outcome?;
            ranks.push(rank);
            latencies.push(micros);
        }
        Ok(Scores {
            following_episodes: following,
            figures: Figures::of(&ranks),
            search_latency_ms: Latency::of(&mut latencies),
        })
    }
}
