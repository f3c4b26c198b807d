//! The CLI against a real server: JSON output parsed and checked, exit codes,
//! and one-line errors with the reason; a file per command group, as in
//! `src/cli/`. Here: the runner they share and `--help` itself.

mod consolidation;
mod data;
mod follow;
mod memory;
mod retry;
mod search;
mod sessions;
mod working;

use serde_json::{Value, json};

struct Cli {
    server: String,
    /// The command group: memory, sessions, episodes.
    group: &'static str,
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Cli {
    fn run(&self, args: &[&str]) -> Run {
        self.run_as("json", args)
    }

    /// Runs the command with `--output` `output`.
    fn run_as(&self, output: &str, args: &[&str]) -> Run {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .arg(self.group)
            .args(["--server", &self.server, "--output", output])
            .args(args)
            .env_remove("ENGRAM_SCOPE")
            .env_remove("ENGRAM_SCOPE_TYPE")
            .output()
            .expect("run engram memory");
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs the command (JSON output) with `input` on its standard input.
    fn run_with_stdin(&self, args: &[&str], input: &str) -> Run {
        use std::io::Write;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .arg(self.group)
            .args(["--server", &self.server, "--output", "json"])
            .args(args)
            .env_remove("ENGRAM_SCOPE")
            .env_remove("ENGRAM_SCOPE_TYPE")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run engram");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input.as_bytes()).expect("write stdin");
        drop(stdin);
        let out = child.wait_with_output().expect("wait for engram");
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs the command with `input` on its standard input; it must
    /// succeed, and its JSON output is parsed.
    fn json_from_stdin(&self, args: &[&str], input: &str) -> Value {
        let run = self.run_with_stdin(args, input);
        assert_eq!(
            run.code, 0,
            "engram {} {args:?} failed: {}",
            self.group, run.stderr
        );
        serde_json::from_str(&run.stdout).unwrap_or_else(|err| panic!("{err}: {}", run.stdout))
    }

    /// Runs a command that must succeed and parses its JSON output.
    fn json(&self, args: &[&str]) -> Value {
        let run = self.run(args);
        assert_eq!(
            run.code, 0,
            "engram {} {args:?} failed: {}",
            self.group, run.stderr
        );
        serde_json::from_str(&run.stdout).unwrap_or_else(|err| panic!("{err}: {}", run.stdout))
    }
}

/// `recall-eval --help` ends with the data set's format, and its two
/// example lines are the JSON the tool reads.
#[test]
fn recall_eval_help_gives_the_data_format() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(["recall-eval", "--help"])
        .output()
        .expect("run engram recall-eval --help");
    let help = String::from_utf8_lossy(&out.stdout);
    let question = help
        .lines()
        .find(|line| line.contains("\"question\""))
        .expect("a question line");
    let question: Value = serde_json::from_str(question.trim()).expect("JSON");
    assert_eq!(question["answers"], json!(["t1"]), "{help}");
    assert!(help.contains("\"turns\": ["), "{help}");
}

/// A count or version below its range is refused by its flag before any
/// call (the server would refuse it too, by its field name, not the
/// flag's).
#[test]
fn numbers_out_of_range_are_refused_by_their_flag() {
    let cases: [(&[&str], &str); 10] = [
        (&["search", "x", "--limit=-1"], "--limit"),
        (&["episodes", "recent", "--user=u", "--limit=-5"], "--limit"),
        (
            &["episodes", "tail", "--session-id=s", "--cursor=-1"],
            "--cursor",
        ),
        (
            &["memory", "get", "k", "--scope=s", "--version=0"],
            "--version",
        ),
        (
            &["memory", "history", "k", "--scope=s", "--from-version=-3"],
            "--from-version",
        ),
        (
            &["memory", "purge", "k", "--scope=s", "--keep=-1"],
            "--keep",
        ),
        (
            &["memory", "compact", "k", "--scope=s", "--max-tokens=-1"],
            "--max-tokens",
        ),
        (
            &["working", "snapshot", "--session=s", "--max-facts=-2"],
            "--max-facts",
        ),
        (
            &["working", "render", "--session=s", "--max-events=-2"],
            "--max-events",
        ),
        (
            &["rules", "run", "r", "--max-episodes=-1"],
            "--max-episodes",
        ),
    ];
    for (args, flag) in cases {
        refused_by_flag(args, flag);
    }
}

/// A point in the past that is neither a revision, a time nor a duration
/// ago is refused by `--as-of` before any call (no server runs here), on
/// every command that takes one.
#[test]
fn points_in_the_past_are_refused_by_their_flag() {
    for point in [
        "yesterday",
        "10000-01-01T00:00:00Z",
        "99999999999d",
        "2026-13-01",
    ] {
        for command in [
            &["memory", "get", "k", "--scope=s"][..],
            &["memory", "list", "--scope=s"],
            &["memory", "scopes"],
            &["memory", "fork", "--scope=s", "--to-scope=t"],
        ] {
            let flag = format!("--as-of={point}");
            let args: Vec<&str> = command.iter().copied().chain([flag.as_str()]).collect();
            let stderr = refused_by_flag(&args, "--as-of");
            assert!(stderr.contains(point), "{args:?}: {stderr}");
        }
    }
}

/// Runs `engram` with `args`, which must exit with code 2 naming `flag`;
/// returns what it printed on stderr.
fn refused_by_flag(args: &[&str], flag: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(args)
        .env("ENGRAM_SERVER", "http://127.0.0.1:9")
        .output()
        .expect("run engram");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(
        stderr.contains(&format!("for '{flag} ")),
        "{args:?}: {stderr}"
    );
    stderr
}

/// Every command, argument and flag says in its `--help` what it is for:
/// the commands are walked as a user would, from `engram --help` down.
#[test]
fn every_argument_is_documented_in_help() {
    fn help(path: &[String]) -> String {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_engram"))
            .args(path)
            .arg("--help")
            .output()
            .expect("run engram --help");
        assert!(out.status.success(), "engram {path:?} --help failed");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The entries of a section (`Commands:`, `Arguments:`, `Options:`),
    /// each with its description, whether on its line or the next ones.
    fn entries(text: &str, section: &str) -> Vec<(String, String)> {
        let mut found: Vec<(String, String)> = Vec::new();
        let mut inside = false;
        for line in text.lines() {
            if !line.starts_with(' ') {
                inside = line == section;
                continue;
            }
            if !inside {
                continue;
            }
            if line.starts_with("          ") {
                // A long description under its entry; `[default: …]` and
                // `[possible values: …]` there describe nothing either.
                if let Some((_, described)) = found.last_mut()
                    && !line.trim_start().starts_with('[')
                {
                    described.push_str(line.trim());
                }
                continue;
            }
            let entry = line.trim_start();
            let (name, described) = entry.split_once("  ").unwrap_or((entry, ""));
            // `[default: …]` and `[possible values: …]` describe nothing.
            let described = if described.trim_start().starts_with('[') {
                ""
            } else {
                described.trim()
            };
            found.push((name.to_owned(), described.to_owned()));
        }
        found
    }

    let mut undocumented = Vec::new();
    let mut pending = vec![Vec::<String>::new()];
    let mut walked = 0;
    while let Some(path) = pending.pop() {
        let text = help(&path);
        walked += 1;
        for (name, described) in entries(&text, "Commands:") {
            if described.is_empty() {
                undocumented.push(format!("engram {} {name}", path.join(" ")));
            }
            if name != "help" {
                let mut below = path.clone();
                below.push(name);
                pending.push(below);
            }
        }
        for section in ["Arguments:", "Options:"] {
            for (name, described) in entries(&text, section) {
                if described.is_empty() {
                    undocumented.push(format!("engram {} {name}", path.join(" ")));
                }
            }
        }
    }
    assert!(walked > 60, "only {walked} commands were walked");
    assert!(
        undocumented.is_empty(),
        "arguments without a description:\n{}",
        undocumented.join("\n")
    );
}
