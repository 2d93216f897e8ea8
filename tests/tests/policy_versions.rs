//! Policy versions (issue 20, part 1): every policy set has a content-addressed id that
//! `ostiary policy validate` names before it is deployed; every audit record names the set
//! that decided it; a reload to changed files swaps in a new id, which new records carry,
//! and `ostiary policy versions` lists both sets with when they went live and were
//! replaced; a restart with the same files is the same id; an approval held under one set
//! and executed after a reload to another records both.

use ostiary_e2e::proxy::TestProxy;
use ostiary_e2e::raw::exchange;
use ostiary_e2e::upstream::Upstream;
use serde_json::Value;

use crate::reload::{ECHO_AND_STATUS, ECHO_ONLY};
use crate::support::approvals::{Rig, APPROVER, POLICIES};
use crate::support::cli::*;

/// `ostiary --config <config> <args> --json`, which must succeed; its JSON.
async fn json_of(config: &str, args: &[&str]) -> Value {
    let mut all = vec!["--config", config];
    all.extend_from_slice(args);
    all.push("--json");
    let out = ostiary(&all).await;
    assert!(out.success(), "{out}");
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}:\n{out}"))
}

fn version_of(v: &Value) -> String {
    let id = v.as_str().unwrap_or_else(|| panic!("no version id: {v}"));
    let hex = id.strip_prefix("sha256:").unwrap_or_else(|| panic!("{id}"));
    assert_eq!(hex.len(), 16, "{id}");
    id.to_owned()
}

/// `POST /v1/policy/reload` with the state directory's admin token; the answer's JSON.
async fn reload(server: &Server) -> Value {
    let token = std::fs::read_to_string(server.state.join("admin.token")).unwrap();
    let addr = server.control_addr;
    let request = format!(
        "POST /v1/policy/reload HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n",
        token.trim()
    );
    let reply = exchange(addr, request.as_bytes()).await.unwrap();
    assert_eq!(reply.status.as_u16(), 200, "{reply:?}");
    serde_json::from_slice(&reply.body).unwrap()
}

