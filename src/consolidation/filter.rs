//! The rule filter language: a subset of AIP-160 over an allowlist of
//! episode fields, parsed into an AST and evaluated in Rust. Nothing of it
//! ever reaches SQL, so `'; DROP TABLE …` is just a string that matches
//! nothing.
//!
//! ```text
//! expr       := or
//! or         := and ("OR" and)*
//! and        := unary (["AND"] unary)*          juxtaposition is AND
//! unary      := ("NOT" | "-") unary | primary
//! primary    := "(" expr ")" | field op value | field ":" value | field ":" "*"
//! op         := "=" | "!=" | "<" | "<=" | ">" | ">="
//! field      := type | agent | user | session | app | source_node | content
//!             | timestamp | seq | metadata("." name)*
//! value      := "string" | 'string' | number | true | false | null | bare_word
//! ```
//!
//! AIP-160 binds OR tighter than AND (`a AND b OR c` is `a AND (b OR c)`),
//! where most languages read `(a AND b) OR c`. So that no filter means one
//! thing to its author and another here, a new filter that mixes AND (or
//! juxtaposition) with OR at one level without parentheses is refused
//! ([`parse`]). Filters stored by releases that accepted that mix were read
//! the second way, and still are ([`parse_stored`]).
//!
//! Strings compare with strings, numbers with numbers; `timestamp` compares
//! with RFC 3339 strings. `:` means "has": a substring of a string, an
//! element of a list, a key of an object, and `:*` means present. A
//! comparison with a missing field is false (so `NOT` of it is true).
//! The parser never panics, and bounds input length and nesting.

use std::fmt;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::sessions::Episode;

/// Longest filter accepted, in bytes.
pub const MAX_FILTER_LEN: usize = 4096;
/// Deepest nesting of parentheses and NOTs.
const MAX_DEPTH: usize = 64;

/// A parse error and the byte offset it was found at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterError {
    pub position: usize,
    pub message: String,
}

impl fmt::Display for FilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at position {}: {}", self.position, self.message)
    }
}

/// The episode fields a filter may read.
#[derive(Debug, Clone, PartialEq)]
pub enum Field {
    Type,
    Agent,
    User,
    Session,
    App,
    SourceNode,
    Content,
    Timestamp,
    Seq,
    /// `metadata` alone (empty path) or a path into it.
    Metadata(Vec<String>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Has,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    String(String),
    Number(f64),
    Bool(bool),
    Null,
    /// `*` after `:`: the field is present.
    Any,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// The empty filter: every episode.
    True,
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Compare(Field, Op, Literal),
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    LParen,
    RParen,
    Op(Op),
    Minus,
    Star,
    Dot,
    Word(String),
    Str(String),
    Number(f64),
}

struct Lexer<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Lexer<'a> {
    fn error(position: usize, message: impl Into<String>) -> FilterError {
        FilterError {
            position,
            message: message.into(),
        }
    }

    fn tokens(text: &'a str) -> Result<Vec<(usize, Token)>, FilterError> {
        let mut lexer = Lexer { text, pos: 0 };
        let mut out = Vec::new();
        while let Some((at, token)) = lexer.next()? {
            out.push((at, token));
        }
        Ok(out)
    }

    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn next(&mut self) -> Result<Option<(usize, Token)>, FilterError> {
        while let Some(c) = self.peek() {
            if c.is_whitespace() {
                self.pos += c.len_utf8();
            } else {
                break;
            }
        }
        let start = self.pos;
        let Some(c) = self.peek() else {
            return Ok(None);
        };
        let rest = &self.text[start..];
        let (token, len) = match c {
            '(' => (Token::LParen, 1),
            ')' => (Token::RParen, 1),
            '*' => (Token::Star, 1),
            '.' => (Token::Dot, 1),
            ':' => (Token::Op(Op::Has), 1),
            '=' => (Token::Op(Op::Eq), 1),
            '!' if rest.starts_with("!=") => (Token::Op(Op::Ne), 2),
            '<' if rest.starts_with("<=") => (Token::Op(Op::Le), 2),
            '<' => (Token::Op(Op::Lt), 1),
            '>' if rest.starts_with(">=") => (Token::Op(Op::Ge), 2),
            '>' => (Token::Op(Op::Gt), 1),
            '"' | '\'' => return self.string(c).map(Some),
            '-' if !rest[1..].starts_with(|d: char| d.is_ascii_digit()) => (Token::Minus, 1),
            c if c == '-' || c.is_ascii_digit() => return self.number().map(Some),
            c if c.is_alphanumeric() || c == '_' => {
                let len = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
                    .unwrap_or(rest.len());
                (Token::Word(rest[..len].to_owned()), len)
            }
            other => {
                return Err(Self::error(
                    start,
                    format!("unexpected character {other:?}"),
                ));
            }
        };
        self.pos += len;
        Ok(Some((start, token)))
    }

