//! Scrubbing a WebSocket's messages on their way from the upstream to the agent: every
//! secret the process injected is redacted from them, as from every HTTP answer.
//!
//! The upstream's bytes are read as frames (RFC 6455 §5.2). A data message is scrubbed as
//! one stream from its first frame to its last ([`StreamScrubber`], against the secrets
//! known when it began), and what the scrubber lets out leaves as fragments of the same
//! message: the first with the message's opcode, the rest as continuations, the last
//! final. An intermediary may refragment a message when no extension is in use (§5.4),
//! and the proxy offers none upstream (the handshake drops `Sec-WebSocket-Extensions`),
//! so no frame is compressed past the scrubber. Control frames leave whole, their payloads
//! scrubbed too (cut to 125 bytes if redaction lengthened them). While no secret was ever
//! injected, frames leave as they came.
//!
//! Frames a server may not send end the relay: masked ones, reserved bits or opcodes, a
//! control frame fragmented or over 125 bytes, a continuation outside a message or a new
//! message inside one. The agent's client would fail the connection on them anyway.

use std::collections::VecDeque;

use bytes::Bytes;

use super::{Scrubber, StreamScrubber};

/// The scrubber over every secret known now; `None` while there is none.
pub type Current = Box<dyn Fn() -> Option<Scrubber> + Send + Sync>;

/// Why a frame from the upstream ended the relay.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("the upstream sent a masked frame")]
    Masked,
    #[error("the upstream set reserved bits, with no extension negotiated")]
    Reserved,
    #[error("the upstream sent the reserved opcode {0:#x}")]
    Opcode(u8),
    #[error("the upstream sent a control frame fragmented or over 125 bytes")]
    Control,
    #[error("the upstream sent a continuation outside a message, or a message inside one")]
    Sequence,
}

/// The upstream-to-agent half of a WebSocket, rewritten frame by frame.
pub struct FrameScrubber {
    current: Current,
    /// The head of the next frame, as far as it has arrived.
    head: Vec<u8>,
    frame: Option<Frame>,
    message: Option<Message>,
}

impl std::fmt::Debug for FrameScrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameScrubber")
            .field("in_message", &self.message.is_some())
            .finish_non_exhaustive()
    }
}

/// The frame being read.
struct Frame {
    fin: bool,
    opcode: u8,
    remaining: u64,
    /// A control frame's payload, collected to leave whole.
    control: Option<Vec<u8>>,
}

/// The data message being read.
struct Message {
    opcode: u8,
    /// Whether a fragment of it has left (later ones are continuations).
    begun: bool,
    /// `None`: it passes as it came (no secret was known when it began).
    scrub: Option<StreamScrubber>,
}

const CONTINUATION: u8 = 0x0;
const CLOSE: u8 = 0x8;
/// RFC 6455 §5.5: a control frame's payload is at most this long.
const CONTROL_MAX: usize = 125;

impl FrameScrubber {
    pub fn new(current: Current) -> Self {
        Self {
            current,
            head: Vec::with_capacity(14),
            frame: None,
            message: None,
        }
    }

