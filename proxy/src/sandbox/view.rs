//! The filesystem a sandboxed command sees, as a list of mounts any runner can translate
//! ([`super::bwrap`] for the `namespaces` level).
//!
//! An empty root, then, parents before children: the profile's `read_only` host paths; a
//! fresh `/proc` and a minimal `/dev`; private writable tmpfs at `/tmp`, `HOME` and the
//! working directory; the sandbox's own plumbing under `/run/ostiary` (the `ostiary`
//! binary, the proxy's Unix socket, the CA, the host working directory to copy from). Then
//! every secret — the state
//! directory, the file backend's secrets, the profile's `hide` paths — is covered wherever a
//! read-only mount would show it: an empty unreadable directory over a directory, an empty
//! read-only file over a file (not `/dev/null`: a device on the view's `nodev` mounts cannot
//! be opened at all, and a hidden file reads as empty, as under every runner). Nothing writable is a host path, so nothing the command writes survives.

use std::path::{Component, Path, PathBuf};

use crate::config::sandbox::Workdir;
use crate::config::{Config, Profile};

use super::{inside, uid::Identity, SandboxError};

/// One mount of the view, in order: a later mount covers what an earlier one shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// A host path, seen read-only at `dst`.
    ReadOnly { src: PathBuf, dst: PathBuf },
    /// A private, empty, writable tmpfs with this mode.
    Tmpfs { dst: PathBuf, mode: u32 },
    /// A procfs of the sandbox's own pid namespace.
    Proc { dst: PathBuf },
    /// A minimal `/dev` (null, zero, full, random, urandom, tty, pts, shm).
    Dev { dst: PathBuf },
    /// A hidden directory: empty and unreadable.
    HideDir { dst: PathBuf },
    /// A hidden file: an empty read-only file (`src`, the run's [`Staging`] `empty`) over it.
    HideFile { src: PathBuf, dst: PathBuf },
}

impl Mount {
    pub fn dst(&self) -> &Path {
        match self {
            Mount::ReadOnly { dst, .. }
            | Mount::Tmpfs { dst, .. }
            | Mount::Proc { dst }
            | Mount::Dev { dst }
            | Mount::HideDir { dst }
            | Mount::HideFile { dst, .. } => dst,
        }
    }
}

/// The whole view and where the command starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    pub mounts: Vec<Mount>,
    pub chdir: PathBuf,
}

/// Host files made for one run and shown inside read-only (`/etc/passwd` and `/etc/group`
/// naming the run's user, the CA, the empty file over hidden files); removed at teardown.
#[derive(Debug)]
pub struct Staging {
    pub dir: PathBuf,
}

impl Staging {
    /// A new directory, `0700`, for run `run_id`.
    pub fn create(
        run_id: &str,
        identity: &Identity,
        home: &Path,
        ca_pem: &str,
    ) -> Result<Self, SandboxError> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let dir = std::env::temp_dir().join(format!("ostiary-run-{run_id}"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(SandboxError::io(format!("creating {}", dir.display())))?;
        let staging = Staging { dir };
        let (uid, gid, user) = (identity.uid, identity.gid, inside::USER);
        let files = [
            (
                "passwd",
                format!(
                    "root:x:0:0:root:/root:/bin/sh\n{user}:x:{uid}:{gid}:{user}:{}:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
                    home.display()
                ),
            ),
            (
                "group",
                format!("root:x:0:\n{user}:x:{gid}:\nnogroup:x:65534:\n"),
            ),
            ("ca.pem", ca_pem.to_owned()),
            (EMPTY, String::new()),
        ];
        for (name, text) in files {
            let path = staging.dir.join(name);
            std::fs::write(&path, text)
                .and_then(|()| {
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
                })
                .map_err(SandboxError::io(format!("writing {}", path.display())))?;
        }
        Ok(staging)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Remove the directory and what it holds.
    pub fn remove(&self) -> Result<(), String> {
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("removing {}: {e}", self.dir.display())),
        }
    }
}

/// The name of the empty file in a [`Staging`] directory that covers hidden files.
pub const EMPTY: &str = "empty";

/// What the view is made of.
#[derive(Debug)]
pub struct ViewSpec<'a> {
    pub profile: &'a Profile,
    /// The host working directory (absolute).
    pub cwd: &'a Path,
    pub home: &'a Path,
    pub staging: &'a Staging,
    /// The `ostiary` binary on the host.
    pub binary: &'a Path,
    /// The proxy's Unix socket on the host.
    pub socket: &'a Path,
    /// Host paths never visible (absolute).
    pub hidden: Vec<PathBuf>,
}

