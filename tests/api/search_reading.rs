//! Both stores read text as Postgres's parser and `engram_english` read
//! it: markup (tags, entities, script and style bodies) is not indexed,
//! letters fold as `unaccent` folds them, and decimals, versions and
//! signed numbers are one word. The Rust side of that (`search::markup`,
//! `english::folded`, `search::numbers`, used by SQLite's tokenizer) is
//! held to a live Postgres over generated and listed cases, and the
//! stores are asked the same searches.

use engram::search::{cjk, english, markup, numbers, spelling};
use serde_json::json;

use crate::helpers::{Backend, TestServer};
use crate::on_both_stores;
use crate::search::{append, episode, memory_query, names, query, search, set};

/// `count` deterministic (xorshift from `seed`) strings of up to `most`
/// of `pieces` each.
pub(crate) fn generated(pieces: &[&str], most: usize, count: usize, seed: u64) -> Vec<String> {
    let mut state = seed;
    let mut next = move |below: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        usize::try_from(state % below as u64).unwrap_or(0)
    };
    (0..count)
        .map(|_| {
            let n = 1 + next(most);
            (0..n).map(|_| pieces[next(pieces.len())]).collect()
        })
        .collect()
}

/// What markup is made of, for [`markup_is_hidden_as_postgres_hides_it`].
const MARKUP_PIECES: &[&str] = &[
    "<", ">", "/", "</", "/>", "&", ";", "#", "x", "X", "41", "amp", "a", "b", "é", "_", "-", ".",
    ":", "=", "\"", "'", "\\", " ", "\n", "!", "?", "!--", "--", "-->", "script", "style", "div",
    "deploy", "(", "~", "%", "ß",
];

/// `ts_debug`'s tokens of each of `texts` as the indexes read it
/// (`engram_search_text` first): the text's number (from 1), the token's
/// kind and the token, in order.
async fn ts_debug(server: &TestServer, texts: &[String]) -> Vec<(i64, String, String)> {
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&server.db.url)
        .await
        .expect("connect");
    sqlx::query_as(
        "SELECT t.i, d.alias, d.token FROM unnest($1::text[]) WITH ORDINALITY AS t(s, i), \
         LATERAL ts_debug('engram_english', engram_search_text(t.s)) WITH ORDINALITY AS d \
         ORDER BY t.i, d.ordinality",
    )
    .bind(texts)
    .fetch_all(&mut conn)
    .await
    .expect("ts_debug")
}

/// Cases read from Postgres 15's `ts_debug` while writing `markup`, and
/// what a web page holds.
const LISTED: &[&str] = &[
    "<div class=\"x\">deploy</div> after",
    "a<b c>d &#169; x&y; <br/> 1<2 and 3>4 <1> < a>",
    "<a b=\"x>y\">z <a b='x\\'y'>z <a b=(c)>z <a b=x,y>z <a b=!x>z <a é=\"x\">z",
    "<a<b>z </ div>z </_a>z <a/ >z <aé>z <a-1.b:c_d>z <a/b>z </a/>z",
    "<!DOCTYPE html>z <?xml version=\"1.0\"?>z <!a>z <?a>z <!-- a <b> -- c -->z <!---->z <!-->z",
    "&amp;x &#x41;y &#65;y &a1;y &1;y &aé;y &é;y &#12a;y &a b;z &a-b;z &_a;z &a!b;z &&amp;z",
    "<script>var deploy = 1;</script> after <SCRIPT>x</Style> y <scripts>z</scripts>",
    "<style >p {x} <b>y</b></style > z <script/>w <script type=\"a\">never closed &amp; gone",
    "<p>See <a href=\"https://example.com/docs/setup.html\">the setup guide</a>&nbsp;first.</p>",
];

