//! What the approval queue costs, measured in one run against a baseline: an allowed tool
//! call forwarded through Ostiary (the same proxy, client, upstream and TLS) versus
//! - holding an escalated call (`202`, the approval on disk with `synchronous = FULL`),
//! - an approval decided through the control API until it has executed (claim, re-decide,
//!   forward, store), seen by a `Prefer: wait` status request,
//! - collecting the stored outcome with `Ostiary-Approval`.
//!
//! `cargo run --release -p ostiary-benches --bin approvals -- [rounds]`
//! Traffic stays on 127.0.0.1. Figures are printed as p50/p90 and as ratios to the baseline.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::upstream::Upstream;

const TOOLS: &str = r#"
[[tool]]
name = "pay.refund"
tier = "irreversible"
match = { host = "api.example.test", method = "POST", path = "/idem/refunds/{charge}" }

[[tool]]
name = "pay.quote"
tier = "write"
match = { host = "api.example.test", method = "POST", path = "/idem/quotes/{charge}" }
"#;

const POLICIES: &str = r#"
@id("write-ok")
permit (principal, action in Ostiary::Action::"tier:write", resource);
@id("irreversible-permit")
permit (principal, action in Ostiary::Action::"tier:irreversible", resource);
@id("irreversible-needs-human")
@escalate("approval")
forbid (principal, action in Ostiary::Action::"tier:irreversible", resource)
unless { context.approval.granted };
"#;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(300);
    let upstream = Upstream::builder().start().await;
    let proxy = TestProxy::start(ProxySpec {
        policies: POLICIES.into(),
        tools_toml: Some(TOOLS.into()),
        ports: vec![upstream.port()],
        upstream_ca_pem: Some(upstream.ca_pem()),
        // The bench repeats one call hundreds of times: the watchdog's identical-call rule
        // would (rightly) pause it.
        extra_toml:
            "[approvals]\napprovers = [\"alice@example.com\"]\n[tiers.write]\nrepeat_max = 0\n"
                .into(),
        ..Default::default()
    })
    .await;
    let session = proxy.session("bench").await;
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(proxy.proxy_url(&session))?)
        .add_root_certificate(reqwest::Certificate::from_pem(proxy.ca_pem.as_bytes())?)
        .build()?;
    let control = proxy.control();
    let body = r#"{"ids":[1,2,3],"reason":"duplicate"}"#;

    let (mut allowed, mut held, mut executed, mut collected) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Warm-up: connections, leaf certificate, policy caches.
    for i in 0..20 {
        client
            .post(upstream.url(&format!("/idem/quotes/warm{i}")))
            .body(body)
            .send()
            .await?;
    }
    for i in 0..rounds {
        // Interleaved, so drift (page cache, CPU frequency) affects all four alike.
        let started = Instant::now();
        let r = client
            .post(upstream.url(&format!("/idem/quotes/q{i}")))
            .body(body)
            .send()
            .await?;
        r.bytes().await?;
        allowed.push(started.elapsed());

        let url = upstream.url(&format!("/idem/refunds/r{i}"));
        let started = Instant::now();
        let r = client.post(&url).body(body).send().await?;
        let status = r.status();
        let reply: serde_json::Value = r.json().await?;
        held.push(started.elapsed());
        if status != 202 {
            bail!("expected 202, got {status}: {reply}");
        }
        let id = reply["approval_id"]
            .as_str()
            .context("approval id")?
            .to_owned();
        let status_url = reply["status_url"]
            .as_str()
            .context("status url")?
            .to_owned();

        let started = Instant::now();
        control.decide(&id, true, "alice@example.com", None).await?;
        let r = client
            .get(&status_url)
            .header("prefer", "wait=10")
            .send()
            .await?;
        let view: serde_json::Value = r.json().await?;
        executed.push(started.elapsed());
        if view["status"] != "executed" {
            bail!("not executed: {view}");
        }

        let started = Instant::now();
        let r = client
            .post(&url)
            .header("ostiary-approval", &id)
            .body(body)
            .send()
            .await?;
        let status = r.status();
        r.bytes().await?;
        collected.push(started.elapsed());
        if status != 201 {
            bail!("collect answered {status}");
        }
    }
    let base = percentile(&mut allowed, 0.5);
    println!("approval queue, {rounds} rounds (interleaved), p50 / p90 and p50 ÷ allowed p50:");
    for (name, samples) in [
        ("allowed tool call (baseline)", &mut allowed),
        ("held (202 approval_pending)", &mut held),
        ("approve → executed (API + status wait)", &mut executed),
        ("collect (Ostiary-Approval)", &mut collected),
    ] {
        let p50 = percentile(samples, 0.5);
        let p90 = percentile(samples, 0.9);
        println!(
            "  {name:<40} {:>9.2?} {:>9.2?}  ×{:.2}",
            p50,
            p90,
            p50.as_secs_f64() / base.as_secs_f64()
        );
    }
    let effects = upstream.effects();
    let refunds = effects
        .iter()
        .filter(|e| e.path.starts_with("/idem/refunds/"))
        .count();
    println!("  upstream applied {refunds} refunds for {rounds} approvals");
    proxy.stop().await;
    Ok(())
}