/// The host paths no sandbox may see: the state directory, the shared keys
/// (`state.keys_dir`), the file backend's secrets, and the profile's `hide` paths; relative
/// ones are taken from `cwd`, as the config is.
pub fn secret_paths(config: &Config, profile: &Profile, cwd: &Path) -> Vec<PathBuf> {
    [&config.state.dir, &config.broker.file]
        .into_iter()
        .chain(&config.state.keys_dir)
        .chain(&profile.hide)
        .map(|p| absolute(cwd, p))
        .collect()
}

fn absolute(cwd: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_owned()
    } else {
        cwd.join(path)
    }
}

/// The view of [`ViewSpec`] (see the module doc).
pub fn build(spec: &ViewSpec<'_>) -> Result<View, SandboxError> {
    let plumbing = Path::new(inside::DIR);
    for path in &spec.profile.read_only {
        if path == Path::new("/") || plumbing.starts_with(path) {
            return Err(SandboxError::Plan(format!(
                "read_only path {} would cover {}, where the sandbox keeps its own plumbing; name the directories under it instead",
                path.display(),
                inside::DIR
            )));
        }
    }
    if spec.cwd == Path::new("/") || !spec.cwd.is_absolute() {
        return Err(SandboxError::Plan(format!(
            "the working directory {} cannot be a sandbox's (run from a project directory)",
            spec.cwd.display()
        )));
    }
    if spec.cwd.starts_with(plumbing) {
        return Err(SandboxError::Plan(format!(
            "the working directory {} is under {}",
            spec.cwd.display(),
            inside::DIR
        )));
    }
    let mut mounts = Vec::new();
    for path in &spec.profile.read_only {
        if path.exists() {
            mounts.push(Mount::ReadOnly {
                src: path.clone(),
                dst: path.clone(),
            });
        }
    }
    for name in ["passwd", "group"] {
        mounts.push(Mount::ReadOnly {
            src: spec.staging.path(name),
            dst: Path::new("/etc").join(name),
        });
    }
    mounts.push(Mount::Proc {
        dst: "/proc".into(),
    });
    mounts.push(Mount::Dev { dst: "/dev".into() });
    mounts.push(Mount::Tmpfs {
        dst: "/tmp".into(),
        mode: 0o1777,
    });
    mounts.push(Mount::Tmpfs {
        dst: spec.home.to_owned(),
        mode: 0o700,
    });
    if spec.cwd != spec.home {
        mounts.push(Mount::Tmpfs {
            dst: spec.cwd.to_owned(),
            mode: 0o700,
        });
    }
    mounts.push(Mount::Tmpfs {
        dst: plumbing.to_owned(),
        mode: 0o755,
    });
    mounts.push(Mount::ReadOnly {
        src: spec.binary.to_owned(),
        dst: inside::BINARY.into(),
    });
    mounts.push(Mount::ReadOnly {
        src: spec.socket.to_owned(),
        dst: inside::SOCKET.into(),
    });
    mounts.push(Mount::ReadOnly {
        src: spec.staging.path("ca.pem"),
        dst: inside::CA.into(),
    });
    if spec.profile.workdir == Workdir::Copy {
        mounts.push(Mount::ReadOnly {
            src: spec.cwd.to_owned(),
            dst: inside::WORKDIR_SOURCE.into(),
        });
    }
    // Parents before children, so that each mount shows on top of the ones above it: a
    // read-only path under `/tmp` or `HOME` stays visible, a working directory under a
    // read-only path is still private. At the same path, the later (the private tmpfs
    // over a read-only path) wins.
    mounts.sort_by_key(|m| m.dst().components().count());
    // A mount that a later one covers at its own path shows nothing: it is not made at all
    // (runners differ on two mounts at one path: gVisor's shows the first).
    let covered: Vec<bool> = (0..mounts.len())
        .map(|i| mounts[i + 1..].iter().any(|m| m.dst() == mounts[i].dst()))
        .collect();
    let mut covered = covered.into_iter();
    mounts.retain(|_| !covered.next().unwrap_or(false));
    let hides = hides(&mounts, &spec.hidden, &spec.staging.path(EMPTY));
    mounts.extend(hides);
    Ok(View {
        mounts,
        chdir: spec.cwd.to_owned(),
    })
}

/// The mounts that cover each hidden path wherever a read-only mount shows it and no later
/// mount already covers it. Paths are compared resolved (a read-only `/lib` that is a link
/// to `/usr/lib` shows what is under `/usr/lib`), and a hidden path that does not exist
/// needs nothing.
fn hides(mounts: &[Mount], hidden: &[PathBuf], empty: &Path) -> Vec<Mount> {
    let mut out = Vec::new();
    for secret in hidden {
        let Ok(real) = secret.canonicalize() else {
            continue;
        };
        let is_dir = real.is_dir();
        for (i, mount) in mounts.iter().enumerate() {
            let Mount::ReadOnly { src, dst } = mount else {
                continue;
            };
            let Ok(src) = src.canonicalize() else {
                continue;
            };
            let Ok(rel) = real.strip_prefix(&src) else {
                continue;
            };
            let at = join_inside(dst, rel);
            let covered = mounts[i + 1..].iter().any(|m| at.starts_with(m.dst()));
            if covered || out.iter().any(|m: &Mount| m.dst() == at) {
                continue;
            }
            out.push(if is_dir {
                Mount::HideDir { dst: at }
            } else {
                Mount::HideFile {
                    src: empty.to_owned(),
                    dst: at,
                }
            });
        }
    }
    out
}

