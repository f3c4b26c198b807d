//! Secret redaction: what looks like a secret becomes `[REDACTED]` before it
//! is stored or logged.
//!
//! Redacted: the value of a `key=value` pair or of a JSON `"key": "value"`
//! pair whose key contains a sensitive word; the value of a `key: value`
//! label (as in YAML, or "db password: hunter2") when the key ends with a
//! sensitive word and the value looks like one (quoted, or a single run
//! holding a digit or a symbol, or of 12 characters or more); the password
//! of a URL's user info (`postgres://app:pw@host`); JWTs; bearer and basic
//! credentials; private key blocks; and well-known key shapes (AWS,
//! GitHub, Slack, OpenAI-style `sk-`, Stripe, Google). Prose that merely
//! mentions a sensitive word ("rotate the token monthly", "auth: handled
//! upstream") is left alone.

use regex::{Captures, Regex};

pub const REDACTED: &str = "[REDACTED]";

/// The words that make a key sensitive, matched anywhere in the key,
/// ignoring case.
pub const DEFAULT_PATTERNS: [&str; 8] = [
    "key",
    "secret",
    "password",
    "token",
    "auth",
    "credential",
    "private",
    "jwt",
];

/// Compiled redaction rules. Cheap to clone (regexes share their programs).
#[derive(Debug, Clone)]
pub struct Redactor {
    /// `key=value` with an unquoted or quoted value. This and `label`
    /// take `[REDACTED]` whole as a value, so that text redacted once
    /// (a remembered fact consolidated again) comes out the same, not
    /// as `[REDACTED]]`.
    assignment: Regex,
    /// `"key": "value"` (and `"key": 123`) as in JSON.
    json_pair: Regex,
    /// `key: value`, the key ending with a sensitive word.
    label: Regex,
    /// The password of `scheme://user:password@`.
    user_info: Regex,
    bearer: Regex,
    /// Whole-match shapes: JWTs, private key blocks, vendor key formats.
    shapes: Vec<Regex>,
    words: Vec<String>,
}

fn compile(pattern: &str) -> Regex {
    // The patterns are fixed or escaped; a failure is a bug caught by tests.
    Regex::new(pattern).unwrap_or_else(|err| panic!("invalid redaction pattern {pattern}: {err}"))
}