/// What Postgres hides is hidden in Rust, and only that: each letter or
/// digit of each text is in a tag, an entity or a script or style body
/// (`ts_debug`'s `tag`, `entity` and `blank` tokens) exactly when it is in
/// one of `markup::hidden`'s ranges.
#[tokio::test]
async fn markup_is_hidden_as_postgres_hides_it() {
    // A server migrates its database: engram_search_text, engram_english.
    let server = TestServer::spawn(Backend::Postgres).await;
    let mut texts: Vec<String> = LISTED.iter().map(|s| (*s).to_owned()).collect();
    texts.extend(generated(MARKUP_PIECES, 24, 20_000, 0x2545_f491_4f6c_dd1d));
    let rows = ts_debug(&server, &texts).await;

    // For each text, the byte offsets of the letters and digits Postgres
    // hides.
    let mut postgres: Vec<Vec<usize>> = vec![Vec::new(); texts.len()];
    let mut offsets: Vec<usize> = vec![0; texts.len()];
    // A compound (`script-amp`) or a URL comes whole, then again as its
    // parts: the bytes of parts still to come.
    let mut parts = 0;
    for (i, alias, token) in &rows {
        let at = usize::try_from(*i - 1).expect("ordinality");
        if parts > 0 {
            parts -= token.len();
            continue;
        }
        if alias.ends_with("hword") || alias == "url" {
            parts = token.len();
        }
        let hides = matches!(alias.as_str(), "tag" | "entity" | "blank");
        for (offset, c) in token.char_indices() {
            if hides && c.is_alphanumeric() {
                postgres[at].push(offsets[at] + offset);
            }
        }
        offsets[at] += token.len();
    }

    let mut differ = Vec::new();
    let mut cut = 0;
    for (at, text) in texts.iter().enumerate() {
        if offsets[at] != text.len() {
            // Postgres's parser drops the rest of a text that ends inside
            // a quoted attribute after a backslash (`<a b="\`): its quirk,
            // not kept in Rust.
            assert!(offsets[at] < text.len(), "Postgres's tokens spell {text:?}");
            cut += 1;
            continue;
        }
        let hidden = markup::in_text(text);
        let ours: Vec<usize> = text
            .char_indices()
            .filter(|(offset, c)| c.is_alphanumeric() && hidden.iter().any(|r| r.contains(offset)))
            .map(|(offset, _)| offset)
            .collect();
        if ours != postgres[at] {
            differ.push(format!(
                "{text:?}: Rust hides {:?}, Postgres {:?}",
                ours.iter()
                    .map(|&o| &text[o..])
                    .map(|s| s.chars().next())
                    .collect::<Vec<_>>(),
                postgres[at]
                    .iter()
                    .map(|&o| &text[o..])
                    .map(|s| s.chars().next())
                    .collect::<Vec<_>>()
            ));
        }
    }
    crate::search::assert_none_differ(&differ);
    assert!(cut * 100 < texts.len(), "{cut} texts cut short");
}

/// Each text's words as Postgres reads them, at their byte offsets: not
/// the breaks, not a compound's whole (its parts follow), not `..` (a
/// file name to the parser, no word to a query).
async fn words_at(server: &TestServer, texts: &[String]) -> Vec<Vec<(usize, String)>> {
    let rows = ts_debug(server, texts).await;
    let mut postgres: Vec<Vec<(usize, String)>> = vec![Vec::new(); texts.len()];
    let mut offsets = vec![0; texts.len()];
    let mut parts = 0;
    for (i, alias, token) in &rows {
        let at = usize::try_from(*i - 1).expect("ordinality");
        if parts > 0 {
            parts -= token.len();
        } else if alias.ends_with("hword") {
            parts = token.len();
            continue;
        }
        if !matches!(alias.as_str(), "blank" | "tag" | "entity") && token != ".." {
            postgres[at].push((offsets[at], token.to_lowercase()));
        }
        offsets[at] += token.len();
    }
    postgres
}

/// The words (`ts_debug`'s tokens but blanks, lowercased) of each of
/// `texts` as the indexes read it, in order.
async fn words_of(server: &TestServer, texts: &[String]) -> Vec<Vec<String>> {
    let mut words: Vec<Vec<String>> = vec![Vec::new(); texts.len()];
    for (i, alias, token) in ts_debug(server, texts).await {
        if alias != "blank" {
            let at = usize::try_from(i - 1).expect("ordinality");
            words[at].push(token.to_lowercase());
        }
    }
    words
}

