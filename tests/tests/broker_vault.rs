//! The broker's Vault client against a real OpenBao (and a real PostgreSQL for database
//! credentials): every source, revocation, login and renewal, and the failure modes the
//! proxy must survive (sealed, hung, gone). Nothing is mocked; each test starts its own
//! server, so the tests run in parallel.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use ostiary_broker::source::{DatabaseSpec, JwtSpec, KvSpec, PkiSpec};
use ostiary_broker::vault::{AppRoleAuth, VaultAuth, VaultClient, VaultConfig, VaultError};
use ostiary_broker::{Material, MintFor, Revocation, SourceSpec};
use ostiary_e2e::openbao::{OpenBao, BROKER_POLICY};
use serde_json::{json, Value};

/// Put `token` in a per-test environment variable and return a config naming it.
fn token_config(bao: &OpenBao, var: &str, token: &str) -> VaultConfig {
    std::env::set_var(var, token);
    VaultConfig {
        addr: bao.addr(),
        auth: VaultAuth {
            token_env: Some(var.into()),
            approle: None,
        },
    }
}

async fn root_client(bao: &OpenBao, var: &str) -> VaultClient {
    VaultClient::connect(&token_config(bao, var, bao.root_token()))
        .await
        .expect("connect with the root token")
}

fn who() -> MintFor<'static> {
    MintFor {
        session: "sess-1",
        agent: "agent-7",
        tenant: "acme",
        host: "api.example.test",
        tool: Some("github.create_issue"),
    }
}

fn kv(path: &str, field: &str) -> SourceSpec {
    SourceSpec::VaultKv(KvSpec {
        mount: "secret".into(),
        path: path.into(),
        field: field.into(),
    })
}

fn token_of(material: &Material) -> &str {
    match material {
        Material::Token(t) => t.expose(),
        other => panic!("expected a token, got {other:?}"),
    }
}

#[tokio::test]
async fn kv_reads_a_field_and_names_what_is_missing() -> Result<()> {
    // A proxy in the environment must not see Vault traffic (it would see the token): this
    // one leads nowhere, so honouring it would fail every call below.
    for var in ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"] {
        std::env::set_var(var, "http://127.0.0.1:9");
    }
    let bao = OpenBao::start().await?;
    bao.put_kv(
        "github",
        json!({ "token": "ghp-very-secret-123", "count": 5 }),
    )
    .await?;
    let client = root_client(&bao, "OSTIARY_TEST_KV_TOKEN").await;

    let cred = client.mint(&kv("github", "token"), &who()).await?;
    assert_eq!(token_of(&cred.material), "ghp-very-secret-123");
    assert!(cred.lease.is_none() && cred.expires_at.is_none());

    let err = client.mint(&kv("nope", "token"), &who()).await.unwrap_err();
    assert!(matches!(err, VaultError::NotFound(_)), "{err:?}");
    assert_eq!(err.kind(), "vault_not_found");

    let err = client
        .mint(&kv("github", "absent"), &who())
        .await
        .unwrap_err();
    assert!(matches!(err, VaultError::NotFound(_)), "{err:?}");
    assert!(err.to_string().contains("absent"), "{err}");

    let err = client
        .mint(&kv("github", "count"), &who())
        .await
        .unwrap_err();
    assert!(matches!(err, VaultError::Malformed { .. }), "{err:?}");

    let err = client
        .mint(&SourceSpec::File("github".into()), &who())
        .await
        .unwrap_err();
    assert!(matches!(err, VaultError::Malformed { .. }), "{err:?}");

    // Nothing prints the token or the value.
    let debug = format!("{client:?} {cred:?}");
    assert!(!debug.contains(bao.root_token()), "{debug}");
    assert!(!debug.contains("ghp-very-secret-123"), "{debug}");
    Ok(())
}

