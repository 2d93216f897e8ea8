//! Brokered credentials from a real OpenBao, through the real proxy (docs/design.md §9, issue 4):
//! KV v2 (one Vault round trip per session, not per request), transit-signed JWTs verified
//! with the public key from Vault, PKI client certificates presented to an upstream that
//! requires mTLS, and PostgreSQL dynamic credentials that log in during the session and no
//! longer after teardown or expiry. Then the failures: Vault sealed or hung answers `503
//! credential_unavailable` with nothing forwarded, a cached credential keeps working until
//! its lease ends, Vault back means requests succeed again, and a revocation that fails is
//! quarantined, audited and retried until it succeeds.
//!
//! Each test starts its own OpenBao dev server, upstreams and proxy on loopback ports.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use ostiary_e2e::openbao::{OpenBao, BROKER_POLICY};
use ostiary_e2e::pki::TestCa;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{self, Reply};
use ostiary_e2e::upstream::{Seen, Upstream};
use ostiary_sdk::{NewSession, Session};
use serde_json::{json, Value};

const KV_SECRET: &str = "ghp_VAULT_CANARY_0f9e8d7c6b5a";
const KV_HOST: &str = "api.example.test";
const JWT_HOST: &str = "jwt.example.test";
const DB_HOST: &str = "db.example.test";
/// The KV credential again, cached for a second only.
const KV_SHORT_HOST: &str = "kv-short.example.test";
const MTLS_HOST: &str = "mtls.example.test";
/// Served by the mTLS upstream but bound to no credential: the handshake must fail.
const MTLS_UNBOUND: &str = "mtls-unbound.example.test";
const TOKEN_VAR: &str = "OSTIARY_E2E_VAULT_TOKEN";

/// OpenBao with every engine configured, a reflecting upstream, an mTLS upstream, a proxy
/// logged in to OpenBao with a least-privilege token.
struct Rig {
    bao: OpenBao,
    upstream: Upstream,
    mtls: Upstream,
    proxy: TestProxy,
}

impl Rig {
    async fn start() -> Result<Self> {
        Self::start_sealed(false).await
    }

    /// `sealed`: the proxy starts while OpenBao is sealed (unseal with `rig.bao.unseal()`).
    async fn start_sealed(sealed: bool) -> Result<Self> {
        let bao = OpenBao::start().await?;
        bao.put_kv("github", json!({ "token": KV_SECRET })).await?;
        bao.enable_transit("agents", "ed25519").await?;
        let pki_ca = bao.enable_pki("agents").await?;
        let db_role = format!("agents{}", std::process::id());
        bao.enable_database_postgres(&db_role).await?;
        let token = bao.token_with_policy(BROKER_POLICY, "1h").await?;
        // Each nextest test is its own process: the variable is this test's alone.
        std::env::set_var(TOKEN_VAR, &token);

        let ca = TestCa::default();
        let upstream = Upstream::builder()
            .names(&[KV_HOST, KV_SHORT_HOST, JWT_HOST, DB_HOST])
            .ca(&ca)
            .start()
            .await;
        let mtls = Upstream::builder()
            .names(&[MTLS_HOST, MTLS_UNBOUND])
            .ca(&ca)
            .client_ca(&pki_ca)
            .start()
            .await;
        let extra = format!(
            r#"
[broker]
backend = "vault"
reap_interval = "200ms"
[broker.vault]
addr = "{addr}"
auth = {{ token_env = "{TOKEN_VAR}" }}

[[credential]]
name = "github"
source = {{ vault_kv = {{ mount = "secret", path = "github", field = "token" }} }}
hosts = ["{KV_HOST}"]
inject = {{ header = "Authorization", value = "Bearer {{secret}}" }}

[[credential]]
name = "github-short"
source = {{ vault_kv = {{ mount = "secret", path = "github", field = "token" }} }}
hosts = ["{KV_SHORT_HOST}"]
inject = {{ header = "Authorization", value = "Bearer {{secret}}" }}
ttl = "1s"

[[credential]]
name = "agent-jwt"
source = {{ vault_jwt = {{ key = "agents", ttl = "2m" }} }}
hosts = ["{JWT_HOST}"]
inject = {{ header = "Authorization", value = "Bearer {{secret}}" }}

[[credential]]
name = "reports-db"
source = {{ vault_database = {{ role = "{db_role}" }} }}
hosts = ["{DB_HOST}"]
inject = {{ basic = {{}} }}

[[credential]]
name = "payments-mtls"
source = {{ vault_pki = {{ role = "agents", common_name = "{{agent}}.agents.test", ttl = "10m" }} }}
hosts = ["{MTLS_HOST}"]
inject = {{ mtls = true }}
"#,
            addr = bao.addr()
        );
        if sealed {
            bao.seal().await?;
        }
        let proxy = TestProxy::start(ProxySpec {
            names: [
                KV_HOST,
                KV_SHORT_HOST,
                JWT_HOST,
                DB_HOST,
                MTLS_HOST,
                MTLS_UNBOUND,
            ]
            .iter()
            .map(|h| h.to_string())
            .collect(),
            ports: vec![upstream.port(), mtls.port()],
            upstream_ca_pem: Some(upstream.ca_pem()),
            extra_toml: extra,
            ..Default::default()
        })
        .await;
        Ok(Self {
            bao,
            upstream,
            mtls,
            proxy,
        })
    }

