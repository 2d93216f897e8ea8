//! What the `ostiary` command line prints (docs/cli.md, "Output formats"): the real binary,
//! against a running `ostiary serve` and its state once stopped.
//!
//! What it proves:
//! - the one global `--json` works on every command that prints a result, before the
//!   subcommand or after it, and prints JSON that parses (one document, or JSON lines for
//!   records), with the exit codes the text has; `serve`, `run` and `completions` refuse it;
//! - JSON is never coloured, even with `CLICOLOR_FORCE=1`; text piped somewhere has no
//!   escape byte; with `CLICOLOR_FORCE=1` doctor's, `audit verify`'s, `policy test`'s,
//!   `approvals list`'s and the record table's verdicts are coloured;
//! - `audit query` prints JSON lines to a pipe and a table with a coloured decision column
//!   to a terminal (`script`'s pty), plain under `NO_COLOR=1`; `audit tail --format table`
//!   prints the rows `query` does;
//! - bad input is refused with exit 2: an unknown `--format`, `--format table` with
//!   `--json`.

use std::process::Stdio;
use std::time::Duration;

use ostiary_e2e::clients::{CmdOutput, SCRUBBED_ENV};
use ostiary_e2e::upstream::Upstream;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::support::approvals::{refund_body, APPROVER, POLICIES, TOOLS};
use crate::support::cli as support;
use support::*;

/// The escape byte every colour code starts with.
const ESC: char = '\x1b';

/// Signs the chain often, so an export taken after the stop has checkpoints to carry.
const AUDIT: &str = "[audit]\nsigned_checkpoint_interval = \"1s\"\n";

