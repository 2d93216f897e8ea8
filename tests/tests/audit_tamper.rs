//! The audit trail notices truncation (issue 13, item 8), with a real proxy, the real
//! `ostiary` binary for `serve`, `audit verify` and `audit reanchor`:
//! - the newest rows deleted while the proxy is running: it stops forwarding;
//! - the newest rows deleted between two runs: the next start (in-process and `ostiary
//!   serve`) refuses, naming the last record the checkpoint expects and the last one
//!   found; `audit verify` fails; `audit reanchor` records the loss and the proxy runs again;
//! - a deleted or forged checkpoint, a database replaced by an older copy: refused too; an
//!   older genuine checkpoint (what a crash leaves) is accepted and caught up.

use std::path::{Path, PathBuf};

use ostiary_e2e::raw::{absolute_get, auth_line};
use ostiary_e2e::upstream::Upstream;

use crate::support::cli as support;
use support::{spawn_serve, SERVER_DEADLINE};

use crate::support::audit_trail;
use audit_trail::*;

/// Newest rows of the chain, deleted by hand: `DELETE FROM audit WHERE seq > keep`.
fn delete_after(state: &Path, keep: i64) -> usize {
    rusqlite::Connection::open(state.join("ostiary.db"))
        .unwrap()
        .execute("DELETE FROM audit WHERE seq > ?1", [keep])
        .unwrap()
}

/// The last sequence number in the chain.
fn last_seq(state: &Path) -> i64 {
    rusqlite::Connection::open(state.join("ostiary.db"))
        .unwrap()
        .query_row("SELECT coalesce(max(seq), 0) FROM audit", [], |r| r.get(0))
        .unwrap()
}

/// Run a proxy on `state`, send `n` requests through it, stop it.
async fn traffic(state: &Path, plain: &Upstream, n: usize) {
    let proxy = proxy_on(Some(state.to_owned()), &[plain]).await;
    let session = proxy.session("agent").await;
    for i in 0..n {
        let reply = absolute_get(
            &proxy,
            &plain.url(&format!("/echo?{i}")),
            &auth_line(&session.token),
        )
        .await;
        assert_eq!(reply.status, 200, "{reply}");
    }
    proxy.stop().await;
}

/// A config for a proxy on `state` (ports 0, the default policy library), written next to it.
fn config_for(state: &Path) -> PathBuf {
    let path = state.with_extension("serve.toml");
    std::fs::write(
        &path,
        format!(
            "[listen]\nproxy = \"127.0.0.1:0\"\ncontrol = \"127.0.0.1:0\"\n\n[state]\ndir = \"{}\"\n",
            state.display()
        ),
    )
    .unwrap();
    path
}

/// Start a proxy on `state` in-process: the error that refused it, if it was refused.
async fn start_error(state: &Path) -> Option<String> {
    let config = ostiary::Config::load(&config_for(state)).unwrap();
    match ostiary::Ostiary::build(config, ostiary::Options::default()).await {
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}

/// `ostiary serve` on `state`: it must exit on its own, non-zero; its log.
async fn serve_refuses(state: &Path) -> String {
    let log = state.with_extension("serve.log");
    let mut child = spawn_serve(Some(&config_for(state)), None, &log, "info");
    let status = tokio::time::timeout(SERVER_DEADLINE, child.wait())
        .await
        .expect("ostiary serve exits by itself")
        .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "ostiary serve refused to start:\n{text}");
    text
}

