//! Rigs and helpers the end-to-end tests share: each file is one concern (a proxy driven through
//! the CLI, the approval rig, a fleet of replicas, the sandbox's runs, ...). Not every test uses
//! every helper.
#![allow(dead_code)]

pub mod approvals;
pub mod audit_trail;
pub mod channels;
pub mod cli;
pub mod credentials;
pub mod egress;
pub mod fleet;
pub mod guardrails;
pub mod mcp;
pub mod postgres;
pub mod runs;
pub mod sandbox;
pub mod sandbox_checks;
pub mod sandbox_limit_checks;
pub mod sdk;
