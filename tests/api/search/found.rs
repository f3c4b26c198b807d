//! What a search finds and in what order: live items of every source with
//! marked snippets, ranking and the query syntax, CJK words inside runs,
//! and the episodes that follow a hit.

use std::collections::BTreeSet;

use engram::proto::SearchRequest;
use engram::proto::working_memory_service_client::WorkingMemoryServiceClient;
use serde_json::json;

use super::{
    EPISODES, FACTS, MEMORY, append, episode, names, query, remember, search, search_client, set,
};
use crate::helpers::{Backend, TestServer, bad_fields};
use crate::on_both_stores;

/// Every source is searched by default; each hit carries its item at its
/// current state and a snippet with the matched words marked.
async fn finds_live_items_of_every_source(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    server
        .memory()
        .set(set(
            "ops",
            "deploy/notes",
            json!({"text": "We deploy with blue green rollouts", "tags": ["kubernetes"]}),
        ))
        .await
        .expect("set");
    server
        .episodes()
        .append_episodes(append(
            "s1",
            "alice",
            vec![episode(
                "e1",
                "user_message",
                "",
                json!("my kubernetes cluster runs the staging deployment"),
            )],
        ))
        .await
        .expect("append");
    WorkingMemoryServiceClient::new(server.channel.clone())
        .remember(remember(
            "s1",
            "alice",
            "alice",
            "alice prefers kubernetes over nomad",
        ))
        .await
        .expect("remember");

    let hits = search(&server, query("kubernetes")).await;
    let found: BTreeSet<String> = names(&hits).into_iter().collect();
    assert_eq!(
        found,
        BTreeSet::from([
            "memory:ops/deploy/notes@1".to_owned(),
            "fact:alice".to_owned(),
            "episode:e1".to_owned(),
        ]),
        "{hits:?}"
    );
    for hit in &hits {
        assert!(hit.score > 0.0, "{hit:?}");
        assert!(
            hit.snippet.to_lowercase().contains("**kubernetes**"),
            "the matched word is marked: {:?}",
            hit.snippet
        );
    }
    let sources: Vec<i32> = hits.iter().map(|h| h.source).collect();
    assert!(sources.contains(&MEMORY) && sources.contains(&FACTS) && sources.contains(&EPISODES));
    assert!(
        hits.windows(2).all(|w| w[0].score >= w[1].score),
        "best first"
    );

    // Words are stemmed: plurals and verb forms find each other.
    let stemmed = search(&server, query("clusters running")).await;
    assert_eq!(names(&stemmed), vec!["episode:e1"]);
    let rollout = search(&server, query("rollout")).await;
    assert_eq!(names(&rollout), vec!["memory:ops/deploy/notes@1"]);
    // Keys and identifiers are found by their parts.
    let by_key = search(&server, query("notes")).await;
    assert_eq!(names(&by_key), vec!["memory:ops/deploy/notes@1"]);
}

/// BM25 with a bonus for neighbouring words: the exact phrase beats the
/// same words scattered, a rare word beats a common one; quotes require
/// the phrase, a minus excludes.
async fn ranking_and_query_syntax(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut episodes = vec![
        episode(
            "scattered",
            "user_message",
            "",
            json!("the setup of the office was slow, and the deployment came much later"),
        ),
        episode(
            "phrase",
            "user_message",
            "",
            json!("the deployment setup of the office was slow and came much later"),
        ),
        episode("rare", "user_message", "", json!("the zanzibar office")),
    ];
    for i in 0..20 {
        episodes.push(episode(
            &format!("filler{i}"),
            "user_message",
            "",
            json!(format!("the office number {i} is open")),
        ));
    }
    server
        .episodes()
        .append_episodes(append("s1", "alice", episodes))
        .await
        .expect("append");

    let hits = search(&server, query("deployment setup")).await;
    assert_eq!(
        names(&hits)[..2],
        ["episode:phrase", "episode:scattered"],
        "{hits:?}"
    );
    let rare = search(&server, query("office zanzibar")).await;
    assert_eq!(names(&rare)[0], "episode:rare", "{rare:?}");

    let quoted = search(&server, query("\"deployment setup\"")).await;
    assert_eq!(names(&quoted), vec!["episode:phrase"]);
    let excluded = search(
        &server,
        query("deployment -zanzibar -phrase -\"deployment setup\""),
    )
    .await;
    assert_eq!(names(&excluded), vec!["episode:scattered"]);
    let limited = search(
        &server,
        SearchRequest {
            limit: 3,
            ..query("office")
        },
    )
    .await;
    assert_eq!(limited.len(), 3);
    assert!(
        search(&server, query("nothing-like-this-anywhere"))
            .await
            .is_empty()
    );
}

