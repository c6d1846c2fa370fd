//! The relay's black-box tests, one module per file of this folder, built as
//! one test binary: the helpers in `support/` and `source_scan/` are compiled
//! once, and one binary is linked instead of one per file. The cluster, the
//! partition, the browser and the WebSocket conformance tests are binaries of
//! their own: the docs and scripts run each alone (`--test cluster`), and the
//! first three start Redis, network namespaces or chromium.
//! Run one module with a filter: `cargo test -p sluice --test suite relay::`.

mod source_scan;
mod support;

mod architecture;
mod auth;
mod budgets;
mod burst;
mod chaos;
mod compact;
mod config;
mod fanout;
mod hostile;
mod import;
mod invariants;
mod metrics_doc;
mod mirror;
mod negentropy;
mod pages;
mod policy;
mod reads;
mod relay;
mod reload;
mod req_burst;
mod retention;
mod search;
mod session;
mod throttle;
mod trust;
mod upload;
mod wire;
