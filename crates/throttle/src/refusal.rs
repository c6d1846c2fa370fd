//! The throttle's one refusal, [`RateLimited`]: which limit refused
//! ([`Layer`], a metric label), why ([`Cause`], a metric label), when a
//! retry may succeed, and the words the client is sent after the
//! `rate-limited:` prefix. A refusal of the global controller (emergency,
//! over the cap) and one of the query scheduler (its bounds, its deadline)
//! are this same type; the texts of the per-client limits are in
//! [`crate::admission`].
//!
//! Invariant: every refusal carries a retry hint; the text never includes
//! the prefix, which the server adds.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which limit refused an operation (a closed set: metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// Open connections per IP (`throttle.clients.max_connections_per_ip`).
    ConnectionsPerIp,
    /// The IP's request bucket (EVENTs, or REQs and COUNTs).
    IpBucket,
    /// A pubkey's request bucket: its tier's, or the author's EVENT bucket.
    PubkeyBucket,
    /// The global controller's verdict.
    Controller,
    /// The query scheduler: queue bounds and deadlines.
    QueryScheduler,
    /// The IP's read budget (cost units).
    ReadBudgetIp,
    /// An authenticated pubkey's read budget (cost units).
    ReadBudgetPubkey,
    /// The connection's read budget (cost units).
    ReadBudgetConnection,
    /// The budget every author outside the web of trust shares
    /// (`trust.outsider_events_per_s`).
    OutsiderBudget,
    /// A budget of the tree (`[[throttle.budgets]]`) other than the
    /// outsiders'.
    Budget,
}

impl Layer {
    /// Every layer, for tests and docs checks.
    pub const ALL: [Layer; 10] = [
        Layer::ConnectionsPerIp,
        Layer::IpBucket,
        Layer::PubkeyBucket,
        Layer::Controller,
        Layer::QueryScheduler,
        Layer::ReadBudgetIp,
        Layer::ReadBudgetPubkey,
        Layer::ReadBudgetConnection,
        Layer::OutsiderBudget,
        Layer::Budget,
    ];

    /// The `layer` label of the throttle metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::ConnectionsPerIp => "connections_per_ip",
            Layer::IpBucket => "ip_bucket",
            Layer::PubkeyBucket => "pubkey_bucket",
            Layer::Controller => "controller",
            Layer::QueryScheduler => "query_scheduler",
            Layer::ReadBudgetIp => "read_budget_ip",
            Layer::ReadBudgetPubkey => "read_budget_pubkey",
            Layer::ReadBudgetConnection => "read_budget_connection",
            Layer::OutsiderBudget => "outsider_budget",
            Layer::Budget => "budget",
        }
    }
}

/// Why a limit refused (a closed set: the `reason` metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// A token bucket (a request bucket or a read budget) is empty.
    Rate,
    /// The controller: memory is past the emergency limit.
    Emergency,
    /// The controller asks for a delay above the cap.
    OverCap,
    /// The scheduler's relay-wide bounds are reached: `max_open_units` of
    /// estimated cost open, or `max_queued` queries waiting.
    QueueFull,
    /// The scheduler's bounds for this client are reached:
    /// `max_open_units_per_client`, or `max_queued_per_client`.
    ClientQueueFull,
    /// The query would wait past the deadline for its first step.
    Deadline,
    /// The query waited past the deadline for its first step.
    Timeout,
}

impl Cause {
    /// Every cause, for tests and docs checks.
    pub const ALL: [Cause; 7] = [
        Cause::Rate,
        Cause::Emergency,
        Cause::OverCap,
        Cause::QueueFull,
        Cause::ClientQueueFull,
        Cause::Deadline,
        Cause::Timeout,
    ];

    /// The `reason` label of the throttle metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Rate => "rate",
            Cause::Emergency => "emergency",
            Cause::OverCap => "over_cap",
            Cause::QueueFull => "queue_full",
            Cause::ClientQueueFull => "client_queue_full",
            Cause::Deadline => "deadline",
            Cause::Timeout => "timeout",
        }
    }

    /// The layer a cause belongs to, and its text; `None` for
    /// [`Cause::Rate`], whose layer and text name the bucket.
    fn layer_and_text(self) -> Option<(Layer, &'static str)> {
        let (layer, text) = match self {
            Cause::Rate => return None,
            Cause::Emergency => (Layer::Controller, "relay memory is over its limit"),
            Cause::OverCap => (Layer::Controller, "relay is overloaded"),
            Cause::QueueFull => (Layer::QueryScheduler, "too much query work waiting"),
            Cause::ClientQueueFull => {
                (Layer::QueryScheduler, "too much of your query work waiting")
            }
            Cause::Deadline => (
                Layer::QueryScheduler,
                "relay is busy, the query would wait too long",
            ),
            Cause::Timeout => (Layer::QueryScheduler, "query waited too long for its turn"),
        };
        Some((layer, text))
    }
}

