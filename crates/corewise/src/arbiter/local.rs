//! The in-process arbiter: cores from the CPU budget, no daemon.
//!
//! Why it exists: most programs run without a core arbiter on the machine,
//! and the runtime must still follow Arachne's protocol (kernel threads that
//! block until granted a core and give it back when asked), because the
//! core policy scales the active cores up and down through it. `Local`
//! grants the runtime's own CPUs, in order, up to the number requested (the
//! runtime has already capped the request by the CPU budget).
//!
//! **Where the granted kernel threads run.** With every CPU granted, kernel
//! thread `k` is pinned to `cpus[k]` with `sched_setaffinity`, one per CPU.
//! With fewer granted than CPUs (the core policy, a quota or the neighbour
//! cap holds the runtime back) the granted threads may run on any of the
//! runtime's CPUs and the kernel places them. Pinning a partial grant would
//! put kernel thread 0 of *every* capped process on the first CPU: three
//! corewise processes capped to one core each on a 2-CPU machine all ran on
//! CPU 0 while CPU 1 idled. Without a daemon nobody owns a CPU, so the
//! kernel's load balancer is the one that can see the neighbours. (A
//! departure from Arachne, whose cores are always exclusive, and from the
//! first issue's "one kernel thread pinned per CPU", which now holds for full
//! grants.) Crossing between a full and a partial grant re-places the kernel
//! threads that keep their core.
//!
//! **A handed-over core stays one CPU.** When a stuck kernel thread's core
//! goes to a spare (blocking handoff), a full grant puts the spare on the
//! core's CPU, which the stuck thread is pinned to as well: the pair shares
//! it. Under a partial grant both could run anywhere, so a process capped to
//! one core by its neighbours would compute on two CPUs while a long task
//! held the first (measured beside a neighbour: 1.25 CPUs for a cap of one,
//! and each task slowed by the rival on its CPU). So the spare goes to the
//! CPU the stuck thread last ran on, and the stuck thread is pinned there
//! too until it is given a core again.
use super::{ArbiterError, ArbiterKind, CoreArbiter};
use crate::policy::PRIORITIES;
use rustix::thread::{CpuSet, Pid};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// The in-process arbiter: grants the runtime's CPUs, in order, up to the
/// number requested; with all of them granted kernel thread `k` owns CPU
/// `cpus[k]` and is pinned to it, with fewer the granted threads share all
/// of the runtime's CPUs (see the module docs).
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
    /// Each kernel thread's id once it has been granted a core, so that a
    /// change between a full and a partial grant can re-place it.
    tids: Mutex<Vec<Option<Pid>>>,
    changed: Condvar,
}

impl Local {
    /// An arbiter over `cpus` (kernel thread `k` gets `cpus[k]`).
    ///
    /// ```
    /// use corewise::arbiter::{CoreArbiter, Local};
    /// let cpus: Vec<usize> = corewise::cpu_budget().unwrap().cpus().iter().take(2).collect();
    /// let arbiter = Local::new(cpus.clone());
    /// arbiter.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0]);
    /// // Kernel thread 0 is granted the first CPU; the others wait.
    /// let got = std::thread::scope(|s| s.spawn(|| arbiter.block_until_core_available(0)).join().unwrap());
    /// assert_eq!(got.unwrap(), Some(cpus[0]));
    /// assert!(arbiter.must_release_core(1));
    /// ```
    pub fn new(cpus: Vec<usize>) -> Self {
        let cpus_len = cpus.len();
        Self {
            requested: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            tids: Mutex::new(vec![None; cpus_len]),
            changed: Condvar::new(),
            cpus,
        }
    }

    fn state(&self) -> MutexGuard<'_, Vec<Option<Pid>>> {
        self.tids.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where kernel thread `k` may run while `granted` cores are granted:
    /// its own CPU under a full grant, any of the runtime's otherwise.
    fn placement(&self, k: usize, granted: usize) -> CpuSet {
        let mut set = CpuSet::new();
        if granted >= self.cpus.len() {
            set.set(self.cpus[k]);
        } else {
            for &cpu in &self.cpus {
                set.set(cpu);
            }
        }
        set
    }

