//! The conversation text `BuildContext` returns: one line per user or agent
//! message, oldest first, in the shape agents paste into a prompt.

use super::Episode;

pub const USER_MESSAGE: &str = "user_message";
pub const AGENT_RESPONSE: &str = "agent_response";

/// Renders messages (oldest first) as `User: ...` / `Assistant: ...` lines.
/// String contents are used as they are; other JSON is written compactly.
/// Other episode types are skipped.
pub fn render_conversation<'a>(episodes: impl IntoIterator<Item = &'a Episode>) -> (String, i32) {
    let mut lines = Vec::new();
    for episode in episodes {
        let speaker = match episode.kind.as_str() {
            USER_MESSAGE => "User",
            AGENT_RESPONSE => "Assistant",
            _ => continue,
        };
        let text = match &episode.content {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        lines.push(format!("{speaker}: {text}"));
    }
    let count = lines.len() as i32;
    (lines.join("\n"), count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn episode(kind: &str, content: serde_json::Value) -> Episode {
        Episode {
            id: String::new(),
            session_id: String::new(),
            seq: 0,
            cursor: 0,
            app: String::new(),
            user: String::new(),
            agent: String::new(),
            kind: kind.to_owned(),
            content,
            metadata: serde_json::Map::new(),
            source_node: String::new(),
            timestamp: chrono::DateTime::UNIX_EPOCH,
            create_time: chrono::DateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn renders_user_and_agent_lines_only() {
        let episodes = [
            episode(USER_MESSAGE, "Hello!".into()),
            episode("tool_call", serde_json::json!({"tool": "calc"})),
            episode(AGENT_RESPONSE, "Hi there!".into()),
            episode(USER_MESSAGE, serde_json::json!({"text": "How are you?"})),
        ];
        let (text, count) = render_conversation(&episodes);
        assert_eq!(
            text,
            "User: Hello!\nAssistant: Hi there!\nUser: {\"text\":\"How are you?\"}"
        );
        assert_eq!(count, 3);
        assert_eq!(render_conversation(&[]), (String::new(), 0));
    }
}
