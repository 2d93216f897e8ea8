//! The runtime guides (docs/guides/) run as written: one test per guide reads its markdown,
//! takes every fenced block whose info string carries `guide:<name>` (```` ```python
//! guide:requests ````), and runs it with the real program — `bash`, the venv's `python`,
//! `node` with undici, `go run`, `git` — against the real `ostiary serve` in front of
//! loopback stand-ins for the guides' hosts.
//!
//! Only the environment comes from the test: the session's variables, obtained by running
//! the README's `guide:session` block (`eval "$(ostiary session new …)"`) as written and
//! keeping what it exported; `API_URL`, `OPENAI_BASE_URL`, `MCP_URL`, … naming the stand-ins;
//! and, for the blocks that call `ostiary`, `PATH` and `OSTIARY_CONFIG`. The guides' `cedar`
//! and `toml` blocks marked `guide:` are the proxy's policies, catalog and credentials, with
//! the documentation's host names (`api.example.com`, `api.openai.com`, …) swapped for the
//! stand-ins' (`api.example.test`, `api.openai.test`, …), which the proxy resolves to
//! 127.0.0.1 (`egress.resolve`) — so clients address them by name, as in production, and
//! none of them skips the proxy for a loopback address (Go always would). Nothing leaves
//! loopback: the refused `https://example.net/` of the guides is refused at CONNECT, before
//! any lookup.
//!
//! Each test then checks what really happened — what the upstream received (no
//! `Proxy-Authorization`, the injected credential, one execution after an approval), what
//! the program printed for a denial and a hold — and fails if a marked block of its guide
//! was not run. A human's approval is given with the real CLI (`ostiary approvals approve
//! … --as alice@example.com`) while the block waits.

use crate::support::cli;
use cli::*;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ostiary_e2e::clients::{self, CmdOutput, PyTlsServer};
use ostiary_e2e::pki::TestCa;
use ostiary_e2e::upstream::Upstream;
use serde_json::Value;
use tokio::process::Command;

/// How long one block may run (the approval blocks wait for the CLI's approval).
const BLOCK_TIMEOUT: Duration = Duration::from_secs(90);

/// The approver the test's proxy lists, who approves from the CLI.
const APPROVER: &str = "alice@example.com";

/// Worthless stand-ins for the real API keys the broker holds.
const OPENAI_SECRET: &str = "sk-guide-openai-0123456789abcdef";
const ANTHROPIC_SECRET: &str = "sk-ant-guide-0123456789abcdef";

// ------------------------------------------------------------------ the guides' blocks

/// One fenced block marked `guide:<name>`.
#[derive(Debug, Clone)]
struct Block {
    lang: String,
    name: String,
    code: String,
}

/// A guide's marked blocks; every one must be taken by the test ([`Guide::all_taken`]).
struct Guide {
    file: &'static str,
    blocks: Vec<Block>,
    taken: RefCell<BTreeSet<String>>,
}

impl Guide {
    fn load(file: &'static str) -> Self {
        let path = workspace_root().join("docs/guides").join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let blocks = parse_blocks(&text);
        let mut names = BTreeSet::new();
        for b in &blocks {
            assert!(
                names.insert(b.name.clone()),
                "{file}: two blocks named guide:{}",
                b.name
            );
        }
        Self {
            file,
            blocks,
            taken: RefCell::default(),
        }
    }

    /// The code of block `name`, as written.
    fn block(&self, name: &str) -> Block {
        let block = self
            .blocks
            .iter()
            .find(|b| b.name == name)
            .unwrap_or_else(|| {
                panic!(
                    "{}: no block marked guide:{name} (found {:?})",
                    self.file,
                    self.blocks.iter().map(|b| &b.name).collect::<Vec<_>>()
                )
            })
            .clone();
        self.taken.borrow_mut().insert(name.to_owned());
        block
    }

    /// Every marked block was taken: a new runnable block needs a test.
    fn all_taken(&self) {
        let taken = self.taken.borrow();
        let left: Vec<&str> = self
            .blocks
            .iter()
            .map(|b| b.name.as_str())
            .filter(|n| !taken.contains(*n))
            .collect();
        assert!(
            left.is_empty(),
            "{}: blocks marked guide: that no test runs: {left:?}",
            self.file
        );
    }
}

