//! One module per subcommand of the binary (`sluice serve`, `sluice import`,
//! ...): its arguments and its `run`.

pub(crate) mod admin;
pub(crate) mod compact;
pub(crate) mod export;
pub(crate) mod import;
pub(crate) mod mirror;
pub(crate) mod reindex;
pub(crate) mod retention;
pub(crate) mod serve;
pub(crate) mod sync;
pub(crate) mod trust;
