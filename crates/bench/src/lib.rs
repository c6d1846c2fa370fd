//! sluice-bench: a load generator and benchmark driver for Nostr relays over
//! real WebSockets. Each command lives in its own module; the shared pieces
//! are the event generator (`generate`), the WebSocket client (`wire`), a
//! raw client that negotiates permessage-deflate and counts bytes (`wsraw`),
//! the publishing driver (`driver`), statistics (`stats`) and /metrics
//! scraping (`metrics`). The binary in main.rs only parses arguments and dispatches.

pub mod audience;
pub mod connections;
pub mod driver;
pub mod fanout;
pub mod generate;
pub mod metrics;
pub mod overload;
pub mod plot;
pub mod publish;
pub mod query;
pub mod readflood;
pub mod report;
pub mod rng;
pub mod soak;
pub mod source;
pub mod stats;
pub mod sybil;
pub mod timeline;
pub mod wire;
pub mod wirebytes;
pub mod wsraw;
