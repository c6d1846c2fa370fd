//! Every way the session says no, in one type: each case knows its NIP-01
//! prefix ([`Reason`]) and its message, renders itself as the answer its
//! command gets (OK false for an EVENT, CLOSED for a REQ or COUNT, NOTICE
//! otherwise), and counts itself on /metrics as it renders.
//!
//! NIP-77's `NEG-ERR` answers are [`NegError`]s: a negentropy case, or a
//! REQ's refusal, rendered and counted the same way.
//!
//! Invariant: the prefix of every refusal the session sends is chosen in
//! [`Refusal::reason`] (or [`NegError::reason`]), and its wording in
//! [`Refusal::detail`] (or [`NegError::detail`]); handlers name the case,
//! never a prefix. The one prefixed answer that is not a refusal, OK true
//! `duplicate:`, is chosen in [`Refusal::of_write`]. No other product code
//! writes a prefix (`tests/invariants.rs`).

use std::borrow::Cow;

use sluice_engine::reads::QueryError;
use sluice_engine::reads::ReadEnd;
use sluice_engine::writer::WriteError;
use sluice_engine::writer::WriteResult;
use sluice_proto::{Reason, RelayMessage};
use sluice_store::WriteOutcome;

use crate::metrics_names as m;

/// A refusal to answer on the wire.
#[derive(Debug)]
pub(super) enum Refusal {
    /// A text message over `limits.max_message_bytes`, refused unparsed.
    TooLarge {
        len: usize,
        max: usize,
    },
    /// A WebSocket frame over the hard bound: the connection closes.
    FrameTooLarge,
    Binary,
    /// Bad JSON, a bad event, a bad filter, an event outside the limits, a
    /// bad signature: the parser's or checker's own words.
    Invalid(String),
    UnknownType(String),
    /// A throttle layer (bucket, controller, read budget, query scheduler).
    Throttled(sluice_throttle::RateLimited),
    /// The writer's queue is full.
    WriterBusy,
    ShuttingDown,
    Superseded,
    DeletedByAuthor,
    Expired,
    /// Retention would remove it at once.
    OutsideRetention,
    /// Its author asked this relay to forget them (NIP-62).
    Vanished,
    /// A NIP-62 request to vanish whose `relay` tag names another relay.
    VanishElsewhere,
    StoreFull,
    /// The store's disk is full (or under `store.min_free_disk_mb`).
    DiskFull(String),
    StoreFailed,
    SubIdTooLong {
        max: usize,
    },
    NoFilters,
    TooManyFilters {
        len: usize,
        max: usize,
    },
    /// Open subscriptions and running COUNTs at `limits.max_subscriptions`.
    TooManySubscriptions {
        max: usize,
    },
    QueryFailed,
    CountFailed,
    /// More than `server.max_buffered_live_events` matched while the
    /// subscription's query ran.
    LiveOverflow,
    /// NIP-42: the answer needs an authenticated pubkey, and none is.
    AuthRequired(&'static str),
    /// NIP-42: the authenticated pubkeys are not allowed this.
    Restricted(&'static str),
    /// An AUTH message while `auth.enabled` is off.
    AuthUnsupported,
    /// `auth.max_pubkeys_per_connection` pubkeys are authenticated.
    TooManyPubkeys {
        max: usize,
    },
    /// A NIP-70 protected event while AUTH is off: nobody can prove
    /// authorship, so nobody may publish it.
    ProtectedWithoutAuth,
    /// The operator's policy (`[policy]`, NIP-86): its own prefix.
    Policy(sluice_engine::access::Denial),
    /// The write-policy plugin rejected it, with its message.
    Plugin(String),
    /// NIP-13: an outsider's event without the work asked of it now.
    Pow {
        required: u32,
    },
    /// `trust.outsider_writes = "deny"` and its author is outside the web.
    NotTrusted,
}

impl From<sluice_throttle::trust::TrustRefusal> for Refusal {
    fn from(r: sluice_throttle::trust::TrustRefusal) -> Self {
        match r {
            sluice_throttle::trust::TrustRefusal::Pow { required } => Refusal::Pow { required },
            sluice_throttle::trust::TrustRefusal::NotTrusted => Refusal::NotTrusted,
        }
    }
}

impl From<sluice_throttle::admission::AuthorRefusal> for Refusal {
    fn from(r: sluice_throttle::admission::AuthorRefusal) -> Self {
        match r {
            sluice_throttle::admission::AuthorRefusal::Limited(r) => Refusal::Throttled(r),
            sluice_throttle::admission::AuthorRefusal::Pow { required } => {
                Refusal::Pow { required }
            }
        }
    }
}

impl Refusal {
    /// The NIP-01 prefix of each case.
    pub(super) fn reason(&self) -> Reason {
        use Refusal as R;
        match self {
            R::TooLarge { .. }
            | R::FrameTooLarge
            | R::Binary
            | R::Invalid(_)
            | R::Expired
            | R::SubIdTooLong { .. }
            | R::NoFilters
            | R::TooManyFilters { .. }
            | R::TooManyPubkeys { .. } => Reason::Invalid,
            R::AuthRequired(_) => Reason::AuthRequired,
            R::Restricted(_) | R::NotTrusted => Reason::Restricted,
            R::Pow { .. } => Reason::Pow,
            R::ProtectedWithoutAuth => Reason::Blocked,
            R::AuthUnsupported => Reason::Unsupported,
            R::Policy(d) => d.reason,
            R::Plugin(msg) => plugin_prefix(msg).0,
            R::UnknownType(_) => Reason::Unsupported,
            R::Throttled(_) | R::WriterBusy | R::TooManySubscriptions { .. } | R::LiveOverflow => {
                Reason::RateLimited
            }
            R::Superseded => Reason::Duplicate,
            R::DeletedByAuthor | R::OutsideRetention | R::Vanished | R::VanishElsewhere => {
                Reason::Blocked
            }
            R::ShuttingDown
            | R::StoreFull
            | R::DiskFull(_)
            | R::StoreFailed
            | R::QueryFailed
            | R::CountFailed => Reason::Error,
        }
    }

    /// The human text after the prefix.
    fn detail(&self) -> Cow<'static, str> {
        use Refusal as R;
        match self {
            R::TooLarge { len, max } => {
                format!("message too large ({len} bytes, max {max})").into()
            }
            R::FrameTooLarge => "message too large, closing".into(),
            R::Binary => "binary messages are not supported".into(),
            R::Invalid(text) => text.clone().into(),
            R::UnknownType(t) => format!("message type {t:?} is not supported").into(),
            R::Throttled(r) => r.detail().into(),
            R::WriterBusy => "relay is busy, retry in a few seconds".into(),
            R::ShuttingDown => "relay is shutting down".into(),
            R::Superseded => "have a newer version of this event".into(),
            R::DeletedByAuthor => "this event was deleted by its author".into(),
            R::Expired => "event has expired".into(),
            R::StoreFull => "relay storage is full".into(),
            R::DiskFull(why) => {
                format!("disk is full, writes resume when space returns ({why})").into()
            }
            R::OutsideRetention => {
                "older than this relay keeps events of this kind (retention)".into()
            }
            R::Vanished => "its author asked this relay to remove their events (NIP-62)".into(),
            R::VanishElsewhere => "this request to vanish names another relay".into(),
            R::StoreFailed => "could not store the event".into(),
            R::SubIdTooLong { max } => {
                format!("subscription id longer than {max} characters").into()
            }
            R::NoFilters => "at least one filter is required".into(),
            R::TooManyFilters { len, max } => format!("too many filters ({len}, max {max})").into(),
            R::TooManySubscriptions { max } => {
                format!("too many open subscriptions (max {max})").into()
            }
            R::QueryFailed => "could not run the query".into(),
            R::CountFailed => "could not count events".into(),
            R::LiveOverflow => "too many live events while the query ran; subscribe again".into(),
            R::AuthRequired(what) | R::Restricted(what) => (*what).into(),
            R::AuthUnsupported => "authentication is not offered here".into(),
            R::TooManyPubkeys { max } => {
                format!("too many authenticated pubkeys on this connection (max {max})").into()
            }
            R::ProtectedWithoutAuth => {
                "protected events are not accepted: this relay does not offer AUTH".into()
            }
            R::Policy(d) => d.message.clone().into(),
            R::Pow { required } => format!("difficulty {required} required").into(),
            R::NotTrusted => "not in this relay's web of trust".into(),
            R::Plugin(msg) => match plugin_prefix(msg).1 {
                "" => "rejected by the write policy".into(),
                text => text.to_string().into(),
            },
        }
    }

    /// `"<prefix>: <detail>"`.
    /// Whether the answer asks the client to authenticate (the challenge
    /// goes first).
    pub(super) fn asks_auth(&self) -> bool {
        self.reason() == Reason::AuthRequired
    }

    pub(super) fn message(&self) -> String {
        self.reason().message(&self.detail())
    }

    /// `["OK", id, false, ...]`, counted in `sluice_events_refused_total`.
    pub(super) fn ok(&self, event_id: &str) -> String {
        metrics::counter!(m::EVENTS_REFUSED_TOTAL, "reason" => self.reason().as_str()).increment(1);
        RelayMessage::ok(event_id, false, &self.message())
    }

    /// `["CLOSED", sub_id, ...]`, counted in `sluice_reqs_refused_total`.
    pub(super) fn closed(&self, sub_id: &str) -> String {
        metrics::counter!(m::REQS_REFUSED_TOTAL, "reason" => self.reason().as_str()).increment(1);
        RelayMessage::closed(sub_id, &self.message())
    }

    /// `["NOTICE", ...]`, counted in `sluice_notices_sent_total`.
    pub(super) fn notice(&self) -> String {
        metrics::counter!(m::NOTICES_SENT_TOTAL).increment(1);
        RelayMessage::notice(&self.message())
    }

    /// How a REQ's query ended when it did not reach EOSE.
    pub(super) fn of_query_end(end: &ReadEnd) -> Refusal {
        match end {
            ReadEnd::Refused(r) => Refusal::Throttled(*r),
            ReadEnd::Failed | ReadEnd::Eose { .. } | ReadEnd::Count { .. } => Refusal::QueryFailed,
        }
    }

    /// How a COUNT ended when it brought no count.
    pub(super) fn of_count_end(end: &ReadEnd) -> Refusal {
        match end {
            ReadEnd::Refused(r) => Refusal::Throttled(*r),
            ReadEnd::Failed | ReadEnd::Eose { .. } | ReadEnd::Count { .. } => Refusal::CountFailed,
        }
    }

    /// The answer to an EVENT the writer finished with (`None`: it stopped
    /// before answering): the accepted outcome's label and OK true message
    /// (empty, or `duplicate:` for an event the relay already had, which
    /// NIP-01 accepts with that note), or the refusal.
    pub(super) fn of_write(
        result: Option<&WriteResult>,
    ) -> Result<(&'static str, String), Refusal> {
        use WriteOutcome as W;
        match result {
            Some(Ok(o @ W::Duplicate)) => Ok((
                sluice_engine::writer::outcome_label(o),
                Reason::Duplicate.message("already have this event"),
            )),
            Some(Ok(o @ (W::Stored { .. } | W::Ephemeral))) => {
                Ok((sluice_engine::writer::outcome_label(o), String::new()))
            }
            Some(Ok(W::Superseded)) => Err(Refusal::Superseded),
            Some(Ok(W::Deleted)) => Err(Refusal::DeletedByAuthor),
            Some(Ok(W::Expired)) => Err(Refusal::Expired),
            Some(Ok(W::OutsideRetention)) => Err(Refusal::OutsideRetention),
            Some(Ok(W::Vanished)) => Err(Refusal::Vanished),
            Some(Err(WriteError::StoreFull)) => Err(Refusal::StoreFull),
            Some(Err(WriteError::DiskFull(why))) => Err(Refusal::DiskFull(why.clone())),
            Some(Err(WriteError::Store(_))) => Err(Refusal::StoreFailed),
            None => Err(Refusal::ShuttingDown),
        }
    }
}

/// Why a negentropy session (NIP-77) is answered `NEG-ERR`: a case of its
/// own, or the refusal its query met on the REQ path.
#[derive(Debug)]
pub(super) enum NegError {
    /// The connection holds [`super::neg::MAX_SESSIONS`] sessions.
    TooManySessions { max: usize },
    /// A NEG-OPEN whose first message is not hex.
    NotHex,
    /// The refusal of the REQ path (policy, buckets, scheduler, private
    /// kinds) that the session's query met.
    Refused(Refusal),
    /// A message the parser refused (`["NEG-OPEN", …]` of the wrong shape).
    BadMessage(String),
    /// More than `limits.max_negentropy_items` events match.
    TooManyItems { max: usize },
    /// The filter's query ran out of its scan budget.
    Truncated,
    /// The negentropy protocol failed on the client's message.
    Protocol(String),
    /// A NEG-MSG for a session this connection does not hold.
    Unknown,
    /// A NEG-MSG while the session's query still runs.
    Early,
}

impl NegError {
    /// The NIP-01 (NIP-77) prefix of each case.
    fn reason(&self) -> Reason {
        use NegError as N;
        match self {
            N::TooManySessions { .. } => Reason::RateLimited,
            N::Refused(r) => r.reason(),
            N::TooManyItems { .. } | N::Truncated => Reason::Blocked,
            N::NotHex | N::BadMessage(_) | N::Protocol(_) | N::Early => Reason::Invalid,
            N::Unknown => Reason::Closed,
        }
    }