/// Each cluster of Thai, Lao, Khmer and Burmese (`cjk::units`: a letter
/// or digit and the marks after it) is one word to Postgres once
/// `engram_search_text` has spaced it apart, as SQLite's `reading 8` and
/// snippets read it: every letter and digit of the four blocks alone,
/// with each mark of its block, and beside other words.
#[tokio::test]
async fn clusters_are_read_as_postgres_reads_them() {
    let starts: Vec<char> = cjk::CLUSTER_BLOCKS
        .iter()
        .flat_map(|r| r.clone())
        .filter(|&c| cjk::is_cluster_start(c))
        .collect();
    let mut texts: Vec<String> = Vec::new();
    for &c in &starts {
        texts.push(format!("{c}"));
        texts.push(format!("x{c}9 {c}{c}"));
        // Thai, Lao, Myanmar, Khmer.
        let script = [
            '\u{0e00}'..='\u{0e7f}',
            '\u{0e80}'..='\u{0eff}',
            '\u{1000}'..='\u{109f}',
            '\u{1780}'..='\u{17ff}',
        ]
        .into_iter()
        .find(|r| r.contains(&c))
        .expect("a script");
        for m in script.filter(|&m| cjk::is_cluster_mark(m)) {
            texts.push(format!("{c}{m}{c}{m}{m}"));
        }
    }
    texts.extend(
        [
            "ผมไม่ชอบกาแฟ",
            "สวัสดีครับ ยินดีที่ได้รู้จัก",
            "ສະບາຍດີ ຂ້ອຍມັກກາເຟ",
            "ខ្ញុំមិនចូលចិត្តកាហ្វេទេ",
            "ကျွန်တော် ကော်ဖီ မကြိုက်ဘူး",
            "deploy ด้วย helm ที่ staging",
        ]
        .map(str::to_owned),
    );
    let server = TestServer::spawn(Backend::Postgres).await;
    let postgres = words_of(&server, &texts).await;
    let mut differ = Vec::new();
    for (text, postgres) in texts.iter().zip(&postgres) {
        // Composed first: `ဥ` and `ီ` make `ဦ`.
        let expected: Vec<String> = cjk::apart(&spelling::composed(text))
            .split_whitespace()
            .map(str::to_lowercase)
            .collect();
        if &expected != postgres {
            differ.push(format!("{text:?}: {expected:?} against {postgres:?}"));
        }
    }
    assert!(texts.len() > 5_000, "{}", texts.len());
    crate::search::assert_none_differ(&differ);
}

/// Arabic's and Hebrew's vowel points (`spelling::POINTS`) are left out
/// by `engram_search_text`, so that Postgres reads each word as
/// `spelling::plain` leaves it: every point after a letter, between two,
/// and alone.
#[tokio::test]
async fn points_are_left_out_as_postgres_reads_them() {
    let texts: Vec<String> = spelling::POINTS
        .iter()
        .flat_map(|r| r.clone())
        .flat_map(|p| [format!("ق{p}ه x{p}"), format!("ש{p}ל {p}"), format!("{p}")])
        .collect();
    assert_read_as_plain(&texts).await;
}

/// The Arabic script's letter variants (`spelling::VARIANTS`) are read by
/// `engram_search_text` as `spelling::plain` reads them: each alone,
/// within a word, beside a point, and with each madda or hamza mark after
/// it; and each of those marks after every letter of the Arabic block.
#[tokio::test]
async fn letter_variants_are_read_as_postgres_reads_them() {
    let seated: Vec<char> = spelling::SEATED.collect();
    let mut texts: Vec<String> = Vec::new();
    for &(from, to) in spelling::VARIANTS {
        texts.push(format!("{from}"));
        texts.push(format!("ب{from}ت x{from}{to} {from}\u{064e}ل"));
        for &m in &seated {
            texts.push(format!("{from}{m}ب {to}{m}\u{0650}{m}ب"));
        }
    }
    let letters = ('\u{0620}'..='\u{06ff}')
        .filter(|&c| c.is_alphabetic() && !spelling::is_point(c) && !spelling::SEATED.contains(&c));
    for c in letters {
        for &m in &seated {
            texts.push(format!("ب{c}{m}ت {c}\u{064b}{m}"));
        }
    }
    assert_read_as_plain(&texts).await;
}

/// Each of the prefixes Arabic writes before a word (`spelling::PREFIXES`)
/// is left off by `engram_search_text` as `spelling::read` leaves it off:
/// at the start of a text and after a space, a Latin letter, a digit, an
/// accent, a point, a letter or a variant; followed by none to four
/// letters; twice, and after each other.
#[tokio::test]
async fn prefixes_are_left_off_as_postgres_leaves_them_off() {
    let befores = [
        "",
        " ",
        "x",
        "3",
        "e\u{0301}",
        "\u{064e}",
        "ب",
        "أ",
        "ـ",
        "\u{0654}",
    ];
    let afters = ["", "ك", "كت", "كتاب", "أحمد", "ةٌ", "\u{0654}بب", "x", "ال"];
    let mut texts: Vec<String> = Vec::new();
    for prefix in spelling::PREFIXES {
        for before in befores {
            for after in afters {
                texts.push(format!("{before}{prefix}{after}"));
                texts.push(format!("{before}{prefix}{prefix}{after} {prefix}"));
            }
        }
        for other in spelling::PREFIXES {
            texts.push(format!(
                "{prefix}{other}كتاب {prefix}{other}ك {prefix}{other}{prefix}كت"
            ));
        }
    }
    assert_read_as_plain(&texts).await;
}

