//! Schedules (`kind = "schedule"`): a cron expression read in a time zone, and the loop that
//! turns its ticks into runs.
//!
//! Each schedule keeps the last tick it handled in a durable cursor (`schedule:<name>` in
//! the store's export cursors), under a lease: one replica ticks a schedule at a time, and a
//! restart knows which ticks it missed. After downtime `catch_up = "one"` starts one run
//! for all the ticks missed (its payload says how many) and never a burst; `"none"` skips
//! them. A tick's run is deduplicated on the tick's time, so even two replicas ticking at
//! once start it once. While a run of the schedule is going, `concurrency` decides: `forbid`
//! skips the tick (audited), `queue` queues it behind (the runner starts one at a time, on
//! every replica: the store's claim checks that none of its runs is running), `replace`
//! cancels the running one and starts the new.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::TimeZone;
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds};
use croner::Cron;

use super::intake::Intake;
use crate::audit::{AuditGuard, AuditSink};
use crate::config::triggers::{CatchUp, Concurrency, Kind, Trigger};
use crate::metrics::Metrics;
use crate::store::cursors::CursorStore;
use crate::store::runs::{RunFilter, RunStatus, RunStore};
use crate::store::{Call, StoreError};

/// A cron expression in a time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    zone: Tz,
}

/// At most this many missed ticks are counted after downtime (the count is a report, and a
/// schedule every second down for a year must not be walked tick by tick).
const MOST_COUNTED: u64 = 100_000;

impl Schedule {
    /// `expr` (five fields, or six with seconds first) in `zone` (an IANA name; UTC when
    /// absent).
    pub fn parse(expr: &str, zone: Option<&str>) -> Result<Self, String> {
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(expr)
            .map_err(|e| format!("cron {expr:?}: {e}"))?;
        let zone = match zone {
            None => Tz::UTC,
            Some(name) => Tz::from_str(name)
                .map_err(|_| format!("timezone {name:?} is not an IANA time zone"))?,
        };
        Ok(Self { cron, zone })
    }

    /// The first tick strictly after `after_ms` (milliseconds since the epoch).
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let after = self.zone.timestamp_millis_opt(after_ms).single()?;
        self.cron
            .find_next_occurrence(&after, false)
            .ok()
            .map(|t| t.timestamp_millis())
    }

    /// The ticks in `(from_ms, to_ms]`: how many (up to [`MOST_COUNTED`]) and the last.
    pub fn between(&self, from_ms: i64, to_ms: i64) -> (u64, Option<i64>) {
        let mut count = 0;
        let mut last = None;
        let mut at = from_ms;
        while let Some(next) = self.next_after(at) {
            if next > to_ms {
                break;
            }
            count += 1;
            last = Some(next);
            at = next;
            if count == MOST_COUNTED {
                // Counted enough: the last tick is the one at or before `to_ms`.
                let before = self
                    .zone
                    .timestamp_millis_opt(to_ms)
                    .single()
                    .and_then(|t| self.cron.find_previous_occurrence(&t, true).ok())
                    .map(|t| t.timestamp_millis());
                return (count, before.or(last));
            }
        }
        (count, last)
    }
}

/// The schedules of a config, ticking.
pub struct Scheduler {
    schedules: Vec<(Trigger, Schedule)>,
    intake: Arc<Intake>,
    cursors: Arc<dyn CursorStore>,
    runs: Arc<dyn RunStore>,
    audit: AuditSink,
    metrics: Arc<Metrics>,
    /// This process, as the cursors' leases name it.
    holder: String,
    /// The triggers of each reload.
    updates: Option<tokio::sync::watch::Receiver<Arc<Vec<Trigger>>>>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("schedules", &self.schedules.len())
            .finish_non_exhaustive()
    }
}

/// How long a schedule's lease lasts past each renewal.
const LEASE: Duration = Duration::from_secs(30);

impl Scheduler {
    pub fn new(
        triggers: &[Trigger],
        intake: Arc<Intake>,
        cursors: Arc<dyn CursorStore>,
        runs: Arc<dyn RunStore>,
        audit: AuditSink,
        metrics: Arc<Metrics>,
        holder: String,
    ) -> Result<Self, String> {
        Ok(Self {
            schedules: schedules_of(triggers)?,
            intake,
            cursors,
            runs,
            audit,
            metrics,
            holder,
            updates: None,
        })
    }

    /// Start the schedules again from each set of triggers `updates` brings (a reload).
    pub fn following(mut self, updates: tokio::sync::watch::Receiver<Arc<Vec<Trigger>>>) -> Self {
        self.updates = Some(updates);
        self
    }

