//! The rules snapshot an EVENT, REQ or COUNT is checked against, built
//! from `[policy]` and the store's runtime entries.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use sluice_proto::{Event, Reason, hex32};
use sluice_throttle::IpBlock;

use super::config::PolicyConfig;

/// Why the policy says no: the NIP-01 prefix and the words after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub reason: Reason,
    pub message: String,
}

impl Denial {
    fn new(reason: Reason, message: impl Into<String>) -> Denial {
        Denial {
            reason,
            message: message.into(),
        }
    }
}

/// The runtime lists (`<list>:<item>` keys of the store's policy table).
pub mod list {
    pub const BAN_PUBKEY: &str = "ban_pubkey";
    pub const ALLOW_PUBKEY: &str = "allow_pubkey";
    pub const BAN_EVENT: &str = "ban_event";
    pub const ALLOW_KIND: &str = "allow_kind";
    pub const DENY_KIND: &str = "deny_kind";
    pub const BLOCK_IP: &str = "block_ip";
    pub const RELAY: &str = "relay";
}

/// One snapshot of every rule, static and runtime.
#[derive(Debug, Clone, Default)]
pub struct AccessRules {
    deny_pubkeys: HashMap<[u8; 32], String>,
    allow_pubkeys: HashMap<[u8; 32], String>,
    banned_events: HashMap<[u8; 32], String>,
    allow_kinds: BTreeSet<u16>,
    deny_kinds: BTreeSet<u16>,
    blocked_ips: Vec<(IpBlock, String)>,
    max_bytes_by_kind: HashMap<u16, usize>,
    members_only: bool,
    read_restricted: bool,
    /// NIP-86 `changerelayname` / `changerelaydescription`.
    pub name: Option<String>,
    pub description: Option<String>,
}

impl AccessRules {
    /// The config's rules, then the runtime entries over them.
    pub fn build(cfg: &PolicyConfig, runtime: &[(String, String)]) -> AccessRules {
        let mut r = AccessRules {
            members_only: cfg.members_only,
            read_restricted: cfg.read_restricted,
            allow_kinds: cfg.allow_kinds.iter().copied().collect(),
            deny_kinds: cfg.deny_kinds.iter().copied().collect(),
            ..AccessRules::default()
        };
        for p in cfg.deny_pubkeys.iter().filter_map(|p| hex32::decode(p)) {
            r.deny_pubkeys.insert(p, "config".into());
        }
        for p in cfg.allow_pubkeys.iter().filter_map(|p| hex32::decode(p)) {
            r.allow_pubkeys.insert(p, "config".into());
        }
        for n in cfg.deny_ips.iter().filter_map(|s| IpBlock::parse(s).ok()) {
            r.blocked_ips.push((n, "config".into()));
        }
        for (k, v) in &cfg.max_event_bytes_by_kind {
            if let Ok(k) = k.parse() {
                r.max_bytes_by_kind.insert(k, *v);
            }
        }
        for (key, value) in runtime {
            let Some((list, item)) = key.split_once(':') else {
                continue;
            };
            let why = value.clone();
            match list {
                list::BAN_PUBKEY => {
                    if let Some(p) = hex32::decode(item) {
                        r.deny_pubkeys.insert(p, why);
                    }
                }
                list::ALLOW_PUBKEY => {
                    if let Some(p) = hex32::decode(item) {
                        r.allow_pubkeys.insert(p, why);
                    }
                }
                list::BAN_EVENT => {
                    if let Some(id) = hex32::decode(item) {
                        r.banned_events.insert(id, why);
                    }
                }
                list::ALLOW_KIND => {
                    if let Ok(k) = item.parse() {
                        r.deny_kinds.remove(&k);
                        r.allow_kinds.insert(k);
                    }
                }
                list::DENY_KIND => {
                    if let Ok(k) = item.parse() {
                        r.allow_kinds.remove(&k);
                        r.deny_kinds.insert(k);
                    }
                }
                list::BLOCK_IP => {
                    if let Ok(n) = IpBlock::parse(item) {
                        r.blocked_ips.push((n, why));
                    }
                }
                list::RELAY if item == "name" => r.name = Some(why),
                list::RELAY if item == "description" => r.description = Some(why),
                _ => {}
            }
        }
        r
    }

