//! glibc's allocator, tuned for a relay that serves crowds which come and
//! go: `sluice serve` runs with
//! `GLIBC_TUNABLES=glibc.malloc.tcache_count=0:glibc.malloc.trim_threshold=131072`
//! unless the operator set `GLIBC_TUNABLES` (even empty) themselves.
//!
//! Why: each thread's cache (tcache) keeps up to seven freed blocks of
//! every small size. After thousands of connections close, those blocks
//! still count as in use, and each pins the page it sits on, so freed
//! pages spread over the worker threads' arenas cannot be given back to
//! the OS (`malloc_trim`, run by the store monitor, skips a page with a
//! live block). Without the caches RSS comes back to within about a fifth
//! of its figure before the crowd; with them it stays about a third higher
//! (docs/benchmarks.md#memory-per-connection). Publish, query and fan-out
//! throughput are the same either way; the arena count
//! (`glibc.malloc.arena_max`) is left alone, as one arena slows the query
//! mix by a third.
//!
//! A fixed trim threshold: `malloc_trim` (the monitor's) gives back free
//! pages inside every arena but shrinks only the main arena's top; a worker
//! thread's arena gives back the top of its heap from `free`, and only once
//! that top is past the trim threshold, which glibc otherwise raises to
//! twice the largest block it has handed back to the OS (the search index's
//! writer frees megabytes). Without a fixed threshold, after a crowd of
//! 19,000 leaves the workers' tops hold some 3 MB and RSS comes back to
//! +19-24% of its idle figure; with it fixed at 128 KiB (glibc's initial
//! value), to +9%. The same setting fixes the mmap threshold at 128 KiB;
//! throughput is the same (docs/benchmarks.md#memory-per-connection).
//!
//! glibc reads its tunables only at start-up, so the process runs itself
//! again (`exec`, same pid, same arguments) with the variable set, before
//! any thread exists. Should that fail, it goes on as it is.

use std::ffi::OsString;

/// The variable glibc reads its tunables from.
pub const TUNABLES: &str = "GLIBC_TUNABLES";
/// What `sluice serve` sets when the operator did not.
pub const SERVE_TUNABLES: &str = "glibc.malloc.tcache_count=0:glibc.malloc.trim_threshold=131072";

/// The tunables `sluice serve` should run with, given the variable as the
/// process found it: none when the operator set it (their choice stands).
pub fn wanted(found: Option<OsString>) -> Option<&'static str> {
    match found {
        Some(_) => None,
        None => Some(SERVE_TUNABLES),
    }
}

/// Runs this process again with [`SERVE_TUNABLES`] unless the operator set
/// `GLIBC_TUNABLES`. Returns only when nothing was to be done or the
/// `exec` failed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn reexec_for_serve() {
    use std::os::unix::process::CommandExt;
    let Some(value) = wanted(std::env::var_os(TUNABLES)) else {
        return;
    };
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
    let err = std::process::Command::new(&exe)
        .arg0(argv0)
        .args(args)
        .env(TUNABLES, value)
        .exec();
    // Not fatal: the relay runs with glibc's defaults.
    eprintln!(
        "sluice: could not run again with {TUNABLES}={value} ({err}); going on with glibc's defaults"
    );
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn reexec_for_serve() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operators_setting_stands_even_empty() {
        assert_eq!(
            wanted(None),
            Some("glibc.malloc.tcache_count=0:glibc.malloc.trim_threshold=131072")
        );
        assert_eq!(wanted(Some(OsString::new())), None);
        assert_eq!(wanted(Some("glibc.malloc.arena_max=2".into())), None);
    }
}