/// Postgres reads each of `texts` (through `engram_search_text`) as the
/// words of `spelling::read`'s reading of it composed, lowercased.
async fn assert_read_as_plain(texts: &[String]) {
    let server = TestServer::spawn(Backend::Postgres).await;
    let postgres = words_of(&server, texts).await;
    let mut differ = Vec::new();
    for (text, postgres) in texts.iter().zip(&postgres) {
        let plain = spelling::read(&spelling::composed(text)).to_lowercase();
        let expected: Vec<&str> = plain.split_whitespace().collect();
        if expected != *postgres {
            differ.push(format!("{text:?}: {expected:?} against {postgres:?}"));
        }
    }
    crate::search::assert_none_differ(&differ);
}

/// What makes text decomposed: Korean jamo, a kana and its voiced mark, a
/// letter and its accents (in either order), a waw or alef and its hamza
/// with a point between, characters NFC reads as others (the ohm and
/// angstrom signs, a Greek dialytika tonos), and their composed forms;
/// and the Arabic script's digits.
const DECOMPOSED_PIECES: &[&str] = &[
    "\u{1112}\u{1161}\u{11ab}",
    "한",
    "\u{1100}",
    "\u{1161}",
    "\u{304b}\u{3099}",
    "が",
    "\u{3099}",
    "e\u{0301}",
    "é",
    "\u{0323}\u{0302}",
    "\u{0302}\u{0323}",
    "\u{0301}",
    "\u{0648}\u{0654}",
    "\u{0627}\u{064e}\u{0654}",
    "ؤ",
    "\u{0654}",
    "\u{2126}",
    "\u{212b}",
    "\u{0344}",
    "a",
    "q",
    " ",
    "/",
    ".",
    "-",
    "1",
    "<b>",
    "ß",
    "ب",
    "ال",
    "٣",
    "۴",
    "٠",
    "۹",
    "٫",
];

/// Since migration 0032 `engram_search_text` composes text first and
/// reads the Arabic script's digits as ASCII ones
/// (`engram_normalized_text`), as `spelling::normalized` does: Postgres's
/// form of each generated text is Rust's, and the text reads as its
/// composed form does. Text below `spelling::COMPOSED_BELOW` skips the
/// composing and the scripts' expressions, and reads as the whole function
/// reads it.
#[tokio::test]
async fn text_is_normalized_before_postgres_reads_it() {
    let server = TestServer::spawn(Backend::Postgres).await;
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&server.db.url)
        .await
        .expect("connect");
    let texts = generated(DECOMPOSED_PIECES, 10, 5_000, 0x9e37_79b9_7f4a_7c15);
    let rows: Vec<(String, bool)> = sqlx::query_as(
        "SELECT engram_normalized_text(t.s), \
                engram_search_text(t.s) = engram_search_text(normalize(t.s, NFC)) \
         FROM unnest($1::text[]) WITH ORDINALITY AS t(s, i) ORDER BY t.i",
    )
    .bind(&texts)
    .fetch_all(&mut conn)
    .await
    .expect("composed");
    let mut differ = Vec::new();
    for (text, (postgres, alike)) in texts.iter().zip(&rows) {
        if *postgres != spelling::normalized(text) || !alike {
            differ.push(format!("{text:?}: {postgres:?}, read alike: {alike}"));
        }
    }
    crate::search::assert_none_differ(&differ);

    // The function's reading of text from `COMPOSED_BELOW` on, as a
    // function of its own, over text below it.
    let migration = include_str!("../../migrations/postgres/0032_search_composed_text.sql");
    let function = &migration[migration
        .find("FUNCTION engram_search_text")
        .expect("the function")..];
    let whole = &function
        [function.find("ELSE ").expect("ELSE") + 5..function.rfind(" END $$;").expect("END")];
    let create = format!(
        "CREATE FUNCTION pg_temp.whole(t text) RETURNS text LANGUAGE sql AS $$ SELECT {whole} $$"
    );
    sqlx::query(sqlx::AssertSqlSafe(create))
        .execute(&mut conn)
        .await
        .expect("create");
    let below = [
        "a", "B", "é", "ß", "ǆ", "\u{2ff}", "/", "./", "<", ">", "</b>", "@", ".", "-", "1", "x",
        " ", "&amp;", "ł", "\u{80}",
    ];
    let texts = generated(&below, 16, 5_000, 0x2545_f491_4f6c_dd1d);
    assert!(
        texts
            .iter()
            .all(|t| t.chars().all(|c| c < spelling::COMPOSED_BELOW))
    );
    let differ: Vec<String> = sqlx::query_scalar(
        "SELECT t FROM unnest($1::text[]) AS t \
         WHERE engram_search_text(t) IS DISTINCT FROM pg_temp.whole(t)",
    )
    .bind(&texts)
    .fetch_all(&mut conn)
    .await
    .expect("alike");
    crate::search::assert_none_differ(&differ);
}

