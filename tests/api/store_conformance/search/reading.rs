//! How each store reads text, case by case on both: compounds, diacritics,
//! word forms, stop words, scripts written with and without spaces,
//! Arabic's spellings, Unicode's forms, numbers and strings. What one store
//! finds for a query, and marks in its snippet, the other must too.

use engram::context::Tenant;
use engram::ports::Store;
use engram::search::{Filters, Query, Source};
use serde_json::json;
use unicode_normalization::UnicodeNormalization;

use super::super::consolidation::{insert, payload};
use super::super::fixtures::{episode, id, log};
use super::super::writer;
use super::{described, found, found_everywhere};
use crate::helpers::TestDb;

/// Each query of `cases` finds `item` alone in `source` of tenant t1, with
/// the given words marked in its snippet.
async fn found_and_marked<S: Store>(store: &S, source: Source, item: &str, cases: &[(&str, &str)]) {
    for (query, marked) in cases {
        let hits = found(store, "t1", source, query, &Filters::default()).await;
        assert_eq!(described(&hits), [item], "{source:?} {query}");
        assert!(
            hits[0].snippet.contains(marked),
            "{source:?} {query}: {}",
            hits[0].snippet
        );
    }
}

/// Writes `text` to tenant t1 as episode `e1` of alice's session s1 and as
/// the value of `key`, and a fact of `ops@example.com` liking `object`.
pub(super) async fn write_everywhere<S: Store>(store: &S, text: &str, key: &str, object: &str) {
    let l = log(store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    l.append("s1", &[episode(&s1, Some("e1"), None, None, json!(text))])
        .await;
    writer(store, "t1").set(key, json!({"text": text})).await;
    insert(
        store,
        &Tenant::new("t1"),
        &payload("ops@example.com", object),
        &[],
    )
    .await;
}

/// A file name, a host and an email are found by each of their parts and
/// whole, in memory, facts and episodes alike, and the snippet marks the
/// part found.
async fn compounds_are_found_by_their_parts<S: Store>(store: S, _db: &TestDb) {
    let any = Filters::default();
    let text = "fixed src/auth/validate.ts, README.md and config1.yaml; \
                mail ops-team@example.com about build 3.14 and covid-19";
    write_everywhere(&store, text, "notes/deploy.md", "validate.ts").await;
    let expected = [
        (Source::Episodes, "e1"),
        (Source::Memory, "notes/deploy.md@1"),
        (Source::Facts, "ops@example.com"),
    ];
    for (source, item) in expected {
        let cases = [
            ("validate", "**validate**"),
            ("ts", "**ts**"),
            ("validate.ts", "**validate.ts**"),
            ("example", "**example**"),
            ("example.com", "**example.com**"),
        ];
        found_and_marked(&store, source, item, &cases).await;
    }
    for (source, item) in &expected[..2] {
        for query in [
            "readme",
            "README.md",
            "yaml",
            "config1",
            "ops-team",
            "\"3.14\"",
            "19",
            "covid-19",
        ] {
            let hits = found(&store, "t1", *source, query, &any).await;
            assert_eq!(described(&hits), [*item], "{source:?} {query}");
        }
    }
    // The memory key's own parts.
    let hits = found(&store, "t1", Source::Memory, "deploy", &any).await;
    assert_eq!(described(&hits), ["notes/deploy.md@1"]);

    // A compound asked for is its parts side by side, not any of them.
    let s1 = id("s1");
    log(&store, "t1")
        .append(
            "s1",
            &[
                episode(&s1, Some("e2"), None, None, json!("user_42 logged in")),
                episode(&s1, Some("e3"), None, None, json!("a user with 42 keys")),
                episode(&s1, Some("e4"), None, None, json!("the ts of validate")),
            ],
        )
        .await;
    for (query, want) in [
        ("user_42", vec!["e2"]),
        ("user", vec!["e2", "e3"]),
        ("validate.ts", vec!["e1"]),
        ("validate.ts user_42", vec!["e1", "e2"]),
    ] {
        let mut hits = described(&found(&store, "t1", Source::Episodes, query, &any).await);
        hits.sort();
        assert_eq!(hits, want, "{query}");
    }
}

/// Letters with diacritics are found without them and with them (`café`
/// by `cafe`, `naive` by `naïve`), in memory, facts and episodes alike.
async fn diacritics_are_read_without_them<S: Store>(store: S, _db: &TestDb) {
    let any = Filters::default();
    write_everywhere(
        &store,
        "the café menu and naïve Bayes",
        "menu",
        "crème brûlée",
    )
    .await;
    for (source, item) in [(Source::Episodes, "e1"), (Source::Memory, "menu@1")] {
        let cases = [
            ("cafe", "**café**"),
            ("café", "**café**"),
            ("CAFÉ", "**café**"),
            ("naive", "**naïve**"),
            ("naïve", "**naïve**"),
        ];
        found_and_marked(&store, source, item, &cases).await;
    }
    for query in ["creme", "brûlée", "brulee"] {
        let hits = found(&store, "t1", Source::Facts, query, &any).await;
        assert_eq!(described(&hits), ["ops@example.com"], "{query}");
    }
}

/// Words are stemmed alike on both stores (Snowball's English stemmer,
/// as Postgres's `english` configuration): a word's other forms find it
/// and are marked, in memory, facts and episodes. FTS5's Porter stemmer,
/// which SQLite used before migration 0014, read `deploy` as `deploi` and
/// `deployment` as `deploy`, and `https` as `http`.
async fn word_forms_are_stemmed_as_postgres_stems_them<S: Store>(store: S, _db: &TestDb) {
    let any = Filters::default();
    write_everywhere(
        &store,
        "we deploy with Argo over https on Fridays",
        "setup",
        "deploy",
    )
    .await;
    for (source, item) in [
        (Source::Episodes, "e1"),
        (Source::Memory, "setup@1"),
        (Source::Facts, "ops@example.com"),
    ] {
        let cases = [
            ("deployment", "**deploy**"),
            ("deployments", "**deploy**"),
            ("deploying", "**deploy**"),
            ("deployed", "**deploy**"),
        ];
        found_and_marked(&store, source, item, &cases).await;
    }
    for (source, item) in [(Source::Episodes, "e1"), (Source::Memory, "setup@1")] {
        found_and_marked(&store, source, item, &[("friday", "**Fridays**")]).await;
        let hits = found(&store, "t1", source, "http", &any).await;
        assert!(hits.is_empty(), "{source:?}: http is not https");
    }
}

/// A query of stop words alone looks for nothing and finds nothing, and
/// a quoted phrase or an exclusion of stop words alone changes nothing,
/// on both stores (Postgres drops stop words from a query; FTS5 indexes
/// them, so SQLite once found every item holding "the").
async fn stop_words_alone_find_nothing<S: Store>(store: S, _db: &TestDb) {
    let any = Filters::default();
    write_everywhere(&store, "We deploy with Argo on Fridays", "setup", "deploy").await;
    for source in [Source::Episodes, Source::Memory, Source::Facts] {
        for query in ["we", "the with", "don't", "\"with the\"", "it's -on"] {
            let hits = found(&store, "t1", source, query, &any).await;
            assert!(
                hits.is_empty(),
                "{source:?} {query}: {:?}",
                described(&hits)
            );
        }
    }
    for query in ["deploy \"the\"", "deploy -with", "deploy -we"] {
        let hits = found(&store, "t1", Source::Episodes, query, &any).await;
        assert_eq!(described(&hits), ["e1"], "{query}");
    }
}

/// A session `session` of tenant `t1` holding an episode of each of
/// `said` (its id and its text); the filters that keep to it.
async fn said_in<S: Store>(store: &S, session: &str, said: &[(&str, &str)]) -> Filters {
    let l = log(store, "t1");
    let session_id = id(session);
    l.create(session, "app", "alice", 0).await;
    let episodes: Vec<_> = said
        .iter()
        .map(|(e, text)| episode(&session_id, Some(e), None, None, json!(text)))
        .collect();
    l.append(session, &episodes).await;
    Filters {
        session_id: Some(session_id),
        ..Filters::default()
    }
}

/// The episodes of tenant `t1` that `query` finds within `filters`: their
/// ids and their snippets, best first.
async fn episodes_found<S: Store>(
    store: &S,
    filters: &Filters,
    query: &str,
) -> (Vec<String>, Vec<String>) {
    let hits = found(store, "t1", Source::Episodes, query, filters).await;
    let snippets: Vec<String> = hits.iter().map(|h| h.snippet.clone()).collect();
    (described(&hits), snippets)
}

/// Chinese, Japanese and Korean characters are words of their own on both
/// stores, and a query word of them looks for its pairs of neighbouring
/// characters: `東京` finds "東京での会議は明日です" in memory, facts and
/// episodes (Postgres's parser, and SQLite's tokenizer before its reading
/// 5, read the run as one word, found only whole). The run itself ranks
/// above its characters scattered; a quoted run needs them side by side;
/// snippets mark the characters found. Thai, also written without
/// spaces, is still a word per run (the README says so).
async fn cjk_text_is_found_by_its_words<S: Store>(store: S, _db: &TestDb) {
    let text = "Café in Zürich. 東京での会議は明日です。";
    write_everywhere(&store, text, "notes/trip", "東京出張").await;
    let everywhere = ["e1", "notes/trip@1", "ops@example.com"];
    for query in ["東京", "東京での会議は明日です", "東京 zurich"] {
        assert_eq!(found_everywhere(&store, query).await, everywhere, "{query}");
    }
    for query in ["会議", "明日", "\"会議は明日\"", "は明"] {
        assert_eq!(
            found_everywhere(&store, query).await,
            ["e1", "notes/trip@1"],
            "{query}"
        );
    }
    for query in ["京都", "\"明日は会議\"", "日東"] {
        assert_eq!(
            found_everywhere(&store, query).await,
            Vec::<String>::new(),
            "{query}"
        );
    }

    let said = [
        ("dark", "深色模式已开启。"),
        ("scattered", "深夜里，颜色和模式都变了。"),
        ("light", "我喜欢浅色"),
        ("japanese", "GPT模型をデプロイする"),
        ("korean", "한국어 검색 기능"),
        ("thai", "สวัสดีครับ"),
        ("decimal", "第3.5章を読んだ"),
        ("thai-tone", "ผมไม่ชอบกาแฟ"),
    ];
    let s2_only = said_in(&store, "s2", &said).await;
    let search = async |query: &str| episodes_found(&store, &s2_only, query).await;
    let (hits, snippets) = search("深色模式").await;
    assert_eq!(hits, ["dark", "scattered"], "{snippets:?}");
    assert_eq!(snippets[0], "**深色模式**已开启。");
    assert_eq!(snippets[1], "深夜里，颜色和**模式**都变了。");
    assert_eq!(search("深色").await.0, ["dark"]);
    assert_eq!(search("\"色模\"").await.0, ["dark"]);
    assert_eq!(search("模式 -深色").await.0, ["scattered"]);
    assert_eq!(search("色").await.0.len(), 3);
    let (hits, snippets) = search("デプロイ").await;
    assert_eq!(hits, ["japanese"]);
    assert_eq!(snippets, ["GPT模型を**デプロイ**する"]);
    assert_eq!(search("gpt 模型").await.0, ["japanese"]);
    assert_eq!(search("국어").await.0, ["korean"]);
    assert_eq!(search("검색").await.1, ["한국어 **검색** 기능"]);
    assert_eq!(search("สวัสดีครับ").await.0, ["thai"]);
    // A tone mark (a combining mark, not a letter) is part of its
    // cluster, in the index and in the snippet: Postgres's snippet had cut
    // the run there and marked nothing.
    let (hits, snippets) = search("ผมไม่ชอบกาแฟ").await;
    assert_eq!(hits, ["thai-tone"]);
    assert_eq!(snippets, ["**ผมไม่ชอบกาแฟ**"]);
    // A number beside such characters is one word, as between spaces:
    // `3.5`, not `3` and `5` (SQLite's reading 5 split it, and neither
    // `3.5` nor the quoted run found it there).
    for query in ["3.5", "\"第3.5章\"", "第3.5章"] {
        assert_eq!(search(query).await.0, ["decimal"], "{query}");
    }
    assert_eq!(search("3.5").await.1, ["第**3.5**章を読んだ"]);
    assert_eq!(search("5").await.0, Vec::<String>::new());
}

/// Thai, Lao, Khmer and Burmese, written without spaces between words,
/// are found by any part of a run: each cluster (a letter and its marks)
/// is a word, and a query's run must stand whole, its clusters side by
/// side and in order. Until Postgres's 0030 and SQLite's 0021 a run was
/// one word, found only whole.
async fn cluster_scripts_are_found_by_their_words<S: Store>(store: S, _db: &TestDb) {
    let said = [
        ("coffee", "ผมไม่ชอบกาแฟ"),
        ("hello", "สวัสดีครับ ยินดีที่ได้รู้จัก"),
        ("price", "ราคา3.14บาท"),
        ("lao", "ສະບາຍດີ ຂ້ອຍມັກກາເຟ"),
        ("khmer", "ខ្ញុំមិនចូលចិត្តកាហ្វេទេ"),
        ("burmese", "ကျွန်တော် ကော်ဖီ မကြိုက်ဘူး"),
        ("mixed", "deploy ด้วย helm ที่ staging"),
    ];
    let s3_only = said_in(&store, "s3", &said).await;
    let search = async |query: &str| episodes_found(&store, &s3_only, query).await;
    let (hits, snippets) = search("กาแฟ").await;
    assert_eq!(hits, ["coffee"]);
    assert_eq!(snippets, ["ผมไม่ชอบ**กาแฟ**"]);
    assert_eq!(search("ไม่ชอบ").await.0, ["coffee"]);
    assert_eq!(search("สวัสดี").await.1, ["**สวัสดี**ครับ ยินดีที่ได้รู้จัก"]);
    assert_eq!(search("\"ยินดีที่ได้\"").await.0, ["hello"]);
    // Any of the words may match; the run must stand whole and in order.
    assert_eq!(search("กาแฟ สวัสดี").await.0.len(), 2);
    for query in ["แฟกา", "ไม่ชอบกาแฟครับ", "กาแฟ -ชอบ"]
    {
        assert_eq!(search(query).await.0, Vec::<String>::new(), "{query}");
    }
    // A tone mark is part of its cluster: without it, it is another one.
    assert_eq!(search("ไมชอบ").await.0, Vec::<String>::new());
    // A number beside clusters is one word, as between spaces.
    for query in ["3.14", "ราคา", "บาท", "\"ราคา3.14บาท\""] {
        assert_eq!(search(query).await.0, ["price"], "{query}");
    }
    assert_eq!(search("3.14").await.1, ["ราคา**3.14**บาท"]);
    assert_eq!(search("14").await.0, Vec::<String>::new());
    assert_eq!(search("ກາເຟ").await.0, ["lao"]);
    assert_eq!(search("កាហ្វេ").await.0, ["khmer"]);
    assert_eq!(search("ကော်ဖီ").await.0, ["burmese"]);
    assert_eq!(search("ကြိုက်").await.1, ["ကျွန်တော် ကော်ဖီ မ**ကြိုက်**ဘူး"]);
    let (hits, snippets) = search("helm ด้วย").await;
    assert_eq!(hits, ["mixed"]);
    assert_eq!(snippets, ["deploy **ด้วย** **helm** ที่ staging"]);
}

/// Scripts written with spaces between words are found by each word on
/// both stores, their marks and accents part of it: Devanagari, Arabic,
/// Hebrew, Greek, Cyrillic, Armenian, Georgian, Tamil, Bengali, Amharic,
/// and Vietnamese, whose accents fold away as French's do.
async fn spaced_scripts_are_found_by_each_word<S: Store>(store: S, _db: &TestDb) {
    let said = [
        ("hindi", "मुझे कॉफ़ी पसंद नहीं है"),
        ("arabic", "لا أحب القهوة كثيرا"),
        ("hebrew", "אני לא אוהב קפה"),
        ("greek", "Δεν μου αρέσει ο καφές"),
        ("russian", "Я не люблю кофе"),
        ("armenian", "Ես չեմ սիրում սուրճ"),
        ("georgian", "მე არ მიყვარს ყავა"),
        ("tamil", "எனக்கு காபி பிடிக்காது"),
        ("bengali", "আমি কফি পছন্দ করি না"),
        ("amharic", "ቡና አልወድም"),
        ("vietnamese", "Tôi không thích cà phê sữa"),
    ];
    let only = said_in(&store, "s4", &said).await;
    for (query, want, snippet) in [
        ("कॉफ़ी", "hindi", "मुझे **कॉफ़ी** पसंद नहीं है"),
        ("القهوة", "arabic", "لا أحب **القهوة** كثيرا"),
        ("קפה", "hebrew", "אני לא אוהב **קפה**"),
        ("καφές", "greek", "Δεν μου αρέσει ο **καφές**"),
        ("кофе", "russian", "Я не люблю **кофе**"),
        ("սուրճ", "armenian", "Ես չեմ սիրում **սուրճ**"),
        ("ყავა", "georgian", "მე არ მიყვარს **ყავა**"),
        ("காபி", "tamil", "எனக்கு **காபி** பிடிக்காது"),
        ("কফি", "bengali", "আমি **কফি** পছন্দ করি না"),
        ("ቡና", "amharic", "**ቡና** አልወድም"),
        // Vietnamese is found without its accents, as French is.
        (
            "\"ca phe\" sua",
            "vietnamese",
            "Tôi không thích **cà** **phê** **sữa**",
        ),
    ] {
        let (hits, snippets) = episodes_found(&store, &only, query).await;
        assert_eq!(hits, [want], "{query}");
        assert_eq!(snippets, [snippet], "{query}");
    }
}

/// Arabic's and Hebrew's vowel points (and the tatweel) are read as if
/// not written, on both stores: a vocalised word and the bare one find
/// each other, and the snippet marks the word as the item wrote it.
async fn vowel_points_are_read_as_if_not_written<S: Store>(store: S, _db: &TestDb) {
    let said = [
        ("vocalised", "أُحِبُّ القَهْوَةَ كَثِيرًا"),
        ("bare", "أحب القهوة كثيرا"),
        ("stretched", "القـــهوة"),
        ("niqqud", "שָׁלוֹם עֲלֵיכֶם"),
        ("plain-hebrew", "שלום לכולם"),
    ];
    let only = said_in(&store, "s5", &said).await;
    let (hits, snippets) = episodes_found(&store, &only, "القهوة").await;
    assert_eq!(hits.len(), 3, "{hits:?}");
    assert!(
        snippets.contains(&"أُحِبُّ **القَهْوَةَ** كَثِيرًا".to_owned()),
        "{snippets:?}"
    );
    assert!(
        snippets.contains(&"**القـــهوة**".to_owned()),
        "{snippets:?}"
    );
    assert_eq!(episodes_found(&store, &only, "القَهْوَةَ").await.0.len(), 3);
    assert_eq!(
        episodes_found(&store, &only, "\"أحب القهوة\"")
            .await
            .0
            .len(),
        2
    );
    let (hits, snippets) = episodes_found(&store, &only, "שלום").await;
    assert_eq!(hits.len(), 2, "{hits:?}");
    assert!(
        snippets.contains(&"**שָׁלוֹם** עֲלֵיכֶם".to_owned()),
        "{snippets:?}"
    );
    assert_eq!(episodes_found(&store, &only, "עֲלֵיכֶם").await.0, ["niqqud"]);
}

/// The Arabic script's letters written more than one way find each
/// other: an alef with or without its hamza or madda, a teh marbuta
/// written as a heh, an alef maksura as a yeh, the Persian and Urdu yeh,
/// kaf and heh as the Arabic ones; snippets mark the word as written. The
/// Urdu yeh barree stays a letter of its own. A word is found with or
/// without the article and what is written before it.
async fn arabic_words_are_read_alike<S: Store>(store: S, _db: &TestDb) {
    let said = [
        ("hamza", "ذهب أحمد إلى المدرسة"),
        ("bare", "ذهب احمد الى المدرسه"),
        ("persian", "این کتاب خوبی است"),
        ("arabic-letters", "هذا كتاب جيد"),
        ("urdu", "یہ کتاب ہے"),
        ("urdu-hi", "یہ کتاب ہی"),
        ("commitment", "نحن ملتزمون بالالتزام الكامل"),
        ("school", "مدرسة جديدة"),
    ];
    let only = said_in(&store, "s6", &said).await;
    for query in ["أحمد", "احمد", "\"إلى المدرسة\"", "\"الى المدرسه\""]
    {
        let (mut hits, _) = episodes_found(&store, &only, query).await;
        hits.sort();
        assert_eq!(hits, ["bare", "hamza"], "{query}");
    }
    for query in ["المدرسه", "مدرسة", "بالمدرسة"] {
        let (mut hits, snippets) = episodes_found(&store, &only, query).await;
        assert!(
            snippets.contains(&"ذهب أحمد إلى **المدرسة**".to_owned()),
            "{snippets:?}"
        );
        hits.sort();
        assert_eq!(hits, ["bare", "hamza", "school"], "{query}");
    }
    let (hits, snippets) = episodes_found(&store, &only, "التزام").await;
    assert_eq!(hits, ["commitment"]);
    assert_eq!(snippets, ["نحن ملتزمون **بالالتزام** الكامل"]);
    let (mut hits, _) = episodes_found(&store, &only, "كتاب").await;
    hits.sort();
    assert_eq!(hits, ["arabic-letters", "persian", "urdu", "urdu-hi"]);
    assert_eq!(episodes_found(&store, &only, "ہے").await.0, ["urdu"]);
    assert_eq!(
        episodes_found(&store, &only, "\"یه کتاب\"").await.0.len(),
        2
    );
}

/// Text in Unicode's decomposed form (a Korean syllable as its jamo, as
/// macOS writes file names; a kana and its combining voiced mark; a
/// letter and its accent; a waw and its hamza) reads as its composed form
/// in memory, facts and episodes: a query in either form finds text in
/// either, and snippets show the text composed.
async fn decomposed_text_reads_as_composed<S: Store>(store: S, _db: &TestDb) {
    let nfd = |text: &str| -> String { text.nfd().collect() };
    let text = "한국어 문서 がっこう Café رؤية";
    let decomposed = nfd(text);
    assert_ne!(decomposed, text);
    write_everywhere(&store, &decomposed, "notes/nfd", &decomposed).await;
    let everywhere = ["e1", "notes/nfd@1", "ops@example.com"];
    for query in ["한국어", "문서", "\"がっこう\"", "café", "رؤية", text] {
        assert_eq!(found_everywhere(&store, query).await, everywhere, "{query}");
        let query = nfd(query);
        assert_eq!(
            found_everywhere(&store, &query).await,
            everywhere,
            "{query}"
        );
    }
    let meeting = "회의는 내일입니다";
    let said = [("composed", meeting), ("decomposed", &nfd(meeting))];
    let only = said_in(&store, "s7", &said).await;
    for query in ["내일", &nfd("내일")] {
        let (mut hits, snippets) = episodes_found(&store, &only, query).await;
        hits.sort();
        assert_eq!(hits, ["composed", "decomposed"], "{query}");
        assert_eq!(snippets[0], snippets[1]);
        assert!(snippets[0].contains("**"), "{snippets:?}");
        assert_eq!(snippets[0].replace("**", ""), meeting);
    }
}

/// The Arabic script's digits, Arabic-Indic and the extended ones Persian
/// and Urdu write, read as ASCII digits: `٣٤` and `۳۴` find `34`, and
/// `34` finds them; a decimal is whole; snippets mark the digits as
/// written.
async fn arabic_digits_read_as_ascii<S: Store>(store: S, _db: &TestDb) {
    let said = [
        ("arabic", "الصفحة ٣٤ من الكتاب"),
        ("persian", "صفحه ۳۴ کتاب"),
        ("ascii", "page 34 of the book"),
        ("decimal", "السعر ٣.١٤ دينار"),
        ("other", "page 35"),
    ];
    let only = said_in(&store, "s8", &said).await;
    for query in ["34", "٣٤", "۳۴"] {
        let (mut hits, _) = episodes_found(&store, &only, query).await;
        hits.sort();
        assert_eq!(hits, ["arabic", "ascii", "persian"], "{query}");
    }
    for query in ["3.14", "٣.١٤", "\"السعر 3.14\""] {
        let (hits, snippets) = episodes_found(&store, &only, query).await;
        assert_eq!(hits, ["decimal"], "{query}");
        // The decimal is marked whole, as written.
        assert!(snippets[0].contains("**٣.١٤**"), "{query}: {snippets:?}");
    }
    let (mut hits, _) = episodes_found(&store, &only, "\"صفحة 34\"").await;
    hits.sort();
    assert_eq!(hits, ["arabic", "persian"]);
    let (hits, snippets) = episodes_found(&store, &only, "۳۴ کتاب").await;
    let persian = hits.iter().position(|h| h == "persian").expect("found");
    assert_eq!(snippets[persian], "صفحه **۳۴** **کتاب**");
}

/// The stop words a query word or phrase starts or ends with are dropped
/// from it, as Postgres drops them: "Lucia's" finds Lucia written without
/// her `'s`, and "the staging cluster" finds "a staging cluster". On
/// SQLite, which indexes every word, "Lucia's" looked for `lucia` followed
/// by `s`, and "Where is Lucia's wedding?" found nothing.
async fn stop_words_at_the_ends_of_a_phrase_are_dropped<S: Store>(store: S, _db: &TestDb) {
    let any = Filters::default();
    said(
        &store,
        &[
            ("lucia", "My cousin Lucia is getting married in Seville."),
            ("cluster", "a staging cluster went down at noon"),
            ("pepper", "Jon's cat is called Pepper."),
        ],
    )
    .await;
    for (query, want) in [
        ("Where is Lucia's wedding?", &["lucia"][..]),
        ("Lucia's", &["lucia"]),
        ("\"the staging cluster\"", &["cluster"]),
        ("\"a staging cluster, was it?\"", &["cluster"]),
        ("Jon's", &["pepper"]),
        ("Jon", &["pepper"]),
        ("pepper -Jon's", &[]),
    ] {
        let hits = found(&store, "t1", Source::Episodes, query, &any).await;
        assert_eq!(described(&hits), want, "{query}");
    }
}

/// Appends each text as an episode of alice's session s1 of tenant t1,
/// under its name.
pub(super) async fn said<S: Store>(store: &S, episodes: &[(&str, &str)]) {
    let l = log(store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    let episodes: Vec<_> = episodes
        .iter()
        .map(|(name, text)| episode(&s1, Some(name), None, None, json!(text)))
        .collect();
    l.append("s1", &episodes).await;
}

/// A hyphenated query word looks for its parts side by side: it finds the
/// compound and the words written apart, not the words in another order,
/// and excludes both alike.
async fn hyphenated_words_find_their_parts_written_apart<S: Store>(store: S, _db: &TestDb) {
    said(
        &store,
        &[
            ("joined", "a state-of-the-art parser"),
            ("apart", "the state of the art in parsing"),
            ("shuffled", "the art of the state"),
        ],
    )
    .await;
    let any = Filters::default();
    for query in [
        "state-of-the-art",
        "\"state-of-the-art\"",
        "\"state of the art\"",
    ] {
        let mut hits = described(&found(&store, "t1", Source::Episodes, query, &any).await);
        hits.sort();
        assert_eq!(hits, ["apart", "joined"], "{query}");
    }
    let rest = found(
        &store,
        "t1",
        Source::Episodes,
        "art -state-of-the-art",
        &any,
    )
    .await;
    assert_eq!(described(&rest), ["shuffled"]);
}

/// Each string of a JSON value is read alone, as Postgres's
/// `jsonb_to_tsvector` reads it: a `<script>` left open at the end of one
/// string hides nothing of the next, a tag begun in one string and ended
/// in the next is no tag, and a phrase does not run from one string into
/// the next. A key and its value are read as one text, so a phrase runs
/// from the key into the value. Snippets read each string alone too.
async fn each_string_is_read_alone<S: Store>(store: S, _db: &TestDb) {
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    let said = |name: &'static str, content: serde_json::Value| {
        episode(&s1, Some(name), None, None, content)
    };
    l.append(
        "s1",
        &[
            said(
                "cut",
                json!({"a": "<script>var x = 1;", "b": "canary rollout"}),
            ),
            said("split", json!({"a": "<b", "b": "kestrel=x> zebra"})),
            said("apart", json!({"a": "deploy", "b": "notes"})),
            said("together", json!({"a": "deploy notes"})),
        ],
    )
    .await;
    writer(&store, "t1")
        .set("deploy", json!({"text": "notes of the week"}))
        .await;
    let any = Filters::default();
    let episodes = |query: &'static str| {
        let store = &store;
        let any = &any;
        async move {
            let mut hits = described(&found(store, "t1", Source::Episodes, query, any).await);
            hits.sort();
            hits
        }
    };
    assert_eq!(episodes("canary").await, ["cut"]);
    // The snippet shows the string after the one cut short.
    let cut = found(&store, "t1", Source::Episodes, "canary", &any).await;
    assert_eq!(cut[0].snippet, "**canary** rollout");
    assert_eq!(episodes("kestrel").await, ["split"]);
    assert_eq!(episodes("zebra").await, ["split"]);
    assert_eq!(episodes("\"deploy notes\"").await, ["together"]);
    let mut both = episodes("deploy notes").await;
    both.sort();
    assert_eq!(both, ["apart", "together"]);
    let memory = found(&store, "t1", Source::Memory, "\"deploy notes\"", &any).await;
    assert_eq!(described(&memory), ["deploy@1"]);
}

