//! The operator's policy: who may connect, write and read, and which events
//! are taken, before any storage or query.
//!
//! Two sources, merged into one [`Rules`] snapshot: the `[policy]` section
//! of the config (static) and the runtime entries of the store's `policy`
//! table (NIP-86 changes, persisted by the writer, applied at once and
//! after restarts). The hot path reads an `Arc<Rules>` (one read lock, no
//! store access); a change builds a new snapshot.
//!
//! Order of the checks of an EVENT (first match answers): blocked address,
//! banned event id, banned author or authenticated pubkey (`blocked:`),
//! kind denied or not in the allowed kinds (`blocked:`), larger than its
//! kind's maximum (`invalid:`), members-only without a member
//! (`auth-required:` when nobody is authenticated, else `restricted:`).
//! A REQ/COUNT: blocked address, then read-restricted without a member.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, PoisonError, RwLock};

use serde::{Deserialize, Serialize};
use sluice_proto::{Event, Reason, hex32};

/// The `[policy]` section.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Pubkeys (hex) whose events are refused and who may not write.
    pub deny_pubkeys: Vec<String>,
    /// Members (hex): with `members_only`/`read_restricted`, who may write
    /// or read.
    pub allow_pubkeys: Vec<String>,
    /// Addresses or CIDR blocks refused at connect.
    pub deny_ips: Vec<String>,
    /// When not empty, only these kinds are taken.
    pub allow_kinds: Vec<u16>,
    /// Kinds never taken.
    pub deny_kinds: Vec<u16>,
    /// Largest event (its JSON, bytes) per kind, e.g. `{ "0" = 8192 }`.
    pub max_event_bytes_by_kind: BTreeMap<String, usize>,
    /// Only members (the author, or an authenticated pubkey, in the allowed
    /// pubkeys) may write. NIP-11 `restricted_writes`.
    pub members_only: bool,
    /// Only authenticated members may REQ or COUNT. NIP-11 `auth_required`.
    pub read_restricted: bool,
    /// Pubkeys (hex) allowed to use the NIP-86 management API.
    pub admin_pubkeys: Vec<String>,
    /// A write-policy program speaking strfry's plugin protocol.
    pub plugin: crate::plugin::PluginConfig,
}

impl PolicyConfig {
    pub fn validate(&self) -> Result<(), String> {
        self.plugin.validate()?;
        for (key, list) in [
            ("policy.deny_pubkeys", &self.deny_pubkeys),
            ("policy.allow_pubkeys", &self.allow_pubkeys),
            ("policy.admin_pubkeys", &self.admin_pubkeys),
        ] {
            for p in list {
                if hex32::decode::<32>(p).is_none() {
                    return Err(format!("{key}: {p:?} is not 64 lowercase hex characters"));
                }
            }
        }
        for ip in &self.deny_ips {
            IpNet::parse(ip)
                .ok_or_else(|| format!("policy.deny_ips: {ip:?} is not an address or CIDR"))?;
        }
        for k in self.max_event_bytes_by_kind.keys() {
            k.parse::<u16>()
                .map_err(|_| format!("policy.max_event_bytes_by_kind: {k:?} is not a kind"))?;
        }
        Ok(())
    }

    pub fn admins(&self) -> Vec<[u8; 32]> {
        self.admin_pubkeys
            .iter()
            .filter_map(|p| hex32::decode(p))
            .collect()
    }
}

/// An address or a CIDR block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    bits: u8,
}

impl IpNet {
    pub fn parse(s: &str) -> Option<IpNet> {
        let (a, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b.parse::<u8>().ok()?)),
            None => (s, None),
        };
        let addr: IpAddr = a.trim().parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(max);
        (bits <= max).then_some(IpNet { addr, bits })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.bits)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.bits))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for IpNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let max = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.bits == max {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.bits)
        }
    }
}

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
pub struct Rules {
    deny_pubkeys: HashMap<[u8; 32], String>,
    allow_pubkeys: HashMap<[u8; 32], String>,
    banned_events: HashMap<[u8; 32], String>,
    allow_kinds: BTreeSet<u16>,
    deny_kinds: BTreeSet<u16>,
    blocked_ips: Vec<(IpNet, String)>,
    max_bytes_by_kind: HashMap<u16, usize>,
    members_only: bool,
    read_restricted: bool,
    /// NIP-86 `changerelayname` / `changerelaydescription`.
    pub name: Option<String>,
    pub description: Option<String>,
}

