//! Self-tests of the test harness with real client programs: curl and the Python clients
//! reach every route of the test upstream directly, its certificates pass Python's strict
//! verification, and the clients take the proxy and CA from the environment (checked
//! against a stand-in CONNECT proxy), so the end-to-end tests can trust them.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ostiary_e2e::clients::{self, client_script, CmdOutput};
use ostiary_e2e::pki::TestCa;
use ostiary_e2e::upstream::{grpc_frame, Upstream};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

// ---- real clients, directly against the upstream ----

fn curl_base(up: &Upstream, ca: &str) -> Vec<String> {
    vec![
        "--cacert".into(),
        ca.into(),
        "--resolve".into(),
        up.resolve_arg(),
    ]
}

async fn curl_with(up: &Upstream, ca: &str, extra: &[&str]) -> CmdOutput {
    let mut args = curl_base(up, ca);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    clients::curl(&args, &[]).await
}

#[tokio::test]
async fn curl_reaches_every_route() {
    let up = Upstream::builder().start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = up.write_ca(dir.path());
    let ca = ca.to_str().unwrap();

    for (flag, version) in [("--http1.1", "HTTP/1.1"), ("--http2", "HTTP/2.0")] {
        let out = curl_with(&up, ca, &[flag, "-d", "abc", &up.url("/echo?q=1")]).await;
        assert!(out.success(), "{out}");
        let v = out.json();
        assert_eq!(v["version"], version, "{out}");
        assert_eq!(v["method"], "POST");
        assert_eq!(v["body_len"], 3);
        assert_eq!(v["query"], "q=1");
    }

    let out = curl_with(&up, ca, &["--http2", &up.url("/stream?chunks=4&size=100")]).await;
    assert_eq!(
        out.stdout,
        "a".repeat(100) + &"b".repeat(100) + &"c".repeat(100) + &"d".repeat(100)
    );

    let file = dir.path().join("blob");
    std::fs::write(&file, vec![7u8; 300_000]).unwrap();
    let out = curl_with(&up, ca, &["-T", file.to_str().unwrap(), &up.url("/upload")]).await;
    assert_eq!(out.json()["received"], 300_000, "{out}");

    let out = curl_with(
        &up,
        ca,
        &[
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &up.url("/status/418"),
        ],
    )
    .await;
    assert_eq!(out.stdout, "418");
    let out = curl_with(
        &up,
        ca,
        &["-o", "/dev/null", "-w", "%{http_code}", &up.url("/missing")],
    )
    .await;
    assert_eq!(out.stdout, "404");

    // gRPC trailers as curl sees them on h2.
    let msg = dir.path().join("msg");
    std::fs::write(&msg, grpc_frame(b"hi")).unwrap();
    let out = curl_with(
        &up,
        ca,
        &[
            "--http2",
            "-i",
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            "--data-binary",
            &format!("@{}", msg.display()),
            &up.url("/grpc"),
        ],
    )
    .await;
    assert!(out.stdout.contains("grpc-status: 0"), "{out}");
    assert!(out.stdout.contains("grpc-message: ok"), "{out}");

    // An untrusted CA must fail (exit 60), proving --cacert is what made the rest work.
    let other_dir = dir.path().join("other");
    std::fs::create_dir(&other_dir).unwrap();
    let other = TestCa::new().write_ca(&other_dir);
    let out = curl_with(&up, other.to_str().unwrap(), &[&up.url("/echo")]).await;
    assert_eq!(out.status, 60, "{out}");
}

