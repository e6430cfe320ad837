//! Keeping a just-freed managed core out of deep idle for a short window.
//!
//! A grant ends with a wake-up of the granted thread on the granted core.
//! When that core is idle, the wake-up waits for the CPU to leave its idle
//! state: microseconds for a shallow C-state on bare metal, but on a
//! virtual machine a halted vCPU must be rescheduled by the host, which on
//! the 2-vCPU machines this project runs on costs about 40 µs — more than
//! everything else in a grant together (a bare cross-core wake-up through
//! a socket: ~46 µs to a halted CPU, ~5 µs to a polling one).
//!
//! Cores are released and wanted again on the time scale of the runtime's
//! core estimation, so the daemon keeps a core that just became free in the
//! polling idle state for a bounded window (default 1 ms) through the CPU's
//! per-device PM QoS resume-latency limit
//! (`/sys/devices/system/cpu/cpuN/power/pm_qos_resume_latency_us` set to
//! `n/a`, which leaves cpuidle only its polling state). When the window
//! ends, or the core is granted (its new holder's idle sleep should halt
//! again), or the daemon exits, the CPU gets its original limit back. This
//! is what the haltpoll cpuidle governor does for every idle entry, limited
//! to the managed cores the daemon owns and to the moments after a release;
//! the price is at most one window of polling per release. A window of zero
//! turns it off; where the file is missing or read-only the daemon says so
//! once and grants without it.
//!
//! A daemon killed in the middle of a window (kill -9) cannot restore the
//! limit, and a core left polling would burn its CPU until reboot. So the
//! originals are also written to a record file (next to the daemon's
//! socket) when the daemon starts and removed when it exits; a daemon that
//! finds a record left behind first puts those limits back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::topology::CoreId;

/// The value that allows only the polling idle state.
const POLL_ONLY: &str = "n/a";

/// Default sysfs directory of the CPU devices.
///
/// ```
/// use corewise_arbiter::warm::SYSFS_CPU_ROOT;
/// // CPU 0's directory is always there on Linux.
/// assert!(std::path::Path::new(SYSFS_CPU_ROOT).join("cpu0").is_dir());
/// ```
pub const SYSFS_CPU_ROOT: &str = "/sys/devices/system/cpu";

struct Entry {
    path: PathBuf,
    original: String,
    /// While warm: when the window ends.
    until: Option<Instant>,
}

/// The warm-window state of the managed cores.
///
/// ```
/// use corewise_arbiter::warm::WarmCores;
/// use std::time::{Duration, Instant};
/// let dir = std::env::temp_dir().join(format!("warm-doc-{}", std::process::id()));
/// std::fs::create_dir_all(dir.join("cpu1/power")).unwrap();
/// let file = dir.join("cpu1/power/pm_qos_resume_latency_us");
/// std::fs::write(&file, "0\n").unwrap();
/// let mut warm = WarmCores::new(&dir, &[1], Duration::from_millis(1), None);
/// let now = Instant::now();
/// warm.freed(1, now);
/// assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), "n/a");
/// warm.expire(now + Duration::from_millis(2));
/// assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), "0");
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub struct WarmCores {
    window: Duration,
    cores: BTreeMap<CoreId, Entry>,
    record: Option<PathBuf>,
}

