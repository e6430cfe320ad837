//! The in-process arbiter: cores from the CPU budget, no daemon.
//!
//! Why it exists: most programs run without a core arbiter on the machine,
//! and the runtime must still follow Arachne's protocol (kernel threads that
//! block until granted a core and give it back when asked), because the
//! core policy scales the active cores up and down through it. `Local`
//! grants the runtime's own CPUs, in order, up to the number requested (the
//! runtime has already capped the request by the CPU budget), and pins each
//! kernel thread to its CPU with `sched_setaffinity`.

use super::{ArbiterError, ArbiterKind, CoreArbiter};
use crate::policy::PRIORITIES;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

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

    fn kind(&self) -> ArbiterKind {
        ArbiterKind::Local
    }
}