    /// Tick every schedule until `shutdown`; each time `updates` brings a new set of
    /// triggers (a reload), the schedules are started again from it. Stopping a schedule
    /// mid-tick loses nothing: its cursor still names the last tick it finished, and a tick
    /// handled twice starts one run (runs are deduplicated on the tick).
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut updates = self.updates.take();
        let this = Arc::new(self);
        let mut schedules = this.schedules.clone();
        loop {
            let mut tasks = tokio::task::JoinSet::new();
            for (trigger, schedule) in schedules.clone() {
                let this = this.clone();
                tasks.spawn(async move { this.tick_forever(&trigger, &schedule).await });
            }
            let reloaded = tokio::select! {
                () = &mut shutdown => None,
                changed = changed(&mut updates) => changed,
            };
            tasks.shutdown().await;
            let Some(triggers) = reloaded else {
                break;
            };
            match schedules_of(&triggers) {
                Ok(fresh) => {
                    // The ones no longer configured: another replica may not take them,
                    // but their leases need not run out either.
                    this.release(
                        schedules
                            .iter()
                            .filter(|(t, _)| !fresh.iter().any(|(f, _)| f.name == t.name)),
                    )
                    .await;
                    schedules = fresh;
                }
                Err(e) => {
                    tracing::error!(error = %e, "schedules: the reloaded triggers do not parse; the schedules in force stay")
                }
            }
        }
        // Another replica takes the schedules over at once.
        this.release(schedules.iter()).await;
    }

    async fn release<'a>(&self, schedules: impl Iterator<Item = &'a (Trigger, Schedule)>) {
        for (trigger, _) in schedules {
            let (name, holder) = (cursor_name(&trigger.name), self.holder.clone());
            let _ = self.cursors.call(move |c| c.release(&name, &holder)).await;
        }
    }

    async fn tick_forever(&self, trigger: &Trigger, schedule: &Schedule) {
        let name = cursor_name(&trigger.name);
        loop {
            // The lease, and the last tick handled (a schedule never seen starts now: the
            // ticks before it existed are not missed ones).
            let now = crate::store::now_ms();
            let until = now + LEASE.as_millis() as i64;
            let (n, h) = (name.clone(), self.holder.clone());
            let claimed = self
                .cursors
                .call(move |c| c.claim(&n, &h, now, now, until))
                .await;
            let last = match claimed {
                Ok(Some(last)) => last,
                Ok(None) => {
                    // Another replica ticks it; look again within a lease.
                    tokio::time::sleep(LEASE / 3).await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(trigger = %trigger.name, error = %e, "schedule: the store is unavailable; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let (missed, latest) = schedule.between(last, now);
            let due = match (missed, latest) {
                // Ticks missed while nobody ticked: one catch-up run, or none.
                (n, Some(latest)) if n > 0 => {
                    if trigger.catch_up == CatchUp::One {
                        self.handle(trigger, latest, n - 1).await;
                    }
                    Some(latest)
                }
                _ => None,
            };
            if let Some(tick) = due {
                self.advance(&name, last, tick).await;
                continue;
            }
            let Some(next) = schedule.next_after(now.max(last)) else {
                tracing::warn!(trigger = %trigger.name, "schedule: no tick ever again");
                std::future::pending::<()>().await;
                return;
            };
            let wait = Duration::from_millis(u64::try_from(next - now).unwrap_or(0));
            // Wake in time to renew the lease if the tick is far.
            if wait > LEASE / 2 {
                tokio::time::sleep(LEASE / 2).await;
                continue;
            }
            tokio::time::sleep(wait).await;
            self.handle(trigger, next, 0).await;
            self.advance(&name, last, next).await;
        }
    }

    async fn advance(&self, name: &str, from: i64, to: i64) {
        let (n, h) = (name.to_owned(), self.holder.clone());
        let now = crate::store::now_ms();
        if let Err(e) = self
            .cursors
            .call(move |c| c.advance(&n, &h, from, to, now))
            .await
        {
            tracing::warn!(cursor = name, error = %e, "schedule: the tick handled could not be recorded; it may be handled again (deduplicated)");
        }
    }

    /// One tick: a run, unless `concurrency` says otherwise.
    async fn handle(&self, trigger: &Trigger, tick_ms: i64, missed: u64) {
        let busy = match self.busy(&trigger.name).await {
            Ok(busy) => busy,
            Err(e) => {
                tracing::warn!(trigger = %trigger.name, error = %e, "schedule: the store is unavailable; the tick is skipped");
                self.skipped(
                    trigger,
                    tick_ms,
                    &format!("the run store is unavailable: {e}"),
                );
                return;
            }
        };
        match (trigger.concurrency, busy) {
            (Concurrency::Forbid, true) => {
                self.skipped(
                    trigger,
                    tick_ms,
                    "a run of this schedule is still going (concurrency = \"forbid\")",
                );
                return;
            }
            (Concurrency::Replace, true) => self.cancel_running(trigger).await,
            _ => {}
        }
        if let Err(e) = self.intake.tick(&trigger.name, tick_ms, missed).await {
            tracing::warn!(trigger = %trigger.name, error = %e, "schedule: the tick started no run");
        }
    }

    /// A run of `trigger` is running or waiting.
    async fn busy(&self, trigger: &str) -> Result<bool, StoreError> {
        let name = trigger.to_owned();
        self.runs
            .call(move |s| {
                if s.running(&name)? > 0 {
                    return Ok(true);
                }
                for status in [RunStatus::Queued, RunStatus::AwaitingApproval] {
                    let waiting = s.list(&RunFilter {
                        status: Some(status),
                        trigger: Some(name.clone()),
                        dead_letters: false,
                        limit: Some(1),
                    })?;
                    if !waiting.is_empty() {
                        return Ok(true);
                    }
                }
                Ok(false)
            })
            .await
    }

    async fn cancel_running(&self, trigger: &Trigger) {
        let name = trigger.name.clone();
        let cancelled = self
            .runs
            .call(move |s| {
                let running = s.list(&RunFilter {
                    status: Some(RunStatus::Running),
                    trigger: Some(name),
                    dead_letters: false,
                    limit: Some(100),
                })?;
                for run in &running {
                    s.cancel(
                        &run.id,
                        "replaced by the schedule's next tick (concurrency = \"replace\")",
                        crate::store::now_ms(),
                    )?;
                }
                Ok::<_, StoreError>(running.len())
            })
            .await;
        if let Err(e) = cancelled {
            tracing::warn!(trigger = %trigger.name, error = %e, "schedule: the running run could not be replaced");
        }
    }

    /// A tick that started nothing, on record.
    fn skipped(&self, trigger: &Trigger, tick_ms: i64, why: &str) {
        let request_id = crate::ids::request_id();
        let mut audit = AuditGuard::start(&self.audit, &self.metrics, &request_id, "trigger");
        audit.update(|r| {
            r.agent = Some(trigger.agent.clone());
            r.reason = Some(format!("trigger {}: tick skipped: {why}", trigger.name));
            r.run = Some(serde_json::json!({"trigger": trigger.name, "scheduled_ms": tick_ms}));
        });
        audit.event("cancel", None);
    }
}

/// The next set of triggers `updates` brings; never, once nobody can send one.
async fn changed(
    updates: &mut Option<tokio::sync::watch::Receiver<Arc<Vec<Trigger>>>>,
) -> Option<Arc<Vec<Trigger>>> {
    if let Some(rx) = updates {
        if rx.changed().await.is_ok() {
            return Some(rx.borrow_and_update().clone());
        }
    }
    std::future::pending().await
}

/// The schedule triggers of `triggers`, parsed.
fn schedules_of(triggers: &[Trigger]) -> Result<Vec<(Trigger, Schedule)>, String> {
    let mut schedules = Vec::new();
    for t in triggers.iter().filter(|t| t.kind == Kind::Schedule) {
        let cron = t.cron.as_deref().unwrap_or_default();
        schedules.push((t.clone(), Schedule::parse(cron, t.timezone.as_deref())?));
    }
    Ok(schedules)
}

fn cursor_name(trigger: &str) -> String {
    format!("schedule:{trigger}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    #[test]
    fn six_fields_tick_by_the_second_and_five_by_the_minute() {
        let every5 = Schedule::parse("*/5 * * * * *", None).unwrap();
        assert_eq!(every5.next_after(T0), Some(T0 + 5_000));
        assert_eq!(every5.next_after(T0 + 1), Some(T0 + 5_000));
        let minutely = Schedule::parse("* * * * *", None).unwrap();
        assert_eq!(minutely.next_after(T0), Some(T0 + 60_000));
    }

    #[test]
    fn a_time_zone_moves_the_ticks() {
        let utc = Schedule::parse("0 0 9 * * *", Some("UTC")).unwrap();
        let paris = Schedule::parse("0 0 9 * * *", Some("Europe/Paris")).unwrap();
        assert_eq!(utc.next_after(T0), Some(T0 + 9 * 3_600_000));
        // Paris is UTC+1 in January.
        assert_eq!(paris.next_after(T0), Some(T0 + 8 * 3_600_000));
    }

    #[test]
    fn missed_ticks_are_counted_with_the_last() {
        let every = Schedule::parse("* * * * * *", None).unwrap();
        assert_eq!(every.between(T0, T0 + 5_000), (5, Some(T0 + 5_000)));
        assert_eq!(every.between(T0, T0 + 999), (0, None));
        let (n, last) = every.between(T0, T0 + 200_000_000);
        assert_eq!(n, MOST_COUNTED);
        assert_eq!(last, Some(T0 + 200_000_000));
    }

    #[test]
    fn bad_expressions_and_zones_are_refused() {
        assert!(Schedule::parse("not cron", None)
            .unwrap_err()
            .contains("cron"));
        assert!(Schedule::parse("* * * * * * * *", None).is_err());
        assert!(Schedule::parse("* * * * *", Some("Mars/Olympus"))
            .unwrap_err()
            .contains("IANA"));
    }
}