impl WarmCores {
    /// Reads the current limits of `managed` under `cpu_root` (normally
    /// [`SYSFS_CPU_ROOT`]). A core whose file cannot be read and written
    /// back, or that is already poll-only, is left alone. With `record`,
    /// first restores what a previous daemon's record file there lists,
    /// then writes this daemon's originals to it.
    ///
    /// ```
    /// use corewise_arbiter::warm::WarmCores;
    /// use std::time::{Duration, Instant};
    /// // A fake sysfs tree: CPU 2's limit is 0, CPU 3 has no file.
    /// let dir = std::env::temp_dir().join(format!("warm-new-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(dir.join("cpu2/power"))?;
    /// std::fs::write(dir.join("cpu2/power/pm_qos_resume_latency_us"), "0\n")?;
    /// let record = dir.join("record");
    /// let mut warm = WarmCores::new(&dir, &[2, 3], Duration::from_millis(1), Some(&record));
    /// // The original limit is recorded for a later daemon to restore.
    /// assert_eq!(std::fs::read_to_string(&record)?, "2 0\n");
    /// warm.freed(2, Instant::now());
    /// warm.freed(3, Instant::now());
    /// assert!(warm.is_warm(2) && !warm.is_warm(3));
    /// drop(warm);
    /// std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn new(
        cpu_root: &Path,
        managed: &[CoreId],
        window: Duration,
        record: Option<&Path>,
    ) -> Self {
        if let Some(r) = record {
            recover(cpu_root, r);
        }
        let mut cores = BTreeMap::new();
        if !window.is_zero() {
            for &c in managed {
                let path = cpu_root
                    .join(format!("cpu{c}"))
                    .join("power/pm_qos_resume_latency_us");
                let original = match std::fs::read_to_string(&path) {
                    Ok(s) => s.trim().to_owned(),
                    Err(e) => {
                        tracing::warn!(core = c, error = %e, path = %path.display(),
                            "no PM QoS limit to hold freed cores awake; grants to idle cores pay the idle exit");
                        continue;
                    }
                };
                if original == POLL_ONLY {
                    // Someone else keeps it polling; nothing to do or undo.
                    continue;
                }
                if let Err(e) = std::fs::write(&path, &original) {
                    tracing::warn!(core = c, error = %e, path = %path.display(),
                        "PM QoS limit not writable; grants to idle cores pay the idle exit");
                    continue;
                }
                cores.insert(
                    c,
                    Entry {
                        path,
                        original,
                        until: None,
                    },
                );
            }
        }
        let record = record.and_then(|r| {
            let text: String = cores
                .iter()
                .map(|(c, e)| format!("{c} {}\n", e.original))
                .collect();
            if cores.is_empty() {
                return None;
            }
            match write_record(r, &text) {
                Ok(()) => Some(r.to_path_buf()),
                Err(e) => {
                    tracing::warn!(path = %r.display(), error = %e, "cannot write the PM QoS record");
                    None
                }
            }
        });
        Self {
            window,
            cores,
            record,
        }
    }

    /// A window that does nothing (`--warm-window 0`, tests).
    ///
    /// ```
    /// use corewise_arbiter::warm::WarmCores;
    /// let mut warm = WarmCores::disabled();
    /// warm.freed(1, std::time::Instant::now());
    /// assert!(!warm.is_warm(1));
    /// assert_eq!(warm.next_deadline(), None);
    /// ```
    pub fn disabled() -> Self {
        Self {
            window: Duration::ZERO,
            cores: BTreeMap::new(),
            record: None,
        }
    }

    /// `core` just became free: keep it polling until `now + window`.
    ///
    /// ```
    /// use corewise_arbiter::warm::WarmCores;
    /// use std::time::{Duration, Instant};
    /// let dir = std::env::temp_dir().join(format!("warm-freed-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(dir.join("cpu1/power"))?;
    /// let file = dir.join("cpu1/power/pm_qos_resume_latency_us");
    /// std::fs::write(&file, "0\n")?;
    /// let mut warm = WarmCores::new(&dir, &[1], Duration::from_millis(1), None);
    /// let now = Instant::now();
    /// warm.freed(1, now);
    /// assert_eq!(std::fs::read_to_string(&file)?, "n/a");
    /// assert_eq!(warm.next_deadline(), Some(now + Duration::from_millis(1)));
    /// drop(warm); // gives the original limit back
    /// assert_eq!(std::fs::read_to_string(&file)?, "0");
    /// std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn freed(&mut self, core: CoreId, now: Instant) {
        let window = self.window;
        let Some(e) = self.cores.get_mut(&core) else {
            return;
        };
        // Already warm: extend the window; else open it if the write works.
        if e.until.is_some() || write(&e.path, POLL_ONLY) {
            e.until = Some(now + window);
        }
    }

    /// `core` was granted: its holder's idle sleep may halt again.
    ///
    /// ```
    /// use corewise_arbiter::warm::WarmCores;
    /// use std::time::{Duration, Instant};
    /// let dir = std::env::temp_dir().join(format!("warm-taken-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(dir.join("cpu1/power"))?;
    /// let file = dir.join("cpu1/power/pm_qos_resume_latency_us");
    /// std::fs::write(&file, "20\n")?;
    /// let mut warm = WarmCores::new(&dir, &[1], Duration::from_secs(1), None);
    /// warm.freed(1, Instant::now());
    /// warm.taken(1); // granted again before the window ended
    /// assert!(!warm.is_warm(1));
    /// assert_eq!(std::fs::read_to_string(&file)?, "20");
    /// std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn taken(&mut self, core: CoreId) {
        if let Some(e) = self.cores.get_mut(&core) {
            restore(e);
        }
    }

    /// Ends every window that is over at `now`.
    ///
    /// ```
    /// use corewise_arbiter::warm::WarmCores;
    /// use std::time::{Duration, Instant};
    /// let dir = std::env::temp_dir().join(format!("warm-expire-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(dir.join("cpu1/power"))?;
    /// std::fs::write(dir.join("cpu1/power/pm_qos_resume_latency_us"), "0\n")?;
    /// let mut warm = WarmCores::new(&dir, &[1], Duration::from_millis(5), None);
    /// let now = Instant::now();
    /// warm.freed(1, now);
    /// warm.expire(now + Duration::from_millis(1));
    /// assert!(warm.is_warm(1));
    /// warm.expire(now + Duration::from_millis(5));
    /// assert!(!warm.is_warm(1));
    /// std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn expire(&mut self, now: Instant) {
        for e in self.cores.values_mut() {
            if e.until.is_some_and(|u| u <= now) {
                restore(e);
            }
        }
    }

    /// When the next window ends.
    ///
    /// ```
    /// use corewise_arbiter::warm::WarmCores;
    /// use std::time::{Duration, Instant};
    /// let dir = std::env::temp_dir().join(format!("warm-deadline-doc-{}", std::process::id()));
    /// for cpu in [1, 2] {
    ///     std::fs::create_dir_all(dir.join(format!("cpu{cpu}/power")))?;
    ///     std::fs::write(dir.join(format!("cpu{cpu}/power/pm_qos_resume_latency_us")), "0\n")?;
    /// }
    /// let mut warm = WarmCores::new(&dir, &[1, 2], Duration::from_millis(3), None);
    /// let now = Instant::now();
    /// assert_eq!(warm.next_deadline(), None);
    /// warm.freed(2, now + Duration::from_millis(1));
    /// warm.freed(1, now);
    /// assert_eq!(warm.next_deadline(), Some(now + Duration::from_millis(3)));
    /// drop(warm);
    /// std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn next_deadline(&self) -> Option<Instant> {
        self.cores.values().filter_map(|e| e.until).min()
    }

    /// Whether `core` is in its window now.
    ///
    /// ```
    /// use corewise_arbiter::warm::WarmCores;
    /// use std::time::{Duration, Instant};
    /// let dir = std::env::temp_dir().join(format!("warm-is-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(dir.join("cpu4/power"))?;
    /// std::fs::write(dir.join("cpu4/power/pm_qos_resume_latency_us"), "0\n")?;
    /// let mut warm = WarmCores::new(&dir, &[4], Duration::from_millis(1), None);
    /// assert!(!warm.is_warm(4));
    /// warm.freed(4, Instant::now());
    /// assert!(warm.is_warm(4));
    /// drop(warm);
    /// std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_warm(&self, core: CoreId) -> bool {
        self.cores.get(&core).is_some_and(|e| e.until.is_some())
    }

    /// Gives every core its original limit back and removes the record
    /// (daemon exit).
    ///
    /// ```
    /// use corewise_arbiter::warm::WarmCores;
    /// use std::time::{Duration, Instant};
    /// let dir = std::env::temp_dir().join(format!("warm-restore-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(dir.join("cpu1/power"))?;
    /// let file = dir.join("cpu1/power/pm_qos_resume_latency_us");
    /// std::fs::write(&file, "0\n")?;
    /// let record = dir.join("record");
    /// let mut warm = WarmCores::new(&dir, &[1], Duration::from_secs(1), Some(&record));
    /// warm.freed(1, Instant::now());
    /// warm.restore_all();
    /// assert_eq!(std::fs::read_to_string(&file)?, "0");
    /// assert!(!record.exists());
    /// std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restore_all(&mut self) {
        for e in self.cores.values_mut() {
            restore(e);
        }
        if let Some(r) = self.record.take() {
            let _ = std::fs::remove_file(r);
        }
    }
}

