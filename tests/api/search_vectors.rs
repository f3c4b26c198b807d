//! The server's own reading of text, held to Postgres's: plain queries
//! normalised in Rust as `to_tsvector` and `phraseto_tsquery` read them,
//! and the search vectors the server builds for episodes, Arabic text and
//! memory values equal to those Postgres's triggers build; kilobyte
//! episodes keep their vectors in the row.

use std::collections::BTreeSet;

use engram::proto::{SearchRequest, SetRequest};
use serde_json::json;

use crate::helpers::{Backend, TestServer};
use crate::search::{
    EPISODES, NS, append, assert_none_differ, episode, memory_query, names, query, search, set,
};

/// Plain queries are normalised in Rust, the rest by Postgres: the two
/// must agree. Every word of this project's README and benchmark log (a
/// few thousand, plain ones only) and each of their lines as a phrase, against Postgres's own
/// `to_tsvector` and `phraseto_tsquery`, plus every stop word.
#[tokio::test]
async fn plain_queries_normalise_as_postgres_does() {
    use engram::search::english;

    let readme = concat!(
        include_str!("../../README.md"),
        include_str!("../../docs/benchmarks.md")
    );
    let mut words: Vec<String> = readme
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_owned)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    words.extend(
        [
            "THE", "Of", "s", "t", "don", "Running", "W448", "user42", "007",
        ]
        .map(String::from),
    );
    let phrases: Vec<String> = readme
        .lines()
        .map(|line| {
            line.split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|w| !w.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|line| !line.is_empty())
        .collect();
    assert!(words.len() > 1_000 && phrases.len() > 500);
    // And the lines as written, punctuation and all, where Rust reads them
    // (Arabic words spelt as a query's are before Postgres reads them:
    // `engram_arabic_text`, migration 0031).
    // A migrated database, for `engram_english`.
    let server = TestServer::spawn(Backend::Postgres).await;
    let reading = crate::helpers::pg_reading(&server.db.url).await;
    let mut phrases = phrases;
    let written = phrases.len();
    phrases.extend(
        readme
            .lines()
            .map(|line| english::spaced(line).into_owned())
            .filter(|line| {
                english::plain(line, reading).is_some_and(|w| w.iter().any(Option::is_some))
            }),
    );
    assert!(
        phrases.len() - written > 200,
        "{} lines read as written",
        phrases.len() - written
    );
    // And what agents write, curly quotes, dashes and numbers included.
    let agents = phrases.len();
    for line in include_str!("../data/agent_episodes.jsonl").lines() {
        let episode: serde_json::Value = serde_json::from_str(line).expect("an episode");
        let text = english::spaced(episode["content"].as_str().expect("text")).into_owned();
        if english::plain(&text, reading).is_some() {
            phrases.push(text);
        }
    }
    if reading == english::Reading::Symbols {
        assert_eq!(phrases.len() - agents, 53, "the agents' texts read here");
    }

    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&server.db.url)
        .await
        .expect("connect");
    let (lexemes, tsqueries): (Vec<String>, Vec<String>) = sqlx::query_as(
        "SELECT ARRAY(SELECT array_to_string(ARRAY(SELECT u.lexeme \
         FROM unnest(to_tsvector('engram_english', t.w)) u ORDER BY u.positions[1]), ' ') \
         FROM unnest($1::text[]) WITH ORDINALITY AS t(w, i) ORDER BY t.i), \
         ARRAY(SELECT phraseto_tsquery('engram_english', engram_arabic_text(t.p))::text \
         FROM unnest($2::text[]) WITH ORDINALITY AS t(p, i) ORDER BY t.i)",
    )
    .bind(&words)
    .bind(&phrases)
    .fetch_one(&mut conn)
    .await
    .expect("normalise");

    let mut differ = Vec::new();
    for (word, postgres) in words.iter().zip(&lexemes) {
        let ours = english::distinct(&english::plain(word, reading).expect("a plain word"));
        if &ours != postgres {
            differ.push(format!("{word}: {ours:?} against {postgres:?}"));
        }
    }
    for (phrase, postgres) in phrases.iter().zip(&tsqueries) {
        let ours = english::phrase(&english::plain(phrase, reading).expect("a plain phrase"));
        if &ours != postgres {
            differ.push(format!("{phrase:?}: {ours:?} against {postgres:?}"));
        }
    }
    assert_none_differ(&differ);
    // Postgres drops the stop words Rust knows, and only those.
    let stops = lexemes.iter().filter(|l| l.is_empty()).count();
    assert!(stops >= 100, "{stops} stop words among the README's words");
}

