//! How many CPUs may this process use? The answer corewise computes for
//! itself ([`corewise::cpu_budget`]: affinity ∩ every cpuset ∩
//! ceil(CFS quota), for the process's cgroup and every parent, cgroup v1
//! and v2), offered to every language.
//!
//! Languages disagree on the number under a quota: most runtimes count the
//! affinity mask or the online CPUs and ignore cgroup quotas, so a program
//! limited to 1.5 CPUs starts a thread per CPU of the host (the friendlypool
//! paper's table of runtimes, and its call for one language-independent
//! interface). Three ways to ask:
//!
//! - the command `corewise-cpus` (prints the number; `--explain`, `--json`),
//!   for shell scripts and container entry points
//!   (`GOMAXPROCS=$(corewise-cpus)`);
//! - the C ABI of `libcorewise_budget.so` ([`corewise_budget_cores`],
//!   [`corewise_budget_json`]; header `include/corewise_budget.h`), for C,
//!   Python's ctypes and any language with a C FFI;
//! - [`explain`] from Rust.
//!
//! This crate only reads the budget through `corewise`'s public API; the
//! cgroup walk itself lives in `corewise::budget`.
//!
//! ```
//! let e = corewise_budget::explain().unwrap();
//! assert!(e.cores >= 1 && e.cores <= e.cpus.len());
//! assert!(e.to_json().contains("\"cores\""));
//! ```

use std::ffi::c_char;
use std::fmt;

use corewise::budget::{BudgetReason, QuotaLimit};
use corewise::{BudgetError, CpuList};

/// Every limit that applies to this process, and the one that set the
/// count.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    /// The core count: at least 1, at most `cpus.len()`.
    pub cores: usize,
    /// The process's affinity mask (`sched_getaffinity`).
    pub affinity: CpuList,
    /// The CPUs it may run on: affinity ∩ online ∩ every cpuset.
    pub cpus: CpuList,
    /// The cgroup whose cpuset narrowed `cpus` last, if any did.
    pub cpuset: Option<String>,
    /// The tightest CFS quota on the process's cgroup or a parent, if any.
    pub quota: Option<QuotaLimit>,
    /// `COREWISE_MAX_CORES`, when set.
    pub env_override: Option<usize>,
    /// Which limit set `cores`: `"affinity"`, `"cpuset"`, `"quota"` or
    /// `"env"`.
    pub winner: &'static str,
}

/// Reads the budget of the calling process and every limit behind it.
///
/// ```
/// let e = corewise_budget::explain().unwrap();
/// println!("{e}");
/// ```
pub fn explain() -> Result<Explanation, BudgetError> {
    let budget = corewise::cpu_budget()?;
    let set = rustix::thread::sched_getaffinity(None).map_err(|e| BudgetError::Affinity {
        target: "self".to_owned(),
        source: e.into(),
    })?;
    let affinity: CpuList = (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| set.is_set(c))
        .collect();
    let (winner, cpuset, env_override) = match budget.reason() {
        BudgetReason::Affinity => ("affinity", None, None),
        BudgetReason::Cpuset { path } => ("cpuset", Some(path.display().to_string()), None),
        BudgetReason::Quota(_) => ("quota", None, None),
        BudgetReason::EnvOverride { value } => ("env", None, Some(*value)),
        _ => ("other", None, None),
    };
    // A cpuset that narrowed the set but did not decide the count is still
    // a limit worth showing.
    let cpuset = cpuset.or_else(|| {
        (budget.cpus().len() < affinity.len()).then(|| "(a cpuset or the online CPUs)".to_owned())
    });
    Ok(Explanation {
        cores: budget.cores(),
        affinity,
        cpus: budget.cpus().clone(),
        cpuset,
        quota: budget.quota().cloned(),
        env_override,
        winner,
    })
}

