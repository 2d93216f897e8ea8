//! Real client programs (curl, Python `requests`/`httpx`/`websockets`) run as subprocesses.
//!
//! Ostiary's users never call it through our own Rust client: agent runtimes set
//! `HTTPS_PROXY` and a CA bundle and then use curl, requests, httpx, Go's net/http...
//! Each of those has its own idea of proxy auth, CONNECT, ALPN and CA loading, so the
//! end-to-end tests drive the real programs and assert on what they print.
//!
//! Every helper is async (a blocking wait would freeze a current-thread test runtime
//! that is also serving the upstream and the proxy), starts the program with proxy and
//! CA variables scrubbed from the inherited environment (so the machine's settings cannot
//! leak into a test; the test passes the ones it means), closes stdin, and kills the
//! child if it outlives [`CLIENT_TIMEOUT`].
//!
//! The Python scripts live in `tests/clients/` and print one JSON line; see
//! [`client_script`].

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// How long a client may run before it is killed and reported as timed out.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

/// Environment variables removed from every child before the test's own are applied.
pub const SCRUBBED_ENV: &[&str] = &[
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "no_proxy",
    "NO_PROXY",
    "wss_proxy",
    "ws_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "OSTIARY_HTTP2",
    "CURL_HOME",
];

/// What a finished client printed.
#[derive(Debug, Clone)]
pub struct CmdOutput {
    /// Exit code; `-1` when the program was killed by a signal or by the timeout.
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

impl CmdOutput {
    pub fn success(&self) -> bool {
        self.status == 0
    }

    /// The last non-empty line of stdout parsed as JSON (the Python clients print one
    /// line; curl with `-w '%{json}'` does too). Panics with the whole output if it is
    /// not JSON, since the test cannot go on without it.
    pub fn json(&self) -> serde_json::Value {
        let line = self
            .stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_default();
        serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("client output is not JSON ({e}):\n{self}"))
    }
}

impl fmt::Display for CmdOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "exit status {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Runs `curl -q -sS <args>`: `-q` first so a `~/.curlrc` cannot change the request,
/// `-sS` so stderr carries errors but no progress meter. Add `-v`, `-w`, `-o` as needed.
pub async fn curl(args: &[&str], env: &[(&str, &str)]) -> CmdOutput {
    let mut all = vec!["-q", "-sS"];
    all.extend_from_slice(args);
    run("curl", &all, env, CLIENT_TIMEOUT).await
}

/// Runs `script` (a path, e.g. from [`client_script`]) with [`python_bin`].
pub async fn python(script: impl AsRef<Path>, args: &[&str], env: &[(&str, &str)]) -> CmdOutput {
    let script = script.as_ref();
    assert!(
        script.is_file(),
        "python client script {} does not exist",
        script.display()
    );
    let mut all: Vec<&OsStr> = vec![script.as_os_str()];
    all.extend(args.iter().map(OsStr::new));
    // Unbuffered so a killed client still shows what it printed; no .pyc in the tree.
    let mut env = env.to_vec();
    env.push(("PYTHONUNBUFFERED", "1"));
    env.push(("PYTHONDONTWRITEBYTECODE", "1"));
    run(python_bin(), &all, &env, CLIENT_TIMEOUT).await
}

/// The Python interpreter that has the clients' packages: `$OSTIARY_TEST_PYTHON` (set by
/// `scripts/test.sh`), else the workspace's `.venv/bin/python`, else `python3` on PATH.
pub fn python_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("OSTIARY_TEST_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    if venv.is_file() {
        return venv;
    }
    PathBuf::from("python3")
}

/// Path of a client script shipped in `tests/clients/` (e.g. `"py_requests.py"`).
pub fn client_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("clients")
        .join(name)
}

/// Runs any program the same way as the helpers above: scrubbed environment plus `env`,
/// no stdin, killed after `timeout`. Panics if the program cannot be started at all, with
/// a message naming it: a missing client is a broken test machine, never a skip.
pub async fn run<P, A>(program: P, args: &[A], env: &[(&str, &str)], timeout: Duration) -> CmdOutput
where
    P: AsRef<OsStr>,
    A: AsRef<OsStr>,
{
    let program = program.as_ref();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for name in SCRUBBED_ENV {
        cmd.env_remove(name);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().unwrap_or_else(|e| {
        panic!(
            "cannot start {}: {e} (scripts/test.sh installs the test clients)",
            program.to_string_lossy()
        )
    });
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(out)) => CmdOutput {
            status: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Ok(Err(e)) => panic!("waiting for {}: {e}", program.to_string_lossy()),
        // The future owned the child; dropping it killed the process (kill_on_drop).
        Err(_) => CmdOutput {
            status: -1,
            stdout: String::new(),
            stderr: format!(
                "{} timed out after {timeout:?} and was killed",
                program.to_string_lossy()
            ),
        },
    }
}

/// `clients/lenient_upstream.py` serving `names`: it decodes JSON as Go's `encoding/json`
/// fills a struct (keys folded, the last of equal keys wins), routes paths loosely, and logs
/// every request it receives, so a test can show what reached it. Killed on drop.
#[derive(Debug)]
pub struct LenientUpstream {
    pub port: u16,
    log: PathBuf,
    _server: PyTlsServer,
}

impl LenientUpstream {
    pub async fn start(ca: &crate::pki::TestCa, names: &[&str]) -> Self {
        let server = PyTlsServer::start(ca, names, "lenient_upstream.py", |dir| {
            vec![dir.join("seen.jsonl").into()]
        })
        .await;
        Self {
            port: server.port,
            log: server.dir.path().join("seen.jsonl"),
            _server: server,
        }
    }

    /// Every request the upstream received, in order (`method`, `path`, `routed`, `body`,
    /// `decoded`).
    pub fn seen(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a log line"))
            .collect()
    }
}

/// A Python TLS server from `tests/clients/` (`SCRIPT PORT CERT_CHAIN_PEM KEY_PEM [ARGS]`),
/// serving a certificate of the test CA for `names`, on a free port, killed on drop. The
/// script exits 4 when the port was taken meanwhile; another one is tried then.
#[derive(Debug)]
pub struct PyTlsServer {
    pub port: u16,
    /// Holds the certificate, the key and whatever the script writes there.
    pub dir: tempfile::TempDir,
    _child: tokio::process::Child,
}

impl PyTlsServer {
    /// Start `script` with the extra arguments `args(dir)` and wait until it accepts
    /// connections (30 s at most).
    pub async fn start(
        ca: &crate::pki::TestCa,
        names: &[&str],
        script: &str,
        args: impl Fn(&Path) -> Vec<std::ffi::OsString>,
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let (chain, key) = ca.issue(names);
        let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&cert_path, chain).unwrap();
        std::fs::write(&key_path, key).unwrap();
        for _ in 0..5 {
            // Servers such as uvicorn would not tell a port 0 they were given: take a free
            // one and hand it over.
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut cmd = Command::new(python_bin());
            cmd.arg(client_script(script))
                .arg(port.to_string())
                .arg(&cert_path)
                .arg(&key_path)
                .args(args(dir.path()))
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .kill_on_drop(true);
            for name in SCRUBBED_ENV {
                cmd.env_remove(name);
            }
            let mut child = cmd
                .spawn()
                .unwrap_or_else(|e| panic!("starting {script}: {e}"));
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    assert_eq!(status.code(), Some(4), "{script} failed: {status}");
                    break; // the port was taken: try another
                }
                if tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok()
                {
                    return Self {
                        port,
                        dir,
                        _child: child,
                    };
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{script} did not listen within 30s"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        panic!("no free port for {script} after 5 tries");
    }
}
