//! The end of every run, whatever ended it: each clean-up step is retried with backoff, a
//! step that still fails is said on stderr and in the run's report (never skipped in
//! silence), and the report goes into the session's teardown audit record.

use std::future::Future;
use std::time::Duration;

use serde_json::{json, Value};

use super::Outcome;

/// How often a failing step is tried.
pub const ATTEMPTS: u32 = 5;

/// The first wait between attempts; doubled each time (50, 100, 200, 400 ms).
const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// Run `step` until it succeeds or [`ATTEMPTS`] tries have failed; each failure is said on
/// stderr. The last failure is returned.
pub async fn retry<F, Fut>(name: &str, mut step: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut wait = FIRST_BACKOFF;
    let mut attempt = 1;
    loop {
        match step().await {
            Ok(()) => return Ok(()),
            Err(e) if attempt >= ATTEMPTS => {
                eprintln!("ostiary: teardown: {name} failed after {ATTEMPTS} attempts: {e}");
                return Err(e);
            }
            Err(e) => {
                eprintln!(
                    "ostiary: teardown: {name} failed (attempt {attempt} of {ATTEMPTS}): {e}; retrying"
                );
                tokio::time::sleep(wait).await;
                wait *= 2;
                attempt += 1;
            }
        }
    }
}

/// The run's report for the session's teardown record: `{"exit", "limit", "limits_by",
/// "cleaned", "failed", "isolation", "profile"}` (the proxy adds `session` to `cleaned`
/// once the session is torn down).
pub fn report(outcome: &Outcome, isolation: &str, profile: &str) -> Value {
    json!({
        "exit": outcome.exit,
        "limit": outcome.limit.map(|l| l.as_str()),
        "limits_by": outcome.limits_by.as_str(),
        "started": outcome.started,
        "cleaned": outcome.cleaned,
        "failed": outcome.failed,
        "isolation": isolation,
        "profile": profile,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::sandbox::{limits::Mechanism, Limit};

    #[tokio::test]
    async fn a_failing_step_is_retried_then_reported() {
        let tries = AtomicU32::new(0);
        let ok = retry("staging", || async {
            (tries.fetch_add(1, Ordering::SeqCst) >= 2)
                .then_some(())
                .ok_or_else(|| "busy".to_owned())
        })
        .await;
        assert_eq!(ok, Ok(()));
        assert_eq!(tries.load(Ordering::SeqCst), 3);
        let tries = AtomicU32::new(0);
        let e = retry("cgroup", || async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>("EBUSY".to_owned())
        })
        .await;
        assert_eq!(e, Err("EBUSY".to_owned()));
        assert_eq!(tries.load(Ordering::SeqCst), ATTEMPTS);
    }

    #[test]
    fn the_report_names_the_limit_and_what_was_cleaned() {
        let outcome = Outcome {
            exit: 150,
            limit: Some(Limit::Memory),
            limits_by: Mechanism::CgroupV1,
            started: true,
            cleaned: vec!["processes", "cgroup", "staging"],
            failed: vec![],
        };
        let r = report(&outcome, "namespaces", "default");
        assert_eq!(r["limit"], "memory");
        assert_eq!(r["limits_by"], "cgroup-v1");
        assert_eq!(r["cleaned"], json!(["processes", "cgroup", "staging"]));
        assert_eq!(r["exit"], 150);
    }
}
