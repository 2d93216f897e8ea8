//! The trail streamed to a SIEM (`[audit.siem]`): every record, in order, `POST`ed as JSON
//! lines to the operator's receiver, with nothing lost while the receiver is down.
//!
//! The trail is the stream's buffer. A durable cursor in the store
//! ([`ostiary_store::cursors`]) names the last record delivered; each round reads the
//! records after it, sends them as one batch and moves the cursor only once the receiver
//! answered 2xx. A receiver that is down, slow or refusing leaves the cursor where it was:
//! the batch is retried, the wait doubling from `interval` up to `retry_max`, for as long as
//! it takes, and the stream catches up afterwards — across restarts and `kill -9` too, since
//! the cursor is in the store. Delivery is at least once: a batch whose 2xx was lost is sent
//! again; each line carries the record's sequence number (`seq`, or OCSF
//! `metadata.sequence`) for the receiver to drop what it has seen.
//!
//! Replicas sharing a store share the cursor, and a lease on it names the one that sends; the
//! others wait and take over within a lease once it lapses (or at once when the holder
//! stops and releases it). The operator replays or skips with `ostiary audit siem replay
//! --from SEQ` ([`replay`]); a delivery in flight never overwrites that (the cursor moves
//! only from where it was read).
//!
//! Every batch's request carries `Ostiary-Seq-From` and `Ostiary-Seq-To`. The token, if any,
//! comes from the environment and is sent as `Authorization: Bearer`; it never appears in a
//! log line, an error or the status.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{AUTHORIZATION, CONTENT_TYPE};
use ostiary_broker::Secret;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::record::AuditRecord;
use crate::config::{Siem, SiemFormat};
use crate::metrics::Metrics;
use crate::store::audit::{AuditRow, AuditStore};
use crate::store::cursors::CursorStore;
use crate::store::{Call, StoreError};

/// Why the stream cannot start as configured (start-up refuses it).
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("audit.siem.token_env names {0}, which is not set")]
    TokenMissing(String),
    #[error("audit.siem.ca_file {path}: {reason}")]
    CaFile { path: String, reason: String },
    #[error("audit.siem: {0}")]
    Client(String),
}

/// Why one delivery did not happen; kept on the cursor (`audit siem status`) until one does.
#[derive(Debug, thiserror::Error)]
enum Failed {
    #[error("the receiver answered {0}")]
    Status(http::StatusCode),
    #[error("the receiver could not be reached: {0}")]
    Send(String),
    #[error("the trail could not be read: {0}")]
    Store(#[from] StoreError),
    #[error("record {seq} does not parse: {reason}")]
    Record { seq: i64, reason: String },
}

/// What one round did.
#[derive(Debug, PartialEq, Eq)]
enum Round {
    /// Records were delivered; `full`: the batch was full, more may wait.
    Delivered { records: usize, full: bool },
    /// Nothing new.
    CaughtUp,
    /// Another replica holds the cursor.
    NotHolder,
    /// The operator moved the cursor while the batch was on its way: read again.
    Moved,
}

/// The stream's metrics.
#[derive(Debug, Clone, Default)]
struct Gauges {
    delivered: Counter,
    failures: Counter,
    cursor: Gauge,
    lag: Gauge,
}

impl Gauges {
    fn register(metrics: &Metrics) -> Self {
        let g = Self::default();
        metrics.register(
            "audit_siem_delivered_records",
            "Audit records the SIEM stream delivered (a batch sent again after a lost answer counts again)",
            g.delivered.clone(),
        );
        metrics.register(
            "audit_siem_failures",
            "Failed SIEM deliveries (each batch is retried until it is delivered)",
            g.failures.clone(),
        );
        metrics.register(
            "audit_siem_cursor",
            "The last audit record the SIEM stream delivered, as this replica last saw it",
            g.cursor.clone(),
        );
        metrics.register(
            "audit_siem_lag_records",
            "Audit records written but not yet delivered to the SIEM, as of the last round",
            g.lag.clone(),
        );
        g
    }
}

/// The exporter: one per process with `[audit.siem]` set.
#[derive(Debug)]
pub struct SiemStream {
    config: Siem,
    trail: Arc<dyn AuditStore>,
    cursors: Arc<dyn CursorStore>,
    client: reqwest::Client,
    token: Option<Secret>,
    /// This process, as the cursor's lease names it.
    holder: String,
    gauges: Gauges,
}

/// How long a lease lasts past each round: long enough for a slow delivery, short enough
/// that a replica that died is replaced within a minute.
fn lease_for(config: &Siem) -> Duration {
    (config.timeout * 2 + config.interval * 3).max(Duration::from_secs(10))
}

impl SiemStream {
    /// The stream `config` asks for, reading `trail` and keeping its place in `cursors`
    /// under the lease of `holder`: the replica's own name on a shared store; on a store
    /// only one process may serve (SQLite's state directory), one name for every run, so
    /// that a restart after `kill -9` takes the cursor at once instead of waiting out the
    /// dead process's lease.
    pub fn new(
        config: &Siem,
        trail: Arc<dyn AuditStore>,
        cursors: Arc<dyn CursorStore>,
        holder: String,
        metrics: &Metrics,
    ) -> Result<Self, StreamError> {
        let token = match &config.token_env {
            None => None,
            Some(var) => Some(Secret::new(
                std::env::var(var).map_err(|_| StreamError::TokenMissing(var.clone()))?,
            )),
        };
        // The receiver is the operator's, reached directly: never through a proxy.
        let mut client = reqwest::Client::builder()
            .no_proxy()
            .timeout(config.timeout)
            .connect_timeout(config.timeout);
        if let Some(path) = &config.ca_file {
            let failed = |reason: String| StreamError::CaFile {
                path: path.display().to_string(),
                reason,
            };
            let pem = std::fs::read(path).map_err(|e| failed(e.to_string()))?;
            for cert in
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| failed(e.to_string()))?
            {
                client = client.add_root_certificate(cert);
            }
        }
        let client = client
            .build()
            .map_err(|e| StreamError::Client(e.to_string()))?;
        Ok(Self {
            config: config.clone(),
            trail,
            cursors,
            client,
            token,
            holder,
            gauges: Gauges::register(metrics),
        })
    }

