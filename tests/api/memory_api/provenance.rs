//! The caller's context: the default scope it implies and the provenance
//! every version records.

use engram::proto::{GetRequest, ListRequest, ScopeType, SetRequest};
use serde_json::json;
use tonic::Code;

use super::{list, set};
use crate::helpers::{Backend, TestServer, bad_fields, reason};
use crate::on_both_stores;

async fn default_scope_and_provenance(backend: Backend) {
    let server = TestServer::spawn(backend).await;
    let no_scope = |key: &str| SetRequest {
        scope_type: ScopeType::Unspecified as i32,
        scope: String::new(),
        ..set("", key, json!("v"))
    };
    let err = server
        .memory()
        .set(no_scope("k"))
        .await
        .expect_err("no scope, no flow");
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::InvalidArgument, "SCOPE_NOT_CONFIGURED")
    );

    let mut in_flow = server.memory_as(&[
        ("engram-execution-id", "exec-1"),
        ("engram-flow-id", "flow-9"),
        ("engram-flow-name", "research_agent"),
    ]);
    let entry = in_flow
        .set(no_scope("notes"))
        .await
        .expect("default scope")
        .into_inner()
        .entry
        .expect("e");
    assert_eq!(
        (entry.scope_type, entry.scope.as_str()),
        (ScopeType::Flow as i32, "research_agent")
    );
    assert_eq!(entry.execution_id, "exec-1");
    assert_eq!(
        (entry.flow_id.as_str(), entry.flow_name.as_str()),
        ("", ""),
        "tags only on execution scopes"
    );
    let read = server
        .memory()
        .get(GetRequest {
            scope_type: ScopeType::Flow as i32,
            scope: "research_agent".to_owned(),
            key: "notes".to_owned(),
            version: 0,
            as_of: None,
        })
        .await
        .expect("explicit read")
        .into_inner()
        .entry
        .expect("e");
    assert_eq!(read.execution_id, "exec-1");

    // EXECUTION with no scope is the caller's own execution, tagged with its flow.
    let own = in_flow
        .set(SetRequest {
            scope_type: ScopeType::Execution as i32,
            scope: String::new(),
            ..set("", "step", json!(1))
        })
        .await
        .expect("own execution")
        .into_inner()
        .entry
        .expect("e");
    assert_eq!(
        (
            own.scope.as_str(),
            own.flow_id.as_str(),
            own.flow_name.as_str()
        ),
        ("exec-1", "flow-9", "research_agent")
    );
    // Another execution's scope: provenance yes, flow tags no (its flow is not known here).
    let other = in_flow
        .set(SetRequest {
            scope_type: ScopeType::Execution as i32,
            scope: "exec-2".to_owned(),
            ..set("", "step", json!(1))
        })
        .await
        .expect("other execution")
        .into_inner()
        .entry
        .expect("e");
    assert_eq!(
        (other.execution_id.as_str(), other.flow_name.as_str()),
        ("exec-1", "")
    );
    // A detached write has no execution.
    let detached = server
        .memory()
        .set(set("ns", "seed", json!(1)))
        .await
        .expect("detached");
    assert_eq!(detached.into_inner().entry.expect("e").execution_id, "");

    // Reads default the same way.
    let listed = in_flow
        .list(ListRequest {
            scope_type: ScopeType::Unspecified as i32,
            ..list("", "", 0, "")
        })
        .await
        .expect("list the flow scope")
        .into_inner();
    assert_eq!(
        listed
            .entries
            .iter()
            .map(|e| e.key.as_str())
            .collect::<Vec<_>>(),
        vec!["notes"]
    );
    // A namespace needs a name.
    let err = in_flow
        .set(SetRequest {
            scope: String::new(),
            ..set("", "k", json!(1))
        })
        .await
        .expect_err("namespace without a name");
    assert_eq!(reason(&err), "SCOPE_NOT_CONFIGURED");
    // Malformed caller context is refused, naming the metadata key.
    let mut bad = server.memory_as(&[("engram-execution-id", "not valid!")]);
    let err = bad
        .set(set("ns", "k", json!(1)))
        .await
        .expect_err("bad metadata");
    assert_eq!(
        (err.code(), bad_fields(&err)),
        (
            Code::InvalidArgument,
            vec!["engram-execution-id".to_owned()]
        )
    );
}

on_both_stores!(default_scope_and_provenance,);