    fn string(&mut self, quote: char) -> Result<(usize, Token), FilterError> {
        let start = self.pos;
        self.pos += 1;
        let mut value = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(Self::error(start, "unterminated string"));
            };
            self.pos += c.len_utf8();
            match c {
                c if c == quote => return Ok((start, Token::Str(value))),
                '\\' => {
                    let Some(escaped) = self.peek() else {
                        return Err(Self::error(start, "unterminated string"));
                    };
                    self.pos += escaped.len_utf8();
                    value.push(match escaped {
                        'n' => '\n',
                        't' => '\t',
                        other => other,
                    });
                }
                c => value.push(c),
            }
        }
    }

    fn number(&mut self) -> Result<(usize, Token), FilterError> {
        let start = self.pos;
        let rest = &self.text[start..];
        let len = rest
            .char_indices()
            .find(|&(i, c)| {
                !(c.is_ascii_digit()
                    || c == '.'
                    || c == 'e'
                    || c == 'E'
                    || ((c == '-' || c == '+') && (i == 0 || rest[..i].ends_with(['e', 'E']))))
            })
            .map_or(rest.len(), |(i, _)| i);
        let text = &rest[..len];
        let n: f64 = text
            .parse()
            .map_err(|_| Self::error(start, format!("{text:?} is not a number")))?;
        if !n.is_finite() {
            return Err(Self::error(start, format!("{text:?} is out of range")));
        }
        self.pos += len;
        Ok((start, Token::Number(n)))
    }
}

struct Parser {
    tokens: Vec<(usize, Token)>,
    next: usize,
    end: usize,
    depth: usize,
    /// Refuse AND and OR mixed at one level without parentheses.
    strict: bool,
}

impl Parser {
    fn position(&self) -> usize {
        self.tokens.get(self.next).map_or(self.end, |(at, _)| *at)
    }