/// The leaf and CA pass OpenSSL's strict X.509 checks, which Python 3.13 turns on by default.
#[tokio::test]
async fn certificates_pass_python_strict_verification() {
    let up = Upstream::builder().start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = up.write_ca(dir.path());
    let code = format!(
        "import socket, ssl\n\
         ctx = ssl.create_default_context(cafile={ca:?})\n\
         ctx.verify_flags |= getattr(ssl, 'VERIFY_X509_STRICT', 0x20)\n\
         s = ctx.wrap_socket(socket.create_connection(('127.0.0.1', {port})), server_hostname='localhost')\n\
         print(s.version())\n",
        ca = ca.to_str().unwrap(),
        port = up.port()
    );
    let out = clients::run(
        clients::python_bin(),
        &["-c", &code],
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(out.success(), "{out}");
    assert!(out.stdout.starts_with("TLSv1.3"), "{out}");
}

#[tokio::test]
async fn python_clients_direct() {
    let up = Upstream::builder().start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = up.write_ca(dir.path());
    let ca = ca.to_str().unwrap();
    let url = format!("https://localhost:{}/echo?from=py", up.port());
    let env = [("REQUESTS_CA_BUNDLE", ca)];

    let out = clients::python(
        client_script("py_requests.py"),
        &[&url, "post", "{\"a\":1}", "-H", "X-Test: yes"],
        &env,
    )
    .await;
    assert!(out.success(), "{out}");
    let v = out.json();
    assert_eq!(v["status"], 200);
    assert_eq!(v["headers"]["content-type"], "application/json");
    let body: Value = serde_json::from_str(v["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["method"], "POST");
    assert_eq!(body["body_len"], 7);
    assert_eq!(body["headers"]["x-test"], "yes");

    for (h2, version) in [("0", "HTTP/1.1"), ("1", "HTTP/2")] {
        let env = [("SSL_CERT_FILE", ca), ("OSTIARY_HTTP2", h2)];
        let out = clients::python(client_script("py_httpx.py"), &[&url], &env).await;
        assert!(out.success(), "{out}");
        let v = out.json();
        assert_eq!(v["status"], 200);
        assert_eq!(v["http_version"], version, "{out}");
    }

    // HTTP errors are answers, not failures.
    let out = clients::python(
        client_script("py_httpx.py"),
        &[&format!("https://localhost:{}/status/500", up.port())],
        &[("SSL_CERT_FILE", ca)],
    )
    .await;
    assert!(out.success(), "{out}");
    assert_eq!(out.json()["status"], 500);

    // Without the CA the TLS handshake fails: exit 3 with the exception named.
    for script in ["py_requests.py", "py_httpx.py", "py_ws.py"] {
        let target = if script == "py_ws.py" {
            format!("wss://localhost:{}/ws", up.port())
        } else {
            url.clone()
        };
        let out = clients::python(client_script(script), &[&target], &[]).await;
        assert_eq!(out.status, 3, "{script}: {out}");
        assert!(
            out.json()["error"]
                .as_str()
                .unwrap()
                .contains("CERTIFICATE_VERIFY_FAILED")
                || out.json()["error"]
                    .as_str()
                    .unwrap()
                    .contains("certificate"),
            "{script}: {out}"
        );
    }

    let out = clients::python(
        client_script("py_ws.py"),
        &[&format!("wss://localhost:{}/ws", up.port()), "héllo"],
        &env,
    )
    .await;
    assert!(out.success(), "{out}");
    assert_eq!(out.json()["echo"], "héllo");
    assert_eq!(up.count("/ws"), 1);
}

// ---- a stand-in CONNECT proxy, so the clients' proxy handling is proven too ----

/// A CONNECT's request line and the Proxy-Authorization it carried.
type ConnectEntry = (String, Option<String>);

/// Records every CONNECT the stand-in proxy received.
#[derive(Debug, Default, Clone)]
struct ConnectLog(Arc<Mutex<Vec<ConnectEntry>>>);

/// A CONNECT-only proxy: requires `Proxy-Authorization: Basic base64(agent:tok)`, sends
/// every tunnel to `target` (as Ostiary's `egress.resolve` would) and splices bytes.
async fn connect_proxy(target: SocketAddr) -> (SocketAddr, ConnectLog) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = ConnectLog::default();
    let log2 = log.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let log = log2.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if client.read_exact(&mut byte).await.is_err() {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let target_line = head.lines().next().unwrap_or_default().to_owned();
                let auth = head
                    .lines()
                    .find_map(|l| {
                        l.split_once(':')
                            .filter(|(k, _)| k.eq_ignore_ascii_case("proxy-authorization"))
                    })
                    .map(|(_, v)| v.trim().to_owned());
                log.0
                    .lock()
                    .unwrap()
                    .push((target_line.clone(), auth.clone()));
                // base64("agent:tok") == "YWdlbnQ6dG9r"
                if auth.as_deref() != Some("Basic YWdlbnQ6dG9r")
                    || !target_line.starts_with("CONNECT ")
                {
                    let _ = client
                        .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"ostiary\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                        .await;
                    return;
                }
                let Ok(mut upstream) = TcpStream::connect(target).await else {
                    return;
                };
                if client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .is_ok()
                {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    (addr, log)
}

#[tokio::test]
async fn clients_use_the_proxy_and_ca_from_the_environment() {
    let up = Upstream::builder().start().await;
    let (proxy, log) = connect_proxy(up.addr()).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = up.write_ca(dir.path());
    let ca = ca.to_str().unwrap();
    let proxy_url = format!("http://agent:tok@{proxy}");
    let env = [
        ("HTTPS_PROXY", proxy_url.as_str()),
        ("SSL_CERT_FILE", ca),
        ("REQUESTS_CA_BUNDLE", ca),
        ("CURL_CA_BUNDLE", ca),
    ];
    let url = up.url("/echo");

    let out = clients::curl(&[&url], &env).await;
    assert_eq!(out.json()["sni"], "api.example.test", "{out}");
    for script in ["py_requests.py", "py_httpx.py"] {
        let out = clients::python(client_script(script), &[&url, "PATCH", "x"], &env).await;
        assert!(out.success(), "{script}: {out}");
        let v = out.json();
        assert_eq!(v["status"], 200, "{script}: {out}");
        let body: Value = serde_json::from_str(v["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["method"], "PATCH");
        assert_eq!(body["sni"], "api.example.test");
    }
    let mut h2env = env.to_vec();
    h2env.push(("OSTIARY_HTTP2", "1"));
    let out = clients::python(client_script("py_httpx.py"), &[&url], &h2env).await;
    assert_eq!(out.json()["http_version"], "HTTP/2", "{out}");

    let ws_url = format!("wss://{}:{}/ws", up.host(), up.port());
    let out = clients::python(
        client_script("py_ws.py"),
        &[&ws_url, "through the tunnel"],
        &env,
    )
    .await;
    assert!(out.success(), "{out}");
    assert_eq!(out.json()["echo"], "through the tunnel");

    let entries = log.0.lock().unwrap().clone();
    assert_eq!(entries.len(), 5, "{entries:?}");
    let authority = format!("api.example.test:{}", up.port());
    for (line, auth) in &entries {
        assert!(line.starts_with(&format!("CONNECT {authority} ")), "{line}");
        assert_eq!(auth.as_deref(), Some("Basic YWdlbnQ6dG9r"));
    }
    assert_eq!(up.count("/echo"), 4);
    assert_eq!(up.count("/ws"), 1);

    // A wrong token: the proxy answers 407 and every client reports a connection failure
    // (curl exit 56), with nothing reaching the upstream.
    let before = up.connections();
    let bad_proxy = format!("http://agent:wrong@{proxy}");
    let bad_env = [
        ("HTTPS_PROXY", bad_proxy.as_str()),
        ("SSL_CERT_FILE", ca),
        ("REQUESTS_CA_BUNDLE", ca),
    ];
    for script in ["py_requests.py", "py_httpx.py"] {
        let out = clients::python(client_script(script), &[&url], &bad_env).await;
        assert_eq!(out.status, 3, "{script}: {out}");
        assert!(
            out.json()["error"].as_str().unwrap().contains("407"),
            "{script}: {out}"
        );
    }
    let out = clients::python(client_script("py_ws.py"), &[&ws_url], &bad_env).await;
    assert_eq!(out.status, 3, "{out}");
    assert!(
        out.json()["error"].as_str().unwrap().contains("407"),
        "{out}"
    );
    let out = clients::curl(&[&url], &bad_env).await;
    assert_eq!(out.status, 56, "{out}");
    assert_eq!(up.connections(), before);
}
