//! Nostr protocol values for Sluice: events (which keep the exact JSON they
//! arrived as), canonical id hashing, BIP-340 signature checks, filters and
//! their matching, client and relay messages, kind classes and the NIP-01
//! reason prefixes.
//!
//! Architecture invariant: this crate is pure. It does no I/O, reads no clock
//! (callers pass `now` in) and knows nothing of tokio, LMDB or HTTP.

#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod auth;
pub mod bech32;
pub mod event;
pub mod filter;
pub mod hex32;
pub mod kind;
pub mod message;
pub mod pow;
pub mod reason;
pub mod search;

pub use auth::{AuthCheck, AuthError, Readers};
pub use event::{Event, EventError, Limits as EventLimits, PubkeyCache};
pub use filter::{Filter, FilterError, TagValue};
pub use kind::KindClass;
pub use message::{ClientMessage, MessageError, RelayMessage};
pub use reason::Reason;
pub use search::Search;
