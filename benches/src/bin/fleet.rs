//! What sharing state costs: the same HTTPS tool calls (a catalogued read, so every request
//! pays the session gate, the GCRA rate limit, the call budget and the loop watchdog) through
//!
//! 1. one replica on SQLite, counters in memory (the embedded default; the baseline),
//! 2. one replica on SQLite with its counters in Redis (what the shared counters add),
//! 3. one replica on PostgreSQL + Redis,
//! 4. three replicas on PostgreSQL + Redis, connections spread round-robin,
//!
//! in one run, rounds interleaved so machine noise hits every setup alike; medians of the
//! rounds, as ratios to the baseline. The replicas run in this process, on the same two
//! cores as the load generator and the upstream: three replicas here share the CPU one has,
//! so their line says what coordination costs, not what more machines would give.
//!
//! `cargo run --release -p ostiary-benches --bin fleet -- [requests] [connections] [rounds]`
//! (PostgreSQL at `OSTIARY_TEST_POSTGRES`, Redis at `OSTIARY_TEST_REDIS`; traffic stays on
//! 127.0.0.1).

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ostiary_benches::load::{client_config, run_spread, Route, Summary};
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::NewSession;

const TOOLS: &str = r#"
[[tool]]
name = "bench.lookup"
tier = "read"
match = { host = "api.example.test", method = "GET", path = "/echo" }
"#;

const POLICIES: &str = r#"
@id("reads")
permit (principal, action in Ostiary::Action::"tier:read", resource);
"#;

/// A rate that never refuses, so the GCRA bookkeeping is paid and never a 429; the loop
/// watchdog on (its trail is shared too) with the rules a benchmark's one repeated call would
/// trip turned off.
const TIERS: &str = "[tiers.read]\nrate_agent = \"100000000/s\"\nrepeat_max = 0\n\n[sessions.watchdog]\ncycle_repeats = 0\n";