impl Explanation {
    /// The explanation as one JSON object (see the crate's README for the
    /// fields).
    ///
    /// ```
    /// let j = corewise_budget::explain().unwrap().to_json();
    /// let v: serde_json::Value = serde_json::from_str(&j).unwrap();
    /// assert!(v["cores"].as_u64().unwrap() >= 1);
    /// ```
    pub fn to_json(&self) -> String {
        let quota = self.quota.as_ref().map(|q| {
            serde_json::json!({
                "path": q.path.display().to_string(),
                "quota_us": q.quota_us,
                "period_us": q.period_us,
                "cpus": q.cpus(),
                "cores": q.cores(),
            })
        });
        serde_json::json!({
            "cores": self.cores,
            "winner": self.winner,
            "affinity": { "cpus": self.affinity.to_string(), "count": self.affinity.len() },
            "cpus": { "cpus": self.cpus.to_string(), "count": self.cpus.len() },
            "cpuset": self.cpuset,
            "quota": quota,
            "env_override": self.env_override,
        })
        .to_string()
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = |name: &str| {
            if self.winner == name {
                "  <- sets the count"
            } else {
                ""
            }
        };
        writeln!(
            f,
            "affinity:  {} CPUs ({}){}",
            self.affinity.len(),
            self.affinity,
            mark("affinity")
        )?;
        match &self.cpuset {
            Some(path) => writeln!(
                f,
                "cpuset:    {} CPUs ({}) at {path}{}",
                self.cpus.len(),
                self.cpus,
                mark("cpuset")
            )?,
            None => writeln!(f, "cpuset:    no narrower cpuset")?,
        }
        match &self.quota {
            Some(q) => writeln!(
                f,
                "quota:     {}/{} us = {:.2} CPUs -> {} cores at {}{}",
                q.quota_us,
                q.period_us,
                q.cpus(),
                q.cores(),
                q.path.display(),
                mark("quota")
            )?,
            None => writeln!(f, "quota:     none")?,
        }
        if let Some(v) = self.env_override {
            writeln!(f, "override:  COREWISE_MAX_CORES={v}{}", mark("env"))?;
        }
        write!(f, "cores:     {}", self.cores)
    }
}

/// The CPU count of the calling process (at least 1), or -1 when it could
/// not be read (a malformed cgroup file, for instance).
///
/// C: `int corewise_budget_cores(void);`
///
/// ```
/// assert!(corewise_budget::corewise_budget_cores() >= 1);
/// ```
#[no_mangle]
pub extern "C" fn corewise_budget_cores() -> i32 {
    std::panic::catch_unwind(|| match corewise::cpu_budget() {
        Ok(b) => i32::try_from(b.cores()).unwrap_or(i32::MAX),
        Err(_) => -1,
    })
    .unwrap_or(-1)
}

/// Writes the explanation as JSON (NUL-terminated) into `buf` of `len`
/// bytes and returns its length without the NUL, like `snprintf`: when the
/// return value is `len` or more, the text did not fit (nothing is written
/// unless it fits) and the caller retries with a larger buffer. `buf` may be
/// null when `len` is 0. Returns -1 when the budget could not be read.
///
/// C: `long corewise_budget_json(char *buf, size_t len);`
///
/// # Safety
///
/// `buf` must be valid for writes of `len` bytes (or `len` must be 0).
///
/// ```
/// // SAFETY: a null buffer of length 0 is allowed.
/// let n = unsafe { corewise_budget::corewise_budget_json(std::ptr::null_mut(), 0) };
/// let mut buf = vec![0u8; n as usize + 1];
/// // SAFETY: `buf` is valid for `buf.len()` bytes.
/// let m = unsafe { corewise_budget::corewise_budget_json(buf.as_mut_ptr().cast(), buf.len()) };
/// assert_eq!(m, n);
/// assert_eq!(buf[n as usize], 0);
/// ```
#[no_mangle]
pub unsafe extern "C" fn corewise_budget_json(buf: *mut c_char, len: usize) -> isize {
    let Ok(Ok(text)) = std::panic::catch_unwind(|| explain().map(|e| e.to_json())) else {
        return -1;
    };
    let bytes = text.as_bytes();
    if !buf.is_null() && bytes.len() < len {
        // SAFETY: the caller guarantees `buf` is valid for `len` bytes, and
        // `bytes.len() + 1 <= len`; the source is a fresh String, so the two
        // do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
            *buf.add(bytes.len()) = 0;
        }
    }
    isize::try_from(bytes.len()).unwrap_or(isize::MAX)
}
