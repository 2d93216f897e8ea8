//! Placeholders are honoured only at their binding's injection point, and every response
//! of a session is scrubbed of all its secrets (issue 13, item 5; docs/design.md §9; THREATS
//! "Authority and ambiguity"): a real proxy, a real TLS upstream, real clients.
//!
//! The attack: an upstream that stores what it receives (a message board, a request bin, an
//! API that logs the headers it got — the upstream's `/messages`) hands a secret back
//! through another route, or another of its hostnames, in the answer to a request that
//! carried no credential. Two halves of the defence, each proved here:
//! - a placeholder anywhere but its binding's own header, Basic credentials or query
//!   parameter — another header, a header name, the path, another query parameter, a body
//!   (JSON, form, JSON-escaped, streamed across chunks, a tool call), Basic credentials of
//!   a non-basic binding — is refused with 403 `placeholder_exfiltration` even towards the
//!   bound host, audited as exfiltration, and nothing of it is forwarded; at its injection
//!   point it is overwritten by the credential, as an SDK expects;
//! - every response is scrubbed of every secret the proxy injected, so a secret the
//!   upstream stored comes back redacted from an unbound hostname of the same service, and
//!   from a host bound to another credential — to the session that sent it and to sessions
//!   that hold none (another agent's, one started after the sender's teardown); answers
//!   pass untouched only while the proxy has injected nothing.
//!
//! The rig is `support/credentials.rs`: `github` is a header binding (`Authorization:
//! Bearer`) on `api.example.test`, `basic` Basic auth on `basic.example.test`, `query` the
//! `api_key` parameter on `query.example.test`, `lower` the `X-Api-Key` header on
//! `lower.example.test`; `other.example.test` is bound to nothing. One upstream serves all
//! of them, with one `/messages` store behind every name.

use base64::Engine;
use http::StatusCode;
use ostiary::audit::AuditRecord;
use ostiary_e2e::clients::curl;
use ostiary_e2e::raw::{self, Reply};

use crate::support::credentials as credentials_support;
use credentials_support::*;

/// The checks every misplaced-placeholder refusal must pass: 403 `denied` with reason
/// `placeholder_exfiltration` naming `credential` and `at`, a deny record that says
/// exfiltration and names the credential, nothing injected, nothing leaked.
async fn assert_misplaced(
    rig: &Rig,
    reply: &Reply,
    credential: &str,
    at: &str,
    what: &str,
) -> AuditRecord {
    let (body, record) = raw::assert_refused(&rig.proxy, reply, 403, "denied").await;
    assert_eq!(
        body["reason"], "placeholder_exfiltration",
        "{what}: {reply}"
    );
    assert_eq!(body["credential"], credential, "{what}: {reply}");
    assert_eq!(body["at"], at, "{what}: {reply}");
    assert!(
        body["point"].is_string(),
        "{what}: towards its own host the refusal names the injection point: {reply}"
    );
    assert_eq!(record.decision, "deny", "{what}: {record:#?}");
    assert!(
        record
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("placeholder exfiltration")),
        "{what}: the record says exfiltration: {record:#?}"
    );
    assert_eq!(record.credentials, [credential], "{what}: {record:#?}");
    assert!(record.leases.is_empty(), "{what}: {record:#?}");
    assert_clean(reply);
    record
}

