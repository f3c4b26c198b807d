//! Text written before a store read it the way it reads it now is read
//! again by the migration that brought the new reading (Postgres and
//! SQLite each), and a Postgres database of another locale or encoding
//! reads text as a UTF-8 one does.

use engram::context::Tenant;
use engram::ports::Store;
use engram::search::{Filters, Query, Source};
use serde_json::json;
use unicode_normalization::UnicodeNormalization;

use super::super::fixtures::{episode, id, log};
use super::super::writer;
use super::reading::{said, write_everywhere};
use super::{described, found, found_everywhere};
use crate::helpers::TestDb;

/// A Postgres store at the schema before migration 0020's reading.
async fn before_the_reading() -> (TestDb, engram::store::PgStore) {
    use engram::ports::Database;

    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    let store = db.pg_store().await;
    store
        .migrate_through(Some(19))
        .await
        .expect("the schema before");
    (db, store)
}

/// What a database held before migration 0020 read compounds whole; the
/// migration reads them again, so a memory value, a fact and an episode
/// written then are found by their parts after it, as before it only by
/// the whole compound.
#[tokio::test]
async fn compounds_written_before_their_reading_are_found_after_the_migration() {
    use engram::ports::Database;

    let (_db, store) = before_the_reading().await;
    // A `~` keeps the episode's text from the server's reader, so the
    // previous trigger builds its vector, as it did then.
    let text = "validate.ts takes ~1.5 s";
    write_everywhere(&store, text, "notes", "cats").await;
    let any = Filters::default();
    let everywhere = async |query: &str| {
        let mut hits = Vec::new();
        for source in [Source::Episodes, Source::Memory, Source::Facts] {
            hits.extend(described(&found(&store, "t1", source, query, &any).await));
        }
        hits
    };
    assert_eq!(everywhere("validate").await, Vec::<String>::new());
    assert_eq!(everywhere("example").await, Vec::<String>::new());

    store.migrate().await.expect("migrate");
    assert_eq!(everywhere("validate").await, ["e1", "notes@1"]);
    assert_eq!(everywhere("validate.ts").await, ["e1", "notes@1"]);
    assert_eq!(everywhere("example").await, ["ops@example.com"]);
}

/// What a database held before the markup reading (Postgres's migration
/// 0027, SQLite's 0015) is read again by it: on Postgres a `<style>`
/// element had hidden the rest of its string and a closing tag's name was
/// a word; on SQLite every tag's name was. After it, in memory, facts and
/// episodes, the text is found on both and the markup on neither.
#[tokio::test]
async fn markup_written_before_its_reading_is_read_again_by_the_migration() {
    use engram::ports::Database;

    let text = "</div> <style>p {}</style> canary rollout";
    let all = ["e1", "notes@1", "ops@example.com"];
    let none = Vec::<String>::new();

    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    let pg = db.pg_store().await;
    pg.migrate_through(Some(26))
        .await
        .expect("the schema before");
    write_everywhere(&pg, text, "notes", text).await;
    assert_eq!(found_everywhere(&pg, "canary").await, none);
    assert_eq!(found_everywhere(&pg, "div").await, all);
    pg.migrate().await.expect("migrate");
    assert_eq!(found_everywhere(&pg, "canary").await, all);
    assert_eq!(found_everywhere(&pg, "div").await, none);

    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    let lite = db.sqlite_store().await;
    lite.migrate_through(Some(14))
        .await
        .expect("the schema before");
    write_everywhere(&lite, text, "notes", text).await;
    assert_eq!(found_everywhere(&lite, "canary").await, all);
    assert_eq!(found_everywhere(&lite, "div").await, all);
    lite.migrate().await.expect("migrate");
    assert_eq!(found_everywhere(&lite, "canary").await, all);
    assert_eq!(found_everywhere(&lite, "div").await, none);
}

