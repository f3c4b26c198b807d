//! Bad requests are refused with the field and the reason.

use engram::proto::{SearchMode, SearchRequest};
use tonic::Code;

use super::{MEMORY, query, search_client};
use crate::helpers::{Backend, TestServer, bad_fields, reason};
use crate::on_both_stores;

/// Bad input is refused with the field and a reason.
async fn bad_requests_name_the_field(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = search_client(&server);
    let cases = [
        (query(""), Code::InvalidArgument, "INVALID_QUERY", "query"),
        (
            query(&"word ".repeat(1000)),
            Code::InvalidArgument,
            "INVALID_QUERY",
            "query",
        ),
        (
            query("-only"),
            Code::InvalidArgument,
            "INVALID_QUERY",
            "query",
        ),
        (
            SearchRequest {
                sources: vec![MEMORY, 99],
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            "sources[1]",
        ),
        (
            SearchRequest {
                limit: 101,
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            "limit",
        ),
        (
            SearchRequest {
                scope_prefix: "no spaces".to_owned(),
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_IDENTIFIER",
            "scope_prefix",
        ),
        (
            SearchRequest {
                limit: -1,
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            "limit",
        ),
        (
            SearchRequest {
                following_episodes: -1,
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            "following_episodes",
        ),
        (
            SearchRequest {
                scope: "ops".to_owned(),
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            "scope",
        ),
        (
            SearchRequest {
                user: "not a name!".to_owned(),
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_IDENTIFIER",
            "user",
        ),
        (
            SearchRequest {
                types: vec!["Bad Type".to_owned()],
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_IDENTIFIER",
            "types[0]",
        ),
        (
            SearchRequest {
                start_time: Some(prost_types::Timestamp {
                    seconds: 20,
                    nanos: 0,
                }),
                end_time: Some(prost_types::Timestamp {
                    seconds: 10,
                    nanos: 0,
                }),
                ..query("x")
            },
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            "end_time",
        ),
    ];
    for (request, code, why, field) in cases {
        let status = client.search(request.clone()).await.expect_err(field);
        assert_eq!(status.code(), code, "{field}: {status:?}");
        assert_eq!(reason(&status), why, "{field}: {status:?}");
        assert_eq!(bad_fields(&status), vec![field.to_owned()], "{status:?}");
        // The field is named once, before what is wrong with it.
        let said = status.message();
        let rest = said.strip_prefix(&format!("{field}: ")).unwrap_or(said);
        assert!(!rest.starts_with(field), "{said}");
    }
    let status = client
        .search(SearchRequest {
            limit: 101,
            ..query("x")
        })
        .await
        .expect_err("limit");
    assert_eq!(
        status.message(),
        "limit: must be from 1 to 100 (0 means 10), got 101"
    );
    for mode in [SearchMode::Semantic, SearchMode::Hybrid] {
        let status = client
            .search(SearchRequest {
                mode: mode as i32,
                ..query("x")
            })
            .await
            .expect_err("no embedder");
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(reason(&status), "EMBEDDER_NOT_CONFIGURED");
        assert!(status.message().contains("--embedder-url"), "{status:?}");
    }
    // Stop words alone find nothing, and are not an error.
    let lexical = client
        .search(SearchRequest {
            mode: SearchMode::Lexical as i32,
            ..query("x")
        })
        .await
        .expect("lexical is built in");
    assert!(lexical.into_inner().hits.is_empty());
}

on_both_stores!(bad_requests_name_the_field,);
