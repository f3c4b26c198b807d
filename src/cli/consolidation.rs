//! `engram rules ...` and `engram facts ...`: consolidation from a shell.

use serde_json::json;

use super::sessions::RequestIdArg;
use super::{
    CliResult, ClientArgs, Output, all_pages, connect, plural, print_json, print_table, time,
    value_json,
};
use crate::proto;
use crate::proto::consolidation_rule::Cadence;
use crate::proto::consolidation_service_client::ConsolidationServiceClient;
use crate::proto::memory_delta::Delta;

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum KindArg {
    Semantic,
    Procedural,
}

impl KindArg {
    pub(crate) fn to_proto(self) -> i32 {
        match self {
            KindArg::Semantic => proto::FactKind::Semantic as i32,
            KindArg::Procedural => proto::FactKind::Procedural as i32,
        }
    }
}

fn kind_name(n: i32) -> &'static str {
    match proto::FactKind::try_from(n) {
        Ok(proto::FactKind::Semantic) => "semantic",
        Ok(proto::FactKind::Procedural) => "procedural",
        _ => "unspecified",
    }
}

#[derive(Debug, clap::Args)]
pub struct RulesCommand {
    #[command(flatten)]
    client: ClientArgs,

    #[command(subcommand)]
    command: RuleCommand,
}

#[derive(Debug, clap::Subcommand)]
enum RuleCommand {
    /// Create a rule; give --every-n-episodes or --cron
    Create {
        /// The rule's id
        id: String,
        /// The filter, e.g. 'type = user_message AND metadata.subject:*'
        #[arg(long, default_value = "", hide_default_value = true)]
        filter: String,
        /// Run once this many episodes arrived
        #[arg(long, conflicts_with = "cron", value_parser = clap::value_parser!(i64).range(1..))]
        every_n_episodes: Option<i64>,
        /// Run on a five-field cron schedule (UTC)
        #[arg(long)]
        cron: Option<String>,
        /// A fact channel it promotes into (repeatable)
        #[arg(long = "emits")]
        then_emits: Vec<String>,
        /// The kind of fact it promotes: semantic (about a user, owned by
        /// the app and user) or procedural (how the app does things,
        /// app-wide)
        #[arg(long, value_enum, default_value_t = KindArg::Semantic)]
        kind: KindArg,
        /// Confidence stamped on its deltas (0 < c <= 1)
        #[arg(long, default_value_t = 1.0)]
        confidence: f64,
        /// Leave it to RunRule: the scheduler will not run it
        #[arg(long)]
        disabled: bool,
        #[command(flatten)]
        request_id: RequestIdArg,
    },
    /// List the rules (every page)
    List,
    /// Print a rule with its watermark
    Get {
        /// The rule's id
        id: String,
    },
    /// Delete a rule (its facts stay)
    Delete {
        /// The rule's id
        id: String,
    },
    /// Run a rule now and print its deltas
    Run {
        /// The rule's id
        id: String,
        /// Print the deltas, write nothing
        #[arg(long)]
        dry_run: bool,
        /// The most episodes to read
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i32).range(0..))]
        max_episodes: i32,
    },
}

fn rule_json(rule: &proto::ConsolidationRule) -> serde_json::Value {
    let (every, cron) = match &rule.cadence {
        Some(Cadence::EveryNEpisodes(n)) => (json!(n), json!(null)),
        Some(Cadence::Cron(text)) => (json!(null), json!(text)),
        None => (json!(null), json!(null)),
    };
    json!({
        "id": rule.id,
        "filter": rule.filter,
        "every_n_episodes": every,
        "cron": cron,
        "then_emits": rule.then_emits,
        "kind": kind_name(rule.kind),
        "confidence": rule.confidence,
        "enabled": rule.enabled,
        "watermark": rule.watermark,
        "episodes_promoted": rule.episodes_promoted,
        "create_time": time(rule.create_time.as_ref()),
        "last_run_time": rule.last_run_time.as_ref().map(|t| time(Some(t))),
    })
}

fn rule_line(rule: &proto::ConsolidationRule) -> String {
    let cadence = match &rule.cadence {
        Some(Cadence::EveryNEpisodes(n)) => format!("every {}", plural(*n, "episode", "episodes")),
        Some(Cadence::Cron(text)) => format!("cron {text:?}"),
        None => "no cadence".to_owned(),
    };
    format!(
        "{}  {}  {}  watermark={}  promoted={}{}  filter: {}",
        rule.id,
        kind_name(rule.kind),
        cadence,
        rule.watermark,
        rule.episodes_promoted,
        if rule.enabled { "" } else { "  (disabled)" },
        if rule.filter.is_empty() {
            "(every episode)"
        } else {
            &rule.filter
        }
    )
}