/// What a SQLite database held before its strings were read alone
/// (migration 0016) is read again by it: a `<script>` left open in one
/// string of a value had hidden the strings after it, in memory and in
/// episodes.
#[tokio::test]
async fn strings_written_before_they_were_read_alone_are_read_again_by_the_migration() {
    use engram::ports::Database;

    let cut = json!({"a": "<script>var x = 1;", "b": "canary rollout"});
    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    let lite = db.sqlite_store().await;
    lite.migrate_through(Some(15))
        .await
        .expect("the schema before");
    let l = log(&lite, "t1");
    l.create("s1", "app", "alice", 0).await;
    l.append(
        "s1",
        &[episode(&id("s1"), Some("e1"), None, None, cut.clone())],
    )
    .await;
    writer(&lite, "t1").set("notes", cut).await;
    assert_eq!(
        found_everywhere(&lite, "canary").await,
        Vec::<String>::new()
    );
    lite.migrate().await.expect("migrate");
    assert_eq!(found_everywhere(&lite, "canary").await, ["e1", "notes@1"]);
}

/// What a SQLite database held before a number before letters was read
/// as Postgres reads it (migration 0017) is read again by it: `3.21s` had
/// been `3` and `21s`, in memory, facts and episodes alike.
#[tokio::test]
async fn numbers_before_letters_written_before_their_reading_are_read_again_by_the_migration() {
    use engram::ports::Database;

    let text = "the build took 3.21s";
    let all = ["e1", "notes@1", "ops@example.com"];
    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    let lite = db.sqlite_store().await;
    lite.migrate_through(Some(16))
        .await
        .expect("the schema before");
    write_everywhere(&lite, text, "notes", text).await;
    assert_eq!(found_everywhere(&lite, "3.21").await, Vec::<String>::new());
    assert_eq!(found_everywhere(&lite, "21s").await, all);
    lite.migrate().await.expect("migrate");
    assert_eq!(found_everywhere(&lite, "3.21").await, all);
    assert_eq!(found_everywhere(&lite, "21s").await, Vec::<String>::new());
    // A key written again leaves its old words (FTS5 reads the stored
    // text again to remove them), and what is written after is read so.
    writer(&lite, "t1").set("notes", json!("other words")).await;
    assert_eq!(
        found_everywhere(&lite, "3.21").await,
        ["e1", "ops@example.com"]
    );
    let l = log(&lite, "t1");
    l.append(
        "s1",
        &[episode(
            &id("s1"),
            Some("e2"),
            None,
            None,
            json!("took 4.5s"),
        )],
    )
    .await;
    assert_eq!(
        described(&found(&lite, "t1", Source::Episodes, "4.5", &Filters::default()).await),
        ["e2"]
    );
}

/// Text written before a reading's migration is read again by it: each
/// of `absent` finds nothing before it; each of `found`, and the text
/// itself, finds it after, in memory, facts and episodes; and the key
/// written again with `again` leaves its old words (`absent[0]` then finds
/// the other two only) and is found by `found_again`.
struct ReadAgain<'a> {
    text: &'a str,
    absent: &'a [&'a str],
    found: &'a [&'a str],
    again: &'a str,
    found_again: &'a str,
}