    /// The human text after the prefix.
    fn detail(&self) -> Cow<'static, str> {
        use NegError as N;
        match self {
            N::TooManySessions { max } => {
                format!("too many negentropy sessions (max {max})").into()
            }
            N::NotHex => "message is not hex".into(),
            N::Refused(r) => r.detail(),
            N::BadMessage(text) | N::Protocol(text) => text.clone().into(),
            N::TooManyItems { max } => {
                format!("too many items to reconcile (max {max}); narrow the filter").into()
            }
            N::Truncated => "the filter matches more than one query may scan; narrow it".into(),
            N::Unknown => "no such negentropy session".into(),
            N::Early => "the session is still reading its events".into(),
        }
    }

    /// The label of `sluice_negentropy_errors_total`.
    fn label(&self) -> &'static str {
        use NegError as N;
        match self {
            N::TooManySessions { .. } => "sessions",
            N::NotHex | N::BadMessage(_) => "invalid",
            N::Refused(_) => "refused",
            N::TooManyItems { .. } => "too_many_items",
            N::Truncated => "truncated",
            N::Protocol(_) => "protocol",
            N::Unknown => "unknown",
            N::Early => "early",
        }
    }

    /// Whether the answer asks the client to authenticate.
    pub(super) fn asks_auth(&self) -> bool {
        self.reason() == Reason::AuthRequired
    }

    /// `["NEG-ERR", sub_id, ...]`, counted in
    /// `sluice_negentropy_errors_total`.
    pub(super) fn neg_err(&self, sub_id: &str) -> String {
        metrics::counter!(m::NEGENTROPY_ERRORS_TOTAL, "reason" => self.label()).increment(1);
        RelayMessage::neg_err(sub_id, &self.reason().message(&self.detail()))
    }
}