fn provenance_json(provenance: Option<&proto::DeltaProvenance>) -> serde_json::Value {
    provenance.map_or(json!(null), |p| {
        json!({
            "source_episode_ids": p.source_episode_ids,
            "promotion_ts": time(p.promotion_ts.as_ref()),
            "rule_id": p.rule_id,
            "confidence": p.confidence,
        })
    })
}

fn payload_json(payload: Option<&proto::FactPayload>) -> serde_json::Value {
    payload.map_or(json!(null), |p| {
        json!({
            "app": p.app,
            "user": p.user,
            "kind": kind_name(p.kind),
            "subject": p.subject,
            "predicate": p.predicate,
            "object": p.object,
            "content": value_json(p.content.clone()),
            "channels": p.channels,
        })
    })
}

/// A delta as JSON: its kind, what it writes or replaces, and provenance.
fn delta_json(delta: &proto::MemoryDelta) -> serde_json::Value {
    match &delta.delta {
        Some(Delta::Add(d)) => json!({
            "kind": "add",
            "fact_payload": payload_json(d.fact_payload.as_ref()),
            "provenance": provenance_json(d.provenance.as_ref()),
        }),
        Some(Delta::Update(d)) => json!({
            "kind": "update",
            "replaces": d.replaces,
            "fact_payload": payload_json(d.fact_payload.as_ref()),
            "provenance": provenance_json(d.provenance.as_ref()),
        }),
        Some(Delta::Delete(d)) => json!({
            "kind": "delete",
            "app": d.app,
            "user": d.user,
            "replaces": d.replaces,
            "provenance": provenance_json(d.provenance.as_ref()),
        }),
        Some(Delta::Noop(d)) => json!({
            "kind": "noop",
            "provenance": provenance_json(d.provenance.as_ref()),
        }),
        None => json!(null),
    }
}

/// One row of the delta table: kind, source episodes, target, what.
fn delta_row(delta: &proto::MemoryDelta) -> [String; 4] {
    let sources = |p: Option<&proto::DeltaProvenance>| {
        p.map(|p| p.source_episode_ids.join(","))
            .unwrap_or_default()
    };
    let what = |p: Option<&proto::FactPayload>| {
        p.map(|p| {
            if p.subject.is_empty() {
                value_json(p.content.clone()).to_string()
            } else {
                format!("{} {} {}", p.subject, p.predicate, p.object)
            }
        })
        .unwrap_or_default()
    };
    match &delta.delta {
        Some(Delta::Add(d)) => [
            "add".into(),
            sources(d.provenance.as_ref()),
            String::new(),
            what(d.fact_payload.as_ref()),
        ],
        Some(Delta::Update(d)) => [
            "update".into(),
            sources(d.provenance.as_ref()),
            d.replaces.join(","),
            what(d.fact_payload.as_ref()),
        ],
        Some(Delta::Delete(d)) => [
            "delete".into(),
            sources(d.provenance.as_ref()),
            d.replaces.join(","),
            String::new(),
        ],
        Some(Delta::Noop(d)) => [
            "noop".into(),
            sources(d.provenance.as_ref()),
            String::new(),
            String::new(),
        ],
        None => Default::default(),
    }
}

