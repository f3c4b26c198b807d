//! The MEMORY block and the memory instructions, as the agent reads them in
//! its system prompt. The text depends only on the snapshot, so the same
//! state always renders the same bytes.

use super::service::Snapshot;
use crate::consolidation::Fact;
use crate::sessions::Episode;

/// How much of one recent event a line shows.
const EVENT_CHARS: usize = 200;

/// The instructions section that teaches the agent to keep its memory.
pub const INSTRUCTIONS: &str = "\
# MEMORY INSTRUCTIONS
The MEMORY section is your working memory. It is rendered again at the start of every turn: read it there instead of asking for it.
- When the user gives you a goal, call memory.set_goal with it.
- Plan with TaskCreate, one task per step, and keep every task's status current with TaskUpdate (pending, in_progress, completed, blocked): in_progress before you start a step, completed when it is done.
- Call Remember for what the next session should know: commands, file locations, preferences, gotchas. Never remember secrets; they are redacted anyway.";

fn single_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn fact_line(fact: &Fact) -> String {
    let text = match &fact.current.content {
        serde_json::Value::String(text) if !text.is_empty() => text.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    };
    let text = if text.is_empty() {
        format!(
            "{} {} {}",
            fact.current.subject, fact.current.predicate, fact.current.object
        )
    } else {
        text
    };
    format!("- {}", single_line(&text))
}

fn event_line(episode: &Episode) -> String {
    let text = match &episode.content {
        serde_json::Value::String(text) => single_line(text),
        other => other.to_string(),
    };
    let shown: String = text.chars().take(EVENT_CHARS).collect();
    let more = if shown.len() < text.len() { "…" } else { "" };
    format!("- {}: {shown}{more}", episode.kind)
}

/// Renders the MEMORY block; each section appears only when it has content.
pub fn memory_block(snapshot: &Snapshot) -> String {
    let mut lines = vec!["# MEMORY".to_owned()];
    if !snapshot.goal.is_empty() {
        lines.push("## Goal".to_owned());
        lines.push(single_line(&snapshot.goal));
    }
    if !snapshot.tasks.is_empty() {
        lines.push(format!("## Todos ({})", snapshot.tasks.len()));
        for task in &snapshot.tasks {
            lines.push(format!(
                "- [{}] {}: {}",
                task.status.name(),
                task.id,
                single_line(&task.subject)
            ));
        }
    }
    if !snapshot.facts.is_empty() {
        lines.push(format!("## Facts ({})", snapshot.facts.len()));
        lines.extend(snapshot.facts.iter().map(fact_line));
    }
    if !snapshot.procedures.is_empty() {
        lines.push(format!("## Procedures ({})", snapshot.procedures.len()));
        lines.extend(snapshot.procedures.iter().map(fact_line));
    }
    if !snapshot.recent.is_empty() {
        lines.push("## Recent activity".to_owned());
        lines.extend(snapshot.recent.iter().map(event_line));
    }
    if lines.len() == 1 {
        lines.push("(empty: no goal, tasks, facts or activity yet)".to_owned());
    }
    lines.join("\n")
}