/// Episodes' JSON for [`episode_vectors_built_by_the_server_match_postgres`]:
/// deterministic (xorshift), mostly text Rust reads, some that only
/// Postgres's parser does.
struct Generated(u64);

impl Generated {
    const WORDS: &[&str] = &[
        "Deployments",
        "running",
        "the",
        "of",
        "it",
        "s",
        "t",
        "don",
        "user",
        "USERS",
        "w448",
        "42",
        "007",
        "1e5",
        "1e5x",
        "12E3b4",
        "x1e5",
        "2ex",
        "0x1f",
        "v2",
        "ab12cd",
        "setup",
        "Kubernetes",
        "a",
        "I",
        "caching",
        "src",
        "auth",
        "validate",
        "ts",
        "com",
        "www",
        "http",
        "amp",
        "lt",
        "nbsp",
        "well-known",
        "state-of-the-art",
        "Running-Deployments",
        "the-end",
        "of-the",
        "e-mail",
        "x1-y",
        "covid-19",
        "3.14",
        "-5",
        "+2.5",
        "10.0.0.1",
        "-0.25",
        "-1.5.3",
        "1..5",
        "3.21s",
        "1.2.3rc1",
        "2.5ex",
        "3.14E5",
        "1.2M",
        "4o-mini",
        "e2e-tests",
        "1st-class",
        "10-fold",
        "0x1f-a",
        "a-b1",
        "1e5-x",
        "Zürich",
        "café",
        "naïve",
        "НОВЫЙ",
        "Ωμέγα",
        "thé",
        "Straße",
        "İstanbul",
        "ǅemal",
        "e\u{301}te",
        "ﬁle",
        "Łódź",
    ];
    /// What follows a word: the first [`Self::PLAIN`] are breaks Rust
    /// reads, the rest are what Postgres's parser reads its own way.
    #[rustfmt::skip]
    const MARKS: &[&str] = &[
        " ", " ", " ", " ", "  ", "\n", "\t", "\r\n", ", ", ". ", ".", "!", "?", ";", ":", "'",
        "\"", "(", ")", "[", "]", "{", "}", "_", "*", "#", "$", "%", "=", "^", "`", "|", "\\", "-",
        " - ", "- ", "--", "-\n", "/", "’", " — ", "—", "“", "”", "…", "\u{a0}", "–", "‘", "«", "🙂",
        "👍\u{fe0f}", " ✅ ", "\u{fe0f}", "👍🏽", "\u{200d}", " -> ", "=>", " < ", "&D ", "++ ", ">",
        "&", "+", " -", "@", ".x", "~", "é", "<", "1.5", "@x.", ".1", "1.", "ª", "·", "&amp;",
        "<b>", "</b>", "&#38;", "+",
    ];
    const PLAIN: usize = 63;

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    fn text(&mut self) -> String {
        let mut out = String::new();
        for _ in 0..self.below(14) {
            out.push_str(Self::WORDS[self.below(Self::WORDS.len())]);
            let mark = if self.below(8) == 0 {
                self.below(Self::MARKS.len())
            } else {
                self.below(Self::PLAIN)
            };
            out.push_str(Self::MARKS[mark]);
        }
        out
    }

    fn value(&mut self, depth: usize) -> serde_json::Value {
        use serde_json::Value;
        match if depth > 2 { 0 } else { self.below(10) } {
            0..=5 => Value::String(self.text()),
            6 => Value::Array((0..self.below(4)).map(|_| self.value(depth + 1)).collect()),
            7 => Value::Object(
                (0..self.below(4))
                    .map(|k| {
                        let key =
                            ["k", "bb", "a", "zz", "key", "a/b", "é", "a.b", "x@y"][self.below(9)];
                        (format!("{key}{k}"), self.value(depth + 1))
                    })
                    .collect(),
            ),
            8 => [Value::Bool(true), Value::Null][self.below(2)].clone(),
            _ => match self.below(4) {
                0 => json!(self.below(1000)),
                1 => json!(-(self.below(1000) as i64)),
                2 => json!(self.below(1000) as f64 / 8.0 - 60.0),
                _ => json!(self.below(1000) as f64 * 1e-9),
            },
        }
    }
}

