//! The one clock every runtime is measured with.
//!
//! On x86_64 with an invariant TSC (`constant_tsc` and `nonstop_tsc` in
//! /proc/cpuinfo) the clock is the TSC, read with `lfence; rdtsc`, and
//! calibrated against `CLOCK_MONOTONIC`. The TSC is synchronised across cores
//! on such machines, so a tick taken on one core can be subtracted from a tick
//! taken on the other. Elsewhere (or with `--clock mono`) the clock is
//! `clock_gettime(CLOCK_MONOTONIC)` and one tick is one nanosecond.

use rustix::time::{clock_gettime, ClockId};
use std::time::{Duration, Instant};

/// Where ticks come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The time-stamp counter (x86_64 only).
    Tsc,
    /// `clock_gettime(CLOCK_MONOTONIC)` in nanoseconds.
    Monotonic,
}

impl Source {
    /// Short name, also passed to the Go peer (`tsc` or `mono`).
    pub fn name(self) -> &'static str {
        match self {
            Source::Tsc => "tsc",
            Source::Monotonic => "mono",
        }
    }
}

/// A calibrated clock. `Copy`, so every measuring thread carries its own.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    source: Source,
    ticks_per_ns: f64,
}

/// One simultaneous reading of the tick source and of `CLOCK_MONOTONIC`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pair {
    /// Ticks.
    pub ticks: u64,
    /// Monotonic nanoseconds.
    pub ns: u64,
}

/// Ticks per nanosecond between two readings; `None` when they do not allow
/// a positive, finite rate.
pub fn ticks_per_ns_from(a: Pair, b: Pair) -> Option<f64> {
    let dt = b.ticks.checked_sub(a.ticks)?;
    let dn = b.ns.checked_sub(a.ns)?;
    if dt == 0 || dn == 0 {
        return None;
    }
    let r = dt as f64 / dn as f64;
    r.is_finite().then_some(r)
}

#[inline]
fn mono_ns() -> u64 {
    let t = clock_gettime(ClockId::Monotonic);
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn tsc() -> u64 {
    // SAFETY: lfence and rdtsc have no memory effects; x86_64 always has
    // SSE2 (lfence) and the TSC.
    unsafe {
        core::arch::x86_64::_mm_lfence();
        core::arch::x86_64::_rdtsc()
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn tsc() -> u64 {
    mono_ns()
}

/// Whether this machine has a TSC that ticks at a constant rate in every
/// state and may be compared across cores.
pub fn invariant_tsc() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    let flags = info.lines().find(|l| l.starts_with("flags"));
    flags.is_some_and(|l| {
        let mut constant = false;
        let mut nonstop = false;
        for f in l.split_whitespace() {
            constant |= f == "constant_tsc";
            nonstop |= f == "nonstop_tsc";
        }
        constant && nonstop
    })
}

impl Clock {
    /// The monotonic clock: one tick per nanosecond, no calibration.
    pub fn monotonic() -> Self {
        Clock {
            source: Source::Monotonic,
            ticks_per_ns: 1.0,
        }
    }

    /// A TSC clock with a given rate (used by tests and by calibration).
    pub fn tsc_with_rate(ticks_per_ns: f64) -> Self {
        Clock {
            source: Source::Tsc,
            ticks_per_ns,
        }
    }

    /// The best clock for this machine: the TSC when it is invariant and
    /// `prefer_tsc` is set, calibrated over `window`; the monotonic clock
    /// otherwise.
    pub fn calibrate(prefer_tsc: bool, window: Duration) -> Self {
        if !(prefer_tsc && invariant_tsc()) {
            return Clock::monotonic();
        }
        let a = tight_pair();
        let start = Instant::now();
        while start.elapsed() < window {
            std::thread::sleep(Duration::from_millis(1));
        }
        let b = tight_pair();
        match ticks_per_ns_from(a, b) {
            Some(r) => Clock::tsc_with_rate(r),
            None => Clock::monotonic(),
        }
    }

    /// The tick source.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Ticks per nanosecond.
    pub fn ticks_per_ns(&self) -> f64 {
        self.ticks_per_ns
    }

    /// Reads the clock at the start of a measured operation: first waits
    /// (a full fence) until the caller's earlier stores have reached the
    /// cache, so the interval covers the operation and not the draining of
    /// unrelated writes before it (the stamp reset, the wake flag). Go's
    /// peer gets the same from its atomic store just before it reads the
    /// clock.
    #[inline(always)]
    pub fn start(&self) -> u64 {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        self.now()
    }

    /// Reads the clock.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        match self.source {
            Source::Tsc => tsc(),
            Source::Monotonic => mono_ns(),
        }
    }

    /// Converts a tick count to nanoseconds.
    #[inline]
    pub fn ticks_to_ns(&self, ticks: u64) -> f64 {
        ticks as f64 / self.ticks_per_ns
    }

    /// Nanoseconds from `start` to `end` (both from [`Clock::now`]); a
    /// negative interval (clock skew between cores) is clamped to zero.
    #[inline]
    pub fn delta_ns(&self, start: u64, end: u64) -> f64 {
        self.ticks_to_ns(end.saturating_sub(start))
    }
}

/// A (TSC, monotonic) reading whose monotonic bracket is the narrowest of a
/// few tries, so the two values belong to the same instant as nearly as
/// possible.
fn tight_pair() -> Pair {
    let mut best: Option<(u64, Pair)> = None;
    for _ in 0..16 {
        let n0 = mono_ns();
        let t = tsc();
        let n1 = mono_ns();
        let width = n1.saturating_sub(n0);
        let p = Pair {
            ticks: t,
            ns: n0 + width / 2,
        };
        if best.is_none_or(|(w, _)| width < w) {
            best = Some((width, p));
        }
    }
    best.map(|(_, p)| p).unwrap_or(Pair {
        ticks: tsc(),
        ns: mono_ns(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_from_synthetic_pairs() {
        let a = Pair {
            ticks: 1_000,
            ns: 10_000,
        };
        let b = Pair {
            ticks: 1_000 + 3_000_000,
            ns: 10_000 + 1_000_000,
        };
        let r = ticks_per_ns_from(a, b).expect("rate");
        assert!((r - 3.0).abs() < 1e-12);
        let c = Clock::tsc_with_rate(r);
        assert!((c.delta_ns(0, 3_000) - 1_000.0).abs() < 1e-9);
        // A backwards interval is clamped, never negative.
        assert_eq!(c.delta_ns(10, 5), 0.0);
    }

    #[test]
    fn degenerate_pairs_are_rejected() {
        let a = Pair { ticks: 5, ns: 5 };
        assert_eq!(ticks_per_ns_from(a, a), None);
        let back = Pair { ticks: 4, ns: 9 };
        assert_eq!(ticks_per_ns_from(a, back), None);
    }

    #[test]
    fn calibrated_clock_is_sane() {
        let c = Clock::calibrate(true, Duration::from_millis(20));
        assert!(c.ticks_per_ns() > 0.0 && c.ticks_per_ns().is_finite());
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
        if c.source() == Source::Monotonic {
            assert_eq!(c.ticks_per_ns(), 1.0);
        }
    }
}