    fn error<T>(&self, message: impl Into<String>) -> Result<T, FilterError> {
        Err(FilterError {
            position: self.position(),
            message: message.into(),
        })
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.next).map(|(_, t)| t)
    }

    fn bump(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.next).map(|(_, t)| t.clone());
        self.next += 1;
        token
    }

    fn is_word(&self, word: &str) -> bool {
        matches!(self.peek(), Some(Token::Word(w)) if w == word)
    }

    fn descend(&mut self) -> Result<(), FilterError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.error(format!("nested deeper than {MAX_DEPTH} levels"));
        }
        Ok(())
    }

    fn or(&mut self) -> Result<Expr, FilterError> {
        let (mut left, mut mixed) = self.and()?;
        let mut first_or = None;
        while self.is_word("OR") {
            first_or.get_or_insert(self.position());
            self.bump();
            let (right, joined) = self.and()?;
            mixed |= joined;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        if let (true, true, Some(position)) = (self.strict, mixed, first_or) {
            return Err(FilterError {
                position,
                message: "AND and OR are mixed without parentheses, which AIP-160 reads as \
                          `a AND (b OR c)` and most languages as `(a AND b) OR c`; add \
                          parentheses to say which"
                    .to_owned(),
            });
        }
        Ok(left)
    }

    /// A conjunction, and whether it joined more than one operand.
    fn and(&mut self) -> Result<(Expr, bool), FilterError> {
        let mut left = self.unary()?;
        let mut joined = false;
        loop {
            if self.is_word("AND") {
                self.bump();
            } else if self.peek().is_none()
                || self.is_word("OR")
                || matches!(self.peek(), Some(Token::RParen))
            {
                return Ok((left, joined));
            }
            let right = self.unary()?;
            left = Expr::And(Box::new(left), Box::new(right));
            joined = true;
        }
    }

    fn unary(&mut self) -> Result<Expr, FilterError> {
        if self.is_word("NOT") || matches!(self.peek(), Some(Token::Minus)) {
            self.bump();
            self.descend()?;
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(Expr::Not(Box::new(inner)));
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, FilterError> {
        match self.peek() {
            Some(Token::LParen) => {
                self.bump();
                self.descend()?;
                let inner = self.or()?;
                self.depth -= 1;
                match self.bump() {
                    Some(Token::RParen) => Ok(inner),
                    _ => {
                        self.next = self.next.saturating_sub(1);
                        self.error("expected ')'")
                    }
                }
            }
            Some(Token::Word(_)) => self.comparison(),
            None => self.error("expected a comparison, found the end of the filter"),
            Some(other) => {
                let other = other.clone();
                self.error(format!("expected a field name, found {}", describe(&other)))
            }
        }
    }

    fn field(&mut self) -> Result<Field, FilterError> {
        let at = self.position();
        let Some(Token::Word(name)) = self.bump() else {
            return Err(FilterError {
                position: at,
                message: "expected a field name".to_owned(),
            });
        };
        let field = match name.as_str() {
            "type" => Field::Type,
            "agent" => Field::Agent,
            "user" => Field::User,
            "session" | "session_id" => Field::Session,
            "app" => Field::App,
            "source_node" => Field::SourceNode,
            "content" => Field::Content,
            "timestamp" => Field::Timestamp,
            "seq" => Field::Seq,
            "metadata" => {
                let mut path = Vec::new();
                while matches!(self.peek(), Some(Token::Dot)) {
                    self.bump();
                    match self.bump() {
                        Some(Token::Word(part)) => path.push(part),
                        Some(Token::Str(part)) => path.push(part),
                        _ => {
                            self.next = self.next.saturating_sub(1);
                            return self.error("expected a name after '.'");
                        }
                    }
                }
                return Ok(Field::Metadata(path));
            }
            other => {
                return Err(FilterError {
                    position: at,
                    message: format!(
                        "unknown field {other:?}; use type, agent, user, session, app, \
                         source_node, content, timestamp, seq or metadata.<key>"
                    ),
                });
            }
        };
        if matches!(self.peek(), Some(Token::Dot)) {
            return self.error(format!("{name} has no sub-fields; only metadata does"));
        }
        Ok(field)
    }

    fn comparison(&mut self) -> Result<Expr, FilterError> {
        let field = self.field()?;
        let op = match self.bump() {
            Some(Token::Op(op)) => op,
            _ => {
                self.next = self.next.saturating_sub(1);
                return self.error("expected an operator (=, !=, <, <=, >, >= or :)");
            }
        };
        let at = self.position();
        let value = match self.bump() {
            Some(Token::Str(s)) => Literal::String(s),
            Some(Token::Number(n)) => Literal::Number(n),
            Some(Token::Word(w)) => match w.as_str() {
                "true" => Literal::Bool(true),
                "false" => Literal::Bool(false),
                "null" => Literal::Null,
                "AND" | "OR" | "NOT" => {
                    self.next -= 1;
                    return self.error(format!("expected a value, found {w}"));
                }
                _ => Literal::String(w),
            },
            Some(Token::Star) if op == Op::Has => Literal::Any,
            other => {
                self.next = self.next.saturating_sub(1);
                let found = other
                    .as_ref()
                    .map_or("the end of the filter".to_owned(), describe);
                return self.error(format!("expected a value, found {found}"));
            }
        };
        if field == Field::Timestamp
            && op != Op::Has
            && let Literal::String(text) = &value
            && DateTime::parse_from_rfc3339(text).is_err()
        {
            return Err(FilterError {
                position: at,
                message: format!("{text:?} is not an RFC 3339 timestamp"),
            });
        }
        Ok(Expr::Compare(field, op, value))
    }
}

fn describe(token: &Token) -> String {
    match token {
        Token::LParen => "'('".to_owned(),
        Token::RParen => "')'".to_owned(),
        Token::Op(_) => "an operator".to_owned(),
        Token::Minus => "'-'".to_owned(),
        Token::Star => "'*'".to_owned(),
        Token::Dot => "'.'".to_owned(),
        Token::Word(w) => format!("{w:?}"),
        Token::Str(s) => format!("the string {s:?}"),
        Token::Number(n) => format!("the number {n}"),
    }
}

/// Parses a new filter; the empty filter matches every episode.
pub fn parse(text: &str) -> Result<Expr, FilterError> {
    parse_with(text, true)
}

/// Parses a filter already stored, which releases before the refusal of AND
/// and OR mixed without parentheses accepted (and read as `(a AND b) OR
/// c`): a rule's run and an import take a stored rule as it was written.
pub fn parse_stored(text: &str) -> Result<Expr, FilterError> {
    parse_with(text, false)
}

fn parse_with(text: &str, strict: bool) -> Result<Expr, FilterError> {
    if text.len() > MAX_FILTER_LEN {
        return Err(FilterError {
            position: MAX_FILTER_LEN,
            message: format!("longer than {MAX_FILTER_LEN} bytes"),
        });
    }
    let tokens = Lexer::tokens(text)?;
    if tokens.is_empty() {
        return Ok(Expr::True);
    }
    let mut parser = Parser {
        tokens,
        next: 0,
        end: text.len(),
        depth: 0,
        strict,
    };
    let expr = parser.or()?;
    if parser.peek().is_some() {
        return parser.error("unexpected ')'");
    }
    Ok(expr)
}

/// The value of a field of an episode, as JSON (`None`: absent).
fn field_value<'a>(episode: &'a Episode, field: &Field) -> Option<std::borrow::Cow<'a, Value>> {
    use std::borrow::Cow;
    let text = |s: &str| Some(Cow::Owned(Value::String(s.to_owned())));
    match field {
        Field::Type => text(&episode.kind),
        Field::Agent => text(&episode.agent),
        Field::User => text(&episode.user),
        Field::Session => text(&episode.session_id),
        Field::App => text(&episode.app),
        Field::SourceNode => text(&episode.source_node),
        Field::Content => Some(Cow::Borrowed(&episode.content)),
        Field::Timestamp => None, // compared as a time, below
        Field::Seq => Some(Cow::Owned(Value::from(episode.seq))),
        Field::Metadata(path) if path.is_empty() => {
            Some(Cow::Owned(Value::Object(episode.metadata.clone())))
        }
        Field::Metadata(path) => {
            let mut current = episode.metadata.get(path.first()?.as_str())?;
            for part in &path[1..] {
                current = match current {
                    Value::Object(map) => map.get(part.as_str())?,
                    _ => return None,
                };
            }
            Some(Cow::Borrowed(current))
        }
    }
}