/// A number right beside a tag or an entity is one word to Postgres, as
/// beside a blank (`3.14` in `<td>3.14</td>`, `-5` after `&lt;`), and so
/// beside a `<`, `>`, `&` or `@` that starts neither (`a<3.14`, `1@3.5`):
/// each number [`numbers::in_text`] reads (as SQLite's tokenizer reads
/// them from reading 7 on, and snippets) is Postgres's word at the same
/// place. (No Chinese, Japanese or Korean here: Postgres spaces those
/// characters apart first, which moves the offsets.)
#[tokio::test]
async fn numbers_beside_markup_are_read_as_postgres_reads_them() {
    const PIECES: &[&str] = &[
        "<b>",
        "</b>",
        "<br/>",
        "<td>",
        "</td>",
        "<!-- c -->",
        "&amp;",
        "&#65;",
        "&lt;",
        "&gt;",
        "<",
        ">",
        "&",
        ";",
        "3.14",
        "-5",
        "+2.5",
        "1.2.3",
        "10",
        "7",
        ".",
        "-",
        "+",
        " ",
        "x",
        "@",
        "€",
        "😀",
        "—",
        "“",
        "”",
        "…",
        "\u{a0}",
        "°",
        "s",
        "rc1",
        "é",
        "_",
    ];
    let texts = generated(PIECES, 10, 20_000, 0x2f6b_9a1c_5d3e_8047);
    let server = TestServer::spawn(Backend::Postgres).await;
    let postgres = words_at(&server, &texts).await;
    let mut differ = Vec::new();
    let mut beside = 0;
    for (at, text) in texts.iter().enumerate() {
        let spaced = english::spaced(text);
        let before = numbers::apart(&cjk::blanked(&spaced, cjk::Units::Characters));
        for number in numbers::in_text(&spaced, &markup::in_text(text), cjk::Units::Clusters) {
            let word = (number.start, spaced[number.clone()].to_owned());
            if !postgres[at].contains(&word) {
                differ.push(format!("{text:?}: {:?} against {:?}", word.1, postgres[at]));
            }
            beside += usize::from(!before.contains(&number));
        }
    }
    crate::search::assert_none_differ(&differ);
    assert!(
        beside > 1_000,
        "only {beside} numbers beside markup and marks"
    );
}

