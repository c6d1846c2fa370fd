//! The heap settings of `sluice serve` (glibc's allocator): no per-thread
//! cache of freed blocks (`tcache`) and one arena.
//!
//! Why: a crowd of connections allocates and frees on every worker thread.
//! Each thread's cache keeps some of the freed blocks, and each thread's
//! arena keeps the pages any live block sits on; after the crowd leaves
//! those scattered blocks hold megabytes that `malloc_trim` cannot return
//! (measured in docs/benchmarks.md: 16 MB after 10,000 subscribed
//! connections closed, against 10.5 MB before; with these settings 11.3 MB,
//! and 2.6 KB a connection instead of 2.8).
//!
//! glibc reads `GLIBC_TUNABLES` only when a program starts, so `serve`
//! executes itself again with the variable set, once: an operator who sets
//! `GLIBC_TUNABLES` (even to nothing) keeps their own settings. Other
//! allocators and C libraries ignore the variable.

use std::os::unix::process::CommandExt;

/// What `serve` runs with unless the operator chose otherwise.
pub const TUNABLES: &str = "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=1";

/// Executes this binary again with [`TUNABLES`] in `GLIBC_TUNABLES`, unless
/// that variable is set. Returns only when it did not (the variable was
/// set, or the executable could not be run: then serving goes on with the
/// allocator's defaults).
pub fn settle_for_serve() {
    if std::env::var_os("GLIBC_TUNABLES").is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut args = std::env::args_os();
    let mut cmd = std::process::Command::new(exe);
    if let Some(arg0) = args.next() {
        cmd.arg0(arg0);
    }
    let err = cmd.args(args).env("GLIBC_TUNABLES", TUNABLES).exec();
    eprintln!("sluice: serving with the allocator's defaults (could not apply {TUNABLES}: {err})");
}