impl Drop for WarmCores {
    fn drop(&mut self) {
        self.restore_all();
    }
}

/// Creates the record anew, as a regular file only the daemon's user may
/// read and write. The record lives next to the socket, possibly in a
/// directory other users can write to: a symlink or a file planted there
/// is never followed, truncated or written (root would otherwise write
/// through a link to any file).
fn write_record(record: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // A record left behind was read and removed by `recover`; whatever is
    // there now is not ours.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(record)?;
    f.write_all(text.as_bytes())
}

/// Reads a record only if it is a regular file (not followed through a
/// symlink) owned by the daemon's user: anyone else's file says nothing
/// about what a previous daemon changed.
fn read_record(record: &Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(record)
        .ok()?;
    let m = f.metadata().ok()?;
    if !m.is_file() || m.uid() != rustix::process::geteuid().as_raw() {
        tracing::warn!(path = %record.display(), "ignoring a PM QoS record the daemon did not write");
        return None;
    }
    let mut text = String::new();
    f.by_ref().take(64 << 10).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Puts back the limits a daemon that did not exit cleanly recorded, where
/// its window left them poll-only, and removes its record.
fn recover(cpu_root: &Path, record: &Path) {
    let Some(text) = read_record(record) else {
        // Not ours (or absent): removed all the same (unlink does not
        // follow a symlink), so that a record of this daemon can be made.
        let _ = std::fs::remove_file(record);
        return;
    };
    for line in text.lines() {
        let Some((cpu, value)) = line.split_once(' ') else {
            continue;
        };
        let Ok(cpu) = cpu.parse::<CoreId>() else {
            continue;
        };
        let value = value.trim();
        if value.is_empty() || value == POLL_ONLY {
            continue;
        }
        let path = cpu_root
            .join(format!("cpu{cpu}"))
            .join("power/pm_qos_resume_latency_us");
        if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == POLL_ONLY)
            && write(&path, value)
        {
            tracing::info!(
                core = cpu,
                value,
                "restored a PM QoS limit left by a previous daemon"
            );
        }
    }
    let _ = std::fs::remove_file(record);
}

