//! Holds the command line to its `--help`: every subcommand says what it does and every
//! argument what it means, and no note meant for the code reaches a user. clap turns a
//! `///` comment above an item into its help, so a missing one or an implementation note
//! written as `///` shows up here rather than in front of an operator.
//!
//! The sandbox's stages are hidden (`ostiary run --sandbox` execs them, nobody types
//! them) and skipped; so are clap's own `--help` and `--version`.

use clap::{Arg, Command, CommandFactory};

use crate::commands::Cli;

/// Words that belong to the code, not to a user's help (a `///` that should have been `//`).
const CODE_WORDS: &[&str] = &["clap", "panic", "struct", "enum", "`Option", "TODO"];

/// Every visible subcommand and argument, by path (`ostiary audit query --session`), with
/// the help text it would print (the long form when there is one).
fn walk(cmd: &Command, path: &str, out: &mut Vec<(String, Option<String>)>) {
    for arg in cmd.get_arguments().filter(|a| shown(a)) {
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(ToString::to_string);
        let name = match arg.get_long() {
            Some(long) => format!("--{long}"),
            None => format!("<{}>", arg.get_id()),
        };
        out.push((format!("{path} {name}"), help));
    }
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let sub_path = format!("{path} {}", sub.get_name());
        let about = sub
            .get_long_about()
            .or_else(|| sub.get_about())
            .map(ToString::to_string);
        out.push((sub_path.clone(), about));
        walk(sub, &sub_path, out);
    }
}

/// Arguments a user sees: not hidden, not clap's generated `--help` / `--version`.
fn shown(arg: &Arg) -> bool {
    !arg.is_hide_set() && !matches!(arg.get_id().as_str(), "help" | "version")
}

fn everything() -> Vec<(String, Option<String>)> {
    let mut cmd = Cli::command();
    // Global arguments are propagated to subcommands at build time, as at parse time.
    cmd.build();
    let mut out = Vec::new();
    walk(&cmd, "ostiary", &mut out);
    out
}

#[test]
fn every_subcommand_and_argument_has_help() {
    let missing: Vec<String> = everything()
        .into_iter()
        .filter(|(_, help)| help.as_deref().is_none_or(|h| h.trim().is_empty()))
        .map(|(path, _)| path)
        .collect();
    assert!(
        missing.is_empty(),
        "without help text (give each a `///` doc comment or `help = ...`):\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn no_implementation_note_reaches_the_help() {
    let leaks: Vec<String> = everything()
        .into_iter()
        .filter_map(|(path, help)| {
            let help = help?;
            let word = CODE_WORDS.iter().find(|w| help.contains(**w))?;
            Some(format!("{path}: {word:?} in {help:?}"))
        })
        .collect();
    assert!(
        leaks.is_empty(),
        "help text that reads like a note for the code (make it a `//` comment):\n  {}",
        leaks.join("\n  ")
    );
}

/// The walk itself must see the tree: a test that checks nothing would pass too.
#[test]
fn the_walk_reaches_nested_commands_and_skips_hidden_stages() {
    let paths: Vec<String> = everything().into_iter().map(|(p, _)| p).collect();
    for expected in [
        "ostiary run --agent",
        "ostiary audit query --session",
        "ostiary session show <id>",
        "ostiary approvals approve --as",
        "ostiary policy explain --tool",
    ] {
        assert!(paths.iter().any(|p| p == expected), "{expected} not walked");
    }
    assert!(
        !paths.iter().any(|p| p.contains("sandbox-")),
        "hidden stages are not a user's: {paths:#?}"
    );
}
