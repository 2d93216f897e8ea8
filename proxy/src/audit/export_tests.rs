//! Signed checkpoints end to end on a real SQLite chain: the writer signs, the export
//! holds what the checkpoints cover, and the offline check refuses every kind of edit.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::audit::attest::Signer;
use crate::audit::{AuditRecord, AuditSink, AuditWriter, Limits};
use crate::metrics::Metrics;

fn signer() -> Arc<Signer> {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    Arc::new(Signer::from_pem(&pair.serialize_pem()).unwrap())
}

fn record(n: usize) -> AuditRecord {
    AuditRecord {
        ts_ms: crate::store::now_ms(),
        request_id: format!("req-{n}"),
        kind: "http".into(),
        host: Some("api.example.test".into()),
        decision: if n.is_multiple_of(3) { "deny" } else { "allow" }.into(),
        ..Default::default()
    }
}

/// A writer on the chain in `dir`, signing with `signer` at most every `every`.
fn start(dir: &Path, signer: Option<Arc<Signer>>, every: Duration) -> (AuditWriter, AuditSink) {
    let trail = crate::store::sqlite::open(&dir.join("ostiary.db"))
        .unwrap()
        .audit;
    let limits = Limits {
        sign_every: every,
        ..Default::default()
    };
    AuditWriter::start_with(
        trail,
        b"k".to_vec(),
        dir.join("audit.head"),
        &Metrics::default(),
        limits,
        signer,
    )
    .unwrap()
}