/// A refusal, sent as `rate-limited:`: which limit, why, when to retry,
/// and the text after the prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(into = "Published")]
pub struct RateLimited {
    pub layer: Layer,
    pub cause: Cause,
    pub retry_after: Duration,
    /// Human text, without the prefix.
    pub message: &'static str,
}

impl RateLimited {
    /// An empty bucket of `layer`, with its text.
    pub fn bucket(layer: Layer, retry_after: Duration, message: &'static str) -> RateLimited {
        RateLimited {
            layer,
            cause: Cause::Rate,
            retry_after,
            message,
        }
    }

    /// A refusal of the controller or the query scheduler: the cause names
    /// the layer and the text. [`Cause::Rate`] (which names neither) gets
    /// the per-IP bucket's layer and a generic text.
    pub fn of(cause: Cause, retry_after: Duration) -> RateLimited {
        let (layer, message) = cause
            .layer_and_text()
            .unwrap_or((Layer::IpBucket, "too many requests"));
        RateLimited {
            layer,
            cause,
            retry_after,
            message,
        }
    }

    /// `"<message>; retry in N s"` (at least 0.1 s, one decimal).
    pub fn detail(&self) -> String {
        let secs = self.retry_after.as_secs_f64().max(0.1);
        format!("{}; retry in {:.1} s", self.message, secs)
    }
}

/// How a published (controller) refusal reads in `GET /api/throttle`:
/// its retry hint and its reason.
#[derive(Serialize, Deserialize)]
struct Published {
    retry_after_ns: u64,
    reason: Cause,
}

impl From<RateLimited> for Published {
    fn from(r: RateLimited) -> Published {
        Published {
            retry_after_ns: u64::try_from(r.retry_after.as_nanos()).unwrap_or(u64::MAX),
            reason: r.cause,
        }
    }
}

impl<'de> Deserialize<'de> for RateLimited {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<RateLimited, D::Error> {
        let p = Published::deserialize(d)?;
        if p.reason == Cause::Rate {
            return Err(serde::de::Error::custom(
                "a bucket's refusal is never published",
            ));
        }
        Ok(RateLimited::of(
            p.reason,
            Duration::from_nanos(p.retry_after_ns),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detail_gives_the_retry_hint_in_seconds() {
        let r = |ms| {
            RateLimited::bucket(
                Layer::IpBucket,
                Duration::from_millis(ms),
                "too many events from your address",
            )
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
        let labels: std::collections::HashSet<_> = Layer::ALL.iter().map(|l| l.as_str()).collect();
        assert_eq!(labels.len(), Layer::ALL.len());
    }

    #[test]
    fn a_cause_names_its_layer_and_its_text() {
        let r = RateLimited::of(Cause::Deadline, Duration::from_secs(1));
        assert_eq!(r.layer, Layer::QueryScheduler);
        assert_eq!(r.message, "relay is busy, the query would wait too long");
        let r = RateLimited::of(Cause::Emergency, Duration::from_secs(1));
        assert_eq!(r.layer, Layer::Controller);
        assert_eq!(r.cause.as_str(), "emergency");
    }

    #[test]
    fn a_published_refusal_round_trips_and_a_bucket_is_never_read_back() {
        let r = RateLimited::of(Cause::OverCap, Duration::from_millis(1500));
        let json = serde_json::to_value(r).unwrap();
        assert_eq!(
            json,
            serde_json::json!({ "retry_after_ns": 1_500_000_000u64, "reason": "over_cap" })
        );
        assert_eq!(serde_json::from_value::<RateLimited>(json).unwrap(), r);
        let bucket = serde_json::json!({ "retry_after_ns": 1, "reason": "rate" });
        assert!(serde_json::from_value::<RateLimited>(bucket).is_err());
    }
}
