//! The process's own memory and file descriptors, from /proc (Linux).
//!
//! Anonymous memory (`RssAnon`) is the heap and stacks: what the relay
//! itself allocated. It excludes the LMDB map, whose pages are file-backed
//! (`RssFile`) and belong to the kernel's page cache, so a large store does
//! not look like memory pressure.

/// Memory of this process in bytes; zeros where /proc is unavailable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessMemory {
    pub resident_bytes: u64,
    pub anonymous_bytes: u64,
}

/// Reads `VmRSS` and `RssAnon` from /proc/self/status.
pub fn memory() -> ProcessMemory {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return ProcessMemory::default();
    };
    let mut m = ProcessMemory::default();
    for line in status.lines() {
        if let Some(v) = line.strip_prefix("VmRSS:") {
            m.resident_bytes = kib(v);
        } else if let Some(v) = line.strip_prefix("RssAnon:") {
            m.anonymous_bytes = kib(v);
        }
    }
    m
}

fn kib(v: &str) -> u64 {
    v.trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .unwrap_or(0)
        * 1024
}

/// Open file descriptors of this process.
///
/// Since Linux 6.2 the size `stat` reports for /proc/self/fd is the count,
/// one call whatever the count; before, it is 0, and the directory is
/// listed, one entry per descriptor (at 8,000 connections, most of the
/// store monitor's CPU).
pub fn open_fds() -> u64 {
    match std::fs::metadata("/proc/self/fd") {
        Ok(m) if m.len() > 0 => m.len(),
        _ => listed_fds(),
    }
}

/// Open file descriptors, by listing /proc/self/fd (without the one the
/// listing itself holds).
fn listed_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| (d.count() as u64).saturating_sub(1))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_own_memory() {
        let m = super::memory();
        if cfg!(target_os = "linux") {
            assert!(m.resident_bytes > 0);
            assert!(m.anonymous_bytes > 0 && m.anonymous_bytes <= m.resident_bytes);
            assert!(super::open_fds() > 0);
        }
    }

    #[test]
    fn the_count_follows_descriptors_opened_and_closed() {
        if !cfg!(target_os = "linux") {
            return;
        }
        // Other tests' threads open and close files beside this one: the
        // counts are compared over many files, with room for them.
        let before = super::open_fds();
        let files: Vec<std::fs::File> = (0..200)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        let during = super::open_fds();
        let listed = super::listed_fds();
        drop(files);
        let after = super::open_fds();
        assert!(during >= before + 150, "{before} -> {during}");
        assert!(
            during.abs_diff(listed) < 50,
            "stat {during}, listed {listed}"
        );
        assert!(after + 150 <= during, "{during} -> {after}");
    }
}

/// The process's soft limit on open descriptors (`ulimit -n`), from
/// /proc/self/limits; `None` where it cannot be read or is unlimited.
pub fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_files_limit(&text)
}

fn parse_open_files_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod limit_tests {
    #[test]
    fn the_soft_open_files_limit_is_read() {
        let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                    Max open files            1024                 524288               files     \n";
        assert_eq!(super::parse_open_files_limit(text), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(super::parse_open_files_limit(unlimited), None);
        assert!(super::open_files_limit().is_some_and(|n| n > 0));
    }
}