/// The committed record of the request to `path` that was answered `status`.
async fn record_of(server: &Server, path: &str, status: u16) -> Value {
    let records = audit_query(server, &[], |records| {
        records
            .iter()
            .any(|r| r["kind"] == "http" && r["path"] == path && r["status"] == status)
    })
    .await;
    records
        .into_iter()
        .rev()
        .find(|r| r["kind"] == "http" && r["path"] == path && r["status"] == status)
        .unwrap_or_else(|| panic!("no record of {path} answered {status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_name_the_deciding_set_and_versions_lists_every_live_set() {
    let upstream = Upstream::builder()
        .tls(false)
        .names(&["api.example.test"])
        .start()
        .await;
    let mut server = Server::start(&upstream, &["api.example.test"], ECHO_ONLY).await;
    let config = server.config_arg();

    // The id is known before anything is deployed, and it is the one the proxy serves.
    let validated = json_of(&config, &["policy", "validate"]).await;
    let v1 = version_of(&validated["version"]);
    let (_, token) = session(&server, "versioned").await;
    assert_eq!(
        get(&server, &token, &upstream.url("/echo")).await.status,
        200
    );
    let first = record_of(&server, "/echo", 200).await;
    assert_eq!(first["policy_version"], v1, "{first:#}");
    let denied = get(&server, &token, &upstream.url("/status/200")).await;
    assert_eq!(denied.status, 403);
    assert_eq!(
        record_of(&server, "/status/200", 403).await["policy_version"],
        v1
    );

    // Changed files: a new id, which validate predicts and the reload swaps in.
    std::fs::write(
        server.dir.path().join("policies/test.cedar"),
        ECHO_AND_STATUS,
    )
    .unwrap();
    let predicted = version_of(&json_of(&config, &["policy", "validate"]).await["version"]);
    let reloaded = reload(&server).await;
    let v2 = version_of(&reloaded["version"]);
    assert_ne!(v1, v2);
    assert_eq!(predicted, v2);
    assert_eq!(
        get(&server, &token, &upstream.url("/status/200"))
            .await
            .status,
        200
    );
    assert_eq!(
        record_of(&server, "/status/200", 200).await["policy_version"],
        v2
    );
    // The reload's own record names the set it swapped in.
    let is_reload = |r: &&Value| {
        r["kind"] == "policy"
            && r["reason"]
                .as_str()
                .is_some_and(|s| s.starts_with("policy set reloaded"))
    };
    let records = audit_query(&server, &[], |records| {
        records.iter().any(|r| is_reload(&r))
    })
    .await;
    let reload_record = records.iter().find(is_reload).expect("the reload's record");
    assert_eq!(reload_record["policy_version"], v2, "{reload_record:#}");
    // Every record of the trail names a set: none was written before one was loaded.
    let unnamed: Vec<&Value> = records
        .iter()
        .filter(|r| r["kind"] != "audit" && r["policy_version"].is_null())
        .collect();
    assert!(
        unnamed.is_empty(),
        "records without a version: {unnamed:#?}"
    );

    // Both sets, newest first, with when they went live and when v1 was replaced.
    let listed = json_of(&config, &["policy", "versions"]).await;
    assert_eq!(listed["current"], v2, "{listed:#}");
    let versions = listed["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2, "{listed:#}");
    let (now, before) = (&versions[0], &versions[1]);
    assert_eq!(
        (now["version"].as_str(), before["version"].as_str()),
        (Some(v2.as_str()), Some(v1.as_str()))
    );
    assert_eq!(now["current"], true);
    assert_eq!(now["live"], true);
    assert!(now["replaced_ms"].is_null(), "{now:#}");
    assert_eq!(
        (now["policies"].as_i64(), before["policies"].as_i64()),
        (Some(2), Some(1))
    );
    assert_eq!(before["current"], false);
    assert_eq!(before["live"], false);
    assert_eq!(
        before["replaced_ms"], now["first_live_ms"],
        "v1 was replaced when v2 went live: {listed:#}"
    );
    assert!(before["first_live_ms"].as_i64().unwrap() <= now["first_live_ms"].as_i64().unwrap());
    // The table names both.
    let table = ostiary(&["--config", &config, "policy", "versions"]).await;
    assert!(table.success(), "{table}");
    assert!(
        table.stdout.contains(&v1) && table.stdout.contains(&v2),
        "{table}"
    );

    // A restart with the same files serves the same id: still two sets, v2 current.
    terminate(&mut server.child, &server.log).await;
    server.child = spawn_serve(Some(&server.config), None, &server.log, "info");
    let control = server.control_addr;
    server.wait_healthy(control).await.unwrap();
    let after = json_of(&config, &["policy", "versions"]).await;
    assert_eq!(after["current"], v2, "{after:#}");
    let versions = after["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 2, "{after:#}");
    assert_eq!(versions[0]["version"], v2);
    assert_eq!(versions[0]["first_live_ms"], now["first_live_ms"]);
    assert!(versions[0]["replaced_ms"].is_null());
    assert_eq!(versions[1]["replaced_ms"], before["replaced_ms"]);
    server.stop().await;
}

/// A config for the CLI that reaches `proxy`'s control listener and reads its admin token.
fn cli_config(proxy: &TestProxy) -> String {
    let path = proxy.dir.path().join("cli.toml");
    std::fs::write(
        &path,
        format!(
            "[listen]\ncontrol = \"{}\"\n[state]\ndir = \"{}\"\n",
            proxy.control_addr,
            proxy.dir.path().join("state").display()
        ),
    )
    .unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_held_under_one_set_and_executed_under_the_next_records_both() {
    let rig = Rig::start(&format!("approvers = [\"{APPROVER}\"]")).await;
    let policies = &rig.proxy.shared.reloader.policies;
    let v1 = policies.current().version().to_string();
    let id = rig.hold("ch_v", &[1, 2]).await;
    let held = rig.proxy.control().approval(&id).await.unwrap();
    assert_eq!(held["held_policy_version"], v1, "{held:#}");
    assert!(held["executed_policy_version"].is_null(), "{held:#}");

    // Another set that still lets an approved refund through: a reviewed comment is enough
    // to make it another version.
    std::fs::write(
        rig.proxy.dir.path().join("policies/test.cedar"),
        format!("// reviewed\n{POLICIES}"),
    )
    .unwrap();
    let report = ostiary::policy_store::reload(
        rig.proxy.shared.reloader.clone(),
        ostiary::policy_store::Trigger::Api,
    )
    .await
    .unwrap();
    let v2 = report.version;
    assert_ne!(v1, v2);
    assert_eq!(policies.current().version().as_str(), v2);

    rig.proxy
        .control()
        .decide(&id, true, APPROVER, None)
        .await
        .unwrap();
    let executed = rig.wait_status(&id, "executed").await;
    assert_eq!(rig.applied("ch_v"), 1);
    assert_eq!(executed["held_policy_version"], v1, "{executed:#}");
    assert_eq!(executed["executed_policy_version"], v2, "{executed:#}");

    // The trail says the same: the held request under v1, its execution under v2.
    let records = rig.proxy.audit().await;
    let hold = records
        .iter()
        .find(|r| {
            r.kind == "http"
                && r.decision == "escalate"
                && r.approval.as_deref() == Some(id.as_str())
        })
        .expect("the held request's record");
    assert_eq!(hold.policy_version.as_deref(), Some(v1.as_str()));
    let execution = records
        .iter()
        .find(|r| {
            r.kind == "approval"
                && r.approval.as_deref() == Some(id.as_str())
                && r.reason
                    .as_deref()
                    .is_some_and(|s| s.starts_with("executed"))
        })
        .expect("the execution's record");
    assert_eq!(execution.policy_version.as_deref(), Some(v2.as_str()));

    // `approvals show` names both.
    let config = cli_config(&rig.proxy);
    let shown = ostiary(&["--config", &config, "approvals", "show", &id]).await;
    assert!(shown.success(), "{shown}");
    assert!(
        shown.stdout.contains(&format!("held under   {v1}"))
            && shown.stdout.contains(&format!("executed     under {v2}")),
        "{shown}"
    );
}