/// Postgres keeps whole every number `numbers::whole` reads whole, at the
/// same place, and reads each `numbers::before_letters` reads as a number
/// and the letters after it as the next word; and in text without letters, the words `unicode61` splits
/// with those numbers whole are Postgres's words wherever the split
/// alone was, and are in many texts where it was not (a sign after a
/// digit or beside `@` or `/`, which the parser reads too, is left
/// alone).
#[tokio::test]
async fn numbers_are_read_whole_as_postgres_reads_them() {
    const PIECES: &[&str] = &[
        "0", "1", "5", "9", "10", "e", "x", ".", ".", "-", "+", " ", " ", ",", "@", "/", "_", ":",
        "(", "é",
    ];
    // Numbers before letters, more often. (No `+`: after an `e` it
    // signs the exponent, `5e+10`, which these rules do not read.)
    const BEFORE: &[&str] = &[
        "1.5", "10.0.1", "3", "5", ".", "x", "s", "rc1", "e", "E", "é", " ", " ", "(", "-", "_",
        "/", "@",
    ];
    let mut texts = generated(PIECES, 12, 20_000, 0x9e37_79b9_7f4a_7c15);
    texts.extend(generated(BEFORE, 8, 10_000, 0x2545_f491_4f6c_dd1d));
    texts.extend(
        [
            "pi is 3.14 today",
            "host 10.0.0.1, -5 and +2.5",
            "-1.5.3 1..5 .5 3.14.",
        ]
        .map(str::to_owned),
    );
    let server = TestServer::spawn(Backend::Postgres).await;
    let postgres = words_at(&server, &texts).await;
    let mut differ = Vec::new();
    let (mut kept, mut before, mut mended) = (0, 0, 0);
    for (at, text) in texts.iter().enumerate() {
        let spaced = english::spaced(text);
        let whole = numbers::whole(&spaced);
        kept += whole.len();
        for number in &whole {
            let word = (number.start, spaced[number.clone()].to_owned());
            if !postgres[at].contains(&word) {
                differ.push(format!("{text:?}: {:?} against {:?}", word.1, postgres[at]));
            }
        }
        // A decimal or version before letters is a word there, and the
        // letters after it start the next (which may run on as a file name,
        // `s._`, as a word of letters alone may).
        let leading = numbers::before_letters(&spaced);
        before += leading.len();
        for number in &leading {
            let rest = &spaced[number.end..];
            let letters = rest[..rest
                .find(|c: char| !c.is_alphanumeric())
                .unwrap_or(rest.len())]
                .to_lowercase();
            let word = (number.start, spaced[number.clone()].to_owned());
            let next = postgres[at]
                .iter()
                .any(|(offset, w)| *offset == number.end && w.starts_with(&letters));
            if !postgres[at].contains(&word) || !next {
                differ.push(format!(
                    "{text:?}: {:?}, {letters:?} against {:?}",
                    word.1, postgres[at]
                ));
            }
        }
        if text.chars().any(char::is_alphabetic) {
            continue;
        }
        // `unicode61`'s words, then with the numbers whole.
        let mut split: Vec<(usize, &str)> = Vec::new();
        let mut from = None;
        for (offset, c) in spaced.char_indices().chain([(spaced.len(), ' ')]) {
            match (c.is_ascii_digit(), from) {
                (true, None) => from = Some(offset),
                (false, Some(start)) => {
                    from = None;
                    split.push((start, &spaced[start..offset]));
                }
                _ => {}
            }
        }
        let mut words: Vec<(usize, String)> = Vec::new();
        for (start, word) in &split {
            match whole.iter().find(|r| r.contains(start)) {
                Some(r) if words.last().is_some_and(|w| w.0 == r.start) => {}
                Some(r) => words.push((r.start, spaced[r.clone()].to_owned())),
                None => words.push((*start, (*word).to_owned())),
            }
        }
        let split: Vec<(usize, String)> =
            split.into_iter().map(|(o, w)| (o, w.to_owned())).collect();
        match (split == postgres[at], words == postgres[at]) {
            (true, false) => differ.push(format!("{text:?}: {words:?} against {:?}", postgres[at])),
            (false, true) => mended += 1,
            _ => {}
        }
    }
    crate::search::assert_none_differ(&differ);
    assert!(kept > 1_000, "only {kept} numbers read whole");
    assert!(before > 300, "only {before} numbers before letters");
    assert!(
        mended > 500,
        "only {mended} texts read as Postgres reads them"
    );
}

