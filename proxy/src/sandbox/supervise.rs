//! The outer process's part of a run: start the stages, watch the limits and the wall
//! clock, pass the operator's signals in, end the run on a limit, and clean up what is on
//! the host (processes, cgroup, staging) whatever happened. The session's own teardown is
//! the caller's (it holds the control client).

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;

use super::enter::EnterArgs;
use super::limits::{Control, Tracked};
use super::spawn::{env_of, Pass, Spawn};
use super::view::Staging;
use super::{exit, teardown, Limit, Outcome, Plan, Runner, RunnerStatus, SandboxError};

/// The descriptor the runner writes its status to (the first after stdio).
const STATUS_FD: i32 = 3;

/// The descriptor the init stage says "started" on, once the sandbox is set up and the
/// command about to run: a runner that fails earlier exits with codes of its own, which
/// must not be taken for the command's.
const STARTED_FD: i32 = 4;

/// How often the limits and the runner's status are looked at.
const TICK: Duration = Duration::from_millis(50);

/// How long a command has to end after a signal the operator sent before it is killed.
const GRACE: Duration = Duration::from_secs(10);

/// Run `plan` with `runner` under `control`, and clean up after it (see the module doc).
pub async fn run(
    plan: &Plan,
    runner: &dyn Runner,
    control: &Control,
    staging: &Staging,
    binary: &Path,
) -> Outcome {
    let status_path = staging.path("status.json");
    let mut outcome = Outcome {
        exit: exit::SETUP,
        limit: None,
        limits_by: control.mechanism,
        started: false,
        cleaned: Vec::new(),
        failed: Vec::new(),
    };
    // A sandbox process whose parent dies (the init, when the runner is killed first) is
    // this process's to reap, not the host init's (which may never reap it).
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let mut tracked = Tracked {
        uid: (!plan.identity.user_ns).then_some(plan.identity.uid),
        ..Tracked::default()
    };
    match start(plan, runner, control, binary, &status_path) {
        Err(e) => eprintln!("ostiary: the sandbox could not be set up: {e}"),
        Ok((pid, started)) => {
            let started = tokio::task::spawn_blocking(move || said_started(started));
            let mut watched = watch(pid, plan, runner, control, &status_path, &mut tracked).await;
            // Every holder of the pipe is gone once the runner is: the read ends at once.
            watched.started = tokio::time::timeout(Duration::from_secs(5), started)
                .await
                .is_ok_and(|read| read.unwrap_or(false))
                || runner.started();
            outcome.started = watched.started;
            outcome.limit = watched.limit;
            outcome.exit = exit_code(&watched, runner);
        }
    }
    // `tracked` lives to the teardown's end: it holds the namespace's number for it.
    clean_up(control, runner, staging, &tracked, &mut outcome).await;
    outcome
}

/// Spawn the enter stage around the runner's command, with exactly the plan's environment
/// and no descriptor but stdio, the runner's status file and the init stage's "started"
/// pipe ([`super::spawn`]), in a process group of its own (the terminal's signals reach
/// `ostiary run`, which passes them on). Returns its pid and the pipe's read end.
fn start(
    plan: &Plan,
    runner: &dyn Runner,
    control: &Control,
    binary: &Path,
    status_path: &Path,
) -> Result<(Pid, OwnedFd), SandboxError> {
    let limits = control.command_limits(plan.identity.user_ns, runner.rlimits_inside());
    let init = plan.init_argv(limits, STARTED_FD);
    let inner = runner.command(plan, &init, STATUS_FD)?;
    let argv = EnterArgs {
        cgroups: control.cgroup_dirs(),
        // A sandbox with a kernel of its own sets them inside (its runner has them in the
        // plan).
        rlimits: if runner.rlimits_inside() {
            Vec::new()
        } else {
            control.rlimits()
        },
        command: inner,
    }
    .argv(binary);
    let (read, write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| SandboxError::Io {
            what: "making a pipe".into(),
            source: e.into(),
        })?;
    let spawn = Spawn {
        pass: vec![
            (STATUS_FD, Pass::WriteFile(status_path)),
            (STARTED_FD, Pass::Fd(write.as_fd())),
        ],
        own_group: true,
    };
    let pid = spawn
        .start(binary, &argv, &env_of(&plan.env.0))
        .map_err(|e| SandboxError::Plan(format!("starting the sandbox: {e}")))?;
    // Only the sandbox holds the write end now: end of file once it is gone.
    drop(write);
    Ok((pid, read))
}

