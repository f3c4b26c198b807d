//! The tokenizer read through tables made with it, reading by reading.

use sqlx::{Connection, Row};

use super::*;
use crate::search::{cjk, english, spelling};

/// The arguments of migration 0016's tables.
const READING_3: &str = "remove_diacritics 0 categories ''L* N* Co M*'' reading 3";

/// The lexemes the tokenizer stores for `text`, in order.
async fn lexemes(conn: &mut SqliteConnection, text: &str) -> Vec<String> {
    sqlx::query("DELETE FROM t")
        .execute(&mut *conn)
        .await
        .expect("clear");
    sqlx::query("INSERT INTO t (text) VALUES (?1)")
        .bind(text)
        .execute(&mut *conn)
        .await
        .expect("insert");
    sqlx::query("SELECT term FROM v ORDER BY offset")
        .fetch_all(&mut *conn)
        .await
        .expect("vocabulary")
        .iter()
        .map(|row| row.get::<String, _>(0))
        .collect()
}

/// How many rows of `t` the FTS5 query `query` matches.
async fn matches(conn: &mut SqliteConnection, query: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM t WHERE t MATCH ?1")
        .bind(query)
        .fetch_one(&mut *conn)
        .await
        .expect("match")
}

/// A connection with the tokenizer, a table `t` read with `arguments`
/// and its vocabulary `v`.
async fn table(arguments: &str) -> SqliteConnection {
    let mut conn = SqliteConnection::connect("sqlite::memory:")
        .await
        .expect("connect");
    register(&mut conn).await.expect("register");
    for statement in [
        format!("CREATE VIRTUAL TABLE t USING fts5(text, tokenize = 'engram_english {arguments}')"),
        "CREATE VIRTUAL TABLE v USING fts5vocab(t, instance)".to_owned(),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(&mut conn)
            .await
            .expect("create");
    }
    conn
}

#[tokio::test]
async fn the_tokenizer_stems_as_postgres_and_leaves_the_rest_whole() {
    let mut conn = table("remove_diacritics 2").await;
    let cases: [(&str, &[&str]); 5] = [
        // Porter read `deploy` as `deploi` but `deployment` as `deploy`.
        ("We deploy Deployments", &["we", "deploy", "deploy"]),
        ("https and http", &["https", "and", "http"]),
        (
            "the Café's naïve résumé",
            &["the", "cafe", "s", "naiv", "resum"],
        ),
        (
            "user_42 v1.2 covid-19",
            &["user", "42", "v1", "2", "covid", "19"],
        ),
        // Owner tokens (hex between a letter and `x`) pass whole.
        (
            "tEAAAAAx u64656661756C7400616C696365x",
            &["teaaaaax", "u64656661756c7400616c696365x"],
        ),
    ];
    for (text, want) in cases {
        assert_eq!(lexemes(&mut conn, text).await, want, "{text}");
    }
    // A query is read by the same tokenizer.
    let found: i64 = sqlx::query_scalar("SELECT count(*) FROM t WHERE t MATCH '\"deployed\"'")
        .fetch_one(&mut conn)
        .await
        .expect("match");
    assert_eq!(found, 0, "the last row holds no form of deploy");
    lexemes(&mut conn, "we deploy").await;
    let found: i64 = sqlx::query_scalar("SELECT count(*) FROM t WHERE t MATCH '\"deployment\"'")
        .fetch_one(&mut conn)
        .await
        .expect("match");
    assert_eq!(found, 1);
}

#[tokio::test]
async fn reading_2_leaves_markup_out_and_folds_letters() {
    let mut conn = table("remove_diacritics 2 reading 2").await;
    let cases: [(&str, &[&str]); 4] = [
        (
            "<p class=\"x\">Deploy &amp; roll</p><br/>",
            &["deploy", "roll"],
        ),
        (
            "<style>p {}</style>after <script>x()</script>end",
            &["after", "end"],
        ),
        (
            "Straße Søren ﬁle café",
            &["strass", "soren", "file", "cafe"],
        ),
        (
            "tEAAAAAx u64656661756C7400616C696365x",
            &["teaaaaax", "u64656661756c7400616c696365x"],
        ),
    ];
    for (text, want) in cases {
        assert_eq!(lexemes(&mut conn, text).await, want, "{text}");
    }
    // The query is read alike: `strasse` finds `Straße`.
    lexemes(&mut conn, "Straße").await;
    let found: i64 = sqlx::query_scalar("SELECT count(*) FROM t WHERE t MATCH '\"strasse\"'")
        .fetch_one(&mut conn)
        .await
        .expect("match");
    assert_eq!(found, 1);
    // A reading this server does not know is refused.
    let unknown = sqlx::query(
        "CREATE VIRTUAL TABLE u USING fts5(text, tokenize = 'engram_english reading 11')",
    )
    .execute(&mut conn)
    .await;
    assert!(unknown.is_err(), "{unknown:?}");
}

