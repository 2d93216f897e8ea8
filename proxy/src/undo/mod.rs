//! Undo for reversible actions (docs/undo.md): a catalog tool may declare the request that
//! reverses a call of it; [`journal`] records that request when a call succeeds, and
//! [`reverse`] sends a session's recorded undos, newest first, each decided by policy as
//! `Action::"tool:<name>.undo"`.

pub mod journal;
pub mod reverse;

pub use reverse::{Report, Reverser, UndoError};