/// Whether the init stage said "started" before the pipe closed.
fn said_started(pipe: OwnedFd) -> bool {
    let mut said = Vec::new();
    let _ = std::fs::File::from(pipe).take(64).read_to_end(&mut said);
    said.starts_with(super::init::STARTED)
}

/// How the watch ended.
#[derive(Debug)]
struct Watched {
    wait: Option<WaitStatus>,
    status: RunnerStatus,
    limit: Option<Limit>,
    started: bool,
}

/// Wait for the sandbox to end, ending it on a limit or after the grace time of a signal.
async fn watch(
    pid: Pid,
    plan: &Plan,
    runner: &dyn Runner,
    control: &Control,
    status_path: &Path,
    tracked: &mut Tracked,
) -> Watched {
    use tokio::signal::unix::{signal, SignalKind};
    let mut waiting = tokio::task::spawn_blocking(move || loop {
        match nix::sys::wait::waitpid(pid, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => return other.ok(),
        }
    });
    let deadline = tokio::time::Instant::now() + plan.wall_clock;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut signals = [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
    ]
    .map(|kind| signal(kind).ok());
    let mut status = RunnerStatus::default();
    let mut limit = None;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let read_status = |status: &mut RunnerStatus, tracked: &mut Tracked| {
        let written = std::fs::read_to_string(status_path).unwrap_or_default();
        *status = runner.status(&written);
        tracked.follow(status, pid.as_raw());
    };
    let wait = loop {
        let grace_over = async {
            match kill_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            waited = &mut waiting => break waited.ok().flatten(),
            _ = tokio::time::sleep_until(deadline), if limit.is_none() => {
                limit = Some(Limit::WallClock);
                end(pid, control, tracked);
            }
            _ = tick.tick() => {
                read_status(&mut status, tracked);
                if limit.is_none() {
                    if let Some(hit) = control.hit(tracked).or_else(|| runner.limit()) {
                        limit = Some(hit);
                        end(pid, control, tracked);
                    }
                }
            }
            _ = grace_over => {
                end(pid, control, tracked);
                kill_at = None;
            }
            kind = next_signal(&mut signals) => {
                // Looked at now, not at the last tick: a signal that comes before the tick
                // that first sees the sandbox's pid 1 would otherwise go to the runner
                // (bwrap), which dies of it instead of passing it on.
                read_status(&mut status, tracked);
                if !runner.signal(kind) {
                    // The sandbox's first process only through its pidfd; before one is
                    // taken, the runner (this process's child, whose pid stays its own).
                    match &tracked.init {
                        Some(init) => {
                            init.signal(kind);
                        }
                        None => {
                            let _ = nix::sys::signal::kill(pid, kind);
                        }
                    }
                }
                kill_at.get_or_insert(tokio::time::Instant::now() + GRACE);
            }
        }
    };
    read_status(&mut status, tracked);
    // A limit the kernel enforced between two looks (the OOM killer just before the end)
    // still names the end: the command died of it, or carried on past a refusal.
    if limit.is_none() {
        limit = control.hit(tracked).or_else(|| runner.limit());
    }
    if let Some(limit) = limit {
        eprintln!(
            "ostiary: the run was ended by its {} limit ({}); exit {}",
            limit.as_str().replace('_', "-"),
            describe(limit, plan),
            limit.exit_code()
        );
    }
    Watched {
        wait,
        status,
        limit,
        started: false,
    }
}

