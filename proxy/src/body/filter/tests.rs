//! Tests of the [`Filtered`] adapter: a probe filter that logs what it is asked, over a
//! scripted source that counts its polls, so each rule of the module docs is seen to hold.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::{ChunkFilter, Filtered, Length};
use crate::body::BoxError;

/// One step of a scripted source.
enum Step {
    Frame(Result<Frame<Bytes>, BoxError>),
    /// Not ready this time (the task is woken at once).
    Wait,
}

/// A source that yields its steps, then ends.
struct Script {
    steps: VecDeque<Step>,
    polls: usize,
    hint: SizeHint,
}

impl Body for Script {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        this.polls += 1;
        match this.steps.pop_front() {
            None => Poll::Ready(None),
            Some(Step::Frame(frame)) => Poll::Ready(Some(frame)),
            Some(Step::Wait) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.steps.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

fn data(text: &str) -> Step {
    Step::Frame(Ok(Frame::data(Bytes::copy_from_slice(text.as_bytes()))))
}

fn trailers(name: &'static str) -> Step {
    let mut t = HeaderMap::new();
    t.insert(name, "1".parse().unwrap());
    Step::Frame(Ok(Frame::trailers(t)))
}

fn script(steps: Vec<Step>) -> Script {
    Script {
        steps: steps.into(),
        polls: 0,
        hint: SizeHint::new(),
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ProbeError(&'static str);

/// A filter that logs its calls. It passes chunks on (or holds them all until the end),
/// fails on a chunk `bad`, and can be told to fail at the end, drop trailers or cut.
#[derive(Debug, Default)]
struct Probe {
    log: Vec<String>,
    hold: bool,
    held: Vec<u8>,
    fail_finish: bool,
    drop_trailers: bool,
    /// Push an empty piece before each chunk.
    empties: bool,
    /// Give what would be put out one byte at a time from `resume` instead.
    split: bool,
    pieces: VecDeque<Bytes>,
    cut: bool,
    length: Option<Length>,
}

impl ChunkFilter for Probe {
    type Error = ProbeError;

    fn feed(&mut self, chunk: Bytes, out: &mut VecDeque<Bytes>) -> Result<(), ProbeError> {
        self.log
            .push(format!("feed {}", String::from_utf8_lossy(&chunk)));
        if self.empties {
            out.push_back(Bytes::new());
        }
        if &chunk[..] == b"bad" {
            out.push_back(Bytes::from_static(b"before"));
            return Err(ProbeError("bad chunk"));
        }
        if self.hold {
            self.held.extend_from_slice(&chunk);
        } else {
            self.put(chunk, out);
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut VecDeque<Bytes>) -> Result<(), ProbeError> {
        self.log.push("finish".into());
        let held = Bytes::from(std::mem::take(&mut self.held));
        self.put(held, out);
        if self.fail_finish {
            return Err(ProbeError("bad end"));
        }
        Ok(())
    }

    fn resume(&mut self, out: &mut VecDeque<Bytes>) -> Result<(), ProbeError> {
        self.log.push("resume".into());
        out.extend(self.pieces.pop_front());
        Ok(())
    }

    fn has_more(&self) -> bool {
        !self.pieces.is_empty()
    }

    fn trailers(&mut self, mut t: HeaderMap) -> Result<Option<HeaderMap>, ProbeError> {
        self.log.push("trailers".into());
        if self.drop_trailers {
            return Ok(None);
        }
        t.insert("x-filtered", "yes".parse().unwrap());
        Ok(Some(t))
    }

    fn failed(&mut self, error: BoxError) -> BoxError {
        self.log.push("failed".into());
        self.held.clear();
        format!("filtered: {error}").into()
    }

    fn poll_cut(&mut self, _: &mut Context<'_>) -> Poll<ProbeError> {
        if self.cut {
            Poll::Ready(ProbeError("cut"))
        } else {
            Poll::Pending
        }
    }

    fn length(&self) -> Length {
        self.length.unwrap_or(Length::Changed)
    }
}

impl Probe {
    fn put(&mut self, bytes: Bytes, out: &mut VecDeque<Bytes>) {
        if self.split {
            self.pieces
                .extend((0..bytes.len()).map(|i| bytes.slice(i..i + 1)));
        } else {
            out.push_back(bytes);
        }
    }
}

/// What a body yielded, in a form easy to compare.
#[derive(Debug, PartialEq, Eq)]
enum Out {
    Data(String),
    Trailers(Vec<String>),
    Error(String),
    Pending,
    End,
}

fn poll(body: &mut Filtered<Script, Probe>) -> Out {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match Pin::new(body).poll_frame(&mut cx) {
        Poll::Pending => Out::Pending,
        Poll::Ready(None) => Out::End,
        Poll::Ready(Some(Err(e))) => Out::Error(e.to_string()),
        Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
            Ok(d) => Out::Data(String::from_utf8_lossy(&d).into_owned()),
            Err(frame) => {
                let t = frame.into_trailers().unwrap();
                let mut names: Vec<String> = t.keys().map(|k| k.to_string()).collect();
                names.sort();
                Out::Trailers(names)
            }
        },
    }
}

/// Everything the body yields up to its end (and one poll after it).
fn drain(body: &mut Filtered<Script, Probe>) -> Vec<Out> {
    let mut got = Vec::new();
    loop {
        match poll(body) {
            Out::Pending => continue,
            Out::End => break,
            other => got.push(other),
        }
    }
    assert_eq!(poll(body), Out::End, "the body stays ended");
    got
}

/// A probe that holds everything until the end.
fn holding() -> Probe {
    Probe {
        hold: true,
        ..Probe::default()
    }
}

fn d(text: &str) -> Out {
    Out::Data(text.into())
}

#[test]
fn the_end_of_the_source_flushes_once() {
    let probe = holding();
    let mut body = Filtered::wrap(script(vec![data("ab"), data("cd")]), probe);
    assert_eq!(drain(&mut body), vec![d("abcd")]);
    assert_eq!(body.filter.log, ["feed ab", "feed cd", "finish"]);
    // Polled for its frames only: it said it had ended, and the ended body does not ask
    // again.
    assert_eq!(body.source.polls, 2);
}

#[test]
fn a_source_that_says_it_ended_is_not_polled_for_its_end() {
    let mut body = Filtered::wrap(script(vec![data("ab")]), holding());
    assert_eq!(
        poll(&mut body),
        d("ab"),
        "held bytes leave with the last frame"
    );
    assert!(body.is_end_stream(), "and the end is known with them");
    assert_eq!(body.source.polls, 1);
    assert_eq!(body.filter.log, ["feed ab", "finish"]);
    // The same for a filter that lets its bytes through as they come.
    let mut body = Filtered::wrap(script(vec![data("ab")]), Probe::default());
    assert_eq!(poll(&mut body), d("ab"));
    assert!(
        body.is_end_stream(),
        "the end is known as the last bytes leave"
    );
    // A source that has not said so is asked, and may keep the body waiting.
    let mut body = Filtered::wrap(script(vec![data("ab"), Step::Wait]), holding());
    assert_eq!(poll(&mut body), Out::Pending);
    assert_eq!(body.source.polls, 2);
}

#[test]
fn trailers_leave_after_the_flush_and_end_the_source() {
    let probe = holding();
    let steps = vec![data("ab"), trailers("x-t"), data("late")];
    let mut body = Filtered::wrap(script(steps), probe);
    assert_eq!(
        drain(&mut body),
        vec![
            d("ab"),
            Out::Trailers(vec!["x-filtered".into(), "x-t".into()])
        ]
    );
    assert_eq!(body.filter.log, ["feed ab", "finish", "trailers"]);
    assert_eq!(
        body.source.steps.len(),
        1,
        "nothing is read after the trailers"
    );
}

#[test]
fn a_filter_may_drop_the_trailers() {
    let probe = Probe {
        drop_trailers: true,
        ..Probe::default()
    };
    let mut body = Filtered::wrap(script(vec![data("ab"), trailers("x-t")]), probe);
    assert_eq!(drain(&mut body), vec![d("ab")]);
}

#[test]
fn an_error_from_feed_ends_the_body_after_what_was_put_out_before_it() {
    let steps = vec![data("ok"), data("bad"), data("more")];
    let mut body = Filtered::wrap(script(steps), Probe::default());
    assert_eq!(
        drain(&mut body),
        vec![d("ok"), d("before"), Out::Error("bad chunk".into())]
    );
    assert_eq!(
        body.filter.log,
        ["feed ok", "feed bad"],
        "not fed, not finished"
    );
    assert_eq!(body.source.steps.len(), 1);
}

#[test]
fn an_error_at_the_end_replaces_the_trailers() {
    let probe = Probe {
        fail_finish: true,
        ..holding()
    };
    let mut body = Filtered::wrap(script(vec![data("ab"), trailers("x-t")]), probe);
    assert_eq!(
        drain(&mut body),
        vec![d("ab"), Out::Error("bad end".into())]
    );
    assert_eq!(body.filter.log, ["feed ab", "finish"]);
}

#[test]
fn a_source_error_goes_through_the_filter_and_drops_what_it_held() {
    let probe = holding();
    let steps = vec![
        data("half a secret"),
        Step::Frame(Err("connection reset".into())),
        data("more"),
    ];
    let mut body = Filtered::wrap(script(steps), probe);
    assert_eq!(
        drain(&mut body),
        vec![Out::Error("filtered: connection reset".into())]
    );
    assert_eq!(body.filter.log, ["feed half a secret", "failed"]);
    assert_eq!(body.source.steps.len(), 1);
}

#[test]
fn empty_frames_are_not_fed_and_empty_pieces_do_not_leave() {
    let probe = Probe {
        empties: true,
        ..Probe::default()
    };
    let steps = vec![data(""), data("ab"), data(""), Step::Wait, data("c")];
    let mut body = Filtered::wrap(script(steps), probe);
    assert_eq!(drain(&mut body), vec![d("ab"), d("c")]);
    assert_eq!(body.filter.log, ["feed ab", "feed c", "finish"]);
}

#[test]
fn the_size_is_known_ahead_only_when_the_length_is_preserved() {
    let sized = |length| {
        let mut source = script(vec![data("0123456789")]);
        source.hint = SizeHint::with_exact(10);
        let probe = Probe {
            length: Some(length),
            ..Probe::default()
        };
        Filtered::wrap(source, probe)
    };
    let changed = sized(Length::Changed).size_hint();
    assert_eq!((changed.lower(), changed.upper()), (0, None));
    assert_eq!(sized(Length::Unchanged).size_hint().exact(), Some(10));
    let delayed = sized(Length::Delayed { held: 3 }).size_hint();
    assert_eq!(
        delayed.exact(),
        Some(13),
        "the held bytes are still to come"
    );
    // What is queued counts too, and once the source has ended the size is known.
    let prefixed = sized(Length::Changed).with_prefix(Bytes::from_static(b"hello"));
    assert_eq!(prefixed.size_hint().lower(), 5);
    assert_eq!(prefixed.size_hint().upper(), None);
    let mut ended = sized(Length::Changed);
    ended.filter.hold = true;
    assert_eq!(poll(&mut ended), d("0123456789"));
    assert_eq!(ended.size_hint().exact(), Some(0));
}

#[test]
fn the_end_follows_the_source_only_for_unchanged_filters() {
    let unchanged = Probe {
        length: Some(Length::Unchanged),
        ..Probe::default()
    };
    assert!(Filtered::wrap(script(vec![]), unchanged).is_end_stream());
    // A filter that may still flush something is asked first.
    let mut changed = Filtered::wrap(script(vec![]), Probe::default());
    assert!(!changed.is_end_stream());
    assert_eq!(drain(&mut changed), vec![]);
    assert!(changed.is_end_stream());
    assert_eq!(changed.filter.log, ["finish"]);
    let delayed = Probe {
        length: Some(Length::Delayed { held: 0 }),
        ..Probe::default()
    };
    assert!(!Filtered::wrap(script(vec![]), delayed).is_end_stream());
}

#[test]
fn a_cut_ends_the_body_at_once() {
    let steps = vec![data("ab"), Step::Wait, data("cd")];
    let mut body = Filtered::wrap(script(steps), Probe::default());
    assert_eq!(poll(&mut body), d("ab"));
    assert_eq!(poll(&mut body), Out::Pending);
    body.filter.cut = true;
    assert_eq!(poll(&mut body), Out::Error("cut".into()));
    assert_eq!(poll(&mut body), Out::End);
    assert_eq!(body.filter.log, ["feed ab"]);
    assert!(body.is_end_stream());
}

#[test]
fn a_prefix_leaves_before_the_source_is_polled() {
    let steps = vec![Step::Wait, data("ab")];
    let mut body =
        Filtered::wrap(script(steps), Probe::default()).with_prefix(Bytes::from_static(b"hi"));
    assert!(!body.is_end_stream());
    assert_eq!(poll(&mut body), d("hi"));
    assert_eq!(body.source.polls, 0);
    assert_eq!(drain(&mut body), vec![d("ab")]);
}

#[test]
fn more_output_is_given_a_piece_at_a_time_before_the_source_is_read() {
    let probe = Probe {
        split: true,
        ..Probe::default()
    };
    let steps = vec![data("abc"), data("d"), trailers("x-t")];
    let mut body = Filtered::wrap(script(steps), probe);
    assert_eq!(poll(&mut body), d("a"));
    assert_eq!(poll(&mut body), d("b"));
    assert_eq!(
        body.source.polls, 1,
        "the source waits while the filter has more"
    );
    assert_eq!(
        body.filter.pieces.len(),
        1,
        "one piece at a time, as it is read"
    );
    assert_eq!(
        drain(&mut body),
        vec![
            d("c"),
            d("d"),
            Out::Trailers(vec!["x-filtered".into(), "x-t".into()])
        ]
    );
}

#[test]
fn the_end_waits_for_what_the_filter_still_has() {
    let probe = Probe {
        split: true,
        ..holding()
    };
    let mut body = Filtered::wrap(script(vec![data("ab")]), probe);
    assert_eq!(poll(&mut body), d("a"));
    assert_eq!(body.filter.log, ["feed ab", "finish", "resume"]);
    assert!(!body.is_end_stream());
    assert_eq!(body.size_hint().upper(), None);
    assert_eq!(poll(&mut body), d("b"));
    assert!(body.is_end_stream());
    assert_eq!(body.size_hint().exact(), Some(0));
    assert_eq!(poll(&mut body), Out::End);
}
