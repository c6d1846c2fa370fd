//! What admission tells a connection about one operation ([`Admit`]), and
//! a refusal ([`Refusal`]): which limit refused ([`Layer`], a metric
//! label), when a retry may succeed, and the words the client is sent
//! after the `rate-limited:` prefix.
//!
//! Invariant: every refusal carries a retry hint; the text never includes
//! the prefix, which the server adds.

use std::time::Duration;

/// Which limit refused an operation (a closed set: metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// Open connections per IP (`throttle.clients.max_connections_per_ip`).
    ConnectionsPerIp,
    /// The IP's request bucket (EVENTs, or REQs and COUNTs).
    IpBucket,
    /// The author's EVENT bucket.
    PubkeyBucket,
    /// The global controller's verdict.
    Controller,
    /// The query scheduler: queue bounds and deadlines.
    QueryScheduler,
    /// The IP's read budget (cost units).
    ReadBudgetIp,
    /// The connection's read budget (cost units).
    ReadBudgetConnection,
}

impl Layer {
    /// The `layer` label of the throttle metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::ConnectionsPerIp => "connections_per_ip",
            Layer::IpBucket => "ip_bucket",
            Layer::PubkeyBucket => "pubkey_bucket",
            Layer::Controller => "controller",
            Layer::QueryScheduler => "query_scheduler",
            Layer::ReadBudgetIp => "read_budget_ip",
            Layer::ReadBudgetConnection => "read_budget_connection",
        }
    }
}

/// A refusal to send as `rate-limited:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub layer: Layer,
    pub retry_after: Duration,
    /// Human text, without the prefix.
    pub message: &'static str,
}

impl Refusal {
    /// `"<message>; retry in N s"` (at least 0.1 s, one decimal).
    pub fn detail(&self) -> String {
        let secs = self.retry_after.as_secs_f64().max(0.1);
        format!("{}; retry in {:.1} s", self.message, secs)
    }
}

/// What a connection should do with one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Go,
    /// Wait this long on this connection, then go.
    Delay(Duration),
    Refuse(Refusal),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detail_gives_the_retry_hint_in_seconds() {
        let r = |ms| Refusal {
            layer: Layer::IpBucket,
            retry_after: Duration::from_millis(ms),
            message: "too many events from your address",
        };
        assert_eq!(
            r(1500).detail(),
            "too many events from your address; retry in 1.5 s"
        );
        assert_eq!(
            r(0).detail(),
            "too many events from your address; retry in 0.1 s"
        );
    }

    #[test]
    fn layer_labels_are_distinct() {
        let all = [
            Layer::ConnectionsPerIp,
            Layer::IpBucket,
            Layer::PubkeyBucket,
            Layer::Controller,
            Layer::QueryScheduler,
            Layer::ReadBudgetIp,
            Layer::ReadBudgetConnection,
        ];
        let labels: std::collections::HashSet<_> = all.iter().map(|l| l.as_str()).collect();
        assert_eq!(labels.len(), all.len());
    }
}
