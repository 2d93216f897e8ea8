//! Placeholders in streamed request bodies: the part of the exfiltration check that cannot
//! run before the request is forwarded, because the body is not read before it is sent.
//!
//! Bodies the proxy reads whole (tool calls, MCP) are checked with the head, before policy
//! ([`super::placeholders`]). Every body towards any host also streams through this guard:
//! one automaton over every configured placeholder (`ostiary:<name>`, also spelled
//! `ostiary%3A<name>` and `ostiary\u003a<name>`, any case) scans each chunk together with
//! the tail of the previous one, so a placeholder split across chunks is found. No binding
//! injects into a body, so a placeholder there is never where it belongs, whatever the
//! host: the chunk holding one is never passed on, the body ends with an error there, the
//! upstream sees an incomplete request, and the agent gets the same 403
//! `placeholder_exfiltration` as for a misplaced placeholder in the head. (A bound upstream
//! that stores bodies would otherwise be a place to leave it for a later lookup.)

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use bytes::Bytes;
use ostiary_broker::{Broker, PLACEHOLDER_PREFIX};

use crate::body::filter::{ChunkFilter, Filtered, Length};
use crate::body::ProxyBody;

/// The placeholders of every binding, compiled once.
#[derive(Debug, Clone)]
pub struct BodyGuard {
    inner: Option<Arc<Patterns>>,
}

#[derive(Debug)]
struct Patterns {
    automaton: AhoCorasick,
    /// Binding name per pattern index.
    names: Vec<String>,
    /// Bytes carried from one chunk to the next: enough to complete any pattern plus the
    /// byte after it (which tells `ostiary:github` from `ostiary:githubx`).
    carry: usize,
}

/// The credential whose placeholder tripped a guard.
pub type Tripped = Arc<OnceLock<String>>;

impl BodyGuard {
    /// A guard over the placeholders of `broker`'s bindings (none when there are none).
    pub fn new(broker: &Broker) -> Self {
        let mut patterns = Vec::new();
        let mut names = Vec::new();
        for binding in broker.bindings() {
            for spelled in [PLACEHOLDER_PREFIX, "ostiary%3a", "ostiary\\u003a"] {
                patterns.push(format!("{spelled}{}", binding.name));
                names.push(binding.name.clone());
            }
        }
        if patterns.is_empty() {
            return Self { inner: None };
        }
        let automaton = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::Standard)
            .build(&patterns)
            .expect("placeholder patterns are plain ASCII and few");
        let carry = patterns.iter().map(String::len).max().unwrap_or(0) + 1;
        Self {
            inner: Some(Arc::new(Patterns {
                automaton,
                names,
                carry,
            })),
        }
    }

    /// Wrap `body`: `Err` gives it back when no placeholder is configured. The returned
    /// flag names the credential once the guard trips.
    pub fn wrap(&self, body: ProxyBody) -> Result<(ProxyBody, Tripped), ProxyBody> {
        let Some(patterns) = &self.inner else {
            return Err(body);
        };
        let tripped: Tripped = Arc::new(OnceLock::new());
        let guarded = Guarded {
            patterns: patterns.clone(),
            tail: Vec::new(),
            tripped: tripped.clone(),
        };
        let body = Filtered::wrap(body, guarded);
        Ok((http_body_util::BodyExt::boxed(body), tripped))
    }
}

/// What a guarded body ends with: the credential whose placeholder it carried.
#[derive(Debug, thiserror::Error)]
#[error("the request body carries the placeholder of credential {0}")]
struct PlaceholderInBody(String);

struct Guarded {
    patterns: Arc<Patterns>,
    /// The last bytes already passed on, to find placeholders split across chunks.
    tail: Vec<u8>,
    tripped: Tripped,
}

impl Guarded {
    /// The credential whose placeholder `chunk` completes, if any.
    fn scan(&mut self, chunk: &[u8]) -> Option<String> {
        let mut window = std::mem::take(&mut self.tail);
        let old = window.len();
        window.extend_from_slice(chunk);
        let mut hit = None;
        for m in self.patterns.automaton.find_overlapping_iter(&window) {
            // Matches ending inside the old tail were judged with the previous chunk (one
            // ending at its very end was judged without knowing the next byte, and refused:
            // a rare false refusal beats a miss).
            if m.end() <= old {
                continue;
            }
            let index = m.pattern().as_usize();
            let continues = window
                .get(m.end())
                .is_some_and(|b| b.is_ascii_alphanumeric() || b"-_".contains(b));
            if !continues {
                hit = Some(self.patterns.names[index].clone());
                break;
            }
        }
        let keep = window.len().min(self.patterns.carry);
        self.tail = window.split_off(window.len() - keep);
        hit
    }
}

