//! `engram bench` runs end to end and reports every workload (a smoke test:
//! it checks the report, never the speed).

use serde_json::Value;

use crate::helpers::{Backend, TestDb};

fn bench(url: &str, workloads: &str, extra: &[&str]) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args([
            "bench",
            "--database-url",
            url,
            "--clients",
            "2",
            "--duration",
            "300ms",
            "--warmup",
            "100ms",
            "--recent-episodes",
            "2000",
            "--history-versions",
            "50",
            "--workloads",
            workloads,
            "--baseline",
            "--output",
            "json",
        ])
        .args(extra)
        .env_remove("ENGRAM_DATABASE_URL")
        .output()
        .expect("run engram bench");
    assert!(
        out.status.success(),
        "engram bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

fn check(report: &Value, expected: &[&str], with_raw: &[&str]) {
    let results = report["results"].as_array().expect("results");
    let names: Vec<&str> = results
        .iter()
        .filter_map(|r| r["workload"].as_str())
        .collect();
    assert_eq!(names, expected);
    for result in results {
        let name = result["workload"].as_str().unwrap_or_default();
        assert!(
            result["ops"].as_u64().is_some_and(|n| n > 0),
            "{name}: {result}"
        );
        assert!(result["latency_ms"]["p99"].as_f64().is_some(), "{name}");
        assert!(
            result["server_peak_rss_mib"]
                .as_f64()
                .is_some_and(|m| m > 0.0),
            "{name}"
        );
        assert_eq!(
            result["raw_ops_per_sec"].as_f64().is_some(),
            with_raw.contains(&name),
            "{name}: {result}"
        );
        if cfg!(target_os = "linux") {
            // Where the CPU went, the started server's share included.
            let cpu = &result["cpu_per_op"];
            assert!(
                cpu["server_us"].as_f64().is_some_and(|us| us >= 0.0),
                "{name}: {result}"
            );
            assert!(
                cpu["idle_pct"]
                    .as_f64()
                    .is_some_and(|p| (0.0..=100.0).contains(&p)),
                "{name}: {result}"
            );
        }
    }
    assert!(
        report["server_idle_rss_mib"]
            .as_f64()
            .is_some_and(|m| m > 0.0)
    );
}

/// `engram bench` driving `server`, with no token or database from the
/// environment.
fn bench_on(server: &crate::helpers::TestServer) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_engram"));
    command
        .args([
            "bench",
            "--server",
            &format!("http://{}", server.grpc_addr()),
        ])
        .env_remove("ENGRAM_TOKEN")
        .env_remove("ENGRAM_DATABASE_URL");
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_every_workload_on_sqlite() {
    let db = TestDb::new(Backend::Sqlite).await;
    let all = [
        "set",
        "get",
        "get-version",
        "list",
        "history",
        "append",
        "recent",
        "search",
        "tail",
    ];
    let report = bench(&db.url, &all.join(","), &[]);
    check(&report, &all, &["set", "get", "append", "recent"]);
    let others = others_are_told(&report);
    // The run deleted what it appended (append, tail after `search`, and
    // the in-process baseline's), so the next run's `recent` is over the
    // loaded set alone.
    let removed = report["removed_episodes"].as_u64().unwrap_or_default();
    assert!(removed > others, "{others} told: {report}");
    let again = bench(&db.url, "recent", &[]);
    assert_eq!(recent_note(&again), "over 2000 episodes of 100 users");
    assert!(
        again["removed_episodes"].is_null(),
        "nothing appended: {again}"
    );
}

/// The appends ran before `recent` and `search`, so those two say that the
/// store holds episodes beyond the loaded set (their index lists are longer
/// than the loaded set's alone); returns how many.
fn others_are_told(report: &Value) -> u64 {
    let results = report["results"].as_array().expect("results");
    let mut told = Vec::new();
    for name in ["recent", "search"] {
        let result = results
            .iter()
            .find(|r| r["workload"] == name)
            .expect("the workload ran");
        let note = result["note"].as_str().unwrap_or_default();
        assert!(note.contains("over 2000 episodes of 100 users"), "{result}");
        let others = note
            .split("the store holds ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse::<u64>().ok());
        assert!(
            note.ends_with("other episodes too)") && others.is_some_and(|n| n > 0),
            "{result}"
        );
        told.extend(others);
    }
    told[0]
}

/// The note of a report's `recent`.
fn recent_note(report: &Value) -> &str {
    report["results"]
        .as_array()
        .and_then(|results| results.iter().find(|r| r["workload"] == "recent"))
        .and_then(|r| r["note"].as_str())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_compares_with_pgbench_on_postgres() {
    let db = TestDb::new(Backend::Postgres).await;
    let report = bench(
        &db.url,
        "set,get,append,recent,search,tail",
        &["--keep-appended"],
    );
    check(
        &report,
        &["set", "get", "append", "recent", "search", "tail"],
        &["set", "get", "append", "recent"],
    );
    others_are_told(&report);
    assert!(report["removed_episodes"].is_null(), "{report}");
    // Kept: a run that appends nothing leaves them (and tells them, the
    // tail's too); the next run that appends deletes them with its own,
    // through the server and (pgbench's) in the database.
    let kept = others_are_told(&bench(&db.url, "recent,search", &[]));
    let appended = bench(&db.url, "append", &[]);
    let removed = appended["removed_episodes"].as_u64().unwrap_or_default();
    let own = appended["results"][0]["ops"].as_u64().unwrap_or_default();
    assert!(removed > kept + own, "{kept} kept: {appended}");
    let last = bench(&db.url, "recent", &[]);
    assert_eq!(recent_note(&last), "over 2000 episodes of 100 users");
    let tail = &report["results"][5];
    assert!(
        tail["note"]
            .as_str()
            .unwrap_or_default()
            .contains("second server process"),
        "{tail}"
    );
}

/// Against a running server that requires tokens: `--token` gets in, and
/// without it the bench says why instead of printing figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_calls_an_authenticated_server_with_its_token() {
    let token = "bench-token";
    let server = crate::helpers::TestServer::spawn_with(Backend::Sqlite, |s| {
        s.tokens = Some(format!("{} default", engram::auth::hash_token(token)));
    })
    .await;
    let run = |token: Option<&str>, workloads: &str| {
        let mut command = bench_on(&server);
        command
            .args(["--clients", "2", "--duration", "200ms", "--warmup", "50ms"])
            .args(["--workloads", workloads, "--output", "json"]);
        if let Some(token) = token {
            command.args(["--token", token]);
        }
        command.output().expect("run engram bench")
    };
    let with = run(Some(token), "get");
    assert!(
        with.status.success(),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
    let report: Value = serde_json::from_slice(&with.stdout).expect("a JSON report");
    assert!(report["results"][0]["ops"].as_u64().is_some_and(|n| n > 0));
    let without = run(None, "get");
    assert!(!without.status.success());
    assert!(String::from_utf8_lossy(&without.stderr).contains("authorization: Bearer"));
    // A workload that appends fails first, and its error is the one
    // reported; the deletion after it fails too and is only warned of.
    let without = run(None, "append");
    let said = String::from_utf8_lossy(&without.stderr);
    assert!(!without.status.success());
    let failed = said.lines().last().unwrap_or_default();
    assert!(failed.contains("append failed"), "{said}");
    assert!(said.contains("cannot delete the episodes"), "{said}");
}

/// `engram recall-eval` loads the labeled set of tests/data as episodes,
/// asks every answerable question through Search and reports recall and
/// MRR for the plain search and with the following turn; the figures on
/// this small set guard against the ranking getting worse.
async fn recall_eval_reports_recall_and_mrr(backend: Backend) {
    let db = TestDb::new(backend).await;
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .args(["recall-eval", "--database-url", &db.url, "--output", "json"])
            .arg("--data")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/data/recall.jsonl"
            ))
            .args(extra)
            .env_remove("ENGRAM_DATABASE_URL")
            .output()
            .expect("run engram recall-eval");
        assert!(
            out.status.success(),
            "engram recall-eval failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).expect("a JSON report")
    };
    let report = run(&[]);
    assert_eq!(report["conversations"], 2);
    assert_eq!(report["turns"], 72);
    assert_eq!(
        report["questions"], 40,
        "the unanswerable question is skipped"
    );
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), 2);
    let figure = |at: usize, name: &str| results[at][name].as_f64().expect(name);
    assert_eq!(results[1]["following_episodes"], 1);
    for at in 0..2 {
        assert!(figure(at, "recall_at_1") <= figure(at, "recall_at_5"));
        assert!(figure(at, "recall_at_5") <= figure(at, "recall_at_10"));
        assert!(figure(at, "mrr") >= figure(at, "recall_at_1"));
    }
    assert!(figure(0, "recall_at_10") >= 0.6, "{report}");
    assert!(figure(1, "recall_at_10") >= 0.75, "{report}");
    assert!(figure(1, "recall_at_10") >= figure(0, "recall_at_10"));

    // Plain BM25 over the same turns, the reference: the same on every
    // store (computed by the tool), and ranking answers no better than
    // the search does.
    let plain = |name: &str| report["plain_bm25"][name].as_f64().expect(name);
    assert_eq!(plain("recall_at_10"), 0.7, "{report}");
    assert!(plain("recall_at_1") <= plain("recall_at_5"));
    assert!(plain("recall_at_5") <= plain("recall_at_10"));
    assert!(figure(0, "mrr") >= plain("mrr"), "{report}");
    assert!(figure(0, "recall_at_5") >= plain("recall_at_5"), "{report}");

    // A rerun loads nothing twice: the same turns, the same figures.
    let again = run(&["--following", "0"]);
    assert_eq!(again["turns"], 72);
    assert_eq!(again["results"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        again["results"][0]["recall_at_10"],
        results[0]["recall_at_10"]
    );
}

