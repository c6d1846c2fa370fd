//! The NIP-11 relay information document, built from the config so every
//! limit the relay enforces is the one it advertises, and from the
//! operator's policy (name and description changed over NIP-86, members-only
//! writes, restricted reads) as it is when asked.

use serde_json::{Value, json};

use crate::config::{AuthConfig, LimitsConfig, RelayInfoConfig};

/// NIPs this relay implements in full, whatever the config (NIP-86
/// management is always served on the relay URL, see `crate::router`).
pub const SUPPORTED_NIPS: &[u16] = &[1, 9, 11, 13, 40, 45, 62, 77, 86];

/// NIPs offered when `auth.enabled` is on: AUTH and protected events.
pub const AUTH_NIPS: &[u16] = &[42, 70];

/// NIP-50 search, offered while `[search]` is on.
pub const SEARCH_NIP: u16 = 50;

/// The NIPs served with this `[auth]` and, with `search`, a full-text
/// index, in order.
pub fn supported_nips(auth: &AuthConfig, search: bool) -> Vec<u16> {
    let mut nips = SUPPORTED_NIPS.to_vec();
    if auth.enabled {
        nips.extend_from_slice(AUTH_NIPS);
    }
    if search {
        nips.push(SEARCH_NIP);
    }
    nips.sort_unstable();
    nips
}

pub fn document(
    info: &RelayInfoConfig,
    limits: &LimitsConfig,
    auth: &AuthConfig,
    policy: &sluice_engine::access::AccessRules,
    retention: &[Value],
    (min_pow_difficulty, search): (u32, bool),
) -> String {
    let nips = supported_nips(auth, search);
    let mut doc = json!({
        "name": policy.name.as_deref().unwrap_or(&info.name),
        "description": policy.description.as_deref().unwrap_or(&info.description),
        "software": "sluice",
        "version": env!("CARGO_PKG_VERSION"),
        "supported_nips": nips,
        "limitation": {
            "max_message_length": limits.max_message_bytes,
            "max_subscriptions": limits.max_subscriptions,
            "max_filters": limits.max_filters,
            "max_limit": limits.max_limit,
            "default_limit": limits.default_limit,
            "max_subid_length": limits.max_subid_length,
            "max_event_tags": limits.max_event_tags,
            "max_content_length": limits.max_content_bytes,
            "min_pow_difficulty": min_pow_difficulty,
            "auth_required": policy.read_restricted(),
            "payment_required": false,
            "restricted_writes": policy.members_only(),
            "created_at_upper_limit": limits.created_at_max_ahead_secs,
        },
    });
    // `created_at_max_age_secs = 0` is no lower limit: NIP-11 has no value
    // meaning that, so the field is left out (a 0 would read as "nothing
    // older than now").
    if limits.created_at_max_age_secs > 0 {
        doc["limitation"]["created_at_lower_limit"] = limits.created_at_max_age_secs.into();
    }
    if !retention.is_empty() {
        doc["retention"] = Value::Array(retention.to_vec());
    }
    for (key, value) in [
        ("pubkey", &info.pubkey),
        ("contact", &info.contact),
        ("icon", &info.icon),
    ] {
        if !value.is_empty() {
            doc[key] = Value::String(value.clone());
        }
    }
    doc.to_string()
}
