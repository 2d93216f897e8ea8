//! An approved execution runs the same phases as a live request (issue 15): its answer goes
//! through response DLP and the byte meters exactly like a live one's. Before the pipeline
//! was written once, the execution had its own copy of the order, which skipped both.

use crate::support::approvals as support;

use serde_json::{json, Value};
use support::{Rig, APPROVER, POLICIES};

/// An AWS key pattern the default DLP detectors know (not a real key).
const KEY: &str = "AKIAIOSFODNN7EXAMPLF";

/// Reads and irreversible calls both scan what comes back; nothing scans requests, so the
/// key reaches the reflecting upstream, which echoes it in its answer.
fn config() -> String {
    format!(
        "approvers = [\"{APPROVER}\"]\n\n[tiers.read]\nchecks = [\"response_dlp\"]\n\n\
         [tiers.irreversible]\nchecks = [\"response_dlp\"]\n"
    )
}

/// Bytes the session has received so far.
async fn received(rig: &Rig) -> u64 {
    let shown: Value = rig
        .proxy
        .control()
        .session(&rig.session.session_id)
        .await
        .unwrap();
    shown["usage"]["bytes_received"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_answer_goes_through_response_dlp_and_the_meters_like_a_live_one() {
    let rig = Rig::start_with(&config(), POLICIES).await;

    // Live: a read whose answer is clean passes and is counted.
    let before = received(&rig).await;
    let clean = rig
        .agent
        .send("GET", &rig.url("/idem/lookup"), None, &[])
        .await;
    assert!(clean.status < 300, "{clean:?}");
    let live_counted = received(&rig).await - before;
    assert!(live_counted > 0, "a live answer is counted");

    // Approved, clean: the stored answer is kept, and counted the same way.
    let url = rig.url("/reflect");
    let body = json!({"note": "nothing to see"}).to_string();
    let held = rig.agent.send("POST", &url, Some(body.clone()), &[]).await;
    assert_eq!(held.status, 202, "{held:?}");
    let id = held.json["approval_id"].as_str().unwrap().to_owned();
    let before = received(&rig).await;
    rig.proxy
        .control()
        .decide(&id, true, APPROVER, None)
        .await
        .unwrap();
    rig.wait_status(&id, "executed").await;
    let counted = received(&rig).await - before;
    assert!(
        counted > 0,
        "an approved answer counts against max_bytes_received"
    );
    let collected = rig
        .agent
        .send("POST", &url, Some(body), &[("ostiary-approval", &id)])
        .await;
    assert_eq!(collected.status, 200, "{collected:?}");
    assert!(
        collected.body.contains("nothing to see"),
        "the stored answer is the upstream's: {collected:?}"
    );
    assert_eq!(
        counted as usize,
        collected.body.len(),
        "exactly the answer's bytes are counted"
    );

    // Approved, leaking: response DLP cuts it before the key, so the key is never stored
    // and the execution does not count as one that answered.
    let leaking = json!({"note": format!("key {KEY} here")}).to_string();
    let held = rig
        .agent
        .send("POST", &url, Some(leaking.clone()), &[])
        .await;
    assert_eq!(held.status, 202, "{held:?}");
    let id = held.json["approval_id"].as_str().unwrap().to_owned();
    rig.proxy
        .control()
        .decide(&id, true, APPROVER, None)
        .await
        .unwrap();
    let ended = rig.wait_status(&id, "failed").await;
    // The held request is the agent's own body (it holds the key by construction); what
    // must not hold it is everything the execution produced.
    for field in ["result", "reason"] {
        assert!(
            !ended[field].to_string().contains(KEY),
            "the key is not in the approval's {field}: {ended:#}"
        );
    }
    let collected = rig
        .agent
        .send("POST", &url, Some(leaking), &[("ostiary-approval", &id)])
        .await;
    assert!(!collected.body.contains(KEY), "{collected:?}");
    // And the cut is counted as a live one's is.
    let metrics = reqwest::Client::new()
        .get(format!("http://{}/metrics", rig.proxy.control_addr))
        .bearer_auth(&rig.proxy.admin_token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("ostiary_checks_total{check=\"response_dlp\",outcome=\"fail\"} 1"),
        "{metrics}"
    );
    let records = rig.proxy.audit().await;
    let failed = records
        .iter()
        .find(|r| {
            r.kind == "approval"
                && r.approval.as_deref() == Some(id.as_str())
                && r.decision == "error"
        })
        .unwrap_or_else(|| panic!("{records:#?}"));
    assert!(!serde_json::to_string(failed).unwrap().contains(KEY));
}
