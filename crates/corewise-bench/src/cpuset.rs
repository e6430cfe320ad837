//! A cpuset subtree of the benchmark's own (cgroup v1 or v2), for
//! benchmarks that run the core arbiter daemon (`core-grant`,
//! `kv --neighbour`).
//!
//! The daemon is confined to the subtree (`--cgroup-root`), so it never
//! touches the rest of the machine; the benchmark process moves in, so the
//! daemon puts all of its threads (load generators included) in the
//! unmanaged set, off the managed cores. The hierarchy is the one the
//! arbiter detects ([`CpusetHierarchy::detect`]): on cgroup v1 the subtree
//! is a cpuset given all CPUs and memory nodes; on cgroup v2 it is a domain
//! cgroup that inherits its parent's CPUs, which the daemon turns into the
//! threaded domain of its sets. On drop the process moves back to the root
//! and the directory is removed. Subtrees of earlier runs that were killed
//! are removed first.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use corewise_arbiter::daemon::Backend;
use corewise_arbiter::fence::{read_ids, CgroupVersion, CpusetHierarchy};
use corewise_arbiter::topology::CpuList;

/// Why the subtree could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SubtreeError {
    /// Not root, or no cpuset hierarchy.
    #[error("{0}")]
    Unsupported(String),
    /// A cgroup file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// Path.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> SubtreeError + 'a {
    move |source| SubtreeError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Removes subtrees left by earlier runs that were killed (their process is
/// gone, so their sets hold no tasks and can simply be removed).
fn remove_stale(root: &Path) {
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("corewise-bench-") else {
            continue;
        };
        if pid.parse::<u32>().is_err() || Path::new("/proc").join(pid).exists() {
            continue;
        }
        if let Ok(children) = std::fs::read_dir(e.path()) {
            for c in children.flatten() {
                if c.path().is_dir() {
                    let _ = std::fs::remove_dir(c.path());
                }
            }
        }
        let _ = std::fs::remove_dir(e.path());
    }
}

/// Our own cpuset subtree; the process lives in it while it exists.
pub struct Subtree {
    /// The subtree's directory (the daemon's `--cgroup-root`).
    pub dir: PathBuf,
    hierarchy: CpusetHierarchy,
}

impl Subtree {
    /// Creates the subtree with all CPUs and memory nodes and moves this
    /// process into it.
    pub fn create() -> Result<Self, SubtreeError> {
        let unsupported = || {
            SubtreeError::Unsupported(
                "root and a cgroup v1 cpuset hierarchy at /sys/fs/cgroup/cpuset, or cgroup v2 \
                 at /sys/fs/cgroup with cpuset in its cgroup.subtree_control"
                    .into(),
            )
        };
        if !rustix::process::geteuid().is_root() {
            return Err(unsupported());
        }
        let hierarchy = CpusetHierarchy::detect().ok_or_else(unsupported)?;
        let root = hierarchy.root.clone();
        remove_stale(&root);
        let dir = root.join(format!("corewise-bench-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(io("mkdir", &dir))?;
        let st = Self { dir, hierarchy };
        if st.hierarchy.version == CgroupVersion::V1 {
            // A new v1 cpuset starts with no CPUs and no memory nodes (a v2
            // one inherits its parent's).
            for f in ["cpuset.mems", "cpuset.cpus"] {
                let v = std::fs::read_to_string(root.join(f)).map_err(io("read", &root.join(f)))?;
                std::fs::write(st.dir.join(f), v.trim()).map_err(io("write", &st.dir.join(f)))?;
            }
        }
        // Every thread of this process moves in; the daemon then puts them
        // in its unmanaged set, off the managed cores.
        let procs = st.dir.join("cgroup.procs");
        std::fs::write(&procs, std::process::id().to_string()).map_err(io("write", &procs))?;
        Ok(st)
    }

    /// The daemon backend for this subtree's hierarchy.
    pub fn backend(&self) -> Backend {
        match self.hierarchy.version {
            CgroupVersion::V1 => Backend::CgroupV1,
            CgroupVersion::V2 => Backend::CgroupV2,
        }
    }

    /// The CPUs the subtree holds (on cgroup v2 the effective ones: a new
    /// cgroup's own `cpuset.cpus` is empty and means "the parent's").
    pub fn cpus(&self) -> Result<CpuList, SubtreeError> {
        let file = match self.hierarchy.version {
            CgroupVersion::V1 => self.dir.join("cpuset.cpus"),
            CgroupVersion::V2 => self.dir.join("cpuset.cpus.effective"),
        };
        let text = std::fs::read_to_string(&file).map_err(io("read", &file))?;
        text.trim().parse().map_err(|e| SubtreeError::Io {
            op: "parse",
            path: file,
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{e}")),
        })
    }
}

impl Drop for Subtree {
    fn drop(&mut self) {
        let root = &self.hierarchy.root;
        // Back to the root (whole process), then remove the directory (the
        // daemon already removed its children). Children started while
        // inside (servers, neighbours) are stopped by their owners first.
        // A thread left behind is moved by its id: through `tasks` on v1,
        // through `cgroup.procs` (its whole process) on v2, where a thread
        // cannot leave its threaded domain alone.
        let _ = std::fs::write(root.join("cgroup.procs"), std::process::id().to_string());
        let back = match self.hierarchy.version {
            CgroupVersion::V1 => root.join("tasks"),
            CgroupVersion::V2 => root.join("cgroup.procs"),
        };
        let threads = self.hierarchy.version.threads_file();
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.dir.exists() && std::fs::remove_dir(&self.dir).is_err() {
            for tid in read_ids(&self.dir.join(threads)) {
                let _ = std::fs::write(&back, tid.to_string());
            }
            if Instant::now() > deadline {
                eprintln!("could not remove {}", self.dir.display());
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
