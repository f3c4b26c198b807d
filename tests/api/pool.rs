//! The Postgres store's own connection pool, through a real server: a
//! connection goes back as it was left (no ping), remembers which tenant its
//! session is set to, rolls back a transaction left open, and does not hand
//! out a connection the database has closed more than once.

use engram::auth::hash_token;
use engram::proto::memory_service_client::MemoryServiceClient;
use engram::proto::{ListRequest, ScopeType, SetRequest};
use serde_json::json;
use tonic::Code;

use crate::auth::{Authed, get, memory, set};
use crate::helpers::{APP_ROLE, Backend, TestServer, reason};

const NS: i32 = ScopeType::Namespace as i32;
const ACME: &str = "acme-pool-token";
const GLOBEX: &str = "globex-pool-token";

async fn value(client: &mut MemoryServiceClient<Authed>, key: &str) -> serde_json::Value {
    let entry = client
        .get(get(key))
        .await
        .unwrap_or_else(|err| panic!("get {key}: {err}"))
        .into_inner()
        .entry
        .expect("entry");
    engram::api::convert::json_from_proto(entry.value.expect("value")).expect("json")
}

/// With one connection, every call of both tenants goes through the same
/// session, alternating: each sees only its own rows, and a transaction a
/// refused write left open is rolled back before the next call runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_take_turns_on_one_connection() {
    let tokens = format!("{} acme\n{} globex", hash_token(ACME), hash_token(GLOBEX));
    let server = TestServer::spawn_with(Backend::Postgres, |s| {
        s.tokens = Some(tokens);
        s.db_max_connections = Some(1);
    })
    .await;
    let mut acme = memory(&server, Some(ACME));
    let mut globex = memory(&server, Some(GLOBEX));

    for round in 0..5 {
        acme.set(set("k", json!({"acme": round})))
            .await
            .expect("acme set");
        globex
            .set(set("k", json!({"globex": round})))
            .await
            .expect("globex set");
        assert_eq!(value(&mut acme, "k").await, json!({"acme": round}));
        assert_eq!(value(&mut globex, "k").await, json!({"globex": round}));
    }
    acme.set(set("only-acme", json!(1))).await.expect("set");
    let listed: Vec<String> = globex
        .list(ListRequest {
            scope_type: NS,
            scope: "shared".into(),
            ..ListRequest::default()
        })
        .await
        .expect("list")
        .into_inner()
        .entries
        .into_iter()
        .map(|entry| entry.key)
        .collect();
    assert_eq!(listed, vec!["k"]);

    // An idempotent write whose condition fails runs in a transaction that
    // has already recorded the request id when the write is refused. The
    // transaction is dropped, not committed: were it not rolled back, the
    // retry below with a new value would be refused as a reused id, and
    // with one connection the next call would wait on its open transaction.
    let conditional = |value: serde_json::Value| SetRequest {
        expected_version: Some(99),
        request_id: "pool-refused-once".into(),
        ..set("k", value)
    };
    let refused = acme
        .set(conditional(json!("first")))
        .await
        .expect_err("condition fails");
    assert_eq!(refused.code(), Code::Aborted, "{refused:?}");
    assert_eq!(reason(&refused), "VERSION_MISMATCH");
    assert_eq!(value(&mut globex, "k").await, json!({"globex": 4}));
    let again = acme
        .set(conditional(json!("second")))
        .await
        .expect_err("condition still fails");
    assert_eq!(reason(&again), "VERSION_MISMATCH");
    let applied = acme
        .set(SetRequest {
            expected_version: Some(5),
            request_id: "pool-refused-once".into(),
            ..set("k", json!("third"))
        })
        .await
        .expect("the id was never recorded")
        .into_inner()
        .entry
        .expect("entry");
    assert_eq!(applied.version, 6);
    assert_eq!(value(&mut acme, "k").await, json!("third"));
    assert_eq!(value(&mut globex, "k").await, json!({"globex": 4}));
    server.stop().await;
}

