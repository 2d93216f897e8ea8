//! The shared counters against the machine's Redis (`OSTIARY_TEST_REDIS`, default
//! `redis://127.0.0.1:6379`): each check-and-charge holds when several handles (as
//! several replicas would) race on one session or one rate key, carving and closing move
//! budget between parent and child exactly once, a lost account is refused rather than
//! restarted, and a Redis that does not answer is an error every caller sees, never a yes.
//!
//! Each test keys under a prefix of its own; a Redis that cannot be reached fails the test.

use std::sync::Arc;
use std::time::Duration;

use ostiary::config::Rate;
use ostiary::counters::{Counters, CountersError};
use ostiary::guardrails::meter::Limits;
use ostiary::metrics::Metrics;

fn redis_url() -> String {
    std::env::var("OSTIARY_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

fn prefix() -> String {
    format!(
        "test-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// `n` handles on one prefix: what `n` replicas hold.
async fn replicas(n: usize) -> Vec<Arc<Counters>> {
    let prefix = prefix();
    let handles: Vec<Arc<Counters>> = (0..n)
        .map(|_| Arc::new(Counters::new(&redis_url(), &prefix, &Metrics::default()).unwrap()))
        .collect();
    let status = handles[0].ping().await;
    assert!(
        status.ok,
        "Redis at {} is required: {:?}",
        redis_url(),
        status.reason
    );
    handles
}

const HOUR: Duration = Duration::from_secs(3600);

fn calls(n: u64) -> Limits {
    Limits {
        max_calls: Some(n),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_budget_raced_by_three_replicas_stops_at_exactly_its_limit() {
    let fleet = replicas(3).await;
    fleet[0].open("s", &calls(30), None, HOUR).await.unwrap();
    // Opening again (another replica, a retry) changes nothing.
    fleet[1].open("s", &calls(99), None, HOUR).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..90 {
        let counters = fleet[i % 3].clone();
        tasks.push(tokio::spawn(async move {
            counters.charge("s", 1_000, true).await.unwrap().is_ok()
        }));
    }
    let mut charged = 0;
    for task in tasks {
        charged += usize::from(task.await.unwrap());
    }
    assert_eq!(charged, 30, "exactly the budget, never one more");
    let refused = fleet[2].charge("s", 0, true).await.unwrap().unwrap_err();
    assert_eq!(refused.limit, "calls");
    assert_eq!(refused.used, serde_json::json!(30));
    // A call a human approved runs whatever the budget says, and is counted.
    let usage = fleet[0].charge("s", 0, false).await.unwrap().unwrap();
    assert_eq!(usage.calls, 31);
    // A grant doubles the limit: 29 more fit.
    assert!(fleet[1].grant("s", "calls").await.unwrap());
    let more = futures_util::future::join_all((0..40).map(|i| {
        let c = fleet[i % 3].clone();
        async move { c.charge("s", 0, true).await.unwrap().is_ok() }
    }))
    .await;
    assert_eq!(more.iter().filter(|ok| **ok).count(), 29);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_is_refused_before_it_passes_and_exactly_at_the_edge() {
    let fleet = replicas(2).await;
    let limits = Limits {
        max_cost_micros: Some(1_000_000),
        ..Default::default()
    };
    fleet[0].open("s", &limits, None, HOUR).await.unwrap();
    for _ in 0..4 {
        fleet[1].charge("s", 250_000, true).await.unwrap().unwrap();
    }
    let refused = fleet[0].charge("s", 1, true).await.unwrap().unwrap_err();
    assert_eq!(refused.limit, "cost");
    assert_eq!(refused.max, serde_json::json!(1.0));
    // A free call still fits a spent cost budget.
    fleet[0].charge("s", 0, true).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_carves_from_its_parent_and_gives_back_what_it_did_not_use_once() {
    let fleet = replicas(2).await;
    fleet[0].open("p", &calls(10), None, HOUR).await.unwrap();
    // Asked for more than is left: refused, nothing carved.
    let refused = fleet[1].carve("p", calls(11)).await.unwrap().unwrap_err();
    assert_eq!(
        (refused.limit.as_str(), refused.max.clone()),
        ("calls", serde_json::json!(10))
    );
    // Named nothing: half of what is left.
    let child = fleet[1]
        .carve("p", Limits::default())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(child.max_calls, Some(5));
    fleet[1].open("c", &child, Some("p"), HOUR).await.unwrap();
    // The parent has 5 left to spend itself.
    let spent = futures_util::future::join_all((0..8).map(|i| {
        let c = fleet[i % 2].clone();
        async move { c.charge("p", 0, true).await.unwrap().is_ok() }
    }))
    .await;
    assert_eq!(spent.iter().filter(|ok| **ok).count(), 5);
    fleet[0].charge("c", 0, true).await.unwrap().unwrap();
    fleet[0].charge("c", 0, true).await.unwrap().unwrap();
    // Closed on one replica and again on the other: the parent gets 3 calls back, once.
    let totals = fleet[1]
        .close("c")
        .await
        .unwrap()
        .expect("the first close has the totals");
    assert_eq!(totals.usage.calls, 2);
    assert_eq!(totals.parent.as_deref(), Some("p"));
    assert!(fleet[0].close("c").await.unwrap().is_none());
    let back = futures_util::future::join_all((0..6).map(|_| {
        let c = fleet[0].clone();
        async move { c.charge("p", 0, true).await.unwrap().is_ok() }
    }))
    .await;
    assert_eq!(back.iter().filter(|ok| **ok).count(), 3);
    // A closed account is gone: charging it is an error, not a fresh budget.
    assert!(matches!(
        fleet[1].charge("c", 0, true).await,
        Err(CountersError::AccountLost(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_pauses_and_the_chain_come_back_from_sync() {
    let fleet = replicas(2).await;
    let root = Limits {
        max_bytes_sent: Some(1000),
        ..Default::default()
    };
    fleet[0].open("p", &root, None, HOUR).await.unwrap();
    fleet[0]
        .open("c", &Limits::default(), Some("p"), HOUR)
        .await
        .unwrap();
    // Bytes a child moved on one replica count for its parent, seen from the other.
    fleet[0].sync("c", 600, 10).await.unwrap();
    let seen = fleet[1].sync("p", 0, 0).await.unwrap();
    assert_eq!(seen.accounts[0].1.usage.bytes_sent, 600);
    let seen = fleet[1].sync("c", 500, 0).await.unwrap();
    let ids: Vec<&str> = seen.accounts.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["c", "p"], "the chain, nearest first");
    assert_eq!(seen.accounts[1].1.usage.bytes_sent, 1100);
    assert_eq!(seen.accounts[1].1.limits.max_bytes_sent, Some(1000));
    assert!(seen.pause.is_none());
    // A pause set through one replica is in the other's next sync, and lifted likewise.
    let pause = ostiary::guardrails::store::Paused {
        kind: "cycle".into(),
        reason: "the same call 20 times".into(),
        at_ms: 1,
        dead_letter: 7,
    };
    fleet[0].set_pause("c", Some(&pause)).await.unwrap();
    assert_eq!(
        fleet[1].sync("c", 0, 0).await.unwrap().pause,
        Some(pause.clone())
    );
    fleet[1].set_pause("c", None).await.unwrap();
    assert_eq!(fleet[0].sync("c", 0, 0).await.unwrap().pause, None);
    // The replica that paused completes its pause (the dead letter's number) only where it
    // still stands: a resume on the other replica meanwhile is not undone.
    let completed = ostiary::guardrails::store::Paused {
        dead_letter: 8,
        ..pause.clone()
    };
    assert!(!fleet[0].refresh_pause("c", &completed).await.unwrap());
    assert_eq!(fleet[1].sync("c", 0, 0).await.unwrap().pause, None);
    fleet[0].set_pause("c", Some(&pause)).await.unwrap();
    assert!(fleet[0].refresh_pause("c", &completed).await.unwrap());
    assert_eq!(
        fleet[1].sync("c", 0, 0).await.unwrap().pause,
        Some(completed)
    );
    assert!(!fleet[0].refresh_pause("nobody", &pause).await.unwrap());
    fleet[1].set_pause("c", None).await.unwrap();
    // An account Redis does not have is lost, not restarted.
    assert!(matches!(
        fleet[0].sync("nobody", 0, 0).await,
        Err(CountersError::AccountLost(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_shared_by_replicas_admits_the_burst_once_then_the_rate() {
    let fleet = replicas(3).await;
    let rate = Rate {
        count: 10,
        period: Duration::from_secs(1),
        burst: 5,
    };
    // The burst, across three replicas at once: 5 of 30.
    let first = futures_util::future::join_all((0..30).map(|i| {
        let c = fleet[i % 3].clone();
        async move { c.admit_rate("agent:read:t/a", &rate).await.unwrap() }
    }))
    .await;
    let admitted = first.iter().filter(|r| r.is_ok()).count();
    assert_eq!(admitted, 5, "{first:?}");
    // The refusal says how long until the next one: at most one interval.
    let wait = first.iter().find_map(|r| r.err()).unwrap();
    assert!(wait <= Duration::from_millis(100), "{wait:?}");
    // Another key is untouched.
    assert!(fleet[0]
        .admit_rate("agent:read:t/b", &rate)
        .await
        .unwrap()
        .is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_counts_hold_across_replicas_and_drop_when_a_child_closes() {
    let fleet = replicas(3).await;
    fleet[0]
        .open("p", &Limits::default(), None, HOUR)
        .await
        .unwrap();
    let counted = futures_util::future::join_all((0..10).map(|i| {
        let c = fleet[i % 3].clone();
        async move { c.spawn("p", 4, HOUR).await.unwrap() }
    }))
    .await;
    assert_eq!(counted.iter().filter(|r| r.is_ok()).count(), 4);
    assert_eq!(fleet[1].spawn("p", 4, HOUR).await.unwrap(), Err(4));
    // One never made (given back), one that ends (its close drops the count).
    fleet[2].unspawn("p").await.unwrap();
    fleet[0]
        .open("c", &Limits::default(), Some("p"), HOUR)
        .await
        .unwrap();
    fleet[0].close("c").await.unwrap();
    fleet[1].spawn("p", 4, HOUR).await.unwrap().unwrap();
    fleet[1].spawn("p", 4, HOUR).await.unwrap().unwrap();
    assert_eq!(fleet[1].spawn("p", 4, HOUR).await.unwrap(), Err(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_does_not_answer_is_an_error_and_says_so() {
    // A port nothing listens on (bound, never listened on, for the whole test).
    let (_closed, closed) = ostiary_e2e::raw::refusing_port();
    let port = closed.port();
    let metrics = Metrics::default();
    let counters =
        Counters::new(&format!("redis://127.0.0.1:{port}"), &prefix(), &metrics).unwrap();
    let err = counters.charge("s", 0, true).await.unwrap_err();
    assert!(matches!(err, CountersError::Unreachable(_)), "{err}");
    let refused = counters
        .admit_rate(
            "k",
            &Rate {
                count: 1,
                period: Duration::from_secs(1),
                burst: 1,
            },
        )
        .await;
    assert!(
        refused.is_err(),
        "a rate limit without Redis admits nothing"
    );
    let status = counters.status();
    assert!(!status.ok);
    assert!(status.reason.is_some());
    assert!(
        metrics.encode().contains("ostiary_state_available 0"),
        "{}",
        metrics.encode()
    );
    // The error the agent gets names the component, not the address.
    let proxy_error: ostiary::error::ProxyError = err.into();
    assert_eq!(proxy_error.kind(), "state_unavailable");
    // A URL that is not Redis's is refused at start, without its password.
    let bad = Counters::new("http://user:hunter2@127.0.0.1:1", "p", &Metrics::default())
        .unwrap_err()
        .to_string();
    assert!(!bad.contains("hunter2"), "{bad}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_trail_is_one_sequence_every_replica_reads_in_order() {
    use ostiary::counters::trail::TrailEvent;
    let fleet = replicas(2).await;
    let event = |key: &str, at_ms| TrailEvent {
        key: key.into(),
        args_hash: 7,
        tier_rank: 0,
        denied: false,
        held: false,
        repeat_max: 20,
        repeat_window_ms: 60_000,
        at_ms,
        reset: false,
    };
    let a = fleet[0]
        .exchange_trail("s", "0-0", &[event("x", 1)], HOUR)
        .await
        .unwrap();
    assert_eq!(a.events, vec![(event("x", 1), true)]);
    // A replica new to the session reads all that is kept, its own call last.
    let b = fleet[1]
        .exchange_trail("s", "0-0", &[event("y", 2), event("z", 3)], HOUR)
        .await
        .unwrap();
    assert_eq!(
        b.events,
        vec![
            (event("x", 1), false),
            (event("y", 2), true),
            (event("z", 3), true)
        ]
    );
    // The first replica, from its cursor, reads only what came since.
    let a = fleet[0]
        .exchange_trail("s", &a.cursor, &[], HOUR)
        .await
        .unwrap();
    assert_eq!(
        a.events,
        vec![(event("y", 2), false), (event("z", 3), false)]
    );
    // A reset marker is appended without reading, and read back by the others in place.
    let appended = fleet[1]
        .exchange_trail("s", "", &[TrailEvent::reset(4)], HOUR)
        .await
        .unwrap();
    assert!(appended.events.is_empty());
    let a = fleet[0]
        .exchange_trail("s", &a.cursor, &[], HOUR)
        .await
        .unwrap();
    assert_eq!(a.events, vec![(TrailEvent::reset(4), false)]);
    // Agent-controlled keys travel as they are (JSON), whatever they hold.
    let odd = event("a\"b\\c\u{0}\n é", 5);
    let a = fleet[0]
        .exchange_trail("s", &a.cursor, std::slice::from_ref(&odd), HOUR)
        .await
        .unwrap();
    assert_eq!(a.events, vec![(odd, true)]);
}
