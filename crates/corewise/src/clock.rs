//! The runtime's clock: the time-stamp counter, calibrated once.
//!
//! Wakeup times live in slots as raw ticks so the dispatcher compares them
//! with one `rdtsc` (a few ns) instead of a `clock_gettime` call. The TSC is
//! used only where the CPU says it is invariant (`constant_tsc` and
//! `nonstop_tsc`); elsewhere ticks are nanoseconds of `CLOCK_MONOTONIC`.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Conversion between ticks and nanoseconds, measured at first use.
#[derive(Debug, Clone, Copy)]
struct Calibration {
    use_tsc: bool,
    ticks_per_ns: f64,
}

static CALIBRATION: OnceLock<Calibration> = OnceLock::new();

fn calibration() -> &'static Calibration {
    CALIBRATION.get_or_init(|| {
        if !tsc_is_invariant() {
            return Calibration {
                use_tsc: false,
                ticks_per_ns: 1.0,
            };
        }
        let t0 = Instant::now();
        let c0 = read_tsc();
        while t0.elapsed() < Duration::from_millis(5) {
            std::hint::spin_loop();
        }
        let c1 = read_tsc();
        let ns = t0.elapsed().as_nanos() as f64;
        Calibration {
            use_tsc: true,
            ticks_per_ns: (c1.wrapping_sub(c0)) as f64 / ns,
        }
    })
}

fn tsc_is_invariant() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    std::fs::read_to_string("/proc/cpuinfo")
        .map(|info| {
            let flags = info
                .lines()
                .find(|l| l.starts_with("flags"))
                .unwrap_or("")
                .to_owned();
            let has = |f: &str| flags.split_whitespace().any(|w| w == f);
            has("constant_tsc") && has("nonstop_tsc")
        })
        .unwrap_or(false)
}

#[inline]
fn read_tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc has no preconditions on x86_64; it only reads a counter.
    unsafe {
        std::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    monotonic_ns()
}

fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Makes sure the clock is calibrated (called once at runtime start, so no
/// user thread pays for calibration).
pub(crate) fn init() {
    calibration();
}

/// The current time in ticks.
#[inline]
pub(crate) fn now() -> u64 {
    let c = calibration();
    if c.use_tsc {
        read_tsc()
    } else {
        monotonic_ns()
    }
}

/// Converts a duration into ticks, saturating.
pub(crate) fn duration_to_ticks(d: Duration) -> u64 {
    let t = d.as_nanos() as f64 * calibration().ticks_per_ns;
    if t >= u64::MAX as f64 {
        u64::MAX
    } else {
        t as u64
    }
}

/// Converts ticks into a duration.
pub(crate) fn ticks_to_duration(ticks: u64) -> Duration {
    Duration::from_nanos((ticks as f64 / calibration().ticks_per_ns) as u64)
}

/// The tick value of `deadline` (saturating at `u64::MAX - 1`, which the
/// dispatcher still treats as a deadline, and at `now` for the past).
pub(crate) fn instant_to_ticks(deadline: Instant) -> u64 {
    let now_i = Instant::now();
    let now_t = now();
    match deadline.checked_duration_since(now_i) {
        Some(d) => now_t.saturating_add(duration_to_ticks(d)).min(u64::MAX - 1),
        None => now_t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_advance_and_convert_back() {
        init();
        let a = now();
        std::thread::sleep(Duration::from_millis(2));
        let b = now();
        assert!(b > a);
        let d = ticks_to_duration(b - a);
        assert!(d >= Duration::from_millis(1), "{d:?}");
        let t = duration_to_ticks(Duration::from_micros(100));
        let back = ticks_to_duration(t);
        assert!(back.as_nanos().abs_diff(100_000) < 1_000, "{back:?}");
    }

    #[test]
    fn past_deadline_is_now() {
        let t = instant_to_ticks(Instant::now() - Duration::from_secs(1));
        assert!(t <= now());
    }
}