fn basic(pair: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// Nothing the upstream stored or saw carries a secret or a placeholder.
fn assert_nothing_stored(rig: &Rig, what: &str) {
    let stored = rig.upstream.messages();
    assert!(stored.is_empty(), "{what}: the upstream stored {stored:#?}");
}

// ---------------------------------------------------------------------------------------
// Misplaced placeholders in the head, towards the bound host.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholders_outside_the_injection_point_are_refused_towards_the_bound_host() {
    let rig = Rig::start().await;
    // One session per case: ten denials in a row would have the watchdog pause one.
    let mut sessions = Vec::new();
    for i in 0..18 {
        sessions.push(rig.proxy.session(&format!("agent-{i}")).await);
    }
    // The session's own tag does not make a misplaced placeholder any better (case 3).
    let tagged = format!("ostiary:github@{}", sessions[3].session_id);
    let basic_gh = basic("x-access-token:ostiary:github");
    let unpadded = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode("u:ostiary:github")
    );
    let bearer_lower = "Bearer ostiary:lower".to_owned();
    // (host, path, headers, credential, where it is reported)
    type Case<'a> = (&'a str, String, Vec<(&'a str, &'a str)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        // Another header: an upstream that logs custom headers would keep the secret.
        (
            BOUND,
            "/messages".into(),
            vec![("x-api-key", "ostiary:github")],
            "github",
            "header x-api-key",
        ),
        (
            BOUND,
            "/messages".into(),
            vec![("x-note", "see ostiary:github, thanks")],
            "github",
            "header x-note",
        ),
        (
            BOUND,
            "/messages".into(),
            vec![("cookie", "t=ostiary:github")],
            "github",
            "header cookie",
        ),
        (
            BOUND,
            "/messages".into(),
            vec![("x-api-key", tagged.as_str())],
            "github",
            "header x-api-key",
        ),
        // The path, raw and percent-encoded.
        (
            BOUND,
            "/messages/ostiary:github".into(),
            vec![],
            "github",
            "path",
        ),
        (
            BOUND,
            "/messages/ostiary%3Agithub".into(),
            vec![],
            "github",
            "path",
        ),
        // Another query parameter: POST /messages?text=… is the issue's attack.
        (
            BOUND,
            "/messages?text=ostiary:github".into(),
            vec![],
            "github",
            "query parameter text",
        ),
        (
            BOUND,
            "/messages?text=OSTIARY%3agithub".into(),
            vec![],
            "github",
            "query parameter text",
        ),
        (
            BOUND,
            "/messages?a=1&text=%6Fstiary%3Agithub".into(),
            vec![],
            "github",
            "query parameter text",
        ),
        (
            BOUND,
            "/messages?ostiary%3Agithub=1".into(),
            vec![],
            "github",
            "name of a query parameter",
        ),
        // Basic credentials of a non-basic binding (base64 hides it; padding optional).
        (
            BOUND,
            "/messages".into(),
            vec![("authorization", basic_gh.as_str())],
            "github",
            "Basic credentials of the authorization header",
        ),
        (
            BOUND,
            "/messages".into(),
            vec![("authorization", unpadded.as_str())],
            "github",
            "Basic credentials of the authorization header",
        ),
        // A header name (`%` is a token character).
        (
            BOUND,
            "/messages".into(),
            vec![("x-ostiary%3agithub", "1")],
            "github",
            "name of a header",
        ),
        // Another binding's injection point: `lower` injects X-Api-Key, not Authorization.
        (
            LOWER_HOST,
            "/messages".into(),
            vec![("authorization", bearer_lower.as_str())],
            "lower",
            "header authorization",
        ),
        // A query binding: any parameter but its own, and `;` is no separator here.
        (
            QUERY_HOST,
            "/messages?api_key=x&note=ostiary:query".into(),
            vec![],
            "query",
            "query parameter note",
        ),
        (
            QUERY_HOST,
            "/messages?x=1;api_key=ostiary:query".into(),
            vec![],
            "query",
            "query parameter x",
        ),
        (
            QUERY_HOST,
            "/messages".into(),
            vec![("x-api-key", "ostiary:query")],
            "query",
            "header x-api-key",
        ),
        // A basic binding: its Authorization only.
        (
            BASIC_HOST,
            "/messages".into(),
            vec![("x-token", "ostiary:basic")],
            "basic",
            "header x-token",
        ),
    ];
    assert_eq!(cases.len(), sessions.len());
    for ((host, path, headers, credential, at), session) in cases.iter().zip(&sessions) {
        let what = format!("{host}{path} {headers:?}");
        let reply = rig.send_as(session, "POST", host, path, headers).await;
        assert_misplaced(&rig, &reply, credential, at, &what).await;
    }
    rig.assert_upstream_saw_nothing("a misplaced placeholder");
    assert_nothing_stored(&rig, "misplaced placeholders");
    // The attempts are counted with the exfiltration attempts.
    let metrics = reqwest::Client::new()
        .get(format!("http://{}/metrics", rig.proxy.control_addr))
        .bearer_auth(&rig.proxy.admin_token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counted = metrics
        .lines()
        .find(|l| {
            l.starts_with("ostiary_placeholder_exfiltration_attempts")
                && l.contains("credential=\"github\"")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<f64>().ok());
    let github_cases = cases.iter().filter(|c| c.3 == "github").count() as f64;
    assert_eq!(counted, Some(github_cases), "{metrics}");
}

/// The same over HTTP/2, where header names arrive lowercase and a request is a stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misplaced_placeholders_are_refused_over_h2_too() {
    let rig = Rig::start().await;
    let mut h2 = rig.h2(BOUND).await;
    for (path, headers, at) in [
        (
            "/messages?text=ostiary:github",
            vec![],
            "query parameter text",
        ),
        (
            "/messages",
            vec![("x-api-key", "ostiary:github")],
            "header x-api-key",
        ),
    ] {
        let req = rig.request("POST", BOUND, path, &headers);
        let reply = raw::send_h2(&mut h2, req).await.unwrap();
        assert_misplaced(&rig, &reply, "github", at, path).await;
    }
    rig.assert_upstream_saw_nothing("a misplaced placeholder over h2");
}

