//! EVENT ingest: the one pipeline every event to be stored passes,
//! whoever sent it. A client's session (`event.rs`) runs its steps with its
//! own client-only steps between them (its buckets and the write
//! controller's delay); a mirror bringing a peer's events (the
//! binary's `mirror.rs`) runs them all at once through [`admit_mirrored`].
//!
//! The order is fixed, cheapest refusal first:
//! 1. [`before_signature`]: the event's limits, the operator's policy
//!    (`AccessRules` snapshot), the web of trust's `deny`, the proof of work an
//!    outsider must carry and the outsiders' shared budget;
//! 2. (a client: its buckets, its class's budgets, the write verdict)
//! 3. [`after_signature`]: the signature, NIP-70, NIP-62's `relay` tag,
//!    and for a client its author's bucket and its distance's budget (after
//!    the signature: an unsigned claim must not spend someone else's
//!    budget);
//! 4. [`hand_on`]: the write-policy plugin, then the live fan-out (an
//!    ephemeral event) or the writer, with the event's [`Origin`] (the
//!    writer offers a stored event to every mirror but the one it came
//!    through).
//!
//! A mirror is charged to no client bucket (its peer's address is not a
//! client of this relay; its rate is bounded by its own window and the
//! writer's queue), but passes every other step.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use sluice_engine::access::{PluginVerdict, Source};
use sluice_engine::clock::unix_now;
use sluice_engine::mirror_tap::Origin;
use sluice_engine::writer::WriteResult;
use sluice_proto::{Event, EventLimits, KindClass, PubkeyCache, auth};
use sluice_throttle::budgets::AuthorClass;
use sluice_throttle::trust::WriteStanding;

use super::refusal::Refusal;
use crate::AppState;

/// Who sent an EVENT, as admission sees it.
pub(super) struct Sender<'a> {
    /// The client's address (a mirror: its peer's), for the policy's
    /// address rules and the plugin.
    pub(super) ip: IpAddr,
    /// The pubkeys proven on the connection (NIP-42); a mirror has none.
    pub(super) authed: &'a [[u8; 32]],
    /// The host the client connected to (NIP-62's `relay` tag).
    pub(super) host: Option<&'a str>,
    pub(super) origin: Origin,
}