async fn read_again_by_the_migration<S>(store: S, before: i64, case: ReadAgain<'_>)
where
    S: Store + engram::ports::Database,
{
    let all = ["e1", "notes@1", "ops@example.com"];
    store
        .migrate_through(Some(before))
        .await
        .expect("the schema before");
    write_everywhere(&store, case.text, "notes", case.text).await;
    for query in case.absent {
        assert_eq!(
            found_everywhere(&store, query).await,
            Vec::<String>::new(),
            "{query}"
        );
    }
    store.migrate().await.expect("migrate");
    for query in case.found.iter().chain([&case.text]) {
        assert_eq!(found_everywhere(&store, query).await, all, "{query}");
    }
    // A key written again leaves its old words (FTS5 reads the stored text
    // again to remove them), and what is written after is read so.
    writer(&store, "t1").set("notes", json!(case.again)).await;
    assert_eq!(
        found_everywhere(&store, case.absent[0]).await,
        ["e1", "ops@example.com"]
    );
    assert_eq!(
        found_everywhere(&store, case.found_again).await,
        ["notes@2"]
    );
}

/// Chinese, Japanese and Korean written before they were read a
/// character at a time (Postgres's 0029, SQLite's 0018).
async fn cjk_text_is_read_again_by_the_migration<S>(store: S, before: i64)
where
    S: Store + engram::ports::Database,
{
    let case = ReadAgain {
        text: "東京での会議は明日です",
        absent: &["会議", "東京"],
        found: &["東京", "会議"],
        again: "明日は休み",
        found_again: "休み",
    };
    read_again_by_the_migration(store, before, case).await;
}

#[tokio::test]
async fn cjk_text_written_before_its_reading_is_read_again_on_postgres() {
    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    cjk_text_is_read_again_by_the_migration(db.pg_store().await, 28).await;
}

/// Thai, Lao, Khmer and Burmese written before they were read a cluster
/// at a time, and Arabic with its vowel points before they were left out
/// (Postgres's 0030, SQLite's 0021).
async fn cluster_text_is_read_again_by_the_migration<S>(store: S, before: i64)
where
    S: Store + engram::ports::Database,
{
    let case = ReadAgain {
        text: "ผมไม่ชอบกาแฟ ราคา3.14บาท القَهْوَة",
        absent: &["กาแฟ", "القهوة"],
        found: &["กาแฟ", "ไม่ชอบ", "3.14", "القهوة"],
        again: "สวัสดีครับ",
        found_again: "สวัสดี",
    };
    read_again_by_the_migration(store, before, case).await;
}

#[tokio::test]
async fn cluster_text_written_before_its_reading_is_read_again_on_postgres() {
    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    cluster_text_is_read_again_by_the_migration(db.pg_store().await, 29).await;
}

#[tokio::test]
async fn cluster_text_written_before_its_reading_is_read_again_on_sqlite() {
    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    cluster_text_is_read_again_by_the_migration(db.sqlite_store().await, 20).await;
}

/// The Arabic script's letter variants written before they were read
/// alike (Postgres's 0031, SQLite's 0022).
async fn arabic_text_is_read_again_by_the_migration<S>(store: S, before: i64)
where
    S: Store + engram::ports::Database,
{
    let case = ReadAgain {
        text: "ذهب أحمد إلى المدرسة مع کتاب",
        absent: &["احمد", "كتاب", "مدرسة"],
        found: &["احمد", "\"الى المدرسه\"", "كتاب", "أحمد", "مدرسة"],
        again: "مستشفى",
        found_again: "مستشفي",
    };
    read_again_by_the_migration(store, before, case).await;
}

#[tokio::test]
async fn arabic_text_written_before_its_reading_is_read_again_on_postgres() {
    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    arabic_text_is_read_again_by_the_migration(db.pg_store().await, 30).await;
}

#[tokio::test]
async fn arabic_text_written_before_its_reading_is_read_again_on_sqlite() {
    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    arabic_text_is_read_again_by_the_migration(db.sqlite_store().await, 21).await;
}

/// Text in Unicode's decomposed form written before it was read composed,
/// and the Arabic script's digits before they were read as ASCII ones
/// (Postgres's 0032, SQLite's 0023): Korean written as its jamo, `٣٤`.
async fn decomposed_text_is_read_again_by_the_migration<S>(store: S, before: i64)
where
    S: Store + engram::ports::Database,
{
    let text: String = "한국어 문서 がっこう صفحة ٣٤".nfd().collect();
    let again: String = "서울 날씨".nfd().collect();
    let case = ReadAgain {
        text: &text,
        absent: &["한국어", "문서", "34"],
        found: &["한국어", "문서", "\"がっこう\"", "34", "٣٤"],
        again: &again,
        found_again: "날씨",
    };
    read_again_by_the_migration(store, before, case).await;
}

#[tokio::test]
async fn decomposed_text_written_before_its_reading_is_read_again_on_postgres() {
    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    decomposed_text_is_read_again_by_the_migration(db.pg_store().await, 31).await;
}

#[tokio::test]
async fn decomposed_text_written_before_its_reading_is_read_again_on_sqlite() {
    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    decomposed_text_is_read_again_by_the_migration(db.sqlite_store().await, 22).await;
}

/// SQLite's migration 0019 reads again what was written before it: a
/// number beside a Chinese, Japanese or Korean character (`3.5` in
/// `第3.5章`) is found whole after it, in memory, facts and episodes, and
/// what is written after is read so.
#[tokio::test]
async fn numbers_beside_cjk_text_are_read_again_by_sqlite_0019() {
    use engram::ports::Database;

    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    let store = db.sqlite_store().await;
    store
        .migrate_through(Some(18))
        .await
        .expect("the schema before");
    let text = "第3.5章を読んだ";
    write_everywhere(&store, text, "notes", text).await;
    assert_eq!(found_everywhere(&store, "3.5").await, Vec::<String>::new());
    store.migrate().await.expect("migrate");
    let all = ["e1", "notes@1", "ops@example.com"];
    for query in ["3.5", "\"第3.5章\"", "章"] {
        assert_eq!(found_everywhere(&store, query).await, all, "{query}");
    }
    // A key written again leaves its old words (FTS5 reads the stored
    // text again to remove them).
    writer(&store, "t1").set("notes", json!("第4.5章")).await;
    assert_eq!(
        found_everywhere(&store, "3.5").await,
        ["e1", "ops@example.com"]
    );
    assert_eq!(found_everywhere(&store, "4.5").await, ["notes@2"]);
}

/// SQLite's migration 0020 reads again what was written before it: a
/// number beside markup (`<td>3.14</td>`, `&lt;-5&gt;`) or a mark
/// Postgres reads as a blank (`€7.25`), which `reading 6` split at its
/// point and `reading 7` reads whole, as Postgres does.
#[tokio::test]
async fn numbers_beside_markup_are_read_again_by_sqlite_0020() {
    use engram::ports::Database;

    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    let store = db.sqlite_store().await;
    store
        .migrate_through(Some(19))
        .await
        .expect("the schema before");
    let text = "<td>3.14</td> &lt;-5&gt; €7.25";
    write_everywhere(&store, text, "notes", text).await;
    assert_eq!(found_everywhere(&store, "3.14").await, Vec::<String>::new());
    store.migrate().await.expect("migrate");
    let all = ["e1", "notes@1", "ops@example.com"];
    for query in ["3.14", "\"-5\"", "\"3.14 -5\"", "7.25"] {
        assert_eq!(found_everywhere(&store, query).await, all, "{query}");
    }
    assert_eq!(found_everywhere(&store, "14").await, Vec::<String>::new());
    // A key written again leaves its old words (FTS5 reads the stored
    // text again to remove them).
    writer(&store, "t1").set("notes", json!("<b>4.5</b>")).await;
    assert_eq!(
        found_everywhere(&store, "3.14").await,
        ["e1", "ops@example.com"]
    );
    assert_eq!(found_everywhere(&store, "4.5").await, ["notes@2"]);
}

#[tokio::test]
async fn cjk_text_written_before_its_reading_is_read_again_on_sqlite() {
    let db = TestDb::new(crate::helpers::Backend::Sqlite).await;
    cjk_text_is_read_again_by_the_migration(db.sqlite_store().await, 17).await;
}

/// In a database that lowercases as Rust does (the test cluster's), the
/// server builds plain episodes' vectors and normalises plain queries
/// itself. The check that decides it once compared a vector with
/// positions to one without, which never matched: every database looked
/// Turkish, and Postgres parsed every appended episode again.
#[tokio::test]
async fn the_server_reads_plain_text_itself_where_the_database_lowercases_alike() {
    use engram::ports::Database;
    use engram::search::english::Reading;

    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    let store = db.pg_store().await;
    store.migrate().await.expect("migrate");
    // The test cluster is C.UTF-8 (scripts/test), which reads punctuation
    // and emoji as breaks and the letters outside ASCII (Arabic's too) as
    // the server does.
    assert_eq!(
        store.text_in_rust().await.expect("the lowercasing check"),
        Some(Reading::Arabic)
    );
}

/// A migrated Postgres store on a database of `locale`, whose text the
/// server reads as `reading` says.
async fn migrated_with_locale(
    locale: &str,
    reading: Option<engram::search::english::Reading>,
) -> (TestDb, engram::store::PgStore) {
    use engram::ports::Database;

    let db = TestDb::postgres_with_locale(locale).await;
    let store = db.pg_store().await;
    store.migrate().await.expect("migrate");
    assert_eq!(
        store.text_in_rust().await.expect("the reading check"),
        reading,
        "{locale}"
    );
    (db, store)
}

/// In the `C` locale Postgres's parser reads every character outside
/// ASCII as a letter, so `don’t` is one word there: the server then reads
/// ASCII text alone, leaves an episode with a curly quote to Postgres, and
/// normalises such a query there too, so that the two meet. Elsewhere
/// (`C.UTF-8`) the quote is a break, as it is to the server.
#[tokio::test]
async fn a_c_locale_database_reads_punctuation_outside_ascii_itself() {
    use engram::search::english::Reading;

    let (db, store) = migrated_with_locale("C", Some(Reading::Ascii)).await;
    said(&store, &[("e1", "Don’t deploy on Fridays")]).await;
    let any = Filters::default();
    let hits = |query: &'static str| {
        let store = &store;
        let any = &any;
        async move { described(&found(store, "t1", Source::Episodes, query, any).await) }
    };
    assert_eq!(hits("don’t").await, ["e1"]);
    assert_eq!(hits("deploy").await, ["e1"]);
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .expect("connect");
    let (vector, same): (String, bool) = sqlx::query_as(
        "SELECT search::text, search = engram_episode_vector(content, metadata) FROM episodes",
    )
    .fetch_one(&mut conn)
    .await
    .expect("the episode's vector");
    // `unaccent` folds the curly quote into an ASCII one.
    assert!(same && vector.contains("'don''t'"), "{vector}");
}