/// `dst` joined with a relative path of normal components only.
fn join_inside(dst: &Path, rel: &Path) -> PathBuf {
    let mut at = dst.to_owned();
    for part in rel.components() {
        if let Component::Normal(name) = part {
            at.push(name);
        }
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_in<'a>(
        dir: &'a Path,
        profile: &'a Profile,
        staging: &'a Staging,
        hidden: Vec<PathBuf>,
    ) -> ViewSpec<'a> {
        ViewSpec {
            profile,
            cwd: dir,
            home: Path::new(inside::HOME),
            staging,
            binary: Path::new("/usr/bin/true"),
            socket: Path::new("/tmp/proxy.sock"),
            hidden,
        }
    }

    #[test]
    fn secrets_are_covered_wherever_a_read_only_mount_shows_them() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let project = root.join("project");
        let state = project.join(".ostiary");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(root.join("secrets.toml"), "a = \"b\"").unwrap();
        let profile = Profile {
            read_only: vec!["/usr".into(), root.clone()],
            ..Profile::default()
        };
        let staging = Staging {
            dir: root.join("staging"),
        };
        let hidden = vec![
            state.clone(),
            root.join("secrets.toml"),
            root.join("absent"),
        ];
        let view = build(&spec_in(&project, &profile, &staging, hidden)).unwrap();
        let hidden: Vec<&Mount> = view
            .mounts
            .iter()
            .filter(|m| matches!(m, Mount::HideDir { .. } | Mount::HideFile { .. }))
            .collect();
        assert_eq!(
            hidden,
            [
                // The state directory under the copy's source; at its own path the
                // working directory's tmpfs already covers it.
                &Mount::HideDir {
                    dst: Path::new(inside::WORKDIR_SOURCE).join(".ostiary")
                },
                &Mount::HideFile {
                    src: root.join("staging").join(EMPTY),
                    dst: root.join("secrets.toml")
                },
            ],
            "{view:#?}"
        );
        assert_eq!(view.chdir, project);
        // The hides come last, after every mount that could show what they cover.
        let first_hide = view
            .mounts
            .iter()
            .position(|m| matches!(m, Mount::HideDir { .. }))
            .unwrap();
        assert!(view.mounts[first_hide..]
            .iter()
            .all(|m| matches!(m, Mount::HideDir { .. } | Mount::HideFile { .. })));
    }

    #[test]
    fn a_read_only_path_the_private_working_directory_covers_is_not_mounted() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().canonicalize().unwrap();
        let profile = Profile {
            read_only: vec!["/usr".into(), project.clone()],
            ..Profile::default()
        };
        let staging = Staging {
            dir: project.join("s"),
        };
        let view = build(&spec_in(&project, &profile, &staging, vec![])).unwrap();
        let at: Vec<&Mount> = view.mounts.iter().filter(|m| m.dst() == project).collect();
        assert_eq!(
            at,
            [&Mount::Tmpfs {
                dst: project.clone(),
                mode: 0o700
            }],
            "{view:#?}"
        );
        // The copy's source is still the host directory.
        assert!(view.mounts.contains(&Mount::ReadOnly {
            src: project.clone(),
            dst: inside::WORKDIR_SOURCE.into()
        }));
    }

    #[test]
    fn an_empty_workdir_is_not_bound_and_views_that_cannot_work_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let staging = Staging {
            dir: dir.path().join("s"),
        };
        let profile = Profile {
            workdir: Workdir::Empty,
            ..Profile::default()
        };
        let view = build(&spec_in(dir.path(), &profile, &staging, vec![])).unwrap();
        assert!(!view
            .mounts
            .iter()
            .any(|m| m.dst() == Path::new(inside::WORKDIR_SOURCE)));
        for read_only in ["/", "/run"] {
            let profile = Profile {
                read_only: vec![read_only.into()],
                ..Profile::default()
            };
            let e = build(&spec_in(dir.path(), &profile, &staging, vec![])).unwrap_err();
            assert!(e.to_string().contains("plumbing"), "{e}");
        }
        let profile = Profile::default();
        let e = build(&spec_in(Path::new("/"), &profile, &staging, vec![])).unwrap_err();
        assert!(e.to_string().contains("project directory"), "{e}");
    }
}
