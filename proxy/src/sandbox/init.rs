//! `ostiary sandbox-init` (hidden): pid 1 inside the sandbox.
//!
//! It hands the private `HOME` and working directory to the run's uid, copies the host
//! working directory into the private one (all or nothing, within `workdir_copy_max`),
//! listens on `127.0.0.1:<listen.proxy's port>` — the proxy URL the command was given — and
//! carries every connection byte for byte to the proxy's Unix socket (the
//! `Proxy-Authorization` travels inside; the proxy authenticates as always). Then it runs
//! the exec stage, passes it `SIGTERM`/`SIGINT`/`SIGHUP`, reaps the orphans every pid 1
//! inherits, and exits with the exec stage's status (128 + signal for a signal). When it
//! exits, the kernel kills every other process of the pid namespace: nothing the command
//! left running survives the run.

use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::exit;
use super::spawn::{own_env, Spawn};

/// What the init stage writes on its "started" descriptor.
pub const STARTED: &[u8] = b"started\n";

/// The init stage's arguments. The command line's parser is the binary's (`ostiary-cli`),
/// which parses what [`InitArgs::argv`] writes back into this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitArgs {
    /// A descriptor to write "started" on once everything is ready, right before the
    /// exec stage starts.
    pub started_fd: Option<i32>,
    /// A file to write "started" in instead (a runner that passes a sandbox no descriptor
    /// but stdio: gvisor). At most one of the two.
    pub started_file: Option<PathBuf>,
    /// The port the forwarder listens on (127.0.0.1).
    pub port: u16,
    /// The proxy's Unix socket.
    pub socket: PathBuf,
    /// The private working directory.
    pub workdir: PathBuf,
    /// The private HOME.
    pub home: PathBuf,
    /// `UID:GID` of the command, who gets the working directory and HOME.
    pub owner: String,
    /// Copy this directory into the working directory first (with `copy_max`).
    pub copy_from: Option<PathBuf>,
    /// The most bytes the copy may hold.
    pub copy_max: Option<u64>,
    /// The exec stage's command line.
    pub exec: Vec<OsString>,
}

impl InitArgs {
    /// The subcommand that runs this stage.
    pub const SUBCOMMAND: &'static str = "sandbox-init";

    /// `binary sandbox-init [--started-fd FD | --started-file PATH] --port .. --socket ..
    /// --workdir .. --home .. --owner UID:GID [--copy-from DIR] [--copy-max N] -- EXEC..`.
    pub fn argv(&self, binary: &Path) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec![binary.into(), Self::SUBCOMMAND.into()];
        if let Some(fd) = self.started_fd {
            argv.extend(["--started-fd".into(), fd.to_string().into()]);
        }
        if let Some(path) = &self.started_file {
            argv.extend(["--started-file".into(), path.into()]);
        }
        argv.extend([
            "--port".into(),
            self.port.to_string().into(),
            "--socket".into(),
            self.socket.clone().into(),
            "--workdir".into(),
            self.workdir.clone().into(),
            "--home".into(),
            self.home.clone().into(),
            "--owner".into(),
            self.owner.clone().into(),
        ]);
        if let Some(from) = &self.copy_from {
            argv.extend(["--copy-from".into(), from.into()]);
        }
        if let Some(max) = self.copy_max {
            argv.extend(["--copy-max".into(), max.to_string().into()]);
        }
        argv.push("--".into());
        argv.extend(self.exec.iter().cloned());
        argv
    }
}

/// Run the stage.
pub fn run(args: InitArgs) -> ExitCode {
    // Nothing of pid 1 (its memory, its descriptors) is the command's to read, even when
    // both share a uid inside a user namespace.
    let _ = nix::sys::prctl::set_dumpable(false);
    if let Err(message) = prepare(&args) {
        eprintln!("ostiary: the sandbox could not be set up: {message}");
        return ExitCode::from(exit::SETUP);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ostiary: the sandbox could not be set up: {e}");
            return ExitCode::from(exit::SETUP);
        }
    };
    match runtime.block_on(supervise(&args)) {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            eprintln!("ostiary: the sandbox could not be set up: {message}");
            ExitCode::from(exit::SETUP)
        }
    }
}

fn owner(text: &str) -> Result<(u32, u32), String> {
    let bad = || format!("--owner {text:?} is not UID:GID");
    let (uid, gid) = text.split_once(':').ok_or_else(bad)?;
    Ok((
        uid.parse().map_err(|_| bad())?,
        gid.parse().map_err(|_| bad())?,
    ))
}