    /// Under a partial grant, where the spare that takes kernel thread
    /// `k`'s core will run: the CPU the stuck thread `old` last ran on, to
    /// which `old` is pinned too, so the pair uses one CPU, as one core of a
    /// full grant does (see the module docs). Any of the runtime's CPUs if
    /// that CPU cannot be read or pinned.
    fn share_cpu_with(&self, old: Pid, k: usize, granted: usize) -> CpuSet {
        let Some(cpu) = last_cpu(old).filter(|c| self.cpus.contains(c)) else {
            return self.placement(k, granted);
        };
        let mut set = CpuSet::new();
        set.set(cpu);
        if let Err(e) = rustix::thread::sched_setaffinity(Some(old), &set) {
            // It exited, or the CPU left our set meanwhile.
            tracing::debug!(core = k, error = %e, "cannot pin a handed-off kernel thread");
            return self.placement(k, granted);
        }
        set
    }

    fn notify(&self) {
        let _g = self.state();
        self.changed.notify_all();
    }
}

/// The CPU kernel thread `tid` of this process last ran on (field 39 of
/// `/proc/self/task/TID/stat`).
fn last_cpu(tid: Pid) -> Option<usize> {
    let text = std::fs::read(format!("/proc/self/task/{}/stat", tid.as_raw_nonzero())).ok()?;
    // The command name may hold spaces and parentheses: fields 3 on follow
    // the last ')'.
    let end = text.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(text.get(end + 1..)?).ok()?;
    rest.split_ascii_whitespace().nth(39 - 3)?.parse().ok()
}

impl CoreArbiter for Local {
    fn needs_periodic_requests(&self) -> bool {
        false
    }

    fn set_requested_cores(&self, per_priority: [u32; PRIORITIES]) {
        let total: usize = per_priority.iter().map(|&n| n as usize).sum();
        let total = total.min(self.cpus.len());
        let tids = self.state();
        let before = self.requested.swap(total, Ordering::SeqCst);
        let full = |n: usize| n >= self.cpus.len();
        if full(before) != full(total) {
            // The threads that keep their core move between "pinned" and
            // "anywhere"; newly granted ones place themselves when they wake.
            for (k, tid) in tids.iter().enumerate().take(before.min(total)) {
                let Some(tid) = *tid else { continue };
                if let Err(e) =
                    rustix::thread::sched_setaffinity(Some(tid), &self.placement(k, total))
                {
                    tracing::warn!(core = k, error = %e, "cannot re-place kernel thread");
                }
            }
        }
        self.changed.notify_all();
    }

    fn block_until_core_available(&self, kthread: usize) -> Result<Option<usize>, ArbiterError> {
        let cpu = *self
            .cpus
            .get(kthread)
            .ok_or(ArbiterError::NoSuchThread(kthread))?;
        let mut tids = self.state();
        let granted = loop {
            if self.shutdown.load(Ordering::SeqCst) {
                return Ok(None);
            }
            let granted = self.requested.load(Ordering::SeqCst);
            if kthread < granted {
                break granted;
            }
            tids = self.changed.wait(tids).unwrap_or_else(|e| e.into_inner());
        };
        // Placed under the lock, so a concurrent change of the grant either
        // sees this thread's id or has already published the new count.
        rustix::thread::sched_setaffinity(None, &self.placement(kthread, granted)).map_err(
            |e| ArbiterError::Pin {
                cpu,
                source: e.into(),
            },
        )?;
        tids[kthread] = Some(rustix::thread::gettid());
        Ok(Some(cpu))
    }

    fn must_release_core(&self, kthread: usize) -> bool {
        self.shutdown.load(Ordering::Relaxed) || kthread >= self.requested.load(Ordering::Relaxed)
    }

    fn core_released(&self, _kthread: usize) {}

    fn supports_handoff(&self) -> bool {
        true
    }

