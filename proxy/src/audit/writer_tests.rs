//! The order that keeps the head checkpoint honest after a power cut: appends are committed
//! without a sync of their own, so the writer must have the store sync them before the head
//! names them, and a sync that fails must stop forwarding like a failed commit.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::audit::chain::{read_head, Head};
use crate::audit::verify::verify;
use crate::audit::{AuditRecord, AuditSink, AuditWriter, Limits};
use crate::metrics::Metrics;
use crate::store::audit::{AuditQuery, Seal};

const KEY: &[u8] = b"k";

/// The real SQLite chain, watched: each sync notes the last row it made durable and checks
/// that the head on disk names nothing past the previous sync; syncs fail while `failing`.
#[derive(Debug)]
struct Watched {
    inner: Arc<dyn AuditStore>,
    head: PathBuf,
    synced: Mutex<i64>,
    syncs: AtomicUsize,
    /// Heads found naming a row no sync had covered yet.
    ahead: Mutex<Vec<String>>,
    failing: AtomicBool,
    /// Appends build their rows twice, keeping the second: a store that retries its
    /// transaction.
    rebuilds: AtomicBool,
}

impl Watched {
    fn new(dir: &Path) -> Arc<Self> {
        Arc::new(Self {
            inner: crate::store::sqlite::open(&dir.join("ostiary.db"))
                .unwrap()
                .audit,
            head: dir.join("audit.head"),
            synced: Mutex::new(0),
            syncs: AtomicUsize::new(0),
            ahead: Mutex::new(Vec::new()),
            failing: AtomicBool::new(false),
            rebuilds: AtomicBool::new(false),
        })
    }

    /// Record a head that names more than the last sync covered.
    fn check_head(&self) {
        let synced = *self.synced.lock().unwrap();
        if let Head::Sealed(tip) = read_head(KEY, &self.head).unwrap() {
            if tip.seq > synced {
                self.ahead.lock().unwrap().push(format!(
                    "head names {} with rows to {synced} synced",
                    tip.seq
                ));
            }
        }
    }
}

impl AuditStore for Watched {
    fn append(&self, after: &Tip, rows: &[AuditRow]) -> Result<(), AppendError> {
        self.inner.append(after, rows)
    }
    fn append_after(&self, after: &Tip, seal: &mut Seal<'_>) -> Result<Vec<AuditRow>, AppendError> {
        if self.rebuilds.load(Ordering::SeqCst) {
            // What a first try built, thrown away with its transaction (no other writer:
            // nothing foreign to take on).
            seal(&[]).unwrap();
        }
        self.inner.append_after(after, seal)
    }
    fn last(&self) -> Result<Option<Tip>, StoreError> {
        self.inner.last()
    }
    fn last_decided(&self, decision: &str) -> Result<Option<AuditRow>, StoreError> {
        self.inner.last_decided(decision)
    }
    fn hash_at(&self, seq: i64) -> Result<Option<String>, StoreError> {
        self.inner.hash_at(seq)
    }
    fn scan(&self, after: i64, visit: &mut dyn FnMut(AuditRow) -> bool) -> Result<(), StoreError> {
        self.inner.scan(after, visit)
    }
    fn query(&self, q: &AuditQuery) -> Result<Vec<String>, StoreError> {
        self.inner.query(q)
    }
    fn recent(&self, session: &str, n: u32) -> Result<Vec<String>, StoreError> {
        self.inner.recent(session, n)
    }
    fn sync(&self) -> Result<(), StoreError> {
        self.check_head();
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable("the disk is gone".into()));
        }
        self.inner.sync()?;
        let last = self.inner.last()?.map_or(0, |tip| tip.seq);
        *self.synced.lock().unwrap() = last;
        self.syncs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

fn record(n: usize) -> AuditRecord {
    AuditRecord {
        ts_ms: crate::store::now_ms(),
        request_id: format!("req-{n}"),
        kind: "http".into(),
        decision: "allow".into(),
        ..Default::default()
    }
}

fn start(trail: Arc<Watched>, dir: &Path) -> (AuditWriter, AuditSink) {
    let limits = Limits {
        checkpoint_every: Duration::from_millis(5),
        retry_min: Duration::from_millis(5),
        retry_max: Duration::from_millis(20),
        ..Default::default()
    };
    start_with(trail, dir, limits)
}

fn start_with(trail: Arc<Watched>, dir: &Path, limits: Limits) -> (AuditWriter, AuditSink) {
    AuditWriter::start_with(
        trail,
        KEY.to_vec(),
        dir.join("audit.head"),
        &Metrics::default(),
        limits,
        None,
    )
    .unwrap()
}

async fn stop(writer: AuditWriter, sink: AuditSink) -> usize {
    let unwritten = sink.close().await;
    drop(sink);
    tokio::task::spawn_blocking(move || writer.join())
        .await
        .unwrap();
    unwritten
}

#[tokio::test]
async fn the_head_never_names_a_row_the_store_has_not_synced() {
    let dir = tempfile::tempdir().unwrap();
    let trail = Watched::new(dir.path());
    let (writer, sink) = start(trail.clone(), dir.path());
    for i in 0..300 {
        sink.send(record(i));
        if i % 7 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if i % 50 == 0 {
            assert!(sink.flush().await, "a flush is answered once checkpointed");
        }
    }
    assert_eq!(stop(writer, sink).await, 0);
    trail.check_head();

    assert_eq!(*trail.ahead.lock().unwrap(), Vec::<String>::new());
    assert!(
        trail.syncs.load(Ordering::SeqCst) >= 2,
        "a sync per checkpoint, and checkpoints were written"
    );
    let Head::Sealed(head) = read_head(KEY, &dir.path().join("audit.head")).unwrap() else {
        panic!("the shutdown wrote a sealed head");
    };
    assert_eq!(head.seq, 300, "every record written and named at shutdown");
    assert_eq!(*trail.synced.lock().unwrap(), 300);
}

