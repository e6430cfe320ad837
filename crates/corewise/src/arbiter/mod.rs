//! Where cores come from.
//!
//! The runtime starts one kernel thread per CPU it may ever use. Each one
//! loops: [`CoreArbiter::block_until_core_available`] (sleep until granted a
//! core; return confined to it), run the dispatcher while it holds the core,
//! and give the core back when [`CoreArbiter::must_release_core`] says so.
//! This is Arachne's arbiter protocol; the [`Local`] arbiter implements it in
//! process from the CPU budget, so no daemon is needed. (The daemon client
//! arrives with the `corewise-arbiter` crate.)

use crate::policy::PRIORITIES;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use thiserror::Error;

/// An arbiter failure.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ArbiterError {
    /// The kernel thread could not be confined to its core.
    #[error("cannot pin kernel thread to CPU {cpu}: {source}")]
    Pin {
        /// The CPU.
        cpu: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// The kernel thread index is not one the arbiter knows.
    #[error("no kernel thread {0}")]
    NoSuchThread(usize),
}

/// The arbiter protocol, as the runtime's kernel threads use it.
pub trait CoreArbiter: Send + Sync + 'static {
    /// The application wants `per_priority[i]` cores at priority `i`.
    fn set_requested_cores(&self, per_priority: [u32; PRIORITIES]);

    /// Kernel thread `kthread` sleeps until it is granted a core and returns
    /// the CPU it now runs on, or `None` once the arbiter is shut down.
    fn block_until_core_available(&self, kthread: usize) -> Result<Option<usize>, ArbiterError>;

    /// Whether kernel thread `kthread` must give its core back.
    fn must_release_core(&self, kthread: usize) -> bool;

    /// Kernel thread `kthread` has stopped using its core.
    fn core_released(&self, kthread: usize);

    /// Cores granted now.
    fn granted(&self) -> usize;

    /// Ends the protocol: every kernel thread is told to release and
    /// `block_until_core_available` returns `None`.
    fn shutdown(&self);
}

/// The in-process arbiter: grants the runtime's CPUs, in order, up to the
/// number requested; kernel thread `k` owns CPU `cpus[k]` and is pinned to it.
///
/// ```
/// use corewise::arbiter::{CoreArbiter, Local};
/// let a = Local::new(vec![0]);
/// a.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0]);
/// assert_eq!(a.block_until_core_available(0).unwrap(), Some(0));
/// assert!(!a.must_release_core(0));
/// a.shutdown();
/// assert!(a.must_release_core(0));
/// ```
#[derive(Debug)]
pub struct Local {
    cpus: Vec<usize>,
    requested: AtomicUsize,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    changed: Condvar,
}

impl Local {
    /// An arbiter over `cpus` (kernel thread `k` gets `cpus[k]`).
    pub fn new(cpus: Vec<usize>) -> Self {
        Self {
            cpus,
            requested: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            lock: Mutex::new(()),
            changed: Condvar::new(),
        }
    }

    fn notify(&self) {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.changed.notify_all();
    }
}

impl CoreArbiter for Local {
    fn set_requested_cores(&self, per_priority: [u32; PRIORITIES]) {
        let total: usize = per_priority.iter().map(|&n| n as usize).sum();
        self.requested
            .store(total.min(self.cpus.len()), Ordering::SeqCst);
        self.notify();
    }

    fn block_until_core_available(&self, kthread: usize) -> Result<Option<usize>, ArbiterError> {
        let cpu = *self
            .cpus
            .get(kthread)
            .ok_or(ArbiterError::NoSuchThread(kthread))?;
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.shutdown.load(Ordering::SeqCst) {
                return Ok(None);
            }
            if kthread < self.requested.load(Ordering::SeqCst) {
                break;
            }
            g = self.changed.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        drop(g);
        let mut set = rustix::thread::CpuSet::new();
        set.set(cpu);
        rustix::thread::sched_setaffinity(None, &set).map_err(|e| ArbiterError::Pin {
            cpu,
            source: e.into(),
        })?;
        Ok(Some(cpu))
    }

    fn must_release_core(&self, kthread: usize) -> bool {
        self.shutdown.load(Ordering::Relaxed) || kthread >= self.requested.load(Ordering::Relaxed)
    }

    fn core_released(&self, _kthread: usize) {}

    fn granted(&self) -> usize {
        self.requested.load(Ordering::Relaxed)
    }

    fn shutdown(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        self.notify();
    }
}
