//! The built-in landing page: what a person opening the relay's URL in a
//! browser reads. Rendered per request from the current `[relay]`,
//! `[limits]`, `[auth]`, the policy, retention and throttle settings, into
//! `assets/landing.html`; every value is escaped (`html.rs`).

use std::fmt::Write;

use sluice_engine::access::AccessRules;
use sluice_throttle::{Mode, ThrottleConfig};

use super::html::{bytes, duration, escape, push_pair};
use crate::config::{AuthConfig, LimitsConfig, RelayInfoConfig};

const TEMPLATE: &str = include_str!("assets/landing.html");

/// Where a NIP's text is.
const NIPS_URL: &str = "https://github.com/nostr-protocol/nips/blob/master/";

/// Everything the page shows, gathered by the handler.
pub struct Facts<'a> {
    pub relay: &'a RelayInfoConfig,
    pub limits: &'a LimitsConfig,
    pub auth: &'a AuthConfig,
    pub rules: &'a AccessRules,
    pub throttle: &'a ThrottleConfig,
    /// `[retention]`'s size target (0: none) and its NIP-11 rules.
    pub retention_target_bytes: u64,
    pub retention_rules: &'a [serde_json::Value],
    /// The difficulty asked of authors outside the web of trust now.
    pub pow_difficulty: u32,
    /// The URL clients connect to.
    pub url: String,
    /// Whether this visitor may open /status (the link is shown then).
    pub status_link: bool,
    /// Whether NIP-50 search is on (`[search] enabled`).
    pub search: bool,
}

/// The page.
pub fn render(f: &Facts<'_>) -> String {
    let name = f.rules.name.as_deref().unwrap_or(&f.relay.name);
    let description = f
        .rules
        .description
        .as_deref()
        .unwrap_or(&f.relay.description);
    let icon = if f.relay.icon.is_empty() {
        String::new()
    } else {
        format!(
            r#"<img class="icon" src="{}" alt="" width="64" height="64">"#,
            escape(&f.relay.icon)
        )
    };
    let status_link = if f.status_link {
        r#"<li><a href="/status">Live status</a></li>"#
    } else {
        ""
    };
    let values = [
        ("{{name}}", escape(name)),
        ("{{description}}", escape(description)),
        ("{{icon}}", icon),
        ("{{status_link}}", status_link.to_string()),
        ("{{url}}", escape(&f.url)),
        ("{{operator}}", operator(f.relay)),
        ("{{policy}}", policy(f)),
        ("{{limits}}", limits(f.limits)),
        ("{{rates}}", rates(f.throttle)),
        ("{{retention}}", retention(f)),
        ("{{nips}}", nips(f.auth, f.search)),
        ("{{version}}", escape(env!("CARGO_PKG_VERSION"))),
    ];
    fill(TEMPLATE, &values)
}

