//! NIP-42 authentication, NIP-70 protected events and who may read a
//! private message, as pure functions: the caller passes the clock, the
//! challenge it sent and the relay URLs it answers to, and verifies the
//! signature itself (with its key cache).
//!
//! - An AUTH event ([`check_auth_event`]) is kind 22242, carries the
//!   connection's challenge in a `challenge` tag and a `relay` tag naming
//!   this relay, and is dated within `max_skew_secs` of now.
//! - A protected event ([`is_protected`], NIP-70) has a tag `["-"]`: only
//!   its author, authenticated, may publish it.
//! - A private message ([`Readers::may_read`]) of one of the configured
//!   kinds (4, 1059 and 1060 by default) is served only to an
//!   authenticated pubkey that wrote it or is named in one of its `p` tags.

use crate::Event;

/// Kind of the NIP-42 authentication event.
pub const AUTH_KIND: u16 = 22242;

/// Why an AUTH event is refused (the text follows `invalid:`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("auth event must be kind 22242")]
    WrongKind,
    #[error("auth event has no challenge tag or the challenge is not this connection's")]
    WrongChallenge,
    #[error("auth event's relay tag does not name this relay")]
    WrongRelay,
    #[error("auth event's created_at is too far from now")]
    Stale,
}

/// What an AUTH event must match on this connection.
#[derive(Debug, Clone, Copy)]
pub struct AuthCheck<'a> {
    /// The challenge this connection was sent.
    pub challenge: &'a str,
    /// The relay URLs the operator configured; empty: the request's host.
    pub relay_urls: &'a [String],
    /// The `Host` header of the WebSocket upgrade, if any.
    pub host: Option<&'a str>,
    pub now: u64,
    pub max_skew_secs: u64,
}

/// Checks everything of an AUTH event but its signature.
pub fn check_auth_event(ev: &Event, c: &AuthCheck<'_>) -> Result<(), AuthError> {
    if ev.kind != AUTH_KIND {
        return Err(AuthError::WrongKind);
    }
    if ev.first_tag_value("challenge") != Some(c.challenge) {
        return Err(AuthError::WrongChallenge);
    }
    let relay = ev.first_tag_value("relay").ok_or(AuthError::WrongRelay)?;
    if !relay_matches(relay, c.relay_urls, c.host) {
        return Err(AuthError::WrongRelay);
    }
    if ev.created_at.abs_diff(c.now) > c.max_skew_secs {
        return Err(AuthError::Stale);
    }
    Ok(())
}

/// Whether a `relay` tag names this relay: equal to one of the configured
/// URLs once normalised (scheme, case, a trailing slash and the default
/// port do not matter), or, with none configured, naming the host the
/// client connected to (the port and path are not compared: a proxy in
/// front may change both). With neither, any URL is taken.
pub fn relay_matches(tag: &str, configured: &[String], host: Option<&str>) -> bool {
    let Some(tag_url) = Url::parse(tag) else {
        return false;
    };
    if !configured.is_empty() {
        return configured
            .iter()
            .filter_map(|u| Url::parse(u))
            .any(|u| u == tag_url);
    }
    match host {
        Some(h) => strip_port(&h.to_ascii_lowercase()) == strip_port(&tag_url.authority),
        None => true,
    }
}

/// A relay URL reduced to what identifies it.
#[derive(Debug, PartialEq, Eq)]
struct Url {
    secure: bool,
    /// Host and port, lower case, without a default port.
    authority: String,
    path: String,
}

impl Url {
    fn parse(s: &str) -> Option<Url> {
        let s = s.trim();
        let lower = s.to_ascii_lowercase();
        let (secure, rest) = if let Some(r) = lower.strip_prefix("wss://") {
            (true, r)
        } else if let Some(r) = lower.strip_prefix("ws://") {
            (false, r)
        } else if let Some(r) = lower.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = lower.strip_prefix("http://") {
            (false, r)
        } else {
            return None;
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return None;
        }
        let default_port = if secure { ":443" } else { ":80" };
        let authority = authority.strip_suffix(default_port).unwrap_or(authority);
        Some(Url {
            secure,
            authority: authority.to_owned(),
            path: path.trim_end_matches('/').to_owned(),
        })
    }
}

/// `host:port` → `host` (an IPv6 literal keeps its brackets).
fn strip_port(authority: &str) -> &str {
    if let Some(end) = authority.rfind(']') {
        return &authority[..=end];
    }
    match authority.rfind(':') {
        Some(i) => &authority[..i],
        None => authority,
    }
}

/// NIP-70: the event carries a `["-"]` tag.
pub fn is_protected(ev: &Event) -> bool {
    ev.tags.iter().any(|t| t.len() == 1 && t[0] == "-")
}

/// Who may read private messages on one connection: the private kinds and
/// the pubkeys the connection has authenticated as.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Readers {
    /// Sorted; empty: nothing is private.
    kinds: Vec<u16>,
    /// Authenticated pubkeys (a handful).
    pubkeys: Vec<[u8; 32]>,
}

impl Readers {
    pub fn new(mut kinds: Vec<u16>, pubkeys: Vec<[u8; 32]>) -> Readers {
        kinds.sort_unstable();
        kinds.dedup();
        Readers { kinds, pubkeys }
    }

    pub fn is_private(&self, kind: u16) -> bool {
        self.kinds.binary_search(&kind).is_ok()
    }

    pub fn pubkeys(&self) -> &[[u8; 32]] {
        &self.pubkeys
    }

    /// Whether an event this reader may see can be decided from its
    /// author and kind alone (no tags needed): not private, or written by
    /// one of the readers.
    pub fn may_read_header(&self, kind: u16, author: &[u8; 32]) -> bool {
        !self.is_private(kind) || self.pubkeys.contains(author)
    }

    /// Whether this reader may see `ev`: it is not of a private kind, or
    /// one of the authenticated pubkeys wrote it or is in a `p` tag.
    pub fn may_read(&self, ev: &Event) -> bool {
        self.may_read_header(ev.kind, &ev.pubkey)
            || (!self.pubkeys.is_empty()
                && ev.tags.iter().any(|t| {
                    t.len() >= 2
                        && t[0] == "p"
                        && crate::hex32::decode(&t[1])
                            .is_some_and(|p: [u8; 32]| self.pubkeys.contains(&p))
                }))
    }

    /// A filter that asks only for private kinds (its `kinds` are all
    /// private): answered `auth-required:` when nobody is authenticated,
    /// rather than silently empty.
    pub fn asks_only_private(&self, kinds: Option<&[u16]>) -> bool {
        !self.kinds.is_empty()
            && kinds.is_some_and(|k| !k.is_empty() && k.iter().all(|k| self.is_private(*k)))
    }
}

#[cfg(test)]
mod tests;