/// A plugin's message may carry its own NIP-01 prefix (strfry's plugins
/// write `"blocked: ..."`): it is kept, not doubled; without one, `blocked:`.
fn plugin_prefix(msg: &str) -> (Reason, &str) {
    for reason in [
        Reason::Blocked,
        Reason::RateLimited,
        Reason::Invalid,
        Reason::Restricted,
        Reason::Pow,
        Reason::Error,
        Reason::AuthRequired,
    ] {
        if let Some(rest) = msg
            .strip_prefix(reason.as_str())
            .and_then(|r| r.strip_prefix(':'))
        {
            return (reason, rest.trim_start());
        }
    }
    (Reason::Blocked, msg)
}

impl From<sluice_throttle::RateLimited> for Refusal {
    fn from(r: sluice_throttle::RateLimited) -> Refusal {
        Refusal::Throttled(r)
    }
}

impl From<QueryError> for Refusal {
    /// Logs a store error: the client only learns the query failed.
    fn from(e: QueryError) -> Refusal {
        match e {
            QueryError::Refused(r) => Refusal::Throttled(r),
            QueryError::Closed => Refusal::ShuttingDown,
            QueryError::Store(e) => {
                tracing::warn!(error = %e, "query failed");
                Refusal::QueryFailed
            }
        }
    }
}