#[tokio::test]
async fn kv_read_is_denied_without_policy() -> Result<()> {
    let bao = OpenBao::start().await?;
    bao.put_kv("github", json!({ "token": "x" })).await?;
    let token = bao
        .token_with_policy(
            r#"path "secret/data/other" { capabilities = ["read"] }"#,
            "1h",
        )
        .await?;
    let client =
        VaultClient::connect(&token_config(&bao, "OSTIARY_TEST_DENY_TOKEN", &token)).await?;
    let err = client
        .mint(&kv("github", "token"), &who())
        .await
        .unwrap_err();
    match &err {
        VaultError::Denied { status, path } => {
            assert_eq!(*status, 403);
            assert_eq!(path, "secret/data/github");
        }
        other => panic!("{other:?}"),
    }
    assert!(!err.to_string().contains(&token));
    Ok(())
}

fn decode_segment(segment: &str) -> Value {
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(segment).unwrap()).unwrap()
}

fn check_claims(claims: &Value, ttl: u64) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(claims["iss"], "ostiary-test");
    assert_eq!(claims["sub"], "agent-7");
    assert_eq!(claims["aud"], "api.example.test");
    assert_eq!(claims["ostiary_session"], "sess-1");
    assert_eq!(claims["tenant"], "acme");
    assert_eq!(claims["tool"], "github.create_issue");
    let exp = claims["exp"].as_u64().unwrap();
    assert!(
        exp >= now + ttl - 5 && exp <= now + ttl + 5,
        "exp {exp} now {now}"
    );
    assert!(claims["jti"].as_str().unwrap().len() >= 16);
}

fn validation(alg: Algorithm) -> Validation {
    let mut v = Validation::new(alg);
    v.set_audience(&["api.example.test"]);
    v.set_issuer(&["ostiary-test"]);
    v
}

