//! Brokered credentials end to end with the file backend, the response side (docs/design.md §9,
//! THREATS "Credentials"): once the proxy has injected a secret, an upstream can hand it
//! straight back (a reflection, an error page, a redirect) and the agent must still never
//! see it. A real TLS upstream reflects whatever it receives (`/reflect?mode=…`); the
//! request side is `credentials_inject.rs`, the rig `support/credentials.rs`.
//!
//! What it proves:
//! - every reflection mode (JSON, gzip/br/zstd/deflate, base64, error page) reaches the
//!   client decoded and without the secret in any form, over HTTP/1.1 and h2; so do `HEAD`
//!   headers, SSE events as they stream, h2 trailers, a redirect's `Location` (and the
//!   host it points to gets nothing), an HTTP/1.1 reason phrase, a header *name* and a
//!   JSON-escaped echo;
//! - an undecodable encoding is refused (502) with nothing of the body, and the error does
//!   not rebuild a case-changed secret; a response without a secret is byte-identical;
//! - the canary appears in no audit record (API and raw SQLite), metric or error body.
//!
//! Every test starts its own upstream and proxy on loopback ports.

use http::StatusCode;
use http_body_util::BodyExt;
use ostiary_e2e::clients::curl;
use ostiary_e2e::raw::{self, Reply};
use serde_json::Value;

use crate::support::credentials as credentials_support;
use credentials_support::*;

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_response_headers_are_scrubbed() {
    let rig = Rig::start().await;
    let reply = rig
        .send_as(&rig.session, "HEAD", BOUND, "/reflect", &[])
        .await;
    assert_status(&reply, StatusCode::OK);
    assert!(reply.body.is_empty());
    assert_reflected_auth_redacted(&reply);
    assert_clean(&reply);
}