/// Copies the (flat) state directory, WAL included, to `to`.
fn copy_state(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_deleted_between_runs_refuse_the_next_start_until_reanchored() {
    let plain = Upstream::builder().tls(false).start().await;
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    traffic(&state, &plain, 4).await;
    let expected = last_seq(&state);
    assert!(expected >= 5, "a session and 4 requests: {expected}");
    assert!(verify(&state).await.success());

    let found = expected - 3;
    assert_eq!(delete_after(&state, found), 3);
    let names = |text: &str| {
        text.contains(&format!("ends at record {found}"))
            && text.contains(&format!("names record {expected}"))
            && text.contains("ostiary audit reanchor")
    };
    let error = start_error(&state).await.expect("the start is refused");
    assert!(names(&error), "{error}");
    let log = serve_refuses(&state).await;
    assert!(names(&log), "ostiary serve says why:\n{log}");
    let out = verify(&state).await;
    assert_eq!(out.status, 1, "{out}");
    assert!(
        out.stdout.contains(&format!(
            "the chain ends at record {found} but record {expected} was written (newest records deleted"
        )),
        "{out}"
    );
    assert_eq!(last_seq(&state), found, "a refused start wrote nothing");

    // Acknowledging needs a reason.
    assert!(!reanchor(&state, &[]).await.success());
    assert!(!reanchor(&state, &["--reason", "  "]).await.success());
    let out = reanchor(
        &state,
        &["--reason", "rows cut by the backup job; checked by ops"],
    )
    .await;
    assert!(out.success(), "{out}");
    let anchor = expected + 1;
    assert!(out.stdout.contains(&format!("record {anchor}")), "{out}");
    let out = verify(&state).await;
    assert!(out.success(), "an acknowledged loss verifies:\n{out}");
    assert!(
        out.stdout.contains(&format!(
            "records {} to {expected} are missing: acknowledged by the re-anchor at record {anchor}",
            found + 1
        )),
        "the loss stays visible:\n{out}"
    );
    assert!(out.stdout.contains("rows cut by the backup job"), "{out}");

    // The proxy runs again, numbering on after the re-anchor; nothing is left to acknowledge.
    traffic(&state, &plain, 2).await;
    assert!(last_seq(&state) > anchor);
    let out = verify(&state).await;
    assert!(out.success(), "{out}");
    let out = reanchor(&state, &["--reason", "again"]).await;
    assert_eq!(out.status, 1, "{out}");
    assert!(out.stdout.contains("nothing to re-anchor"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_forged_checkpoint_or_an_older_database_refuses_the_start() {
    let plain = Upstream::builder().tls(false).start().await;
    let root = tempfile::tempdir().unwrap();
    let base = root.path().join("base");
    traffic(&base, &plain, 3).await;
    let older = root.path().join("older");
    copy_state(&base, &older);
    traffic(&base, &plain, 3).await;
    let last = last_seq(&base);
    let head = std::fs::read_to_string(base.join("audit.head")).unwrap();
    assert!(head.starts_with(&format!("{last} ")), "{head}");

    // (a) The checkpoint deleted.
    let s = root.path().join("no-head");
    copy_state(&base, &s);
    std::fs::remove_file(s.join("audit.head")).unwrap();
    let error = start_error(&s).await.expect("refused");
    assert!(
        error.contains("checkpoint") && error.contains("is missing"),
        "{error}"
    );
    assert!(problems(&s).contains("is missing"), "{}", problems(&s));

    // (b) The newest rows deleted and the checkpoint rewritten to name the new last row,
    // in each format an attacker without the audit key could write.
    let cut = last - 2;
    let cut_hash: String = {
        let s = root.path().join("probe");
        copy_state(&base, &s);
        rusqlite::Connection::open(s.join("ostiary.db"))
            .unwrap()
            .query_row("SELECT hash FROM audit WHERE seq = ?1", [cut], |r| r.get(0))
            .unwrap()
    };
    for (name, forged) in [
        ("unsealed", format!("{cut} {cut_hash}\n")),
        ("bad-seal", format!("{cut} {cut_hash} {}\n", "0".repeat(64))),
        (
            "old-seal",
            format!(
                "{cut} {cut_hash} {}\n",
                head.split_whitespace().nth(2).unwrap()
            ),
        ),
        ("garbage", "not a checkpoint\n".to_owned()),
    ] {
        let s = root.path().join(name);
        copy_state(&base, &s);
        delete_after(&s, cut);
        std::fs::write(s.join("audit.head"), forged).unwrap();
        let error = start_error(&s).await.expect("refused");
        assert!(error.contains("cannot be trusted"), "{name}: {error}");
        let found = problems(&s);
        assert!(found.contains("cannot be trusted"), "{name}: {found}");
    }

    // (c) The database replaced by an older copy, the checkpoint left alone.
    let s = root.path().join("old-db");
    copy_state(&base, &s);
    for file in ["ostiary.db", "ostiary.db-wal", "ostiary.db-shm"] {
        let _ = std::fs::remove_file(s.join(file));
        if older.join(file).exists() {
            std::fs::copy(older.join(file), s.join(file)).unwrap();
        }
    }
    let found = last_seq(&s);
    assert!(found < last);
    let error = start_error(&s).await.expect("refused");
    assert!(
        error.contains(&format!("ends at record {found}"))
            && error.contains(&format!("names record {last}")),
        "{error}"
    );
    assert!(
        problems(&s).contains("newest records deleted"),
        "{}",
        problems(&s)
    );

    // (d) An older genuine checkpoint with the chain intact is what a crash between a
    // commit and its checkpoint leaves: accepted, and caught up.
    let s = root.path().join("old-head");
    copy_state(&base, &s);
    std::fs::copy(older.join("audit.head"), s.join("audit.head")).unwrap();
    assert!(
        verify_in_process(&s).ok(),
        "records are all there: {}",
        problems(&s)
    );
    assert_eq!(start_error(&s).await, None, "accepted");
    let caught_up = std::fs::read_to_string(s.join("audit.head")).unwrap();
    assert!(caught_up.starts_with(&format!("{last} ")), "{caught_up}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_deleted_while_running_stop_forwarding_and_the_next_start() {
    let Live {
        proxy,
        plain,
        state,
        auth,
        url,
        mut tally,
        _root,
    } = live("agent", 3).await;
    let expected = last_seq(&state);
    delete_after(&state, expected - 2);

    let window = until_refused(&proxy, &url, &auth, &mut tally).await;
    eprintln!("forwarded after the deletion: {window}");
    let body = wait_ready(&proxy, 503).await;
    assert!(
        body["components"]["audit"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("changed by another writer")),
        "{body}"
    );
    let seen = plain.seen().len();
    for _ in 0..3 {
        assert!(tally.saw(&absolute_get(&proxy, &url, &auth).await));
    }
    assert_eq!(plain.seen().len(), seen);
    proxy.stop().await;
    let error = start_error(&state)
        .await
        .expect("the next start is refused");
    assert!(
        error.contains(&format!("names record {expected}")),
        "{error}"
    );
}
