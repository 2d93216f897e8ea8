//! The sandbox suite of `sandbox.rs` and `sandbox_limits.rs` under the `gvisor` level (the
//! built-in `gvisor` profile: the same arrangement run under gVisor's `runsc`), against a
//! real `ostiary serve`: the proxy is the only way out, the operator's secrets are out of
//! sight, nothing written survives, the command runs as its own uid under a seccomp filter,
//! limits end a run with their exit codes, nothing of a run remains, two runs share
//! nothing, the operator's signals reach the command (docs/sandbox.md). Without Debian's
//! `runsc` every test fails saying so: it never skips.

use crate::support::sandbox as rig;
use crate::support::sandbox_checks as checks;
use crate::support::sandbox_limit_checks as limit_checks;

/// The profile under test, once runsc is known to be there.
fn gvisor() -> &'static str {
    rig::require_runsc();
    "gvisor"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_and_python_requests_reach_the_upstream_through_the_proxy() {
    checks::clients_reach_the_upstream(gvisor()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_but_the_proxy_is_reachable_from_a_sandbox() {
    checks::nothing_but_the_proxy(gvisor()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_directory_and_the_operators_secrets_are_out_of_sight() {
    checks::secrets_out_of_sight(gvisor()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_written_in_a_sandbox_survives_it() {
    checks::writes_do_not_persist(gvisor()).await;
}

#[cfg(target_arch = "x86_64")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_runs_as_its_own_uid_and_seccomp_refuses_what_an_agent_never_needs() {
    checks::seccomp_refuses(gvisor()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_bombs_and_memory_hogs_are_stopped_with_their_exit_codes() {
    limit_checks::memory_and_processes(gvisor()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_time_and_wall_clock_limits_end_the_run() {
    limit_checks::cpu_and_wall_clock(gvisor()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profiles_limits_and_env_allowlist_apply() {
    limit_checks::limits_and_allowlist(gvisor()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_run_nothing_of_it_remains_and_its_session_is_torn_down() {
    limit_checks::nothing_remains(gvisor()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_share_nothing() {
    limit_checks::clean_slate(gvisor()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_signals_reach_the_command_and_the_teardown_still_runs() {
    limit_checks::signals_reach_the_command(gvisor()).await;
}