/// Memory and fact vectors are indexed by tenant and words (migration
/// 0022), episodes' by tenant, user and words (0023), so a search looks
/// its tenant's matches up in the index and never reads another tenant's
/// rows; no index of the words alone is left for a plan to read every
/// tenant's matches through.
#[tokio::test]
async fn search_vectors_are_indexed_by_tenant() {
    use engram::ports::Database;
    use sqlx::Connection;

    let db = TestDb::new(crate::helpers::Backend::Postgres).await;
    db.pg_store().await.migrate().await.expect("migrate");
    let mut conn = sqlx::PgConnection::connect(&db.url).await.expect("connect");
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT tablename::text, indexdef FROM pg_indexes \
         WHERE tablename IN ('memory_search', 'fact_search', 'episodes') \
         AND indexdef LIKE '%USING gin%' \
         ORDER BY tablename",
    )
    .fetch_all(&mut conn)
    .await
    .expect("the search indexes");
    let kept: Vec<(&str, bool)> = indexes
        .iter()
        .map(|(table, def)| {
            let columns = match table.as_str() {
                "episodes" => "(tenant, user_id, search)",
                _ => "(tenant, search)",
            };
            (
                table.as_str(),
                def.ends_with(&format!("USING gin {columns}")),
            )
        })
        .collect();
    assert_eq!(
        kept,
        [
            ("episodes", true),
            ("fact_search", true),
            ("memory_search", true)
        ],
        "{indexes:?}"
    );
}

