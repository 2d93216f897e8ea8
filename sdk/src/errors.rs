//! [`SdkError`]: why an SDK call failed — one enum for the control client and the agent's
//! client alike, so a caller matches once.
//!
//! The variants say who failed: the caller's input ([`SdkError::Config`], before anything is
//! sent), the network ([`SdkError::Transport`]), Ostiary refusing ([`SdkError::Api`] on the
//! control API, [`SdkError::Refused`] on the proxy, both carrying the typed [`Refusal`]), a
//! wait that ran out ([`SdkError::ApprovalTimeout`]), or an answer that cannot be read
//! ([`SdkError::Decode`]). No message ever carries a token.

use std::time::Duration;

use crate::refusal::Refusal;

/// Why an SDK call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SdkError {
    /// The SDK was given something it cannot use, and said so before sending anything: a
    /// control URL that is not `http(s)://host` or that carries credentials, no admin token
    /// for a call that needs one, an empty id or approver, a session whose proxy URL or CA
    /// does not parse, a request that cannot be re-sent to collect its approval.
    #[error("{0}")]
    Config(String),
    /// Nothing (or only half an answer) came back from `url`, the control API or the proxy:
    /// refused, timed out, reset. Nothing was decided, so retrying later is safe.
    #[error("no answer from {url}: {message}")]
    Transport {
        /// What was called (the control API's URL, or the request's through the proxy).
        url: String,
        /// What went wrong, with the causes; never a token.
        message: String,
    },
    /// The control API refused the call: any status of 400 and above. `message` is its
    /// sentence (or its error kind when it gave none, or its body when that is not JSON);
    /// `refusal` the typed reading of its JSON, when it was Ostiary's (a child asking for
    /// more than its parent has left is [`Refusal::LimitExceeded`], as on the data plane).
    #[error("control API answered {status}: {message}")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The human sentence to show.
        message: String,
        /// The answer read as one of Ostiary's refusals, `None` when it was not its JSON.
        refusal: Option<Box<Refusal>>,
    },
    /// The proxy refused a request sent through it (an answer it produced itself, told
    /// apart from the upstream's by `Ostiary-Request-Id`), or — for a request an approval
    /// held — the approval's outcome was not to run it.
    #[error("{0}")]
    Refused(Box<Refusal>),
    /// The proxy refused to open a tunnel to `host` for an `https://` request. A refusal at
    /// `CONNECT` (most often a destination the egress guard or a policy forbids outright, a
    /// port outside `egress.ports`) comes before any TLS, and `reqwest` does not hand its
    /// body over, so its details cannot be read.
    #[error(
        "the proxy refused to open a tunnel to {host} (refused at CONNECT: a policy or the \
         egress guard forbids this destination; the reasons are in the proxy's audit trail)"
    )]
    TunnelRefused {
        /// The destination of the tunnel.
        host: String,
    },
    /// A held request was still waiting for a human when the wait ran out. Nothing was run
    /// because of the wait ending: the approval stays in the queue and can be waited for,
    /// or collected, again.
    #[error("approval {approval_id} was still undecided after waiting {waited:?}")]
    ApprovalTimeout {
        /// The approval still pending.
        approval_id: String,
        /// How long was waited.
        waited: Duration,
    },
    /// An answer the SDK cannot read: not JSON where JSON was promised, or without a field
    /// the call relies on. Says what was wrong; never guesses.
    #[error("an answer the SDK cannot read: {0}")]
    Decode(String),
}

impl SdkError {
    /// Ostiary's refusal, whichever side answered it: the control API's
    /// ([`SdkError::Api`]) or the proxy's ([`SdkError::Refused`]).
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Self::Api { refusal, .. } => refusal.as_deref(),
            Self::Refused(refusal) => Some(refusal),
            _ => None,
        }
    }

    /// The HTTP status of the refusal, when there was one.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } => Some(*status),
            other => other.refusal().and_then(Refusal::status),
        }
    }

    /// The id of the request an operator finds the audit record by, when Ostiary gave one.
    pub fn request_id(&self) -> Option<&str> {
        self.refusal().and_then(Refusal::request_id)
    }
}