/// `program <args>` with `env` set on top of an environment without the colour variables
/// of whoever runs the tests (a `NO_COLOR` there would hide every colour asserted here).
async fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> CmdOutput {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .env("OSTIARY_LOG", "warn");
    for name in SCRUBBED_ENV.iter().chain(&[
        "NO_COLOR",
        "CLICOLOR",
        "CLICOLOR_FORCE",
        "OSTIARY_CONFIG",
        "OSTIARY_ADMIN_TOKEN",
        "OSTIARY_APPROVER",
    ]) {
        cmd.env_remove(name);
    }
    cmd.envs(env.iter().copied());
    let out = tokio::time::timeout(CLI_TIMEOUT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} timed out"))
        .unwrap_or_else(|e| panic!("starting {program}: {e}"));
    CmdOutput {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `ostiary <args>` with `env`.
async fn ostiary_env(args: &[&str], env: &[(&str, &str)]) -> CmdOutput {
    run(&ostiary_bin().display().to_string(), args, env).await
}

/// Every JSON value stdout holds: one pretty document, or one per line.
fn documents(out: &CmdOutput) -> Vec<Value> {
    serde_json::Deserializer::from_str(&out.stdout)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"))
}

/// `ostiary --config <config> <args>` with `--json` first before the subcommand, then after
/// it under `CLICOLOR_FORCE=1`: both exit `code` and print uncoloured JSON. The documents of
/// the first run.
async fn json_both(config: &str, args: &[&str], code: i32) -> Vec<Value> {
    let mut before = vec!["--config", config, "--json"];
    before.extend_from_slice(args);
    let mut after = vec!["--config", config];
    after.extend_from_slice(args);
    after.push("--json");
    let mut first = None;
    for (argv, env) in [(before, &[][..]), (after, &[("CLICOLOR_FORCE", "1")][..])] {
        let out = ostiary_env(&argv, env).await;
        assert_eq!(out.status, code, "{argv:?}:\n{out}");
        assert!(!out.stdout.contains(ESC), "{argv:?} coloured JSON:\n{out}");
        let docs = documents(&out);
        first.get_or_insert(docs);
    }
    first.unwrap_or_default()
}

/// The one document `json_both` found.
async fn json_one(config: &str, args: &[&str], code: i32) -> Value {
    let mut docs = json_both(config, args, code).await;
    assert_eq!(docs.len(), 1, "{args:?}: {docs:#?}");
    docs.remove(0)
}

/// A config naming `state` and `policies` alone: for the commands that read the store or
/// the policies with the proxy stopped, and for `[audit.siem]` added.
fn offline_config(dir: &std::path::Path, name: &str, extra: &str) -> String {
    let path = dir.join(name);
    let state = dir.join("state");
    let text = format!(
        "[state]\ndir = \"{}\"\n[policy]\ndir = \"{}\"\n{extra}",
        state.display(),
        dir.join("policies").display()
    );
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_print_no_result_refuse_json_and_bad_formats_are_refused() {
    for args in [
        &["--json", "serve"][..],
        &["serve", "--json"],
        &["run", "--agent", "a", "--json", "--", "true"],
        &["completions", "bash", "--json"],
    ] {
        let out = ostiary_env(args, &[]).await;
        assert_eq!(out.status, 2, "{args:?}:\n{out}");
        assert!(out.stdout.is_empty(), "{args:?}:\n{out}");
        assert!(
            out.stderr.contains("--json does not apply") && out.stderr.contains("no result"),
            "{args:?}:\n{out}"
        );
    }
    for args in [
        &["audit", "query", "--format", "nonsense"][..],
        &["audit", "tail", "--format", "nonsense"],
        &["audit", "query", "--format"],
        &["--json=yes", "doctor"],
    ] {
        let out = ostiary_env(args, &[]).await;
        assert_eq!(out.status, 2, "{args:?}:\n{out}");
        assert!(out.stdout.is_empty(), "{args:?}:\n{out}");
    }
    let out = ostiary_env(&["audit", "query", "--format", "nonsense"], &[]).await;
    assert!(
        out.stderr.contains("invalid value 'nonsense'") && out.stderr.contains("table, json, ocsf"),
        "{out}"
    );
}

/// `ostiary … | head`: the reader goes away before the command writes; it ends with the
/// shell's SIGPIPE code and says nothing, rather than panicking on the broken pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_went_away_ends_the_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let (stderr, code) = (dir.path().join("stderr"), dir.path().join("code"));
    // `true` has exited (the pipe has no reader) by the time ostiary writes its first line.
    let script = format!(
        "(sleep 0.5; '{}' policy schema 2>'{}'; echo $? >'{}') | true",
        ostiary_bin().display(),
        stderr.display(),
        code.display()
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script]).env_remove("OSTIARY_CONFIG");
    let status = tokio::time::timeout(CLI_TIMEOUT, cmd.status())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
    let said = std::fs::read_to_string(&stderr).unwrap();
    assert_eq!(
        std::fs::read_to_string(&code).unwrap().trim(),
        "141",
        "{said}"
    );
    assert!(!said.contains("panicked"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_commands_print_json_and_colour_verdicts_only_when_asked() {
    let library = workspace_root().join("policies/library");
    let library_arg = library.display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("library.toml");
    std::fs::write(
        &config,
        format!(
            "[state]\ndir = \"{}\"\n[policy]\ndir = \"{library_arg}\"\n",
            dir.path().join("state").display()
        ),
    )
    .unwrap();
    let config = config.display().to_string();

    let valid = json_one(&config, &["policy", "validate"], 0).await;
    assert_eq!(valid["ok"], true, "{valid}");
    assert!(valid["policies"].as_u64() > Some(0), "{valid}");
    assert_eq!(valid["dir"], library_arg.as_str());
    let schema = json_one(&config, &["policy", "schema"], 0).await;
    assert!(
        schema["schema"]
            .as_str()
            .is_some_and(|s| s.contains("namespace Ostiary")),
        "{schema}"
    );
    let explained = json_one(
        &config,
        &[
            "policy",
            "explain",
            "--agent",
            "a",
            "--host",
            "169.254.169.254",
        ],
        0,
    )
    .await;
    assert_eq!(explained["decision"], "deny", "{explained}");

    let tested = json_one(&config, &["policy", "test", "--dir", &library_arg], 0).await;
    assert_eq!(tested["ok"], true, "{tested}");
    assert_eq!(tested["failed"], 0, "{tested}");
    let cases = tested["cases"].as_array().expect("cases");
    assert!(!cases.is_empty() && cases.iter().all(|c| c["passed"] == true));
    assert_eq!(tested["passed"], cases.len());

    // One wrong expectation: exit 1 with --json as without, the case saying why.
    let wrong = dir.path().join("wrong");
    std::fs::create_dir_all(wrong.join("tests")).unwrap();
    std::fs::copy(library.join("egress.cedar"), wrong.join("egress.cedar")).unwrap();
    std::fs::write(
        wrong.join("tests/wrong.toml"),
        "[[case]]\nname = \"publishing is allowed\"\naction = \"http\"\nhost = \"pypi.org\"\nmethod = \"POST\"\nexpect = \"allow\"\n\n\
         [[case]]\nname = \"reading is allowed\"\naction = \"http\"\nhost = \"pypi.org\"\nexpect = \"allow\"\n",
    )
    .unwrap();
    let wrong_arg = wrong.display().to_string();
    let failed = json_one(&config, &["policy", "test", "--dir", &wrong_arg], 1).await;
    assert_eq!(failed["ok"], false, "{failed}");
    assert_eq!(failed["failed"], 1, "{failed}");
    let case = &failed["cases"][0];
    assert_eq!(case["name"], "publishing is allowed", "{failed}");
    assert_eq!(case["passed"], false, "{failed}");
    assert_eq!(case["decision"], "deny", "{failed}");
    assert!(case["failure"]
        .as_str()
        .is_some_and(|f| f.contains("expected allow, got deny")));

    policy_test_text_is_coloured_only_when_forced(&wrong_arg).await;
    state_init_prints_the_paths_it_wrote(&config, dir.path()).await;
}

/// `policy test`'s verdicts: plain on a pipe, coloured when forced, plain again under
/// `NO_COLOR`.
async fn policy_test_text_is_coloured_only_when_forced(wrong_arg: &str) {
    let piped = ostiary_env(&["policy", "test", "--dir", wrong_arg], &[]).await;
    assert_eq!(piped.status, 1, "{piped}");
    assert!(!piped.stdout.contains(ESC), "{piped}");
    assert!(
        piped
            .stdout
            .contains("FAIL wrong.toml: publishing is allowed"),
        "{piped}"
    );
    let forced = ostiary_env(
        &["policy", "test", "--dir", wrong_arg],
        &[("CLICOLOR_FORCE", "1")],
    )
    .await;
    assert_eq!(forced.status, 1, "{forced}");
    assert!(
        forced
            .stdout
            .contains("\x1b[32mok\x1b[0m   wrong.toml: reading"),
        "{forced:?}"
    );
    assert!(
        forced.stdout.contains("\x1b[31mFAIL\x1b[0m wrong.toml"),
        "{forced:?}"
    );
    // NO_COLOR wins even over CLICOLOR_FORCE.
    let none = ostiary_env(
        &["policy", "test", "--dir", wrong_arg],
        &[("NO_COLOR", "1"), ("CLICOLOR_FORCE", "1")],
    )
    .await;
    assert!(!none.stdout.contains(ESC), "{none}");
}

async fn state_init_prints_the_paths_it_wrote(config: &str, dir: &std::path::Path) {
    let keys = dir.join("keys");
    let init = json_one(
        config,
        &["state", "init", "--dir", &keys.display().to_string()],
        0,
    )
    .await;
    let paths = init["paths"].as_array().expect("paths");
    assert!(paths.len() >= 4, "{init}");
    assert!(paths
        .iter()
        .all(|p| std::path::Path::new(p.as_str().unwrap()).is_file()));
}

/// A server whose policies allow `/echo` on `api.example.test` and hold refunds for an
/// approver, with an allowed and a denied request in its trail.
struct Rig {
    upstream: Upstream,
    server: Server,
    config: String,
}

impl Rig {
    async fn start() -> Self {
        let upstream = Upstream::builder()
            .tls(false)
            .names(&["api.example.test"])
            .start()
            .await;
        let extra = format!("{AUDIT}[approvals]\napprovers = [\"{APPROVER}\"]\n");
        let policies = format!("{POLICY}\n{POLICIES}");
        let server = Server::start_with_files(
            &upstream,
            &["api.example.test"],
            &policies,
            &[("tools.toml", TOOLS)],
            &extra,
            "info",
        )
        .await;
        let config = server.config_arg();
        Rig {
            upstream,
            server,
            config,
        }
    }

    /// A held refund's approval id.
    async fn hold(&self, token: &str, charge: &str) -> String {
        let ca = std::fs::read(self.server.state.join("ca.pem")).unwrap();
        let agent = reqwest::Client::builder()
            .proxy(
                reqwest::Proxy::all(format!("http://agent:{token}@{}", self.server.proxy_addr))
                    .unwrap(),
            )
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .build()
            .unwrap();
        let answer = agent
            .post(self.upstream.url(&format!("/idem/refunds/{charge}")))
            .header("content-type", "application/json")
            .body(refund_body(&[7]))
            .send()
            .await
            .expect("the refund through the proxy");
        assert_eq!(answer.status().as_u16(), 202);
        let body: Value = answer.json().await.unwrap();
        body["approval_id"]
            .as_str()
            .expect("approval_id")
            .to_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_before_or_after_the_subcommand_on_every_command_with_a_result() {
    let rig = Rig::start().await;
    let config = rig.config.clone();
    let server = &rig.server;

    let made = json_both(&config, &["session", "new", "--agent", "demo"], 0).await;
    assert_eq!(made.len(), 1, "{made:#?}");
    assert_eq!(made[0]["agent"], "demo");
    let (id, token) = session(server, "demo").await;
    assert_eq!(
        get(server, &token, &rig.upstream.url("/echo")).await.status,
        200
    );
    assert_eq!(
        get(server, &token, &rig.upstream.url("/forbidden"))
            .await
            .status,
        403
    );
    // Committed a few milliseconds later: everything below reads them.
    let both = |r: &[Value]| {
        ["/echo", "/forbidden"]
            .iter()
            .all(|p| r.iter().any(|r| r["path"] == *p))
    };
    assert!(both(&audit_query(server, &[], both).await));

    let shown = json_one(&config, &["sessions", "show", &id], 0).await;
    assert_eq!(shown["session_id"], id.as_str(), "{shown}");
    assert_eq!(shown["state"], "live", "{shown}");
    let letters = json_one(&config, &["sessions", "dead-letters"], 0).await;
    assert!(letters["dead_letters"].is_array(), "{letters}");
    // A live session is not paused: refused (exit 1), and the JSON says so.
    let resumed = json_one(&config, &["sessions", "resume", &id], 1).await;
    assert_eq!(resumed["session_id"], id.as_str(), "{resumed}");
    assert_eq!(resumed["resumed"], false, "{resumed}");
    assert!(
        resumed["error"]
            .as_str()
            .is_some_and(|e| e.contains("not paused")),
        "{resumed}"
    );
    let unknown = json_one(&config, &["sessions", "show", "no-such-session"], 1).await;
    assert!(unknown["error"].is_string(), "{unknown}");
    for first in [true, false] {
        let (doomed, _) = session(server, "doomed").await;
        let mut args = vec!["--config", config.as_str()];
        let tail = ["sessions", "terminate", &doomed];
        if first {
            args.push("--json");
            args.extend(tail);
        } else {
            args.extend(tail);
            args.push("--json");
        }
        let out = ostiary_env(&args, &[]).await;
        assert!(out.success(), "{out}");
        let expected = serde_json::json!({"session_id": doomed, "terminated": true});
        assert_eq!(documents(&out), [expected]);
    }

    let ca = json_one(&config, &["ca", "export"], 0).await;
    let on_disk = std::fs::read_to_string(server.state.join("ca.pem")).unwrap();
    assert_eq!(ca["pem"], on_disk.as_str());
    let key = json_one(&config, &["audit", "pubkey"], 0).await;
    assert!(
        key["pem"]
            .as_str()
            .is_some_and(|p| p.contains("PUBLIC KEY")),
        "{key}"
    );
    assert!(
        key["key_id"].as_str().is_some_and(|k| !k.is_empty()),
        "{key}"
    );
    let listed = json_one(&config, &["approvals", "list"], 0).await;
    assert!(listed["approvals"].is_array(), "{listed}");
    let doctor = json_one(&config, &["doctor"], 0).await;
    let checks = doctor["checks"].as_array().expect("checks");
    let proxy = checks
        .iter()
        .find(|c| c["name"] == "proxy" && c["status"] == "ok");
    assert!(proxy.is_some(), "{doctor:#}");
    assert!(checks
        .iter()
        .all(|c| ["ok", "warn", "fail"].contains(&c["status"].as_str().unwrap())));

    approvals_decide_with_json(&rig, &token).await;
    records_as_json_lines_and_tables(&rig).await;
    doctor_colours(&config).await;

    let dir = rig.server.stop().await;
    stopped_audit_commands(dir.path()).await;
}

async fn approvals_decide_with_json(rig: &Rig, token: &str) {
    let config = rig.config.as_str();
    let held = rig.hold(token, "ch_json_1").await;
    let shown = json_one(config, &["approvals", "show", &held], 0).await;
    assert_eq!(shown["status"], "pending", "{shown}");
    let link = json_one(config, &["approvals", "link", &held, "--as", APPROVER], 0).await;
    assert!(
        link["link"].as_str().is_some_and(|l| l.starts_with("http")),
        "{link}"
    );

    // Pending is yellow in the list when colour is forced, and plain on a pipe.
    let forced = ostiary_env(
        &["--config", config, "approvals", "list"],
        &[("CLICOLOR_FORCE", "1")],
    )
    .await;
    assert!(
        forced.stdout.contains("\x1b[33mpending  \x1b[0m"),
        "{forced:?}"
    );
    let piped = ostiary_env(&["--config", config, "approvals", "list"], &[]).await;
    assert!(
        piped.stdout.contains("pending") && !piped.stdout.contains(ESC),
        "{piped}"
    );

    // Each decision once: one before the subcommand, one after.
    let approved = ostiary_env(
        &[
            "--config",
            config,
            "--json",
            "approvals",
            "approve",
            &held,
            "--as",
            APPROVER,
        ],
        &[],
    )
    .await;
    assert!(approved.success(), "{approved}");
    let answer = documents(&approved);
    assert_eq!(answer[0]["approval_id"], held.as_str(), "{approved}");
    assert_eq!(answer[0]["status"], "approved", "{approved}");
    let other = rig.hold(token, "ch_json_2").await;
    let denied = ostiary_env(
        &[
            "--config",
            config,
            "approvals",
            "deny",
            &other,
            "--as",
            APPROVER,
            "--json",
        ],
        &[("CLICOLOR_FORCE", "1")],
    )
    .await;
    assert!(denied.success() && !denied.stdout.contains(ESC), "{denied}");
    assert_eq!(documents(&denied)[0]["status"], "denied", "{denied}");
}

async fn records_as_json_lines_and_tables(rig: &Rig) {
    let config = rig.config.as_str();
    // A pipe and no flag: the JSON lines every script (and test) reads.
    let piped = ostiary_env(&["--config", config, "audit", "query"], &[]).await;
    assert!(piped.success() && !piped.stdout.contains(ESC), "{piped}");
    let records = documents(&piped);
    assert!(records
        .iter()
        .any(|r| r["path"] == "/echo" && r["decision"] == "allow"));
    assert_eq!(records.len(), piped.stdout.lines().count());
    let lines = json_both(config, &["audit", "query"], 0).await;
    assert!(
        lines.iter().all(|r| r["decision"].is_string()),
        "{lines:#?}"
    );
    let ocsf = json_both(config, &["audit", "query", "--format", "ocsf"], 0).await;
    assert!(ocsf.iter().all(|e| e["class_uid"].is_number()), "{ocsf:#?}");
    for (args, code) in [
        (&["audit", "query", "--json", "--format", "table"][..], 2),
        (&["audit", "tail", "--json", "--format", "table"], 2),
    ] {
        let mut all = vec!["--config", config];
        all.extend_from_slice(args);
        let out = ostiary_env(&all, &[]).await;
        assert_eq!(out.status, code, "{out}");
        assert!(out.stderr.contains("--json and --format table"), "{out}");
    }
    // One line per group (none until the approved refund has run and been charged).
    let costs = json_both(config, &["audit", "cost"], 0).await;
    assert!(
        costs.iter().all(|c| c["cost_micros"].is_i64()),
        "{costs:#?}"
    );

    // The table on a pipe, asked for: aligned, uncoloured; forced: the decision coloured.
    let table = ostiary_env(
        &["--config", config, "audit", "query", "--format", "table"],
        &[],
    )
    .await;
    assert!(table.success() && !table.stdout.contains(ESC), "{table}");
    let header = table.stdout.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("TIME") && header.contains("DECISION") && header.ends_with("POLICIES"),
        "{table}"
    );
    let echo = table
        .stdout
        .lines()
        .find(|l| l.contains("GET api.example.test /echo"))
        .expect("the /echo row");
    assert!(
        echo.contains("allow")
            && echo.contains(" demo ")
            && echo.contains("200")
            && echo.ends_with("allow-demo-echo"),
        "{table}"
    );
    assert_eq!(echo.find("allow"), header.find("DECISION"), "{table}");
    let forced = ostiary_env(
        &["--config", config, "audit", "query", "--format", "table"],
        &[("CLICOLOR_FORCE", "1")],
    )
    .await;
    assert!(
        forced.stdout.contains("\x1b[32mallow   \x1b[0m"),
        "{forced:?}"
    );
    assert!(
        forced.stdout.contains("\x1b[1m\x1b[31mdeny    \x1b[0m"),
        "{forced:?}"
    );
}

async fn doctor_colours(config: &str) {
    let piped = ostiary_env(&["--config", config, "doctor"], &[]).await;
    assert!(piped.success() && !piped.stdout.contains(ESC), "{piped}");
    assert!(
        piped.stdout.lines().any(|l| l.starts_with("ok    proxy")),
        "{piped}"
    );
    let forced = ostiary_env(&["--config", config, "doctor"], &[("CLICOLOR_FORCE", "1")]).await;
    assert!(forced.success(), "{forced}");
    assert!(
        forced.stdout.contains("\x1b[32mok   \x1b[0m proxy"),
        "{forced:?}"
    );
}

/// With the proxy stopped: verify, export, offline verify, reanchor, siem, the table under a
/// real terminal, and `tail` printing the rows `query` prints.
async fn stopped_audit_commands(dir: &std::path::Path) {
    let state = dir.join("state");
    let config = offline_config(dir, "stopped.toml", "");
    let verified = json_one(&config, &["audit", "verify"], 0).await;
    assert_eq!(verified["ok"], true, "{verified}");
    assert!(
        verified["records"].as_i64() > Some(0) && verified["problems"] == serde_json::json!([])
    );
    let forced = ostiary_env(
        &["--config", &config, "audit", "verify"],
        &[("CLICOLOR_FORCE", "1")],
    )
    .await;
    assert!(
        forced.stdout.starts_with("\x1b[32mok\x1b[0m: "),
        "{forced:?}"
    );
    // Intact: nothing to acknowledge, exit 1 either way.
    let intact = json_one(&config, &["audit", "reanchor", "--reason", "test"], 1).await;
    assert_eq!(intact["reanchored"], false, "{intact}");

    let exported = json_both(&config, &["audit", "export"], 0).await;
    assert!(!exported.is_empty());
    let export = dir.join("export.jsonl");
    let out = ostiary_env(&["--config", &config, "audit", "export"], &[]).await;
    std::fs::write(&export, &out.stdout).unwrap();
    let key = dir.join("audit.pub.pem");
    let out = ostiary_env(&["--config", &config, "audit", "pubkey"], &[]).await;
    std::fs::write(&key, &out.stdout).unwrap();
    let (export_arg, key_arg) = (export.display().to_string(), key.display().to_string());
    let offline = json_one(
        &config,
        &[
            "audit",
            "verify",
            "--offline",
            &export_arg,
            "--pubkey",
            &key_arg,
        ],
        0,
    )
    .await;
    assert_eq!(offline["ok"], true, "{offline}");

    let siem = offline_config(
        dir,
        "siem.toml",
        "[audit.siem]\nurl = \"http://127.0.0.1:9/\"\n",
    );
    let status = json_one(&siem, &["audit", "siem", "status"], 0).await;
    assert!(status["head"].as_i64() > Some(0), "{status}");
    let replay = json_one(&siem, &["audit", "siem", "replay", "--from", "1"], 0).await;
    assert_eq!(replay["from"], 1, "{replay}");

    terminal_table(&config).await;
    tail_prints_the_rows_query_prints(&config).await;

    // The newest record deleted: FAILED, red when forced, the problems in the JSON; then
    // acknowledged.
    let db = rusqlite::Connection::open(state.join("ostiary.db")).unwrap();
    db.execute(
        "DELETE FROM audit WHERE seq = (SELECT max(seq) FROM audit)",
        [],
    )
    .unwrap();
    drop(db);
    let broken = json_one(&config, &["audit", "verify"], 1).await;
    assert_eq!(broken["ok"], false, "{broken}");
    assert!(
        !broken["problems"].as_array().unwrap().is_empty(),
        "{broken}"
    );
    let forced = ostiary_env(
        &["--config", &config, "audit", "verify"],
        &[("CLICOLOR_FORCE", "1")],
    )
    .await;
    assert_eq!(forced.status, 1, "{forced}");
    assert!(
        forced.stdout.starts_with("\x1b[1m\x1b[31mFAILED\x1b[0m: "),
        "{forced:?}"
    );
    let mut args = vec!["--config", config.as_str(), "--json", "audit", "reanchor"];
    args.extend(["--reason", "the test deleted it"]);
    let acknowledged = ostiary_env(&args, &[]).await;
    assert!(acknowledged.success(), "{acknowledged}");
    let done = documents(&acknowledged);
    assert_eq!(done[0]["reanchored"], true, "{acknowledged}");
    assert!(done[0]["seq"].as_i64().is_some(), "{acknowledged}");
}

/// `audit query` under a pseudo-terminal (`script`): a table with its decisions coloured by
/// default; the same table plain under `NO_COLOR=1`.
async fn terminal_table(config: &str) {
    let command = format!(
        "'{}' --config '{config}' audit query",
        ostiary_bin().display()
    );
    let args = ["-qec", command.as_str(), "/dev/null"];
    let term = ("TERM", "xterm-256color");
    let coloured = run("script", &args, &[term]).await;
    assert!(coloured.success(), "{coloured}");
    assert!(
        coloured.stdout.starts_with("TIME "),
        "a table, not JSON:\n{coloured}"
    );
    assert!(
        !coloured.stdout.lines().any(|l| l.starts_with('{')),
        "{coloured}"
    );
    assert!(
        coloured.stdout.contains("\x1b[32mallow   \x1b[0m"),
        "{coloured:?}"
    );
    let plain = run("script", &args, &[term, ("NO_COLOR", "1")]).await;
    assert!(plain.success(), "{plain}");
    assert!(plain.stdout.starts_with("TIME "), "{plain}");
    assert!(
        plain.stdout.contains("GET api.example.test /echo"),
        "{plain}"
    );
    assert!(!plain.stdout.contains(ESC), "{plain:?}");
}

/// `audit tail --since … --format table` prints, row for row, what `query` prints under its
/// header.
async fn tail_prints_the_rows_query_prints(config: &str) {
    let table = ostiary_env(
        &["--config", config, "audit", "query", "--format", "table"],
        &[],
    )
    .await;
    let rows: Vec<&str> = table.stdout.lines().skip(1).collect();
    assert!(!rows.is_empty(), "{table}");
    let mut child = Command::new(ostiary_bin())
        .args([
            "--config", config, "audit", "tail", "--since", "1d", "--format", "table",
        ])
        .env("OSTIARY_LOG", "warn")
        .env_remove("CLICOLOR_FORCE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starting audit tail");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    while seen.len() < rows.len() {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("tail printed only {seen:#?}"))
            .unwrap()
            .unwrap_or_else(|| panic!("tail ended after {seen:#?}"));
        seen.push(line);
    }
    assert_eq!(seen, rows);
    let _ = child.kill().await;
}
