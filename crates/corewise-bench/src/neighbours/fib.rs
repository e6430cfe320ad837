//! The unit of work: a naive recursive Fibonacci, as in the friendlypool
//! paper, and its calibration.
//!
//! The paper computes `fib(30)`. Its cost is machine dependent; when
//! `fib(30)` takes longer than the limit (5 ms by default) the benchmark
//! uses the largest `N` whose predicted time fits: each step down divides
//! the number of calls by the golden ratio φ, so
//! `N = 30 − ceil(log_φ(t(30) / limit))`. The chosen `N` is then measured
//! again (median of several runs) and that measurement sizes the rate.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// The golden ratio: fib(n) calls grow by this factor per step of `n`.
pub const PHI: f64 = 1.618_033_988_749_895;

/// Naive recursive Fibonacci (deliberately exponential).
pub fn fib(n: u32) -> u64 {
    if n < 2 {
        u64::from(n)
    } else {
        fib(black_box(n - 1)) + fib(black_box(n - 2))
    }
}

/// The largest `n ≤ base` whose predicted run time is at most `limit`,
/// given that `fib(base)` took `t_base`; never below `min`.
pub fn choose_n(base: u32, t_base: Duration, limit: Duration, min: u32) -> u32 {
    let (t, l) = (t_base.as_secs_f64(), limit.as_secs_f64());
    if !(t.is_finite() && l > 0.0) || t <= l {
        return base.max(min);
    }
    // The tolerance absorbs nanosecond rounding of the measured times.
    let steps = ((t / l).ln() / PHI.ln() - 1e-6).ceil().max(0.0) as u32;
    base.saturating_sub(steps).max(min)
}

/// Predicted time of `fib(n)` from a measurement of `fib(base)`.
#[cfg(test)]
pub fn predict(base: u32, t_base: Duration, n: u32) -> Duration {
    let f = PHI.powi(n as i32 - base as i32);
    Duration::from_secs_f64(t_base.as_secs_f64() * f)
}

/// Shortest wall time of `runs` evaluations of `fib(n)`: the minimum, not
/// the median, because other processes (concurrent builds on a shared
/// machine) only ever make a run slower, and the rate must be sized from
/// the task's cost on an uncontended CPU.
pub fn measure(n: u32, runs: usize) -> Duration {
    (0..runs.max(1))
        .map(|_| {
            let t = Instant::now();
            black_box(fib(black_box(n)));
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

/// The result of a calibration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// The argument used.
    pub n: u32,
    /// Shortest time of one `fib(n)` on this machine (see [`measure`]).
    pub task: Duration,
    /// Shortest time of `fib(base)`.
    pub base_time: Duration,
}

/// Measures `fib(base)`, picks `n` with [`choose_n`] for `limit`, and
/// measures `fib(n)`.
pub fn calibrate(base: u32, limit: Duration, min: u32) -> Calibration {
    // Warm the CPU up (frequency) before timing.
    black_box(fib(black_box(base.min(25))));
    let base_time = measure(base, 5);
    let n = choose_n(base, base_time, limit, min);
    let task = if n == base { base_time } else { measure(n, 9) };
    Calibration { n, task, base_time }
}

/// The largest `n ≤ max` (not below `min`) whose `fib(n)` takes at most
/// `target`, found by measuring upwards: used for the short tasks of
/// `cores`.
pub fn n_for(target: Duration, min: u32, max: u32) -> Calibration {
    let mut n = min;
    let mut t = measure(n, 15);
    while n < max {
        let next = measure(n + 1, 15);
        if next > target {
            break;
        }
        n += 1;
        t = next;
    }
    Calibration {
        n,
        task: t,
        base_time: t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fib_values() {
        assert_eq!(fib(0), 0);
        assert_eq!(fib(1), 1);
        assert_eq!(fib(10), 55);
        assert_eq!(fib(20), 6765);
    }

    #[test]
    fn keeps_base_when_fast_enough() {
        let ms = Duration::from_millis;
        assert_eq!(choose_n(30, ms(4), ms(5), 20), 30);
        assert_eq!(choose_n(30, ms(5), ms(5), 20), 30);
    }

    #[test]
    fn steps_down_by_golden_ratio() {
        let ms = Duration::from_millis;
        // 8 ms / 5 ms = 1.6 < φ: one step.
        assert_eq!(choose_n(30, ms(8), ms(5), 20), 29);
        // 8.1 ms / 5 ms > φ: two steps.
        assert_eq!(choose_n(30, Duration::from_micros(8_100), ms(5), 20), 28);
        // φ² exactly (rounded to µs) stays two steps, and the prediction fits.
        let t = Duration::from_secs_f64(0.005 * PHI * PHI);
        let n = choose_n(30, t, ms(5), 20);
        assert_eq!(n, 28);
        assert!(predict(30, t, n) <= ms(5) + Duration::from_nanos(10));
        // Never below the floor.
        assert_eq!(choose_n(30, Duration::from_secs(100), ms(5), 25), 25);
    }

    #[test]
    fn prediction_scales_by_phi() {
        let t = predict(30, Duration::from_millis(10), 29);
        assert!((t.as_secs_f64() - 0.01 / PHI).abs() < 1e-9);
        let u = predict(30, Duration::from_millis(10), 31);
        assert!((u.as_secs_f64() - 0.01 * PHI).abs() < 1e-9);
    }

    #[test]
    fn degenerate_inputs_keep_base() {
        assert_eq!(
            choose_n(30, Duration::from_millis(9), Duration::ZERO, 20),
            30
        );
    }
}
