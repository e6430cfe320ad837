//! A cgroup v1 cpuset subtree of the benchmark's own, for benchmarks that
//! run the core arbiter daemon (`core-grant`, `kv --neighbour`).
//!
//! The daemon is confined to the subtree (`--cgroup-root`), so it never
//! touches the rest of the machine; the benchmark process moves in, so the
//! daemon puts all of its threads (load generators included) in the
//! unmanaged set, off the managed cores. On drop the process moves back to
//! the root cpuset and the directory is removed. Subtrees of earlier runs
//! that were killed are removed first.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const CPUSET: &str = "/sys/fs/cgroup/cpuset";

/// Why the subtree could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SubtreeError {
    /// Not root, or no cgroup v1 cpuset hierarchy.
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

fn read_ids(p: &Path) -> Vec<u32> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
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
}

impl Subtree {
    /// Creates the subtree with all CPUs and memory nodes and moves this
    /// process into it.
    pub fn create() -> Result<Self, SubtreeError> {
        let root = Path::new(CPUSET);
        if !rustix::process::geteuid().is_root() || !root.join("tasks").exists() {
            return Err(SubtreeError::Unsupported(
                "root and a cgroup v1 cpuset hierarchy at /sys/fs/cgroup/cpuset".into(),
            ));
        }
        remove_stale(root);
        let dir = root.join(format!("corewise-bench-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(io("mkdir", &dir))?;
        let st = Self { dir };
        for f in ["cpuset.mems", "cpuset.cpus"] {
            let v = std::fs::read_to_string(root.join(f)).map_err(io("read", &root.join(f)))?;
            std::fs::write(st.dir.join(f), v.trim()).map_err(io("write", &st.dir.join(f)))?;
        }
        // Every thread of this process moves in; the daemon then puts them
        // in its unmanaged set, off the managed cores.
        let procs = st.dir.join("cgroup.procs");
        std::fs::write(&procs, std::process::id().to_string()).map_err(io("write", &procs))?;
        Ok(st)
    }
}

impl Drop for Subtree {
    fn drop(&mut self) {
        let root = Path::new(CPUSET);
        // Back to the root cpuset (whole process), then remove the directory
        // (the daemon already removed its children). Children started while
        // inside (servers, neighbours) are stopped by their owners first.
        let _ = std::fs::write(root.join("cgroup.procs"), std::process::id().to_string());
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.dir.exists() && std::fs::remove_dir(&self.dir).is_err() {
            for tid in read_ids(&self.dir.join("tasks")) {
                let _ = std::fs::write(root.join("tasks"), tid.to_string());
            }
            if Instant::now() > deadline {
                eprintln!("could not remove {}", self.dir.display());
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
