//! [`DlpBody`]: a request body scanned on its way to the upstream, stopped at the first
//! secret.
//!
//! Released bytes are forwarded as they come; bytes that could still be part of a secret
//! wait (see [`super::stream`]). On a finding the body ends with an error frame, so hyper
//! aborts the upstream request: the upstream sees an incomplete body, never the secret.
//! The finding goes into a slot the caller holds, because the error that reaches the caller
//! through hyper is an opaque send error — the slot says what happened (as the
//! placeholder guard of `inject::body_guard` does).

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use super::{Detectors, Finding, StreamScanner};
use crate::body::filter::{ChunkFilter, Filtered, Length};
use crate::body::{BoxError, ProxyBody};

/// The error a [`DlpBody`] ends with. It names the kind and the offset, never the bytes.
#[derive(Debug, thiserror::Error)]
#[error("the body was stopped by the dlp check: it carries a {} at byte {}", .0.kind, .0.offset)]
pub struct Blocked(pub Finding);

/// A body scanned for secrets as it streams.
pub type DlpBody = Filtered<ProxyBody, DlpScan>;

/// The scan of a [`DlpBody`]: what it releases leaves as it came, what could still be part
/// of a secret waits.
#[derive(Debug)]
pub struct DlpScan {
    scanner: StreamScanner,
    slot: Arc<OnceLock<Finding>>,
}

impl DlpBody {
    /// Wrap `inner`; the slot is set once a secret is found. Returns the boxed body, as
    /// the request that carries it takes a [`ProxyBody`].
    #[allow(clippy::new_ret_no_self)]
    pub fn new(inner: ProxyBody, detectors: Arc<Detectors>) -> (ProxyBody, Arc<OnceLock<Finding>>) {
        let slot = Arc::new(OnceLock::new());
        let scan = DlpScan {
            scanner: StreamScanner::new(detectors),
            slot: slot.clone(),
        };
        let body = Filtered::wrap(inner, scan);
        (http_body_util::BodyExt::boxed(body), slot)
    }
}

impl DlpScan {
    /// `released`, or the finding that stops the body, noted in the slot.
    fn release(
        &mut self,
        released: Result<Bytes, Finding>,
        out: &mut VecDeque<Bytes>,
    ) -> Result<(), Blocked> {
        match released {
            Ok(bytes) => {
                out.push_back(bytes);
                Ok(())
            }
            Err(finding) => {
                let _ = self.slot.set(finding.clone());
                Err(Blocked(finding))
            }
        }
    }
}

impl ChunkFilter for DlpScan {
    type Error = Blocked;

    fn feed(&mut self, chunk: Bytes, out: &mut VecDeque<Bytes>) -> Result<(), Blocked> {
        let released = self.scanner.push(chunk);
        self.release(released, out)
    }

    fn finish(&mut self, out: &mut VecDeque<Bytes>) -> Result<(), Blocked> {
        let released = self.scanner.finish();
        self.release(released, out)
    }

    fn failed(&mut self, error: BoxError) -> BoxError {
        // Held bytes of a failed body are not forwarded after its error.
        self.scanner.discard();
        error
    }

    fn length(&self) -> Length {
        // A clean body comes out as it went in: the source's remainder plus what is held.
        Length::Delayed {
            held: self.scanner.held() as u64,
        }
    }
}