fn literal_matches(value: &Value, literal: &Literal) -> bool {
    match (value, literal) {
        (Value::String(s), Literal::String(l)) => s == l,
        (Value::Number(n), Literal::Number(l)) => n.as_f64() == Some(*l),
        (Value::Bool(b), Literal::Bool(l)) => b == l,
        (Value::Null, Literal::Null) => true,
        _ => false,
    }
}

fn order(value: &Value, literal: &Literal) -> Option<std::cmp::Ordering> {
    match (value, literal) {
        (Value::String(s), Literal::String(l)) => Some(s.as_str().cmp(l.as_str())),
        (Value::Number(n), Literal::Number(l)) => n.as_f64()?.partial_cmp(l),
        (Value::Bool(b), Literal::Bool(l)) => Some(b.cmp(l)),
        _ => None,
    }
}

fn has(value: &Value, literal: &Literal) -> bool {
    match (value, literal) {
        (_, Literal::Any) => !value.is_null(),
        (Value::String(s), Literal::String(l)) => s.contains(l.as_str()),
        (Value::Array(items), l) => items.iter().any(|item| literal_matches(item, l)),
        (Value::Object(map), Literal::String(key)) => map.contains_key(key.as_str()),
        (other, l) => literal_matches(other, l),
    }
}

fn compare_time(time: DateTime<Utc>, op: Op, literal: &Literal) -> bool {
    let Literal::String(text) = literal else {
        return matches!((op, literal), (Op::Has, Literal::Any));
    };
    let Ok(other) = DateTime::parse_from_rfc3339(text) else {
        return false;
    };
    let ordering = time.cmp(&other.with_timezone(&Utc));
    apply(op, ordering)
}