#[tokio::test]
async fn transit_jwts_verify_with_vaults_public_key() -> Result<()> {
    let bao = OpenBao::start().await?;
    bao.enable_transit("agents", "ed25519").await?;
    bao.enable_transit("agents-ec", "ecdsa-p256").await?;
    let client = root_client(&bao, "OSTIARY_TEST_JWT_TOKEN").await;
    let spec = |key: &str| {
        SourceSpec::VaultJwt(JwtSpec {
            mount: "transit".into(),
            key: key.into(),
            ttl: Duration::from_secs(120),
            issuer: "ostiary-test".into(),
        })
    };

    // Ed25519: transit's public key is base64 of the raw 32 bytes.
    let cred = client.mint(&spec("agents"), &who()).await?;
    let jwt = token_of(&cred.material).to_string();
    let header = decode_segment(jwt.split('.').next().unwrap());
    assert_eq!(header["alg"], "EdDSA");
    assert_eq!(header["typ"], "JWT");
    assert_eq!(header["kid"], "agents:1");
    let raw = STANDARD.decode(bao.transit_public_key("agents").await?)?;
    let key = DecodingKey::from_ed_components(&URL_SAFE_NO_PAD.encode(raw))?;
    let data = jsonwebtoken::decode::<Value>(&jwt, &key, &validation(Algorithm::EdDSA))?;
    check_claims(&data.claims, 120);
    let exp = data.claims["exp"].as_u64().unwrap();
    assert_eq!(cred.expires_at, Some(UNIX_EPOCH + Duration::from_secs(exp)));

    // A tampered token does not verify.
    let mut parts: Vec<&str> = jwt.split('.').collect();
    let forged = URL_SAFE_NO_PAD.encode(serde_json::to_vec(
        &json!({"sub": "admin", "aud": "api.example.test", "iss": "ostiary-test", "exp": exp}),
    )?);
    parts[1] = &forged;
    assert!(
        jsonwebtoken::decode::<Value>(&parts.join("."), &key, &validation(Algorithm::EdDSA))
            .is_err()
    );

    // ECDSA P-256: JWS marshaling, verified with the PEM public key.
    let cred = client.mint(&spec("agents-ec"), &who()).await?;
    let jwt = token_of(&cred.material);
    let pem = bao.transit_public_key("agents-ec").await?;
    let key = DecodingKey::from_ec_pem(pem.as_bytes())?;
    let data = jsonwebtoken::decode::<Value>(jwt, &key, &validation(Algorithm::ES256))?;
    check_claims(&data.claims, 120);

    // Rotation: a client that reads the key afresh signs with, and names, version 2.
    bao.api("POST", "transit/keys/agents/rotate", None).await?;
    let fresh = root_client(&bao, "OSTIARY_TEST_JWT_TOKEN").await;
    let cred = fresh.mint(&spec("agents"), &who()).await?;
    let jwt = token_of(&cred.material);
    assert_eq!(
        decode_segment(jwt.split('.').next().unwrap())["kid"],
        "agents:2"
    );
    let raw = STANDARD.decode(bao.transit_public_key("agents").await?)?;
    let key = DecodingKey::from_ed_components(&URL_SAFE_NO_PAD.encode(raw))?;
    jsonwebtoken::decode::<Value>(jwt, &key, &validation(Algorithm::EdDSA))?;

    let err = client.mint(&spec("missing-key"), &who()).await.unwrap_err();
    assert!(
        matches!(err, VaultError::NotFound(_) | VaultError::Malformed { .. }),
        "{err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn pki_issues_a_client_certificate_and_revokes_it() -> Result<()> {
    let bao = OpenBao::start().await?;
    let ca_pem = bao.enable_pki("agents").await?;
    let client = root_client(&bao, "OSTIARY_TEST_PKI_TOKEN").await;
    let spec = SourceSpec::VaultPki(PkiSpec {
        mount: "pki".into(),
        role: "agents".into(),
        common_name: "{agent}.{session}.agents.test".into(),
        ttl: Duration::from_secs(600),
    });
    let cred = client.mint(&spec, &who()).await?;
    let Material::ClientCert(id) = &cred.material else {
        panic!("{:?}", cred.material)
    };

    // Leaf first, then the CA.
    let pems: Vec<_> = x509_parser::pem::Pem::iter_from_buffer(id.cert_chain_pem.as_bytes())
        .collect::<Result<_, _>>()?;
    assert!(pems.len() >= 2, "chain of {}", pems.len());
    let leaf = pems[0].parse_x509()?;
    let cn = leaf
        .subject()
        .iter_common_name()
        .next()
        .unwrap()
        .as_str()?
        .to_string();
    assert_eq!(cn, "agent-7.sess-1.agents.test");
    let (_, ca) = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes())?;
    assert_eq!(
        pems[1].contents, ca.contents,
        "the chain ends with the test CA"
    );

    // The key belongs to the certificate.
    let key = rcgen::KeyPair::from_pem(id.key_pem.expose())?;
    assert_eq!(
        key.public_key_raw(),
        &*leaf.public_key().subject_public_key.data
    );

    let not_after = leaf.validity().not_after.timestamp() as u64;
    assert_eq!(
        cred.expires_at,
        Some(UNIX_EPOCH + Duration::from_secs(not_after))
    );
    assert!(format!("{cred:?}").contains("***") && !format!("{cred:?}").contains("PRIVATE KEY"));

    let lease = cred.lease.clone().unwrap();
    let Revocation::PkiSerial { mount, serial } = &lease.revocation else {
        panic!("{lease:?}")
    };
    assert_eq!(mount, "pki");
    assert_eq!(lease.id, format!("pki:pki:{serial}"));
    assert!(!lease.renewable);

    let before = bao.api("GET", &format!("pki/cert/{serial}"), None).await?;
    assert_eq!(before["data"]["revocation_time"], 0);
    client.revoke(&lease).await?;
    let after = bao.api("GET", &format!("pki/cert/{serial}"), None).await?;
    assert_ne!(after["data"]["revocation_time"], 0, "{after}");

    // Revoking again, or a serial Vault never issued, succeeds.
    client.revoke(&lease).await?;
    let unknown = ostiary_broker::Lease {
        id: "pki:pki:00-11".into(),
        revocation: Revocation::PkiSerial {
            mount: "pki".into(),
            serial: "00-11-22-33-44-55-66-77-88-99-aa-bb-cc-dd-ee-ff-00-11-22-33".into(),
        },
        renewable: false,
    };
    client.revoke(&unknown).await?;
    Ok(())
}

