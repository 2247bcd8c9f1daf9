//! [`Error`]: what a request to the API can end in, with the server's problem+json body when it
//! sent one.

use keel_api::Problem;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an error status and an RFC 9457 problem body (`application/
    /// problem+json`): 400, 401, 403 (naming the server `limit` that refused), 404, 409, 412,
    /// 422, 428, 429, …
    #[error("{} {}: {}", problem.status, problem.title, problem.detail)]
    Api {
        /// The HTTP status.
        status: u16,
        /// The body: `detail` says what went wrong and what to do; `field`, `id`, `limit`
        /// name what is at fault.
        problem: Box<Problem>,
    },
    /// The server answered with an error status and a body that is not a problem (a proxy, a
    /// server that is not Keel). `body` is its first 500 bytes.
    #[error("{url} answered HTTP {status}: {body}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The URL requested.
        url: String,
        /// The start of the body.
        body: String,
    },
    /// No connection could be made (refused, unreachable, DNS, TLS handshake).
    #[error("cannot connect to {url}: {detail}")]
    Connect {
        /// The URL requested.
        url: String,
        /// The cause, as reqwest reports it.
        detail: String,
    },
    /// The connection broke or timed out after it was made.
    #[error("request to {url} failed: {detail}")]
    Transport {
        /// The URL requested.
        url: String,
        /// The cause.
        detail: String,
    },
    /// A success response whose body is not the JSON the document promises.
    #[error("{url} answered a body that does not parse as {what}: {detail}")]
    Decode {
        /// The URL requested.
        url: String,
        /// The type expected.
        what: &'static str,
        /// The parser's message.
        detail: String,
    },
    /// A base URL or key the client cannot use.
    #[error("{0}")]
    Config(String),
    /// The event stream could not be resumed after `attempts` reconnects in a row.
    #[error(
        "the event stream of session {session} broke and {attempts} reconnects failed (last error: {last}); the session itself goes on on the server: when it answers again, `keel --server URL sessions show {session}` says where it stands (a tool call the server lost becomes outcome_unknown: resolve it, then resume)"
    )]
    StreamLost {
        /// The session.
        session: String,
        /// Reconnects tried.
        attempts: u32,
        /// The last reconnect's error.
        last: Box<Error>,
    },
}

impl Error {
    /// The HTTP status of an error response (`None` for connection and decoding errors).
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } | Self::Status { status, .. } => Some(*status),
            Self::StreamLost { last, .. } => last.status(),
            _ => None,
        }
    }

    /// The problem body, when the server sent one.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Self::Api { problem, .. } => Some(problem),
            Self::StreamLost { last, .. } => last.problem(),
            _ => None,
        }
    }

    pub(crate) fn from_reqwest(url: &str, e: &reqwest::Error) -> Self {
        // The whole chain: reqwest's own message is only "error sending request".
        let mut detail = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            detail.push_str(": ");
            detail.push_str(&s.to_string());
            source = s.source();
        }
        if e.is_connect() {
            Self::Connect {
                url: url.to_owned(),
                detail,
            }
        } else {
            Self::Transport {
                url: url.to_owned(),
                detail,
            }
        }
    }
}
