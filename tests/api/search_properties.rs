//! Property tests for the text Search reads from the network: queries,
//! and the texts whose words the server reads itself (episodes' vectors,
//! snippets). No input panics, words are cut on character boundaries in
//! order, and a snippet shows only the text it was made from.

use engram::error::Reason;
use engram::search::Query;
use engram::search::english::{self, Reading};
use engram::search::snippet::{Case, snippet, word_ranges};
use engram::search::{markup, vector};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// The pieces the readers treat specially (numbers and what joins them,
/// markup and entities, query syntax, CJK, Thai with its marks, combining
/// accents, Turkish `İ`/`ı`, emoji and typographic marks), so that
/// generated text reaches the corners, not only plain letters. No NUL:
/// the stores refuse it before they read anything.
pub(crate) const TRICKY: &[&str] = &[
    "word",
    "Words",
    "the",
    "3",
    "3.14",
    "-5",
    "+",
    "1e",
    "5e+10.0.1",
    ".",
    "..",
    "-",
    "--",
    "/",
    "@",
    "_",
    "user_42",
    "src/auth/validate.ts",
    "v1.2.3",
    "covid-19",
    "<p>",
    "</p>",
    "<a href=\"x\">",
    "<",
    ">",
    "&amp;",
    "&lt;",
    "&#x1F600;",
    "&NotEqualTilde;",
    "&",
    ";",
    "\"",
    "\"quoted",
    "-excluded",
    "第",
    "3.5",
    "章",
    "深色",
    "モデル",
    "한국어",
    "ผม",
    "ไม่",
    "\u{0301}",
    "e\u{0301}",
    "İ",
    "ı",
    "INVOICE",
    "Σ",
    "ß",
    "ﬁ",
    "😀",
    "—",
    "“",
    "\u{200b}",
    " ",
    " ",
    "\n",
    "\t",
];

/// Text made of [`TRICKY`]'s pieces and NUL, or of any characters.
fn tricky_text() -> impl Strategy<Value = String> {
    let mut pieces = TRICKY.to_vec();
    pieces.push("\u{0}");
    let pieces = prop::sample::select(pieces);
    prop_oneof![
        prop::collection::vec(pieces, 0..40).prop_map(|parts| parts.concat()),
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn queries_parse_or_say_why(text in tricky_text()) {
        match Query::parse("query", &text) {
            Ok(query) => {
                prop_assert!(
                    !query.words.is_empty() || !query.phrases.is_empty(),
                    "a query with nothing to look for: {query:?} from {text:?}"
                );
                let _ = query.excludes(&text);
            }
            Err(err) => {
                prop_assert_eq!(err.reason(), Reason::InvalidQuery, "{} for {:?}", err, text);
                prop_assert!(err.to_string().contains("query"), "{err}");
            }
        }
    }

    #[test]
    fn words_are_cut_on_character_boundaries_in_order(text in tricky_text()) {
        let mut end = 0;
        for range in word_ranges(&text) {
            prop_assert!(range.start >= end && range.start < range.end, "{range:?} in {text:?}");
            prop_assert!(
                text.is_char_boundary(range.start) && text.is_char_boundary(range.end),
                "{range:?} in {text:?}"
            );
            end = range.end;
        }
        prop_assert!(end <= text.len());
    }

    #[test]
    fn snippets_show_only_their_text(text in tricky_text(), pick in any::<prop::sample::Index>()) {
        // The lexemes of some of the text's own words, so that words are
        // marked, and one the text cannot hold.
        let ranges = word_ranges(&text);
        let mut terms = vec!["zzzabsent".to_owned()];
        let mut runs = Vec::new();
        if !ranges.is_empty() {
            let at = pick.index(ranges.len());
            let range = &ranges[at];
            terms.push(english::lexeme(&text[range.clone()]));
            terms.push(english::turkic_lexeme(&text[range.clone()]));
            // And the run of clusters from there on, when it is one.
            let run: Vec<String> = ranges[at..]
                .iter()
                .map(|r| text[r.clone()].to_owned())
                .take_while(|w| engram::search::cjk::is_cluster(w))
                .take(3)
                .collect();
            if !run.is_empty() {
                runs.push(run);
            }
        }
        for case in [Case::Unicode, Case::Turkic] {
            let shown = snippet(&text, &terms, &runs, case);
            if !text.contains('*') && !text.contains('…') {
                // Snippets show the text composed, as it is read.
                let composed = engram::search::spelling::composed(&text);
                for fragment in shown.split(" … ") {
                    let unmarked = fragment.replace("**", "");
                    prop_assert!(
                        composed.contains(&unmarked),
                        "{fragment:?} is not of {text:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn texts_are_read_or_left_to_postgres(text in tricky_text()) {
        let _ = markup::visible(&text);
        let _ = english::spaced(&text);
        for reading in [
            Reading::Ascii,
            Reading::Punctuation,
            Reading::Symbols,
            Reading::Letters,
            Reading::Arabic,
        ] {
            if let Some(words) = english::plain(&text, reading) {
                let _ = english::distinct(&words);
                let _ = english::phrase(&words);
            }
            let content = json!({"text": text, "n": 3.5});
            let mut metadata = Map::new();
            metadata.insert("note".to_owned(), Value::String(text.clone()));
            let _ = vector::episode(&content, &metadata, reading);
            let _ = vector::memory("notes/a", &content, reading);
        }
    }
}
