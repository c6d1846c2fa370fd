//! Kind classes of NIP-01: how a relay stores an event depends on its kind.

/// Storage class of an event kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KindClass {
    /// Stored as is.
    Regular,
    /// Kinds 0, 3 and 10000-19999: only the newest per pubkey and kind is kept.
    Replaceable,
    /// Kinds 20000-29999: delivered to live subscriptions, never stored.
    Ephemeral,
    /// Kinds 30000-39999: only the newest per pubkey, kind and `d` tag is kept.
    Addressable,
}

impl KindClass {
    pub fn of(kind: u16) -> KindClass {
        match kind {
            0 | 3 | 10000..=19999 => KindClass::Replaceable,
            20000..=29999 => KindClass::Ephemeral,
            30000..=39999 => KindClass::Addressable,
            _ => KindClass::Regular,
        }
    }

    /// Label for metrics (a closed set).
    pub fn as_str(self) -> &'static str {
        match self {
            KindClass::Regular => "regular",
            KindClass::Replaceable => "replaceable",
            KindClass::Ephemeral => "ephemeral",
            KindClass::Addressable => "addressable",
        }
    }
}

/// Kind of NIP-09 deletion requests.
pub const DELETION: u16 = 5;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(KindClass::of(0), KindClass::Replaceable);
        assert_eq!(KindClass::of(1), KindClass::Regular);
        assert_eq!(KindClass::of(3), KindClass::Replaceable);
        assert_eq!(KindClass::of(9999), KindClass::Regular);
        assert_eq!(KindClass::of(10002), KindClass::Replaceable);
        assert_eq!(KindClass::of(20001), KindClass::Ephemeral);
        assert_eq!(KindClass::of(30023), KindClass::Addressable);
        assert_eq!(KindClass::of(40000), KindClass::Regular);
    }

    /// The `kind_class` label of `sluice_events_received_total`: the values
    /// docs/metrics.md lists, one per class.
    #[test]
    fn each_class_has_its_documented_metric_label() {
        for (kind, label) in [
            (1, "regular"),
            (0, "replaceable"),
            (20001, "ephemeral"),
            (30023, "addressable"),
        ] {
            assert_eq!(KindClass::of(kind).as_str(), label, "kind {kind}");
        }
    }
}