async fn pg_login(user: &str, password: &str) -> Result<String, tokio_postgres::Error> {
    let conn_str = format!("host=127.0.0.1 port=5432 dbname=test user={user} password={password}");
    let (pg, conn) = tokio_postgres::connect(&conn_str, tokio_postgres::NoTls).await?;
    let task = tokio::spawn(conn);
    let row = pg.query_one("SELECT current_user::text", &[]).await?;
    let who: String = row.get(0);
    drop(pg);
    let _ = task.await;
    Ok(who)
}

#[tokio::test]
async fn database_credentials_log_in_until_revoked() -> Result<()> {
    let bao = OpenBao::start().await?;
    let role = format!("app{}", bao.port());
    bao.enable_database_postgres(&role).await?;
    let client = root_client(&bao, "OSTIARY_TEST_DB_TOKEN").await;
    let spec = SourceSpec::VaultDatabase(DatabaseSpec {
        mount: "database".into(),
        role: role.clone(),
    });
    let cred = client.mint(&spec, &who()).await?;
    let Material::Basic { username, password } = &cred.material else {
        panic!("{:?}", cred.material)
    };
    let lease = cred.lease.clone().unwrap();
    assert_eq!(lease.revocation, Revocation::VaultLease);
    assert!(
        lease.id.starts_with(&format!("database/creds/{role}/")),
        "{}",
        lease.id
    );
    assert!(lease.renewable);
    let left = cred.remaining(SystemTime::now()).unwrap();
    assert!(
        left > Duration::from_secs(3500) && left <= Duration::from_secs(3600),
        "{left:?}"
    );
    let debug = format!("{cred:?}");
    assert!(!debug.contains(username.expose()) && !debug.contains(password.expose()));

    assert_eq!(
        pg_login(username.expose(), password.expose()).await?,
        username.expose()
    );

    client.revoke(&lease).await?;
    let err = pg_login(username.expose(), password.expose())
        .await
        .expect_err("the revoked user can no longer log in");
    assert!(
        err.to_string().contains("does not exist") || err.as_db_error().is_some(),
        "{err}"
    );

    // Idempotent: again, and an unknown lease.
    client.revoke(&lease).await?;
    let unknown = ostiary_broker::Lease {
        id: format!("database/creds/{role}/doesnotexist"),
        revocation: Revocation::VaultLease,
        renewable: true,
    };
    client.revoke(&unknown).await?;
    Ok(())
}