// ---------------------------------------------------------------------------------------
// Bodies: no binding injects into one.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholders_in_bodies_towards_the_bound_host_are_refused_and_never_stored() {
    let rig = Rig::start().await;
    for body in [
        r#"{"text":"ostiary:github"}"#,
        r#"{"text":"deploy with OSTIARY:github"}"#,
        r#"{"text":"ostiary\u003agithub"}"#,
        r#"{"text":"ostiary\u003Agithub@x"}"#,
    ] {
        let reply = rig.post_json(BOUND, "/messages", &[], body).await;
        assert_misplaced(&rig, &reply, "github", "body", body).await;
    }
    // A form body, percent-encoded, through curl.
    let env = rig.env();
    let url = rig.url("https", BOUND, "/messages");
    for form in ["text=ostiary%3Agithub", "a=1&text=ostiary:github"] {
        let out = curl(
            &["-sS", "--data", form, "-w", "\n%{http_code}", &url],
            &borrow(&env),
        )
        .await;
        assert!(out.stdout.trim_end().ends_with("403"), "{form}: {out}");
        assert!(out.stdout.contains("placeholder_exfiltration"), "{out}");
    }
    assert_nothing_stored(&rig, "placeholders in bodies");
    for seen in rig.seen_at(BOUND) {
        assert!(
            !seen.body_complete || seen.body_len == 0,
            "the upstream got a whole body carrying a placeholder: {seen:#?}"
        );
    }
}

/// A chunked body whose placeholder straddles two chunks, written on the wire by hand: the
/// chunk that completes it never reaches the upstream, which sees an incomplete body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_placeholder_split_across_chunks_towards_the_bound_host_is_stopped() {
    let rig = Rig::start().await;
    let mut wire = raw::Wire::new(rig.tunnel(BOUND, &[b"http/1.1"]).await);
    let mut text = format!(
        "POST /messages HTTP/1.1\r\nHost: {BOUND}:{}\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\n\r\n",
        rig.upstream.port()
    );
    for chunk in ["{\"text\":\"ost", "iary:git", "hub\"}"] {
        text.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    text.push_str("0\r\n\r\n");
    wire.send(text.as_bytes()).await.unwrap();
    let reply = in_time("the refusal", wire.response()).await.unwrap();
    assert_misplaced(&rig, &reply, "github", "body", "chunked").await;
    assert_nothing_stored(&rig, "a chunked placeholder");
    for seen in rig.seen_at(BOUND) {
        assert!(!seen.body_complete, "{seen:#?}");
        assert!(seen.body_len < 20, "past the placeholder: {seen:#?}");
    }
}

const TOOLS: &str = r#"
[[tool]]
name = "notes.create"
tier = "write"
match = { host = "api.example.test", method = "POST", path = "/notes" }