/// A decimal, a version and a signed number are each one word, as
/// Postgres's parser reads them: `14` does not find `3.14`, a version is
/// found whole, not by the version it starts with, one right before
/// letters is a word apart from them (`3.21s`), and the snippet marks the
/// number whole.
async fn numbers_are_read_whole<S: Store>(store: S, _db: &TestDb) {
    said(
        &store,
        &[
            ("pi", "pi is 3.14 today"),
            ("issue", "issue 14 closed"),
            ("host", "host 10.0.0.15 is up"),
            ("cold", "it fell to -5 overnight"),
            ("build", "the build took 3.21s, then 1.2.3rc1 shipped"),
            ("cell", "<td>2.71</td><td>&lt;-7&gt;</td>"),
            ("odds", "odds of 1@3.5 when x<9.25"),
            ("price", "lunch was €12.50, “cheap”"),
        ],
    )
    .await;
    let any = Filters::default();
    for (query, want) in [
        ("14", &["issue"][..]),
        ("3.14", &["pi"]),
        ("10.0.0.15", &["host"]),
        ("10.0.0.1", &[]),
        ("\"-5\"", &["cold"]),
        // Beside markup, as beside a blank.
        ("2.71", &["cell"]),
        ("\"-7\"", &["cell"]),
        ("71", &[]),
        ("3.5", &["odds"]),
        ("9.25", &["odds"]),
        ("12.50", &["price"]),
        ("50", &[]),
        ("5", &[]),
        ("3.21", &["build"]),
        ("1.2.3", &["build"]),
        ("rc1", &["build"]),
        ("\"3.21s\"", &["build"]),
        ("21s", &[]),
    ] {
        let hits = described(&found(&store, "t1", Source::Episodes, query, &any).await);
        assert_eq!(hits, want, "{query}");
    }
    // And marked whole in the snippet.
    for (query, snippet) in [
        ("3.14", "pi is **3.14** today"),
        ("10.0.0.15", "host **10.0.0.15** is up"),
        ("\"-5\"", "it fell to **-5** overnight"),
        ("\"-7\"", "2.71 <**-7**>"),
        ("9.25", "odds of 1@3.5 when x<**9.25**"),
        ("12.50", "lunch was €**12.50**, “cheap”"),
        ("3.21", "the build took **3.21**s, then 1.2.3rc1 shipped"),
        (
            "1.2.3 rc1",
            "the build took 3.21s, then **1.2.3rc1** shipped",
        ),
    ] {
        let hits = found(&store, "t1", Source::Episodes, query, &any).await;
        assert_eq!(hits[0].snippet, snippet, "{query}");
    }
}