#[tokio::test]
async fn reading_3_reads_each_string_alone() {
    let mut conn = table(READING_3).await;
    let gap = "\u{1e}";
    let cases: [(&str, &[&str]); 7] = [
        // An open `<script>` hides the rest of its own string only, and
        // a string without words leaves no gap.
        ("<script>x()\u{1e}canary", &["canari"]),
        // A tag is not begun in one string and ended in the next.
        (
            "<b\u{1e}kestrel=x> zebra",
            &["b", gap, "kestrel", "x", "zebra"],
        ),
        ("<b\u{1f}kestrel=x> zebra", &["b", "kestrel", "x", "zebra"]),
        // A gap after a string with a word, not after stop words, and
        // one for several strings without words.
        (
            "deploy\u{1e}\u{1e}<br>\u{1e}notes",
            &["deploy", gap, "note"],
        ),
        ("the\u{1e}notes", &["the", "note"]),
        ("deploy\u{1f}notes\u{1e}", &["deploy", "note"]),
        // Combining marks belong to their word, as Postgres reads
        // them; `unaccent` takes the accents off.
        (
            "cafe\u{301}s x\u{363}y \u{2764}\u{fe0f}you",
            &["cafe", "x\u{363}i", "you"],
        ),
    ];
    for (text, want) in cases {
        assert_eq!(lexemes(&mut conn, text).await, want, "{text:?}");
    }
    // Numbers Postgres keeps whole are one token, found whole.
    for (text, want) in [
        ("pi is 3.14 today", &["pi", "is", "3.14", "today"][..]),
        (
            "at -5 on 10.0.0.1, 3.14pm",
            &["at", "-5", "on", "10.0.0.1", "3", "14pm"],
        ),
    ] {
        assert_eq!(lexemes(&mut conn, text).await, want, "{text:?}");
    }
    lexemes(&mut conn, "pi is 3.14 today").await;
    for (query, found) in [("3.14", 1), ("14", 0), ("3", 0)] {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t WHERE t MATCH ?1")
            .bind(format!("\"{query}\""))
            .fetch_one(&mut conn)
            .await
            .expect("match");
        assert_eq!(n, found, "{query}");
    }
    // A phrase runs between parts, not between strings.
    for (text, found) in [("deploy\u{1f}notes", 1), ("deploy\u{1e}notes", 0)] {
        lexemes(&mut conn, text).await;
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t WHERE t MATCH '\"deploy notes\"'")
            .fetch_one(&mut conn)
            .await
            .expect("match");
        assert_eq!(n, found, "{text:?}");
    }
}

#[tokio::test]
async fn reading_4_reads_a_number_before_letters_apart_from_them() {
    let mut conn = table(&READING_3.replace("reading 3", "reading 4")).await;
    let cases: [(&str, &[&str]); 3] = [
        (
            "took 3.21s, then 1.2.3rc1",
            &["took", "3.21", "s", "then", "1.2.3", "rc1"],
        ),
        // Not before an `e` (`3.14E5` may be a number there), nor
        // after a letter; numbers apart from letters as in reading 3.
        (
            "3.14E5 x3.5s (2.5Gi) -5 10.0.0.1",
            &["3", "14e5", "x3", "5s", "2.5", "gi", "-5", "10.0.0.1"],
        ),
        // The letters are a word as any other: folded and stemmed.
        ("4.5Bugs 2.0Units", &["4.5", "bug", "2.0", "unit"]),
    ];
    for (text, want) in cases {
        assert_eq!(lexemes(&mut conn, text).await, want, "{text:?}");
    }
    lexemes(&mut conn, "the build took 3.21s").await;
    for (query, found) in [("3.21", 1), ("\"3.21s\"", 1), ("21s", 0), ("3", 0)] {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t WHERE t MATCH ?1")
            .bind(if query.starts_with('"') {
                query.to_owned()
            } else {
                format!("\"{query}\"")
            })
            .fetch_one(&mut conn)
            .await
            .expect("match");
        assert_eq!(n, found, "{query}");
    }
    // A table of reading 3 reads as it always did.
    let mut old = table(READING_3).await;
    assert_eq!(lexemes(&mut old, "took 3.21s").await, ["took", "3", "21s"]);
}