/// Writes racing migration 0020 (memory sets and appends whose text the
/// previous reading kept whole) neither fail nor deadlock, and every one is
/// found by its parts afterwards: the migration holds the tables' writes
/// while it reads them again, so none lands under the old reading after
/// its table's pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_racing_the_reading_migration_are_read_the_new_way() {
    use engram::ports::Database;
    use engram::search::ports::SearchStore;

    const EACH: usize = 25;
    let (_db, store) = before_the_reading().await;
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    let w = writer(&store, "t1");
    let sets = async {
        for n in 0..EACH {
            w.set(&format!("k{n}"), json!(format!("file{n}.txt"))).await;
        }
    };
    let appends = async {
        for n in 0..EACH {
            // A `~` leaves the text to the trigger, as in the release
            // before this reading.
            let text = json!(format!("file{n}.txt is ~1.5 MB"));
            l.append(
                "s1",
                &[episode(&s1, Some(&format!("e{n}")), None, None, text)],
            )
            .await;
        }
    };
    let migrate = async { store.migrate().await.expect("migrate") };
    tokio::join!(sets, appends, migrate);

    let query = Query::parse("query", "txt").expect("query");
    for source in [Source::Memory, Source::Episodes] {
        let hits = store
            .search(
                &Tenant::new("t1"),
                &[source],
                &query,
                &Filters::default(),
                100,
            )
            .await
            .expect("search");
        assert_eq!(hits.len(), EACH, "{source:?}: {:?}", described(&hits));
    }
}