/// Run a writer on the chain in `dir` and write `n` records, `pause` apart; closed at the
/// end (the shutdown checkpoint).
async fn write(
    dir: &Path,
    signer: Option<Arc<Signer>>,
    every: Duration,
    n: usize,
    pause: Duration,
) {
    let (writer, sink) = start(dir, signer, every);
    for i in 0..n {
        sink.send(record(i));
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    assert_eq!(sink.close().await, 0);
    drop(sink);
    tokio::task::spawn_blocking(move || writer.join())
        .await
        .unwrap();
}

fn exported(dir: &Path, since_ms: Option<i64>) -> (Exported, String) {
    let trail = crate::store::sqlite::open(&dir.join("ostiary.db"))
        .unwrap()
        .audit;
    let mut out = Vec::new();
    let done = export(&*trail, since_ms, &mut out).unwrap();
    (done, String::from_utf8(out).unwrap())
}

fn check(text: &str, key: &PublicKey) -> Result<Verified, OfflineError> {
    verify_offline(text.as_bytes(), key)
}

fn problems(text: &str, key: &PublicKey) -> String {
    match check(text, key) {
        Ok(v) => panic!("an altered export verified: {v:?}"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn an_export_verifies_offline_and_no_edit_of_it_does() {
    let dir = tempfile::tempdir().unwrap();
    let signer = signer();
    write(
        dir.path(),
        Some(signer.clone()),
        Duration::from_secs(60),
        20,
        Duration::ZERO,
    )
    .await;
    let (done, text) = exported(dir.path(), None);
    // 20 records and the shutdown checkpoint.
    assert_eq!((done.header.first, done.header.last), (1, 21));
    assert_eq!((done.header.checkpoints, done.unsigned), (1, 0));
    let key = signer.public();
    let ok = check(&text, &key).unwrap();
    assert_eq!((ok.first, ok.last, ok.checkpoints), (1, 21, 1));

    let lines: Vec<&str> = text.lines().collect();
    let join = |lines: &[String]| lines.join("\n") + "\n";
    let owned: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();

    // A record's content changed (its links left as they were).
    let mut edited = owned.clone();
    edited[5] = edited[5].replace("req-4", "req-X");
    assert_ne!(edited[5], owned[5]);
    assert!(
        problems(&join(&edited), &key).contains("not the ones the checkpoint"),
        "edit"
    );

    // A record removed from the middle.
    let mut removed = owned.clone();
    removed.remove(7);
    assert!(problems(&join(&removed), &key).contains("records missing"));

    // Two records swapped.
    let mut swapped = owned.clone();
    swapped.swap(3, 4);
    assert!(!problems(&join(&swapped), &key).is_empty());

    // The checkpoint cut off: nothing vouches for the rest.
    let cut = owned[..owned.len() - 1].to_vec();
    assert!(problems(&join(&cut), &key).contains("covered by no signed checkpoint"));

    // A checkpoint whose signed digest was replaced.
    let mut forged = owned.clone();
    let last = forged.len() - 1;
    let cp = attest::checkpoint_of(&serde_json::from_str::<Line>(&forged[last]).unwrap().record)
        .unwrap();
    forged[last] = forged[last].replace(&cp.digest, &"0".repeat(64));
    assert!(problems(&join(&forged), &key).contains("signature does not verify"));

    // A record appended after the checkpoint.
    let mut appended = owned.clone();
    let mut extra: Line = serde_json::from_str(&owned[last]).unwrap();
    extra.prev = extra.hash.clone();
    extra.seq += 1;
    extra.record = serde_json::to_string(&record(99)).unwrap();
    appended.push(serde_json::to_string(&extra).unwrap());
    assert!(problems(&join(&appended), &key).contains("covered by no signed checkpoint"));

    // Another key, a damaged header, an empty file.
    assert!(problems(&text, &self::signer().public()).contains("not the key given"));
    assert!(problems(&text.replacen(FORMAT, "other", 1), &key).contains("line 1"));
    assert!(problems("", &key).contains("empty"));
    assert!(problems(&format!("{}\nnot json\n", owned[0]), &key).contains("line 2"));
}

#[tokio::test]
async fn checkpoints_follow_one_another_across_restarts_and_cover_an_unsigned_past() {
    let dir = tempfile::tempdir().unwrap();
    // A chain from before checkpoints were signed (or a crash before the first one).
    write(dir.path(), None, Duration::from_secs(60), 5, Duration::ZERO).await;
    let trail = crate::store::sqlite::open(&dir.path().join("ostiary.db"))
        .unwrap()
        .audit;
    assert!(matches!(
        export(&*trail, None, &mut Vec::new()),
        Err(ExportError::NothingSigned)
    ));
    let signer = signer();
    // Checkpoints every 30 ms while records come 10 ms apart, then at shutdown; twice.
    for _ in 0..2 {
        let (every, pause) = (Duration::from_millis(30), Duration::from_millis(10));
        write(dir.path(), Some(signer.clone()), every, 12, pause).await;
    }
    let (done, text) = exported(dir.path(), None);
    assert_eq!(
        done.header.first, 1,
        "the first range covers the unsigned past"
    );
    assert!(done.header.checkpoints >= 4, "{:?}", done.header);
    let ok = check(&text, &signer.public()).unwrap();
    assert_eq!(ok.checkpoints, done.header.checkpoints);
    assert_eq!(ok.last, done.header.last);

    // From a time in the middle: the export starts at a range's start, and verifies.
    let middle: Line = serde_json::from_str(text.lines().nth(15).unwrap()).unwrap();
    let ts = serde_json::from_str::<serde_json::Value>(&middle.record).unwrap()["ts_ms"]
        .as_i64()
        .unwrap();
    let (since, text) = exported(dir.path(), Some(ts));
    assert!(
        since.header.first > 1 && since.header.first <= middle.seq,
        "{:?}",
        since.header
    );
    check(&text, &signer.public()).unwrap();
    // After the newest checkpoint: nothing signed yet.
    let trail = crate::store::sqlite::open(&dir.path().join("ostiary.db"))
        .unwrap()
        .audit;
    assert!(matches!(
        export(
            &*trail,
            Some(crate::store::now_ms() + 60_000),
            &mut Vec::new()
        ),
        Err(ExportError::NothingSince { .. })
    ));
}

#[tokio::test]
async fn an_idle_writer_signs_what_it_wrote_without_waiting_for_more() {
    let dir = tempfile::tempdir().unwrap();
    let signer = signer();
    let trail = crate::store::sqlite::open(&dir.path().join("ostiary.db"))
        .unwrap()
        .audit;
    let (writer, sink) = start(dir.path(), Some(signer.clone()), Duration::from_millis(100));
    for i in 0..3 {
        sink.send(record(i));
    }
    assert!(sink.flush().await);
    // Nothing more comes: the checkpoint is still made once the interval is up.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while trail.last_decided(attest::CHECKPOINT).unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint while idle"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, text) = exported(dir.path(), None);
    assert_eq!(check(&text, &signer.public()).unwrap().last, 4);
    // And none more while nothing new is written.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(trail.last().unwrap().unwrap().seq, 4);
    sink.close().await;
    drop(sink);
    tokio::task::spawn_blocking(move || writer.join())
        .await
        .unwrap();
    assert_eq!(
        trail.last().unwrap().unwrap().seq,
        4,
        "no shutdown checkpoint over nothing"
    );
}