[[tool]]
name = "search.query"
tier = "read"
match = { host = "query.example.test", method = "GET", path = "/search" }
"#;

const TOOL_POLICIES: &str = r#"
@id("allow-all-http")
permit (principal, action == Ostiary::Action::"http", resource);
@id("allow-all-connect")
permit (principal, action == Ostiary::Action::"connect", resource);
@id("write-ok")
permit (principal, action in Ostiary::Action::"tier:write", resource);
@id("read-ok")
permit (principal, action in Ostiary::Action::"tier:read", resource);
"#;

/// A tool call's body is read whole before policy: a placeholder in it is refused there,
/// JSON escapes decoded. Its query is not its body: the query binding's own parameter on a
/// tool call is still its injection point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_call_bodies_are_checked_and_their_query_is_not_taken_for_body() {
    let rig = Rig::start_with("5m", TOOL_POLICIES, Some(|_| TOOLS.to_owned()), true).await;
    for body in [
        r#"{"title":"ostiary:github"}"#,
        r#"{"title":"ostiary\u003Agithub"}"#,
    ] {
        let reply = rig.post_json(BOUND, "/notes", &[], body).await;
        let record = assert_misplaced(&rig, &reply, "github", "body", body).await;
        assert_eq!(record.tool.as_deref(), Some("notes.create"), "{record:#?}");
    }
    assert_eq!(
        rig.upstream.count("/notes"),
        0,
        "{:#?}",
        rig.upstream.seen()
    );

    let reply = rig
        .get(QUERY_HOST, "/search?q=x&api_key=ostiary:query", &[])
        .await;
    // The upstream answers 404 for /search: its own answer, so the call was forwarded.
    assert_status(&reply, StatusCode::NOT_FOUND);
    let seen = rig.only_seen_at(QUERY_HOST);
    assert_eq!(query_values(&seen.path, "api_key"), [CANARY_QUERY]);
    assert!(!seen.path.contains("ostiary"), "{}", seen.path);
    let record = allowed_record(&rig, QUERY_HOST).await;
    assert_eq!(record.tool.as_deref(), Some("search.query"), "{record:#?}");
}

// ---------------------------------------------------------------------------------------
// At the injection point: overwritten by the credential.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholders_at_their_injection_point_are_overwritten_by_the_credential() {
    let rig = Rig::start().await;
    let sid = rig.session.session_id.clone();
    let tagged = format!("Bearer ostiary:github@{sid}");
    // The SDK's own header, plain and tagged with the session's id.
    for auth in [
        "Bearer ostiary:github",
        tagged.as_str(),
        "token ostiary%3Agithub",
    ] {
        let reply = rig.get(BOUND, "/reflect", &[("authorization", auth)]).await;
        assert_status(&reply, StatusCode::OK);
        assert_clean(&reply);
        assert_reflected_auth_redacted(&reply);
    }
    for seen in rig.seen_at(BOUND) {
        let auth: Vec<_> = seen.headers.get_all("authorization").iter().collect();
        assert_eq!(auth, [bearer(CANARY).as_str()], "{seen:#?}");
        assert!(!seen_text(&seen).contains("ostiary"), "{seen:#?}");
    }

    // A header binding other than Authorization.
    let reply = rig
        .get(LOWER_HOST, "/reflect", &[("x-api-key", "ostiary:lower")])
        .await;
    assert_status(&reply, StatusCode::OK);
    assert_clean(&reply);
    let seen = rig.only_seen_at(LOWER_HOST);
    assert_eq!(seen.header("x-api-key"), Some(CANARY_LOWER));

    // The query binding's own parameter, raw and percent-encoded.
    for path in [
        "/reflect?api_key=ostiary:query&x=1",
        "/reflect?x=1&api%5Fkey=ostiary%3Aquery",
    ] {
        let reply = rig.get(QUERY_HOST, path, &[]).await;
        assert_status(&reply, StatusCode::OK);
        assert_clean(&reply);
    }
    for seen in rig.seen_at(QUERY_HOST) {
        assert_eq!(query_values(&seen.path, "api_key"), [CANARY_QUERY]);
        assert_eq!(query_values(&seen.path, "x"), ["1"]);
        assert!(!seen.path.contains("ostiary"), "{}", seen.path);
    }

    // Basic: git's credential helper sends `x-access-token:<token>`.
    let auth = basic("x-access-token:ostiary:basic");
    let reply = rig
        .get(BASIC_HOST, "/reflect", &[("authorization", &auth)])
        .await;
    assert_status(&reply, StatusCode::OK);
    assert_clean(&reply);
    let seen = rig.only_seen_at(BASIC_HOST);
    let want = basic(&format!("x-access-token:{CANARY_BASIC}"));
    assert_eq!(seen.header("authorization"), Some(want.as_str()));

    // A real client with the session's environment: curl with $GITHUB_TOKEN.
    let env = rig.env();
    let url = rig.url("https", BOUND, "/reflect");
    let out = curl(
        &[
            "-sS",
            "-H",
            "Authorization: Bearer ostiary:github",
            "-w",
            "\n%{http_code}",
            &url,
        ],
        &borrow(&env),
    )
    .await;
    assert!(out.stdout.trim_end().ends_with("200"), "{out}");
    assert!(
        leaks_in("curl", out.stdout.as_bytes(), &ALL_SECRETS).is_empty(),
        "{out}"
    );
}