    /// Whether `ip` is in a denied or blocked block. Made canonical here
    /// too (an IPv4-mapped address is its IPv4 one): the server's are
    /// already, but a mirror's peer address does not pass through its
    /// accept.
    pub fn ip_blocked(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.blocked_ips.iter().any(|(n, _)| n.contains(ip))
    }

    fn is_member(&self, pubkeys: impl IntoIterator<Item = [u8; 32]>) -> bool {
        pubkeys
            .into_iter()
            .any(|p| self.allow_pubkeys.contains_key(&p))
    }

    /// May this EVENT be taken from `ip`, on a connection authenticated as
    /// `authed`? See the module docs for the order.
    pub fn check_event(&self, ev: &Event, ip: IpAddr, authed: &[[u8; 32]]) -> Result<(), Denial> {
        if self.ip_blocked(ip) {
            return Err(Denial::new(Reason::Blocked, "your address is blocked"));
        }
        if self.banned_events.contains_key(&ev.id) {
            return Err(Denial::new(Reason::Blocked, "this event is banned"));
        }
        if self.deny_pubkeys.contains_key(&ev.pubkey)
            || authed.iter().any(|p| self.deny_pubkeys.contains_key(p))
        {
            return Err(Denial::new(Reason::Blocked, "this pubkey is banned"));
        }
        if self.deny_kinds.contains(&ev.kind)
            || (!self.allow_kinds.is_empty() && !self.allow_kinds.contains(&ev.kind))
        {
            return Err(Denial::new(
                Reason::Blocked,
                format!("kind {} is not accepted here", ev.kind),
            ));
        }
        if let Some(max) = self.max_bytes_by_kind.get(&ev.kind)
            && ev.raw().len() > *max
        {
            return Err(Denial::new(
                Reason::Invalid,
                format!(
                    "event too large for kind {} ({} bytes, max {max})",
                    ev.kind,
                    ev.raw().len()
                ),
            ));
        }
        if self.members_only && !self.is_member(authed.iter().copied().chain([ev.pubkey])) {
            let reason = if authed.is_empty() {
                Reason::AuthRequired
            } else {
                Reason::Restricted
            };
            return Err(Denial::new(reason, "only members may publish here"));
        }
        Ok(())
    }

    /// May a connection from `ip`, authenticated as `authed`, REQ or COUNT?
    pub fn check_read(&self, ip: IpAddr, authed: &[[u8; 32]]) -> Result<(), Denial> {
        if self.ip_blocked(ip) {
            return Err(Denial::new(Reason::Blocked, "your address is blocked"));
        }
        if self.read_restricted && !self.is_member(authed.iter().copied()) {
            let reason = if authed.is_empty() {
                Reason::AuthRequired
            } else {
                Reason::Restricted
            };
            return Err(Denial::new(reason, "only members may read here"));
        }
        Ok(())
    }

    pub fn members_only(&self) -> bool {
        self.members_only
    }

    pub fn read_restricted(&self) -> bool {
        self.read_restricted
    }

    /// `(hex pubkey, reason)` of the banned pubkeys.
    pub fn banned_pubkeys(&self) -> Vec<(String, String)> {
        sorted_hex(&self.deny_pubkeys)
    }

    pub fn allowed_pubkeys(&self) -> Vec<(String, String)> {
        sorted_hex(&self.allow_pubkeys)
    }

    pub fn banned_events(&self) -> Vec<(String, String)> {
        sorted_hex(&self.banned_events)
    }

    pub fn allowed_kinds(&self) -> Vec<u16> {
        self.allow_kinds.iter().copied().collect()
    }

    pub fn blocked_ips(&self) -> Vec<(String, String)> {
        self.blocked_ips
            .iter()
            .map(|(n, why)| (n.to_string(), why.clone()))
            .collect()
    }
}

fn sorted_hex(m: &HashMap<[u8; 32], String>) -> Vec<(String, String)> {
    let mut v: Vec<_> = m
        .iter()
        .map(|(k, why)| (hex32::encode(k), why.clone()))
        .collect();
    v.sort();
    v
}
