//! Test harness shared by the wire guard's test modules.
//!
//! Framing bugs hide in read boundaries, so every case is played through pipes of several
//! sizes and must give the same outcome under each; and the client's view (the bytes on
//! the wire) is checked along with hyper's (the bytes released), since a refusal must be
//! seen by one and not the other.

use std::io;
use std::pin::Pin;
use std::task::Poll;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::{StrictH1, Violation, DEFAULT_MAX_HEAD_BYTES};

/// What the reader (hyper) received, what went back to the client (the random request
/// id replaced by `ID`), the read error kind and the violation's reason.
pub(super) type Outcome = (Vec<u8>, String, Option<io::ErrorKind>, Option<&'static str>);

pub(super) const GET: &[u8] = b"GET /a HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n";
pub(super) const CHUNKED: &[u8] =
    b"POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";

pub(super) fn passed(input: &[u8]) -> Outcome {
    (input.to_vec(), String::new(), None, None)
}

/// Plays `input` as the client through a pipe of `pipe` bytes, so reads and writes are
/// split at that size and meet back-pressure (Pending) on both sides.
async fn run_once(input: &[u8], max: usize, pipe: usize) -> Outcome {
    let (client, server) = tokio::io::duplex(pipe);
    let (mut from_guard, mut to_guard) = tokio::io::split(client);
    let input = input.to_vec();
    let sender = tokio::spawn(async move {
        // Fails once the guard hangs up after a rejection; the unsent rest is moot then.
        let _ = to_guard.write_all(&input).await;
        let _ = to_guard.shutdown().await;
    });
    let receiver = tokio::spawn(async move {
        let mut wire = Vec::new();
        from_guard.read_to_end(&mut wire).await.map(|_| wire)
    });
    let mut guard = StrictH1::new(server, max);
    let (mut released, mut chunk) = (Vec::new(), [0u8; 997]);
    let error = loop {
        match guard.read(&mut chunk).await {
            Ok(0) => break None,
            Ok(n) => released.extend_from_slice(&chunk[..n]),
            Err(e) => break Some(e.kind()),
        }
        // Stands in for hyper's answers, which let the next head be inspected.
        guard.write_all(b".").await.unwrap();
    };
    let reason = guard.violation().map(Violation::reason);
    let id = guard.rejection_id().map(str::to_owned);
    drop(guard);
    sender.await.unwrap();
    let wire = String::from_utf8(receiver.await.unwrap().unwrap()).unwrap();
    let mut wire = wire.trim_start_matches('.').to_owned();
    if let Some(id) = id {
        assert!(id.len() == 16 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
        wire = wire.replace(&id, "ID");
    }
    (released, wire, error, reason)
}

/// Runs under several read/write splittings, which must all agree.
pub(super) async fn run_max(input: &[u8], max: usize) -> Outcome {
    let whole = run_once(input, max, 1 << 20).await;
    for pipe in [1, 3, 7, 4096] {
        assert_eq!(run_once(input, max, pipe).await, whole, "pipe of {pipe}");
    }
    whole
}

pub(super) async fn run(input: &[u8]) -> Outcome {
    run_max(input, DEFAULT_MAX_HEAD_BYTES).await
}

/// `bad`, sent after `good`, is answered with `status` and none of it is released.
pub(super) async fn assert_rejected_after(good: &[u8], bad: &[u8], status: &str, reason: &str) {
    let (released, wire, error, got) = run(&[good, bad].concat()).await;
    assert_eq!(
        (&released[..], error, got),
        (good, None, Some(reason)),
        "{bad:?}"
    );
    assert!(
        wire.starts_with(&format!("HTTP/1.1 {status}\r\n")),
        "{wire}"
    );
    assert!(
        wire.ends_with(&format!(r#""request_id":"ID","reason":"{reason}"}}"#)),
        "{wire}"
    );
}

pub(super) async fn assert_rejected(bad: &[u8], reason: &str) {
    assert_rejected_after(b"", bad, "400 Bad Request", reason).await;
}

/// One poll of `poll_read`: whether it returned Pending.
pub(super) async fn read_is_pending<IO: AsyncRead + AsyncWrite + Unpin>(
    guard: &mut StrictH1<IO>,
) -> bool {
    let mut buf = [0u8; 64];
    let mut rb = ReadBuf::new(&mut buf);
    std::future::poll_fn(|cx| {
        Poll::Ready(Pin::new(&mut *guard).poll_read(cx, &mut rb).is_pending())
    })
    .await
}

/// Serves `input` with hyper over the guard; returns what the client got back and
/// what the service saw: one `path body-or-error` line per request.
pub(super) async fn through_hyper(input: &[u8]) -> (String, Vec<String>) {
    use http_body_util::BodyExt;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let log = log.clone();
        async move {
            let path = req.uri().path().to_owned();
            let body = req.into_body().collect().await.map(|b| b.to_bytes());
            log.lock().unwrap().push(format!("{path} {body:?}"));
            let ok = http_body_util::Full::new(bytes::Bytes::from_static(b"ok"));
            Ok::<_, hyper::Error>(hyper::Response::new(ok))
        }
    });
    let (mut client, server) = tokio::io::duplex(1 << 16);
    let io = hyper_util::rt::TokioIo::new(StrictH1::new(server, DEFAULT_MAX_HEAD_BYTES));
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
    let conn = tokio::spawn(conn);
    client.write_all(input).await.unwrap();
    let mut wire = String::new();
    client.read_to_string(&mut wire).await.unwrap();
    conn.await.unwrap().unwrap();
    let seen = seen.lock().unwrap().clone();
    (wire, seen)
}