// ---------------------------------------------------------------------------------------
// Store, then fetch: every response is scrubbed of every secret injected.

/// The stored requests as the upstream hands them back, as text.
fn stored_text(rig: &Rig) -> String {
    serde_json::to_string(&rig.upstream.messages()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_stored_by_the_upstream_comes_back_scrubbed_through_any_route() {
    let rig = Rig::start().await;
    // The upstream logs the headers it receives, the injected Authorization among them.
    let reply = rig
        .post_json(BOUND, "/messages", &[], r#"{"text":"hello"}"#)
        .await;
    assert_status(&reply, StatusCode::CREATED);
    assert!(
        stored_text(&rig).contains(CANARY),
        "the attack needs the secret stored"
    );

    // Fetched through a hostname of the same service that no binding names: the answer
    // carried no credential, and is scrubbed all the same.
    for version in ["h1", "h2"] {
        let reply = match version {
            "h1" => rig.get(OTHER, "/messages", &[]).await,
            _ => {
                let req = rig.request("GET", OTHER, "/messages", &[]);
                raw::send_h2(&mut rig.h2(OTHER).await, req).await.unwrap()
            }
        };
        assert_status(&reply, StatusCode::OK);
        assert_clean(&reply);
        let body = String::from_utf8_lossy(&reply.body).into_owned();
        assert!(body.contains(&bearer(REDACTED)), "{version}: {body}");
        assert!(
            body.contains("hello"),
            "{version}: the rest is intact: {body}"
        );
    }
    // Nothing was injected towards the unbound host.
    for seen in rig.seen_at(OTHER) {
        assert!(seen.header("authorization").is_none(), "{seen:#?}");
    }
    // Through a host bound to another credential (its own secret is injected there).
    let reply = rig.get(QUERY_HOST, "/messages", &[]).await;
    assert_status(&reply, StatusCode::OK);
    assert_clean(&reply);
    // Through plain http, absolute form on the proxy listener, to the unbound host: the
    // upstream speaks only TLS, so there is nothing to read; the answer is clean anyway.
    let reply = rig.plain_get(OTHER, "/messages").await;
    assert_clean(&reply);
}

/// The session's scrubber follows its holdings: a credential fetched later is scrubbed
/// from the next answer on, the earlier ones still are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrubber_grows_with_the_sessions_secrets() {
    let rig = Rig::start().await;
    let reply = rig
        .post_json(BOUND, "/messages", &[], r#"{"text":"one"}"#)
        .await;
    assert_status(&reply, StatusCode::CREATED);
    let reply = rig.get(OTHER, "/messages", &[]).await;
    assert_clean_of(&reply, &[CANARY]);

    // The query credential lands in the stored path; then the Basic one in a header.
    let reply = rig
        .send_as(&rig.session, "POST", QUERY_HOST, "/messages?x=2", &[])
        .await;
    assert_status(&reply, StatusCode::CREATED);
    let reply = rig
        .send_as(&rig.session, "POST", BASIC_HOST, "/messages", &[])
        .await;
    assert_status(&reply, StatusCode::CREATED);
    let stored = stored_text(&rig);
    let pair =
        base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{CANARY_BASIC}"));
    for secret in [CANARY, CANARY_QUERY, pair.as_str()] {
        assert!(stored.contains(secret), "{secret} not stored: {stored}");
    }

    for host in [OTHER, BOUND, LOWER_HOST] {
        let reply = rig.get(host, "/messages", &[]).await;
        assert_status(&reply, StatusCode::OK);
        assert_clean(&reply);
        let found = leaks_in("reply", &reply.body, &[&pair]);
        assert!(found.is_empty(), "{host}: {found:#?}");
        let body = String::from_utf8_lossy(&reply.body).into_owned();
        assert!(
            body.contains("/messages?x=2"),
            "{host}: the rest is intact: {body}"
        );
    }
    // Towards the unbound host the session's requests ask for answers it can scrub.
    for seen in rig.seen_at(OTHER) {
        assert_eq!(
            seen.header("accept-encoding"),
            Some("identity"),
            "{seen:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_pass_untouched_until_the_proxy_knows_a_secret() {
    // The file holds no value at start-up: no secret is known, none could have been
    // injected before. Then the values are written, and one is injected.
    let rig = Rig::start_with_file("").await;
    let headers = [("accept-encoding", "gzip"), ("range", "bytes=0-9")];
    let reply = rig.get(OTHER, "/reflect?mode=plain", &headers).await;
    assert_eq!(
        reply.body[..],
        ostiary_e2e::upstream::plain_reflect_body()[..]
    );
    let seen = rig.only_seen_at(OTHER);
    assert_eq!(seen.header("accept-encoding"), Some("gzip"), "{seen:#?}");
    assert_eq!(seen.header("range"), Some("bytes=0-9"), "{seen:#?}");

    // Once any session had a secret injected — another agent's here — every session's
    // requests ask for whole, identity-encoded answers (a range could start inside a
    // stored secret, a compressed one hide it), and answers without one stay identical.
    std::fs::write(&rig.secrets, secrets_toml(CANARY)).unwrap();
    let other = rig.proxy.session("agent-2").await;
    let reply = rig.send_as(&other, "GET", BOUND, "/reflect", &[]).await;
    assert_status(&reply, StatusCode::OK);
    let reply = rig.get(OTHER, "/reflect?mode=plain", &headers).await;
    assert_eq!(
        reply.body[..],
        ostiary_e2e::upstream::plain_reflect_body()[..]
    );
    let seen = rig.seen_at(OTHER);
    let last = seen.last().unwrap();
    assert_eq!(
        last.header("accept-encoding"),
        Some("identity"),
        "{last:#?}"
    );
    assert_eq!(last.header("range"), None, "{last:#?}");
}

/// A session (`agent-2`) whose request to the bound host leaves its injected secret in the
/// upstream's store: what the attacks below read back.
async fn leave_the_secret_upstream(rig: &Rig) -> ostiary_sdk::Session {
    let writer = rig.proxy.session("agent-2").await;
    let reply = rig
        .post_json_as(
            &writer,
            BOUND,
            "/messages",
            &[],
            r#"{"text":"left by the writer"}"#,
        )
        .await;
    assert_status(&reply, StatusCode::CREATED);
    assert!(
        stored_text(rig).contains(CANARY),
        "the attack needs the secret stored"
    );
    writer
}

/// Session A's request leaves its secret at an upstream that stores what it receives; a
/// session that holds no credential at all — of the same agent, of another agent, one
/// started after A was torn down — reads it back through an unbound hostname and finds it
/// redacted: what the proxy injected for one session is scrubbed from every session's
/// answers until it ends (a `file` secret never does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_one_session_sent_is_redacted_for_sessions_that_hold_none() {
    let rig = Rig::start().await;
    let writer = leave_the_secret_upstream(&rig).await;

    let check = |who: &'static str, reply: Reply| {
        assert_status(&reply, StatusCode::OK);
        assert_clean(&reply);
        let body = String::from_utf8_lossy(&reply.body).into_owned();
        assert!(body.contains(&bearer(REDACTED)), "{who}: {body}");
        assert!(body.contains("left by the writer"), "{who}: {body}");
    };
    // The rig's own session (agent-1) holds nothing; neither does a fresh one of the
    // writer's agent.
    check(
        "another agent's session",
        rig.get(OTHER, "/messages", &[]).await,
    );
    let sibling = rig.proxy.session("agent-2").await;
    check(
        "a sibling session",
        rig.send_as(&sibling, "GET", OTHER, "/messages", &[]).await,
    );
    // Over h2 as well.
    let req = rig.request("GET", OTHER, "/messages", &[]);
    let reply = raw::send_h2(&mut rig.h2(OTHER).await, req).await.unwrap();
    check("over h2", reply);

    // The writer's session ends; its file secret does not, and stays redacted.
    rig.proxy
        .control()
        .delete_session(&writer.session_id)
        .await
        .expect("session deleted");
    let after = rig.proxy.session("agent-3").await;
    check(
        "a session started after the teardown",
        rig.send_as(&after, "GET", OTHER, "/messages", &[]).await,
    );
    // Nothing was ever injected towards the unbound host.
    for seen in rig.seen_at(OTHER) {
        assert!(seen.header("authorization").is_none(), "{seen:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_read_back_over_a_websocket_is_redacted() {
    let rig = Rig::start().await;
    leave_the_secret_upstream(&rig).await;
    // A real client (Python's `websockets`, which offers permessage-deflate: the proxy
    // offers the upstream no extension, so what comes back is readable) asks an unbound
    // host's socket for what was stored: as one message and in 7-byte fragments, so the
    // secret straddles frames.
    let env = rig.proxy.client_env(&rig.session);
    let url = format!("wss://{OTHER}:{}/ws", rig.upstream.port());
    for ask in ["messages", "messages in fragments"] {
        let out = ostiary_e2e::clients::python(
            ostiary_e2e::clients::client_script("py_ws.py"),
            &[&url, ask],
            &env.iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect::<Vec<_>>(),
        )
        .await;
        assert!(out.success(), "{ask}: {out}");
        let echo = out.json()["echo"].as_str().unwrap_or_default().to_owned();
        assert!(echo.contains("left by the writer"), "{ask}: {echo}");
        assert!(
            !echo.contains(CANARY),
            "{ask}: the secret came back: {echo}"
        );
        assert!(echo.contains(&bearer(REDACTED)), "{ask}: {echo}");
    }
    let ws = rig.upstream.seen_path("/ws");
    assert_eq!(ws.len(), 2, "{ws:#?}");
    for seen in ws {
        assert!(
            seen.header("sec-websocket-extensions").is_none(),
            "no extension is offered upstream: {seen:#?}"
        );
    }
}

/// A `file` (or `vault_kv`) value is the same in every process: what one process injected
/// and an upstream kept is redacted by the next one from its first answer, before it
/// injected anything itself (a restart here; another replica alike).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_left_upstream_before_a_restart_is_redacted_after_it() {
    let mut rig = Rig::start().await;
    leave_the_secret_upstream(&rig).await;
    rig.proxy.restart().await;
    let reader = rig.proxy.session("agent-3").await;
    let headers = [("range", "bytes=0-9")];
    let reply = rig
        .send_as(&reader, "GET", OTHER, "/messages", &headers)
        .await;
    assert_status(&reply, StatusCode::OK);
    assert_clean(&reply);
    let body = String::from_utf8_lossy(&reply.body).into_owned();
    assert!(body.contains(&bearer(REDACTED)), "{body}");
    assert!(body.contains("left by the writer"), "{body}");
    // Asked whole: a range could start inside the stored secret.
    let last = rig.seen_at(OTHER).pop().unwrap();
    assert_eq!(last.header("range"), None, "{last:#?}");
    for seen in rig.seen_at(OTHER) {
        assert!(seen.header("authorization").is_none(), "{seen:#?}");
    }
}
