//! The audit writer: one thread owns the chain and appends records in batches.
//!
//! Each record is sealed as `hash = HMAC-SHA256(audit key, prev ‖ seq ‖ record)`, where
//! `prev` is the previous record's hash. Editing, inserting or deleting a row breaks the
//! chain; without the key (kept in the state directory, never in the database) the chain
//! cannot be recomputed. After every batch the head (last seq and hash) is written to a file
//! beside the database, so that deleting the newest rows is detected too.

use std::path::PathBuf;
use std::thread;

use hmac::{Hmac, Mac};
use rusqlite::{params, Connection, OptionalExtension};
use sha2::Sha256;
use tokio::sync::{mpsc, oneshot};

use super::record::AuditRecord;
use crate::store::StoreError;

/// Hash of the (virtual) record before the first one.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Largest number of records written in one transaction.
const BATCH: usize = 512;

enum Command {
    Record(Box<AuditRecord>),
    Flush(oneshot::Sender<()>),
}

/// Cheap handle to send records to the writer; never blocks the request path.
#[derive(Debug, Clone)]
pub struct AuditSink {
    tx: mpsc::UnboundedSender<Command>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Record(r) => f.debug_tuple("Record").field(&r.request_id).finish(),
            Command::Flush(_) => f.write_str("Flush"),
        }
    }
}

impl AuditSink {
    /// Queue one record. If the writer is gone the record is logged as lost, loudly.
    pub fn send(&self, record: AuditRecord) {
        if let Err(e) = self.tx.send(Command::Record(Box::new(record))) {
            if let Command::Record(r) = e.0 {
                tracing::error!(request_id = %r.request_id, "audit writer stopped; record lost");
            }
        }
    }

    /// Wait until every record sent before this call is committed.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// The writer thread's handle; dropping every sink and joining drains the queue.
#[derive(Debug)]
pub struct AuditWriter {
    thread: Option<thread::JoinHandle<()>>,
}

impl AuditWriter {
    /// Start the writer on `conn`, sealing with `key`, checkpointing the head to `head_path`.
    pub fn start(
        conn: Connection,
        key: Vec<u8>,
        head_path: PathBuf,
    ) -> Result<(Self, AuditSink), StoreError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut chain = Chain::load(conn, key, head_path)?;
        let thread = thread::Builder::new()
            .name("ostiary-audit".into())
            .spawn(move || chain.run(rx))
            .map_err(|e| StoreError::Task(e.to_string()))?;
        Ok((
            Self {
                thread: Some(thread),
            },
            AuditSink { tx },
        ))
    }

    /// Wait for the thread to drain its queue and exit (all sinks must be dropped first).
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Chain {
    conn: Connection,
    key: Vec<u8>,
    head_path: PathBuf,
    seq: i64,
    prev: String,
}

impl Chain {
    fn load(conn: Connection, key: Vec<u8>, head_path: PathBuf) -> Result<Self, StoreError> {
        let last: Option<(i64, String)> = conn
            .query_row(
                "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()?;
        let (seq, prev) = last.unwrap_or((0, GENESIS.to_owned()));
        Ok(Self {
            conn,
            key,
            head_path,
            seq,
            prev,
        })
    }

    fn run(&mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        let mut batch = Vec::with_capacity(BATCH);
        let mut waiters = Vec::new();
        while let Some(first) = rx.blocking_recv() {
            let mut next = Some(first);
            while let Some(cmd) = next.take() {
                match cmd {
                    Command::Record(r) => batch.push(*r),
                    Command::Flush(w) => waiters.push(w),
                }
                if batch.len() < BATCH {
                    next = rx.try_recv().ok();
                }
            }
            if let Err(e) = self.append(&batch) {
                // The chain is the product's record of truth: say so loudly, keep running.
                tracing::error!(error = %e, lost = batch.len(), "audit batch could not be written");
            }
            batch.clear();
            for w in waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }

    fn append(&mut self, batch: &[AuditRecord]) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let (mut seq, mut prev) = (self.seq, self.prev.clone());
        let tx = self.conn.transaction()?;
        {
            let mut insert = tx.prepare_cached(
                "INSERT INTO audit (seq, ts_ms, session, decision, record, prev, hash)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            for record in batch {
                seq += 1;
                let json = serde_json::to_string(record)
                    .map_err(|e| StoreError::Task(format!("serialising audit record: {e}")))?;
                let hash = seal(&self.key, &prev, seq, &json);
                insert.execute(params![
                    seq,
                    record.ts_ms,
                    record.session,
                    record.decision,
                    json,
                    prev,
                    hash
                ])?;
                prev = hash;
            }
        }
        tx.commit()?;
        self.seq = seq;
        self.prev = prev;
        // Best effort: a missing head only weakens tail-deletion detection, and verify says so.
        if let Err(e) = std::fs::write(&self.head_path, format!("{} {}\n", self.seq, self.prev)) {
            tracing::warn!(error = %e, "could not checkpoint the audit head");
        }
        Ok(())
    }
}

/// The seal of one record.
pub fn seal(key: &[u8], prev: &str, seq: i64, record_json: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(prev.as_bytes());
    mac.update(b"\n");
    mac.update(seq.to_string().as_bytes());
    mac.update(b"\n");
    mac.update(record_json.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}