/// Hand the private directories to the command's uid, and fill the working directory.
fn prepare(args: &InitArgs) -> Result<(), String> {
    let (uid, gid) = owner(&args.owner)?;
    let chown = nix::unistd::getuid().as_raw() != uid;
    let workdir_dev = std::fs::metadata(&args.workdir)
        .map_err(|e| format!("{}: {e}", args.workdir.display()))?
        .dev();
    if let (Some(from), Some(max)) = (&args.copy_from, args.copy_max) {
        let mut total = 0;
        let from_dev = std::fs::metadata(from)
            .map_err(|e| format!("{}: {e}", from.display()))?
            .dev();
        measure(from, from_dev, max, &mut total)?;
        let copy = Copy {
            from_dev,
            to_dev: workdir_dev,
            owner: chown.then_some((uid, gid)),
        };
        copy.tree(from, &args.workdir)?;
    }
    for dir in [&args.home, &args.workdir] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        if chown {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .map_err(|e| format!("handing {} to uid {uid}: {e}", dir.display()))?;
        }
    }
    Ok(())
}

/// Adds up the bytes of the regular files under `dir` on its own file system, failing as
/// soon as they exceed `max`: a copy happens whole or not at all.
fn measure(dir: &Path, dev: u64, max: u64, total: &mut u64) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("reading {}: {e}", dir.display()))?;
        let meta = entry
            .metadata()
            .map_err(|e| format!("{}: {e}", entry.path().display()))?;
        if meta.dev() != dev {
            continue;
        }
        if meta.is_dir() {
            measure(&entry.path(), dev, max, total)?;
        } else if meta.is_file() {
            *total = total.saturating_add(meta.len());
        }
        if *total > max {
            return Err(format!(
                "the working directory holds more than workdir_copy_max ({max} bytes) to copy; raise the profile's workdir_copy_max, use workdir = \"empty\", or run from a smaller directory"
            ));
        }
    }
    Ok(())
}

/// A copy of a directory tree into the private working directory.
struct Copy {
    /// The file system copied from: a mount inside it (a hidden path) is not copied.
    from_dev: u64,
    /// The working directory's file system: something already mounted over a path of the
    /// copy (a deeper read-only path) is left as it is.
    to_dev: u64,
    /// Who gets the copy (none: it is the copier's already).
    owner: Option<(u32, u32)>,
}

impl Copy {
    fn tree(&self, from: &Path, to: &Path) -> Result<(), String> {
        let entries =
            std::fs::read_dir(from).map_err(|e| format!("reading {}: {e}", from.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("reading {}: {e}", from.display()))?;
            let (src, dst) = (entry.path(), to.join(entry.file_name()));
            let meta =
                std::fs::symlink_metadata(&src).map_err(|e| format!("{}: {e}", src.display()))?;
            if meta.dev() != self.from_dev {
                continue;
            }
            if std::fs::symlink_metadata(&dst).is_ok_and(|d| d.dev() != self.to_dev) {
                continue;
            }
            let kind = meta.file_type();
            if kind.is_dir() {
                std::fs::create_dir(&dst).map_err(|e| format!("{}: {e}", dst.display()))?;
                self.tree(&src, &dst)?;
                self.finish(&dst, meta.mode())?;
            } else if kind.is_file() {
                std::fs::copy(&src, &dst).map_err(|e| format!("copying {}: {e}", src.display()))?;
                self.finish(&dst, meta.mode())?;
            } else if kind.is_symlink() {
                let target =
                    std::fs::read_link(&src).map_err(|e| format!("{}: {e}", src.display()))?;
                std::os::unix::fs::symlink(&target, &dst)
                    .map_err(|e| format!("{}: {e}", dst.display()))?;
                if let Some((uid, gid)) = self.owner {
                    std::os::unix::fs::lchown(&dst, Some(uid), Some(gid))
                        .map_err(|e| format!("{}: {e}", dst.display()))?;
                }
            }
            // Sockets, fifos and devices are not copied.
        }
        Ok(())
    }

    /// The copy's mode (without set-uid/set-gid: nothing in the sandbox gains privileges)
    /// and owner, set once its contents are in.
    fn finish(&self, path: &Path, mode: u32) -> Result<(), String> {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o1777))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(())
    }
}