/// Each vector the server built that is not Postgres's, described.
fn differing(
    built: &[Option<Vec<u8>>],
    postgres: &[Vec<u8>],
    describe: impl Fn(usize) -> String,
) -> Vec<String> {
    built
        .iter()
        .enumerate()
        .filter(|(at, ours)| ours.as_ref().is_some_and(|ours| ours != &postgres[*at]))
        .map(|(at, _)| describe(at))
        .collect()
}

/// The search vector the server builds for an episode
/// (`search/vector.rs`) is byte for byte the one Postgres builds from the
/// same JSON (the trigger's `engram_episode_vector`, migration 0020), on
/// generated episodes that mix words, punctuation, objects, arrays and
/// what Postgres's parser reads its own way; the server builds most of
/// them. Then, through a server: an episode appended with a vector built
/// here and one left to the trigger both hold Postgres's vector, and an
/// update of an episode's content builds it again.
#[tokio::test]
async fn episode_vectors_built_by_the_server_match_postgres() {
    use engram::search::{english, vector};
    use serde_json::Value;

    let server = TestServer::spawn(Backend::Postgres).await;
    let reading = crate::helpers::pg_reading(&server.db.url).await;
    let mut make = Generated(0x9e37_79b9_7f4a_7c15);
    let mut contents = Vec::new();
    let mut metadatas = Vec::new();
    for _ in 0..20_000 {
        contents.push(make.value(0));
        let mut metadata = serde_json::Map::new();
        for k in 0..make.below(3) {
            metadata.insert(format!("m{k}"), Value::String(make.text()));
        }
        metadatas.push(metadata);
    }
    // And episodes as agents write them (`tests/data/agent_episodes.jsonl`:
    // curly quotes, dashes, decimals, versions, lists, numbers in the
    // metadata).
    let written = contents.len();
    for line in include_str!("../data/agent_episodes.jsonl").lines() {
        let mut episode: Value = serde_json::from_str(line).expect("an episode");
        let Value::Object(metadata) = episode["metadata"].take() else {
            panic!("metadata is an object: {line}")
        };
        contents.push(episode["content"].take());
        metadatas.push(metadata);
    }
    let built: Vec<Option<Vec<u8>>> = contents
        .iter()
        .zip(&metadatas)
        .map(|(content, metadata)| vector::episode(content, metadata, reading))
        .collect();

    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&server.db.url)
        .await
        .expect("connect");
    let postgres: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT ARRAY(SELECT tsvectorsend(engram_episode_vector(c::jsonb, m::jsonb)) \
         FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(c, m, i) ORDER BY i)",
    )
    .bind(contents.iter().map(Value::to_string).collect::<Vec<_>>())
    .bind(
        metadatas
            .iter()
            .map(|m| Value::Object(m.clone()).to_string())
            .collect::<Vec<_>>(),
    )
    .fetch_one(&mut conn)
    .await
    .expect("Postgres's vectors");
    assert_none_differ(&differing(&built, &postgres, |at| {
        format!("{} {:?}", contents[at], metadatas[at])
    }));
    // And the text itself is read alike, compounds and all.
    let texts: Vec<String> = (0..5_000).map(|_| make.text()).collect();
    let spaced: Vec<String> = sqlx::query_scalar(
        "SELECT ARRAY(SELECT engram_search_text(t) \
         FROM unnest($1::text[]) WITH ORDINALITY AS u(t, i) ORDER BY i)",
    )
    .bind(&texts)
    .fetch_one(&mut conn)
    .await
    .expect("Postgres's reading");
    let differ: Vec<String> = texts
        .iter()
        .zip(&spaced)
        .filter(|(text, postgres)| {
            let composed = engram::search::spelling::composed(text);
            engram::search::english::spaced(&composed) != postgres.as_str()
        })
        .map(|(text, postgres)| format!("{text:?}: {postgres:?}"))
        .collect();
    assert_none_differ(&differ);
    let ours = built.iter().filter(|v| v.is_some()).count();
    assert!(
        (4_000..16_000).contains(&ours),
        "{ours} of 20,000 built by the server: both ways must be tried"
    );
    // What agents write is read by the server, where the database reads
    // punctuation and emoji as breaks as it does: all 53 of these (21
    // before numbers, compounds with digits, curly quotes and emoji were
    // read here).
    let agents = built[written..].iter().filter(|v| v.is_some()).count();
    if reading == english::Reading::Symbols {
        assert_eq!(agents, 53, "the agents' episodes built by the server");
    }

    // Through the server: one episode whose vector it builds, one it
    // leaves to the trigger, then an update.
    let plain = json!({
        "text": "Deployments: the cluster’s setup (w448) in src/auth/validate.ts — 3.5× faster 🎉",
        "turn": 12
    });
    let parsed = json!("<b>blue-green</b> deploys of covid-19 fixes, 1.5 GB");
    assert!(vector::episode(&plain, &serde_json::Map::new(), reading).is_some());
    assert!(vector::episode(&parsed, &serde_json::Map::new(), reading).is_none());
    server
        .episodes()
        .append_episodes(append(
            "s1",
            "alice",
            vec![
                episode("plain", "user_message", "", plain.clone()),
                episode("parsed", "user_message", "", parsed),
            ],
        ))
        .await
        .expect("append");
    const CHECK: &str = "SELECT id, search = engram_episode_vector(content, metadata), \
         search::text FROM episodes ORDER BY id";
    // Every stored episode's vector, each checked against Postgres's.
    let checked = async |conn: &mut sqlx::PgConnection| {
        let rows: Vec<(String, bool, String)> = sqlx::query_as(CHECK)
            .fetch_all(conn)
            .await
            .expect("vectors");
        assert!(rows.iter().all(|(_, same, _)| *same), "{rows:?}");
        rows
    };
    let rows = checked(&mut conn).await;
    assert_eq!(rows.len(), 2);
    assert!(rows[1].2.contains("'w448'"), "{}", rows[1].2);
    assert!(
        rows[1].2.contains("'valid'") && rows[1].2.contains("'ts'"),
        "{}",
        rows[1].2
    );
    // A replay beside a new episode (the append reads first, then writes
    // the new one only): the new one gets its own vector.
    server
        .episodes()
        .append_episodes(append(
            "s1",
            "alice",
            vec![
                episode("plain", "user_message", "", plain.clone()),
                episode("third", "user_message", "", json!("w999 third")),
            ],
        ))
        .await
        .expect("append again");
    let rows = checked(&mut conn).await;
    assert_eq!(rows[2].2, "'third':2 'w999':1");
    sqlx::query("UPDATE episodes SET content = '\"w777 rebuilt\"' WHERE id = 'plain'")
        .execute(&mut conn)
        .await
        .expect("update");
    let rows = checked(&mut conn).await;
    assert_eq!(rows[1].2, "'rebuilt':2 'w777':1");
}