impl Rules {
    /// The config's rules, then the runtime entries over them.
    pub fn build(cfg: &PolicyConfig, runtime: &[(String, String)]) -> Rules {
        let mut r = Rules {
            members_only: cfg.members_only,
            read_restricted: cfg.read_restricted,
            allow_kinds: cfg.allow_kinds.iter().copied().collect(),
            deny_kinds: cfg.deny_kinds.iter().copied().collect(),
            ..Rules::default()
        };
        for p in cfg.deny_pubkeys.iter().filter_map(|p| hex32::decode(p)) {
            r.deny_pubkeys.insert(p, "config".into());
        }
        for p in cfg.allow_pubkeys.iter().filter_map(|p| hex32::decode(p)) {
            r.allow_pubkeys.insert(p, "config".into());
        }
        for n in cfg.deny_ips.iter().filter_map(|s| IpNet::parse(s)) {
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
                    if let Some(n) = IpNet::parse(item) {
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

    pub fn ip_blocked(&self, ip: IpAddr) -> bool {
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

/// The live policy: the config, the runtime entries and the snapshot
/// built from both.
#[derive(Default)]
pub struct Policy {
    inner: RwLock<PolicyState>,
}

#[derive(Default)]
struct PolicyState {
    cfg: PolicyConfig,
    admins: Vec<[u8; 32]>,
    /// The store's entries, in key order.
    runtime: BTreeMap<String, String>,
    rules: Arc<Rules>,
}

impl PolicyState {
    fn rebuild(&mut self) {
        let runtime: Vec<(String, String)> = self
            .runtime
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self.rules = Arc::new(Rules::build(&self.cfg, &runtime));
    }
}

impl Policy {
    /// The current snapshot.
    pub fn rules(&self) -> Arc<Rules> {
        self.inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .rules
            .clone()
    }

    /// Replaces the config and every runtime entry.
    pub fn load(&self, cfg: PolicyConfig, runtime: Vec<(String, String)>) {
        let mut st = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        st.admins = cfg.admins();
        st.cfg = cfg;
        st.runtime = runtime.into_iter().collect();
        st.rebuild();
    }

    /// Replaces the config (a reload), keeping the runtime entries and
    /// the running plugin's settings. Returns whether the new plugin
    /// settings differ from the running ones (they need a restart).
    pub fn reload(&self, mut cfg: PolicyConfig) -> bool {
        let mut st = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        let plugin_changed = st.cfg.plugin != cfg.plugin;
        cfg.plugin = st.cfg.plugin.clone();
        st.admins = cfg.admins();
        st.cfg = cfg;
        st.rebuild();
        plugin_changed
    }

    /// Applies one runtime entry the store has made durable.
    pub fn set(&self, key: String, value: Option<String>) {
        let mut st = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        match value {
            Some(v) => st.runtime.insert(key, v),
            None => st.runtime.remove(&key),
        };
        st.rebuild();
    }

    pub fn is_admin(&self, pubkey: &[u8; 32]) -> bool {
        self.inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .admins
            .contains(pubkey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(sk: u8, kind: u16, content: &str) -> Event {
        Event::sign(&[sk; 32], 1, kind, vec![], content)
    }

    fn pk(sk: u8) -> [u8; 32] {
        sluice_proto::event::public_key_of(&[sk; 32])
    }

    #[test]
    fn a_reload_replaces_the_config_and_keeps_runtime_entries_and_the_running_plugin() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let p = Policy::default();
        let running = crate::plugin::PluginConfig {
            command: "/bin/cat".into(),
            ..Default::default()
        };
        p.load(
            PolicyConfig {
                plugin: running.clone(),
                admin_pubkeys: vec![hex32::encode(&pk(5))],
                ..PolicyConfig::default()
            },
            vec![("deny_kind:3".into(), String::new())],
        );
        p.set("deny_kind:4".into(), Some(String::new()));
        let denied = |p: &Policy, kind| p.rules().check_event(&ev(1, kind, "x"), ip, &[]).is_err();
        assert!(!denied(&p, 7));
        let changed = p.reload(PolicyConfig {
            deny_kinds: vec![7],
            admin_pubkeys: vec![hex32::encode(&pk(6))],
            ..PolicyConfig::default()
        });
        assert!(changed, "the plugin's settings changed");
        assert!(denied(&p, 7), "the new config applies");
        assert!(denied(&p, 3) && denied(&p, 4), "runtime entries stay");
        assert!(!denied(&p, 1));
        assert!(p.is_admin(&pk(6)) && !p.is_admin(&pk(5)));
        assert_eq!(p.inner.read().unwrap().cfg.plugin, running);
        // The same plugin settings again: nothing to restart.
        assert!(!p.reload(PolicyConfig {
            plugin: running,
            ..PolicyConfig::default()
        }));
        assert!(!denied(&p, 7));
    }

    #[test]
    fn each_rule_refuses_with_its_prefix_in_order() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let cfg = PolicyConfig {
            deny_pubkeys: vec![hex32::encode(&pk(2))],
            allow_pubkeys: vec![hex32::encode(&pk(3))],
            deny_ips: vec!["192.168.0.0/16".into()],
            allow_kinds: vec![0, 1, 3],
            max_event_bytes_by_kind: [("0".to_string(), 400)].into(),
            ..PolicyConfig::default()
        };
        cfg.validate().unwrap();
        let runtime = vec![
            (
                format!("ban_event:{}", ev(1, 1, "bad").id_hex()),
                "spam".into(),
            ),
            ("deny_kind:3".into(), String::new()),
        ];
        let r = Rules::build(&cfg, &runtime);
        let deny =
            |e: &Event, authed: &[[u8; 32]]| r.check_event(e, ip, authed).err().map(|d| d.reason);
        assert_eq!(deny(&ev(1, 1, "ok"), &[]), None);
        assert_eq!(
            r.check_event(&ev(1, 1, "ok"), "192.168.4.4".parse().unwrap(), &[])
                .unwrap_err()
                .reason,
            Reason::Blocked
        );
        assert_eq!(deny(&ev(1, 1, "bad"), &[]), Some(Reason::Blocked));
        assert_eq!(deny(&ev(2, 1, "x"), &[]), Some(Reason::Blocked));
        assert_eq!(
            deny(&ev(1, 1, "x"), &[pk(2)]),
            Some(Reason::Blocked),
            "banned session"
        );
        assert_eq!(
            deny(&ev(1, 7, "x"), &[]),
            Some(Reason::Blocked),
            "not allowed"
        );
        assert_eq!(
            deny(&ev(1, 3, "x"), &[]),
            Some(Reason::Blocked),
            "denied at runtime"
        );
        assert_eq!(
            deny(&ev(1, 0, &"x".repeat(300)), &[]),
            Some(Reason::Invalid)
        );

        let members = Rules::build(
            &PolicyConfig {
                members_only: true,
                read_restricted: true,
                ..cfg.clone()
            },
            &[],
        );
        let m = |e: &Event, authed: &[[u8; 32]]| {
            members.check_event(e, ip, authed).err().map(|d| d.reason)
        };
        assert_eq!(m(&ev(1, 1, "x"), &[]), Some(Reason::AuthRequired));
        assert_eq!(m(&ev(1, 1, "x"), &[pk(4)]), Some(Reason::Restricted));
        assert_eq!(
            m(&ev(1, 1, "x"), &[pk(3)]),
            None,
            "a member publishes another's event"
        );
        assert_eq!(m(&ev(3, 1, "x"), &[]), None, "a member's own event");
        assert_eq!(
            members.check_read(ip, &[]).unwrap_err().reason,
            Reason::AuthRequired
        );
        assert_eq!(
            members.check_read(ip, &[pk(4)]).unwrap_err().reason,
            Reason::Restricted
        );
        assert!(members.check_read(ip, &[pk(3)]).is_ok());
    }

    #[test]
    fn cidrs_match_by_prefix_and_bad_config_is_named() {
        let n = IpNet::parse("10.1.0.0/16").unwrap();
        assert!(n.contains("10.1.200.3".parse().unwrap()));
        assert!(!n.contains("10.2.0.1".parse().unwrap()));
        assert!(n.contains("::ffff:10.1.0.1".parse().unwrap()));
        let v6 = IpNet::parse("2001:db8::/32").unwrap();
        assert!(v6.contains("2001:db8:1::1".parse().unwrap()));
        assert!(IpNet::parse("10.0.0.1/33").is_none());
        assert_eq!(IpNet::parse("1.2.3.4").unwrap().to_string(), "1.2.3.4");
        let bad = PolicyConfig {
            deny_ips: vec!["nope".into()],
            ..PolicyConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("policy.deny_ips"));
    }
}
