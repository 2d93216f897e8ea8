//! `ostiary run --sandbox` under the `namespaces` level (the built-in `default` profile)
//! against a real `ostiary serve`, tried as a hostile agent would (docs/sandbox.md): the
//! proxy is the only way out, the operator's secrets are not in view, nothing written
//! survives, the command runs as its own uid under a seccomp filter, and Cedar sees the
//! profile. Without `--sandbox`, `run` refuses where the command could read the state
//! directory. The checks themselves are in `support/sandbox_checks.rs` (`sandbox_gvisor.rs`
//! runs them under `gvisor`); limits, teardown and the clean slate: `sandbox_limits.rs`.

use crate::support::sandbox as rig;
use crate::support::sandbox_checks as checks;

use rig::{line_value, Rig};

const PROFILE: &str = "default";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_and_python_requests_reach_the_upstream_through_the_proxy() {
    checks::clients_reach_the_upstream(PROFILE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_but_the_proxy_is_reachable_from_a_sandbox() {
    checks::nothing_but_the_proxy(PROFILE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_directory_and_the_operators_secrets_are_out_of_sight() {
    checks::secrets_out_of_sight(PROFILE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_written_in_a_sandbox_survives_it() {
    checks::writes_do_not_persist(PROFILE).await;
}

#[cfg(target_arch = "x86_64")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_runs_as_its_own_uid_and_seccomp_refuses_what_an_agent_never_needs() {
    checks::seccomp_refuses(PROFILE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cedar_sees_the_profile_a_session_runs_under() {
    // Only sessions of the default profile may reach /echo.
    let policy = r#"
@id("sandboxed-only")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { context.path == "/echo" && context.session.profile == "default" };
"#;
    let rig = Rig::start(Some(policy), "[sandbox.profiles.other]\n").await;
    let url = rig.upstream.url("/echo");
    let script = format!("curl -q -sS -o /dev/null -w 'CODE=%{{http_code}}\\n' '{url}'");
    let sandboxed = rig.sandboxed("default", &script).await;
    assert!(sandboxed.success(), "{sandboxed}");
    assert_eq!(line_value(&sandboxed, "CODE"), "200", "{sandboxed}");
    let other = rig.sandboxed("other", &script).await;
    assert_eq!(line_value(&other, "CODE"), "403", "{other}");
    let unsandboxed = rig
        .run(
            &[
                "--unsafe-shared-uid",
                "--agent",
                "demo",
                "--",
                "sh",
                "-c",
                &script,
            ],
            &[],
        )
        .await;
    assert!(unsandboxed.success(), "{unsandboxed}");
    assert_eq!(line_value(&unsandboxed, "CODE"), "403", "{unsandboxed}");
    assert_eq!(rig.upstream.count("/echo"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_sandbox_run_refuses_when_the_state_directory_is_readable() {
    let rig = Rig::start(
        None,
        "[approvals]\nslack_webhook_env = \"TEAM_SLACK_HOOK\"\n",
    )
    .await;
    let server_dir = rig.server.dir.path().to_owned();
    let admin = rig.admin_token();
    // The state directory is the proxy's alone: `0700`, and every file in it `0600`.
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |m: std::fs::Metadata| m.permissions().mode() & 0o777;
        assert_eq!(mode(std::fs::metadata(&rig.server.state).unwrap()), 0o700);
        for entry in std::fs::read_dir(&rig.server.state).unwrap().flatten() {
            let meta = entry.metadata().unwrap();
            if meta.is_file() {
                assert_eq!(mode(meta), 0o600, "{}", entry.path().display());
            }
        }
    }
    let state = rig.server.state.display().to_string();
    let token_file = format!("{state}/admin.token");
    // The attack of issue 14: the agent reads the admin token. From the proxy's directory,
    // by absolute path, with the token given in the environment instead: refused each time,
    // and the command never runs.
    for (cwd, path, env) in [
        (&server_dir, "state/admin.token", vec![]),
        (&rig.work.path().to_owned(), token_file.as_str(), vec![]),
        (
            &server_dir,
            "state/admin.token",
            vec![("OSTIARY_ADMIN_TOKEN", admin.as_str())],
        ),
    ] {
        let out = rig
            .run_from(cwd, &["--agent", "demo", "--", "cat", path], &env)
            .await;
        assert_eq!(out.status, 125, "{out}");
        assert!(!out.stdout.contains(&admin), "{out}");
        assert!(out.stdout.is_empty(), "{out}");
        assert!(
            out.stderr.contains("--sandbox") && out.stderr.contains("--unsafe-shared-uid"),
            "{out}"
        );
    }
    // --unsafe-shared-uid runs it, with the secret variables cleared and the session's set.
    let env = [
        ("OSTIARY_ADMIN_TOKEN", admin.as_str()),
        ("VAULT_TOKEN", "canary-vault"),
        ("BAO_TOKEN", "canary-bao"),
        ("TEAM_SLACK_HOOK", "canary-slack"),
        ("PLAIN_VALUE", "kept"),
    ];
    let out = rig
        .run(
            &["--unsafe-shared-uid", "--agent", "demo", "--", "env"],
            &env,
        )
        .await;
    assert!(out.success(), "{out}");
    assert!(
        !out.stdout.contains("canary") && !out.stdout.contains(&admin),
        "{out}"
    );
    assert!(out.stdout.contains("PLAIN_VALUE=kept"), "{out}");
    assert!(out.stdout.contains("HTTPS_PROXY=http://agent:"), "{out}");
    // --sandbox and --unsafe-shared-uid say opposite things.
    let out = rig
        .run(
            &[
                "--sandbox",
                "--unsafe-shared-uid",
                "--agent",
                "demo",
                "--",
                "true",
            ],
            &[],
        )
        .await;
    assert_eq!(out.status, 2, "{out}");
    // The help says what is a boundary, and the exit codes.
    let help = rig.run(&["--help"], &[]).await;
    for needle in [
        "Only --sandbox is a boundary",
        "124",
        "125",
        "150",
        "151",
        "152",
    ] {
        assert!(help.stdout.contains(needle), "{needle}:\n{help}");
    }
}