/// The first of the operator's signals to arrive.
async fn next_signal(signals: &mut [Option<tokio::signal::unix::Signal>; 3]) -> Signal {
    let [int, term, hup] = signals;
    tokio::select! {
        _ = recv(int) => Signal::SIGINT,
        _ = recv(term) => Signal::SIGTERM,
        _ = recv(hup) => Signal::SIGHUP,
    }
}

/// The next delivery of a signal that could be handled; never for one that could not.
async fn recv(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// What a limit was, for the message that says it ended the run.
fn describe(limit: Limit, plan: &Plan) -> String {
    match limit {
        Limit::Memory => format!("{} bytes", plan.limits.memory),
        Limit::Processes => format!("{} processes", plan.limits.processes),
        Limit::CpuTime => humantime::format_duration(plan.limits.cpu_time).to_string(),
        Limit::WallClock => humantime::format_duration(plan.wall_clock).to_string(),
    }
}

/// Kill the whole sandbox now: its init (whose end takes the pid namespace), the runner
/// process, and whatever the cgroup or the kernel still finds of the run.
fn end(pid: Pid, control: &Control, tracked: &Tracked) {
    if let Some(init) = &tracked.init {
        init.signal(Signal::SIGKILL);
    }
    let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    control.kill_all(tracked);
}

/// `ostiary run`'s exit code for how the sandbox ended.
fn exit_code(watched: &Watched, runner: &dyn Runner) -> u8 {
    if let Some(limit) = watched.limit {
        return limit.exit_code();
    }
    if !watched.started {
        // The runner gave up before the sandbox was set up (it said why on stderr).
        eprintln!(
            "ostiary: the sandbox could not be set up (the {} runner did not start it); the command did not run",
            runner.isolation().as_str()
        );
        return exit::SETUP;
    }
    if let Some(code) = watched.status.exit {
        return code.clamp(0, 255) as u8;
    }
    match watched.wait {
        Some(WaitStatus::Exited(_, code)) => code.clamp(0, 255) as u8,
        Some(WaitStatus::Signaled(_, signal, _)) => (128 + signal as i32).clamp(0, 255) as u8,
        _ => exit::SETUP,
    }
}

/// Every host-side clean-up step, each retried; what was done goes into `outcome`.
async fn clean_up(
    control: &Control,
    runner: &dyn Runner,
    staging: &Staging,
    tracked: &Tracked,
    outcome: &mut Outcome,
) {
    runner.finish();
    let processes = teardown::retry("processes", || async {
        control.kill_all(tracked);
        for pid in runner.remaining() {
            super::pin::signal_if(pid, Signal::SIGKILL, |pid| runner.holds(pid));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        reap_orphans();
        let mut left = control.remaining(tracked);
        left.extend(runner.remaining());
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("processes of the run are still alive: {left:?}"))
        }
    })
    .await;
    record(outcome, "processes", processes);
    if control.has_cgroup() {
        let removed = teardown::retry("cgroup", || async { control.remove() }).await;
        record(outcome, "cgroup", removed);
    }
    let removed = teardown::retry("staging", || async { staging.remove() }).await;
    record(outcome, "staging", removed);
}

/// Reap the sandbox's processes that became this process's children (see
/// `set_child_subreaper` above). Only after the runner itself was waited for: no other
/// child of this process is waited for by anyone else.
fn reap_orphans() {
    use nix::sys::wait::WaitPidFlag;
    while let Ok(status) = nix::sys::wait::waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if status == WaitStatus::StillAlive {
            break;
        }
    }
}

fn record(outcome: &mut Outcome, step: &'static str, result: Result<(), String>) {
    match result {
        Ok(()) => outcome.cleaned.push(step),
        Err(e) => outcome.failed.push(format!("{step}: {e}")),
    }
}