/// The database closes every connection the server holds (a restart, a
/// failover, an administrator): at most one call fails, UNAVAILABLE, and
/// the rest find fresh connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_connections_fail_at_most_one_call() {
    let server = TestServer::spawn_with(Backend::Postgres, |s| {
        s.db_max_connections = Some(4);
    })
    .await;
    let mut memory = server.memory();
    // Open several connections: concurrent calls each need one.
    let writes: Vec<_> = (0..8)
        .map(|n| {
            let mut client = memory.clone();
            tokio::spawn(async move { client.set(set(&format!("k{n}"), json!(n))).await })
        })
        .collect();
    for write in writes {
        write.await.expect("task").expect("set");
    }

    let mut owner = <sqlx::PgConnection as sqlx::Connection>::connect(&server.db.url)
        .await
        .expect("connect as the owner");
    let killed: i64 = sqlx::query_scalar(
        "WITH server AS MATERIALIZED (SELECT pid FROM pg_stat_activity \
         WHERE usename = $1 AND datname = current_database()) \
         SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM server",
    )
    .bind(APP_ROLE)
    .fetch_one(&mut owner)
    .await
    .expect("terminate the server's connections");
    assert!(killed >= 1, "the server held no connection");

    let mut failures = Vec::new();
    for n in 0..8 {
        match memory.get(get(&format!("k{n}"))).await {
            Ok(found) => {
                let entry = found.into_inner().entry.expect("entry");
                assert_eq!(entry.key, format!("k{n}"));
            }
            Err(status) => failures.push((status.code(), reason(&status))),
        }
    }
    assert!(
        failures.len() <= 1,
        "more than one call failed: {failures:?}"
    );
    for (code, reason) in &failures {
        assert_eq!(*code, Code::Unavailable);
        assert_eq!(reason, "DATABASE_UNAVAILABLE");
    }
    server.stop().await;
}

