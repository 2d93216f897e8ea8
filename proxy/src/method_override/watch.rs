//! The watch over a body that streams to its upstream unread by anything else (untyped,
//! multipart): its form keys and part names are read as they pass, and each chunk leaves
//! once read — an upstream that answers a streamed body as it arrives keeps doing so. What
//! waits is the body's *end*, the moment an upstream takes it as whole: with a declared
//! `Content-Length`, the chunk that completes it leaves only once the readers have read to
//! the end; without one, the end (chunked's last chunk, HTTP/2's `END_STREAM`) is sent only
//! after they have. So an upstream has a whole body only once nothing in it names an
//! override. On a finding the body ends with an error, hyper aborts the upstream request
//! (the upstream sees a body cut short, never a complete one), and the finding goes into a
//! slot `forward` reads: the error hyper returns is opaque.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use super::form::FormKeys;
use super::parts::PartNames;
use super::{Finding, Place, Reader};
use crate::body::filter::{ChunkFilter, Filtered, Length};
use crate::body::ProxyBody;

/// The error a watched body ends with.
#[derive(Debug, thiserror::Error)]
#[error("the body was stopped: {0} names `_method`")]
pub(crate) struct Stopped(Place);

/// `body` (of `declared` bytes, if its length was declared), watched as a form (`form`:
/// it has no media type) and as parts (`multipart`).
pub(super) fn watched(
    body: ProxyBody,
    declared: Option<u64>,
    form: bool,
    multipart: bool,
) -> (ProxyBody, Finding) {
    let slot = Arc::new(OnceLock::new());
    let mut readers: Vec<(Place, Box<dyn Reader + Send + Sync>)> = Vec::new();
    if form {
        readers.push(("the body", Box::<FormKeys>::default()));
    }
    if multipart {
        readers.push(("a part of the multipart body", Box::<PartNames>::default()));
    }
    let watch = Watch {
        readers,
        left: declared,
        slot: slot.clone(),
    };
    let body = Filtered::wrap(body, watch);
    (http_body_util::BodyExt::boxed(body), slot)
}

/// The readers over one body.
struct Watch {
    readers: Vec<(Place, Box<dyn Reader + Send + Sync>)>,
    /// Bytes of the declared length not read yet (`None`: no length was declared).
    left: Option<u64>,
    slot: Finding,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field(
                "readers",
                &self
                    .readers
                    .iter()
                    .map(|(place, _)| place)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// The place a reader found an override in, after reading `chunk` (`None`: the end).
    fn finding(&mut self, chunk: Option<&[u8]>) -> Option<Place> {
        self.readers.iter_mut().find_map(|(place, reader)| {
            let found = match chunk {
                Some(chunk) => reader.push(chunk),
                None => reader.finish(),
            };
            found.then_some(*place)
        })
    }

    fn stop(&mut self, place: Place) -> Stopped {
        let _ = self.slot.set(place);
        Stopped(place)
    }
}

impl ChunkFilter for Watch {
    type Error = Stopped;

    fn feed(&mut self, chunk: Bytes, out: &mut VecDeque<Bytes>) -> Result<(), Stopped> {
        if let Some(place) = self.finding(Some(&chunk)) {
            return Err(self.stop(place));
        }
        let left = self
            .left
            .map(|left| left.saturating_sub(chunk.len() as u64));
        if std::mem::replace(&mut self.left, left).is_some() && left == Some(0) {
            // This chunk completes the declared length: the end is read before it leaves.
            if let Some(place) = self.finding(None) {
                return Err(self.stop(place));
            }
        }
        out.push_back(chunk);
        Ok(())
    }

    fn finish(&mut self, _out: &mut VecDeque<Bytes>) -> Result<(), Stopped> {
        // Read already if the declared length was reached.
        if self.left != Some(0) {
            if let Some(place) = self.finding(None) {
                return Err(self.stop(place));
            }
        }
        Ok(())
    }