/// A writer that gathers asleep (records never wake it) is woken by whoever waits on it: a
/// flush while records are pending, a flush and a close while it naps between records.
/// With a linger of a minute, each would otherwise wait out the nap.
#[tokio::test]
async fn a_flush_or_a_close_wakes_a_writer_gathering_asleep() {
    let dir = tempfile::tempdir().unwrap();
    let trail = Watched::new(dir.path());
    let limits = Limits {
        linger: Duration::from_secs(60),
        checkpoint_every: Duration::from_millis(5),
        ..Default::default()
    };
    let (writer, sink) = start_with(trail.clone(), dir.path(), limits);
    let bound = Duration::from_secs(20);
    for round in 1..=2 {
        sink.send(record(round));
        // Taken by the writer before the flush is sent: the flush must find it asleep.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let flushed = tokio::time::timeout(bound, sink.flush()).await;
        assert_eq!(
            flushed,
            Ok(true),
            "round {round}: the flush woke the writer"
        );
        assert_eq!(trail.last().unwrap().map(|t| t.seq), Some(round as i64));
    }
    // Nothing pending, the last record a moment ago: napping, and the close wakes it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let closed = tokio::time::timeout(bound, stop(writer, sink)).await;
    assert_eq!(
        closed,
        Ok(0),
        "the close woke the writer and nothing was lost"
    );
}

/// A full batch is committed at once, not after the linger: the record that fills it wakes
/// the writer.
#[tokio::test]
async fn a_full_batch_wakes_a_writer_gathering_asleep() {
    let dir = tempfile::tempdir().unwrap();
    let trail = Watched::new(dir.path());
    let limits = Limits {
        linger: Duration::from_secs(60),
        batch: 4,
        ..Default::default()
    };
    let (writer, sink) = start_with(trail.clone(), dir.path(), limits);
    sink.send(record(1));
    // Taken by the writer, which now naps until the linger is out.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in 2..=4 {
        sink.send(record(i));
    }
    let committed = async {
        while trail.last().unwrap().map(|t| t.seq) != Some(4) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let woken = tokio::time::timeout(Duration::from_secs(20), committed).await;
    assert!(woken.is_ok(), "the fourth record woke the writer");
    assert_eq!(stop(writer, sink).await, 0);
}

#[tokio::test]
async fn a_sync_that_fails_stops_forwarding_until_it_works_again() {
    let dir = tempfile::tempdir().unwrap();
    let trail = Watched::new(dir.path());
    let (writer, sink) = start(trail.clone(), dir.path());
    sink.send(record(0));
    assert!(sink.flush().await);
    assert!(sink.writable().await.is_ok());

    trail.failing.store(true, Ordering::SeqCst);
    sink.send(record(1));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let reason = loop {
        if let Err(e) = sink.writable().await {
            break e.to_string();
        }
        assert!(tokio::time::Instant::now() < deadline, "still writable");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    assert!(
        sink.status()
            .reason
            .unwrap_or_default()
            .contains("the disk is gone"),
        "the reason is kept: {reason}"
    );
    assert!(!sink.flush().await, "nobody waits out an outage");
    let Head::Sealed(head) = read_head(KEY, &dir.path().join("audit.head")).unwrap() else {
        panic!("a sealed head");
    };
    assert_eq!(head.seq, 1, "the head still names only what was synced");

    trail.failing.store(false, Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while sink.writable().await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    sink.send(record(2));
    assert!(sink.flush().await);
    assert_eq!(stop(writer, sink).await, 0);

    assert_eq!(*trail.ahead.lock().unwrap(), Vec::<String>::new());
    let report = verify(&*trail.inner, KEY, &dir.path().join("audit.head")).unwrap();
    // Three records and the outage's own: nothing lost, nothing written twice.
    assert!(report.ok(), "{report:?}");
    assert_eq!(report.records, 4, "{report:?}");
}

#[test]
fn a_records_text_is_what_serde_json_writes_whatever_its_length() {
    for reason in [String::new(), "r".repeat(100), "é\"\\\n".repeat(2_000)] {
        let record = AuditRecord {
            request_id: "req".into(),
            kind: "http".into(),
            decision: "deny".into(),
            reason: Some(reason),
            ..Default::default()
        };
        assert_eq!(
            record_text(&record).unwrap(),
            serde_json::to_string(&record).unwrap()
        );
    }
}

/// The rows of a batch move into the attempt that builds them; a store that builds them
/// again gets every record, serialised anew, not an empty or partial batch.
#[tokio::test]
async fn a_store_that_builds_a_batch_twice_writes_every_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let trail = Watched::new(dir.path());
    trail.rebuilds.store(true, Ordering::SeqCst);
    let (writer, sink) = start(trail.clone(), dir.path());
    for i in 0..40 {
        sink.send(record(i));
        if i % 10 == 0 {
            assert!(sink.flush().await);
        }
    }
    assert_eq!(stop(writer, sink).await, 0);

    let report = verify(&*trail.inner, KEY, &dir.path().join("audit.head")).unwrap();
    assert!(report.ok(), "{report:?}");
    assert_eq!(report.records, 40, "{report:?}");
    let mut ids = Vec::new();
    trail
        .inner
        .scan(0, &mut |row| {
            let kept: AuditRecord = serde_json::from_str(&row.record).unwrap();
            assert_eq!(record_text(&kept).unwrap(), row.record);
            ids.push(kept.request_id);
            true
        })
        .unwrap();
    let want: Vec<String> = (0..40).map(|i| format!("req-{i}")).collect();
    assert_eq!(ids, want);
}