    /// Deliver until `shutdown`; the stream is handed back for [`SiemStream::finish`].
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Self {
        tokio::pin!(shutdown);
        let mut backoff = self.config.interval;
        loop {
            let wait = match self.round().await {
                Ok(Round::Delivered { full: true, .. }) | Ok(Round::Moved) => Duration::ZERO,
                Ok(_) => {
                    backoff = self.config.interval;
                    self.config.interval
                }
                Err(e) => {
                    let wait = backoff;
                    backoff = (backoff * 2).min(self.config.retry_max);
                    self.note_failure(&e, wait).await;
                    wait
                }
            };
            tokio::select! {
                () = &mut shutdown => return self,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// At shutdown, once the trail's last records are written: deliver what is left
    /// within `grace` (one attempt per batch), then give up the lease so that another
    /// replica, or the next start, carries on from the cursor at once.
    pub async fn finish(self, grace: Duration) {
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            match tokio::time::timeout_at(deadline.into(), self.round()).await {
                Ok(Ok(Round::Delivered { full: true, .. } | Round::Moved)) => continue,
                Ok(Ok(_)) => break,
                Ok(Err(e)) => {
                    self.note_failure(&e, Duration::ZERO).await;
                    break;
                }
                Err(_) => break,
            }
        }
        let (name, holder) = (self.config.cursor.clone(), self.holder.clone());
        if let Err(e) = self.cursors.call(move |c| c.release(&name, &holder)).await {
            tracing::warn!(error = %e, "siem stream: releasing the cursor's lease failed; it lapses by itself");
        }
    }

    /// Claim the cursor, read what follows it, send it, move the cursor.
    async fn round(&self) -> Result<Round, Failed> {
        let now = crate::store::now_ms();
        let until = now + i64::try_from(lease_for(&self.config).as_millis()).unwrap_or(i64::MAX);
        let (name, holder) = (self.config.cursor.clone(), self.holder.clone());
        let claimed = self
            .cursors
            .call(move |c| c.claim(&name, &holder, 0, now, until))
            .await?;
        let Some(from) = claimed else {
            return Ok(Round::NotHolder);
        };
        self.gauges.cursor.set(from);
        let most = self.config.batch;
        let rows = self
            .trail
            .call(move |t| {
                let mut rows = Vec::with_capacity(most.min(1024));
                t.scan(from, &mut |row| {
                    rows.push(row);
                    rows.len() < most
                })?;
                let head = t.last()?.map_or(0, |tip| tip.seq);
                Ok::<_, StoreError>((rows, head))
            })
            .await;
        let (rows, head) = rows?;
        self.gauges.lag.set(head - from);
        let Some(last) = rows.last().map(|r| r.seq) else {
            return Ok(Round::CaughtUp);
        };
        let body = lines(&rows, self.config.format)?;
        self.deliver(body, from + 1, last).await?;
        let (name, holder) = (self.config.cursor.clone(), self.holder.clone());
        let moved = self
            .cursors
            .call(move |c| c.advance(&name, &holder, from, last, crate::store::now_ms()))
            .await?;
        self.gauges.delivered.inc_by(rows.len() as u64);
        if !moved {
            return Ok(Round::Moved);
        }
        self.gauges.cursor.set(last);
        self.gauges.lag.set((head - last).max(0));
        Ok(Round::Delivered {
            records: rows.len(),
            full: rows.len() == most,
        })
    }

    /// One `POST` of records `first..=last`.
    async fn deliver(&self, body: String, first: i64, last: i64) -> Result<(), Failed> {
        let mut request = self
            .client
            .post(&self.config.url)
            .header(CONTENT_TYPE, "application/x-ndjson")
            .header("ostiary-seq-from", first)
            .header("ostiary-seq-to", last)
            .body(body);
        if let Some(token) = &self.token {
            request = request.header(AUTHORIZATION, format!("Bearer {}", token.expose()));
        }
        let answer = request
            .send()
            .await
            // Without the URL's query or anything the client echoes of the request.
            .map_err(|e| Failed::Send(ostiary_broker::error_chain(&e.without_url())))?;
        let status = answer.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(Failed::Status(status))
        }
    }

    async fn note_failure(&self, e: &Failed, retry_in: Duration) {
        self.gauges.failures.inc();
        tracing::warn!(error = %e, retry_in = ?retry_in, url = %self.config.url, "siem stream: delivery failed; the batch is kept and sent again");
        let (name, holder, text) = (
            self.config.cursor.clone(),
            self.holder.clone(),
            e.to_string(),
        );
        if let Err(e) = self
            .cursors
            .call(move |c| c.failed(&name, &holder, &text, crate::store::now_ms()))
            .await
        {
            tracing::warn!(error = %e, "siem stream: noting the failure on the cursor failed");
        }
    }
}

/// The body of one batch: a line per record.
fn lines(rows: &[AuditRow], format: SiemFormat) -> Result<String, Failed> {
    let mut body = String::with_capacity(rows.iter().map(|r| r.record.len() + 160).sum());
    for row in rows {
        match format {
            // The record's JSON as stored, untouched: what the chain's hash covers.
            SiemFormat::Records => {
                body.push_str(&format!(
                    "{{\"seq\":{},\"prev\":\"{}\",\"hash\":\"{}\",\"record\":{}}}",
                    row.seq, row.prev, row.hash, row.record
                ));
            }
            SiemFormat::Ocsf => {
                let record: AuditRecord =
                    serde_json::from_str(&row.record).map_err(|e| Failed::Record {
                        seq: row.seq,
                        reason: e.to_string(),
                    })?;
                let mut event = super::ocsf::event(&record);
                event["metadata"]["sequence"] = row.seq.into();
                body.push_str(&event.to_string());
            }
        }
        body.push('\n');
    }
    Ok(body)
}

/// `ostiary audit siem replay --from SEQ`: the stream sends record `from` and everything
/// after it next (again, or for the first time when `from` is past the cursor: a skip).
pub fn replay(cursors: &dyn CursorStore, name: &str, from: i64) -> Result<(), StoreError> {
    cursors.reset(name, from.max(1) - 1, crate::store::now_ms())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, record: &str) -> AuditRow {
        AuditRow {
            seq,
            ts_ms: 1,
            session: None,
            decision: "allow".into(),
            record: record.into(),
            prev: format!("p{seq}"),
            hash: format!("h{seq}"),
        }
    }

