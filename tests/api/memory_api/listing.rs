//! Listing: pages to the end, prefixes that collide, and the scopes with
//! their counts.

use engram::proto::{ListScopesRequest, ScopeType, SetRequest};
use serde_json::json;
use tonic::Code;

use super::{NS, delete, list, set};
use crate::helpers::{Backend, TestServer, bad_fields, reason};
use crate::on_both_stores;

async fn pagination_to_the_end(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    let mut expected: Vec<String> = (0..25).map(|i| format!("item/{i:02}")).collect();
    for key in expected.iter().rev() {
        client
            .set(set("pages", key, json!(key)))
            .await
            .expect("set");
    }
    client
        .set(set("pages", "other", json!(1)))
        .await
        .expect("set");

    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = client
            .list(list("pages", "item/", 7, &token))
            .await
            .expect("list")
            .into_inner();
        pages += 1;
        assert!(page.entries.len() <= 7);
        seen.extend(page.entries.iter().map(|e| e.key.clone()));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    expected.sort();
    assert_eq!(seen, expected, "every key once, in key order");
    assert_eq!(pages, 4);

    // A page that ends exactly at the last key has no next token.
    let exact = client
        .list(list("pages", "item/", 25, ""))
        .await
        .expect("list")
        .into_inner();
    assert_eq!(
        (exact.entries.len(), exact.next_page_token.as_str()),
        (25, "")
    );
    // page_size 0 is the default (100); above the maximum is lowered.
    let all = client
        .list(list("pages", "", 0, ""))
        .await
        .expect("list")
        .into_inner();
    assert_eq!(all.entries.len(), 26);
    let capped = client
        .list(list("pages", "", 5000, ""))
        .await
        .expect("list")
        .into_inner();
    assert_eq!(capped.entries.len(), 26);

    let first = client
        .list(list("pages", "item/", 7, ""))
        .await
        .expect("list")
        .into_inner();
    let err = client
        .list(list("pages", "other", 7, &first.next_page_token))
        .await
        .expect_err("token of another query");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_PAGE_TOKEN")
    );
    assert_eq!(bad_fields(&err), vec!["page_token"]);
    let err = client
        .list(list("pages", "item/", 7, "not-a-token"))
        .await
        .expect_err("bad token");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_PAGE_TOKEN")
    );
    let err = client
        .list(list("pages", "item/", -1, ""))
        .await
        .expect_err("negative size");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "INVALID_PAGE_SIZE")
    );
    assert_eq!(bad_fields(&err), vec!["page_size"]);
}

async fn prefix_collisions(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    for key in ["a/b", "a/bc", "a/b/c", "ab", "a_b", "a%b"] {
        if key.contains('%') {
            continue; // not a valid key; checked with the invalid identifiers
        }
        client.set(set("p", key, json!(key))).await.expect("set");
    }
    let reader = client.clone();
    let keys = |prefix: &'static str| {
        let mut client = reader.clone();
        async move {
            let page = client
                .list(list("p", prefix, 0, ""))
                .await
                .expect("list")
                .into_inner();
            page.entries.into_iter().map(|e| e.key).collect::<Vec<_>>()
        }
    };
    assert_eq!(keys("a/b").await, vec!["a/b", "a/b/c", "a/bc"]);
    assert_eq!(keys("a/b/").await, vec!["a/b/c"]);
    assert_eq!(keys("a/bc").await, vec!["a/bc"]);
    // `_` is a literal character, not a wildcard.
    assert_eq!(keys("a_").await, vec!["a_b"]);
    assert_eq!(keys("a").await, vec!["a/b", "a/b/c", "a/bc", "a_b", "ab"]);
    // Scopes are prefix-safe too: `p` never sees `p2`.
    client.set(set("p2", "a/b", json!(1))).await.expect("set");
    assert_eq!(keys("a/b").await, vec!["a/b", "a/b/c", "a/bc"]);
}

async fn scopes_listing(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let mut client = server.memory();
    for (scope_type, scope, keys) in [
        (ScopeType::Namespace, "customers", 3),
        (ScopeType::Flow, "research_agent", 2),
        (ScopeType::Execution, "exec-1", 1),
        (ScopeType::Namespace, "archive", 1),
    ] {
        for i in 0..keys {
            client
                .set(SetRequest {
                    scope_type: scope_type as i32,
                    ..set(scope, &format!("k{i}"), json!(i))
                })
                .await
                .expect("set");
        }
    }
    client
        .delete(delete("archive", "k0"))
        .await
        .expect("delete");
    let all = client
        .list_scopes(ListScopesRequest::default())
        .await
        .expect("scopes")
        .into_inner();
    let shape: Vec<(i32, &str, i64)> = all
        .scopes
        .iter()
        .map(|s| (s.scope_type, s.scope.as_str(), s.entry_count))
        .collect();
    assert_eq!(
        shape,
        vec![
            (NS, "archive", 0),
            (NS, "customers", 3),
            (ScopeType::Flow as i32, "research_agent", 2),
            (ScopeType::Execution as i32, "exec-1", 1),
        ]
    );
    let namespaces = client
        .list_scopes(ListScopesRequest {
            scope_type: NS,
            ..ListScopesRequest::default()
        })
        .await
        .expect("namespaces")
        .into_inner();
    assert_eq!(namespaces.scopes.len(), 2);

    let mut names = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_scopes(ListScopesRequest {
                page_size: 3,
                page_token: token.clone(),
                ..ListScopesRequest::default()
            })
            .await
            .expect("page")
            .into_inner();
        names.extend(page.scopes.into_iter().map(|s| s.scope));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(
        names,
        vec!["archive", "customers", "research_agent", "exec-1"]
    );
    let first = client
        .list_scopes(ListScopesRequest {
            page_size: 1,
            ..ListScopesRequest::default()
        })
        .await
        .expect("page")
        .into_inner();
    let err = client
        .list_scopes(ListScopesRequest {
            scope_type: NS,
            page_size: 1,
            page_token: first.next_page_token,
            ..ListScopesRequest::default()
        })
        .await
        .expect_err("token of another filter");
    assert_eq!(reason(&err), "INVALID_PAGE_TOKEN");
}

on_both_stores!(pagination_to_the_end, prefix_collisions, scopes_listing,);
