//! The ClientHello an intercepted tunnel starts with: its SNI must name the CONNECT host,
//! or the handshake is refused before any leaf certificate is minted, and the refusal is on
//! the record (THREATS: "SNI missing, an IP, or different from the CONNECT host").

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sni_naming_another_host_is_refused_before_any_certificate() {
    let fx = fixture(ALLOW_ALL).await;
    let (config, verifier) = watching_config(&fx.proxy.ca_pem);
    let result = tls(fx.connected().await, config, "other.test").await;
    assert!(result.is_err(), "the handshake must fail");
    assert!(
        !verifier.saw_certificate(),
        "no certificate may be presented for a fronted SNI"
    );
    let record = wait_for_audit(&fx.proxy, "the refused handshake", |r| {
        r.kind == "tls" && r.decision == "deny"
    })
    .await;
    let reason = record.reason.as_deref().unwrap_or_default();
    assert!(
        reason.contains("SNI other.test differs from the CONNECT host"),
        "{reason}"
    );
    assert_eq!(record.host.as_deref(), Some("api.example.test"));
    assert_eq!(record.session.as_deref(), Some(&*fx.session.session_id));
    fx.assert_upstreams_untouched();
    assert_eq!(fx.tls.connections(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hello_without_sni_is_refused_before_any_certificate() {
    let fx = fixture(ALLOW_ALL).await;
    let (config, verifier) = watching_config(&fx.proxy.ca_pem);
    // rustls sends no SNI when the server name is an IP address.
    let result = tls(fx.connected().await, config, "127.0.0.1").await;
    assert!(result.is_err(), "the handshake must fail");
    assert!(!verifier.saw_certificate());
    let record = wait_for_audit(&fx.proxy, "the refused handshake", |r| {
        r.kind == "tls" && r.decision == "deny"
    })
    .await;
    assert!(
        record
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("no SNI"),
        "{record:#?}"
    );
    fx.assert_upstreams_untouched();
}

/// A TLS 1.3 ClientHello whose `server_name` extension carries `name` as a host name: what
/// OpenSSL's `s_client -servername 127.0.0.1` sends, and rustls never does.
fn client_hello_naming(name: &str) -> Vec<u8> {
    fn u16_len(bytes: &[u8]) -> [u8; 2] {
        (bytes.len() as u16).to_be_bytes()
    }
    fn extension(kind: u16, data: &[u8]) -> Vec<u8> {
        [&kind.to_be_bytes()[..], &u16_len(data), data].concat()
    }
    let host = name.as_bytes();
    let entry = [&[0u8][..], &u16_len(host), host].concat();
    let server_name = [&u16_len(&entry)[..], &entry].concat();
    let key = [7u8; 32];
    let share = [&0x001du16.to_be_bytes()[..], &u16_len(&key), &key].concat();
    let extensions = [
        extension(0x0000, &server_name),
        extension(0x002b, &[2, 0x03, 0x04]),
        extension(0x000a, &[0, 2, 0x00, 0x1d]),
        extension(0x000d, &[0, 4, 0x08, 0x07, 0x04, 0x03]),
        extension(0x0033, &[&u16_len(&share)[..], &share].concat()),
    ]
    .concat();
    let hello = [
        &[0x03, 0x03][..],
        &[9u8; 32],
        &[0],
        &[0, 2, 0x13, 0x01],
        &[1, 0],
        &u16_len(&extensions),
        &extensions,
    ]
    .concat();
    let len = (hello.len() as u32).to_be_bytes();
    let handshake = [&[1u8, len[1], len[2], len[3]][..], &hello].concat();
    [&[0x16, 0x03, 0x01][..], &u16_len(&handshake), &handshake].concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hello_whose_sni_is_an_ip_is_refused_before_any_certificate() {
    let fx = fixture(ALLOW_ALL).await;
    for name in ["127.0.0.1", "::1"] {
        let mut stream = fx.connected().await;
        stream.write_all(&client_hello_naming(name)).await.unwrap();
        // Whatever comes back (an alert, or the connection closed), it is no ServerHello:
        // no certificate follows.
        let mut answer = Vec::new();
        let read = tokio::time::timeout(
            ostiary_e2e::raw::IO_DEADLINE,
            stream.read_to_end(&mut answer),
        )
        .await;
        assert!(read.is_ok(), "{name}: the proxy closes the connection");
        assert!(
            answer.first() != Some(&0x16),
            "{name}: a handshake record came back: {answer:02x?}"
        );
    }
    // The same ClientHello naming the CONNECT host goes on: the refusal is the IP's.
    let mut stream = fx.connected().await;
    stream
        .write_all(&client_hello_naming(fx.tls.host()))
        .await
        .unwrap();
    let mut first = [0u8; 1];
    stream.read_exact(&mut first).await.unwrap();
    assert_eq!(first[0], 0x16, "a ServerHello for the CONNECT host");
    let records = fx.proxy.audit().await;
    let refused: Vec<_> = records
        .iter()
        .filter(|r| r.kind == "tls" && r.decision == "deny")
        .collect();
    assert_eq!(refused.len(), 2, "{records:#?}");
    fx.assert_upstreams_untouched();
}