#[tokio::test]
async fn reading_5_reads_each_cjk_character_alone() {
    let mut conn = table(&READING_3.replace("reading 3", "reading 5")).await;
    let cases: [(&str, &[&str]); 4] = [
        (
            "我喜欢深色模式",
            &["我", "喜", "欢", "深", "色", "模", "式"],
        ),
        // The letters beside them are words as any other: folded and
        // stemmed; punctuation of the blocks is a break, a lone mark
        // is no word.
        (
            "GPT模型をDeployments、Café・ｶﾀ\u{3099}",
            &["gpt", "模", "型", "を", "deploy", "cafe", "ｶ", "ﾀ"],
        ),
        ("한국어 검색", &["한", "국", "어", "검", "색"]),
        // Numbers as before.
        ("第3章 v2 3.5", &["第", "3", "章", "v2", "3.5"]),
    ];
    for (text, want) in cases {
        assert_eq!(lexemes(&mut conn, text).await, want, "{text:?}");
    }
    lexemes(&mut conn, "我喜欢深色模式").await;
    for (query, found) in [
        ("\"深 色\"", 1),
        ("\"深色\"", 1),
        ("\"色 深\"", 0),
        ("深", 1),
    ] {
        assert_eq!(matches(&mut conn, query).await, found, "{query}");
    }
    // A table of reading 4 reads as it always did.
    let mut old = table(&READING_3.replace("reading 3", "reading 4")).await;
    assert_eq!(lexemes(&mut old, "深色 模式").await, ["深色", "模式"]);
}

#[tokio::test]
async fn reading_8_reads_each_cluster_alone() {
    let mut conn = table(&READING_3.replace("reading 3", "reading 8")).await;
    let cases: [(&str, &[&str]); 4] = [
        (
            "ผมไม่ชอบกาแฟ",
            &["ผ", "ม", "ไ", "ม่", "ช", "อ", "บ", "ก", "า", "แ", "ฟ"],
        ),
        // Words beside them as any other, a number whole.
        (
            "Deployments ด้วย ราคา3.14บาท",
            &[
                "deploy", "ด้", "ว", "ย", "ร", "า", "ค", "า", "3.14", "บ", "า", "ท",
            ],
        ),
        ("ខ្ញុំ မြန်", &["ខ្", "ញុំ", "မြ", "န်"]),
        // Chinese as before.
        ("深色", &["深", "色"]),
    ];
    for (text, want) in cases {
        assert_eq!(lexemes(&mut conn, text).await, want, "{text:?}");
    }
    // Every letter and digit of the four scripts with each mark of its
    // script is one cluster, as `cjk::units` cuts it.
    let scripts = [
        '\u{0e00}'..='\u{0e7f}',
        '\u{0e80}'..='\u{0eff}',
        '\u{1000}'..='\u{109f}',
        '\u{1780}'..='\u{17ff}',
    ];
    let mut differ = Vec::new();
    for script in scripts {
        let starts = script.clone().filter(|&c| cjk::is_cluster_start(c));
        for c in starts {
            let marks = script.clone().filter(|&m| cjk::is_cluster_mark(m));
            let text: String = std::iter::once(format!("x{c}9 "))
                .chain(marks.map(|m| format!("{c}{m}{m} ")))
                .collect();
            let want: Vec<String> = cjk::units(&text, cjk::Units::Clusters)
                .into_iter()
                .map(|r| text[r].to_owned())
                .collect();
            let mut got = lexemes(&mut conn, &text).await;
            got.retain(|l| l != "x" && l != "9");
            if got != want {
                differ.push(format!("{text:?}: {got:?}"));
            }
        }
    }
    assert!(differ.is_empty(), "{} differ: {differ:#?}", differ.len());
    lexemes(&mut conn, "ผมไม่ชอบกาแฟ").await;
    for (query, found) in [
        ("\"ก า แ ฟ\"", 1),
        ("\"กาแฟ\"", 1),
        ("\"แ ฟ ก า\"", 0),
        ("ม่", 1),
        ("ม", 1),
    ] {
        assert_eq!(matches(&mut conn, query).await, found, "{query}");
    }
    // Arabic's and Hebrew's vowel points are left out of lexemes, a
    // tatweel alone is no word.
    assert_eq!(
        lexemes(&mut conn, "القَهْوَة القـهوة ـ שָׁלוֹם").await,
        ["القهوة", "القهوة", "שלום"]
    );
    // A table of reading 7 reads as it always did.
    let mut old = table(&READING_3.replace("reading 3", "reading 7")).await;
    assert_eq!(lexemes(&mut old, "ผมไม่ชอบ กาแฟ").await, ["ผมไม่ชอบ", "กาแฟ"]);
    assert_eq!(lexemes(&mut old, "שָׁלוֹם").await, ["שָׁלוֹם"]);
}

