//! NIP-42 on one connection: the challenge, AUTH events, the pubkeys the
//! connection has proven, and what depends on them: NIP-70 protected events
//! and who may read private messages.
//!
//! Invariants:
//! - The challenge is 16 random bytes, one per connection, sent at most
//!   once: at connect (`auth.challenge_on_connect`) or with the first
//!   answer that asks for authentication.
//! - A pubkey is added only after its AUTH event passed every check of
//!   [`sluice_proto::auth::check_auth_event`] and its signature; a
//!   connection holds at most `auth.max_pubkeys_per_connection`.
//! - The readers (private kinds and pubkeys) the query path and the live
//!   index see are replaced as a whole when a pubkey is added, so a private
//!   message is checked against one consistent set.

use std::sync::Arc;

use sluice_proto::auth::{AuthCheck, check_auth_event};
use sluice_proto::{Event, Readers, RelayMessage};

use super::out::{Out, Step};
use super::refusal::Refusal;
use super::{Session, id_hex};
use crate::metrics_names as m;

/// One connection's authentication state.
pub(super) struct AuthState {
    /// 16 random bytes, sent as hex.
    challenge: [u8; 16],
    /// The challenge has been sent.
    sent: bool,
    /// Counts this connection in `sluice_connections_authenticated` once it
    /// has a pubkey.
    counted: Option<sluice_engine::gauge::GaugeGuard>,
    /// Who may read private messages here; shared with running queries
    /// and the live index (and, until an AUTH, with every connection
    /// that has none).
    readers: Arc<Readers>,
}

impl AuthState {
    pub(super) fn new(anonymous: &Arc<Readers>) -> AuthState {
        let mut challenge = [0u8; 16];
        // A failing OS random source leaves the bytes zero: the challenge is
        // then predictable but still per-connection in its use.
        if getrandom::fill(&mut challenge).is_err() {
            tracing::warn!("no OS randomness for an AUTH challenge");
        }
        AuthState {
            challenge,
            sent: false,
            counted: None,
            readers: anonymous.clone(),
        }
    }

    fn challenge(&self) -> String {
        hex::encode(self.challenge)
    }

    pub(super) fn pubkeys(&self) -> &[[u8; 32]] {
        self.readers.pubkeys()
    }

    pub(super) fn readers(&self) -> &Arc<Readers> {
        &self.readers
    }

    pub(super) fn is_authenticated_as(&self, pubkey: &[u8; 32]) -> bool {
        self.readers.pubkeys().contains(pubkey)
    }
}

impl Session {
    /// Sends this connection's challenge if it has not been sent (and AUTH
    /// is offered).
    pub(super) async fn send_challenge(&mut self, out: &mut Out<'_>) -> Step {
        if !self.st.auth.enabled || self.auth.sent {
            return Ok(());
        }
        self.auth.sent = true;
        out.send(RelayMessage::auth(&self.auth.challenge())).await
    }

    /// Answers a refusal that asks the client to authenticate: the
    /// challenge first if it was not sent yet, then the refusal.
    pub(super) async fn send_asking_auth(&mut self, out: &mut Out<'_>, answer: String) -> Step {
        self.send_challenge(out).await?;
        out.send(answer).await
    }

    /// An AUTH message: checked, and on success its pubkey joins this
    /// connection's. Always answered with one OK.
    pub(super) async fn on_auth(&mut self, out: &mut Out<'_>, ev: Box<Event>) -> Step {
        let id = id_hex(&ev.id);
        let answer = match self.check_auth(&ev) {
            Ok(()) => {
                metrics::counter!(m::AUTH_TOTAL, "result" => "ok").increment(1);
                tracing::debug!(peer = %self.ip, pubkey = %id_hex(&ev.pubkey), "authenticated");
                RelayMessage::ok(&id, true, "")
            }
            Err(refusal) => {
                metrics::counter!(m::AUTH_TOTAL, "result" => refusal.reason().as_str())
                    .increment(1);
                RelayMessage::ok(&id, false, &refusal.message())
            }
        };
        out.send(answer).await
    }

    fn check_auth(&mut self, ev: &Event) -> Result<(), Refusal> {
        let cfg = &self.st.auth;
        if !cfg.enabled {
            return Err(Refusal::AuthUnsupported);
        }
        if !self.auth.sent {
            return Err(Refusal::Invalid("no challenge was sent yet".into()));
        }
        let challenge = self.auth.challenge();
        let check = AuthCheck {
            challenge: &challenge,
            relay_urls: &cfg.relay_urls,
            host: self.host(),
            now: sluice_engine::clock::unix_now(),
            max_skew_secs: cfg.max_skew_secs,
        };
        check_auth_event(ev, &check).map_err(|e| Refusal::Invalid(e.to_string()))?;
        ev.verify_cached(super::keys(&mut super::extra(&mut self.extra).keys))
            .map_err(|e| Refusal::Invalid(e.to_string()))?;
        if self.auth.is_authenticated_as(&ev.pubkey) {
            return Ok(());
        }
        let max = cfg.max_pubkeys_per_connection;
        if self.auth.pubkeys().len() >= max {
            return Err(Refusal::TooManyPubkeys { max });
        }
        let mut pubkeys = self.auth.pubkeys().to_vec();
        pubkeys.push(ev.pubkey);
        // A full reader (another node of the cluster, a backup) sees every
        // private event: nothing is private to it.
        let private = if cfg.any_full_reader(&pubkeys) {
            Vec::new()
        } else {
            cfg.private_kinds.clone()
        };
        let readers = Arc::new(Readers::new(private, pubkeys));
        self.live.set_readers(readers.clone());
        self.auth.readers = readers;
        self.auth.counted.get_or_insert_with(|| {
            sluice_engine::gauge::GaugeGuard::hold(m::CONNECTIONS_AUTHENTICATED)
        });
        // Its tier: a listed one, else the one its distance in the web of
        // trust gives it (its reads and requests are charged there).
        let trust = self.st.engine.trust();
        let principal =
            self.st
                .engine
                .limiter()
                .principal_with(self.ip, self.auth.pubkeys(), |p| trust.tier_of(p));
        metrics::counter!(m::AUTH_TIER_TOTAL, "tier" => principal.tier.name).increment(1);
        self.extra().principal = Some(principal);
        Ok(())
    }

    /// A REQ or COUNT whose filters ask only for private kinds, from a
    /// connection that has not authenticated: `auth-required:` rather than
    /// an answer that is silently empty.
    pub(super) fn check_private_read(
        &self,
        filters: &[sluice_proto::Filter],
    ) -> Result<(), Refusal> {
        let readers = &self.auth.readers;
        if readers.pubkeys().is_empty()
            && filters
                .iter()
                .any(|f| readers.asks_only_private(f.kinds.as_deref()))
        {
            return Err(Refusal::AuthRequired(
                "private messages are served only to their authenticated parties",
            ));
        }
        Ok(())
    }
}
