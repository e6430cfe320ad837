//! CPU lists and machine topology.
//!
//! Why: the policy keeps hyperthread siblings and sockets together, so it needs
//! to know which CPUs share a physical core and a package. That comes from
//! `/sys/devices/system/cpu/cpu*/topology`; on machines (or containers) where
//! those files are missing every CPU is treated as its own core on package 0,
//! which is correct without hyperthreads.

use std::path::Path;

/// A CPU (core) number as the kernel numbers it.
///
/// ```
/// use corewise_arbiter::CoreId;
/// use corewise_arbiter::topology::Topology;
/// let cpu: CoreId = 3;
/// assert_eq!(Topology::synthetic(1, 2, 2).siblings(cpu), vec![2, 3]);
/// ```
pub type CoreId = u32;

pub use crate::cpulist::{CpuList, CpuListError};

/// Where one CPU sits.
///
/// ```
/// use corewise_arbiter::topology::{CpuPlace, Topology};
/// let t = Topology::synthetic(2, 1, 2);
/// // CPU 3: the second hyperthread of package 1's only core (core id 1).
/// assert_eq!(t.places()[3], CpuPlace { cpu: 3, core: 1, package: 1 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuPlace {
    /// The CPU.
    pub cpu: CoreId,
    /// Physical core id (shared by hyperthread siblings).
    pub core: u32,
    /// Package (socket) id.
    pub package: u32,
}

/// The topology of the CPUs the daemon manages.
///
/// ```
/// use corewise_arbiter::topology::Topology;
/// // Two packages, two cores each, two hyperthreads per core.
/// let t = Topology::synthetic(2, 2, 2);
/// assert_eq!(t.siblings(0), vec![0, 1]);
/// assert_eq!(t.package_of(5), Some(1));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    places: Vec<CpuPlace>,
}

impl Topology {
    /// Reads the topology of `cpus` from sysfs (`/sys/devices/system/cpu`).
    ///
    /// ```
    /// use corewise_arbiter::topology::{online_cpus, Topology};
    /// let cpus = online_cpus();
    /// let t = Topology::read(&cpus);
    /// assert_eq!(t.places().len(), cpus.len());
    /// assert!(cpus.cores().all(|c| t.siblings(c).contains(&c)));
    /// ```
    pub fn read(cpus: &CpuList) -> Self {
        Self::read_from(Path::new("/sys/devices/system/cpu"), cpus)
    }