#[tokio::test]
async fn reading_9_reads_arabic_words_as_postgres_does() {
    let mut conn = table(&READING_3.replace("reading 3", "reading 9")).await;
    // Each lexeme as `spelling::read` reads it, points left out first,
    // then letters folded.
    let text = "أحمد إلى المدرسة على کتاب خانۀ ٱلْحَمْدُ \u{0627}\u{0654}حمد ؤ \
                وبالمدرسة الالتزام e\u{0301}الكتاب";
    let want = [
        "احمد",
        "الي",
        "مدرسه",
        "علي",
        "كتاب",
        "خانه",
        "حمد",
        "احمد",
        "ؤ",
        "وبالمدرسه",
        "تزام",
        "eكتاب",
    ];
    let read = spelling::read(text);
    let read: Vec<&str> = read.split_whitespace().collect();
    assert_eq!(read.len(), want.len(), "{read:?}");
    assert_eq!(lexemes(&mut conn, text).await, want);
    for (query, found) in [
        ("احمد", 1),
        ("أحمد", 1),
        ("\"الى المدرسه\"", 1),
        ("كتاب", 1),
        ("مدرسة", 1),
        ("بالمدرسة", 1),
        ("التزام", 1),
    ] {
        assert_eq!(matches(&mut conn, query).await, found, "{query}");
    }
    // Thai as reading 8 reads it.
    assert_eq!(lexemes(&mut conn, "กาแฟ").await, ["ก", "า", "แ", "ฟ"]);
    // A table of reading 8 reads as it always did.
    let mut old = table(&READING_3.replace("reading 3", "reading 8")).await;
    assert_eq!(lexemes(&mut old, "أحمد کتاب").await, ["أحمد", "کتاب"]);
}

/// Reading 10 reads text composed: a Korean syllable written as its
/// jamo, a kana and its combining voiced mark, a letter and its
/// accent, a waw and its hamza are the characters they make, in text
/// and in queries; and the Arabic script's digits as ASCII ones, a
/// decimal whole. Reading 9 read them as written.
#[tokio::test]
async fn reading_10_reads_text_composed_with_ascii_digits() {
    use unicode_normalization::UnicodeNormalization;

    let mut conn = table(&READING_3.replace("reading 3", "reading 10")).await;
    let composed = "한국 がっこう café \u{0624} ٣٤ ۱.۵";
    let decomposed: String = composed.nfd().collect();
    assert_ne!(decomposed, composed);
    let want = [
        "한", "국", "が", "っ", "こ", "う", "cafe", "\u{0624}", "34", "1.5",
    ];
    assert_eq!(lexemes(&mut conn, composed).await, want);
    assert_eq!(lexemes(&mut conn, &decomposed).await, want);
    for query in [
        "한국",
        "\"がっこう\"",
        "café",
        "\u{0624}",
        "34",
        "٣٤",
        "\"1.5\"",
        "\"۱.۵\"",
    ] {
        assert_eq!(matches(&mut conn, query).await, 1, "{query}");
        let query: String = query.nfd().collect();
        assert_eq!(matches(&mut conn, &query).await, 1, "{query}");
    }
    let mut old = table(&READING_3.replace("reading 3", "reading 9")).await;
    assert_ne!(lexemes(&mut old, &decomposed).await, want);
}

/// Reading 3 folds each letter of the blocks the API tests hold to
/// Postgres (`letters_fold_as_unaccent_folds_them`) as
/// [`english::lexeme`] does, upper and lower case alike.
#[tokio::test]
async fn reading_3_folds_letters_as_lexeme_does() {
    let mut conn = table(READING_3).await;
    let blocks = [
        '\u{c0}'..='\u{4ff}',
        '\u{1d00}'..='\u{1dbf}',
        '\u{1e00}'..='\u{1eff}',
        '\u{2c60}'..='\u{2c7f}',
        '\u{a720}'..='\u{a7ff}',
        '\u{fb00}'..='\u{fb06}',
        '\u{ff21}'..='\u{ff5a}',
    ];
    let mut differ = Vec::new();
    for c in blocks.into_iter().flatten().filter(|c| c.is_alphabetic()) {
        let word = format!("q{c}q");
        let got = lexemes(&mut conn, &word).await.join(" ");
        if got != english::lexeme(&word) {
            differ.push(format!("{word}: {got} against {}", english::lexeme(&word)));
        }
    }
    assert!(differ.is_empty(), "{} differ: {differ:#?}", differ.len());
}