/// Chinese, Japanese and Korean through the API: a word of the text is
/// found inside a run written without spaces, the run itself first, with
/// its characters marked in the snippet, and a quoted run needs them in a
/// row.
async fn cjk_words_are_found_inside_runs(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let said = [
        ("dark", "我喜欢深色模式，晚上看代码不累。"),
        ("scattered", "深夜里，颜色和模式都变了。"),
        ("japanese", "明日の会議でデプロイの手順を決めます"),
        ("korean", "배포 설정은 쿠버네티스로 합니다"),
    ];
    let episodes = said
        .iter()
        .map(|(id, text)| episode(id, "user_message", "", json!(text)))
        .collect();
    server
        .episodes()
        .append_episodes(append("s1", "alice", episodes))
        .await
        .expect("append");

    let hits = search(&server, query("深色模式")).await;
    assert_eq!(
        names(&hits),
        ["episode:dark", "episode:scattered"],
        "{hits:?}"
    );
    assert_eq!(hits[0].snippet, "我喜欢**深色模式**，晚上看代码不累。");
    let quoted = search(&server, query("\"深色\"")).await;
    assert_eq!(names(&quoted), ["episode:dark"]);
    let japanese = search(&server, query("デプロイ 手順")).await;
    assert_eq!(names(&japanese), ["episode:japanese"]);
    assert_eq!(
        japanese[0].snippet,
        "明日の会議で**デプロイ**の**手順**を決めます"
    );
    let korean = search(&server, query("쿠버네티스")).await;
    assert_eq!(names(&korean), ["episode:korean"]);
}

/// `following_episodes` adds the turns after each episode hit, scored
/// below it and within the episode filters.
async fn following_episodes_bring_the_answer(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    server
        .episodes()
        .append_episodes(append(
            "s1",
            "alice",
            vec![
                episode(
                    "q",
                    "user_message",
                    "",
                    json!("what did you eat for dinner?"),
                ),
                episode("a", "agent_response", "bot", json!("pasta with pesto")),
                episode("later", "user_message", "", json!("thanks")),
            ],
        ))
        .await
        .expect("append");
    let dinner = || SearchRequest {
        sources: vec![EPISODES],
        ..query("dinner")
    };
    assert_eq!(names(&search(&server, dinner()).await), vec!["episode:q"]);
    let hits = search(
        &server,
        SearchRequest {
            following_episodes: 1,
            ..dinner()
        },
    )
    .await;
    assert_eq!(names(&hits), vec!["episode:q", "episode:a"]);
    assert!(hits[1].score < hits[0].score);
    assert_eq!(hits[1].snippet, "pasta with pesto");
    let two = search(
        &server,
        SearchRequest {
            following_episodes: 2,
            ..dinner()
        },
    )
    .await;
    assert_eq!(names(&two), vec!["episode:q", "episode:a", "episode:later"]);
    let typed = search(
        &server,
        SearchRequest {
            following_episodes: 2,
            types: vec!["user_message".to_owned()],
            ..dinner()
        },
    )
    .await;
    assert_eq!(names(&typed), vec!["episode:q", "episode:later"]);
    let status = search_client(&server)
        .search(SearchRequest {
            following_episodes: 4,
            ..dinner()
        })
        .await
        .expect_err("too many");
    assert_eq!(bad_fields(&status), vec!["following_episodes".to_owned()]);
}

/// About 900 KB of text: `lead`, then distinct made-up words, more of
/// them than one Postgres search vector holds (1 MB of distinct words).
fn too_wordy(lead: &str) -> String {
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut text = format!("{lead}\n");
    while text.len() < 900_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        text.extend((0..9).map(|i| char::from(b'a' + ((state >> (i * 5)) % 26) as u8)));
        text.push(' ');
    }
    text
}

/// An item with more distinct words than a search vector holds was
/// refused as an internal error on Postgres (a base64 blob, a long log of
/// ids, numbers printed in full). It is stored, and found by its key and
/// its leading words. (A fact's content is at most 64 KiB.)
async fn items_too_wordy_for_one_vector_are_stored_and_found(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut memory = server.memory();
    memory
        .set(set("ops", "dump", json!(too_wordy("zebracorn manifest"))))
        .await
        .expect("a value of many words is stored");
    // Numbers with large exponents, which jsonb prints in full.
    let tiny: Vec<f64> = (0..4000)
        .map(|i| (1.0 + f64::from(i) / 4096.0) * 1e-300)
        .collect();
    memory
        .set(set("ops", "tinynumbers", json!(tiny)))
        .await
        .expect("numbers printed in full are stored");
    server
        .episodes()
        .append_episodes(append(
            "s1",
            "alice",
            vec![episode(
                "e1",
                "tool_result",
                "",
                json!(too_wordy("quokkafest transcript")),
            )],
        ))
        .await
        .expect("an episode of many words is appended");

    for (words, found) in [
        ("zebracorn", "memory:ops/dump@1"),
        ("dump", "memory:ops/dump@1"),
        ("tinynumbers", "memory:ops/tinynumbers@1"),
        ("quokkafest", "episode:e1"),
    ] {
        let hits = search(&server, query(words)).await;
        assert_eq!(names(&hits), vec![found.to_owned()], "{words}");
    }
}

on_both_stores!(
    items_too_wordy_for_one_vector_are_stored_and_found,
    finds_live_items_of_every_source,
    ranking_and_query_syntax,
    cjk_words_are_found_inside_runs,
    following_episodes_bring_the_answer,
);