fn apply(op: Op, ordering: std::cmp::Ordering) -> bool {
    use std::cmp::Ordering::{Equal, Greater, Less};
    match op {
        Op::Eq | Op::Has => ordering == Equal,
        Op::Ne => ordering != Equal,
        Op::Lt => ordering == Less,
        Op::Le => ordering != Greater,
        Op::Gt => ordering == Greater,
        Op::Ge => ordering != Less,
    }
}

impl Expr {
    /// Whether an episode passes the filter.
    pub fn matches(&self, episode: &Episode) -> bool {
        match self {
            Expr::True => true,
            Expr::And(a, b) => a.matches(episode) && b.matches(episode),
            Expr::Or(a, b) => a.matches(episode) || b.matches(episode),
            Expr::Not(inner) => !inner.matches(episode),
            Expr::Compare(Field::Timestamp, op, literal) => {
                compare_time(episode.timestamp, *op, literal)
            }
            Expr::Compare(field, op, literal) => {
                let Some(value) = field_value(episode, field) else {
                    return false;
                };
                match op {
                    Op::Has => has(&value, literal),
                    Op::Eq => literal_matches(&value, literal),
                    Op::Ne => !literal_matches(&value, literal),
                    _ => order(&value, literal).is_some_and(|o| apply(*op, o)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn episode() -> Episode {
        let metadata = json!({
            "intent": "update",
            "subject": "alice",
            "score": 7,
            "tags": ["vip", "beta"],
            "nested": {"level": {"deep": true}},
        });
        Episode {
            id: "e1".into(),
            session_id: "s1".into(),
            seq: 3,
            cursor: 10,
            app: "support".into(),
            user: "alice".into(),
            agent: "rag".into(),
            kind: "user_message".into(),
            content: json!("I prefer dark mode"),
            metadata: metadata.as_object().cloned().unwrap_or_default(),
            source_node: "n1".into(),
            timestamp: DateTime::parse_from_rfc3339("2025-06-01T12:00:00Z")
                .map(|t| t.with_timezone(&Utc))
                .unwrap_or_default(),
            create_time: DateTime::UNIX_EPOCH,
        }
    }

    fn eval(filter: &str) -> bool {
        match parse(filter) {
            Ok(expr) => expr.matches(&episode()),
            Err(err) => panic!("{filter:?} did not parse: {err}"),
        }
    }

    #[test]
    fn comparisons_and_logic() {
        for (filter, expected) in [
            ("", true),
            ("type = \"user_message\"", true),
            ("type = user_message", true),
            ("type != user_message", false),
            ("type = agent_response OR agent = 'rag'", true),
            ("type = user_message AND agent = planner", false),
            ("type = user_message agent = rag", true),
            ("NOT type = agent_response", true),
            ("-type = user_message", false),
            ("(type = a OR type = user_message) AND user = alice", true),
            ("seq >= 3 AND seq < 4", true),
            ("seq > 3", false),
            ("metadata.score > 5.5", true),
            ("metadata.score = 7", true),
            ("metadata.intent = update", true),
            ("metadata.nested.level.deep = true", true),
            ("metadata.tags:vip", true),
            ("metadata.tags:gold", false),
            ("metadata:subject", true),
            ("metadata:object", false),
            ("metadata.object:*", false),
            ("metadata.subject:*", true),
            ("content:\"dark mode\"", true),
            ("content = \"I prefer dark mode\"", true),
            ("timestamp > \"2025-01-01T00:00:00Z\"", true),
            ("timestamp < \"2025-06-01T12:00:00+01:00\"", false),
            ("metadata.missing = 1", false),
            ("NOT metadata.missing = 1", true),
            ("metadata.score = \"7\"", false),
        ] {
            assert_eq!(eval(filter), expected, "{filter}");
        }
    }

    #[test]
    fn an_injection_attempt_is_only_a_string() {
        assert!(!eval("content = \"'; DROP TABLE episodes; --\""));
        assert!(!eval("metadata.subject = \"x' OR '1'='1\""));
    }

    #[test]
    fn errors_name_the_position() {
        for (filter, position) in [
            ("type =", 6),
            ("colour = red", 0),
            ("type = a AND", 12),
            ("(type = a", 9),
            ("type = a)", 8),
            ("type ~ a", 5),
            ("content = \"open", 10),
            ("timestamp > yesterday", 12),
            ("type.x = 1", 4),
            ("metadata. = 1", 10),
            ("type = AND", 7),
        ] {
            match parse(filter) {
                Ok(expr) => panic!("{filter:?} parsed as {expr:?}"),
                Err(err) => assert_eq!(err.position, position, "{filter:?}: {err}"),
            }
        }
    }

    #[test]
    fn and_and_or_mixed_need_parentheses() {
        for (filter, position) in [
            ("type = a AND user = b OR user = alice", 22),
            ("type = a OR type = user_message AND user = bob", 9),
            ("type = a user = b OR user = alice", 18),
            ("(type = a) OR (type = b) (user = c)", 11),
            ("NOT (type = a OR user = b AND agent = c)", 14),
        ] {
            match parse(filter) {
                Ok(expr) => panic!("{filter:?} parsed as {expr:?}"),
                Err(err) => {
                    assert_eq!(err.position, position, "{filter:?}: {err}");
                    assert!(err.message.contains("parentheses"), "{err}");
                }
            }
        }
        // Either reading, spelt out, and either operator alone, are fine.
        for filter in [
            "type = a AND (user = b OR user = alice)",
            "(type = a AND user = b) OR user = alice",
            "type = a OR user = b OR agent = c",
            "type = a user = b AND agent = c",
            "NOT type = a OR user = b",
        ] {
            assert!(parse(filter).is_ok(), "{filter:?}");
        }
        // A filter stored before the refusal keeps the reading it had.
        let stored = parse_stored("type = a AND user = b OR user = alice").expect("stored");
        assert!(stored.matches(&episode()), "(a AND b) OR c");
        let stored = parse_stored("user = alice OR type = a AND user = b").expect("stored");
        assert!(stored.matches(&episode()), "a OR (b AND c)");
    }

    #[test]
    fn limits_hold() {
        let deep = format!("{}type = a{}", "(".repeat(100), ")".repeat(100));
        assert!(parse(&deep).is_err());
        let nots = format!("{}type = a", "NOT ".repeat(100));
        assert!(parse(&nots).is_err());
        assert!(parse(&"a".repeat(MAX_FILTER_LEN + 1)).is_err());
    }

    /// Fuzz-style: arbitrary byte soup from a fixed generator never panics.
    #[test]
    fn never_panics_on_garbage() {
        let alphabet: Vec<char> = "()=!<>:*.-\"'\\ aNDORTtype metadata.x 12.5e3é\u{0}\n"
            .chars()
            .collect();
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..20_000 {
            let mut text = String::new();
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 40) as usize;
            for _ in 0..len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                text.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            if let Ok(expr) = parse(&text) {
                let _ = expr.matches(&episode());
            }
        }
    }
}