/// Calls of two tenants alternate on one connection while many of them are
/// cancelled part-way (a dropped future: a client gone, a deadline), in the
/// middle of binding the tenant, of a statement or of a transaction. The
/// store runs as an ordinary role, so row-level security holds it to the
/// tenant its connection is bound to: had any connection gone back to the
/// pool bound to the wrong tenant, or with a transaction open, a later call
/// would see nothing (a spurious NOT_FOUND or an empty list) or have its
/// write refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_leave_no_connection_bound_to_the_wrong_tenant() {
    use std::time::Duration;

    use engram::context::Tenant;
    use engram::memory::ports::{ListQuery, MemoryStore, Mutation, RequestStamp, Write, Written};
    use engram::memory::{ChangeKind, Key, KeyPrefix, Provenance, Scope, ScopeName, Value};
    use engram::ports::Database;
    use engram::store::{PgStore, StoreOptions};

    use crate::helpers::{TestDb, as_user, create_app_role};

    let db = TestDb::new(Backend::Postgres).await;
    let owner = db.pg_store().await;
    owner.migrate().await.expect("migrate");
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .expect("connect as the owner");
    create_app_role(&mut admin).await;
    owner.grant_to(APP_ROLE).await.expect("grant");
    // One connection: every call of the other tenant rebinds it.
    let options = StoreOptions {
        max_connections: 1,
        ..engram::config::Config::defaults().store
    };
    let store = PgStore::connect(&as_user(&db.url, APP_ROLE), &options)
        .await
        .expect("connect as the app role");
    // How the database reads text, which the first write would otherwise
    // ask in the background, on one of the pool's system connections:
    // asked first, so that the one it opens is counted at the end.
    store.text_in_rust().await.expect("the text reading check");

    let scope = Scope {
        scope_type: engram::memory::ScopeType::Namespace,
        name: ScopeName::parse("scope", "shared").expect("scope"),
    };
    let provenance = Provenance::default();
    let tenants = [Tenant::new("acme"), Tenant::new("globex")];
    let value_of = |tenant: &Tenant, n: u64| {
        Value::new(json!({"tenant": tenant.as_str(), "n": n}), 1 << 20).expect("value")
    };
    let write = |tenant: &Tenant,
                 key: &Key,
                 value: &Value,
                 stamp: Option<RequestStamp<'_>>,
                 expected_version: Option<i64>| {
        let (store, scope, provenance, tenant) = (&store, &scope, &provenance, tenant.clone());
        let (key, value) = (key.clone(), value.clone());
        let stamp = stamp.map(|s| (s.id.to_owned(), s.fingerprint));
        async move {
            let write = Write {
                scope,
                key: &key,
                mutation: Mutation::Set(&value),
                expected_version,
                request: stamp.as_ref().map(|(id, fingerprint)| RequestStamp {
                    id,
                    fingerprint: *fingerprint,
                }),
                provenance,
                now: chrono::Utc::now(),
                change: ChangeKind::Set,
            };
            store.write(&tenant, &write).await
        }
    };
    let k = Key::parse("key", "k").expect("key");
    for tenant in &tenants {
        let written = write(tenant, &k, &value_of(tenant, 0), None, None)
            .await
            .expect("first write");
        assert!(matches!(written, Written::Stored(_)), "{written:?}");
    }

    // Every check runs to the end: what a caller that was not cancelled sees.
    let check = async |tenant: &Tenant, round: u64| {
        let entry = store
            .get(tenant, &scope, &k, None)
            .await
            .expect("get")
            .unwrap_or_else(|| panic!("round {round}: {tenant:?} lost its key"));
        assert_eq!(
            entry.value.expect("value").json()["tenant"],
            json!(tenant.as_str()),
            "round {round}"
        );
        let prefix = KeyPrefix::default();
        let listed = store
            .list(
                tenant,
                &ListQuery {
                    scope: &scope,
                    prefix: &prefix,
                    after: None,
                    limit: 1000,
                    include_reserved: false,
                    descending: false,
                },
            )
            .await
            .expect("list");
        assert!(
            listed.iter().any(|e| e.key == k),
            "round {round}: {tenant:?} listed {} keys without its own",
            listed.len()
        );
        for entry in &listed {
            let value = entry.value.as_ref().expect("value").json();
            assert_eq!(value["tenant"], json!(tenant.as_str()), "round {round}");
        }
        let written = write(tenant, &k, &value_of(tenant, round), None, None)
            .await
            .unwrap_or_else(|err| panic!("round {round}: {tenant:?} write refused: {err}"));
        assert!(matches!(written, Written::Stored(_)), "{written:?}");
    };

    // A small linear congruential generator: the cancellation points vary
    // from run to run of the loop, not between runs of the test.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |bound: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % bound
    };
    let mut cancelled = 0;
    for round in 1..=300u64 {
        let tenant = &tenants[(round % 2) as usize];
        let key = Key::parse("key", format!("k{}", next(8))).expect("key");
        let value = value_of(tenant, round);
        let deadline = Duration::from_micros(next(800));
        let id = format!("req-{round}");
        let stamp = RequestStamp {
            id: &id,
            fingerprint: [round as u8; 32],
        };
        // Plain writes are one statement in autocommit; idempotent ones a
        // transaction of several, rolled back when their condition fails.
        let call = match next(4) {
            0 => tokio::time::timeout(deadline, write(tenant, &key, &value, None, None))
                .await
                .map(|done| done.map(drop)),
            1 => tokio::time::timeout(deadline, write(tenant, &key, &value, Some(stamp), None))
                .await
                .map(|done| done.map(drop)),
            2 => {
                let refused = write(tenant, &key, &value, Some(stamp), Some(1 << 40));
                tokio::time::timeout(deadline, refused)
                    .await
                    .map(|done| done.map(drop))
            }
            _ => tokio::time::timeout(deadline, store.get(tenant, &scope, &key, None))
                .await
                .map(|done| done.map(drop)),
        };
        match call {
            Err(_) => cancelled += 1,
            Ok(done) => done.unwrap_or_else(|err| panic!("round {round}: {err}")),
        }
        for tenant in &tenants {
            check(tenant, round).await;
        }
    }
    assert!(cancelled >= 10, "only {cancelled} calls were cancelled");
    // The calls' one connection, and the check's system connection.
    assert!(store.pool_status().open <= 2, "{:?}", store.pool_status());
    store.close().await;
}

/// The store's connections run with JIT off (a compiled plan costs 100 ms
/// and more a call), unless the URL's options say otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_run_without_jit_unless_the_url_sets_it() {
    use engram::store::PgStore;
    use sqlx::Connection;

    async fn jit(url: &str) -> String {
        let options = PgStore::connect_options(url).expect("options");
        let mut conn = sqlx::PgConnection::connect_with(&options)
            .await
            .expect("connect");
        sqlx::query_scalar("SHOW jit")
            .fetch_one(&mut conn)
            .await
            .expect("show jit")
    }

    let url = crate::helpers::pg_admin_url();
    assert_eq!(jit(&url).await, "off");
    let separator = if url.contains('?') { '&' } else { '?' };
    let on = format!("{url}{separator}options=-c%20jit%3Don");
    assert_eq!(jit(&on).await, "on");
    assert!(PgStore::connect_options("not a url").is_err());
}
