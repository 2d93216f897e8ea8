//! Ostiary's end-to-end test harness: test upstreams with their own CA ([`upstream`],
//! [`pki`]), real client programs ([`clients`]), a proxy started in-process on port 0
//! ([`proxy`]), and hand-driven wire clients for adversarial tests ([`raw`]).
#![forbid(unsafe_code)]

pub mod browser;
pub mod clients;
pub mod openbao;
pub mod pki;
pub mod proxy;
pub mod raw;
pub mod slack;
pub mod smtp;
pub mod upstream;
