//! The process's file-descriptor table, grown once at runtime start.
//!
//! Why: the kernel grows a process's fd table by doubling (64, 128, 256,
//! ...) when a new fd does not fit, and in a process whose table is shared
//! by several threads each growth waits for an RCU grace period
//! (`expand_fdtable` calls `synchronize_rcu`), 10-20 ms on the virtual
//! machines this was measured on. The call that made the fd waits that
//! long: for a runtime that is the dispatcher's `io_uring_enter` issuing an
//! accept, so the whole core stalled. A client that opened 2 000
//! connections at once had its first requests answered 7-16 ms late (a
//! single-threaded tokio server: 0.1 ms). Growing the table once, when the
//! runtime starts, to what the descriptor limit allows (capped at
//! [`RESERVE_CAP`]) makes every later fd fit; it costs one wait at start
//! (none if the process is still single-threaded then) and 8 bytes of
//! kernel memory per slot (512 KiB at the cap).

use std::os::fd::AsFd;

/// The largest table reserved at start: 65 536 descriptors.
pub(crate) const RESERVE_CAP: u64 = 65_536;

/// Grows the fd table so that descriptors below `min(soft limit,
/// RESERVE_CAP)` fit without a growth; returns the size asked for, or
/// `None` when nothing could be done (no fd to duplicate, or the limit is
/// below the kernel's first table). Failures are harmless: the table
/// then grows on demand, as without this.
pub(crate) fn reserve() -> Option<u64> {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(RESERVE_CAP);
    let want = soft.min(RESERVE_CAP);
    if want <= 64 {
        return None;
    }
    let probe = std::fs::File::open("/dev/null").ok()?;
    // A duplicate at the highest descriptor makes the kernel size the
    // table for it; closing it leaves the table as grown.
    let high = rustix::io::fcntl_dupfd_cloexec(probe.as_fd(), (want - 1) as i32).ok()?;
    drop(high);
    Some(want)
}

#[cfg(all(test, not(loom)))]
mod tests {
    /// The table's size, as `/proc/self/status` reports it (`FDSize`).
    fn fd_table_size() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("FDSize:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    #[test]
    fn the_table_holds_what_the_limit_allows_after_a_reserve() {
        let want = super::reserve().expect("a descriptor limit above 64");
        assert!(
            fd_table_size() >= want,
            "FDSize {} < {want}",
            fd_table_size()
        );
    }
}