    /// Reads from another sysfs-like directory (for tests).
    ///
    /// ```
    /// use corewise_arbiter::topology::{CpuList, Topology};
    /// // A sysfs-like tree where CPUs 0 and 1 are hyperthreads of core 0.
    /// let base = std::env::temp_dir().join(format!("topology-doc-{}", std::process::id()));
    /// for cpu in 0..2 {
    ///     let dir = base.join(format!("cpu{cpu}/topology"));
    ///     std::fs::create_dir_all(&dir)?;
    ///     std::fs::write(dir.join("core_id"), "0\n")?;
    ///     std::fs::write(dir.join("physical_package_id"), "0\n")?;
    /// }
    /// let cpus: CpuList = "0-2".parse().unwrap();
    /// let t = Topology::read_from(&base, &cpus);
    /// assert!(t.are_siblings(0, 1));
    /// // CPU 2 has no files: its own core.
    /// assert_eq!(t.siblings(2), vec![2]);
    /// std::fs::remove_dir_all(&base)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn read_from(base: &Path, cpus: &CpuList) -> Self {
        let read_num = |cpu: CoreId, file: &str| -> Option<u32> {
            let p = base.join(format!("cpu{cpu}/topology/{file}"));
            std::fs::read_to_string(p)
                .ok()?
                .trim()
                .parse::<i64>()
                .ok()
                .map(|v| v.max(0) as u32)
        };
        let places = cpus
            .cores()
            .map(|cpu| CpuPlace {
                cpu,
                // Without topology files each CPU is its own physical core.
                core: read_num(cpu, "core_id").map_or(cpu, |c| c),
                package: read_num(cpu, "physical_package_id").unwrap_or(0),
            })
            .collect::<Vec<_>>();
        // If core_id came from sysfs for some CPUs but not others, keys could
        // collide with CPU numbers; that only makes grouping coarser, never wrong.
        Self { places }
    }

    /// A regular machine: CPUs numbered package-major, core, then thread.
    ///
    /// ```
    /// use corewise_arbiter::topology::Topology;
    /// // One package, four cores, no hyperthreads.
    /// let t = Topology::synthetic(1, 4, 1);
    /// assert_eq!(t.places().len(), 4);
    /// assert_eq!(t.siblings(2), vec![2]);
    /// assert_eq!(t.package_of(3), Some(0));
    /// ```
    pub fn synthetic(packages: u32, cores_per_package: u32, threads_per_core: u32) -> Self {
        let mut places = Vec::new();
        let mut cpu = 0;
        for p in 0..packages {
            for c in 0..cores_per_package {
                for _ in 0..threads_per_core {
                    places.push(CpuPlace {
                        cpu,
                        core: p * cores_per_package + c,
                        package: p,
                    });
                    cpu += 1;
                }
            }
        }
        Self { places }
    }

    /// Every CPU described.
    ///
    /// ```
    /// use corewise_arbiter::topology::Topology;
    /// let t = Topology::synthetic(2, 2, 1);
    /// let packages: Vec<u32> = t.places().iter().map(|p| p.package).collect();
    /// assert_eq!(packages, vec![0, 0, 1, 1]);
    /// ```
    pub fn places(&self) -> &[CpuPlace] {
        &self.places
    }

    fn place(&self, cpu: CoreId) -> Option<&CpuPlace> {
        self.places.iter().find(|p| p.cpu == cpu)
    }

    /// CPUs sharing a physical core with `cpu` (including `cpu`).
    ///
    /// ```
    /// use corewise_arbiter::topology::Topology;
    /// let t = Topology::synthetic(1, 2, 2);
    /// assert_eq!(t.siblings(1), vec![0, 1]);
    /// // A CPU not described is its own only sibling.
    /// assert_eq!(t.siblings(9), vec![9]);
    /// ```
    pub fn siblings(&self, cpu: CoreId) -> Vec<CoreId> {
        match self.place(cpu) {
            Some(me) => self
                .places
                .iter()
                .filter(|p| p.core == me.core && p.package == me.package)
                .map(|p| p.cpu)
                .collect(),
            None => vec![cpu],
        }
    }

    /// Package of `cpu`, if known.
    ///
    /// ```
    /// use corewise_arbiter::topology::Topology;
    /// let t = Topology::synthetic(2, 2, 2);
    /// assert_eq!(t.package_of(3), Some(0));
    /// assert_eq!(t.package_of(4), Some(1));
    /// assert_eq!(t.package_of(8), None);
    /// ```
    pub fn package_of(&self, cpu: CoreId) -> Option<u32> {
        self.place(cpu).map(|p| p.package)
    }

    /// Whether two CPUs are hyperthreads of one physical core.
    ///
    /// ```
    /// use corewise_arbiter::topology::Topology;
    /// let t = Topology::synthetic(1, 2, 2);
    /// assert!(t.are_siblings(2, 3));
    /// assert!(!t.are_siblings(1, 2));
    /// assert!(!t.are_siblings(2, 2)); // a CPU is not its own sibling
    /// ```
    pub fn are_siblings(&self, a: CoreId, b: CoreId) -> bool {
        match (self.place(a), self.place(b)) {
            (Some(x), Some(y)) => a != b && x.core == y.core && x.package == y.package,
            _ => false,
        }
    }
}

/// CPUs online on this machine (`/sys/devices/system/cpu/online`), falling
/// back to the calling thread's affinity.
///
/// ```
/// use corewise_arbiter::topology::online_cpus;
/// let cpus = online_cpus();
/// assert!(!cpus.is_empty());
/// assert!(cpus.contains(rustix::thread::sched_getcpu()));
/// ```
pub fn online_cpus() -> CpuList {
    if let Ok(s) = std::fs::read_to_string("/sys/devices/system/cpu/online") {
        if let Ok(l) = s.parse::<CpuList>() {
            if !l.is_empty() {
                return l;
            }
        }
    }
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&c| set.is_set(c))
            .collect(),
        Err(_) => std::iter::once(0usize).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists() {
        for s in ["", "0", "0-3", "0,2,4-6", "1023"] {
            let l: CpuList = s.parse().unwrap();
            assert_eq!(l.to_string(), s);
        }
        for s in ["-1", "a", "1-", "2-1", "65536"] {
            assert!(s.parse::<CpuList>().is_err(), "{s}");
        }
        assert_eq!("0-1\n".parse::<CpuList>().unwrap().len(), 2);
    }

    #[test]
    fn real_topology_is_consistent() {
        let cpus = online_cpus();
        let t = Topology::read(&cpus);
        assert_eq!(t.places().len(), cpus.len());
        for c in cpus.cores() {
            assert!(t.siblings(c).contains(&c));
        }
    }

    #[test]
    fn missing_sysfs_means_no_siblings() {
        let cpus: CpuList = "0-3".parse().unwrap();
        let t = Topology::read_from(Path::new("/nonexistent"), &cpus);
        assert_eq!(t.siblings(2), vec![2]);
        assert!(!t.are_siblings(0, 1));
    }
}