struct Setup {
    name: &'static str,
    replicas: Vec<TestProxy>,
    routes: Vec<Route>,
}

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn psql(sql: &str) -> Result<()> {
    let url = env(
        "OSTIARY_TEST_POSTGRES",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let status = std::process::Command::new("psql")
        .args([&url, "-qc", sql])
        .status()
        .context("running psql")?;
    ensure!(status.success(), "psql {sql:?} failed");
    Ok(())
}

async fn setup(
    name: &'static str,
    upstream: &Upstream,
    replicas: usize,
    store: Option<String>,
    redis: Option<(String, String)>,
    keys: Option<std::path::PathBuf>,
) -> Result<Setup> {
    let mut proxies = Vec::new();
    for _ in 0..replicas {
        proxies.push(
            TestProxy::start(ProxySpec {
                policies: POLICIES.into(),
                tools_toml: Some(TOOLS.into()),
                ports: vec![upstream.port()],
                upstream_ca_pem: Some(upstream.ca_pem()),
                extra_toml: TIERS.into(),
                store: store.clone(),
                redis: redis.clone(),
                keys_dir: keys.clone(),
                ..Default::default()
            })
            .await,
        );
    }
    let session = proxies[0]
        .control()
        .create_session(&NewSession {
            agent: "bench".into(),
            max_calls: Some(1_000_000_000),
            ..Default::default()
        })
        .await?;
    let routes = proxies
        .iter()
        .map(|p| {
            Ok(Route {
                proxy: Some((p.proxy_addr, session.token.clone())),
                upstream: upstream.addr(),
                host: upstream.host().to_owned(),
                path: "/echo".into(),
                tls: client_config(&p.ca_pem)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Setup {
        name,
        replicas: proxies,
        routes,
    })
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut arg = |default: usize| -> Result<usize> {
        Ok(args
            .next()
            .map(|a| a.parse())
            .transpose()?
            .unwrap_or(default))
    };
    let (total, connections, rounds) = (arg(4_000)?, arg(8)?, arg(5)?);

    let upstream = Upstream::builder().start().await;
    let schema = format!("bench_fleet_{}", std::process::id());
    let base = env(
        "OSTIARY_TEST_POSTGRES",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let store = |which: &str| format!("{base}?options=-csearch_path%3D{schema}_{which}");
    psql(&format!(
        "CREATE SCHEMA {schema}_one; CREATE SCHEMA {schema}_three"
    ))?;
    let redis = env("OSTIARY_TEST_REDIS", "redis://127.0.0.1:6379");
    let prefix = |which: &str| {
        (
            redis.clone(),
            format!("bench-{}-{which}", std::process::id()),
        )
    };
    let keys = tempfile::tempdir()?;
    ostiary::state::StateDir::init_keys(keys.path())?;

    let setups = vec![
        setup(
            "1 replica, SQLite, counters in memory",
            &upstream,
            1,
            None,
            None,
            None,
        )
        .await?,
        setup(
            "1 replica, SQLite, counters in Redis",
            &upstream,
            1,
            None,
            Some(prefix("a")),
            None,
        )
        .await?,
        setup(
            "1 replica, PostgreSQL + Redis",
            &upstream,
            1,
            Some(store("one")),
            Some(prefix("b")),
            Some(keys.path().to_owned()),
        )
        .await?,
        setup(
            "3 replicas, PostgreSQL + Redis",
            &upstream,
            3,
            Some(store("three")),
            Some(prefix("c")),
            Some(keys.path().to_owned()),
        )
        .await?,
    ];
    let results = measure(&setups, total, connections, rounds).await?;
    println!(
        "{total} requests × {rounds} rounds over {connections} keep-alive connections (HTTPS GET, a catalogued read tool); medians of the rounds"
    );
    report(&setups, &results);
    for s in setups {
        for replica in s.replicas {
            replica.stop().await;
        }
    }
    psql(&format!(
        "DROP SCHEMA {schema}_one CASCADE; DROP SCHEMA {schema}_three CASCADE"
    ))?;
    Ok(())
}

/// Every setup warmed up, then `rounds` rounds of `total` requests each: per setup, its
/// rounds' summaries.
async fn measure(
    setups: &[Setup],
    total: usize,
    connections: usize,
    rounds: usize,
) -> Result<Vec<Vec<Summary>>> {
    for s in setups {
        run_spread(&s.routes, connections * 20, connections)
            .await
            .with_context(|| format!("warming up {}", s.name))?;
    }
    let mut results: Vec<Vec<Summary>> = vec![Vec::new(); setups.len()];
    for round in 0..rounds {
        // Rotated, so no setup always runs first (or last) in a round.
        for k in 0..setups.len() {
            let i = (k + round) % setups.len();
            let summary = run_spread(&setups[i].routes, total, connections)
                .await
                .with_context(|| setups[i].name)?;
            results[i].push(summary);
        }
    }
    Ok(results)
}

/// The table: each setup's medians, as ratios and differences to the first (the baseline).
fn report(setups: &[Setup], results: &[Vec<Summary>]) {
    let med = |i: usize, f: &dyn Fn(&Summary) -> f64| {
        let mut v: Vec<f64> = results[i].iter().map(f).collect();
        median(&mut v)
    };
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (base_rps, base_p50, base_p99) = (
        med(0, &|s| s.rps),
        med(0, &|s| us(s.p50)),
        med(0, &|s| us(s.p99)),
    );
    println!(
        "{:<40} {:>10} {:>7} {:>10} {:>10} {:>11} {:>11}",
        "setup", "req/s", "ratio", "p50 µs", "p99 µs", "+p50 µs", "+p99 µs"
    );
    for (i, s) in setups.iter().enumerate() {
        let (rps, p50, p99) = (
            med(i, &|s| s.rps),
            med(i, &|s| us(s.p50)),
            med(i, &|s| us(s.p99)),
        );
        println!(
            "{:<40} {:>10.0} {:>6.2}× {:>10.0} {:>10.0} {:>+11.0} {:>+11.0}",
            s.name,
            rps,
            rps / base_rps,
            p50,
            p99,
            p50 - base_p50,
            p99 - base_p99
        );
    }
}