    async fn session(&self, agent: &str, ttl: Option<&str>) -> Session {
        self.proxy
            .control()
            .create_session(&NewSession {
                agent: agent.into(),
                ttl: ttl.map(str::to_owned),
                ..Default::default()
            })
            .await
            .expect("session created")
    }

    /// `GET /echo` on `host` through an intercepted tunnel, as `session`.
    async fn get(&self, session: &Session, host: &str) -> Reply {
        let port = if host.starts_with("mtls") {
            self.mtls.port()
        } else {
            self.upstream.port()
        };
        let tls = raw::intercepted(&self.proxy, &session.token, host, port, &[b"http/1.1"]).await;
        let mut sender = raw::h1(tls).await;
        let req = Request::builder()
            .uri("/echo")
            .header("host", format!("{host}:{port}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        raw::send_h1(&mut sender, req)
            .await
            .unwrap_or_else(|e| panic!("GET {host}/echo: {e}"))
    }

    fn seen_at(&self, host: &str) -> Vec<Seen> {
        self.upstream
            .seen()
            .into_iter()
            .filter(|s| s.sni.as_deref() == Some(host))
            .collect()
    }

    async fn metrics(&self) -> String {
        reqwest::Client::new()
            .get(format!("http://{}/metrics", self.proxy.control_addr))
            .bearer_auth(&self.proxy.admin_token)
            .send()
            .await
            .expect("metrics answer")
            .text()
            .await
            .expect("metrics body")
    }

    /// The value of the first metrics line starting with `prefix`.
    async fn metric(&self, prefix: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    async fn delete(&self, session: &Session) {
        self.proxy
            .control()
            .delete_session(&session.session_id)
            .await
            .expect("session deleted");
    }
}

fn assert_unavailable(reply: &Reply, credential: &str) {
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
    let body = reply.json();
    assert_eq!(body["error"], "credential_unavailable", "{body}");
    assert_eq!(body["credential"], credential, "{body}");
}

/// The user and password the upstream received in a Basic `Authorization`.
fn basic_pair(seen: &Seen) -> (String, String) {
    let value = seen.header("authorization").expect("Authorization sent");
    let encoded = value.strip_prefix("Basic ").expect("Basic credentials");
    let pair = String::from_utf8(STANDARD.decode(encoded).unwrap()).unwrap();
    let (user, password) = pair.split_once(':').expect("user:password");
    (user.to_owned(), password.to_owned())
}

async fn pg_login(user: &str, password: &str) -> Result<(), tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port=5432 dbname=test user={user} password={password}"),
        tokio_postgres::NoTls,
    )
    .await?;
    let task = tokio::spawn(connection);
    client.simple_query("SELECT 1").await?;
    drop(client);
    let _ = task.await;
    Ok(())
}

/// Poll `check` until it holds or `within` passes.
async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_credential_costs_one_vault_round_trip_per_session() -> Result<()> {
    let rig = Rig::start().await?;
    let one = rig.session("agent-1", None).await;
    for _ in 0..5 {
        let reply = rig.get(&one, KV_HOST).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply}");
        let text = String::from_utf8_lossy(&reply.body);
        assert!(!text.contains(KV_SECRET), "the secret came back: {text}");
        assert!(text.contains("[REDACTED by ostiary]"), "{text}");
    }
    let seen = rig.seen_at(KV_HOST);
    assert_eq!(seen.len(), 5);
    for s in &seen {
        assert_eq!(
            s.header("authorization"),
            Some(format!("Bearer {KV_SECRET}").as_str())
        );
    }
    let fetched =
        r#"ostiary_credentials_total{credential="github",source="vault_kv",outcome="fetched"}"#;
    let cached =
        r#"ostiary_credentials_total{credential="github",source="vault_kv",outcome="cached"}"#;
    assert_eq!(
        rig.metric(fetched).await,
        1.0,
        "one Vault read for five requests"
    );
    assert_eq!(rig.metric(cached).await, 4.0);