    #[test]
    fn records_go_as_stored_with_their_place_in_the_chain() {
        let body = lines(
            &[row(
                7,
                r#"{"ts_ms":1,"request_id":"r7","kind":"http","decision":"allow","duration_us":3}"#,
            )],
            SiemFormat::Records,
        )
        .unwrap();
        let line: serde_json::Value = serde_json::from_str(body.trim_end()).unwrap();
        assert_eq!(line["seq"], 7);
        assert_eq!(line["prev"], "p7");
        assert_eq!(line["hash"], "h7");
        assert_eq!(line["record"]["request_id"], "r7");
        assert!(body.ends_with('\n'));
    }

    #[test]
    fn ocsf_events_carry_the_sequence_and_a_broken_record_is_named() {
        let body = lines(
            &[
                row(1, r#"{"ts_ms":1,"request_id":"a","kind":"http","decision":"deny","duration_us":3}"#),
                row(2, r#"{"ts_ms":2,"request_id":"b","kind":"session","decision":"allow","duration_us":0}"#),
            ],
            SiemFormat::Ocsf,
        )
        .unwrap();
        let events: Vec<serde_json::Value> = body
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0]["metadata"]["sequence"], 1);
        assert_eq!(events[0]["metadata"]["uid"], "a");
        assert_eq!(events[1]["metadata"]["sequence"], 2);
        let e = lines(&[row(9, "{not json")], SiemFormat::Ocsf).unwrap_err();
        assert!(e.to_string().starts_with("record 9 does not parse"), "{e}");
    }

    #[test]
    fn the_lease_outlasts_a_slow_delivery() {
        let mut config = Siem::default();
        assert_eq!(lease_for(&config), Duration::from_secs(23));
        config.timeout = Duration::from_millis(100);
        config.interval = Duration::from_millis(100);
        assert_eq!(lease_for(&config), Duration::from_secs(10));
    }

    #[test]
    fn the_token_is_never_printed() {
        let stream_token = Secret::new("s3cret-token");
        assert_eq!(format!("{stream_token:?}"), "***");
        let e = StreamError::TokenMissing("OSTIARY_SIEM_TOKEN".into());
        assert_eq!(
            e.to_string(),
            "audit.siem.token_env names OSTIARY_SIEM_TOKEN, which is not set"
        );
    }
}
