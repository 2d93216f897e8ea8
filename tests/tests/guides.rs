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
/// `API_URL`, naming the example API's stand-in as the guides' blocks expect it.
fn api_url(upstream: &Upstream) -> (&'static str, String) {
    (
        "API_URL",
        format!("https://api.example.test:{}", upstream.port()),
    )
}

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

// The guides themselves, one test each.
mod runs;

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