impl ChunkFilter for Guarded {
    type Error = PlaceholderInBody;

    fn feed(&mut self, chunk: Bytes, out: &mut VecDeque<Bytes>) -> Result<(), PlaceholderInBody> {
        if let Some(name) = self.scan(&chunk) {
            let _ = self.tripped.set(name.clone());
            return Err(PlaceholderInBody(name));
        }
        out.push_back(chunk);
        Ok(())
    }

    fn length(&self) -> Length {
        Length::Unchanged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body;
    use crate::body::BoxError;
    use futures_util::stream;
    use http_body::Frame;
    use http_body_util::{BodyExt, StreamBody};

    fn broker() -> Broker {
        let binding = |name: &str| {
            toml::from_str(&format!(
                "name = \"{name}\"\nsource = {{ file = \"{name}\" }}\nhosts = [\"api.{name}.com\"]\ninject = {{ query = \"k\" }}"
            ))
            .unwrap()
        };
        Broker::new(vec![binding("github"), binding("stripe")], None, None).unwrap()
    }

    fn chunked(parts: &[&str]) -> ProxyBody {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::copy_from_slice(p.as_bytes()))))
            .collect();
        body::stream(StreamBody::new(stream::iter(frames)))
    }

    /// What passed before the guard stopped the body, and whom it tripped on.
    async fn run(parts: &[&str]) -> (String, Option<String>) {
        let b = broker();
        let guard = BodyGuard::new(&b);
        let (mut guarded, tripped) = match guard.wrap(chunked(parts)) {
            Ok(wrapped) => wrapped,
            Err(_) => return (parts.concat(), None),
        };
        let mut passed = String::new();
        while let Some(frame) = guarded.frame().await {
            match frame {
                Ok(frame) => passed.push_str(&String::from_utf8_lossy(frame.data_ref().unwrap())),
                Err(_) => break,
            }
        }
        (passed, tripped.get().cloned())
    }

    #[tokio::test]
    async fn a_placeholder_split_anywhere_is_stopped_before_it_passes() {
        let text = "{\"token\": \"ostiary:github\", \"x\": 1}";
        for cut in 0..=text.len() {
            let (a, b) = text.split_at(cut);
            let (passed, tripped) = run(&[a, b, "tail"]).await;
            assert_eq!(tripped.as_deref(), Some("github"), "cut at {cut}");
            assert!(!passed.contains("ostiary:github"), "cut at {cut}: {passed}");
        }
    }

    #[tokio::test]
    async fn spellings_and_case_are_caught() {
        for body in ["a=OSTIARY%3Agithub&b=1", "Ostiary:Stripe "] {
            let (_, tripped) = run(&[body]).await;
            assert!(tripped.is_some(), "{body}");
        }
    }

    #[tokio::test]
    async fn json_escaped_placeholders_are_caught() {
        for body in [
            r#"{"t":"ostiary\u003agithub"}"#,
            r#"{"t":"OSTIARY\u003Astripe"}"#,
        ] {
            let (passed, tripped) = run(&[body]).await;
            assert!(tripped.is_some(), "{body}");
            assert!(passed.is_empty(), "{passed}");
        }
    }

    #[tokio::test]
    async fn every_configured_placeholder_is_refused_and_other_names_pass() {
        // No host is passed: a body is no binding's injection point, so a placeholder
        // there is refused towards its own host as much as towards any other.
        for body in ["ostiary:github", "x ostiary:stripe@ses_1 y"] {
            let (passed, tripped) = run(&[body]).await;
            assert!(tripped.is_some(), "{body}");
            assert!(passed.is_empty(), "{passed}");
        }
        let (passed, tripped) = run(&["ostiary:githubx ostiary:", "unknown"]).await;
        assert_eq!(tripped, None);
        assert_eq!(passed, "ostiary:githubx ostiary:unknown");
    }

    #[tokio::test]
    async fn without_bindings_bodies_are_not_wrapped() {
        let b = Broker::new(Vec::new(), None, None).unwrap();
        assert!(BodyGuard::new(&b)
            .wrap(chunked(&["ostiary:github"]))
            .is_err());
    }
}