// ---------------------------------------------------------------------------------------
// 4. Scrubbing every reflect mode.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reflection_mode_is_scrubbed() {
    let rig = Rig::start().await;
    for mode in ["json", "gzip", "br", "zstd", "deflate", "b64", "error"] {
        let path = format!("/reflect?mode={mode}");
        let accept = [("accept-encoding", "gzip, br, zstd, deflate")];
        let reply = rig.get(BOUND, &path, &accept).await;
        assert_clean(&reply);
        let want = if mode == "error" { 500 } else { 200 };
        assert_eq!(reply.status.as_u16(), want, "{mode}: {reply}");
        assert!(
            reply.header("content-encoding").is_none(),
            "{mode}: the body must arrive decoded: {reply}"
        );
        let body = String::from_utf8_lossy(&reply.body).into_owned();
        match mode {
            "b64" => {
                // The base64 of the echo had the secret at some alignment; it is gone, and
                // a marker stands where it was.
                assert!(body.contains(REDACTED), "{mode}: {body}");
            }
            "error" => {
                assert!(body.contains("<h1>Internal Server Error</h1>"), "{body}");
                let line = format!("authorization: {}", bearer(REDACTED));
                assert!(body.contains(&line), "{body}");
            }
            _ => {
                let echo: Value = serde_json::from_str(&body)
                    .unwrap_or_else(|e| panic!("{mode}: decoded body is not JSON ({e}): {body}"));
                assert!(
                    echo["headers"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p[0] == "authorization" && p[1] == bearer(REDACTED)),
                    "{mode}: {echo}"
                );
                // The upstream was asked for identity: a credential-bearing request must
                // be scrubbable without decoding.
                let sent = rig.upstream.seen().last().unwrap().clone();
                assert_eq!(sent.header("accept-encoding"), Some("identity"), "{mode}");
            }
        }
    }
    assert_eq!(rig.seen_at(BOUND).len(), 7);
    for seen in rig.seen_at(BOUND) {
        assert_eq!(seen.header("authorization"), Some(bearer(CANARY).as_str()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reflection_mode_is_scrubbed_over_h2() {
    let rig = Rig::start().await;
    let mut sender = rig.h2(BOUND).await;
    for mode in ["json", "gzip", "zstd", "b64", "error"] {
        let uri = rig.url("https", BOUND, &format!("/reflect?mode={mode}"));
        let req = raw::request("GET", &uri, None);
        let reply = raw::send_h2(&mut sender, req).await.unwrap();
        assert_clean(&reply);
        assert!(contains(&reply.body, REDACTED), "{mode}: {reply}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_events_stream_scrubbed() {
    let rig = Rig::start().await;
    let mut sender = rig.h1(BOUND).await;
    let accept = [("accept", "text/event-stream")];
    let req = rig.request("GET", BOUND, "/reflect?mode=sse&delay_ms=2", &accept);
    let response = in_time("head", sender.send_request(req)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers().get("content-type").unwrap(),
        "text/event-stream"
    );
    let mut body = response.into_body();
    let mut all = Vec::new();
    let mut frames = 0;
    while let Some(frame) = in_time("frame", body.frame()).await {
        if let Ok(data) = frame.expect("frame").into_data() {
            frames += 1;
            assert_no_leak("sse frame", &data);
            all.extend_from_slice(&data);
        }
    }
    let text = String::from_utf8_lossy(&all);
    assert!(
        frames > 1,
        "the events streamed in several frames: {frames}"
    );
    let event = format!(
        "event: header\ndata: authorization: {}\n\n",
        bearer(REDACTED)
    );
    assert!(text.contains(&event), "{text}");
    assert!(text.ends_with("event: end\ndata: done\n\n"), "{text}");
    assert!(leaks_in("sse", &all, &ALL_SECRETS).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_encoding_is_refused_and_nothing_of_the_body_passes() {
    let rig = Rig::start().await;
    let reply = rig.get(BOUND, "/reflect?mode=compress", &[]).await;
    let (_, record) = raw::assert_refused(&rig.proxy, &reply, 502, "upstream_error").await;
    assert_clean(&reply);
    let body = String::from_utf8_lossy(&reply.body);
    assert!(
        !body.contains("\"headers\""),
        "echo content reached the client: {body}"
    );
    assert!(reply.header("x-reflect-authorization").is_none(), "{reply}");
    assert!(reply.header("set-cookie").is_none(), "{reply}");
    assert_eq!(record.credentials, vec!["github".to_owned()], "{record:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirect_location_is_scrubbed_and_the_next_host_gets_nothing() {
    let rig = Rig::start().await;
    // The 302 itself, read raw.
    let reply = rig.get(BOUND, "/reflect?mode=redirect", &[]).await;
    assert_status(&reply, StatusCode::FOUND);
    assert_clean(&reply);
    let location = reply
        .header("location")
        .unwrap_or_else(|| panic!("{reply}"));
    let target = rig.url("https", OTHER, "/reflect?auth=");
    assert!(location.starts_with(&target), "{location}");
    assert!(location.contains("REDACTED"), "{location}");

    // curl following it, through the proxy.
    let env = rig.env();
    let url = rig.url("https", BOUND, "/reflect?mode=redirect");
    let out = curl(&["-L", "-i", "--max-redirs", "2", &url], &borrow(&env)).await;
    let found = leaks_in("curl stdout", out.stdout.as_bytes(), &ALL_SECRETS);
    assert!(found.is_empty(), "{found:#?}\n{out}");
    assert!(
        leaks_in("curl stderr", out.stderr.as_bytes(), &ALL_SECRETS).is_empty(),
        "{out}"
    );
    let at_other = rig.seen_at(OTHER);
    assert_eq!(
        at_other.len(),
        1,
        "curl followed the redirect once:\n{out}\n{at_other:#?}"
    );
    let followed = &at_other[0];
    let towards = leaks_in(
        "redirect target",
        seen_text(followed).as_bytes(),
        &ALL_SECRETS,
    );
    assert!(
        towards.is_empty(),
        "re-injected or leaked towards {OTHER}: {followed:#?}"
    );
    assert!(followed.header("authorization").is_none(), "{followed:#?}");
    assert!(out.success(), "{out}");
    assert!(
        out.stdout.contains("HTTP/1.1 302") || out.stdout.contains("HTTP/2 302"),
        "{out}"
    );
}

/// `GET path` on `host` straight to the upstream (trusting its CA, no proxy).
async fn direct_get(rig: &Rig, host: &str, path: &str) -> Reply {
    let tcp = tokio::net::TcpStream::connect(rig.upstream.addr())
        .await
        .unwrap();
    let config = raw::client_config(&rig.upstream.ca_pem(), &[b"http/1.1"]);
    let tls = raw::tls(tcp, config, host).await.unwrap();
    let mut sender = raw::h1(tls).await;
    raw::send_h1(&mut sender, rig.request("GET", host, path, &[]))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_without_secrets_is_byte_identical() {
    let rig = Rig::start().await;
    let via_proxy = rig.get(BOUND, "/reflect?mode=plain", &[]).await;
    assert_status(&via_proxy, StatusCode::OK);
    let direct = direct_get(&rig, BOUND, "/reflect?mode=plain").await;
    assert_eq!(direct.status, StatusCode::OK);
    assert_eq!(direct.body, ostiary_e2e::upstream::plain_reflect_body());
    assert!(
        via_proxy.body == direct.body,
        "the proxy changed a body without secrets ({} vs {} bytes)",
        via_proxy.body.len(),
        direct.body.len()
    );
    assert_eq!(via_proxy.header("x-plain"), direct.header("x-plain"));
    assert_eq!(via_proxy.header("content-type"), Some("text/plain"));
    // The credential was injected all the same, so the scrubber was in the path.
    let injected = rig.seen_at(BOUND);
    assert_eq!(
        injected[0].header("authorization"),
        Some(bearer(CANARY).as_str())
    );
}

/// A rig, and `GET /reflect?mode=<mode>` to `host`, whose binding injects `secret` as
/// `X-Api-Key` (checked at the upstream).
async fn reflect_api_key(host: &str, secret: &str, mode: &str) -> (Rig, Reply) {
    let rig = Rig::start().await;
    let reply = rig.get(host, &format!("/reflect?mode={mode}"), &[]).await;
    assert_eq!(rig.only_seen_at(host).header("x-api-key"), Some(secret));
    (rig, reply)
}

/// An upstream that reflects a secret into a header *name*: the header is dropped (a name
/// cannot be redacted in place). Found by this test; `Scrubber::scrub_headers` once
/// rewrote values only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reflected_into_a_header_name_is_scrubbed() {
    let (_rig, reply) = reflect_api_key(LOWER_HOST, CANARY_LOWER, "names").await;
    assert_status(&reply, StatusCode::OK);
    // The value reflections are scrubbed...
    assert_eq!(reply.header("x-reflect-x-api-key"), Some(REDACTED));
    // ...and the name reflection must be too.
    assert_clean(&reply);
}

/// A PHP-style JSON echo escapes `/` as `\/`: a secret holding `/` (AWS secret keys do)
/// must be found in that form too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reflected_in_escaped_json_is_scrubbed() {
    let (_rig, reply) = reflect_api_key(SLASH_HOST, CANARY_SLASH, "json_slashes").await;
    assert_status(&reply, StatusCode::OK);
    assert_clean(&reply);
    let escaped = CANARY_SLASH.replace('/', "\\/");
    let body = String::from_utf8_lossy(&reply.body);
    assert!(
        !body.contains(&escaped),
        "the JSON-escaped secret {escaped} reached the client:\n{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_reflecting_the_secret_are_scrubbed() {
    let rig = Rig::start().await;
    let mut sender = rig.h2(BOUND).await;
    let uri = rig.url("https", BOUND, "/reflect?mode=trailers");
    let req = raw::request("GET", &uri, None);
    let response = in_time("head", sender.send_request(req)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let collected = in_time("body", response.into_body().collect())
        .await
        .unwrap();
    let trailers = collected
        .trailers()
        .cloned()
        .expect("the upstream's trailers reach an h2 client");
    assert_eq!(
        trailers
            .get("x-trailer-authorization")
            .map(|v| v.to_str().unwrap()),
        Some(bearer(REDACTED).as_str()),
        "{trailers:?}"
    );
    for (name, value) in &trailers {
        assert_no_leak(&format!("trailer {name}"), value.as_bytes());
    }
    assert_no_leak("body", &collected.to_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reason_phrase_reflecting_the_secret_is_scrubbed() {
    let rig = Rig::start_with("5m", ostiary_e2e::proxy::ALLOW_ALL, None, false).await;
    let mut wire = raw::Wire::new(rig.tunnel(BOUND, &[b"http/1.1"]).await);
    let head = format!(
        "GET /reflect?mode=reason HTTP/1.1\r\nHost: {BOUND}:{}\r\nConnection: close\r\n\r\n",
        rig.upstream.port()
    );
    wire.send(head.as_bytes()).await.unwrap();
    // Read the raw bytes: the status line is what matters here.
    let mut tls = wire.into_inner();
    let mut bytes = Vec::new();
    let read = tokio::io::AsyncReadExt::read_to_end(&mut tls, &mut bytes);
    let _ = in_time("answer", read).await;
    let text = String::from_utf8_lossy(&bytes);
    let status_line = text.lines().next().unwrap_or_default();
    // The reflected phrase arrives, scrubbed.
    let want = format!("HTTP/1.1 200 Echo {}", bearer(REDACTED));
    assert_eq!(status_line, want, "{text}");
    assert!(
        rig.only_seen_at(BOUND).header("authorization") == Some(&bearer(CANARY)),
        "the upstream got the credential"
    );
    let found = leaks_in("raw response", &bytes, &ALL_SECRETS);
    assert!(found.is_empty(), "{found:#?}\n{text}");
}

/// An upstream answering `Content-Encoding: <SECRET IN UPPER CASE>` (the header scrub is
/// case-sensitive): the 502 that refuses the undecodable body must not name the coding,
/// since lowercasing it for the message would rebuild the secret in the body, the audit
/// `reason` and the log line. Found by this test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_case_changed_secret_in_content_encoding_is_not_rebuilt_in_the_error() {
    let (rig, reply) = reflect_api_key(LOWER_HOST, CANARY_LOWER, "encoding_upper").await;
    let (_, record) = raw::assert_refused(&rig.proxy, &reply, 502, "upstream_error").await;
    let audit = serde_json::to_string(&record).unwrap();
    let mut found = leaks(&reply, &ALL_SECRETS);
    found.extend(leaks_in("audit record", audit.as_bytes(), &ALL_SECRETS));
    assert!(found.is_empty(), "{found:#?}\n{reply}");
}

// ---------------------------------------------------------------------------------------
// 8. The canary in audit, metrics and error bodies.

/// No form of any secret in any cell of any table of the SQLite store at `db`.
fn assert_no_leak_in_sqlite(db: &std::path::Path) {
    use rusqlite::types::ValueRef;
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(tables.iter().any(|t| t.contains("audit")), "{tables:?}");
    let mut cells = 0usize;
    for table in &tables {
        let mut stmt = conn.prepare(&format!("SELECT * FROM \"{table}\"")).unwrap();
        let columns = stmt.column_count();
        let mut rows = stmt.query([]).unwrap();
        while let Some(row) = rows.next().unwrap() {
            for i in 0..columns {
                let bytes: Vec<u8> = match row.get_ref(i).unwrap() {
                    ValueRef::Text(t) | ValueRef::Blob(t) => t.to_vec(),
                    other => format!("{other:?}").into_bytes(),
                };
                cells += 1;
                assert_no_leak(&format!("{table} column {i}"), &bytes);
            }
        }
    }
    assert!(cells > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_canary_is_in_no_audit_record_metric_or_error_body() {
    let rig = Rig::start().await;
    let mut replies = Vec::new();
    for path in [
        "/reflect",
        "/reflect?mode=gzip",
        "/reflect?mode=error",
        "/reflect?mode=compress",
        "/reflect?mode=redirect",
    ] {
        // The SDK's placeholder, at its binding's injection point.
        let placeholder = [("authorization", "Bearer ostiary:github")];
        replies.push(rig.get(BOUND, path, &placeholder).await);
    }
    for (host, path) in [
        (OTHER, "/reflect?t=ostiary:github"),
        (CRLF_HOST, "/reflect"),
        (MISSING_HOST, "/reflect"),
        (BASIC_HOST, "/reflect?mode=error"),
        (QUERY_HOST, "/reflect?mode=redirect&api_key=x"),
    ] {
        replies.push(rig.get(host, path, &[]).await);
    }
    replies.push(rig.plain_get(BOUND, "/reflect").await);
    let statuses: Vec<u16> = replies.iter().map(|r| r.status.as_u16()).collect();
    assert_eq!(
        statuses,
        [200, 200, 500, 502, 302, 403, 503, 503, 500, 302, 403]
    );
    for reply in &replies {
        assert_clean(reply);
    }
    // The upstream did receive them (the canary existed in the exchange).
    assert!(rig
        .seen_at(BOUND)
        .iter()
        .all(|s| s.header("authorization") == Some(bearer(CANARY).as_str())));

    // Audit, through the API...
    let records = rig.proxy.audit().await;
    assert!(records.len() >= replies.len(), "{records:#?}");
    let json = serde_json::to_string(&records).unwrap();
    assert_no_leak("audit records", json.as_bytes());
    // ...and every cell of every table of the SQLite store.
    assert_no_leak_in_sqlite(&rig.proxy.shared.db_path);

    // Metrics.
    let metrics = reqwest::Client::new()
        .get(format!("http://{}/metrics", rig.proxy.control_addr))
        .bearer_auth(&rig.proxy.admin_token)
        .send()
        .await
        .unwrap();
    assert!(metrics.status().is_success());
    let metrics = metrics.text().await.unwrap();
    assert!(
        metrics.contains("github"),
        "credential metrics name the binding:\n{metrics}"
    );
    assert!(
        metrics.lines().any(|l| !l.starts_with('#')
            && l.contains("exfiltration")
            && l.contains("\"github\"")
            && !l.ends_with(" 0")),
        "the placeholder exfiltration attempt is counted:\n{metrics}"
    );
    assert_no_leak("metrics", metrics.as_bytes());
}