/// Arabic text the server reads itself where the database reads Arabic
/// letters so (`Reading::Arabic`): the vectors it builds are byte for byte
/// Postgres's `engram_episode_vector` of the same JSON, articles, letter
/// variants, Arabic punctuation and all, on generated texts; and it
/// builds half of them, vowel points and all (the rest, with Arabic
/// digits, a hyphen after a letter or a mark it does not read, are left
/// to Postgres).
#[tokio::test]
async fn arabic_vectors_built_by_the_server_match_postgres() {
    use engram::search::{english, vector};
    use serde_json::Value;

    const WORDS: &[&str] = &[
        "المدرسة",
        "والمدرسة",
        "بالمدرسة",
        "للمدرسة",
        "كالبحر",
        "فالكتاب",
        "الالتزام",
        "التزام",
        "أحمد",
        "إلى",
        "آخر",
        "على",
        "مستشفى",
        "کتاب",
        "یک",
        "خانۀ",
        "ٱلحمد",
        "الم",
        "الله",
        "لله",
        "وزير",
        "و",
        "في",
        "ال",
        "x",
        "Deployments",
        "café",
        "3.14",
        "42",
        "user_42",
        "ذهبتُ",
        "مَدرسة",
        "٣٤",
        "۱۲",
        "می\u{200c}خواهم",
        "ہے",
        "بھی",
    ];
    #[rustfmt::skip]
    const MARKS: &[&str] = &[
        " ", " ", " ", "\n", "، ", "؟", "؛ ", "۔ ", ". ", ", ", "-", "«", "»", "(", ")", "“", "…",
        "\u{200f}", "ـ", "/", "_",
    ];
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut below = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let mut contents = Vec::new();
    for _ in 0..5_000 {
        let mut text = String::new();
        for _ in 0..below(16) {
            text.push_str(WORDS[below(WORDS.len())]);
            text.push_str(MARKS[below(MARKS.len())]);
        }
        contents.push(Value::String(text));
    }
    let server = TestServer::spawn(Backend::Postgres).await;
    let reading = crate::helpers::pg_reading(&server.db.url).await;
    assert_eq!(reading, english::Reading::Arabic);
    let none = serde_json::Map::new();
    let built: Vec<Option<Vec<u8>>> = contents
        .iter()
        .map(|content| vector::episode(content, &none, reading))
        .collect();
    let read_here = built.iter().filter(|b| b.is_some()).count();
    assert!(read_here > 2_000, "{read_here} of 5,000 read by the server");
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&server.db.url)
        .await
        .expect("connect");
    let postgres: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT ARRAY(SELECT tsvectorsend(engram_episode_vector(c::jsonb, '{}')) \
         FROM unnest($1::text[]) WITH ORDINALITY AS t(c, i) ORDER BY i)",
    )
    .bind(contents.iter().map(Value::to_string).collect::<Vec<_>>())
    .fetch_one(&mut conn)
    .await
    .expect("Postgres's vectors");
    assert_none_differ(&differing(&built, &postgres, |at| contents[at].to_string()));
}

