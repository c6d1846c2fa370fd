//! `[policy]` and `[policy.plugin]`, as the operator writes them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sluice_proto::hex32;

use sluice_throttle::{BlockError, IpBlock};

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
    pub plugin: PluginConfig,
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
            IpBlock::parse(ip).map_err(|e| match e {
                BlockError::Syntax => format!("policy.deny_ips: {ip:?} is not an address or CIDR"),
                e => format!("policy.deny_ips: {ip:?}: {e}"),
            })?;
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

/// `[policy.plugin]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PluginConfig {
    /// Program to run (empty: no plugin).
    pub command: String,
    pub args: Vec<String>,
    /// Longest wait for the program's answer to one event.
    pub timeout_ms: u64,
    /// Events waiting for the program, at most.
    pub queue: usize,
    /// When the program does not answer (timeout, queue full, not
    /// running): accept the event (`true`) or reject it (`false`).
    pub fail_open: bool,
    /// Wait before restarting a program that exited.
    pub restart_backoff_ms: u64,
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig {
            command: String::new(),
            args: Vec::new(),
            timeout_ms: 2_000,
            queue: 1_024,
            fail_open: false,
            restart_backoff_ms: 1_000,
        }
    }
}

impl PluginConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.timeout_ms == 0 || self.queue == 0 {
            return Err(
                "policy.plugin.timeout_ms and policy.plugin.queue must be at least 1".into(),
            );
        }
        Ok(())
    }
}