impl From<sluice_engine::writer::SubmitError> for Refusal {
    fn from(e: sluice_engine::writer::SubmitError) -> Refusal {
        match e {
            sluice_engine::writer::SubmitError::QueueFull => Refusal::WriterBusy,
            sluice_engine::writer::SubmitError::Closed => Refusal::ShuttingDown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each NEG-ERR answer, word for word, and its metric label.
    #[test]
    fn neg_errors_keep_their_prefix_wording_and_label() {
        let cases = [
            (
                NegError::TooManySessions { max: 4 },
                "rate-limited: too many negentropy sessions (max 4)",
                "sessions",
            ),
            (NegError::NotHex, "invalid: message is not hex", "invalid"),
            (
                NegError::Refused(Refusal::NoFilters),
                "invalid: at least one filter is required",
                "refused",
            ),
            (
                NegError::Refused(Refusal::QueryFailed),
                "error: could not run the query",
                "refused",
            ),
            (
                NegError::BadMessage("NEG-MSG takes one message".into()),
                "invalid: NEG-MSG takes one message",
                "invalid",
            ),
            (
                NegError::TooManyItems { max: 10 },
                "blocked: too many items to reconcile (max 10); narrow the filter",
                "too_many_items",
            ),
            (
                NegError::Truncated,
                "blocked: the filter matches more than one query may scan; narrow it",
                "truncated",
            ),
            (
                NegError::Protocol("message is not hex".into()),
                "invalid: message is not hex",
                "protocol",
            ),
            (
                NegError::Unknown,
                "closed: no such negentropy session",
                "unknown",
            ),
            (
                NegError::Early,
                "invalid: the session is still reading its events",
                "early",
            ),
        ];
        for (error, text, label) in cases {
            assert_eq!(
                error.neg_err("s"),
                RelayMessage::neg_err("s", text),
                "{error:?}"
            );
            assert_eq!(error.label(), label, "{error:?}");
        }
        assert!(NegError::Refused(Refusal::AuthRequired("x")).asks_auth());
    }
}