    fn length(&self) -> Length {
        // Not `Unchanged`: that would let the body report its end before `finish` ran.
        Length::Delayed { held: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::BoxError;
    use http_body::Body as _;
    use http_body_util::BodyExt;

    /// A body sent as `chunks` (its length declared, or not), watched: what left before the
    /// next chunk was sent, and how the body ended (`None`: cleanly).
    async fn run(
        chunks: &[&str],
        declared: bool,
        form: bool,
        multipart: bool,
    ) -> (Vec<Bytes>, Option<String>) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, BoxError>>(8);
        let frames = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|frame| (frame, rx))
        });
        let source = http_body_util::StreamBody::new(frames);
        let length = declared.then(|| chunks.iter().map(|c| c.len() as u64).sum());
        let (mut body, slot) = watched(crate::body::stream(source), length, form, multipart);
        let mut left = Vec::new();
        for chunk in chunks {
            tx.send(Ok(http_body::Frame::data(Bytes::copy_from_slice(
                chunk.as_bytes(),
            ))))
            .await
            .unwrap();
            // What leaves now is what an upstream has before the next chunk is sent.
            let polled =
                tokio::time::timeout(std::time::Duration::from_millis(20), body.frame()).await;
            match polled {
                Ok(Some(Ok(frame))) => left.push(frame.into_data().unwrap()),
                Ok(Some(Err(e))) => {
                    assert!(slot.get().is_some(), "the finding is in the slot");
                    return (left, Some(e.to_string()));
                }
                Ok(None) => unreachable!("the source has not ended"),
                Err(_) => {}
            }
            assert!(
                !body.is_end_stream(),
                "no end is reported before the source's"
            );
        }
        drop(tx);
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => left.push(frame.into_data().unwrap()),
                Err(e) => {
                    assert!(slot.get().is_some(), "the finding is in the slot");
                    return (left, Some(e.to_string()));
                }
            }
        }
        assert!(slot.get().is_none());
        (left, None)
    }

    #[tokio::test]
    async fn a_clean_body_streams_each_chunk_as_it_arrives() {
        for declared in [false, true] {
            let (left, ended) = run(&["a=1&", "b=2&", "c=3"], declared, true, false).await;
            assert_eq!(ended, None);
            assert_eq!(left, ["a=1&", "b=2&", "c=3"], "declared: {declared}");
        }
    }

    #[tokio::test]
    async fn an_override_stops_the_body_before_an_upstream_can_take_it_as_whole() {
        // Found only at the end, with no length declared: every chunk left, but the body
        // ends with an error, never with the end that would make it whole.
        let (left, ended) = run(&["a=1&", "b=2&", "_method"], false, true, false).await;
        assert_eq!(left, ["a=1&", "b=2&", "_method"]);
        assert_eq!(
            ended.as_deref(),
            Some("the body was stopped: the body names `_method`")
        );
        // With a length declared, the chunk that completes it never leaves.
        let (left, ended) = run(&["a=1&", "b=2&", "_method"], true, true, false).await;
        assert_eq!(left, ["a=1&", "b=2&"]);
        assert!(ended.unwrap().contains("the body names"));
        // Found mid-body: the chunk that ends it does not leave, nor any later.
        for declared in [false, true] {
            let chunks = ["x=1&", "a=1&_meth", "od=DELETE&", "c=3"];
            let (left, ended) = run(&chunks, declared, true, false).await;
            assert_eq!(left, ["x=1&", "a=1&_meth"]);
            assert!(ended.unwrap().contains("the body names"));
        }
        let body = "--b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--b--";
        let chunks = [&body[..20], &body[20..40], &body[40..]];
        let (left, ended) = run(&chunks, true, false, true).await;
        assert_eq!(left, [&body[..20], &body[20..40]]);
        assert!(ended.unwrap().contains("a part of the multipart body"));
    }
}