/// The search vector the server builds for a memory version
/// (`vector::memory`) is byte for byte Postgres's `engram_memory_vector`
/// of the same key and value, on generated keys and values. Then, through
/// a server: sets whose vectors it builds (alone, and many at once, which
/// group commit writes in one statement) and ones it leaves to the
/// trigger (told apart by a mark the trigger's function adds meanwhile),
/// a compare-and-set and a delete all leave each live key's
/// `memory_search` row at its current version with Postgres's vector, and
/// no version keeps a vector of its own.
#[tokio::test]
async fn memory_vectors_built_by_the_server_match_postgres() {
    use engram::proto::DeleteRequest;
    use engram::search::vector;

    let server = TestServer::spawn(Backend::Postgres).await;
    let reading = crate::helpers::pg_reading(&server.db.url).await;
    let mut make = Generated(0x2545_f491_4f6c_dd1d);
    let mut keys = Vec::new();
    let mut values = Vec::new();
    for at in 0..10_000 {
        keys.push(match at % 3 {
            0 => make.text(),
            1 => format!("user/{}", make.text()),
            _ => format!("k{at}"),
        });
        values.push(make.value(0));
    }
    let built: Vec<Option<Vec<u8>>> = keys
        .iter()
        .zip(&values)
        .map(|(key, value)| vector::memory(key, value, reading))
        .collect();
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&server.db.url)
        .await
        .expect("connect");
    let postgres: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT ARRAY(SELECT tsvectorsend(engram_memory_vector(k, v::jsonb)) \
         FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(k, v, i) ORDER BY i)",
    )
    .bind(&keys)
    .bind(values.iter().map(|v| v.to_string()).collect::<Vec<_>>())
    .fetch_one(&mut conn)
    .await
    .expect("Postgres's vectors");
    assert_none_differ(&differing(&built, &postgres, |at| {
        format!("{:?} {}", keys[at], values[at])
    }));
    let ours = built.iter().filter(|v| v.is_some()).count();
    assert!(
        (2_000..9_000).contains(&ours),
        "{ours} of 10,000 built by the server: both ways must be tried"
    );

    // Through the server, with the trigger's vectors marked.
    for statement in [
        "ALTER FUNCTION engram_memory_vector(text, jsonb) RENAME TO engram_memory_vector_unmarked",
        "CREATE FUNCTION engram_memory_vector(key text, value jsonb) RETURNS tsvector \
         LANGUAGE sql IMMUTABLE AS $$ SELECT engram_memory_vector_unmarked(key, value) \
         || 'zzmarked'::tsvector $$",
    ] {
        sqlx::query(statement)
            .execute(&mut conn)
            .await
            .expect("mark the trigger's vectors");
    }
    let plain =
        json!({"text": "Deployments: the cluster’s setup (w448) — 3.5× faster", "turn": 12});
    let parsed = json!("<b>blue-green</b> deploys of v1.2, 1.5 GB");
    assert!(vector::memory("deploy/plain", &plain, reading).is_some());
    assert!(vector::memory("deploy/parsed", &parsed, reading).is_none());
    // A search asks the database how it reads text, which the server's
    // first writes do not wait for (they leave their vectors to the
    // trigger until it knows).
    search(&server, memory_query("w1")).await;
    let mut memory = server.memory();
    memory
        .set(set("notes", "deploy/plain", plain.clone()))
        .await
        .expect("set");
    memory
        .set(set("notes", "deploy/parsed", parsed))
        .await
        .expect("set");
    // Many at once: group commit writes them in one statement.
    let sets = (0..16).map(|n| {
        let mut memory = server.memory();
        async move {
            memory
                .set(set(
                    "notes",
                    &format!("many/{n}"),
                    json!(format!("w{n} batch")),
                ))
                .await
                .expect("set")
        }
    });
    futures::future::join_all(sets).await;
    // A compare-and-set of a new value, and a delete.
    memory
        .set(SetRequest {
            expected_version: Some(1),
            ..set("notes", "deploy/plain", json!("w501 replaced"))
        })
        .await
        .expect("compare-and-set");
    memory
        .delete(DeleteRequest {
            scope_type: NS,
            scope: "notes".into(),
            key: "many/0".into(),
            ..DeleteRequest::default()
        })
        .await
        .expect("delete");
    for statement in [
        "DROP FUNCTION engram_memory_vector(text, jsonb)",
        "ALTER FUNCTION engram_memory_vector_unmarked(text, jsonb) RENAME TO engram_memory_vector",
    ] {
        sqlx::query(statement)
            .execute(&mut conn)
            .await
            .expect("unmark");
    }
    let rows: Vec<(String, i64, bool, String)> = sqlx::query_as(
        "SELECT s.key, s.version, s.search = engram_memory_vector(v.key, v.value), \
         s.search::text FROM memory_search s JOIN memory_versions v \
         USING (tenant, scope_type, scope, key, version) WHERE s.scope = 'notes' ORDER BY s.key",
    )
    .fetch_all(&mut conn)
    .await
    .expect("memory vectors");
    // Only the text left to the trigger was built by it.
    for (key, _, same, vector) in &rows {
        let by_trigger = key == "deploy/parsed";
        assert_eq!(vector.contains("zzmarked"), by_trigger, "{key}: {vector}");
        assert_eq!(*same, !by_trigger, "{key}: {vector}");
    }
    let keys: Vec<(&str, i64)> = rows.iter().map(|(k, v, _, _)| (k.as_str(), *v)).collect();
    assert_eq!(keys.len(), 17, "{keys:?}");
    assert_eq!(keys[0], ("deploy/parsed", 1));
    assert_eq!(keys[1], ("deploy/plain", 2));
    assert!(!keys.iter().any(|(k, _)| *k == "many/0"), "{keys:?}");
    assert!(rows[1].3.contains("'w501':3"), "{}", rows[1].3);
    let kept: i64 =
        sqlx::query_scalar("SELECT count(*) FROM memory_versions WHERE search IS NOT NULL")
            .fetch_one(&mut conn)
            .await
            .expect("versions' vectors");
    assert_eq!(kept, 0, "no version keeps a vector");
    let hits = search(&server, memory_query("w501")).await;
    assert_eq!(names(&hits), ["memory:notes/deploy/plain@2"]);
    let hits = search(&server, memory_query("w7 batch")).await;
    assert_eq!(names(&hits)[0], "memory:notes/many/7@1");
}

