//! Triggers reloaded without a restart (docs/runs.md): `POST /v1/policy/reload` (as `SIGHUP`
//! does) reads the config file again and puts its `[[trigger]]` tables in force.
//!
//! What it proves: a trigger added to the file starts runs after the reload, one removed is
//! `404` from then on; a file whose triggers do not load (a cron expression that does not
//! parse) leaves the triggers in force as they were, runs still start (they read the config
//! as the proxy loaded it), and the failure is on record.

use serde_json::json;

use crate::support::cli::audit_query;
use crate::support::runs::*;

const FIRST: &str = r#"
[[trigger]]
name = "first"
kind = "api"
agent = "job-bot"
profile = "none"
command = ["true"]
"#;

const SECOND: &str = r#"
[[trigger]]
name = "second"
kind = "api"
agent = "job-bot"
profile = "none"
command = ["true"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggers_are_reloaded_with_the_policies_and_a_bad_file_changes_nothing() {
    let rig = RunsRig::start(FIRST).await;
    let first = rig.start_run("first", json!({})).await;
    rig.wait_status(&first, "succeeded").await;

    let config = std::fs::read_to_string(&rig.server.config).unwrap();
    std::fs::write(&rig.server.config, config.replace(FIRST, SECOND)).unwrap();
    reload(&rig).await;
    let second = rig.start_run("second", json!({})).await;
    rig.wait_status(&second, "succeeded").await;
    let gone = rig
        .call(
            "POST",
            "/v1/runs",
            Some(&rig.admin),
            Some(&json!({"trigger": "first"})),
        )
        .await;
    assert_eq!(gone.status.as_u16(), 404, "{gone}");

    // A schedule that does not parse: nothing changes, and the record says why.
    let broken = format!(
        "{}\n[[trigger]]\nname = \"nightly\"\nkind = \"schedule\"\ncron = \"every night\"\nagent = \"job-bot\"\nprofile = \"none\"\ncommand = [\"true\"]\n",
        std::fs::read_to_string(&rig.server.config).unwrap()
    );
    let good = std::fs::read_to_string(&rig.server.config).unwrap();
    std::fs::write(&rig.server.config, broken).unwrap();
    reload(&rig).await;
    // Runs read the config as the proxy loaded it, not the broken file.
    let still = rig.start_run("second", json!({})).await;
    rig.wait_status(&still, "succeeded").await;
    // (The CLI reads the file itself: put back for the audit query.)
    std::fs::write(&rig.server.config, good).unwrap();
    let records = audit_query(&rig.server, &[], |r| {
        r.iter().any(|r| {
            r["reason"]
                .as_str()
                .is_some_and(|s| s.starts_with("triggers not reloaded"))
        })
    })
    .await;
    let failed = records
        .iter()
        .find(|r| {
            r["reason"]
                .as_str()
                .is_some_and(|s| s.starts_with("triggers not reloaded"))
        })
        .unwrap_or_else(|| panic!("no record of the failed reload: {records:#?}"));
    assert!(
        failed["reason"].as_str().unwrap().contains("every night"),
        "{failed:#}"
    );
    assert_eq!(failed["decision"], "error");
    assert!(records
        .iter()
        .any(|r| r["reason"] == "triggers reloaded: 1 triggers"));
}

/// `POST /v1/policy/reload`, as `SIGHUP` does.
async fn reload(rig: &RunsRig) {
    let reply = rig
        .call(
            "POST",
            "/v1/policy/reload",
            Some(&rig.admin),
            Some(&json!({})),
        )
        .await;
    assert_eq!(reply.status.as_u16(), 200, "{reply}");
}