impl RulesCommand {
    pub async fn run(self) -> CliResult {
        let channel = connect(&self.client).await?;
        let output = self.client.output();
        let mut rules = ConsolidationServiceClient::new(channel);
        match self.command {
            RuleCommand::Create {
                id,
                filter,
                every_n_episodes,
                cron,
                then_emits,
                kind,
                confidence,
                disabled,
                request_id,
            } => {
                let cadence = match (every_n_episodes, cron) {
                    (Some(n), _) => Some(Cadence::EveryNEpisodes(n)),
                    (None, Some(text)) => Some(Cadence::Cron(text)),
                    (None, None) => None,
                };
                let rule = rules
                    .create_rule(proto::CreateRuleRequest {
                        rule: Some(proto::ConsolidationRule {
                            id,
                            filter,
                            cadence,
                            then_emits,
                            kind: kind.to_proto(),
                            confidence,
                            enabled: !disabled,
                            ..proto::ConsolidationRule::default()
                        }),
                        request_id: request_id.or_random(),
                    })
                    .await?
                    .into_inner()
                    .rule;
                print_rule(output, rule);
            }
            RuleCommand::List => {
                let all = all_pages(|page_token| {
                    let mut rules = rules.clone();
                    async move {
                        let page = rules
                            .list_rules(proto::ListRulesRequest {
                                page_size: 1000,
                                page_token,
                            })
                            .await?
                            .into_inner();
                        Ok((page.rules, page.next_page_token))
                    }
                })
                .await?;
                match output {
                    Output::Json => print_json(&json!({
                        "rules": all.iter().map(rule_json).collect::<Vec<_>>(),
                    })),
                    Output::Text => all.iter().for_each(|r| outln!("{}", rule_line(r))),
                }
            }
            RuleCommand::Get { id } => {
                let rule = rules
                    .get_rule(proto::GetRuleRequest { rule_id: id })
                    .await?
                    .into_inner()
                    .rule;
                print_rule(output, rule);
            }
            RuleCommand::Delete { id } => {
                rules
                    .delete_rule(proto::DeleteRuleRequest {
                        rule_id: id.clone(),
                    })
                    .await?;
                match output {
                    Output::Json => print_json(&json!({ "deleted": id })),
                    Output::Text => outln!("deleted rule {id}"),
                }
            }
            RuleCommand::Run {
                id,
                dry_run,
                max_episodes,
            } => {
                let run = rules
                    .run_rule(proto::RunRuleRequest {
                        rule_id: id,
                        dry_run,
                        max_episodes,
                    })
                    .await?
                    .into_inner();
                match output {
                    Output::Json => print_json(&json!({
                        "deltas": run.deltas.iter().map(delta_json).collect::<Vec<_>>(),
                        "episodes_scanned": run.episodes_scanned,
                        "episodes_matched": run.episodes_matched,
                        "watermark": run.watermark,
                        "more": run.more,
                        "facts_added": run.facts_added,
                        "facts_updated": run.facts_updated,
                        "facts_deleted": run.facts_deleted,
                        "fact_ids": run.fact_ids,
                        "dry_run": dry_run,
                    })),
                    Output::Text => {
                        let rows: Vec<[String; 4]> = run.deltas.iter().map(delta_row).collect();
                        print_table(["DELTA", "EPISODES", "REPLACES", "FACT"], &rows);
                        outln!(
                            "{} scanned, {} matched; {} added, {} updated, {} deleted; watermark {}{}{}",
                            run.episodes_scanned,
                            run.episodes_matched,
                            run.facts_added,
                            run.facts_updated,
                            run.facts_deleted,
                            run.watermark,
                            if run.more { "; more waiting" } else { "" },
                            if dry_run {
                                " (dry run: nothing written)"
                            } else {
                                ""
                            },
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

fn print_rule(output: Output, rule: Option<proto::ConsolidationRule>) {
    if let Some(rule) = rule {
        match output {
            Output::Json => print_json(&rule_json(&rule)),
            Output::Text => outln!("{}", rule_line(&rule)),
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct FactsCommand {
    #[command(flatten)]
    client: ClientArgs,

    #[command(subcommand)]
    command: FactCommand,
}

#[derive(Debug, clap::Subcommand)]
enum FactCommand {
    /// List live facts (every page)
    List {
        /// Only facts of this app
        #[arg(long, default_value = "", hide_default_value = true)]
        app: String,
        /// Only facts about this user
        #[arg(long, default_value = "", hide_default_value = true)]
        user: String,
        /// Only facts of this kind
        #[arg(long, value_enum)]
        kind: Option<KindArg>,
    },
    /// Print a fact with every version and its lineage (every page)
    Get {
        /// The fact's id
        id: String,
    },
    /// Tombstone a fact
    Delete {
        /// The fact's id
        id: String,
    },
    /// Apply deltas (add, update, delete, noop) read from FILE, or from
    /// standard input with `-`, in the JSON `rules run --json` prints them
    /// in (the array, or the object holding it as `deltas`); each needs
    /// its provenance. A dry run's deltas applied here do not move the
    /// rule's watermark: a later run of the rule promotes those episodes
    /// again
    Apply {
        /// The file of deltas, or `-`
        file: String,
    },
}

fn version_json(version: &proto::FactVersion) -> serde_json::Value {
    json!({
        "version": version.version,
        "deleted": version.deleted,
        "subject": version.subject,
        "predicate": version.predicate,
        "object": version.object,
        "content": value_json(version.content.clone()),
        "confidence": version.confidence,
        "source": version.lineage.as_ref().map(|l| l.source.clone()),
        "source_episode_ids": version.lineage.as_ref().map(|l| l.source_episode_ids.clone()),
        "channels": version.channels,
        "create_time": time(version.create_time.as_ref()),
    })
}

pub(crate) fn fact_json(fact: &proto::Fact) -> serde_json::Value {
    json!({
        "id": fact.id,
        "app": fact.app,
        "user": fact.user,
        "kind": kind_name(fact.kind),
        "current": fact.current.as_ref().map(version_json),
        "create_time": time(fact.create_time.as_ref()),
    })
}

pub(crate) fn fact_line(fact: &proto::Fact) -> String {
    let Some(current) = &fact.current else {
        return fact.id.clone();
    };
    let what = if current.subject.is_empty() {
        value_json(current.content.clone()).to_string()
    } else {
        // A deletion's version has no object: no blank where it would be.
        [&current.subject, &current.predicate, &current.object]
            .iter()
            .filter(|part| !part.is_empty())
            .map(|part| part.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let source = current
        .lineage
        .as_ref()
        .map(|l| match l.source_episode_ids.as_slice() {
            [] => l.source.clone(),
            episodes => format!("{} <- {}", l.source, episodes.join(",")),
        })
        .unwrap_or_default();
    format!(
        "{}  {}/{}  v{}{}  {what}  [{source}]",
        fact.id,
        fact.app,
        if fact.user.is_empty() {
            "*"
        } else {
            &fact.user
        },
        current.version,
        if current.deleted { " (deleted)" } else { "" },
    )
}

impl FactsCommand {
    pub async fn run(self) -> CliResult {
        let channel = connect(&self.client).await?;
        let output = self.client.output();
        let mut facts = ConsolidationServiceClient::new(channel);
        match self.command {
            FactCommand::List { app, user, kind } => {
                let all = all_pages(|page_token| {
                    let mut facts = facts.clone();
                    let request = proto::ListFactsRequest {
                        app: app.clone(),
                        user: user.clone(),
                        kind: kind.map_or(0, KindArg::to_proto),
                        page_size: 1000,
                        page_token,
                    };
                    async move {
                        let page = facts.list_facts(request).await?.into_inner();
                        Ok((page.facts, page.next_page_token))
                    }
                })
                .await?;
                match output {
                    Output::Json => print_json(&json!({
                        "facts": all.iter().map(fact_json).collect::<Vec<_>>(),
                    })),
                    Output::Text => all.iter().for_each(|f| outln!("{}", fact_line(f))),
                }
            }
            FactCommand::Apply { file } => {
                let text = super::file_or_stdin(file)?;
                let deltas = super::deltas::parse(&text)?;
                let applied = facts
                    .apply_deltas(proto::ApplyDeltasRequest { deltas })
                    .await?
                    .into_inner();
                match output {
                    Output::Json => print_json(&json!({
                        "facts_added": applied.facts_added,
                        "facts_updated": applied.facts_updated,
                        "facts_deleted": applied.facts_deleted,
                        "fact_ids": applied.fact_ids,
                    })),
                    Output::Text => outln!(
                        "{} added, {} updated, {} deleted",
                        applied.facts_added,
                        applied.facts_updated,
                        applied.facts_deleted
                    ),
                }
            }
            FactCommand::Get { id } => {
                // Every page of versions; the fact as the last page had it.
                let (mut versions, mut page_token) = (Vec::new(), String::new());
                let fact = loop {
                    let page = facts
                        .get_fact(proto::GetFactRequest {
                            fact_id: id.clone(),
                            page_size: 1000,
                            page_token,
                        })
                        .await?
                        .into_inner();
                    versions.extend(page.versions);
                    if page.next_page_token.is_empty() {
                        break page.fact;
                    }
                    page_token = page.next_page_token;
                };
                match output {
                    Output::Json => print_json(&json!({
                        "fact": fact.as_ref().map(fact_json),
                        "versions": versions.iter().map(version_json).collect::<Vec<_>>(),
                    })),
                    Output::Text => {
                        if let Some(fact) = &fact {
                            outln!("{}", fact_line(fact));
                        }
                        for version in &versions {
                            outln!("  {}", version_json(version));
                        }
                    }
                }
            }
            FactCommand::Delete { id } => {
                let fact = facts
                    .delete_fact(proto::DeleteFactRequest { fact_id: id })
                    .await?
                    .into_inner()
                    .fact;
                if let Some(fact) = fact {
                    match output {
                        Output::Json => print_json(&fact_json(&fact)),
                        Output::Text => outln!("{}", fact_line(&fact)),
                    }
                }
            }
        }
        Ok(())
    }
}
