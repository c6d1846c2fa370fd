//! Names of the cluster's metrics (docs/metrics.md lists them).

/// 1 while this node reaches Redis, else 0.
pub const CLUSTER_REDIS_UP: &str = "sluice_cluster_redis_up";
/// Redis commands that failed, by task (publish, consume, limits, registry).
pub const CLUSTER_REDIS_ERRORS_TOTAL: &str = "sluice_cluster_redis_errors_total";
/// Events this node put on the stream.
pub const CLUSTER_EVENTS_OUT_TOTAL: &str = "sluice_cluster_events_out_total";
/// Stream entries from other nodes, by result (stored, duplicate,
/// ephemeral, rejected, invalid).
pub const CLUSTER_EVENTS_IN_TOTAL: &str = "sluice_cluster_events_in_total";
/// Entries not yet read by this node's consumer group (Redis' `lag`).
pub const CLUSTER_STREAM_LAG_ENTRIES: &str = "sluice_cluster_stream_lag_entries";
/// From an entry's stream id (the publishing node's clock) to its
/// handling here.
pub const CLUSTER_REPLICATION_DELAY_SECONDS: &str = "sluice_cluster_replication_delay_seconds";
/// Client events waiting for the publisher.
pub const CLUSTER_OUTBOUND_QUEUED: &str = "sluice_cluster_outbound_queued";
/// One reconcile of bucket use with Redis.
pub const CLUSTER_LIMITS_RECONCILE_SECONDS: &str = "sluice_cluster_limits_reconcile_seconds";
/// Client keys sent in the last reconcile.
pub const CLUSTER_LIMITS_KEYS: &str = "sluice_cluster_limits_keys";
/// Operations other nodes' clients took, charged to the same keys here.
pub const CLUSTER_LIMITS_REMOTE_OPS_TOTAL: &str = "sluice_cluster_limits_remote_ops_total";
/// Repairs by negentropy against a peer, by result (ok, failed, no_peer).
pub const CLUSTER_REPAIRS_TOTAL: &str = "sluice_cluster_repairs_total";
/// Events a repair fetched and stored.
pub const CLUSTER_REPAIR_EVENTS_TOTAL: &str = "sluice_cluster_repair_events_total";
/// 1 for the Redis primary this node follows (label `addr`, `host:port`
/// as the Sentinels name it), 0 for one it followed before; with
/// `cluster.sentinels` only.
pub const CLUSTER_PRIMARY: &str = "sluice_cluster_primary";
/// When the followed primary last changed (unix seconds; the first one
/// named at start counts).
pub const CLUSTER_PRIMARY_CHANGED_TIMESTAMP_SECONDS: &str =
    "sluice_cluster_primary_changed_timestamp_seconds";
/// Failovers followed: the primary changed after the first was named.
pub const CLUSTER_PRIMARY_CHANGES_TOTAL: &str = "sluice_cluster_primary_changes_total";
/// Answers and messages from the Sentinels, by kind (`asked`: a
/// get-master-addr-by-name answered, `switch`: a `+switch-master` heard,
/// `error`: a Sentinel unreachable or refusing).
pub const CLUSTER_SENTINEL_EVENTS_TOTAL: &str = "sluice_cluster_sentinel_events_total";
/// The share of each global limit this node enforces on its own: 1 while
/// Redis is reachable (the shared counters), `1/N` while it is not (`N`:
/// the nodes alive at the last heartbeat).
pub const CLUSTER_LEASE_SHARE: &str = "sluice_cluster_lease_share";
/// Nodes alive at the last heartbeat that reached Redis, this one
/// included: what a lease divides each global limit by.
pub const CLUSTER_LEASE_NODES: &str = "sluice_cluster_lease_nodes";
/// Redis outages during which this node enforced its leased share.
pub const CLUSTER_LEASES_TOTAL: &str = "sluice_cluster_leases_total";
/// Client operations (EVENTs, REQs) this node admitted on a leased share.
pub const CLUSTER_LEASE_OPS_TOTAL: &str = "sluice_cluster_lease_ops_total";
