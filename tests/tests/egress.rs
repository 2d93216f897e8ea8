//! The egress (SSRF) guard under attack (THREATS.md, "Egress and SSRF"): blocked address
//! ranges, IPv4 hidden in IPv6, odd spellings, DNS rebinding, the proxy's own listeners,
//! unlisted and nonsense ports, raw-IP detours and agent-supplied routing headers
//! (uninspected `egress.tunnel` relays are in `tunnels.rs`).
//!
//! Safety: every test that names an address outside loopback runs the proxy with a
//! [`StubResolver`] and a [`RecordingDialer`] (which refuses to connect anywhere but
//! loopback), and asserts what was dialed: even a broken guard cannot send a packet off
//! the machine. Where the guard is what must refuse, the policy permits everything
//! ([`ALLOW_ALL`]) so that the refusal cannot come from Cedar.

use std::net::SocketAddr;

use ostiary_e2e::proxy::{ProxySpec, ALLOW_ALL};
use ostiary_e2e::raw::{assert_refused, auth_line, connect, h1, intercepted, request, send_h1};
use ostiary_e2e::upstream::Upstream;

use crate::support::egress as support;
use support::*;

/// Host as written in a URL → (`address` in the refusal, `reason`, canonical audit host).
const BLOCKED: &[(&str, &str, &str, &str)] = &[
    (
        "169.254.169.254",
        "169.254.169.254",
        "link_local",
        "169.254.169.254",
    ),
    ("10.0.0.1", "10.0.0.1", "private", "10.0.0.1"),
    ("172.16.0.1", "172.16.0.1", "private", "172.16.0.1"),
    ("192.168.1.1", "192.168.1.1", "private", "192.168.1.1"),
    ("100.64.0.1", "100.64.0.1", "cgnat", "100.64.0.1"),
    ("0.0.0.0", "0.0.0.0", "unspecified", "0.0.0.0"),
    ("224.0.0.1", "224.0.0.1", "multicast", "224.0.0.1"),
    // allow_private is 127.0.0.1/32 here: it does not cover ::1.
    ("[::1]", "::1", "loopback", "::1"),
    // An IPv4-mapped literal *is* its IPv4 address (normalised before anything else).
    ("[::ffff:10.0.0.1]", "10.0.0.1", "private", "10.0.0.1"),
    (
        "[64:ff9b::a00:1]",
        "64:ff9b::a00:1",
        "private",
        "64:ff9b::a00:1",
    ),
    (
        "[2002:a00:1::1]",
        "2002:a00:1::1",
        "private",
        "2002:a00:1::1",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_addresses_are_403_at_connect_and_in_absolute_form_without_a_dial() {
    let (stub, dialer, options) = seams();
    let (proxy, session) = started(ProxySpec {
        policies: ALLOW_ALL.into(),
        options,
        ..Default::default()
    })
    .await;
    for &(host, address, reason, canonical) in BLOCKED {
        let reply = connect_as(&proxy, &session, &format!("{host}:443")).await;
        let (body, record) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
        assert_eq!(body["address"], address, "CONNECT {host}");
        assert_eq!(body["reason"], reason, "CONNECT {host}");
        assert_eq!(record.kind, "connect");
        assert_eq!(record.host.as_deref(), Some(canonical), "CONNECT {host}");
        assert_eq!(record.port, Some(443));

        let reply = get_as(
            &proxy,
            &session,
            &format!("http://{host}/latest/meta-data"),
            "",
        )
        .await;
        let (body, record) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
        assert_eq!(body["address"], address, "GET http://{host}/");
        assert_eq!(body["reason"], reason, "GET http://{host}/");
        assert_eq!(record.kind, "http");
        assert_eq!(
            record.host.as_deref(),
            Some(canonical),
            "GET http://{host}/"
        );
        assert_eq!(
            record.policies,
            vec!["allow-all-http".to_owned()],
            "policy allowed it: the guard is what refused"
        );
    }
    assert!(dialer.dials().is_empty(), "{:?}", dialer.dials());
    assert!(stub.lookups().is_empty(), "IP literals are never resolved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_is_blocked_when_allow_private_is_empty() {
    let (stub, dialer, options) = seams();
    stub.answer("localhost", vec![vec![ip("127.0.0.1")]]);
    let (proxy, session) = started(ProxySpec {
        policies: ALLOW_ALL.into(),
        allow_private: Some(vec![]),
        options,
        ..Default::default()
    })
    .await;
    for host in ["127.0.0.1", "localhost", "api.example.test"] {
        let reply = connect_as(&proxy, &session, &format!("{host}:443")).await;
        let (body, _) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
        assert_eq!(body["address"], "127.0.0.1", "{host}");
        assert_eq!(body["reason"], "loopback", "{host}");
        let reply = get_as(&proxy, &session, &format!("http://{host}/"), "").await;
        let (body, _) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
        assert_eq!(body["address"], "127.0.0.1", "{host}");
    }
    assert!(dialer.dials().is_empty(), "{:?}", dialer.dials());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_resolving_to_blocked_addresses_are_403_without_a_dial() {
    let (stub, dialer, options) = seams();
    stub.answer("internal.test", vec![vec![ip("10.0.0.5")]]);
    stub.answer("metadata.test", vec![vec![ip("169.254.169.254")]]);
    stub.answer("ula.test", vec![vec![ip("fd00::1")]]);
    stub.answer("mapped.test", vec![vec![ip("::ffff:192.168.0.1")]]);
    // A mixed answer is refused whole, even though its first address may be reached.
    stub.answer("mixed.test", vec![vec![ip("127.0.0.1"), ip("10.0.0.1")]]);
    let (proxy, session) = started(ProxySpec {
        policies: ALLOW_ALL.into(),
        options,
        ..Default::default()
    })
    .await;
    let cases = [
        ("internal.test", "10.0.0.5", "private"),
        ("metadata.test", "169.254.169.254", "link_local"),
        ("ula.test", "fd00::1", "unique_local"),
        ("mapped.test", "::ffff:192.168.0.1", "private"),
        ("mixed.test", "10.0.0.1", "private"),
    ];
    for (name, address, reason) in cases {
        let reply = connect_as(&proxy, &session, &format!("{name}:443")).await;
        let (body, record) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
        assert_eq!(body["address"], address, "CONNECT {name}");
        assert_eq!(body["reason"], reason, "CONNECT {name}");
        assert_eq!(record.host.as_deref(), Some(name));
        let reply = get_as(&proxy, &session, &format!("http://{name}/"), "").await;
        let (body, _) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
        assert_eq!(body["address"], address, "GET {name}");
    }
    assert!(dialer.dials().is_empty(), "{:?}", dialer.dials());
    let mut lookups = stub.lookups();
    lookups.sort();
    assert_eq!(
        lookups,
        vec![
            "internal.test",
            "mapped.test",
            "metadata.test",
            "mixed.test",
            "ula.test"
        ],
        "each name is resolved once (the answer is cached between CONNECT and GET)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_spellings_are_normalised_then_blocked() {
    let (stub, dialer, options) = seams();
    stub.answer("xn--bcher-kva.test", vec![vec![ip("10.9.9.9")]]);
    let (proxy, session) = started(ProxySpec {
        policies: ALLOW_ALL.into(),
        allow_private: Some(vec![]),
        options,
        ..Default::default()
    })
    .await;
    // Written as → canonical host (audit, Cedar entity id) and the address refused.
    let cases = [
        ("2130706433", "127.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1", "127.0.0.1"),
        ("api.example.test.", "api.example.test", "127.0.0.1"),
        ("API.Example.TEST", "api.example.test", "127.0.0.1"),
        ("XN--BCHER-KVA.test.", "xn--bcher-kva.test", "10.9.9.9"),
    ];
    for (written, canonical, address) in cases {
        let reply = connect_as(&proxy, &session, &format!("{written}:443")).await;
        let (body, record) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
        assert_eq!(body["address"], address, "CONNECT {written}");
        assert_eq!(record.host.as_deref(), Some(canonical), "CONNECT {written}");
        let reply = get_as(&proxy, &session, &format!("http://{written}/"), "").await;
        let (body, record) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
        assert_eq!(body["address"], address, "GET {written}");
        assert_eq!(record.host.as_deref(), Some(canonical), "GET {written}");
    }
    assert!(dialer.dials().is_empty(), "{:?}", dialer.dials());
    assert_eq!(
        stub.lookups(),
        vec!["xn--bcher-kva.test"],
        "the resolver is asked the canonical name, once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_spellings_are_decided_by_policy_on_the_canonical_host() {
    let upstream = Upstream::builder().tls(false).start().await;
    let (_stub, dialer, options) = seams();
    let (proxy, session) = started(ProxySpec {
        policies: r#"
@id("allow-http")
permit (principal, action == Ostiary::Action::"http", resource);
@id("forbid-loopback-literal")
forbid (principal, action, resource == Ostiary::Host::"127.0.0.1");
"#
        .into(),
        ports: vec![upstream.port()],
        options,
        ..Default::default()
    })
    .await;
    let port = upstream.port();
    for written in [
        "127.0.0.1",
        "2130706433",
        "0x7f.1",
        "127.1",
        "0177.0.0.1",
        "127.0.0.1.",
    ] {
        let url = format!("http://{written}:{port}/echo");
        let reply = get_as(&proxy, &session, &url, "").await;
        let (body, record) = assert_refused(&proxy, &reply, 403, "denied").await;
        assert_eq!(body["resource"], "Ostiary::Host::\"127.0.0.1\"", "{url}");
        assert_eq!(
            body["policies"],
            serde_json::json!(["forbid-loopback-literal"])
        );
        assert_eq!(record.host.as_deref(), Some("127.0.0.1"));
    }
    assert_eq!(
        upstream.connections(),
        0,
        "a denied spelling is never forwarded"
    );

    let reply = get_as(
        &proxy,
        &session,
        &format!("http://API.Example.TEST.:{port}/echo"),
        "",
    )
    .await;
    assert_eq!(reply.status, 200, "{reply}");
    let record = only_allowed_http(&proxy).await;
    assert_eq!(record.host.as_deref(), Some("api.example.test"));
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].header("host"),
        Some(&*format!("api.example.test:{port}")),
        "the upstream is addressed by the canonical host"
    );
    assert_eq!(dialer.dials(), vec![upstream.addr()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_rebinding_gets_one_question_and_the_checked_address_is_dialed() {
    let upstream = Upstream::builder().names(&["rebind.test"]).start().await;
    let plain = Upstream::builder().tls(false).start().await;
    let (stub, dialer, options) = seams();
    // First answer allowed (allow_private 127.0.0.1/32), every later one private.
    stub.answer(
        "rebind.test",
        vec![vec![ip("127.0.0.1")], vec![ip("10.0.0.1")]],
    );
    stub.answer(
        "rebind-plain.test",
        vec![vec![ip("127.0.0.1")], vec![ip("10.0.0.1")]],
    );
    let (proxy, session) = started(ProxySpec {
        policies: ALLOW_ALL.into(),
        names: vec![],
        ports: vec![upstream.port(), plain.port()],
        upstream_ca_pem: Some(upstream.ca_pem()),
        options,
        ..Default::default()
    })
    .await;
    let host = format!("rebind.test:{}", upstream.port());
    for _ in 0..2 {
        let tunnel = intercepted(
            &proxy,
            &session.token,
            "rebind.test",
            upstream.port(),
            &[b"http/1.1"],
        )
        .await;
        let mut sender = h1(tunnel).await;
        for _ in 0..2 {
            let reply = send_h1(&mut sender, request("GET", "/echo", Some(&host)))
                .await
                .unwrap();
            assert_eq!(reply.status, 200, "{reply}");
        }
    }
    let plain_url = format!("http://rebind-plain.test:{}/echo", plain.port());
    for _ in 0..2 {
        let reply = get_as(&proxy, &session, &plain_url, "").await;
        assert_eq!(reply.status, 200, "{reply}");
    }
    assert_eq!(upstream.count("/echo"), 4);
    assert_eq!(plain.count("/echo"), 2);
    assert_eq!(
        stub.lookups(),
        vec!["rebind.test", "rebind-plain.test"],
        "each name was resolved exactly once"
    );
    let dials = dialer.dials();
    assert!(!dials.is_empty());
    assert!(
        dials
            .iter()
            .all(|d| *d == upstream.addr() || *d == plain.addr()),
        "only the checked addresses were dialed: {dials:?}"
    );
    for record in proxy.audit().await.iter().filter(|r| r.kind == "http") {
        let dialed: SocketAddr = record.upstream.as_deref().unwrap().parse().unwrap();
        assert!(dialed.ip().is_loopback(), "{record:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_own_listeners_are_never_reachable() {
    let (stub, dialer, options) = seams();
    stub.answer("localhost", vec![vec![ip("127.0.0.1")]]);
    // Loopback allowed as widely as it gets, and ALLOW_ALL's connect permit opens every port.
    let (proxy, session) = started(ProxySpec {
        policies: ALLOW_ALL.into(),
        allow_private: Some(vec!["127.0.0.0/8".into(), "::1/128".into()]),
        options,
        ..Default::default()
    })
    .await;
    let control = proxy.control_addr.port();
    let own = proxy.proxy_addr.port();
    let absolute = [
        (
            format!("http://127.0.0.1:{control}/healthz"),
            format!("127.0.0.1:{control}"),
        ),
        (
            format!("http://localhost:{control}/healthz"),
            format!("127.0.0.1:{control}"),
        ),
        (
            format!("http://127.0.0.2:{control}/healthz"),
            format!("127.0.0.2:{control}"),
        ),
        (
            format!("http://[::1]:{control}/healthz"),
            format!("[::1]:{control}"),
        ),
        (
            format!("http://[::ffff:127.0.0.1]:{control}/v1/audit"),
            format!("127.0.0.1:{control}"),
        ),
        (
            format!("http://2130706433:{control}/healthz"),
            format!("127.0.0.1:{control}"),
        ),
        (
            format!("http://127.0.0.1:{own}/"),
            format!("127.0.0.1:{own}"),
        ),
    ];
    for (url, address) in &absolute {
        let reply = get_as(&proxy, &session, url, "").await;
        let (body, _) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
        assert_eq!(body["address"], *address, "{url}");
        assert_eq!(body["reason"], "the proxy's own listener", "{url}");
    }
    let tunnels = [
        (format!("127.0.0.1:{own}"), format!("127.0.0.1:{own}")),
        (format!("localhost:{own}"), format!("127.0.0.1:{own}")),
        (
            format!("localhost:{control}"),
            format!("127.0.0.1:{control}"),
        ),
        (format!("[::1]:{control}"), format!("[::1]:{control}")),
    ];
    for (authority, address) in &tunnels {
        let reply = connect_as(&proxy, &session, authority).await;
        let (body, _) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
        assert_eq!(body["address"], *address, "CONNECT {authority}");
    }
    assert!(dialer.dials().is_empty(), "{:?}", dialer.dials());
}

const HTTP_ONLY: &str = r#"
@id("allow-http")
permit (principal, action == Ostiary::Action::"http", resource);
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_unlisted_ports_is_403_without_a_port_permit() {
    let (_stub, dialer, options) = seams();
    let (proxy, session) = started(ProxySpec {
        policies: HTTP_ONLY.into(),
        options,
        ..Default::default()
    })
    .await;
    for port in [22, 25, 5432, 6379] {
        let reply = connect_as(&proxy, &session, &format!("api.example.test:{port}")).await;
        let (body, record) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
        assert_eq!(body["address"], format!("api.example.test:{port}"));
        let reason = body["reason"].as_str().unwrap();
        assert!(reason.contains("not in egress.ports"), "{reason}");
        assert_eq!(record.port, Some(port));
        // The same rule holds for plain http to that port.
        let reply = get_as(
            &proxy,
            &session,
            &format!("http://api.example.test:{port}/"),
            "",
        )
        .await;
        let (body, _) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
        assert_eq!(body["address"], format!("api.example.test:{port}"));
    }
    assert!(dialer.dials().is_empty(), "{:?}", dialer.dials());
}

/// The documented behaviour (docs/design.md §8, evaluate.rs): a `connect` permit naming a port
/// opens that port to CONNECT; the tunnel is then intercepted and every request inside it
/// is decided as `http` as usual. Other unlisted ports stay closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_permit_naming_a_port_opens_that_port_only() {
    let upstream = Upstream::builder().start().await;
    let (_stub, dialer, options) = seams();
    let policies = format!(
        r#"{HTTP_ONLY}
@id("open-redis-port")
permit (principal, action == Ostiary::Action::"connect", resource)
when {{ context.port == 6379 }};
@id("open-upstream-port")
permit (principal, action == Ostiary::Action::"connect", resource == Ostiary::Host::"api.example.test")
when {{ context.port == {} }};
"#,
        upstream.port()
    );
    let (proxy, session) = started(ProxySpec {
        policies,
        upstream_ca_pem: Some(upstream.ca_pem()),
        options,
        ..Default::default()
    })
    .await;
    let (_wire, reply) = connect(
        proxy.proxy_addr,
        "api.example.test:6379",
        &auth_line(&session.token),
    )
    .await;
    assert_eq!(reply.status, 200, "the port permit opens 6379:\n{reply}");
    for port in [22, 5432] {
        let reply = connect_as(&proxy, &session, &format!("api.example.test:{port}")).await;
        assert_refused(&proxy, &reply, 403, "destination_blocked").await;
    }
    // End to end on a port outside egress.ports that a permit names.
    let tunnel = intercepted(
        &proxy,
        &session.token,
        "api.example.test",
        upstream.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut sender = h1(tunnel).await;
    let host = format!("api.example.test:{}", upstream.port());
    let reply = send_h1(&mut sender, request("GET", "/echo", Some(&host)))
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(upstream.count("/echo"), 1);
    assert_eq!(
        dialer.dials(),
        vec![upstream.addr()],
        "accepting CONNECT :6379 dialed nothing; only the upstream was dialed"
    );
    // The audit records name the policy that opened each port.
    let records = proxy.audit().await;
    let opened = |port: u16| {
        records
            .iter()
            .find(|r| r.kind == "connect" && r.port == Some(port) && r.decision == "allow")
            .unwrap_or_else(|| panic!("no allowed CONNECT to {port}: {records:#?}"))
            .policies
            .clone()
    };
    assert_eq!(opened(6379), vec!["open-redis-port".to_owned()]);
    assert_eq!(
        opened(upstream.port()),
        vec!["open-upstream-port".to_owned()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonsense_ports_are_400() {
    let (_stub, dialer, options) = seams();
    let (proxy, session) = started(ProxySpec {
        policies: ALLOW_ALL.into(),
        options,
        ..Default::default()
    })
    .await;
    let connects = [
        ("api.example.test:0", "port 0 is not a destination"),
        ("api.example.test:99999", "port is larger than 65535"),
        ("api.example.test:abc", "port is not a decimal number"),
        ("api.example.test:+443", "port is not a decimal number"),
        ("api.example.test:", "empty port"),
        ("api.example.test", "CONNECT target has no port"),
    ];
    for (authority, why) in connects {
        let reply = connect_as(&proxy, &session, authority).await;
        let (body, record) = assert_refused(&proxy, &reply, 400, "bad_request").await;
        assert!(body["reason"].as_str().unwrap().contains(why), "{reply}");
        assert_eq!(record.kind, "connect");
    }
    let urls = [
        ("http://api.example.test:0/", "port 0 is not a destination"),
        (
            "http://api.example.test:99999/",
            "port is larger than 65535",
        ),
        (
            "http://api.example.test:abc/",
            "port is not a decimal number",
        ),
    ];
    for (url, why) in urls {
        let reply = get_as(&proxy, &session, url, "").await;
        let (body, record) = assert_refused(&proxy, &reply, 400, "bad_request").await;
        assert!(body["reason"].as_str().unwrap().contains(why), "{reply}");
        assert_eq!(record.kind, "http");
    }
    assert!(dialer.dials().is_empty(), "{:?}", dialer.dials());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_hostname_reached_by_its_raw_ip_is_still_denied() {
    let upstream = Upstream::builder().tls(false).start().await;
    let (_stub, dialer, options) = seams();
    let (proxy, session) = started(ProxySpec {
        policies: r#"
@id("allow-api")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test");
"#
        .into(),
        ports: vec![upstream.port()],
        options,
        ..Default::default()
    })
    .await;
    let port = upstream.port();
    for written in ["127.0.0.1", "2130706433", "[::ffff:127.0.0.1]"] {
        let reply = get_as(
            &proxy,
            &session,
            &format!("http://{written}:{port}/echo"),
            "",
        )
        .await;
        let (body, _) = assert_refused(&proxy, &reply, 403, "denied").await;
        assert_eq!(
            body["resource"], "Ostiary::Host::\"127.0.0.1\"",
            "{written}"
        );
        assert_eq!(body["action"], "Ostiary::Action::\"http\"");
    }
    // CONNECT by IP: no permit's scope names the address, so it is refused at CONNECT,
    // before any TLS or dial.
    let reply = connect_as(&proxy, &session, &format!("127.0.0.1:{port}")).await;
    let (body, _) = assert_refused(&proxy, &reply, 403, "denied").await;
    assert_eq!(body["resource"], "Ostiary::Host::\"127.0.0.1\"", "{body}");
    assert_eq!(upstream.connections(), 0);
    let reply = get_as(&proxy, &session, &upstream.url("/echo"), "").await;
    assert_eq!(
        reply.status, 200,
        "the hostname itself is allowed:\n{reply}"
    );
    assert_eq!(dialer.dials(), vec![upstream.addr()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_supplied_routing_headers_are_ignored() {
    let plain = Upstream::builder().tls(false).start().await;
    let tls_up = Upstream::builder().start().await;
    let (stub, dialer, options) = seams();
    // If the proxy ever routed by a header, evil.test would be looked up (and reachable).
    stub.answer("evil.test", vec![vec![ip("127.0.0.1")]]);
    let (proxy, session) = started(ProxySpec {
        policies: r#"
@id("allow-api")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test");
@id("forbid-evil")
forbid (principal, action, resource == Ostiary::Host::"evil.test");
"#
        .into(),
        ports: vec![plain.port(), tls_up.port()],
        upstream_ca_pem: Some(tls_up.ca_pem()),
        options,
        ..Default::default()
    })
    .await;
    let port = plain.port();
    let evil = format!(
        "X-Forwarded-Host: evil.test\r\nX-Upstream-Host: evil.test:{port}\r\n\
         X-Upstream-Url: http://evil.test:{port}/\r\nForwarded: host=evil.test\r\n"
    );
    // The URL names the allowed host; `Host` and the routing headers name another.
    let request_text = format!(
        "GET http://api.example.test:{port}/echo HTTP/1.1\r\nHost: evil.test:{port}\r\n{}{evil}\
         Connection: close\r\n\r\n",
        auth_line(&session.token)
    );
    let reply = ostiary_e2e::raw::exchange(proxy.proxy_addr, request_text.as_bytes())
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    let record = only_allowed_http(&proxy).await;
    assert_eq!(record.host.as_deref(), Some("api.example.test"));
    let seen = plain.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].header("host"),
        Some(&*format!("api.example.test:{port}"))
    );

    // The URL names the forbidden host; the headers claim the allowed one.
    let reply = get_as(
        &proxy,
        &session,
        &format!("http://evil.test:{port}/echo"),
        "X-Forwarded-Host: api.example.test\r\nX-Upstream-Host: api.example.test\r\n",
    )
    .await;
    let (body, _) = assert_refused(&proxy, &reply, 403, "denied").await;
    assert_eq!(body["resource"], "Ostiary::Host::\"evil.test\"");
    assert_eq!(plain.seen().len(), 1);

    // Inside an intercepted tunnel the same headers change nothing either.
    let tunnel = intercepted(
        &proxy,
        &session.token,
        "api.example.test",
        tls_up.port(),
        &[b"http/1.1"],
    )
    .await;
    let mut sender = h1(tunnel).await;
    let mut req = request(
        "GET",
        "/echo",
        Some(&format!("api.example.test:{}", tls_up.port())),
    );
    for line in evil.split("\r\n").filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(": ").unwrap();
        req.headers_mut().insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    let reply = send_h1(&mut sender, req).await.unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(tls_up.seen()[0].sni.as_deref(), Some("api.example.test"));

    assert!(
        !stub.lookups().iter().any(|l| l == "evil.test"),
        "{:?}",
        stub.lookups()
    );
    assert!(
        dialer
            .dials()
            .iter()
            .all(|d| *d == plain.addr() || *d == tls_up.addr()),
        "{:?}",
        dialer.dials()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv4_inside_nat64_local_use_isatap_and_teredo_addresses_is_judged_without_a_dial() {
    let (stub, dialer, options) = seams();
    // Name → the address its (stub) DNS answers → the reason the guard must give.
    let cases = [
        // RFC 8215 local-use prefix, the /96 layout and the /64 and /56 ones (whose /96
        // reading, 8.0.0.0 and 0.0.0.0, would hide the private address).
        ("nat64-local.test", "64:ff9b:1::a00:1", "private"),
        ("nat64-metadata.test", "64:ff9b:1::a9fe:a9fe", "link_local"),
        ("nat64-layout64.test", "64:ff9b:1:0:a:0:800:0", "private"),
        ("nat64-layout56.test", "64:ff9b:1:c0:a8:101::", "private"),
        // ISATAP interface ids carry the IPv4 address a host's ISATAP interface delivers to.
        ("isatap.test", "2606:4700:1:2:0:5efe:a00:1", "private"),
        (
            "isatap-global.test",
            "2606:4700:1:2:200:5efe:a9fe:a9fe",
            "link_local",
        ),
        // Teredo (client 10.0.0.1, XOR-obfuscated) and IPv4-compatible are refused whole.
        (
            "teredo.test",
            "2001:0:4136:e378:8000:63bf:f5ff:fffe",
            "teredo",
        ),
        ("compat.test", "::a00:1", "ipv4_compatible"),
    ];
    for (name, address, _) in cases {
        stub.answer(name, vec![vec![ip(address)]]);
    }
    stub.answer("nat64-public.test", vec![vec![ip("64:ff9b:1::808:808")]]);
    let (proxy, session) = started(ProxySpec {
        policies: ALLOW_ALL.into(),
        options,
        ..Default::default()
    })
    .await;
    let same_ip = |body: &serde_json::Value, want: &str| {
        body["address"]
            .as_str()
            .and_then(|a| a.parse::<std::net::IpAddr>().ok())
            == Some(ip(want))
    };
    for (name, address, reason) in cases {
        let reply = connect_as(&proxy, &session, &format!("{name}:443")).await;
        let (body, _) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
        assert!(same_ip(&body, address), "CONNECT {name}: {body}");
        assert_eq!(body["reason"], reason, "CONNECT {name}: {body}");
        let reply = get_as(&proxy, &session, &format!("http://{name}/"), "").await;
        let (body, _) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
        assert!(same_ip(&body, address), "GET {name}: {body}");
        assert_eq!(body["reason"], reason, "GET {name}: {body}");
    }
    // The same addresses as IP literals.
    for literal in [
        "[64:ff9b:1::a00:1]",
        "[64:ff9b:1:0:a:0:800:0]",
        "[2606:4700:1:2:0:5efe:a00:1]",
    ] {
        let reply = get_as(&proxy, &session, &format!("http://{literal}/"), "").await;
        let (body, _) = assert_refused(&proxy, &reply, 403, "destination_blocked").await;
        assert_eq!(body["reason"], "private", "{literal}: {body}");
    }
    assert!(dialer.dials().is_empty(), "{:?}", dialer.dials());

    // A public IPv4 behind the local-use prefix is let through to the dialer (which, being
    // the recording one, refuses anything but loopback: nothing leaves the machine).
    let reply = get_as(&proxy, &session, "http://nat64-public.test/", "").await;
    assert_eq!(reply.status, 502, "{reply}");
    assert_eq!(
        dialer.dials(),
        vec!["[64:ff9b:1::808:808]:80".parse::<SocketAddr>().unwrap()]
    );
}