/// On Postgres a kilobyte episode keeps its search vector in its row
/// (migration 0015), so a search reads it without a TOAST lookup: the
/// vector is past the 2 KB at which Postgres would otherwise move it
/// out, the episodes' TOAST relation stays empty, and the episode is
/// found by a word of it.
#[tokio::test]
async fn kilobyte_episodes_keep_their_vectors_in_the_row() {
    let server = TestServer::spawn(Backend::Postgres).await;
    // Distinct, random-looking words: pglz cannot shrink their vector
    // by the quarter it requires, as with most real text of this size.
    let mut at: u64 = 7;
    let words: Vec<String> = (0..150)
        .map(|_| {
            at = at * 48_271 % 2_147_483_647;
            format!("w{at}")
        })
        .collect();
    server
        .episodes()
        .append_episodes(append(
            "s1",
            "alice",
            vec![episode(
                "big",
                "user_message",
                "",
                json!(format!("{} needle", words.join(" "))),
            )],
        ))
        .await
        .expect("append");
    let hits = search(
        &server,
        SearchRequest {
            sources: vec![EPISODES],
            ..query("needle")
        },
    )
    .await;
    assert_eq!(names(&hits), vec!["episode:big"]);

    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&server.db.url)
        .await
        .expect("connect");
    let (vector, toast): (i32, i64) = sqlx::query_as(
        "SELECT (SELECT pg_column_size(search) FROM episodes WHERE id = 'big'), \
         pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = 'episodes'",
    )
    .fetch_one(&mut conn)
    .await
    .expect("sizes");
    assert!(vector > 2_000, "the vector takes {vector} bytes");
    assert_eq!(toast, 0, "bytes in the episodes' TOAST relation");
}