/// `template` with each `{{slot}}` replaced by its value, in one pass: a
/// value is never read again for slots (an operator's `{{name}}` in a
/// description stays text).
pub(super) fn fill(template: &str, values: &[(&str, String)]) -> String {
    let mut out = String::with_capacity(template.len() * 2);
    let mut rest = template;
    while let Some(at) = rest.find("{{") {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        match values.iter().find(|(slot, _)| rest.starts_with(slot)) {
            Some((slot, value)) => {
                out.push_str(value);
                rest = &rest[slot.len()..];
            }
            None => {
                out.push_str("{{");
                rest = &rest[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn operator(relay: &RelayInfoConfig) -> String {
    let mut out = String::new();
    if !relay.contact.is_empty() {
        let contact = &relay.contact;
        let link = if contact.starts_with("mailto:")
            || contact.starts_with("https://")
            || contact.starts_with("http://")
        {
            Some(contact.clone())
        } else if contact.contains('@') && !contact.contains(' ') {
            Some(format!("mailto:{contact}"))
        } else {
            None
        };
        let shown = contact.strip_prefix("mailto:").unwrap_or(contact);
        match link {
            Some(href) => {
                let _ = write!(
                    out,
                    r#"<dt>Contact</dt><dd><a href="{}">{}</a></dd>"#,
                    escape(&href),
                    escape(shown)
                );
            }
            None => push_pair(&mut out, "Contact", contact),
        }
    }
    if let Some(key) = sluice_proto::hex32::decode::<32>(&relay.pubkey) {
        let npub = sluice_proto::bech32::npub(&key);
        let _ = write!(
            out,
            r#"<dt>Public key</dt><dd><code id="npub" class="key">{npub}</code> <button type="button" class="copy" data-copy="npub" hidden>Copy</button></dd>"#
        );
    }
    if out.is_empty() {
        "<p>The operator has not published a contact.</p>".into()
    } else {
        format!("<dl>{out}</dl>")
    }
}

fn policy(f: &Facts<'_>) -> String {
    let mut items: Vec<String> = Vec::new();
    if f.rules.members_only() {
        items.push(
            "<strong>Members only</strong>: only the operator's members may publish here.".into(),
        );
    } else {
        items.push("Anyone may publish here, within the limits below.".into());
    }
    if f.pow_difficulty > 0 {
        items.push(format!(
            "Authors outside the operator's web of trust must add proof of work \
             (NIP-13) of at least {} bits.",
            f.pow_difficulty
        ));
    }
    if f.rules.read_restricted() {
        items.push("<strong>Reading requires authentication</strong> (NIP-42) as a member.".into());
    } else {
        items.push("Anyone may read public events.".into());
    }
    if !f.auth.private_kinds.is_empty() {
        let kinds: Vec<String> = f.auth.private_kinds.iter().map(u16::to_string).collect();
        items.push(format!(
            "<strong>Authentication required to read DMs</strong>: events of kinds {} \
             (direct messages, gift wraps) are served only to their author and the \
             people they name, once authenticated (NIP-42).",
            kinds.join(", ")
        ));
    }
    if f.auth.enabled {
        items.push("Clients may authenticate with NIP-42.".into());
    }
    let allowed = f.rules.allowed_kinds();
    if !allowed.is_empty() {
        let kinds: Vec<String> = allowed.iter().map(u16::to_string).collect();
        items.push(format!(
            "Only events of kinds {} are taken.",
            kinds.join(", ")
        ));
    }
    ul(&items)
}

fn limits(l: &LimitsConfig) -> String {
    let mut out = String::new();
    push_pair(
        &mut out,
        "Largest message",
        &bytes(l.max_message_bytes as u64),
    );
    push_pair(
        &mut out,
        "Largest event content",
        &bytes(l.max_content_bytes as u64),
    );
    push_pair(&mut out, "Tags per event", &l.max_event_tags.to_string());
    push_pair(
        &mut out,
        "Subscriptions per connection",
        &l.max_subscriptions.to_string(),
    );
    push_pair(
        &mut out,
        "Filters per subscription",
        &l.max_filters.to_string(),
    );
    push_pair(
        &mut out,
        "Events per query",
        &format!("{} (default {})", l.max_limit, l.default_limit),
    );
    push_pair(
        &mut out,
        "Timestamps",
        &if l.created_at_max_age_secs > 0 {
            format!(
                "at most {} ahead, at most {} old",
                duration(l.created_at_max_ahead_secs),
                duration(l.created_at_max_age_secs)
            )
        } else {
            format!("at most {} ahead", duration(l.created_at_max_ahead_secs))
        },
    );
    format!("<dl>{out}</dl>")
}

fn rates(t: &ThrottleConfig) -> String {
    if t.mode == Mode::Off {
        return "<p>No rate limits are enforced.</p>".into();
    }
    let c = &t.clients;
    let rate = |r: f64| {
        if r.fract() == 0.0 {
            format!("{r:.0}")
        } else {
            format!("{r}")
        }
    };
    let mut out = String::new();
    push_pair(
        &mut out,
        "Events",
        &format!(
            "{} per second per address, {} per second per author",
            rate(c.events_per_ip.rate_per_s),
            rate(c.events_per_pubkey.rate_per_s)
        ),
    );
    push_pair(
        &mut out,
        "Queries (REQ, COUNT)",
        &format!("{} per second per address", rate(c.reqs_per_ip.rate_per_s)),
    );
    push_pair(
        &mut out,
        "Connections",
        &format!("{} at once per address", c.max_connections_per_ip),
    );
    format!(
        "<dl>{out}</dl><p>Under load the relay slows the heaviest clients first; a \
         polite client is not held back.</p>"
    )
}

fn retention(f: &Facts<'_>) -> String {
    let mut items = Vec::new();
    if f.retention_target_bytes > 0 {
        items.push(format!(
            "The store is kept under {}: past it, the oldest events go first.",
            bytes(f.retention_target_bytes)
        ));
    }
    for rule in f.retention_rules {
        let kinds = match rule["kinds"].as_array() {
            Some(k) => {
                let k: Vec<String> = k.iter().map(|v| v.to_string()).collect();
                format!("Events of kinds {}", k.join(", "))
            }
            None => "Events".into(),
        };
        if let Some(t) = rule["time"].as_u64() {
            items.push(format!("{kinds} are kept {}.", duration(t)));
        }
        if let Some(n) = rule["count"].as_u64() {
            items.push(format!("{kinds}: the newest {n} of each author are kept."));
        }
    }
    if items.is_empty() {
        items.push(
            "Events are kept until their author deletes them (NIP-09) or they expire (NIP-40)."
                .into(),
        );
    }
    ul(&items)
}

fn nips(auth: &AuthConfig, search: bool) -> String {
    let mut out = String::new();
    for n in crate::nip11::supported_nips(auth, search) {
        let _ = write!(
            out,
            r#"<li><a href="{NIPS_URL}{n:02}.md">NIP-{n:02}</a> {}</li>"#,
            nip_title(n)
        );
    }
    out
}

fn nip_title(n: u16) -> &'static str {
    match n {
        1 => "Basic protocol",
        9 => "Event deletion",
        11 => "Relay information",
        13 => "Proof of work",
        40 => "Expiration",
        42 => "Authentication",
        45 => "Event counts",
        50 => "Search",
        62 => "Request to vanish",
        70 => "Protected events",
        77 => "Negentropy sync",
        86 => "Relay management",
        _ => "",
    }
}

/// `<ul>` of items already in HTML.
fn ul(items: &[String]) -> String {
    let mut out = String::from("<ul>");
    for i in items {
        let _ = write!(out, "<li>{i}</li>");
    }
    out.push_str("</ul>");
    out
}

#[cfg(test)]
mod tests;