crate::on_both_stores!(recall_eval_reports_recall_and_mrr);

/// A bench run on `server` with `args`, once its first append to `app`
/// shows in a tail: what the test then writes beside it happens while the
/// bench runs. Finish it with [`report_of`].
async fn bench_appending(
    server: &crate::helpers::TestServer,
    app: &str,
    args: &[&str],
) -> tokio::task::JoinHandle<std::process::Output> {
    let mut tail = server
        .episodes()
        .tail_episodes(engram::proto::TailEpisodesRequest {
            app: app.to_owned(),
            ..engram::proto::TailEpisodesRequest::default()
        })
        .await
        .expect("tail")
        .into_inner();
    let mut command = bench_on(server);
    command.args(args).args(["--output", "json"]);
    let run = tokio::task::spawn_blocking(move || command.output().expect("run engram bench"));
    let first = tail
        .message()
        .await
        .expect("the tail")
        .and_then(|r| r.episode)
        .expect("the bench's first append");
    assert!(
        first.session_id.starts_with(&format!("{app}-")),
        "{first:?}"
    );
    run
}

/// The JSON report of a bench run that succeeded.
async fn report_of(run: tokio::task::JoinHandle<std::process::Output>) -> Value {
    let out = run.await.expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

/// A bench that appends deletes, when it ends, its own sessions and those
/// idle since it began, not those another run writes to meanwhile: a
/// session appended to while it ran, or created then, stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_leaves_the_sessions_another_run_writes() {
    use engram::api::convert::json_to_proto;
    use engram::proto::{AppendEpisodeRequest, ListSessionsRequest, NewEpisode};

    let server = crate::helpers::TestServer::spawn(Backend::Sqlite).await;
    let mut episodes = server.episodes();
    let append = |session: &str| AppendEpisodeRequest {
        session_id: session.to_owned(),
        app: "bench-append".to_owned(),
        user: "another-run".to_owned(),
        episode: Some(NewEpisode {
            content: Some(json_to_proto(&serde_json::json!("beside the bench"))),
            ..NewEpisode::default()
        }),
        require_session: false,
    };
    // An earlier run's session left idle, and one another run goes on with.
    for session in ["bench-append-idle-0", "bench-append-busy-0"] {
        episodes
            .append_episode(append(session))
            .await
            .expect("an earlier session");
    }
    let run = bench_appending(
        &server,
        "bench-append",
        &[
            "--workloads",
            "append",
            "--clients",
            "2",
            "--warmup",
            "50ms",
            "--duration",
            "3s",
        ],
    )
    .await;
    // The other run writes beside it.
    for session in ["bench-append-busy-0", "bench-append-new-0"] {
        episodes
            .append_episode(append(session))
            .await
            .expect("an append beside the bench");
    }
    let report = report_of(run).await;
    let own = report["results"][0]["ops"].as_u64().unwrap_or_default();
    let removed = report["removed_episodes"].as_u64().unwrap_or_default();
    assert!(
        removed > own,
        "its own appends and the idle one's: {report}"
    );
    let mut left: Vec<String> = server
        .sessions()
        .list_sessions(ListSessionsRequest {
            app: "bench-append".to_owned(),
            ..ListSessionsRequest::default()
        })
        .await
        .expect("list")
        .into_inner()
        .sessions
        .into_iter()
        .map(|s| s.id)
        .collect();
    left.sort();
    assert_eq!(left, ["bench-append-busy-0", "bench-append-new-0"]);
}

