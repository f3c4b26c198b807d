//! `engram export` and `engram import`.

use serde_json::{Value, json};

use super::Cli;
use crate::helpers::{Backend, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_and_import_commands_move_a_tenant() {
    let source = TestServer::spawn(Backend::Sqlite).await;
    let target = TestServer::spawn(Backend::Sqlite).await;
    let memory = Cli {
        server: format!("http://{}", source.grpc_addr()),
        group: "memory",
    };
    memory.json(&["set", "k", r#"{"v": 1}"#, "--scope", "team"]);
    memory.json(&["set", "k", r#"{"v": 2}"#, "--scope", "team"]);
    let episodes = Cli {
        server: memory.server.clone(),
        group: "episodes",
    };
    episodes.json(&["append", "s1", "hello", "--app", "bot", "--user", "u1"]);

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("tenant.jsonl");
    let export = |server: &str, file: &std::path::Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .args(["export", "--server", server, "--file"])
            .arg(file)
            .output()
            .expect("run engram export");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let said = export(&memory.server, &file);
    assert!(
        said.contains("exported 4 records (episode 1, memory_version 2, session 1)"),
        "{said}"
    );

    // Import from standard input, twice: the second changes nothing.
    let target_server = format!("http://{}", target.grpc_addr());
    let import = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .args([
                "import",
                "--server",
                &target_server,
                "--output",
                "json",
                "-",
            ])
            .stdin(std::fs::File::open(&file).expect("open the export"))
            .output()
            .expect("run engram import");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).expect("json")
    };
    let first = import();
    assert_eq!(
        (
            &first["imported"]["memory_version"],
            &first["imported"]["episode"]
        ),
        (&json!(2), &json!(1))
    );
    let second = import();
    assert_eq!(second["imported"], json!({}));
    assert_eq!(second["unchanged"]["memory_version"], json!(2));

    let copy = dir.path().join("copy.jsonl");
    export(&target_server, &copy);
    let body = |path: &std::path::Path| -> Vec<String> {
        std::fs::read_to_string(path)
            .expect("read")
            .lines()
            .skip(1)
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(body(&copy), body(&file));

    // A file that is not an export: exit code 2 (invalid argument), the
    // line named.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "not json\n").expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(["import", "--server", &target_server])
        .arg(&bad)
        .output()
        .expect("run engram import");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("IMPORT_MALFORMED") && stderr.contains("line 1"),
        "{stderr}"
    );
}

/// An export to `--file` that fails leaves the file that was there as it
/// was (a backup's last good copy), and no `.partial` beside it; one that
/// succeeds replaces it whole, its last line the end line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_export_leaves_the_file_as_it_was() {
    let server = TestServer::spawn(Backend::Sqlite).await;
    let address = format!("http://{}", server.grpc_addr());
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("backup.jsonl");
    std::fs::write(&file, "the last good export\n").expect("write");
    let export = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .args(["export", "--server", &address, "--file"])
            .arg(&file)
            .args(args)
            .output()
            .expect("run engram export")
    };

    // The server refuses the selection once the export is under way.
    let failed = export(&["--scope", "not a scope"]);
    assert!(!failed.status.success());
    assert!(
        String::from_utf8_lossy(&failed.stderr).contains("scope"),
        "{}",
        String::from_utf8_lossy(&failed.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        "the last good export\n"
    );
    assert!(!dir.path().join("backup.jsonl.partial").exists());

    let done = export(&[]);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let written = std::fs::read_to_string(&file).expect("read");
    let lines: Vec<&str> = written.lines().collect();
    let end: Value = serde_json::from_str(lines[lines.len() - 1]).expect("json");
    assert_eq!(end, json!({"kind": "end", "lines": lines.len() - 1}));
    assert!(!dir.path().join("backup.jsonl.partial").exists());
}

/// `engram import --check` reads a file as an import would, with no
/// server: a whole export passes with its counts, one cut short (its end
/// line gone) or miscounted fails naming the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_check_reads_a_file_offline() {
    let server = TestServer::spawn(Backend::Sqlite).await;
    let memory = Cli {
        server: format!("http://{}", server.grpc_addr()),
        group: "memory",
    };
    memory.json(&["set", "k", r#"{"v": 1}"#, "--scope", "team"]);
    memory.json(&["set", "k", r#"{"v": 2}"#, "--scope", "team"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("team.jsonl");
    let exported = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args([
            "export",
            "--server",
            &memory.server,
            "--scope",
            "team",
            "--file",
        ])
        .arg(&file)
        .output()
        .expect("run engram export");
    assert!(exported.status.success());
    drop(server);

    // No server is called: the one named is not there.
    let check = |file: &std::path::Path, json: bool| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_engram"));
        command.args(["import", "--check", "--server", "http://127.0.0.1:9"]);
        if json {
            command.args(["--output", "json"]);
        }
        command
            .arg(file)
            .output()
            .expect("run engram import --check")
    };
    let whole = check(&file, false);
    assert!(
        whole.status.success(),
        "{}",
        String::from_utf8_lossy(&whole.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&whole.stdout),
        format!(
            "{}: whole, format version 4, 4 lines: 2 records (memory_version 2)\n",
            file.display()
        )
    );
    let json_out: Value = serde_json::from_slice(&check(&file, true).stdout).expect("json");
    assert_eq!(
        json_out,
        json!({"lines": 4, "version": 4, "records": {"memory_version": 2}})
    );

    let text = std::fs::read_to_string(&file).expect("read");
    let lines: Vec<&str> = text.lines().collect();
    let cut = dir.path().join("cut.jsonl");
    std::fs::write(&cut, lines[..3].join("\n") + "\n").expect("write");
    let refused = check(&cut, false);
    assert_eq!(refused.status.code(), Some(1));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("line 4.kind: the file ends before its end line"),
        "{said}"
    );
    let miscounted = dir.path().join("miscounted.jsonl");
    std::fs::write(&miscounted, [lines[0], lines[1], lines[3]].join("\n")).expect("write");
    let refused = check(&miscounted, false);
    assert_eq!(refused.status.code(), Some(1));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("line 3.lines: says 3 lines came before it, but 2 did"),
        "{said}"
    );
}