    /// Read `bytes` from the upstream; what the agent is to receive goes to `out`.
    pub fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<u8>) -> Result<(), FrameError> {
        while !bytes.is_empty() {
            let Some(frame) = &mut self.frame else {
                let want = head_len(&self.head) - self.head.len();
                let take = want.min(bytes.len());
                self.head.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if self.head.len() == head_len(&self.head) {
                    self.begin_frame(out)?;
                }
                continue;
            };
            let take = (frame.remaining.min(bytes.len() as u64)) as usize;
            let (payload, rest) = bytes.split_at(take);
            bytes = rest;
            frame.remaining -= take as u64;
            self.payload(payload, out);
            if self.frame.as_ref().is_some_and(|f| f.remaining == 0) {
                self.end_frame(out);
            }
        }
        Ok(())
    }

    /// A frame's head is whole: check it and start reading its payload.
    fn begin_frame(&mut self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        let head = &self.head;
        let (fin, opcode) = (head[0] & 0x80 != 0, head[0] & 0x0f);
        if head[0] & 0x70 != 0 {
            return Err(FrameError::Reserved);
        }
        if head[1] & 0x80 != 0 {
            return Err(FrameError::Masked);
        }
        let len = match head[1] & 0x7f {
            126 => u64::from(u16::from_be_bytes([head[2], head[3]])),
            127 => u64::from_be_bytes(head[2..10].try_into().expect("eight bytes")),
            short => u64::from(short),
        };
        let control = match opcode {
            0x8..=0xa if !fin || len > CONTROL_MAX as u64 => return Err(FrameError::Control),
            0x8..=0xa => Some(Vec::with_capacity(len as usize)),
            CONTINUATION if self.message.is_none() => return Err(FrameError::Sequence),
            CONTINUATION => None,
            0x1 | 0x2 if self.message.is_some() => return Err(FrameError::Sequence),
            0x1 | 0x2 => {
                let scrub = (self.current)()
                    .filter(|s| !s.is_empty())
                    .map(StreamScrubber::new);
                self.message = Some(Message {
                    opcode,
                    begun: false,
                    scrub,
                });
                None
            }
            other => return Err(FrameError::Opcode(other)),
        };
        if control.is_none() && self.message.as_ref().is_some_and(|m| m.scrub.is_none()) {
            // Passed as it came: the head now, the payload as it arrives.
            out.extend_from_slice(head);
        }
        self.head.clear();
        self.frame = Some(Frame {
            fin,
            opcode,
            remaining: len,
            control,
        });
        if len == 0 {
            self.end_frame(out);
        }
        Ok(())
    }

    fn payload(&mut self, payload: &[u8], out: &mut Vec<u8>) {
        let frame = self.frame.as_mut().expect("reading a frame");
        if let Some(control) = &mut frame.control {
            control.extend_from_slice(payload);
            return;
        }
        let message = self.message.as_mut().expect("a data frame is in a message");
        match &mut message.scrub {
            None => out.extend_from_slice(payload),
            Some(scrub) => {
                let mut pieces = VecDeque::new();
                scrub.feed(Bytes::copy_from_slice(payload), &mut pieces);
                message.fragments(pieces, false, out);
            }
        }
    }

    fn end_frame(&mut self, out: &mut Vec<u8>) {
        let frame = self.frame.take().expect("reading a frame");
        if let Some(payload) = frame.control {
            let payload = self.scrubbed_control(frame.opcode, payload);
            write_head(out, true, frame.opcode, payload.len() as u64);
            out.extend_from_slice(&payload);
            return;
        }
        if !frame.fin {
            return;
        }
        let mut message = self.message.take().expect("a data frame is in a message");
        if let Some(scrub) = &mut message.scrub {
            let mut pieces = VecDeque::new();
            scrub.finish(&mut pieces);
            message.fragments(pieces, true, out);
        }
    }

    /// A control frame's payload, scrubbed, within the 125 bytes a control frame holds (a
    /// close keeps its code and loses a reason redaction made too long).
    fn scrubbed_control(&self, opcode: u8, payload: Vec<u8>) -> Vec<u8> {
        let Some(scrubber) = (self.current)() else {
            return payload;
        };
        let mut payload = scrubber.scrub_bytes(&payload).into_owned();
        if payload.len() > CONTROL_MAX {
            payload.truncate(if opcode == CLOSE { 2 } else { CONTROL_MAX });
        }
        payload
    }
}

impl Message {
    /// `pieces` as fragments of this message; the last is final when `last`.
    fn fragments(&mut self, pieces: VecDeque<Bytes>, last: bool, out: &mut Vec<u8>) {
        let count = pieces.len();
        for (i, piece) in pieces.into_iter().enumerate() {
            let fin = last && i + 1 == count;
            write_head(out, fin, self.next_opcode(), piece.len() as u64);
            out.extend_from_slice(&piece);
        }
        if last && count == 0 {
            write_head(out, true, self.next_opcode(), 0);
        }
    }

    fn next_opcode(&mut self) -> u8 {
        if std::mem::replace(&mut self.begun, true) {
            CONTINUATION
        } else {
            self.opcode
        }
    }
}

/// How long the head that starts `head` is (2 until its length byte is in).
fn head_len(head: &[u8]) -> usize {
    match head.get(1).map(|b| b & 0x7f) {
        None => 2,
        Some(126) => 4,
        Some(127) => 10,
        Some(_) => 2,
    }
}

/// An unmasked frame head.
fn write_head(out: &mut Vec<u8>, fin: bool, opcode: u8, len: u64) {
    out.push(if fin { 0x80 } else { 0 } | opcode);
    match len {
        0..=125 => out.push(len as u8),
        126..=0xffff => {
            out.push(126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(127);
            out.extend_from_slice(&len.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests;
