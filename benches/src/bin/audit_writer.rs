//! What the audit writer's thread spends per record, measured off the request path: the
//! writer on SQLite in a fresh state directory, fed bursts of one allowed tool call's record
//! the way one client's requests feed it (a group of records, then a pause longer than the
//! group commit's linger, so that each burst is committed as one group and the head is
//! checkpointed on its own schedule), and the thread's CPU time read from the kernel's
//! per-thread accounting.
//!
//! `cargo run --profile profiling -p ostiary-benches --bin audit_writer -- [bursts] [records]`
//! (defaults 100 bursts of 160 records, ~one client's 20 ms group). Under
//! `valgrind --tool=callgrind --separate-threads=yes` the writer's own file (thread 2,
//! named `ostiary-audit`) counts its instructions, repeatably from run to run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ostiary::audit::{AuditGuard, AuditWriter, Limits};
use ostiary::metrics::Metrics;
use ostiary::state::{files, SecretString, StateDir};
use ostiary::store::sqlite;
use ostiary_benches::fill_tool_call_record;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let bursts: u32 = args.next().map_or(Ok(100), |a| a.parse())?;
    let records: u32 = args.next().map_or(Ok(160), |a| a.parse())?;
    let dir = tempfile::tempdir()?;
    let state = StateDir::open_with(dir.path(), Some(SecretString::new("bench".into())))?;
    let stores = sqlite::open(&state.path(files::DATABASE))?;
    let metrics = Arc::new(Metrics::default());
    let mut limits = Limits::default();
    if let Ok(ms) = std::env::var("AUDIT_BENCH_CHECKPOINT_MS") {
        limits.checkpoint_every = Duration::from_millis(ms.parse()?);
    }
    let (writer_thread, sink) = AuditWriter::start_with(
        stores.audit,
        state.audit_key.expose().as_bytes().to_vec(),
        state.path(files::AUDIT_HEAD),
        &metrics,
        limits,
        None,
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // The thread names itself once it runs, a moment after it is spawned.
    let deadline = Instant::now() + Duration::from_secs(2);
    let writer = loop {
        match task_named("ostiary-audit") {
            Ok(task) => break task,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Err(e) => return Err(e),
        }
    };
    let before = cpu_time(&writer)?;
    let started = Instant::now();
    for _ in 0..bursts {
        for _ in 0..records {
            let mut audit = AuditGuard::start(&sink, &metrics, &ostiary::ids::request_id(), "http");
            audit.update(fill_tool_call_record);
            audit.allow(200);
        }
        // Past the group commit's linger (20 ms): the burst is one group.
        std::thread::sleep(Duration::from_millis(30));
    }
    if !rt.block_on(sink.flush()) {
        bail!("the trail was not writable");
    }
    let spent = cpu_time(&writer)? - before;
    let (user, system) = user_and_system(&writer)?;
    let n = f64::from(bursts * records);
    println!(
        "audit writer: {bursts} groups of {records} records in {:.1} s; the writer's CPU {:.1} ms, \
         {:.2} µs per record (user {user} and system {system} ticks of 10 ms since its start)",
        started.elapsed().as_secs_f64(),
        spent.as_secs_f64() * 1e3,
        spent.as_secs_f64() * 1e6 / n
    );
    if rt.block_on(sink.close()) != 0 {
        bail!("records were left unwritten at close");
    }
    writer_thread.join();
    Ok(())
}

/// This process's thread named `name`: its directory under `/proc/self/task`.
fn task_named(name: &str) -> Result<PathBuf> {
    for task in std::fs::read_dir("/proc/self/task")? {
        let task = task?.path();
        if std::fs::read_to_string(task.join("comm"))?.trim() == name {
            return Ok(task);
        }
    }
    bail!("no thread named {name}")
}

/// The thread's CPU time so far (its `schedstat`, in nanoseconds).
fn cpu_time(task: &Path) -> Result<Duration> {
    let stat = std::fs::read_to_string(task.join("schedstat"))?;
    let ns: u64 = stat
        .split_whitespace()
        .next()
        .context("an empty schedstat")?
        .parse()?;
    Ok(Duration::from_nanos(ns))
}

/// The thread's user and system CPU time in clock ticks (`stat` fields 14 and 15).
fn user_and_system(task: &Path) -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string(task.join("stat"))?;
    // After the command's closing parenthesis: the state is field 3.
    let rest = stat
        .rsplit_once(')')
        .context("a stat line without a command")?
        .1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Ok((fields[11].parse()?, fields[12].parse()?))
}