    fn core_handed_over(&self, kthread: usize, tid: i32) -> Result<(), ArbiterError> {
        let cpu = *self
            .cpus
            .get(kthread)
            .ok_or(ArbiterError::NoSuchThread(kthread))?;
        let mut tids = self.state();
        let granted = self.requested.load(Ordering::SeqCst);
        let pid = Pid::from_raw(tid).ok_or(ArbiterError::NoSuchThread(kthread))?;
        let set = match tids[kthread].filter(|_| granted < self.cpus.len()) {
            Some(old) => self.share_cpu_with(old, kthread, granted),
            None => self.placement(kthread, granted),
        };
        rustix::thread::sched_setaffinity(Some(pid), &set).map_err(|e| ArbiterError::Pin {
            cpu,
            source: e.into(),
        })?;
        tids[kthread] = Some(pid);
        Ok(())
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn affinity(tid: Pid) -> Vec<usize> {
        let set = rustix::thread::sched_getaffinity(Some(tid)).unwrap();
        (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect()
    }

    /// Two CPUs this process may use, or `None` (and a note) on a machine
    /// with one.
    fn two_cpus() -> Option<Vec<usize>> {
        let set = rustix::thread::sched_getaffinity(None).unwrap();
        let cpus: Vec<usize> = (0..CpuSet::MAX_CPU)
            .filter(|&c| set.is_set(c))
            .take(2)
            .collect();
        if cpus.len() < 2 {
            eprintln!("skipped: needs two CPUs, has {cpus:?}");
            return None;
        }
        Some(cpus)
    }

    #[test]
    fn full_grants_pin_partial_grants_share_the_cpus() {
        let Some(cpus) = two_cpus() else {
            return;
        };
        let local = Arc::new(Local::new(cpus.clone()));
        local.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0]);
        // Real kernel threads, granted as the runtime's would be; each holds
        // its grant (no dispatcher) until the test ends.
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let stop_rx = Arc::new(Mutex::new(stop_rx));
        let grant = |k: usize| {
            let (local, stop_rx) = (local.clone(), stop_rx.clone());
            let (tx, rx) = std::sync::mpsc::channel();
            let t = std::thread::spawn(move || {
                let cpu = local.block_until_core_available(k).unwrap();
                tx.send((cpu, rustix::thread::gettid())).unwrap();
                let _ = stop_rx.lock().unwrap().recv();
            });
            (rx.recv().unwrap(), t)
        };
        let ((cpu0, tid0), t0) = grant(0);
        assert_eq!(cpu0, Some(cpus[0]));
        assert_eq!(affinity(tid0), cpus, "one of two granted: any CPU");
        local.set_requested_cores([2, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(affinity(tid0), vec![cpus[0]], "full grant: thread 0 pinned");
        let ((cpu1, tid1), t1) = grant(1);
        assert_eq!(cpu1, Some(cpus[1]));
        assert_eq!(affinity(tid1), vec![cpus[1]], "full grant: thread 1 pinned");
        local.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            affinity(tid0),
            cpus,
            "back to one: thread 0 shares the CPUs"
        );
        local.shutdown();
        drop(stop_tx);
        t0.join().unwrap();
        t1.join().unwrap();
    }

    #[test]
    fn a_core_handed_over_under_a_partial_grant_stays_one_cpu() {
        let Some(cpus) = two_cpus() else {
            return;
        };
        let local = Arc::new(Local::new(cpus.clone()));
        local.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0]);
        // The core's owner (it computes, as a stuck thread would) and a
        // spare that waits to be given its core.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let owner = {
            let (local, stop, tx) = (local.clone(), stop.clone(), tx.clone());
            std::thread::spawn(move || {
                local.block_until_core_available(0).unwrap();
                tx.send(rustix::thread::gettid()).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let old = rx.recv().unwrap();
        assert_eq!(affinity(old), cpus, "partial grant: any CPU");
        let spare = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                tx.send(rustix::thread::gettid()).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            })
        };
        let new = rx.recv().unwrap();
        local
            .core_handed_over(0, new.as_raw_nonzero().get())
            .unwrap();
        let shared = affinity(new);
        assert_eq!(shared.len(), 1, "the spare runs on one CPU: {shared:?}");
        assert!(cpus.contains(&shared[0]));
        assert_eq!(affinity(old), shared, "the stuck thread shares it");
        // Under a full grant the spare takes the core's own CPU.
        local.set_requested_cores([2, 0, 0, 0, 0, 0, 0, 0]);
        local
            .core_handed_over(0, old.as_raw_nonzero().get())
            .unwrap();
        assert_eq!(affinity(old), vec![cpus[0]]);
        stop.store(true, Ordering::Relaxed);
        local.shutdown();
        owner.join().unwrap();
        spare.join().unwrap();
    }
}