    let two = rig.session("agent-2", None).await;
    assert_eq!(rig.get(&two, KV_HOST).await.status, StatusCode::OK);
    assert_eq!(
        rig.metric(fetched).await,
        2.0,
        "a second session reads again"
    );

    let audit = rig.proxy.audit().await;
    let injected: Vec<_> = audit
        .iter()
        .filter(|r| r.credentials == ["github"])
        .collect();
    assert_eq!(
        injected.len(),
        6,
        "every injected request names its credential"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transit_jwt_verifies_with_the_public_key_from_vault() -> Result<()> {
    let rig = Rig::start().await?;
    let session = rig.session("agent-jwt", None).await;
    let reply = rig.get(&session, JWT_HOST).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    let seen = rig.seen_at(JWT_HOST);
    let jwt = seen[0]
        .header("authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .context("a bearer JWT")?
        .to_owned();
    assert!(
        !String::from_utf8_lossy(&reply.body).contains(&jwt),
        "the JWT came back to the agent"
    );

    // The upstream's side: verify with the public key published by Vault.
    let public = STANDARD.decode(rig.bao.transit_public_key("agents").await?)?;
    let key = DecodingKey::from_ed_components(&URL_SAFE_NO_PAD.encode(public))?;
    let mut validation = Validation::new(Algorithm::EdDSA);
    validation.set_audience(&[JWT_HOST]);
    validation.set_issuer(&["ostiary"]);
    let claims = jsonwebtoken::decode::<Value>(&jwt, &key, &validation)?.claims;
    assert_eq!(claims["sub"], "agent-jwt");
    assert_eq!(claims["ostiary_session"], session.session_id.as_str());
    let lifetime = claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap();
    assert_eq!(lifetime, 120, "ttl = 2m");

    // A forged signature is refused by the same check.
    let mut forged = jwt.clone();
    forged.pop();
    forged.push(if jwt.ends_with('A') { 'B' } else { 'A' });
    assert!(jsonwebtoken::decode::<Value>(&forged, &key, &validation).is_err());

    // Cached per session: the second request carries the same JWT.
    rig.get(&session, JWT_HOST).await;
    let again = rig.seen_at(JWT_HOST);
    assert_eq!(
        again[1].header("authorization"),
        seen[0].header("authorization")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pki_certificate_is_presented_to_the_mtls_upstream_and_revoked_at_teardown() -> Result<()> {
    let rig = Rig::start().await?;
    let session = rig.session("agent-m", None).await;
    let reply = rig.get(&session, MTLS_HOST).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    let certs = rig.mtls.client_certs();
    assert_eq!(certs.len(), 1, "one handshake with a client certificate");
    let (_, cert) = x509_parser::parse_x509_certificate(&certs[0])?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .context("a common name")?;
    assert_eq!(cn, "agent-m.agents.test");
    // DER pads a serial with a high bit with 0x00; Vault names it without.
    let serial = cert
        .raw_serial()
        .iter()
        .skip_while(|b| **b == 0)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");

    // No credential for this name: the upstream refuses the handshake, the agent gets 502.
    let unbound = rig.get(&session, MTLS_UNBOUND).await;
    assert_eq!(unbound.status, StatusCode::BAD_GATEWAY, "{unbound}");

    let before = rig
        .bao
        .api("GET", &format!("pki/cert/{serial}"), None)
        .await?;
    assert_eq!(before.pointer("/data/revocation_time"), Some(&json!(0)));
    rig.delete(&session).await;
    let after = rig
        .bao
        .api("GET", &format!("pki/cert/{serial}"), None)
        .await?;
    let revoked_at = after
        .pointer("/data/revocation_time")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    assert!(
        revoked_at > 0,
        "certificate not revoked at teardown: {after}"
    );
    let audit = rig.proxy.audit().await;
    let teardown = audit
        .iter()
        .find(|r| r.kind == "session" && r.reason.as_deref() == Some("session revoked"))
        .context("a teardown record")?;
    assert_eq!(teardown.credentials, ["payments-mtls"]);
    assert!(
        teardown.leases[0].starts_with("pki:pki:"),
        "{:?}",
        teardown.leases
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_credentials_log_in_during_the_session_and_not_after_teardown() -> Result<()> {
    let rig = Rig::start().await?;
    let session = rig.session("agent-db", None).await;
    let reply = rig.get(&session, DB_HOST).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply}");
    let (user, password) = basic_pair(&rig.seen_at(DB_HOST)[0]);
    // PostgreSQL truncates the generated name; its prefix says Vault made it.
    assert!(user.starts_with("v-token-"), "a Vault-made user: {user}");
    let text = String::from_utf8_lossy(&reply.body);
    assert!(!text.contains(&password) && !text.contains(&user), "{text}");

    pg_login(&user, &password)
        .await
        .context("the minted user logs in during the session")?;
    rig.delete(&session).await;
    assert!(
        pg_login(&user, &password).await.is_err(),
        "the minted user still logs in after teardown"
    );
    let audit = rig.proxy.audit().await;
    let allowed = audit
        .iter()
        .find(|r| r.credentials == ["reports-db"])
        .context("the injected request's record")?;
    assert!(
        allowed.leases[0].starts_with("database/creds/"),
        "{:?}",
        allowed.leases
    );
    let teardown = audit
        .iter()
        .find(|r| r.kind == "session" && r.reason.as_deref() == Some("session revoked"))
        .context("a teardown record")?;
    assert_eq!(teardown.leases, allowed.leases, "the same lease revoked");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_expiry_revokes_database_credentials() -> Result<()> {
    let rig = Rig::start().await?;
    let session = rig.session("agent-short", Some("2s")).await;
    assert_eq!(rig.get(&session, DB_HOST).await.status, StatusCode::OK);
    let (user, password) = basic_pair(&rig.seen_at(DB_HOST)[0]);
    pg_login(&user, &password).await?;
    let gone = eventually(Duration::from_secs(10), || async {
        pg_login(&user, &password).await.is_err()
    })
    .await;
    assert!(
        gone,
        "the reaper did not revoke the expired session's lease"
    );
    // The record follows the revocation (it says what was revoked): wait for it too.
    let recorded = eventually(Duration::from_secs(10), || async {
        rig.proxy
            .audit()
            .await
            .iter()
            .any(|r| r.kind == "session" && r.reason.as_deref() == Some("session expired"))
    })
    .await;
    assert!(recorded, "no `session expired` record");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vault_sealed_or_hung_answers_503_and_forwards_nothing_then_recovers() -> Result<()> {
    let mut rig = Rig::start().await?;
    let warm = rig.session("agent-warm", None).await;
    assert_eq!(rig.get(&warm, KV_HOST).await.status, StatusCode::OK);
    assert_eq!(rig.get(&warm, KV_SHORT_HOST).await.status, StatusCode::OK);

    // Sealed: a session without a cached credential gets 503 and nothing is forwarded.
    rig.bao.seal().await?;
    let cold = rig.session("agent-cold", None).await;
    let forwarded = rig.seen_at(KV_HOST).len();
    assert_unavailable(&rig.get(&cold, KV_HOST).await, "github");
    assert_eq!(
        rig.seen_at(KV_HOST).len(),
        forwarded,
        "forwarded without a credential"
    );
    // The warm session's credential is still inside its lifetime: it keeps working.
    assert_eq!(rig.get(&warm, KV_HOST).await.status, StatusCode::OK);
    // Until it ends: the one cached for a second is not used past it, and nothing is
    // forwarded without it.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let forwarded = rig.seen_at(KV_SHORT_HOST).len();
    assert_unavailable(&rig.get(&warm, KV_SHORT_HOST).await, "github-short");
    assert_eq!(rig.seen_at(KV_SHORT_HOST).len(), forwarded);
    let sealed = r#"ostiary_credentials_total{credential="github",source="vault_kv",outcome="vault_sealed"}"#;
    assert_eq!(rig.metric(sealed).await, 1.0);

    rig.bao.unseal().await?;
    let reply = rig.get(&cold, KV_HOST).await;
    assert_eq!(reply.status, StatusCode::OK, "Vault back: {reply}");

    // Hung (SIGSTOP): the fetch times out instead of hanging the request; 503 again.
    rig.bao.pause()?;
    let hung = rig.session("agent-hung", None).await;
    let forwarded = rig.seen_at(KV_HOST).len();
    let started = Instant::now();
    let reply = rig.get(&hung, KV_HOST).await;
    rig.bao.resume()?;
    assert_unavailable(&reply, "github");
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(rig.seen_at(KV_HOST).len(), forwarded);
    let reply = rig.get(&hung, KV_HOST).await;
    assert_eq!(reply.status, StatusCode::OK, "Vault resumed: {reply}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_revocation_is_quarantined_audited_and_retried() -> Result<()> {
    let mut rig = Rig::start().await?;
    let session = rig.session("agent-q", None).await;
    assert_eq!(rig.get(&session, DB_HOST).await.status, StatusCode::OK);
    let (user, password) = basic_pair(&rig.seen_at(DB_HOST)[0]);

    rig.bao.seal().await?;
    rig.delete(&session).await;
    // The session is over for the agent at once, lease or not.
    let authority = format!("{KV_HOST}:{}", rig.upstream.port());
    let (_, refused) = raw::connect(
        rig.proxy.proxy_addr,
        &authority,
        &raw::auth_line(&session.token),
    )
    .await;
    assert_eq!(refused.status, StatusCode::PROXY_AUTHENTICATION_REQUIRED);
    assert_eq!(rig.metric("ostiary_quarantined_leases").await, 1.0);
    let audit = rig.proxy.audit().await;
    let failed = audit
        .iter()
        .find(|r| r.kind == "lease" && r.error.as_deref() == Some("revocation_failed"))
        .context("an audit record of the failed revocation")?;
    assert_eq!(failed.credentials, ["reports-db"]);
    assert!(failed.leases[0].starts_with("database/creds/"));
    pg_login(&user, &password)
        .await
        .context("not revoked while Vault is sealed")?;

    rig.bao.unseal().await?;
    let revoked = eventually(Duration::from_secs(15), || async {
        pg_login(&user, &password).await.is_err()
    })
    .await;
    assert!(
        revoked,
        "the quarantined lease was not revoked once Vault came back"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            rig.metric("ostiary_quarantined_leases").await == 0.0
        })
        .await
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_left_by_a_previous_run_are_revoked_at_start_up() -> Result<()> {
    let mut rig = Rig::start().await?;
    let session = rig.session("agent-r", None).await;
    assert_eq!(rig.get(&session, DB_HOST).await.status, StatusCode::OK);
    let (user, password) = basic_pair(&rig.seen_at(DB_HOST)[0]);
    pg_login(&user, &password).await?;

    // The credential lived in the old process's memory only; the new one cannot use it,
    // so it must not stay alive in Vault until its TTL.
    rig.proxy.restart().await;
    let revoked = eventually(Duration::from_secs(10), || async {
        pg_login(&user, &password).await.is_err()
    })
    .await;
    assert!(revoked, "the previous run's lease is still alive");
    // Recorded once Vault confirmed the revocation, a moment after the login stops working.
    let recorded =
        eventually(Duration::from_secs(10), || async {
            rig.proxy.audit().await.iter().any(|r| {
                r.kind == "lease" && r.leases.iter().any(|l| l.starts_with("database/creds/"))
            })
        })
        .await;
    assert!(recorded, "no audit record of the revocation");
    // The session itself survived the restart and gets a fresh credential.
    assert_eq!(rig.get(&session, DB_HOST).await.status, StatusCode::OK);
    let (fresh_user, _) = basic_pair(&rig.seen_at(DB_HOST)[1]);
    assert_ne!(fresh_user, user);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ostiary_starts_while_vault_is_sealed_and_logs_in_once_it_is_back() -> Result<()> {
    let mut rig = Rig::start_sealed(true).await?;
    let session = rig.session("agent-early", None).await;
    let reply = rig.get(&session, KV_HOST).await;
    assert_unavailable(&reply, "github");
    assert_eq!(reply.json()["reason"], "vault_not_connected", "{reply}");
    assert!(
        rig.seen_at(KV_HOST).is_empty(),
        "forwarded without a credential"
    );
    rig.bao.unseal().await?;
    let ready = eventually(Duration::from_secs(15), || async {
        rig.get(&session, KV_HOST).await.status == StatusCode::OK
    })
    .await;
    assert!(ready, "no background login after Vault came back");
    Ok(())
}