/// Every letter of the Latin, Greek and Cyrillic blocks, phonetic
/// letters and ligatures (in a word of its own) gets the lexeme
/// Postgres's `engram_english` gives it (`unaccent`, then the stemmer),
/// and SQLite's tokenizer reads it through the same `english::lexeme`.
#[tokio::test]
async fn letters_fold_as_unaccent_folds_them() {
    let server = TestServer::spawn(Backend::Postgres).await;
    let blocks = [
        '\u{c0}'..='\u{24f}',    // Latin-1, Latin Extended-A and -B
        '\u{250}'..='\u{2af}',   // IPA
        '\u{370}'..='\u{4ff}',   // Greek, Cyrillic
        '\u{1d00}'..='\u{1dbf}', // phonetic extensions
        '\u{1e00}'..='\u{1eff}', // Latin Extended Additional
        '\u{2c60}'..='\u{2c7f}', // Latin Extended-C
        '\u{a720}'..='\u{a7ff}', // Latin Extended-D
        '\u{fb00}'..='\u{fb06}', // Latin ligatures
        '\u{ff21}'..='\u{ff5a}', // fullwidth letters
    ];
    // Not `ŉ` (deprecated), which `unaccent` reads as `'n`: the
    // apostrophe stays inside a word and goes at its start.
    let words: Vec<String> = blocks
        .into_iter()
        .flatten()
        .filter(|c| c.is_alphabetic() && *c != 'ŉ')
        .map(|c| format!("q{c}q"))
        .collect();
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&server.db.url)
        .await
        .expect("connect");
    let lexemes: Vec<String> = sqlx::query_scalar(
        "SELECT ARRAY(SELECT array_to_string(tsvector_to_array(to_tsvector('engram_english', t.w)), ' ') \
         FROM unnest($1::text[]) WITH ORDINALITY AS t(w, i) ORDER BY t.i)",
    )
    .bind(&words)
    .fetch_one(&mut conn)
    .await
    .expect("lexemes");
    // Letters newer than the database's Unicode tables (in Latin
    // Extended-D) are no letters to its parser, which reads `q`, a break
    // and `q`; they are left out, and there are few.
    let unknown = lexemes.iter().filter(|l| *l == "q").count();
    assert!(unknown < 16, "{unknown} letters unknown to the database");
    let differ: Vec<String> = words
        .iter()
        .zip(&lexemes)
        .filter(|(_, postgres)| *postgres != "q")
        .filter(|(word, postgres)| english::lexeme(word) != **postgres)
        .map(|(word, postgres)| format!("{word}: {} against {postgres}", english::lexeme(word)))
        .collect();
    crate::search::assert_none_differ(&differ);
}

/// The same searches find the same items on both stores: no markup word
/// is found, the text around and after it is, and folded letters match
/// their ASCII spelling both ways.
async fn markup_and_folded_letters_are_read_alike(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let page = "<html><head><style>body { color: teal }</style></head><body>\
                <p>Read <a href=\"https://example.com/docs/setup.html\">the rollout guide</a>\
                &nbsp;before you deploy.</p><script>track('pageview')</script>\
                <p>Ask Straße support.</p></body></html>";
    server
        .episodes()
        .append_episodes(append(
            "web-1",
            "ana",
            vec![
                episode("page", "tool_result", "browser", json!(page)),
                episode(
                    "note",
                    "note",
                    "agent",
                    json!("Søren wrote the Æsir ﬁle on Łódź"),
                ),
                episode("russian", "note", "agent", json!("новый мой отчёт")),
            ],
        ))
        .await
        .expect("append");
    server
        .memory()
        .set(set(
            "web",
            "notes",
            json!({"html": "<b>Canary</b> releases &amp; flags"}),
        ))
        .await
        .expect("set");

    for word in [
        "html", "div", "href", "example", "docs", "nbsp", "amp", "teal", "pageview", "track", "b",
    ] {
        assert!(
            names(&search(&server, query(word)).await).is_empty(),
            "{backend:?}: {word} is markup"
        );
    }
    for (words, found) in [
        ("rollout guide", vec!["episode:page"]),
        ("deploy", vec!["episode:page"]),
        ("strasse", vec!["episode:page"]),
        ("Straße", vec!["episode:page"]),
        ("soren aesir file lodz", vec!["episode:note"]),
        ("Łódź", vec!["episode:note"]),
        // `ё` folds to `е`; `й` does not fold to `и`, as `unaccent` reads
        // them.
        ("отчет", vec!["episode:russian"]),
        ("новый", vec!["episode:russian"]),
        ("новыи", vec![]),
    ] {
        assert_eq!(
            names(&search(&server, query(words)).await),
            found,
            "{backend:?}: {words}"
        );
    }
    // The snippet is the text a reader sees.
    let hits = search(&server, query("rollout guide")).await;
    assert_eq!(
        hits[0].snippet, "Read the **rollout** **guide** before you deploy. Ask Straße support.",
        "{backend:?}"
    );
    // A word with a letter `unaccent` keeps is marked in the snippet.
    let hits = search(&server, query("новый")).await;
    assert_eq!(hits[0].snippet, "**новый** мой отчёт", "{backend:?}");
    assert_eq!(
        names(&search(&server, memory_query("canary flags")).await),
        vec!["memory:web/notes@1"],
        "{backend:?}"
    );
}

on_both_stores!(markup_and_folded_letters_are_read_alike);