/// Fenced blocks whose info string has a `guide:<name>` word after the language.
fn parse_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, Option<String>, Vec<&str>)> = None;
    for line in text.lines() {
        match open.as_mut() {
            None => {
                if let Some(info) = line.strip_prefix("```") {
                    let mut words = info.split_whitespace();
                    let lang = words.next().unwrap_or_default().to_owned();
                    let name = words
                        .find_map(|w| w.strip_prefix("guide:"))
                        .map(str::to_owned);
                    open = Some((lang, name, Vec::new()));
                }
            }
            Some((lang, name, lines)) => {
                if line.trim_end() == "```" {
                    if let Some(name) = name.take() {
                        let mut code = lines.join("\n");
                        code.push('\n');
                        blocks.push(Block {
                            lang: std::mem::take(lang),
                            name,
                            code,
                        });
                    }
                    open = None;
                } else {
                    lines.push(line);
                }
            }
        }
    }
    assert!(open.is_none(), "an unclosed code fence");
    blocks
}

/// The documentation's host names swapped for the loopback stand-ins'.
fn for_test(text: &str) -> String {
    [
        ("api.example.com", "api.example.test"),
        ("files.example.com", "files.example.test"),
        ("git.example.com", "git.example.test"),
        ("api.openai.com", "api.openai.test"),
        ("api.anthropic.com", "api.anthropic.test"),
    ]
    .iter()
    .fold(text.to_owned(), |t, (doc, test)| t.replace(doc, test))
}

// ------------------------------------------------------------------ the proxy

/// What the proxy of one guide's test is given.
struct ProxySetup<'a> {
    /// Trusted for upstream TLS (`egress.ca_file`).
    upstream_ca: &'a TestCa,
    /// The stand-ins' ports (`egress.ports`).
    ports: Vec<u16>,
    /// Names resolved to 127.0.0.1.
    names: &'a [&'a str],
    /// Cedar files: the README's policy and the guide's.
    policies: Vec<(&'static str, String)>,
    /// The catalog: the README's tools and the guide's.
    tools: String,
    /// Config appended (credentials).
    extra_toml: String,
}

