//! Ostiary's end-to-end test harness: the real components a test drives, each started for
//! one test and stopped when it ends. The tests themselves are in `tests/tests/`.
//!
//! # Layout
//! - [`proxy`] — an Ostiary proxy started in-process on port 0, with its own state and policies.
//! - [`upstream`] — a real HTTPS (or plain HTTP) upstream that remembers what reached it.
//! - [`pki`] — a throwaway certificate authority for the test upstreams.
//! - [`clients`] — real client programs (curl, Python `requests`/`httpx`/`websockets`).
//! - [`raw`] — hand-driven wire clients for adversarial tests, and the checks of a refusal.
//! - [`openbao`] — a real OpenBao dev server and the setup of the engines the broker uses.
//! - [`smtp`] — a real SMTP server that keeps every mail it accepts.
//! - [`slack`] — a stand-in Slack incoming webhook, and signed interactive callbacks.
//! - [`browser`] — headless Chromium driven by Playwright on the approval page.
#![forbid(unsafe_code)]

pub mod browser;
pub mod clients;
pub mod lenient;
pub mod openbao;
pub mod pki;
pub mod proxy;
pub mod raw;
pub mod slack;
pub mod smtp;
pub mod upstream;