/// A bench's `tail` samples only its own appends: an episode another run
/// appends to the same app meanwhile, stamped an hour ago, would show as
/// an hour's latency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_tail_follows_only_its_own_appends() {
    use engram::api::convert::json_to_proto;
    use engram::proto::{AppendEpisodeRequest, NewEpisode};

    let server = crate::helpers::TestServer::spawn(Backend::Sqlite).await;
    // Once the bench appends (and so samples), another run appends to
    // the same app.
    let run = bench_appending(
        &server,
        "bench-tail",
        &[
            "--workloads",
            "tail",
            "--clients",
            "2",
            "--warmup",
            "0ms",
            "--duration",
            "2s",
            "--tail-rate",
            "50",
        ],
    )
    .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_micros() as i64;
    let hour_ago = now - 3_600_000_000;
    let mut episodes = server.episodes();
    for _ in 0..5 {
        episodes
            .append_episode(AppendEpisodeRequest {
                session_id: "bench-tail-other-0".to_owned(),
                app: "bench-tail".to_owned(),
                user: "another-run".to_owned(),
                episode: Some(NewEpisode {
                    content: Some(json_to_proto(&serde_json::json!(hour_ago))),
                    ..NewEpisode::default()
                }),
                require_session: false,
            })
            .await
            .expect("an append beside the bench");
    }
    let report = report_of(run).await;
    let tail = &report["results"][0];
    assert_eq!(tail["workload"], "tail", "{report}");
    assert!(tail["ops"].as_u64().unwrap_or_default() > 0, "{report}");
    let max = tail["latency_ms"]["max"].as_f64().expect("a max latency");
    assert!(max < 3_600_000.0, "another run's appends sampled: {report}");
}