/// `ostiary serve` on free loopback ports with the guide's policies, an approver, and a file
/// broker holding the stand-in API keys.
async fn start_proxy(setup: ProxySetup<'_>) -> Server {
    let mut dir = tempfile::tempdir().unwrap();
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    for (name, text) in &setup.policies {
        std::fs::write(policies.join(name), text).unwrap();
    }
    std::fs::write(policies.join("tools.toml"), &setup.tools).unwrap();
    let ca_file = setup.upstream_ca.write_ca(dir.path());
    let secrets = dir.path().join("secrets.toml");
    std::fs::write(
        &secrets,
        format!("openai = \"{OPENAI_SECRET}\"\nanthropic = \"{ANTHROPIC_SECRET}\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600)).unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("ostiary.toml");
    let log = dir.path().join("serve.log");
    let resolve: Vec<String> = setup
        .names
        .iter()
        .map(|n| format!("\"{n}\" = \"127.0.0.1\""))
        .collect();
    let ports: Vec<String> = setup.ports.iter().map(u16::to_string).collect();
    let mut last_log = String::new();
    for _attempt in 0..3 {
        let proxy_addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let control_addr: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let text = format!(
            r#"
[listen]
proxy = "{proxy_addr}"
control = "{control_addr}"

[state]
dir = "{state}"

[policy]
dir = "{policies}"

[egress]
ports = [80, 443, {ports}]
allow_private = ["127.0.0.1/32"]
resolve = {{ {resolve} }}
ca_file = "{ca_file}"

[approvals]
approvers = ["{APPROVER}"]
tick = "100ms"

[broker]
backend = "file"
file = "{secrets}"

{extra}
"#,
            state = state.display(),
            policies = policies.display(),
            ports = ports.join(", "),
            resolve = resolve.join(", "),
            ca_file = ca_file.display(),
            secrets = secrets.display(),
            extra = setup.extra_toml,
        );
        std::fs::write(&config, text).unwrap();
        let child = spawn_serve(Some(&config), None, &log, "warn");
        let mut server = Server {
            child,
            dir,
            config: config.clone(),
            state: state.clone(),
            proxy_addr,
            control_addr,
            log: log.clone(),
        };
        match server.wait_healthy(control_addr).await {
            Ok(()) => return server,
            Err(text) => {
                last_log = text;
                let _ = server.child.kill().await;
                if !last_log.contains("binding") {
                    break;
                }
                dir = server.dir;
            }
        }
    }
    panic!("ostiary serve did not become healthy:\n{last_log}");
}

/// The README's policy and catalog, plus the guide's (each with the stand-ins' names).
fn policies_and_tools(guide: Option<&Guide>) -> (Vec<(&'static str, String)>, String) {
    let index = Guide::load("README.md");
    let mut policies = vec![("guides.cedar", for_test(&index.block("policy").code))];
    let mut tools = for_test(&index.block("tools").code);
    if let Some(guide) = guide {
        if guide.blocks.iter().any(|b| b.name == "policy") {
            policies.push(("guide.cedar", for_test(&guide.block("policy").code)));
        }
        if guide.blocks.iter().any(|b| b.name == "tools") {
            tools.push('\n');
            tools.push_str(&for_test(&guide.block("tools").code));
        }
    }
    (policies, tools)
}

// ------------------------------------------------------------------ running blocks

/// The directory holding the `ostiary` binary, first on `PATH`.
fn path_with_ostiary() -> String {
    let bin = ostiary_bin().parent().expect("the binary's directory");
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// What the README's `guide:session` block exports, run as written by bash with `ostiary`
/// on `PATH` and `OSTIARY_CONFIG` naming the test's proxy: the variables that differ after it.
async fn session_env(server: &Server, work: &Path) -> Vec<(String, String)> {
    let index = Guide::load("README.md");
    let block = index.block("session");
    assert_eq!(block.lang, "sh");
    index.all_taken_but(&["policy", "tools"]);
    let script = format!(
        "env > \"$1/before.env\"\n{}\nenv > \"$1/after.env\"\n",
        block.code
    );
    let out = run_in(
        work,
        "bash",
        &["-c", &script, "_", &work.display().to_string()],
        &ostiary_env(server),
    )
    .await;
    assert!(out.success(), "the session block failed:\n{out}");
    let read = |name: &str| parse_env(&std::fs::read_to_string(work.join(name)).unwrap());
    let (before, after) = (read("before.env"), read("after.env"));
    let env: Vec<(String, String)> = after
        .into_iter()
        .filter(|(k, v)| k != "_" && before.get(k) != Some(v))
        .collect();
    let names: BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let proxy = names.get("HTTPS_PROXY").copied().unwrap_or_default();
    assert!(
        proxy.starts_with("http://agent:") && proxy.ends_with(&format!("@{}", server.proxy_addr)),
        "HTTPS_PROXY is the proxy URL with the token: {env:?}"
    );
    for name in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_CAINFO",
        "OSTIARY_SESSION_ID",
    ] {
        assert!(names.contains_key(name), "{name} not exported: {env:?}");
    }
    env
}

/// `PATH` with `ostiary` on it and `OSTIARY_CONFIG` naming the test's proxy.
fn ostiary_env(server: &Server) -> Vec<(String, String)> {
    vec![
        ("PATH".into(), path_with_ostiary()),
        ("OSTIARY_CONFIG".into(), server.config_arg()),
        ("OSTIARY_LOG".into(), "warn".into()),
    ]
}

impl Guide {
    /// Like [`Guide::all_taken`] for the README, whose policy and catalog blocks are taken
    /// by [`policies_and_tools`] from another copy.
    fn all_taken_but(&self, others: &[&str]) {
        for name in others {
            self.taken.borrow_mut().insert((*name).to_owned());
        }
        self.all_taken();
    }
}

/// Runs `program args` in `dir` with the proxy and CA variables of the machine scrubbed
/// (as [`clients::run`] does) and `env` added; killed after [`BLOCK_TIMEOUT`].
async fn run_in(dir: &Path, program: &str, args: &[&str], env: &[(String, String)]) -> CmdOutput {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for name in clients::SCRUBBED_ENV {
        cmd.env_remove(name);
    }
    for name in [
        "OSTIARY_CONFIG",
        "OSTIARY_ADMIN_TOKEN",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
    ] {
        cmd.env_remove(name);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program}: {e} (scripts/test.sh installs it)"));
    match tokio::time::timeout(BLOCK_TIMEOUT, child.wait_with_output()).await {
        Ok(Ok(out)) => CmdOutput {
            status: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Ok(Err(e)) => panic!("waiting for {program}: {e}"),
        Err(_) => CmdOutput {
            status: -1,
            stdout: String::new(),
            stderr: format!("{program} timed out after {BLOCK_TIMEOUT:?} and was killed"),
        },
    }
}

/// Writes `block` to a file in `dir` and runs it with the program for its language.
async fn run_block(dir: &Path, block: &Block, env: &[(String, String)]) -> CmdOutput {
    let mut env = env.to_vec();
    // Named so that no file shadows a module the block imports (`requests.py`).
    let stem = format!("guide_{}", block.name.replace('-', "_"));
    let out = match block.lang.as_str() {
        "sh" | "bash" => {
            let file = write(dir, &format!("{stem}.sh"), &block.code);
            run_in(dir, "bash", &[&file], &env).await
        }
        "python" => {
            let file = write(dir, &format!("{stem}.py"), &block.code);
            env.push(("PYTHONUNBUFFERED".into(), "1".into()));
            env.push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
            let python = clients::python_bin().display().to_string();
            run_in(dir, &python, &[&file], &env).await
        }
        "js" => {
            // As a user's project has it: the script beside a node_modules with undici.
            let link = dir.join("node_modules");
            if !link.exists() {
                std::os::unix::fs::symlink(node_modules(), &link).unwrap();
            }
            let file = write(dir, &format!("{stem}.mjs"), &block.code);
            run_in(dir, "node", &[&file], &env).await
        }
        "go" => {
            let pkg = dir.join(&block.name);
            std::fs::create_dir_all(&pkg).unwrap();
            write(&pkg, "main.go", &block.code);
            run_in(&pkg, "go", &["run", "main.go"], &env).await
        }
        other => panic!(
            "guide:{} is a {other:?} block; no runner for it",
            block.name
        ),
    };
    eprintln!("--- guide:{} ---\n{out}", block.name);
    out
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// undici, installed by scripts/test.sh (`$OSTIARY_TEST_NODE_MODULES`, else the venv's).
fn node_modules() -> PathBuf {
    let dir = std::env::var_os("OSTIARY_TEST_NODE_MODULES")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/node/node_modules"));
    assert!(
        dir.join("undici/package.json").is_file(),
        "undici is not installed in {} (bash scripts/test.sh --setup-only installs it)",
        dir.display()
    );
    dir
}

/// The human: waits for a pending approval, approves it with the CLI, returns its id.
async fn approve_when_pending(server: &Server) -> String {
    let config = server.config_arg();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = ostiary(&["--config", &config, "approvals", "list", "--json"]).await;
        assert!(out.success(), "{out}");
        let listed: Value =
            serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
        if let Some(id) = listed["approvals"][0]["approval_id"].as_str() {
            let approved = ostiary(&[
                "--config",
                &config,
                "approvals",
                "approve",
                id,
                "--as",
                APPROVER,
            ])
            .await;
            assert!(approved.success(), "{approved}");
            return id.to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing was held for approval within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `block` while the human approves what it holds; returns its output and the id.
async fn run_with_approval(
    server: &Server,
    dir: &Path,
    block: &Block,
    env: &[(String, String)],
) -> (CmdOutput, String) {
    tokio::join!(run_block(dir, block, env), approve_when_pending(server))
}

/// `env` plus `(name, value)` pairs.
fn with(env: &[(String, String)], more: &[(&str, String)]) -> Vec<(String, String)> {
    let mut all = env.to_vec();
    all.extend(more.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    all
}

/// The stdout lines starting with `prefix`.
fn line<'a>(out: &'a CmdOutput, prefix: &str) -> &'a str {
    out.stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?}:\n{out}"))
}

/// The `/echo` requests the upstream received, each checked for a clean forward.
fn echoes(upstream: &Upstream, query: &str) -> usize {
    let seen: Vec<_> = upstream
        .seen_path("/echo")
        .into_iter()
        .filter(|s| s.path.ends_with(query))
        .collect();
    for s in &seen {
        assert!(
            s.header("proxy-authorization").is_none(),
            "the session token reached the upstream: {s:?}"
        );
        assert_eq!(s.sni.as_deref(), Some("api.example.test"), "{s:?}");
    }
    seen.len()
}

/// An upstream for `api.example.test` and the proxy with the README's policy.
async fn example_api(guide: Option<&Guide>) -> (Upstream, Server, tempfile::TempDir) {
    let upstream = Upstream::builder()
        .names(&["api.example.test"])
        .start()
        .await;
    let (policies, tools) = policies_and_tools(guide);
    let server = start_proxy(ProxySetup {
        upstream_ca: upstream.ca(),
        ports: vec![upstream.port()],
        names: &["api.example.test"],
        policies,
        tools,
        extra_toml: String::new(),
    })
    .await;
    (upstream, server, tempfile::tempdir().unwrap())
}

// ------------------------------------------------------------------ the guides

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_guide_runs() {
    let guide = Guide::load("shell.md");
    let (upstream, server, work) = example_api(Some(&guide)).await;
    let session = session_env(&server, work.path()).await;
    let api = [(
        "API_URL",
        format!("https://api.example.test:{}", upstream.port()),
    )];

    let out = run_block(work.path(), &guide.block("curl"), &with(&session, &api)).await;
    assert!(out.success(), "{out}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    let echo: Value = serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}:\n{out}"));
    assert_eq!(echo["query"], "from=shell", "{out}");
    assert!(
        echo["headers"].get("proxy-authorization").is_none(),
        "{out}"
    );
    let denied: Value = serde_json::from_str(lines[1]).unwrap_or_else(|e| panic!("{e}:\n{out}"));
    assert_eq!(denied["error"], "denied", "{out}");
    assert_eq!(
        denied["policies"],
        serde_json::json!(["example-api-no-deletes"])
    );
    assert_eq!(lines[2], "status 403", "{out}");
    assert!(
        out.stderr.contains("CONNECT tunnel failed, response 403"),
        "{out}"
    );
    assert_eq!(line(&out, "curl exit"), "curl exit 56", "{out}");
    assert_eq!(echoes(&upstream, "?from=shell"), 1);
    assert_eq!(upstream.seen().len(), 1, "the DELETE was not forwarded");

    let (out, id) = run_with_approval(
        &server,
        work.path(),
        &guide.block("approval"),
        &with(&session, &api),
    )
    .await;
    assert!(out.success(), "{out}");
    let held = line(&out, "status 202: ");
    let held: Value = serde_json::from_str(&held["status 202: ".len()..]).unwrap();
    assert_eq!(held["error"], "approval_pending");
    assert_eq!(held["approval_id"], id.as_str());
    assert_eq!(
        line(&out, "status 201: "),
        "status 201: {\"stored\":1}",
        "{out}"
    );
    let stored = upstream.messages();
    assert_eq!(stored.len(), 1, "sent once: {stored:?}");
    assert_eq!(
        stored[0]["body"],
        "{\"to\": \"ops\", \"text\": \"deploy finished\"}"
    );

    // `ostiary run` makes a session of its own: only PATH, the config and API_URL given.
    let env = with(&ostiary_env(&server), &api);
    let out = run_block(work.path(), &guide.block("run"), &env).await;
    assert!(out.success(), "{out}");
    let echo: Value = serde_json::from_str(line(&out, "{")).unwrap();
    assert_eq!(echo["query"], "from=run", "{out}");
    assert_eq!(line(&out, "exit "), "exit 0", "{out}");
    assert_eq!(echoes(&upstream, "?from=run"), 1);
    guide.all_taken();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_requests_httpx_guide_runs() {
    let guide = Guide::load("python-requests-httpx.md");
    let (upstream, server, work) = example_api(Some(&guide)).await;
    let session = session_env(&server, work.path()).await;
    let env = with(
        &session,
        &[(
            "API_URL",
            format!("https://api.example.test:{}", upstream.port()),
        )],
    );

    let out = run_block(work.path(), &guide.block("requests"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(line(&out, "allowed"), "allowed 200 None", "{out}");
    assert_eq!(
        line(&out, "denied"),
        "denied 403 denied ['example-api-no-deletes']",
        "{out}"
    );
    assert_eq!(line(&out, "refused"), "refused at CONNECT: True", "{out}");
    assert_eq!(echoes(&upstream, "?from=requests"), 1);
    let ua = upstream.seen_path("/echo")[0]
        .header("user-agent")
        .unwrap_or_default()
        .to_owned();
    assert!(ua.starts_with("python-requests/"), "{ua}");

    let (out, id) = run_with_approval(
        &server,
        work.path(),
        &guide.block("requests-approval"),
        &env,
    )
    .await;
    assert!(out.success(), "{out}");
    assert!(
        line(&out, "held").starts_with(&format!("held approval_pending {id} http://")),
        "{out}"
    );
    assert_eq!(line(&out, "answer"), "answer 201 {'stored': 1}", "{out}");
    assert_eq!(upstream.messages().len(), 1, "sent once");

    let out = run_block(work.path(), &guide.block("httpx"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(line(&out, "allowed"), "allowed 200 None", "{out}");
    assert_eq!(
        line(&out, "denied"),
        "denied 403 True ['example-api-no-deletes']",
        "{out}"
    );
    assert!(
        line(&out, "held").starts_with("held 202 approval_pending apr_"),
        "{out}"
    );
    assert_eq!(
        line(&out, "refused"),
        "refused at CONNECT: 403 Forbidden",
        "{out}"
    );
    assert_eq!(echoes(&upstream, "?from=httpx"), 1);
    assert_eq!(upstream.messages().len(), 1, "the held one is not sent");
    guide.all_taken();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_anthropic_guide_runs() {
    let guide = Guide::load("openai-anthropic.md");
    let names = ["api.openai.test", "api.anthropic.test"];
    let upstream = Upstream::builder().names(&names).start().await;
    let (policies, tools) = policies_and_tools(Some(&guide));
    let server = start_proxy(ProxySetup {
        upstream_ca: upstream.ca(),
        ports: vec![upstream.port()],
        names: &names,
        policies,
        tools,
        extra_toml: for_test(&guide.block("credentials").code),
    })
    .await;
    let work = tempfile::tempdir().unwrap();
    let session = session_env(&server, work.path()).await;
    let placeholders: BTreeMap<_, _> = session.iter().cloned().collect();
    assert_eq!(
        placeholders.get("OPENAI_API_KEY").map(String::as_str),
        Some("ostiary:openai")
    );
    assert_eq!(
        placeholders.get("ANTHROPIC_API_KEY").map(String::as_str),
        Some("ostiary:anthropic")
    );
    let port = upstream.port();

    let env = with(
        &session,
        &[(
            "OPENAI_BASE_URL",
            format!("https://api.openai.test:{port}/v1"),
        )],
    );
    let out = run_block(work.path(), &guide.block("openai"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(
        line(&out, "allowed"),
        "allowed Hello from the stand-in.",
        "{out}"
    );
    assert_eq!(
        line(&out, "denied"),
        "denied 403 denied ['llm-no-preview-models']",
        "{out}"
    );
    let chats = upstream.seen_path("/v1/chat/completions");
    assert_eq!(chats.len(), 1, "the denied call was not forwarded");
    assert_eq!(
        chats[0].header("authorization"),
        Some(format!("Bearer {OPENAI_SECRET}").as_str()),
        "the proxy wrote the real key over the placeholder"
    );
    assert_eq!(chats[0].sni.as_deref(), Some("api.openai.test"));

    let env = with(
        &session,
        &[(
            "ANTHROPIC_BASE_URL",
            format!("https://api.anthropic.test:{port}"),
        )],
    );
    let (out, id) = run_with_approval(&server, work.path(), &guide.block("anthropic"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(
        line(&out, "allowed"),
        "allowed Hello from the stand-in.",
        "{out}"
    );
    assert_eq!(
        line(&out, "held"),
        format!("held approval_pending {id}"),
        "{out}"
    );
    assert_eq!(
        line(&out, "approved"),
        "approved Hello from the stand-in.",
        "{out}"
    );
    let messages = upstream.seen_path("/v1/messages");
    assert_eq!(
        messages.len(),
        2,
        "haiku, then opus once after the approval"
    );
    for m in &messages {
        assert_eq!(
            m.header("authorization"),
            Some(format!("Bearer {ANTHROPIC_SECRET}").as_str()),
            "{m:?}"
        );
        assert!(m.header("proxy-authorization").is_none());
    }
    assert!(!out.stdout.contains(OPENAI_SECRET) && !out.stdout.contains(ANTHROPIC_SECRET));
    guide.all_taken();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_guide_runs() {
    let guide = Guide::load("mcp.md");
    let ca = TestCa::new();
    let mcp = PyTlsServer::start(&ca, &["files.example.test"], "mcp_server.py", |_| {
        Vec::new()
    })
    .await;
    let url = format!("https://files.example.test:{}/mcp", mcp.port);
    let (policies, tools) = policies_and_tools(Some(&guide));
    let tools = tools.replace("https://files.example.test/mcp", &url);
    let server = start_proxy(ProxySetup {
        upstream_ca: &ca,
        ports: vec![mcp.port],
        names: &["files.example.test"],
        policies,
        tools,
        extra_toml: String::new(),
    })
    .await;
    let work = tempfile::tempdir().unwrap();
    let session = session_env(&server, work.path()).await;
    let out = run_block(
        work.path(),
        &guide.block("client"),
        &with(&session, &[("MCP_URL", url)]),
    )
    .await;
    assert!(out.success(), "{out}");
    assert_eq!(
        line(&out, "tools"),
        "tools ['delete_file', 'read_file']",
        "{out}"
    );
    assert_eq!(line(&out, "read_file"), "read_file hello", "{out}");
    assert_eq!(
        line(&out, "write_file"),
        "write_file -32001 denied ['files-no-writes']",
        "{out}"
    );
    assert!(
        line(&out, "delete_file").starts_with("delete_file -32002 approval_pending apr_"),
        "{out}"
    );
    let records = audit_query(&server, &["--decision", "deny"], |r| !r.is_empty()).await;
    assert!(
        records
            .iter()
            .any(|r| r["policies"] == serde_json::json!(["files-no-writes"])),
        "{records:#?}"
    );
    guide.all_taken();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_guide_runs() {
    let guide = Guide::load("node.md");
    let (upstream, server, work) = example_api(Some(&guide)).await;
    let session = session_env(&server, work.path()).await;
    let env = with(
        &session,
        &[(
            "API_URL",
            format!("https://api.example.test:{}", upstream.port()),
        )],
    );

    let out = run_block(work.path(), &guide.block("env-proxy-agent"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(
        line(&out, "allowed"),
        "allowed 200 (no proxy-authorization)",
        "{out}"
    );
    assert_eq!(
        line(&out, "denied"),
        "denied 403 denied [ 'example-api-no-deletes' ]",
        "{out}"
    );
    assert!(
        line(&out, "held").starts_with("held 202 approval_pending apr_"),
        "{out}"
    );
    assert_eq!(
        line(&out, "refused"),
        "refused at CONNECT: Proxy response (403) !== 200 when HTTP Tunneling",
        "{out}"
    );
    assert_eq!(echoes(&upstream, "?from=node"), 1);

    let out = run_block(work.path(), &guide.block("proxy-agent"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(
        line(&out, "allowed"),
        "allowed 200 from=proxy-agent",
        "{out}"
    );
    assert_eq!(echoes(&upstream, "?from=proxy-agent"), 1);
    assert_eq!(upstream.messages().len(), 0, "the held one is not sent");
    guide.all_taken();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_guide_runs() {
    let guide = Guide::load("go.md");
    let (upstream, server, work) = example_api(Some(&guide)).await;
    let session = session_env(&server, work.path()).await;
    let env = with(
        &session,
        &[(
            "API_URL",
            format!("https://api.example.test:{}", upstream.port()),
        )],
    );

    let out = run_block(work.path(), &guide.block("net-http"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(line(&out, "allowed"), "allowed 200 true", "{out}");
    assert_eq!(
        line(&out, "denied"),
        "denied 403 denied [example-api-no-deletes]",
        "{out}"
    );
    assert_eq!(
        line(&out, "held"),
        "held 202 approval_pending true",
        "{out}"
    );
    assert_eq!(
        line(&out, "refused"),
        "refused at CONNECT: Get \"https://example.net/\": Forbidden",
        "{out}"
    );
    assert_eq!(echoes(&upstream, "?from=go"), 1);
    let ua = upstream.seen_path("/echo")[0]
        .header("user-agent")
        .unwrap_or_default()
        .to_owned();
    assert!(ua.starts_with("Go-http-client/"), "{ua}");

    let out = run_block(work.path(), &guide.block("transport"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(line(&out, "allowed"), "allowed 200", "{out}");
    assert_eq!(echoes(&upstream, "?from=go-transport"), 1);
    guide.all_taken();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_guide_runs() {
    let guide = Guide::load("git.md");
    let repos = tempfile::tempdir().unwrap();
    make_repository(&repos.path().join("acme/widgets.git")).await;
    let upstream = Upstream::builder()
        .names(&["git.example.test"])
        .git_root(repos.path())
        .start()
        .await;
    let (policies, tools) = policies_and_tools(Some(&guide));
    let server = start_proxy(ProxySetup {
        upstream_ca: upstream.ca(),
        ports: vec![upstream.port()],
        names: &["git.example.test"],
        policies,
        tools,
        extra_toml: String::new(),
    })
    .await;
    let work = tempfile::tempdir().unwrap();
    let session = session_env(&server, work.path()).await;
    let repo_url = format!(
        "https://git.example.test:{}/git/acme/widgets.git",
        upstream.port()
    );
    let env = with(&session, &[("REPO_URL", repo_url.clone())]);

    let out = run_block(work.path(), &guide.block("clone"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(line(&out, "cloned"), "cloned first commit", "{out}");
    assert_eq!(line(&out, "<sha>"), "<sha>\trefs/heads/main", "{out}");
    assert!(work.path().join("widgets/README").is_file(), "{out}");

    let out = run_block(work.path(), &guide.block("config"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.trim(), "1", "{out}");

    let out = run_block(work.path(), &guide.block("push"), &env).await;
    assert!(out.success(), "{out}");
    assert!(
        out.stdout.contains(&format!(
            "fatal: unable to access '{repo_url}/': The requested URL returned error: 403"
        )),
        "{out}"
    );
    assert_eq!(
        line(&out, "push refused"),
        "push refused (exit 128)",
        "{out}"
    );

    let seen = upstream.seen();
    assert!(
        seen.iter()
            .any(|s| s.path.ends_with("/info/refs?service=git-upload-pack")),
        "{seen:?}"
    );
    assert!(seen
        .iter()
        .any(|s| s.method == "POST" && s.path.ends_with("/git-upload-pack")));
    assert!(
        seen.iter()
            .all(|s| !s.path.contains("receive-pack") && s.header("proxy-authorization").is_none()),
        "nothing of the push reached the upstream: {seen:?}"
    );
    let denies = audit_query(&server, &["--decision", "deny"], |r| !r.is_empty()).await;
    assert!(
        denies
            .iter()
            .any(|r| r["policies"] == serde_json::json!(["git-no-push"])),
        "{denies:#?}"
    );
    guide.all_taken();
    server.stop().await;
}

/// A bare repository at `bare` with one commit (`first commit`, a README) on `main`.
async fn make_repository(bare: &Path) {
    let src = tempfile::tempdir().unwrap();
    let src_path = src.path().display().to_string();
    let bare_path = bare.display().to_string();
    let git = |args: Vec<String>| async move {
        let env = [
            ("GIT_AUTHOR_NAME".to_owned(), "guide".to_owned()),
            (
                "GIT_AUTHOR_EMAIL".to_owned(),
                "guide@example.test".to_owned(),
            ),
            ("GIT_COMMITTER_NAME".to_owned(), "guide".to_owned()),
            (
                "GIT_COMMITTER_EMAIL".to_owned(),
                "guide@example.test".to_owned(),
            ),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_in(Path::new("/"), "git", &args, &env).await;
        assert!(out.success(), "git {args:?}:\n{out}");
    };
    let s = |v: &[&str]| v.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    git(s(&[
        "init",
        "--quiet",
        "--bare",
        "--initial-branch=main",
        &bare_path,
    ]))
    .await;
    git(s(&["init", "--quiet", "--initial-branch=main", &src_path])).await;
    std::fs::write(src.path().join("README"), "widgets\n").unwrap();
    git(s(&["-C", &src_path, "add", "README"])).await;
    git(s(&[
        "-C",
        &src_path,
        "commit",
        "--quiet",
        "-m",
        "first commit",
    ]))
    .await;
    git(s(&["-C", &src_path, "push", "--quiet", &bare_path, "main"])).await;
}

#[test]
fn blocks_are_found_by_their_marker() {
    let text = "intro\n```python guide:one\nprint(1)\n```\n```sh\nnot marked\n```\n```go x guide:two\npackage main\n\n```\n";
    let blocks = parse_blocks(text);
    assert_eq!(blocks.len(), 2);
    assert_eq!(
        (blocks[0].lang.as_str(), blocks[0].name.as_str()),
        ("python", "one")
    );
    assert_eq!(blocks[0].code, "print(1)\n");
    assert_eq!(
        (blocks[1].lang.as_str(), blocks[1].name.as_str()),
        ("go", "two")
    );
    assert_eq!(blocks[1].code, "package main\n\n");
}