fn restore(e: &mut Entry) {
    if e.until.take().is_some() {
        let _ = write(&e.path, &e.original);
    }
}

fn write(path: &Path, value: &str) -> bool {
    match std::fs::write(path, value) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "PM QoS write failed");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct FakeSysfs(PathBuf);

    impl FakeSysfs {
        fn new(tag: &str, cpus: &[(CoreId, &str)]) -> Self {
            let dir = std::env::temp_dir().join(format!("warm-{tag}-{}", std::process::id()));
            for &(c, v) in cpus {
                let p = dir.join(format!("cpu{c}/power"));
                std::fs::create_dir_all(&p).unwrap();
                std::fs::write(p.join("pm_qos_resume_latency_us"), format!("{v}\n")).unwrap();
            }
            Self(dir)
        }
        fn value(&self, c: CoreId) -> String {
            std::fs::read_to_string(
                self.0
                    .join(format!("cpu{c}/power/pm_qos_resume_latency_us")),
            )
            .unwrap()
            .trim()
            .to_owned()
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn window_opens_on_release_and_closes_on_grant_expiry_and_exit() {
        let fs = FakeSysfs::new("cycle", &[(1, "0"), (2, "25")]);
        let mut w = WarmCores::new(&fs.0, &[1, 2], Duration::from_millis(1), None);
        let t = Instant::now();
        w.freed(1, t);
        w.freed(2, t);
        assert_eq!((fs.value(1), fs.value(2)), ("n/a".into(), "n/a".into()));
        assert_eq!(w.next_deadline(), Some(t + Duration::from_millis(1)));
        w.taken(1);
        assert_eq!(fs.value(1), "0");
        assert!(!w.is_warm(1) && w.is_warm(2));
        w.expire(t + Duration::from_micros(500));
        assert_eq!(fs.value(2), "n/a");
        w.expire(t + Duration::from_millis(1));
        assert_eq!(fs.value(2), "25", "the original limit comes back");
        w.freed(2, t);
        drop(w);
        assert_eq!(fs.value(2), "25", "exit restores");
    }

    #[test]
    fn missing_files_already_polling_cores_and_zero_window_are_left_alone() {
        let fs = FakeSysfs::new("skip", &[(1, "n/a")]);
        let mut w = WarmCores::new(&fs.0, &[1, 3], Duration::from_millis(1), None);
        w.freed(1, Instant::now());
        w.freed(3, Instant::now());
        assert_eq!(w.next_deadline(), None);
        drop(w);
        assert_eq!(fs.value(1), "n/a", "not ours to restore");
        let fs = FakeSysfs::new("zero", &[(1, "0")]);
        let mut w = WarmCores::new(&fs.0, &[1], Duration::ZERO, None);
        w.freed(1, Instant::now());
        assert_eq!(fs.value(1), "0");
    }

    #[test]
    fn a_second_release_extends_the_window() {
        let fs = FakeSysfs::new("extend", &[(1, "0")]);
        let mut w = WarmCores::new(&fs.0, &[1], Duration::from_millis(1), None);
        let t = Instant::now();
        w.freed(1, t);
        w.freed(1, t + Duration::from_micros(800));
        w.expire(t + Duration::from_millis(1));
        assert_eq!(fs.value(1), "n/a");
        w.expire(t + Duration::from_micros(1800));
        assert_eq!(fs.value(1), "0");
    }

    #[test]
    fn a_planted_record_is_neither_followed_nor_trusted() {
        let fs = FakeSysfs::new("planted", &[(1, "0"), (2, "n/a")]);
        let victim = fs.0.join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        // A symlink where the record goes: the daemon must not write
        // through it.
        let record = fs.0.join("arbiter.sock.pmqos");
        std::os::unix::fs::symlink(&victim, &record).unwrap();
        let w = WarmCores::new(&fs.0, &[1], Duration::from_millis(1), Some(&record));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        assert_eq!(
            std::fs::read_to_string(&record).unwrap(),
            "1 0\n",
            "the link was replaced by a record of the daemon's own"
        );
        drop(w);
        assert!(victim.exists() && !record.exists());
        // A link planted between the removal of a stale record and the
        // write of the new one (a race a local user can run in a loop):
        // the write fails instead of going through it.
        std::os::unix::fs::symlink(&victim, &record).unwrap();
        assert!(write_record(&record, "1 0\n").is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        std::fs::remove_file(&record).unwrap();
        // A record owned by someone else is not restored from (giving it
        // away needs root).
        std::fs::write(&record, "2 42\n").unwrap();
        if std::os::unix::fs::chown(&record, Some(65534), None).is_err() {
            return;
        }
        drop(WarmCores::new(
            &fs.0,
            &[1],
            Duration::from_millis(1),
            Some(&record),
        ));
        assert_eq!(fs.value(2), "n/a", "a stranger's record changes nothing");
    }

    #[test]
    fn a_record_left_by_a_killed_daemon_is_restored_at_start() {
        let fs = FakeSysfs::new("record", &[(1, "0")]);
        let record = fs.0.join("arbiter.sock.pmqos");
        let mut w = WarmCores::new(&fs.0, &[1], Duration::from_millis(1), Some(&record));
        assert_eq!(std::fs::read_to_string(&record).unwrap(), "1 0\n");
        w.freed(1, Instant::now());
        // kill -9: nothing is restored.
        std::mem::forget(w);
        assert_eq!(fs.value(1), "n/a");
        let w = WarmCores::new(&fs.0, &[1], Duration::from_millis(1), Some(&record));
        assert_eq!(fs.value(1), "0", "the next daemon puts the limit back");
        assert!(!w.is_warm(1));
        drop(w);
        assert!(!record.exists(), "a clean exit removes the record");
    }
}