/// Given a server, the workloads that read or write its database directly
/// (`recent`, `search`, `--baseline`) need that database named, and a
/// database the server does not read is caught before anything is
/// measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_with_a_given_server_needs_its_database() {
    let server = crate::helpers::TestServer::spawn(Backend::Sqlite).await;
    let address = format!("http://{}", server.grpc_addr());
    let elsewhere = tempfile::tempdir().expect("a directory");
    let run = |extra: &[&str]| {
        bench_on(&server)
            .current_dir(elsewhere.path())
            .args(["--clients", "1", "--duration", "100ms", "--warmup", "0ms"])
            .args(["--recent-episodes", "1000"])
            .args(extra)
            .output()
            .expect("run engram bench")
    };

    for (args, said) in [
        (
            ["--clients", "0", "--duration", "1s"],
            "--clients must be at least 1",
        ),
        (
            ["--clients", "1", "--duration", "0s"],
            "--duration must be more than 0",
        ),
    ] {
        let out = bench_on(&server)
            .args(args)
            .args(["--workloads", "ping"])
            .output()
            .expect("run engram bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(said), "{stderr}");
    }

    let out = run(&["--workloads", "get,search", "--baseline"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("--server with search, --baseline needs --database-url"),
        "{said}"
    );
    assert!(
        !elsewhere.path().join("engram-bench.db").exists(),
        "nothing loaded into the default file"
    );

    // Another Engram database, which the server does not read.
    let other = format!("sqlite://{}", elsewhere.path().join("other.db").display());
    let migrated = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .arg("migrate")
        .env("ENGRAM_DATABASE_URL", &other)
        .output()
        .expect("run engram migrate");
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );
    let out = run(&["--workloads", "recent", "--database-url", &other]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("does not see the episodes loaded into") && said.contains("other.db"),
        "{said}"
    );

    // Workloads that only call the server need no database.
    let out = run(&["--workloads", "ping", "--output", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["database"], format!("the server at {address}"));
}
