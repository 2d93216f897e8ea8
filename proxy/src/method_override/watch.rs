//! The watch over a body that streams to its upstream unread by anything else (untyped,
//! multipart): its form keys and part names are read as they pass, and its last chunk is
//! held back until the end has been read, so the upstream has the whole body only once
//! nothing in it names an override. On a finding the body ends with an error, hyper aborts
//! the upstream request (the upstream sees a body cut short, never a complete one), and
//! the finding goes into a slot `forward` reads: the error hyper returns is opaque.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use super::form::FormKeys;
use super::parts::PartNames;
use super::{Finding, Place, Reader};
use crate::body::filter::{ChunkFilter, Filtered, Length};
use crate::body::{BoxError, ProxyBody};

/// The error a watched body ends with.
#[derive(Debug, thiserror::Error)]
#[error("the body was stopped: {0} names `_method`")]
pub(crate) struct Stopped(Place);

/// `body`, watched as a form (`form`: it has no media type) and as parts (`multipart`).
pub(super) fn watched(body: ProxyBody, form: bool, multipart: bool) -> (ProxyBody, Finding) {
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
        held: None,
        slot: slot.clone(),
    };
    let body = Filtered::wrap(body, watch);
    (http_body_util::BodyExt::boxed(body), slot)
}

/// The readers over one body, and the chunk held back.
struct Watch {
    readers: Vec<(Place, Box<dyn Reader + Send + Sync>)>,
    held: Option<Bytes>,
    slot: Finding,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The held chunk is not shown: it is the agent's body.
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
        self.held = None;
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
        // The previous chunk leaves once a later one has been read: the last one waits for
        // the end.
        out.extend(self.held.replace(chunk));
        Ok(())
    }

    fn finish(&mut self, out: &mut VecDeque<Bytes>) -> Result<(), Stopped> {
        if let Some(place) = self.finding(None) {
            return Err(self.stop(place));
        }
        out.extend(self.held.take());
        Ok(())
    }

    fn failed(&mut self, error: BoxError) -> BoxError {
        self.held = None;
        error
    }

    fn length(&self) -> Length {
        Length::Delayed {
            held: self.held.as_ref().map_or(0, |held| held.len() as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A body sent as `chunks`, watched: what leaves before its end, and how it ends.
    async fn run(chunks: &[&str], form: bool, multipart: bool) -> (Vec<Bytes>, Option<String>) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, BoxError>>(8);
        let frames = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|frame| (frame, rx))
        });
        let source = http_body_util::StreamBody::new(frames);
        let (mut body, slot) = watched(crate::body::stream(source), form, multipart);
        let mut left = Vec::new();
        for chunk in chunks {
            tx.send(Ok(http_body::Frame::data(Bytes::copy_from_slice(
                chunk.as_bytes(),
            ))))
            .await
            .unwrap();
            // What leaves now is what an upstream would have before the next chunk is sent.
            let polled =
                tokio::time::timeout(std::time::Duration::from_millis(20), body.frame()).await;
            match polled {
                Ok(Some(Ok(frame))) => left.push(frame.into_data().unwrap()),
                Ok(Some(Err(e))) => return (left, Some(e.to_string())),
                Ok(None) => unreachable!("the source has not ended"),
                Err(_) => {}
            }
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
    async fn a_clean_body_passes_whole_with_its_last_chunk_held_to_the_end() {
        let (left, ended) = run(&["a=1&", "b=2&", "c=3"], true, false).await;
        assert_eq!(ended, None);
        assert_eq!(left, ["a=1&", "b=2&", "c=3"]);
    }

    #[tokio::test]
    async fn an_override_stops_the_body_before_its_end_leaves() {
        // Found only at the end: everything but the last chunk has left, never the last.
        let (left, ended) = run(&["a=1&", "b=2&", "_method"], true, false).await;
        assert_eq!(left, ["a=1&", "b=2&"]);
        assert_eq!(
            ended.as_deref(),
            Some("the body was stopped: the body names `_method`")
        );
        // Found mid-body: neither the chunk that ends it nor the one held leaves, nor later.
        let (left, ended) = run(&["x=1&", "a=1&_meth", "od=DELETE&", "c=3"], true, false).await;
        assert_eq!(left, ["x=1&"]);
        assert!(ended.unwrap().contains("the body names"));
        let body = "--b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--b--";
        let chunks = [&body[..20], &body[20..40], &body[40..], "never sent"];
        let (left, ended) = run(&chunks, false, true).await;
        assert_eq!(left, [&body[..20]]);
        assert!(ended.unwrap().contains("a part of the multipart body"));
    }
}