/// In a database whose text search lowercases `I` to a dotless `ı` (a
/// Turkish `LC_CTYPE`), Postgres normalises everything: an episode's
/// vector and a plain query are then made as the memory's vectors are, and
/// meet them. Built by the server, the episode held `invoic` and the query
/// asked for it, where Postgres indexed the memory key under `ınvoıc`.
#[tokio::test]
async fn a_turkish_database_normalises_text_in_postgres() {
    let (db, store) = migrated_with_locale("tr_TR.UTF-8", None).await;
    let l = log(&store, "t1");
    l.create("s1", "app", "alice", 0).await;
    let s1 = id("s1");
    l.append(
        "s1",
        &[episode(
            &s1,
            Some("e1"),
            None,
            None,
            json!("INVOICE overdue in İSTANBUL"),
        )],
    )
    .await;
    writer(&store, "t1")
        .set("billing", json!({"text": "INVOICE paid"}))
        .await;
    let any = Filters::default();
    let mut found_both = Vec::new();
    let mut snippets = Vec::new();
    for source in [Source::Memory, Source::Episodes] {
        let hits = found(&store, "t1", source, "INVOICE", &any).await;
        found_both.extend(described(&hits));
        snippets.extend(hits.into_iter().map(|hit| hit.snippet));
    }
    assert_eq!(found_both, ["billing@1", "e1"]);
    // Snippets read the words as the database does: `INVOICE` is its
    // `ınvoıc` there, and marked.
    assert_eq!(
        snippets,
        [
            "billing **INVOICE** paid",
            "**INVOICE** overdue in İSTANBUL"
        ]
    );
    // `unaccent` reads `İ` as `I` first, so `İSTANBUL` is `ıstanbul`.
    let hits = found(&store, "t1", Source::Episodes, "İSTANBUL", &any).await;
    assert_eq!(described(&hits), ["e1"]);
    assert_eq!(hits[0].snippet, "INVOICE overdue in **İSTANBUL**");
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .expect("connect");
    let vector: String = sqlx::query_scalar("SELECT search::text FROM episodes")
        .fetch_one(&mut conn)
        .await
        .expect("the episode's vector");
    assert!(vector.contains("'ınvoıc'"), "{vector}");
}
