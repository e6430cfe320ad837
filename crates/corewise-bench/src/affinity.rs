//! Thread pinning through `sched_setaffinity`.

use crate::error::BenchError;
use rustix::thread::{sched_getaffinity, sched_getcpu, sched_setaffinity, CpuSet};

/// Pins the calling thread to `cpu`.
pub fn pin_current(cpu: usize) -> Result<(), BenchError> {
    if cpu >= CpuSet::MAX_CPU {
        return Err(BenchError::Pin {
            cpu,
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        });
    }
    let mut set = CpuSet::new();
    set.set(cpu);
    sched_setaffinity(None, &set).map_err(|e| BenchError::Pin {
        cpu,
        source: e.into(),
    })
}

/// The CPUs the calling thread may run on.
pub fn allowed_cpus() -> Result<Vec<usize>, BenchError> {
    let set = sched_getaffinity(None).map_err(|e| BenchError::io("sched_getaffinity", e.into()))?;
    Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
}

/// The CPU the calling thread is running on right now.
#[inline]
pub fn current_cpu() -> usize {
    sched_getcpu()
}

/// Confines the process `cmd` starts to `cpus` (set between fork and exec,
/// so the child's every thread inherits it). CPUs beyond what a `CpuSet`
/// holds are left out; the caller takes its CPUs from [`allowed_cpus`].
pub fn confine_child(cmd: &mut std::process::Command, cpus: &[usize]) {
    use std::os::unix::process::CommandExt;
    let mut set = CpuSet::new();
    for &c in cpus.iter().filter(|&&c| c < CpuSet::MAX_CPU) {
        set.set(c);
    }
    // SAFETY: the hook runs in the forked child before exec and only makes
    // one system call (sched_setaffinity) on a set built before the fork
    // and copied into the closure: no allocation, no lock, nothing that is
    // unsafe after fork.
    unsafe {
        cmd.pre_exec(move || sched_setaffinity(None, &set).map_err(std::io::Error::from));
    }
}