/// A word at the start of any text is found, alone, and marked in the
/// snippet, whatever follows it, on both stores; and any such text asked
/// as a query answers (hits or none), never fails. Each episode and
/// memory value holds its own word (`quokka` and a number: a word of
/// letters alone would be stemmed, and two could share a stem) and then
/// generated text.
async fn any_text_around_a_word_leaves_it_findable<S: Store>(store: S, _db: &TestDb) {
    let texts = crate::search_reading::generated(
        crate::search_properties::TRICKY,
        16,
        150,
        0x5851_f42d_4c95_7f2d,
    );
    let word = |at: usize| format!("quokka{at}");
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    let w = writer(&store, "t1");
    for (at, text) in texts.iter().enumerate() {
        let text = format!("{} {text}", word(at));
        let name = format!("e{at}");
        l.append("s1", &[episode(&s1, Some(&name), None, None, json!(text))])
            .await;
        w.set(&format!("k{at}"), json!({ "text": text })).await;
    }
    let any = Filters::default();
    for (at, text) in texts.iter().enumerate() {
        let word = word(at);
        let hits = found(&store, "t1", Source::Episodes, &word, &any).await;
        assert_eq!(described(&hits), [format!("e{at}")], "{word} {text:?}");
        assert!(
            hits[0].snippet.starts_with(&format!("**{word}**")),
            "{:?} for {text:?}",
            hits[0].snippet
        );
        let hits = found(&store, "t1", Source::Memory, &word, &any).await;
        assert_eq!(described(&hits), [format!("k{at}@1")], "{word} {text:?}");
        if Query::parse("query", text).is_ok() {
            for source in [Source::Memory, Source::Episodes] {
                found(&store, "t1", source, text, &any).await;
            }
        }
    }
}

store_suite!(
    any_text_around_a_word_leaves_it_findable,
    each_string_is_read_alone,
    numbers_are_read_whole,
    hyphenated_words_find_their_parts_written_apart,
    compounds_are_found_by_their_parts,
    diacritics_are_read_without_them,
    word_forms_are_stemmed_as_postgres_stems_them,
    stop_words_alone_find_nothing,
    stop_words_at_the_ends_of_a_phrase_are_dropped,
    cjk_text_is_found_by_its_words,
    cluster_scripts_are_found_by_their_words,
    spaced_scripts_are_found_by_each_word,
    vowel_points_are_read_as_if_not_written,
    arabic_words_are_read_alike,
    decomposed_text_reads_as_composed,
    arabic_digits_read_as_ascii,
);