/// How an EVENT handed on ended.
pub(super) enum Answer {
    /// The writer's outcome; `None` when it stopped before answering.
    Written(Option<WriteResult>),
    /// Refused before the writer (the write-policy plugin, or the writer's
    /// queue after the plugin accepted).
    Refused(Refusal),
    /// Taken without storing: the plugin's `shadowReject`, or an ephemeral
    /// event published after the plugin accepted it.
    Taken(&'static str),
}

impl Answer {
    /// The OK's outcome label and message, or the refusal.
    pub(super) fn result(self) -> Result<(&'static str, String), Refusal> {
        match self {
            Answer::Written(result) => Refusal::of_write(result.as_ref()),
            Answer::Refused(refusal) => Err(refusal),
            Answer::Taken(label) => Ok((label, String::new())),
        }
    }
}

/// The answer of an EVENT handed on.
pub(super) type AnswerFut = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// Where an admitted EVENT went.
pub(super) enum HandedOn {
    /// To the plugin or the writer: its answer comes later.
    Pending(AnswerFut),
    /// Published to live subscribers; nothing to wait for.
    Ephemeral,
}

/// The checks before the signature. Returns what the event's author
/// makes of it in the budget tree (docs/design.md#hierarchical-budgets),
/// for a client's own step.
pub(super) fn before_signature(
    st: &AppState,
    limits: &EventLimits,
    ev: &Event,
    from: &Sender<'_>,
) -> Result<AuthorClass, Refusal> {
    ev.check_limits(limits, unix_now())
        .map_err(|e| Refusal::Invalid(e.to_string()))?;
    st.engine
        .policy()
        .rules()
        .check_event(ev, from.ip, from.authed)
        .map_err(Refusal::Policy)?;
    // The web of trust and proof of work on the claimed author: a lookup
    // and a count of zero bits (the signature comes later).
    let standing = st.engine.trust().standing(&ev.pubkey, ev.kind);
    let difficulty = sluice_proto::pow::difficulty(ev);
    sluice_throttle::trust::before_signature(&standing, difficulty)?;
    st.engine.limiter().admit_outsider(&standing, difficulty)?;
    Ok(AuthorClass::of(&standing, difficulty))
}

/// The checks after any delay: the signature, NIP-70, NIP-62, and a
/// client's author bucket. Returns whether the author is an outsider of
/// the web of trust (its event waits to ride on the writer's next commit).
pub(super) fn after_signature(
    st: &AppState,
    ev: &Event,
    keys: &mut PubkeyCache,
    from: &Sender<'_>,
) -> Result<bool, Refusal> {
    ev.verify_cached(keys)
        .map_err(|e| Refusal::Invalid(e.to_string()))?;
    check_protected(st, ev, from.authed)?;
    check_vanish(st, ev, from.host)?;
    let standing = st.engine.trust().standing(&ev.pubkey, ev.kind);
    if from.origin == Origin::Client {
        st.engine
            .limiter()
            .admit_author(&ev.pubkey, ev.kind, &standing)?;
    }
    // With a web of trust, a stranger's event waits to ride on the
    // writer's next commit (strangers wait, the web does not).
    Ok(matches!(standing, WriteStanding::Outsider(_))
        && st.engine.trust().settings().trust.enabled())
}

/// NIP-70: a protected event is taken only from its author, authenticated
/// on the connection (a mirror authenticates as nobody: never from one).
fn check_protected(st: &AppState, ev: &Event, authed: &[[u8; 32]]) -> Result<(), Refusal> {
    if !auth::is_protected(ev) || authed.contains(&ev.pubkey) {
        return Ok(());
    }
    if !st.auth.enabled {
        return Err(Refusal::ProtectedWithoutAuth);
    }
    if authed.is_empty() {
        Err(Refusal::AuthRequired(
            "this event may only be published by its author",
        ))
    } else {
        Err(Refusal::Restricted(
            "this event may only be published by its author",
        ))
    }
}

/// NIP-62: a request to vanish must name this relay (its `relay` tag is
/// one of `auth.relay_urls`, or with none the host the client connected
/// to, or `ALL_RELAYS`); one meant for another relay is refused, so the
/// writer never applies it here.
fn check_vanish(st: &AppState, ev: &Event, host: Option<&str>) -> Result<(), Refusal> {
    if ev.kind != sluice_store::VANISH {
        return Ok(());
    }
    let names_us = ev.tags.iter().any(|t| {
        t.first().is_some_and(|n| n == "relay")
            && t.get(1).is_some_and(|url| {
                url == "ALL_RELAYS" || auth::relay_matches(url, &st.auth.relay_urls, host)
            })
    });
    if names_us {
        Ok(())
    } else {
        Err(Refusal::VanishElsewhere)
    }
}

/// Hands an admitted event on: the write policy answers first; the writer
/// (or the live fan-out) only after it accepted. Without a plugin an
/// ephemeral event is published at once. `lone`: the sender has no other
/// EVENT awaiting its answer.
pub(super) fn hand_on(
    st: &AppState,
    ev: Arc<Event>,
    from: &Sender<'_>,
    (admitted, lone, outsider): (Instant, bool, bool),
) -> Result<HandedOn, Refusal> {
    let origin = from.origin;
    if let Some(plugin) = st.engine.plugin() {
        let engine = st.engine.clone();
        let source = (from.ip, from.authed.first().copied());
        return Ok(HandedOn::Pending(Box::pin(async move {
            let verdict = plugin
                .check(
                    &ev,
                    Source {
                        ip: source.0,
                        authed: source.1.as_ref(),
                    },
                )
                .await;
            match verdict {
                PluginVerdict::Reject(msg) => Answer::Refused(Refusal::Plugin(msg)),
                PluginVerdict::ShadowReject => Answer::Taken("shadow_rejected"),
                PluginVerdict::Accept if KindClass::of(ev.kind) == KindClass::Ephemeral => {
                    engine.publish_ephemeral_from(ev, origin);
                    Answer::Taken("ephemeral")
                }
                PluginVerdict::Accept => {
                    match engine.submit(ev, admitted, origin, (lone, outsider)) {
                        Ok(rx) => Answer::Written(rx.await.ok()),
                        Err(e) => Answer::Refused(e.into()),
                    }
                }
            }
        })));
    }
    if KindClass::of(ev.kind) == KindClass::Ephemeral {
        st.engine.publish_ephemeral_from(ev, origin);
        return Ok(HandedOn::Ephemeral);
    }
    let rx = st.engine.submit(ev, admitted, origin, (lone, outsider))?;
    Ok(HandedOn::Pending(Box::pin(async move {
        Answer::Written(rx.await.ok())
    })))
}

/// What became of an event a mirror brought in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorAnswer {
    /// `stored`, `duplicate`, `ephemeral`, `shadow_rejected` (taken), or
    /// `refused`.
    pub outcome: &'static str,
    /// The refusal's text as a client's OK false would carry it (empty when
    /// taken).
    pub message: String,
    /// Refused only because the writer's queue was full: the mirror waits
    /// and hands the event in again (backpressure, not a refusal).
    pub busy: bool,
}

impl MirrorAnswer {
    fn of(result: Result<(&'static str, String), Refusal>) -> MirrorAnswer {
        match result {
            Ok((outcome, _)) => MirrorAnswer {
                outcome,
                message: String::new(),
                busy: false,
            },
            Err(refusal) => MirrorAnswer {
                outcome: "refused",
                message: refusal.message(),
                busy: matches!(refusal, Refusal::WriterBusy),
            },
        }
    }
}

/// The answer of an event a mirror handed in.
pub type MirrorFut = Pin<Box<dyn Future<Output = MirrorAnswer> + Send>>;

/// Admission of an event a mirror brought from its peer (at `peer`): every
/// step of a client's EVENT (limits, policy, trust and proof of work,
/// signature, NIP-70, NIP-62, the write-policy plugin, the writer) but the
/// client's buckets and the write controller's delay, with `origin` (the
/// mirror's), so the writer never offers it back to that mirror. `keys`
/// caches parsed authors' keys for the mirror. The future answers after
/// the commit (or at once for a refusal or an ephemeral event).
pub fn admit_mirrored(
    st: &AppState,
    ev: Event,
    peer: IpAddr,
    origin: Origin,
    keys: &mut PubkeyCache,
) -> MirrorFut {
    let from = Sender {
        ip: peer,
        authed: &[],
        host: None,
        origin,
    };
    let front = st.front();
    let admitted = Instant::now();
    let handed = before_signature(st, &front.event_limits, &ev, &from)
        .and_then(|_| after_signature(st, &ev, keys, &from))
        .and_then(|outsider| hand_on(st, Arc::new(ev), &from, (admitted, false, outsider)));
    match handed {
        Ok(HandedOn::Pending(answer)) => {
            Box::pin(async move { MirrorAnswer::of(answer.await.result()) })
        }
        Ok(HandedOn::Ephemeral) => {
            let answer = MirrorAnswer::of(Ok(("ephemeral", String::new())));
            Box::pin(std::future::ready(answer))
        }
        Err(refusal) => Box::pin(std::future::ready(MirrorAnswer::of(Err(refusal)))),
    }
}
