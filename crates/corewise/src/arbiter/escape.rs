//! Getting a kernel thread out of a dead daemon's cpusets.
//!
//! Why: a daemon that crashes (kill -9) cannot move the threads it
//! confined back; a kernel thread it had granted a core stays in that
//! core's cpuset, on one CPU, and one that was waiting stays in the
//! unmanaged set, which lacks every CPU that was granted at the time of the
//! crash. The runtime then runs on its CPU budget without the daemon, so
//! each of its kernel threads moves itself to the daemon's cgroup root (the
//! parent of the daemon's sets, which the daemon never narrows) and widens
//! its affinity to the budget's CPUs. Moving a thread between cgroups takes
//! write access to the cgroup files, which the daemon's root usually keeps
//! to itself: without it the thread stays where it is and runs there, on
//! whatever CPUs that set has, which is as much of the budget as it can
//! get. A daemon that comes back moves the threads of its root into its
//! unmanaged set, as it does with every task it finds there.

use std::path::{Path, PathBuf};

use crate::budget::cgroup::{locate_v1, locate_v2, parse_mountinfo, parse_proc_cgroup, Version};

/// The daemon's cpusets: `corewise-unmanaged` and `corewise-core<N>`
/// (`corewise_arbiter::fence` names them).
pub(crate) fn is_daemon_set(dir: &Path) -> bool {
    dir.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n == "corewise-unmanaged" || n.starts_with("corewise-core"))
}

/// Where the calling thread's cpuset is, and the file that takes a thread
/// into its parent; `None` outside the daemon's sets (or without a cpuset).
fn parent_threads_file() -> Option<PathBuf> {
    let proc_cgroup = Path::new("/proc/thread-self/cgroup");
    let lines = parse_proc_cgroup(&std::fs::read_to_string(proc_cgroup).ok()?, proc_cgroup).ok()?;
    let mountinfo = Path::new("/proc/self/mountinfo");
    let mounts = parse_mountinfo(&std::fs::read_to_string(mountinfo).ok()?, mountinfo).ok()?;
    let root = Path::new("/");
    let at =
        locate_v1(&lines, &mounts, "cpuset", root).or_else(|| locate_v2(&lines, &mounts, root))?;
    if !is_daemon_set(&at.leaf) {
        return None;
    }
    let file = match at.version {
        Version::V1 => "tasks",
        // The daemon's root is a threaded domain: threads move inside it.
        Version::V2 => "cgroup.threads",
    };
    Some(at.leaf.parent()?.join(file))
}

/// Moves the calling kernel thread out of the daemon's cpuset it is in (if
/// it is in one) and sets its affinity to `cpus`. Returns whether it left a
/// daemon's set; failures are logged at debug level and leave the thread
/// where it can run.
pub(crate) fn leave_daemon_cpusets(cpus: &[usize]) -> bool {
    let mut left = false;
    if let Some(file) = parent_threads_file() {
        let tid = rustix::thread::gettid().as_raw_nonzero().get();
        match std::fs::write(&file, tid.to_string()) {
            Ok(()) => left = true,
            Err(e) => {
                tracing::debug!(file = %file.display(), error = %e, "cannot leave the daemon's cpuset; running where it is");
            }
        }
    }
    if !cpus.is_empty() {
        let mut set = rustix::thread::CpuSet::new();
        for &c in cpus
            .iter()
            .filter(|&&c| c < rustix::thread::CpuSet::MAX_CPU)
        {
            set.set(c);
        }
        if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
            tracing::debug!(error = %e, "cannot widen the affinity to the CPU budget");
        }
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_daemons_sets_are_left() {
        assert!(is_daemon_set(Path::new("/sys/fs/cgroup/x/corewise-core3")));
        assert!(is_daemon_set(Path::new(
            "/sys/fs/cgroup/corewise-unmanaged"
        )));
        assert!(!is_daemon_set(Path::new("/sys/fs/cgroup/user.slice")));
        assert!(!is_daemon_set(Path::new("/")));
        // This test's thread is in no daemon set: nothing to leave, and an
        // empty CPU list leaves the affinity alone.
        if parent_threads_file().is_none() {
            assert!(!leave_daemon_cpusets(&[]));
        }
    }
}
