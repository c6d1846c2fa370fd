//! The operator's policy: who may connect, write and read, and which events
//! are taken, before any storage or query.
//!
//! Two sources, merged into one [`AccessRules`] snapshot: the `[policy]` section
//! of the config (static) and the runtime entries of the store's `policy`
//! table (NIP-86 changes, persisted by the writer, applied at once and
//! after restarts). The hot path reads an `Arc<AccessRules>` (one read lock, no
//! store access); a change builds a new snapshot.
//!
//! Order of the checks of an EVENT (first match answers): blocked address,
//! banned event id, banned author or authenticated pubkey (`blocked:`),
//! kind denied or not in the allowed kinds (`blocked:`), larger than its
//! kind's maximum (`invalid:`), members-only without a member
//! (`auth-required:` when nobody is authenticated, else `restricted:`).
//! A REQ/COUNT: blocked address, then read-restricted without a member.

mod config;
mod plugin;
mod rules;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use parking_lot::RwLock;
use std::sync::Arc;

pub use config::{PluginConfig, PolicyConfig};
pub use plugin::{Plugin, PluginVerdict, Source};
pub use rules::{AccessRules, Denial, list};

/// The live policy: the config, the runtime entries and the snapshot
/// built from both.
#[derive(Default)]
pub struct Access {
    inner: RwLock<AccessState>,
}

#[derive(Default)]
struct AccessState {
    cfg: PolicyConfig,
    admins: Vec<[u8; 32]>,
    /// The store's entries, in key order.
    runtime: BTreeMap<String, String>,
    rules: Arc<AccessRules>,
}

impl AccessState {
    fn rebuild(&mut self) {
        let runtime: Vec<(String, String)> = self
            .runtime
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self.rules = Arc::new(AccessRules::build(&self.cfg, &runtime));
    }
}

impl Access {
    /// The current snapshot.
    pub fn rules(&self) -> Arc<AccessRules> {
        self.inner.read().rules.clone()
    }

    /// Replaces the config and every runtime entry.
    pub fn load(&self, cfg: PolicyConfig, runtime: Vec<(String, String)>) {
        let mut st = self.inner.write();
        st.admins = cfg.admins();
        st.cfg = cfg;
        st.runtime = runtime.into_iter().collect();
        st.rebuild();
    }

    /// Replaces the config (a reload), keeping the runtime entries and
    /// the running plugin's settings. Returns whether the new plugin
    /// settings differ from the running ones (they need a restart).
    pub fn reload(&self, mut cfg: PolicyConfig) -> bool {
        let mut st = self.inner.write();
        let plugin_changed = st.cfg.plugin != cfg.plugin;
        cfg.plugin = st.cfg.plugin.clone();
        st.admins = cfg.admins();
        st.cfg = cfg;
        st.rebuild();
        plugin_changed
    }

    /// Applies one runtime entry the store has made durable.
    pub fn set(&self, key: String, value: Option<String>) {
        let mut st = self.inner.write();
        match value {
            Some(v) => st.runtime.insert(key, v),
            None => st.runtime.remove(&key),
        };
        st.rebuild();
    }

    pub fn is_admin(&self, pubkey: &[u8; 32]) -> bool {
        self.inner.read().admins.contains(pubkey)
    }
}
