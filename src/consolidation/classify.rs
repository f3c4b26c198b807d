//! Classification: each matching episode becomes one typed delta.
//!
//! | episode metadata                          | delta                        |
//! |-------------------------------------------|------------------------------|
//! | `intent = noop`                           | Noop (audit only)            |
//! | `intent = delete` and `replaces`          | Delete of what it replaces   |
//! | `intent = update` and `replaces`          | Update of what it replaces   |
//! | otherwise                                 | Add                          |
//! | Add whose (subject, predicate) repeats an | Update replacing the earlier |
//! | earlier episode of this batch             | episode                      |
//! | Add whose (subject, predicate) matches a  | Update replacing that fact   |
//! | live fact of the same app and user        |                              |
//!
//! (subject, predicate) pairs only count when both are set, and always
//! within one owner (app and user).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::types::{Delta, FactKind, FactPayload, Provenance, Rule};
use crate::sessions::Episode;

/// Whose fact an episode makes, and about what: the key of the
/// (subject, predicate) rules.
pub type FactKey = (String, String, String, String);

fn text(episode: &Episode, key: &str) -> String {
    episode
        .metadata
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn replaces(episode: &Episode) -> Vec<String> {
    match episode.metadata.get("replaces") {
        Some(Value::String(id)) if !id.is_empty() => vec![id.clone()],
        Some(Value::Array(ids)) => ids
            .iter()
            .filter_map(Value::as_str)
            .filter(|id| !id.is_empty())
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// The owner of the fact an episode makes under a rule.
/// Whose fact an episode's delta writes: (app, user), the user empty for
/// a procedural rule's app-wide facts.
pub fn owner(rule: &Rule, episode: &Episode) -> (String, String) {
    let user = match rule.kind {
        FactKind::Semantic => episode.user.clone(),
        FactKind::Procedural => String::new(),
    };
    (episode.app.clone(), user)
}

/// The (owner, subject, predicate) key of an episode, when it has both.
pub fn fact_key(rule: &Rule, episode: &Episode) -> Option<FactKey> {
    let (subject, predicate) = (text(episode, "subject"), text(episode, "predicate"));
    if subject.is_empty() || predicate.is_empty() {
        return None;
    }
    let (app, user) = owner(rule, episode);
    Some((app, user, subject, predicate))
}

/// Classifies matching episodes (in cursor order). `live` maps the keys of
/// existing live facts to their ids.
pub fn classify(
    rule: &Rule,
    episodes: &[Episode],
    live: &HashMap<FactKey, String>,
    now: DateTime<Utc>,
) -> Vec<Delta> {
    let mut earlier: HashMap<FactKey, String> = HashMap::new();
    let mut deltas = Vec::with_capacity(episodes.len());
    for episode in episodes {
        let provenance = Provenance {
            source_episode_ids: vec![episode.id.clone()],
            promotion_ts: now,
            rule_id: rule.id.clone(),
            confidence: rule.confidence,
        };
        let (app, user) = owner(rule, episode);
        let intent = text(episode, "intent");
        let replaced = replaces(episode);
        let payload = || FactPayload {
            app: app.clone(),
            user: user.clone(),
            kind: rule.kind,
            subject: text(episode, "subject"),
            predicate: text(episode, "predicate"),
            object: text(episode, "object"),
            content: episode.content.clone(),
            channels: rule.then_emits.clone(),
        };
        let delta = match intent.as_str() {
            "noop" => Delta::Noop { provenance },
            "delete" if !replaced.is_empty() => Delta::Delete {
                app,
                user,
                replaces: replaced,
                provenance,
            },
            "update" if !replaced.is_empty() => Delta::Update {
                payload: payload(),
                replaces: replaced,
                provenance,
            },
            _ => {
                let key = fact_key(rule, episode);
                let previous = key
                    .as_ref()
                    .and_then(|key| earlier.get(key).or_else(|| live.get(key)).cloned());
                match previous {
                    Some(id) => Delta::Update {
                        payload: payload(),
                        replaces: vec![id],
                        provenance,
                    },
                    None => Delta::Add {
                        payload: payload(),
                        provenance,
                    },
                }
            }
        };
        if matches!(delta, Delta::Add { .. } | Delta::Update { .. })
            && let Some(key) = fact_key(rule, episode)
        {
            earlier.insert(key, episode.id.clone());
        }
        deltas.push(delta);
    }
    deltas
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consolidation::Cadence;
    use serde_json::json;

    fn rule() -> Rule {
        Rule {
            id: "prefs".into(),
            filter: String::new(),
            cadence: Cadence::EveryNEpisodes(1),
            then_emits: vec!["semantic".into()],
            kind: FactKind::Semantic,
            confidence: 0.9,
            enabled: true,
            watermark: 0,
            episodes_promoted: 0,
            create_time: DateTime::UNIX_EPOCH,
            last_run_time: None,
        }
    }

    fn episode(id: &str, user: &str, metadata: Value) -> Episode {
        Episode {
            id: id.into(),
            session_id: "s".into(),
            seq: 1,
            cursor: 1,
            app: "app".into(),
            user: user.into(),
            agent: "app".into(),
            kind: "observation".into(),
            content: json!(id),
            metadata: metadata.as_object().cloned().unwrap_or_default(),
            source_node: String::new(),
            timestamp: DateTime::UNIX_EPOCH,
            create_time: DateTime::UNIX_EPOCH,
        }
    }

    fn kinds(deltas: &[Delta]) -> Vec<String> {
        deltas
            .iter()
            .map(|d| match d {
                Delta::Add { .. } => "add".to_owned(),
                Delta::Update { replaces, .. } => format!("update {}", replaces.join(",")),
                Delta::Delete { replaces, .. } => format!("delete {}", replaces.join(",")),
                Delta::Noop { .. } => "noop".to_owned(),
            })
            .collect()
    }

    #[test]
    fn the_table_case_by_case() {
        let sp = |s: &str| json!({"subject": s, "predicate": "likes"});
        let episodes = [
            episode("e1", "alice", json!({"intent": "noop"})),
            episode("e2", "alice", json!({"intent": "delete", "replaces": "f9"})),
            episode(
                "e3",
                "alice",
                json!({"intent": "update", "replaces": ["e0", "f8"]}),
            ),
            episode("e4", "alice", json!({})),
            episode("e5", "alice", json!({"intent": "delete"})),
            episode("e6", "alice", sp("tea")),
            episode("e7", "alice", sp("tea")),
            episode("e8", "bob", sp("tea")),
            episode("e9", "alice", sp("coffee")),
            episode("e10", "alice", json!({"subject": "tea"})),
        ];
        let live = HashMap::from([(
            (
                "app".into(),
                "alice".into(),
                "coffee".into(),
                "likes".into(),
            ),
            "fact-1".to_owned(),
        )]);
        let now = DateTime::UNIX_EPOCH;
        let deltas = classify(&rule(), &episodes, &live, now);
        assert_eq!(
            kinds(&deltas),
            [
                "noop",
                "delete f9",
                "update e0,f8",
                "add",
                "add",
                "add",
                "update e6",
                "add",
                "update fact-1",
                "add",
            ]
        );
        for (delta, episode) in deltas.iter().zip(&episodes) {
            let provenance = delta.provenance();
            assert_eq!(
                provenance.source_episode_ids,
                std::slice::from_ref(&episode.id)
            );
            assert_eq!(
                (provenance.rule_id.as_str(), provenance.confidence),
                ("prefs", 0.9)
            );
            assert!(provenance.check("delta").is_ok());
        }
    }

    #[test]
    fn procedural_facts_are_app_wide() {
        let mut procedural = rule();
        procedural.kind = FactKind::Procedural;
        let sp = json!({"subject": "deploy", "predicate": "steps"});
        let deltas = classify(
            &procedural,
            &[episode("e1", "alice", sp.clone()), episode("e2", "bob", sp)],
            &HashMap::new(),
            DateTime::UNIX_EPOCH,
        );
        assert_eq!(kinds(&deltas), ["add", "update e1"]);
        let Delta::Add { payload, .. } = &deltas[0] else {
            panic!("an add");
        };
        assert_eq!(payload.user, "");
    }
}