#[tokio::test]
async fn a_short_token_is_kept_alive_past_its_ttl() -> Result<()> {
    let bao = OpenBao::start().await?;
    bao.put_kv("k", json!({ "v": "value" })).await?;
    let token = bao.token_with_policy(BROKER_POLICY, "4s").await?;
    let kept = VaultClient::connect(&token_config(&bao, "OSTIARY_TEST_RENEW_A", &token)).await?;
    let token2 = bao.token_with_policy(BROKER_POLICY, "4s").await?;
    let unkept = VaultClient::connect(&token_config(&bao, "OSTIARY_TEST_RENEW_B", &token2)).await?;

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let kept = std::sync::Arc::new(kept);
    let keeper = {
        let kept = kept.clone();
        tokio::spawn(async move {
            kept.keep_token_alive(async {
                let _ = stopped.await;
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_secs(9)).await;
    let cred = kept.mint(&kv("k", "v"), &who()).await?;
    assert_eq!(token_of(&cred.material), "value");
    // The control: the same kind of token, not renewed, has expired.
    let err = unkept.mint(&kv("k", "v"), &who()).await.unwrap_err();
    assert!(matches!(err, VaultError::Denied { .. }), "{err:?}");

    stop.send(()).ok();
    tokio::time::timeout(Duration::from_secs(2), keeper).await??;
    Ok(())
}

#[tokio::test]
async fn approle_logs_in_and_again_past_the_max_ttl() -> Result<()> {
    let bao = OpenBao::start().await?;
    bao.put_kv("k", json!({ "v": "value" })).await?;
    let (role_id, secret_id) = bao.enable_approle(BROKER_POLICY, "3s", "6s").await?;
    std::env::set_var("OSTIARY_TEST_APPROLE_SECRET", &secret_id);
    let config = VaultConfig {
        addr: bao.addr(),
        auth: VaultAuth {
            token_env: None,
            approle: Some(AppRoleAuth {
                mount: "approle".into(),
                role_id: role_id.clone(),
                secret_id_env: "OSTIARY_TEST_APPROLE_SECRET".into(),
            }),
        },
    };
    let client = std::sync::Arc::new(VaultClient::connect(&config).await?);
    let debug = format!("{client:?}");
    assert!(
        !debug.contains(&secret_id) && debug.contains("approle"),
        "{debug}"
    );

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let keeper = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .keep_token_alive(async {
                    let _ = stopped.await;
                })
                .await
        })
    };
    // Past the 6 s max TTL: only a new login keeps the client working.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let cred = client.mint(&kv("k", "v"), &who()).await?;
    assert_eq!(token_of(&cred.material), "value");
    stop.send(()).ok();
    tokio::time::timeout(Duration::from_secs(2), keeper).await??;

    // A wrong secret id is a login error that does not repeat it.
    std::env::set_var("OSTIARY_TEST_APPROLE_BAD", "not-the-secret-id-42");
    let mut bad = config.clone();
    bad.auth.approle.as_mut().unwrap().secret_id_env = "OSTIARY_TEST_APPROLE_BAD".into();
    let err = VaultClient::connect(&bad).await.unwrap_err();
    assert!(matches!(err, VaultError::Auth(_)), "{err:?}");
    assert!(!err.to_string().contains("not-the-secret-id-42"), "{err}");

    // Exactly one of token_env and approle.
    let mut both = config.clone();
    both.auth.token_env = Some("OSTIARY_TEST_APPROLE_SECRET".into());
    let err = VaultClient::connect(&both).await.unwrap_err();
    assert!(
        matches!(err, VaultError::Auth(_)) && err.to_string().contains("both"),
        "{err}"
    );
    let mut neither = config.clone();
    neither.auth.approle = None;
    let err = VaultClient::connect(&neither).await.unwrap_err();
    assert!(
        matches!(err, VaultError::Auth(_)) && err.to_string().contains("neither"),
        "{err}"
    );
    let missing = VaultConfig {
        addr: bao.addr(),
        auth: VaultAuth {
            token_env: Some("OSTIARY_TEST_NO_SUCH_VAR".into()),
            approle: None,
        },
    };
    let err = VaultClient::connect(&missing).await.unwrap_err();
    assert!(matches!(err, VaultError::Auth(_)), "{err:?}");
    let wrong = token_config(&bao, "OSTIARY_TEST_WRONG_TOKEN", "s.not-a-real-token-xyz");
    let err = VaultClient::connect(&wrong).await.unwrap_err();
    assert!(matches!(err, VaultError::Auth(_)), "{err:?}");
    assert!(!err.to_string().contains("not-a-real-token-xyz"), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_sealed_vault_is_reported_as_sealed() -> Result<()> {
    let mut bao = OpenBao::start().await?;
    bao.put_kv("k", json!({ "v": "value" })).await?;
    let client = root_client(&bao, "OSTIARY_TEST_SEAL_TOKEN").await;
    bao.seal().await?;
    let err = client.mint(&kv("k", "v"), &who()).await.unwrap_err();
    assert!(matches!(err, VaultError::Sealed), "{err:?}");
    assert_eq!(err.kind(), "vault_sealed");
    let err = VaultClient::connect(&token_config(
        &bao,
        "OSTIARY_TEST_SEAL_TOKEN",
        bao.root_token(),
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, VaultError::Sealed), "{err:?}");
    // Revocation is not silently "done" while sealed: the broker must retry or quarantine.
    let lease = ostiary_broker::Lease {
        id: "database/creds/app/abc".into(),
        revocation: Revocation::VaultLease,
        renewable: true,
    };
    let err = client.revoke(&lease).await.unwrap_err();
    assert!(matches!(err, VaultError::Sealed), "{err:?}");

    bao.unseal().await?;
    let cred = client.mint(&kv("k", "v"), &who()).await?;
    assert_eq!(token_of(&cred.material), "value");
    Ok(())
}

#[tokio::test]
async fn a_hung_or_stopped_vault_fails_fast_and_recovers() -> Result<()> {
    let mut bao = OpenBao::start().await?;
    bao.put_kv("k", json!({ "v": "value" })).await?;
    let config = token_config(&bao, "OSTIARY_TEST_DOWN_TOKEN", bao.root_token());
    let client = VaultClient::connect_with_timeout(&config, Duration::from_secs(2)).await?;

    // Hung: the kernel accepts, nobody answers; the request timeout ends it.
    bao.pause()?;
    let started = Instant::now();
    let err = client.mint(&kv("k", "v"), &who()).await.unwrap_err();
    let took = started.elapsed();
    bao.resume()?;
    assert!(matches!(err, VaultError::Unreachable(_)), "{err:?}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert!(!err.to_string().contains(bao.root_token()), "{err}");

    // Back: the same client works again.
    let cred = client.mint(&kv("k", "v"), &who()).await?;
    assert_eq!(token_of(&cred.material), "value");

    // Gone: connection refused, at once.
    bao.stop().await?;
    let started = Instant::now();
    let err = client.mint(&kv("k", "v"), &who()).await.unwrap_err();
    assert!(matches!(err, VaultError::Unreachable(_)), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(err.kind(), "vault_unreachable");
    let err = VaultClient::connect(&config).await.unwrap_err();
    assert!(matches!(err, VaultError::Unreachable(_)), "{err:?}");
    Ok(())
}

/// A log sink the test can read back.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn trace_logs_never_carry_tokens_or_secrets() -> Result<()> {
    let sink = Captured::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let bao = OpenBao::start().await?;
    bao.put_kv("github", json!({ "token": "ghp-logged-never-77" }))
        .await?;
    let (role_id, secret_id) = bao.enable_approle(BROKER_POLICY, "1h", "2h").await?;
    std::env::set_var("OSTIARY_TEST_LOG_SECRET", &secret_id);
    let config = VaultConfig {
        addr: bao.addr(),
        auth: VaultAuth {
            token_env: None,
            approle: Some(AppRoleAuth {
                mount: "approle".into(),
                role_id,
                secret_id_env: "OSTIARY_TEST_LOG_SECRET".into(),
            }),
        },
    };
    let approle = VaultClient::connect(&config).await?;
    approle.mint(&kv("github", "token"), &who()).await?;
    approle
        .mint(&kv("missing", "token"), &who())
        .await
        .unwrap_err();
    let root = root_client(&bao, "OSTIARY_TEST_LOG_ROOT").await;
    root.mint(&kv("github", "token"), &who()).await?;

    let logs = String::from_utf8(sink.0.lock().unwrap().clone())?;
    assert!(
        logs.contains("rustify") || logs.contains("vaultrs"),
        "nothing was logged: {logs}"
    );
    for secret in [bao.root_token(), secret_id.as_str(), "ghp-logged-never-77"] {
        assert!(!logs.contains(secret), "a secret reached the trace log");
    }
    Ok(())
}