/// Forward, run the exec stage, reap, pass signals; the exec stage's exit status.
async fn supervise(args: &InitArgs) -> Result<u8, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
        .await
        .map_err(|e| format!("listening on 127.0.0.1:{}: {e}", args.port))?;
    let sig = |kind| signal(kind).map_err(|e| format!("handling signals: {e}"));
    // Registered before the child exists, so that its exit is never missed.
    let mut children = sig(SignalKind::child())?;
    let mut terminate = sig(SignalKind::terminate())?;
    let mut interrupt = sig(SignalKind::interrupt())?;
    let mut hangup = sig(SignalKind::hangup())?;
    let program = args.exec.first().ok_or("no exec stage")?;
    if let Some(fd) = args.started_fd {
        say_started(fd)?;
    }
    if let Some(path) = &args.started_file {
        std::fs::write(path, STARTED)
            .map_err(|e| format!("saying started in {}: {e}", path.display()))?;
    }
    // Started with no descriptor but stdio: not the "started" one, not one a runner let
    // through.
    let pid = Spawn::default()
        .start(Path::new(program), &args.exec, &own_env())
        .map_err(|e| format!("starting {}: {e}", program.to_string_lossy()))?;
    tokio::spawn(forward(listener, args.socket.clone()));
    let pass = |signal| {
        let _ = nix::sys::signal::kill(pid, signal);
    };
    loop {
        tokio::select! {
            _ = children.recv() => {
                if let Some(code) = reap(pid) {
                    return Ok(code);
                }
            }
            _ = terminate.recv() => pass(Signal::SIGTERM),
            _ = interrupt.recv() => pass(Signal::SIGINT),
            _ = hangup.recv() => pass(Signal::SIGHUP),
        }
    }
}

/// "started" on descriptor `fd`, through a fresh open of it (the descriptor itself stays
/// open until this process ends; no child gets it).
fn say_started(fd: i32) -> Result<(), String> {
    use std::io::Write;
    let path = format!("/proc/self/fd/{fd}");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|mut f| f.write_all(STARTED))
        .map_err(|e| format!("saying started on descriptor {fd}: {e}"))
}

/// Reap every child that has ended; the exit code of `pid` once it has.
fn reap(pid: Pid) -> Option<u8> {
    loop {
        match nix::sys::wait::waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(p, code)) if p == pid => return Some(code.clamp(0, 255) as u8),
            Ok(WaitStatus::Signaled(p, signal, _)) if p == pid => {
                // Said here, where it is known: outside, 128 + N could be the command's own
                // exit code, or this stage's.
                eprintln!("ostiary: the command was killed by {}", signal.as_str());
                return Some((128 + signal as i32).clamp(0, 255) as u8);
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return None,
            Ok(_) => continue,
        }
    }
}

/// Every connection to the listener, carried to the proxy's socket and back.
async fn forward(listener: tokio::net::TcpListener, socket: PathBuf) {
    loop {
        let Ok((mut tcp, _)) = listener.accept().await else {
            continue;
        };
        let socket = socket.clone();
        tokio::spawn(async move {
            match tokio::net::UnixStream::connect(&socket).await {
                Ok(mut proxy) => {
                    let _ = tokio::io::copy_bidirectional(&mut tcp, &mut proxy).await;
                }
                Err(e) => eprintln!(
                    "ostiary: the proxy is unreachable at {}: {e}",
                    socket.display()
                ),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_whole_within_its_bound_and_keeps_no_set_uid_bit() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("from"), dir.path().join("to"));
        std::fs::create_dir_all(from.join("sub")).unwrap();
        std::fs::create_dir(&to).unwrap();
        std::fs::write(from.join("a.txt"), "hello").unwrap();
        std::fs::write(from.join("sub/b.bin"), vec![0u8; 100]).unwrap();
        std::fs::set_permissions(from.join("a.txt"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();
        std::os::unix::fs::symlink("a.txt", from.join("link")).unwrap();
        let dev = std::fs::metadata(&from).unwrap().dev();
        let mut total = 0;
        let e = measure(&from, dev, 104, &mut total).unwrap_err();
        assert!(e.contains("workdir_copy_max"), "{e}");
        let mut total = 0;
        measure(&from, dev, 105, &mut total).unwrap();
        assert_eq!(total, 105);
        let copy = Copy {
            from_dev: dev,
            to_dev: std::fs::metadata(&to).unwrap().dev(),
            owner: None,
        };
        copy.tree(&from, &to).unwrap();
        assert_eq!(std::fs::read_to_string(to.join("a.txt")).unwrap(), "hello");
        assert_eq!(std::fs::read(to.join("sub/b.bin")).unwrap().len(), 100);
        assert_eq!(
            std::fs::read_link(to.join("link")).unwrap(),
            Path::new("a.txt")
        );
        let mode = std::fs::metadata(to.join("a.txt")).unwrap().mode();
        assert_eq!(mode & 0o7777, 0o755);
    }

    #[test]
    fn owners_parse() {
        assert_eq!(owner("5:6").unwrap(), (5, 6));
        assert!(owner("5").is_err());
        assert!(owner("a:b").is_err());
    }
}
