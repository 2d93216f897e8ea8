//! `ostiary policy promote` (`POST /v1/policy/promote`): the shadow set becomes the enforced
//! one. Its files (`*.cedar`, `tools.toml`, `*.json`) are copied over the policy directory —
//! each written beside its target and renamed over it, files the shadow set does not have
//! removed — under the reloads' lock, so neither the directory watch nor a reload reads the
//! directory half-copied; then the set built from the directory is swapped in as a reload
//! swaps one: a request is decided wholly under the old set or wholly under the new.

use std::path::{Path, PathBuf};

/// Why a promotion did not happen (the enforced set is then as it was).
#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    #[error("no shadow set is configured ([policy] shadow_dir)")]
    NoShadow,
    #[error(
        "the enforced set is the embedded library (no policy directory to write): create \
         {0} first"
    )]
    Embedded(PathBuf),
    #[error("copying the shadow set into the policy directory: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Invalid(#[from] ostiary_policies::LoadError),
}

/// Whether `name` is a file a policy set is built from.
pub(crate) fn is_policy_input(name: &str) -> bool {
    name == "tools.toml" || name.ends_with(".cedar") || name.ends_with(".json")
}

/// The policy inputs directly in `dir`, by name.
fn inputs(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_policy_input(&name) && entry.path().is_file() {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// Make `live`'s policy inputs those of `shadow`: each copied beside its target and renamed
/// over it, then the ones `shadow` lacks removed.
pub(crate) fn copy_over(shadow: &Path, live: &Path) -> std::io::Result<()> {
    let wanted = inputs(shadow)?;
    for name in &wanted {
        let staged = live.join(format!(".{name}.promote"));
        std::fs::copy(shadow.join(name), &staged)?;
        std::fs::File::open(&staged)?.sync_all()?;
        std::fs::rename(&staged, live.join(name))?;
    }
    for name in inputs(live)? {
        if !wanted.contains(&name) {
            std::fs::remove_file(live.join(name))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_directory_ends_with_exactly_the_shadow_inputs() {
        let shadow = tempfile::tempdir().unwrap();
        let live = tempfile::tempdir().unwrap();
        std::fs::write(shadow.path().join("a.cedar"), "new a").unwrap();
        std::fs::write(shadow.path().join("tools.toml"), "new tools").unwrap();
        std::fs::write(shadow.path().join("notes.txt"), "not an input").unwrap();
        std::fs::write(live.path().join("a.cedar"), "old a").unwrap();
        std::fs::write(live.path().join("b.cedar"), "old b").unwrap();
        std::fs::write(live.path().join("README.md"), "kept").unwrap();
        copy_over(shadow.path(), live.path()).unwrap();
        let read = |n: &str| std::fs::read_to_string(live.path().join(n)).ok();
        assert_eq!(read("a.cedar").as_deref(), Some("new a"));
        assert_eq!(read("tools.toml").as_deref(), Some("new tools"));
        assert_eq!(read("b.cedar"), None, "an input the shadow set lacks goes");
        assert_eq!(
            read("README.md").as_deref(),
            Some("kept"),
            "other files stay"
        );
        assert_eq!(read("notes.txt"), None);
        assert_eq!(
            inputs(live.path()).unwrap(),
            ["a.cedar", "tools.toml"],
            "no staged file is left"
        );
    }
}
