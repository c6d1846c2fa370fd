//! Names of the front end's metrics, in one place.

pub const CONNECTIONS_OPEN: &str = "sluice_connections_open";
pub const CONNECTIONS_OPENED_TOTAL: &str = "sluice_connections_opened_total";
pub const CONNECTIONS_CLOSED_TOTAL: &str = "sluice_connections_closed_total";
pub const CONNECTIONS_REFUSED_TOTAL: &str = "sluice_connections_refused_total";
pub const MESSAGES_RECEIVED_TOTAL: &str = "sluice_messages_received_total";
pub const EVENTS_RECEIVED_TOTAL: &str = "sluice_events_received_total";
pub const EVENTS_ACCEPTED_TOTAL: &str = "sluice_events_accepted_total";
pub const EVENTS_REFUSED_TOTAL: &str = "sluice_events_refused_total";
pub const OK_LATENCY_SECONDS: &str = "sluice_ok_latency_seconds";
pub const REQS_REFUSED_TOTAL: &str = "sluice_reqs_refused_total";
pub const NOTICES_SENT_TOTAL: &str = "sluice_notices_sent_total";
pub const SUBSCRIPTIONS_OPEN: &str = "sluice_subscriptions_open";
pub const LIVE_DELIVERIES_TOTAL: &str = "sluice_live_deliveries_total";
pub const SLOW_CONSUMER_DISCONNECTS_TOTAL: &str = "sluice_slow_consumer_disconnects_total";
/// Times a connection stopped reading its socket: `server.max_pending_writes`
/// of its EVENTs awaited their OK (TCP then holds the client back).
pub const READS_PAUSED_TOTAL: &str = "sluice_socket_reads_paused_total";
/// TCP connections that are not WebSocket sessions (plain HTTP, handshakes).
pub const HTTP_CONNECTIONS_OPEN: &str = "sluice_http_connections_open";
pub const HTTP_CONNECTIONS_CLOSED_TOTAL: &str = "sluice_http_connections_closed_total";
/// TCP connections waiting for a handshake slot of their address.
pub const HANDSHAKE_QUEUE_WAITING: &str = "sluice_handshake_queue_waiting";
/// Waiting connections that got a slot.
pub const HANDSHAKE_QUEUE_ADMITTED_TOTAL: &str = "sluice_handshake_queue_admitted_total";
/// Refused connections closed without their HTTP answer (too many answers
/// being written at once).
pub const CONNECTIONS_REFUSED_UNANSWERED_TOTAL: &str =
    "sluice_connections_refused_unanswered_total";
pub const ACCEPT_ERRORS_TOTAL: &str = "sluice_accept_errors_total";
/// Requests to /metrics or /api/throttle on the relay port refused (403).
pub const OPERATOR_REQUESTS_REFUSED_TOTAL: &str = "sluice_operator_requests_refused_total";
/// AUTH messages by result (`ok` or the refusal's prefix).
pub const AUTH_TOTAL: &str = "sluice_auth_total";
/// Connections with at least one authenticated pubkey.
pub const CONNECTIONS_AUTHENTICATED: &str = "sluice_connections_authenticated";
/// Successful AUTHs, by the tier the connection is in afterwards.
pub const AUTH_TIER_TOTAL: &str = "sluice_auth_tier_total";
/// NIP-86 management requests, by method and result (`ok`, `error`,
/// `unauthorized`, `bad_request`, `too_large`).
pub const NIP86_REQUESTS_TOTAL: &str = "sluice_nip86_requests_total";
/// NIP-77 negentropy sessions open now.
pub const NEGENTROPY_SESSIONS_OPEN: &str = "sluice_negentropy_sessions_open";
/// NIP-77 messages received, by type (`open`, `msg`, `close`).
pub const NEGENTROPY_MESSAGES_TOTAL: &str = "sluice_negentropy_messages_total";
/// Items (stored events) negentropy sessions reconciled over.
pub const NEGENTROPY_ITEMS_TOTAL: &str = "sluice_negentropy_items_total";
/// NEG-ERR answers, by reason.
pub const NEGENTROPY_ERRORS_TOTAL: &str = "sluice_negentropy_errors_total";
/// Connections that agreed permessage-deflate, by mode.
pub const WS_COMPRESSION_AGREED_TOTAL: &str = "sluice_ws_compression_agreed_total";
