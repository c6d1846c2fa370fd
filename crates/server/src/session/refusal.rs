//! Every way the session says no, in one type: each case knows its NIP-01
//! prefix ([`Reason`]) and its message, renders itself as the answer its
//! command gets (OK false for an EVENT, CLOSED for a REQ or COUNT, NOTICE
//! otherwise), and counts itself on /metrics as it renders.
//!
//! Invariant: the prefix of every refusal the session sends is chosen in
//! [`Refusal::reason`], and its wording in [`Refusal::detail`]; handlers
//! name the case, never a prefix. The one prefixed answer that is not a
//! refusal, OK true `duplicate:`, is chosen in [`Refusal::of_write`].

use std::borrow::Cow;

use sluice_engine::{QueryError, ReadEnd, WriteError, WriteOutcome, WriteResult};
use sluice_proto::{Reason, RelayMessage};

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
    /// `server.max_pending_writes` EVENTs of this connection await their OK.
    InFlight {
        max: usize,
    },
    /// A throttle layer (bucket, controller, read budget, query scheduler).
    Throttled(sluice_engine::Refusal),
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
    Policy(sluice_engine::Denial),
    /// The write-policy plugin rejected it, with its message.
    Plugin(String),
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
            R::Restricted(_) => Reason::Restricted,
            R::ProtectedWithoutAuth => Reason::Blocked,
            R::AuthUnsupported => Reason::Unsupported,
            R::Policy(d) => d.reason,
            R::Plugin(msg) => plugin_prefix(msg).0,
            R::UnknownType(_) => Reason::Unsupported,
            R::InFlight { .. }
            | R::Throttled(_)
            | R::WriterBusy
            | R::TooManySubscriptions { .. }
            | R::LiveOverflow => Reason::RateLimited,
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
            R::InFlight { max } => format!(
                "too many events in flight on this connection (max {max}); wait for their OKs"
            )
            .into(),
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
        if let Refusal::InFlight { .. } = self {
            metrics::counter!(m::EVENTS_REFUSED_IN_FLIGHT_TOTAL).increment(1);
        }
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
                sluice_engine::outcome_label(o),
                Reason::Duplicate.message("already have this event"),
            )),
            Some(Ok(o @ (W::Stored { .. } | W::Ephemeral))) => {
                Ok((sluice_engine::outcome_label(o), String::new()))
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

impl From<sluice_engine::Refusal> for Refusal {
    fn from(r: sluice_engine::Refusal) -> Refusal {
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

impl From<sluice_engine::SubmitError> for Refusal {
    fn from(e: sluice_engine::SubmitError) -> Refusal {
        match e {
            sluice_engine::SubmitError::QueueFull => Refusal::WriterBusy,
            sluice_engine::SubmitError::Closed => Refusal::ShuttingDown,
        }
    }
}
