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
pub fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count() as u64)
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
}
