//! `--max-map-count N`: raises the kernel's `vm.max_map_count` for one run
//! of `threads` and puts the old value back afterwards.
//!
//! Runtimes that map every stack on its own (may, std threads: a mapping
//! and a guard each) need about two mappings per thread, so 1 000 000 of
//! them do not fit under the default 65 530. The value is system-wide, so
//! the benchmark never leaves it changed: a guard restores it when the run
//! ends, returns an error or panics, and a SIGINT/SIGTERM handler restores
//! it before the process dies of the signal. (SIGKILL cannot be caught;
//! the old value is printed to stderr when it is raised.)

use crate::error::BenchError;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

const PATH: &str = "/proc/sys/vm/max_map_count";
/// The same path, NUL-terminated, for the signal handler's `open`.
const PATH_C: &[u8] = b"/proc/sys/vm/max_map_count\0";

/// The value to restore from the signal handler (0: nothing to restore).
static RESTORE: AtomicU64 = AtomicU64::new(0);

/// The current `vm.max_map_count`, if readable.
pub fn current() -> Option<u64> {
    std::fs::read_to_string(PATH).ok()?.trim().parse().ok()
}

fn write(v: u64) -> std::io::Result<()> {
    std::fs::write(PATH, format!("{v}\n"))
}

/// A raised `vm.max_map_count`; dropping it writes the old value back.
#[derive(Debug)]
pub struct Raised {
    /// The value before the run.
    pub old: u64,
    /// The value in force for the run.
    pub now: u64,
}

impl Raised {
    /// Sets `vm.max_map_count` to `n` if it is lower (needs root).
    pub fn to(n: u64) -> Result<Raised, BenchError> {
        let old = current().ok_or_else(|| BenchError::Machine(format!("cannot read {PATH}")))?;
        if n <= old {
            return Ok(Raised { old, now: old });
        }
        RESTORE.store(old, Ordering::SeqCst);
        install_handlers();
        write(n).map_err(|e| {
            RESTORE.store(0, Ordering::SeqCst);
            BenchError::io(format!("raising {PATH} to {n} (needs root)"), e)
        })?;
        eprintln!("threads: vm.max_map_count raised from {old} to {n} for this run");
        Ok(Raised { old, now: n })
    }

    /// The line for the table's notes.
    pub fn note(&self) -> String {
        if self.now == self.old {
            format!(
                "vm.max_map_count = {} (already at least the --max-map-count asked for)",
                self.now
            )
        } else {
            format!(
                "vm.max_map_count = {} for this run (--max-map-count; {} before, restored after)",
                self.now, self.old
            )
        }
    }
}

impl Drop for Raised {
    fn drop(&mut self) {
        if self.now == self.old {
            return;
        }
        RESTORE.store(0, Ordering::SeqCst);
        if let Err(e) = write(self.old) {
            eprintln!(
                "threads: could not restore vm.max_map_count to {}: {e}",
                self.old
            );
        }
    }
}

/// Restores the old value, then dies of the same signal.
extern "C" fn on_signal(sig: libc::c_int) {
    let v = RESTORE.swap(0, Ordering::SeqCst);
    if v != 0 {
        // Digits into a stack buffer: integer formatting into a slice
        // neither allocates nor locks.
        let mut buf = [0u8; 24];
        let mut cur = std::io::Cursor::new(&mut buf[..]);
        let _ = writeln!(cur, "{v}");
        let len = cur.position() as usize;
        // SAFETY: open, write, close and signal are async-signal-safe; the
        // path is NUL-terminated and the buffer outlives the calls.
        unsafe {
            let fd = libc::open(PATH_C.as_ptr().cast(), libc::O_WRONLY);
            if fd >= 0 {
                libc::write(fd, buf.as_ptr().cast(), len);
                libc::close(fd);
            }
        }
    }
    // SAFETY: back to the default action, then the signal again, so the
    // process ends as it would have without the handler.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

fn install_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `on_signal` only makes async-signal-safe calls.
        unsafe {
            libc::signal(
                sig,
                on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
}