impl Redactor {
    /// The default words plus `extra` (e.g. `api_key`, `slack_webhook`).
    pub fn new(extra: &[String]) -> Redactor {
        let mut words: Vec<String> = DEFAULT_PATTERNS.iter().map(|w| (*w).to_owned()).collect();
        for word in extra {
            let word = word.trim().to_ascii_lowercase();
            if !word.is_empty() && !words.contains(&word) {
                words.push(word);
            }
        }
        let alternation = words
            .iter()
            .map(|w| regex::escape(w))
            .collect::<Vec<_>>()
            .join("|");
        let key = format!(r"[A-Za-z0-9_.\-]*(?:{alternation})[A-Za-z0-9_.\-]*");
        Redactor {
            assignment: compile(&format!(
                r#"(?i)\b(?P<key>{key})(?P<sep>\s*=\s*)(?P<value>\[REDACTED\]|"[^"]*"|'[^']*'|[^\s,;&"'<>\]\)\}}]+)"#
            )),
            json_pair: compile(&format!(
                r#"(?i)(?P<key>"{key}")(?P<sep>\s*:\s*)(?P<value>"(?:[^"\\]|\\.)*"|-?[0-9][0-9.eE+\-]*)"#
            )),
            label: compile(&format!(
                r#"(?i)\b(?P<key>[A-Za-z0-9_.\-]*(?:{alternation}))(?P<sep>[ \t]*:[ \t]*)(?P<value>\[REDACTED\]|"[^"\n]*"|'[^'\n]*'|[^\s,;"'<>\]\)\}}]+)"#
            )),
            user_info: compile(
                r"(?i)\b(?P<key>[a-z][a-z0-9+.\-]*://[^\s:/@]*)(?P<sep>:)(?P<value>[^\s/@]+)@",
            ),
            bearer: compile(
                r"(?i)\b(?P<key>bearer|basic)(?P<sep>\s+)(?P<value>[A-Za-z0-9\-._~+/]{8,}=*)",
            ),
            shapes: [
                // JWT: three base64url parts, the first a JSON header.
                r"\beyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{4,}",
                r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
                r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
                r"\bgh[pousr]_[A-Za-z0-9]{30,}\b",
                r"\bxox[abposr]-[A-Za-z0-9\-]{10,}",
                r"\bsk-[A-Za-z0-9_\-]{20,}",
                r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}",
                r"\bAIza[0-9A-Za-z_\-]{35}\b",
            ]
            .iter()
            .map(|p| compile(p))
            .collect(),
            words,
        }
    }

    /// The words that make a key sensitive.
    pub fn words(&self) -> &[String] {
        &self.words
    }

    /// Redacts secrets in free text.
    pub fn text(&self, text: &str) -> String {
        let keep_quotes = |caps: &Captures<'_>| {
            let value = &caps["value"];
            let quoted = |q: char| value.len() >= 2 && value.starts_with(q) && value.ends_with(q);
            let value = if quoted('"') {
                format!("\"{REDACTED}\"")
            } else if quoted('\'') {
                format!("'{REDACTED}'")
            } else {
                REDACTED.to_owned()
            };
            format!("{}{}{value}", &caps["key"], &caps["sep"])
        };
        let mut out = self.json_pair.replace_all(text, keep_quotes).into_owned();
        out = self.assignment.replace_all(&out, keep_quotes).into_owned();
        out = self
            .label
            .replace_all(&out, |caps: &Captures<'_>| {
                // A label is often prose ("auth: handled upstream"); only a
                // value shaped like a secret goes.
                let value = &caps["value"];
                let quoted = value.starts_with(['"', '\'']);
                let shaped =
                    value.chars().any(|c| !c.is_alphabetic()) || value.chars().count() >= 12;
                if quoted || shaped {
                    keep_quotes(caps)
                } else {
                    caps[0].to_owned()
                }
            })
            .into_owned();
        out = self
            .user_info
            .replace_all(&out, |caps: &Captures<'_>| {
                format!("{}{}{REDACTED}@", &caps["key"], &caps["sep"])
            })
            .into_owned();
        out = self
            .bearer
            .replace_all(&out, |caps: &Captures<'_>| {
                // "bearer authentication" is prose; tokens are not words.
                if caps["value"].chars().all(|c| c.is_ascii_alphabetic()) {
                    caps[0].to_owned()
                } else {
                    keep_quotes(caps)
                }
            })
            .into_owned();
        for shape in &self.shapes {
            out = shape.replace_all(&out, REDACTED).into_owned();
        }
        out
    }

    fn sensitive_key(&self, key: &str) -> bool {
        let key = key.to_ascii_lowercase();
        self.words.iter().any(|word| key.contains(word.as_str()))
    }

    /// Redacts secrets in JSON: every string is redacted as text, and the
    /// scalar value of an object key that is sensitive is replaced whole.
    pub fn json(&self, value: &serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        match value {
            Value::String(s) => Value::String(self.text(s)),
            Value::Array(items) => Value::Array(items.iter().map(|v| self.json(v)).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| {
                        let redacted = match v {
                            Value::String(_) | Value::Number(_) if self.sensitive_key(k) => {
                                Value::String(REDACTED.to_owned())
                            }
                            other => self.json(other),
                        };
                        (k.clone(), redacted)
                    })
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn redact(text: &str) -> String {
        Redactor::new(&[]).text(text)
    }

    #[test]
    fn every_pattern_and_shape() {
        let cases = [
            ("password=hunter2", "password=[REDACTED]"),
            ("db_password = 'p4ss word'", "db_password = '[REDACTED]'"),
            ("API_KEY=\"abc123\" next", "API_KEY=\"[REDACTED]\" next"),
            ("url?token=abc&x=1", "url?token=[REDACTED]&x=1"),
            ("client_secret=s3cr3t;", "client_secret=[REDACTED];"),
            ("AUTH_HEADER=xyz", "AUTH_HEADER=[REDACTED]"),
            ("credentials=a:b", "credentials=[REDACTED]"),
            ("private_key=abc", "private_key=[REDACTED]"),
            ("jwt=abc.def", "jwt=[REDACTED]"),
            (r#"{"api_key": "sk-live"}"#, r#"{"api_key": "[REDACTED]"}"#),
            (
                r#"{"pin": 1, "secretNumber": 1234}"#,
                r#"{"pin": 1, "secretNumber": [REDACTED]}"#,
            ),
            (
                r#"{"token": "a \"quoted\" one", "user": "bob"}"#,
                r#"{"token": "[REDACTED]", "user": "bob"}"#,
            ),
            (
                "Authorization: Bearer abcdef123456",
                "Authorization: Bearer [REDACTED]",
            ),
            (
                "use eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl now",
                "use [REDACTED] now",
            ),
            ("aws AKIAIOSFODNN7EXAMPLE here", "aws [REDACTED] here"),
            (
                "gh ghp_abcdefghijklmnopqrstuvwxyz0123456789",
                "gh [REDACTED]",
            ),
            ("slack xoxb-1234567890-abcdef", "slack [REDACTED]"),
            ("openai sk-abcdefghijklmnopqrstuvwxyz", "openai [REDACTED]"),
            ("stripe sk_live_abcdefghijklmnop1234", "stripe [REDACTED]"),
            ("g AIzaSyA-abcdefghijklmnopqrstuvwxyz01234", "g [REDACTED]"),
            ("db password: hunter2", "db password: [REDACTED]"),
            ("DB_PASSWORD: 'p4ss word'", "DB_PASSWORD: '[REDACTED]'"),
            (
                "api-key:abc123, region: eu",
                "api-key:[REDACTED], region: eu",
            ),
            ("secret: correcthorsebatterystaple", "secret: [REDACTED]"),
            (
                "DATABASE_URL=postgres://app:s3cret@db.internal/app",
                "DATABASE_URL=postgres://app:[REDACTED]@db.internal/app",
            ),
            (
                "connect to postgres://app:s3cret@db.internal:5432/app now",
                "connect to postgres://app:[REDACTED]@db.internal:5432/app now",
            ),
            (
                "redis://:hunter2@cache:6379",
                "redis://:[REDACTED]@cache:6379",
            ),
            (
                "Authorization: Basic dXNlcjpwYXNzd29yZA==",
                "Authorization: Basic [REDACTED]",
            ),
            (
                "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----",
                "[REDACTED]",
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(redact(input), expected, "{input}");
        }
    }

    #[test]
    fn prose_is_left_alone() {
        for text in [
            "Rotate the token every 30 days",
            "The auth service lives in src/auth",
            "Test command: pytest tests/ -v",
            "password reset emails go out at noon",
            "key points: fast, small",
            "Use a bearer token for the API",
            "bearer authentication is configured upstream",
            "auth: handled upstream by the gateway",
            "Primary key: id",
            "Key takeaway: ship it",
            "the token: rotate it monthly",
            "see https://example.com:8080/auth and mailto:someone@example.com",
            "basic authentication is off",
        ] {
            assert_eq!(redact(text), text);
        }
    }

    #[test]
    fn extra_words_extend_the_keys() {
        let redactor = Redactor::new(&["slack_webhook".to_owned(), "PIN".to_owned()]);
        assert_eq!(
            redactor.text("slack_webhook=https://x"),
            "slack_webhook=[REDACTED]"
        );
        assert_eq!(redactor.text("pin=1234"), "pin=[REDACTED]");
        assert_eq!(Redactor::new(&[]).text("pin=1234"), "pin=1234");
    }

    #[test]
    fn json_values() {
        let redactor = Redactor::new(&[]);
        let value = json!({
            "note": "password=hunter2",
            "apiKey": "abc",
            "nested": [{"token": 42, "ok": "fine"}],
            "count": 3,
        });
        assert_eq!(
            redactor.json(&value),
            json!({
                "note": "password=[REDACTED]",
                "apiKey": "[REDACTED]",
                "nested": [{"token": "[REDACTED]", "ok": "fine"}],
                "count": 3,
            })
        );
    }

    #[test]
    fn redacting_twice_changes_nothing_more() {
        let redactor = Redactor::new(&[]);
        for text in [
            "password=hunter2",
            "db password: hunter2",
            "DB_PASSWORD: 'p4ss word'",
            "postgres://app:s3cret@db/app",
            "Authorization: Basic dXNlcjpwYXNzd29yZA==",
            "api-key:abc123, region: eu",
        ] {
            let once = redactor.text(text);
            assert_eq!(redactor.text(&once), once, "{text}");
        }
    }
}
