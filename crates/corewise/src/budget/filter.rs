//! Smoothing and hysteresis between the raw neighbour share and the cap.
//!
//! friendlypool's cap is `ceil(O · share · CPUs)`. Fed a raw share that sits
//! near an integer boundary (two CPUs, one of three busy threads ours: `2/3 ·
//! 2 = 1.33`, or exactly `1.0` when the split is even), `ceil()` flips the cap
//! on every measurement wobble. This filter makes the cap change only when the
//! share has really moved:
//!
//! * **Smoothing**: an exponentially weighted moving average of the share
//!   with weight `alpha` for the newest sample. With windows of 10 ms and
//!   `alpha = 0.3`, a step in the share is 97 % followed after 10 samples
//!   (100 ms), which is the follow-time target.
//! * **Offset boundaries**: the cap for demand `d = O · share · CPUs` is
//!   `ceil(d - OFFSET)` with `OFFSET = 0.65`, not `ceil(d)`. Processes that
//!   all want every core split the host evenly, so the demand of each sits
//!   *exactly* on an integer (1.0 for two such processes on two CPUs) and
//!   measurement noise would put it on either side of `ceil()`'s boundary.
//!   With the offset an integer demand `k` is well inside cap `k`'s range
//!   `(k - 0.35, k + 0.65]`.
//!   Why more than half a core: a pool that holds more cores than its
//!   neighbours measures a larger share *because* it holds them. A pool at
//!   a full grant pins one kernel thread per CPU (see
//!   [`crate::arbiter::Local`]), so a neighbour's busy thread (an aware
//!   pool capped to one core, or a plain spinning process) shares a CPU
//!   with one of them and the kernel cannot place it better: on two CPUs
//!   the pool gets 1.5 CPUs and the neighbour 0.5 (measured, 1.50 against
//!   0.50), a demand of `c - 0.5` = 1.5. With the boundary half a core
//!   above the integers and a band of 0.15 (as before) 1.5 kept two cores
//!   for good: beside an aware neighbour the measured pool got 0.51 CPU in
//!   three of five `neighbours --quick` runs. The shrink boundary from `c`
//!   is now `c - 1 + 0.65 - 0.1` = `c - 0.45`, above `c - 0.5`, so the pool
//!   comes down to one core and both get one CPU. (Earlier, `OFFSET =
//!   0.25` kept 1.33, two aware pools' demand under per-thread fairness.)
//!   The price: a neighbour that wants half a CPU or more also makes a
//!   full grant give one core up, since its demand reads the same.
//! * **Hysteresis**: the cap grows from `c` only when the smoothed demand
//!   exceeds `c + OFFSET + band`, and shrinks only when it drops below
//!   `c - 1 + OFFSET - band` (the new cap is `ceil(d - OFFSET)`, clamped to
//!   `[1, budget]`). A demand hovering within `band` of a boundary never
//!   flips the cap. Alone, a pool reads a share near 1: a demand of
//!   `CPUs`, above the grow boundary as long as others use less than
//!   `(0.35 - band) / CPUs` of the host's busy time.
//!
//! The samples come from nanosecond counters (the process CPU clock and
//! the `cpuacct` root's usage, see [`NeighbourShare`](super::NeighbourShare));
//! the measurements behind that choice are in `docs/architecture.md`.
//!
//! The filter is pure (no clock, no I/O), so it is unit-tested
//! deterministically; [`NeighbourShare`](super::NeighbourShare) feeds it
//! one sample per window.

/// Where the cap boundaries sit above the integers, in cores (see the
/// module docs for why 0.65).
///
/// ```
/// use corewise::budget::{ShareFilter, OFFSET};
/// // Cap 1's range of demands is (OFFSET, 1 + OFFSET]: an even split of
/// // two CPUs (demand 1.0) is inside it, and so is 1.5, what a pool at
/// // two pinned cores beside one busy thread reads.
/// assert!(OFFSET < 1.0 && 1.5 <= 1.0 + OFFSET);
/// let mut f = ShareFilter::new(1.0, 2, 1.0, 0.0, 2);
/// assert_eq!(f.push(0.75), 1); // demand 1.5
/// assert_eq!(f.push(0.5), 1); // demand 1.0
/// ```
pub const OFFSET: f64 = 0.65;

/// EWMA plus a dead band around the current cap.
///
/// ```
/// use corewise::budget::ShareFilter;
/// let mut f = ShareFilter::new(1.0, 2, 0.3, 0.15, 2);
/// // A share hovering around the 1|2 boundary (demand 1.55..1.75) keeps the cap.
/// let start = f.push(0.825);
/// for i in 0..100 {
///     let s = if i % 2 == 0 { 0.775 } else { 0.875 };
///     assert_eq!(f.push(s), start);
/// }
/// ```
#[derive(Debug, Clone)]
pub struct ShareFilter {
    overcommit: f64,
    host_cpus: usize,
    alpha: f64,
    band: f64,
    budget: usize,
    smoothed: Option<f64>,
    cap: usize,
}

impl ShareFilter {
    /// A filter for `host_cpus` CPUs, a cap in `[1, budget]`, EWMA weight
    /// `alpha` (clamped to `(0, 1]`) and dead band `band` in cores on each
    /// side of a boundary (clamped to `[0, 0.5]`). The cap starts at `budget`.
    ///
    /// ```
    /// use corewise::budget::ShareFilter;
    /// let f = ShareFilter::new(1.0, 2, 0.3, 0.25, 2);
    /// assert_eq!(f.cap(), 2);
    /// ```
    pub fn new(overcommit: f64, host_cpus: usize, alpha: f64, band: f64, budget: usize) -> Self {
        let budget = budget.max(1);
        Self {
            overcommit: if overcommit.is_finite() && overcommit > 0.0 {
                overcommit
            } else {
                1.0
            },
            host_cpus: host_cpus.max(1),
            alpha: if alpha.is_finite() {
                alpha.clamp(f64::MIN_POSITIVE, 1.0)
            } else {
                1.0
            },
            band: if band.is_finite() {
                band.clamp(0.0, 0.5)
            } else {
                0.0
            },
            budget,
            smoothed: None,
            cap: budget,
        }
    }

    /// The current cap.
    ///
    /// ```
    /// use corewise::budget::ShareFilter;
    /// let mut f = ShareFilter::new(1.0, 2, 1.0, 0.25, 2);
    /// assert_eq!(f.push(0.2), 1);
    /// assert_eq!(f.cap(), 1);
    /// ```
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The smoothed share, if any sample was pushed.
    ///
    /// ```
    /// use corewise::budget::ShareFilter;
    /// let mut f = ShareFilter::new(1.0, 2, 0.5, 0.25, 2);
    /// f.push(1.0);
    /// f.push(0.0);
    /// assert_eq!(f.smoothed(), Some(0.5));
    /// ```
    pub fn smoothed(&self) -> Option<f64> {
        self.smoothed
    }

    /// Changes the budget; the cap is clamped to it at once (and may grow
    /// to it with the next sample).
    ///
    /// ```
    /// use corewise::budget::ShareFilter;
    /// let mut f = ShareFilter::new(1.0, 4, 1.0, 0.15, 4);
    /// f.set_budget(2);
    /// assert_eq!(f.cap(), 2);
    /// ```
    pub fn set_budget(&mut self, budget: usize) {
        self.budget = budget.max(1);
        self.cap = self.cap.min(self.budget);
    }

    /// Changes the number of CPUs the share is counted over (the process's
    /// CPU set changed). The smoothed share was a share of the old set, so
    /// it is forgotten; the cap stays until the next sample.
    ///
    /// ```
    /// use corewise::budget::ShareFilter;
    /// let mut f = ShareFilter::new(1.0, 8, 1.0, 0.1, 2);
    /// assert_eq!(f.push(0.2), 2); // a fifth of 8 CPUs: demand 1.6
    /// f.set_host_cpus(2);
    /// assert_eq!(f.smoothed(), None);
    /// assert_eq!(f.push(0.2), 1); // a fifth of 2 CPUs: demand 0.4
    /// ```
    pub fn set_host_cpus(&mut self, host_cpus: usize) {
        self.host_cpus = host_cpus.max(1);
        self.smoothed = None;
    }

    /// Forget the history (after an idle period: the next sample starts fresh)
    /// and return to the whole budget.
    ///
    /// ```
    /// use corewise::budget::ShareFilter;
    /// let mut f = ShareFilter::new(1.0, 2, 1.0, 0.25, 2);
    /// f.push(0.1);
    /// f.reset();
    /// assert_eq!(f.cap(), 2);
    /// ```
    pub fn reset(&mut self) {
        self.smoothed = None;
        self.cap = self.budget;
    }

    /// Feed one share sample (`self / all`, clamped to `[0, 1]`; NaN ignored)
    /// and return the cap.
    ///
    /// ```
    /// use corewise::budget::ShareFilter;
    /// let mut f = ShareFilter::new(1.0, 2, 1.0, 0.15, 2);
    /// assert_eq!(f.push(0.5), 1); // demand 1.0 < 2 - 1 + 0.65 - 0.15
    /// assert_eq!(f.push(0.85), 1); // demand 1.7: inside the band
    /// assert_eq!(f.push(0.95), 2); // demand 1.9 > 1 + 0.65 + 0.15
    /// ```
    pub fn push(&mut self, share: f64) -> usize {
        if share.is_nan() {
            return self.cap;
        }
        let share = share.clamp(0.0, 1.0);
        let s = match self.smoothed {
            None => share,
            Some(prev) => prev + self.alpha * (share - prev),
        };
        self.smoothed = Some(s);
        let demand = self.overcommit * s * self.host_cpus as f64;
        let cap = self.cap as f64;
        let next = if demand > cap + OFFSET + self.band || demand < cap - 1.0 + OFFSET - self.band {
            (demand - OFFSET).ceil()
        } else {
            cap
        };
        self.cap = (next.max(1.0) as usize).min(self.budget);
        self.cap
    }
}

#[cfg(test)]
mod tests {
    use super::{ShareFilter, OFFSET};

    /// A deterministic wobble in `[-1, 1]`.
    fn wobble(i: u32) -> f64 {
        (((i * 7919) % 21) as f64 - 10.0) / 10.0
    }

    /// Cap changes while `share(i)` is pushed 1000 times after `f` settled.
    fn flips(f: &mut ShareFilter, share: impl Fn(u32) -> f64) -> usize {
        let mut last = f.cap();
        let mut changes = 0;
        for i in 0..1000u32 {
            let c = f.push(share(i));
            if c != last {
                changes += 1;
                last = c;
            }
        }
        changes
    }

    #[test]
    fn hovering_at_boundary_never_flips() {
        // Two CPUs; the 1|2 boundary is at demand 1 + OFFSET, share 0.625.
        // The raw share wobbles by ±0.06 (demand ±0.12) around it, from
        // either side: the cap stays where it was.
        let boundary = (1.0 + OFFSET) / 2.0;
        for start in [0.2, 1.0] {
            let mut f = ShareFilter::new(1.0, 2, 0.3, 0.15, 2);
            for _ in 0..50 {
                f.push(start);
            }
            let settled = f.cap();
            let changes = flips(&mut f, |i| boundary + 0.06 * wobble(i));
            assert_eq!(
                changes, 0,
                "from share {start}: cap flipped {changes} times"
            );
            assert_eq!(f.cap(), settled);
        }
    }

    #[test]
    fn raw_ceil_would_flip_on_same_input() {
        // The wobble through the unfiltered formula does flip, around
        // ceil()'s boundary and around the offset one: the test above is
        // therefore not vacuous.
        for (centre, offset) in [(0.5, 0.0), ((1.0 + OFFSET) / 2.0, OFFSET)] {
            let mut flips = 0;
            let mut last = None;
            for i in 0..1000u32 {
                let s = centre + 0.06 * wobble(i);
                let c = (s * 2.0 - offset - 1e-9).ceil() as usize;
                if last.is_some_and(|l| l != c) {
                    flips += 1;
                }
                last = Some(c);
            }
            assert!(flips > 10, "centre {centre}: {flips}");
        }
    }

    #[test]
    fn an_even_split_settles_on_the_fair_cap() {
        // One neighbour as busy as we are: share 0.5 ± 0.1, demand exactly
        // one CPU. ceil() would flip between 1 and 2; the filter goes to 1
        // and stays.
        let mut f = ShareFilter::new(1.0, 2, 0.3, 0.15, 2);
        for i in 0..20 {
            f.push(0.5 + 0.1 * wobble(i));
        }
        assert_eq!(f.cap(), 1);
        assert_eq!(flips(&mut f, |i| 0.5 + 0.1 * wobble(i)), 0);
        // Three even processes on three CPUs: one core each.
        let mut f = ShareFilter::new(1.0, 3, 0.3, 0.15, 3);
        for i in 0..20 {
            f.push(1.0 / 3.0 + 0.05 * wobble(i));
        }
        assert_eq!(f.cap(), 1);
    }

    #[test]
    fn follows_a_real_step_within_ten_samples() {
        let mut f = ShareFilter::new(1.0, 2, 0.3, 0.15, 2);
        for _ in 0..50 {
            assert_eq!(f.push(1.0), 2);
        }
        // A neighbour arrives: our share halves to a third.
        let steps = (1..=50).find(|_| f.push(1.0 / 3.0) == 1).unwrap();
        assert!(steps <= 10, "took {steps} samples");
        // It leaves: back to the whole host.
        let steps = (1..=50).find(|_| f.push(1.0) == 2).unwrap();
        assert!(steps <= 10, "took {steps} samples");
    }

    #[test]
    fn bad_samples_are_ignored_and_cap_is_clamped() {
        let mut f = ShareFilter::new(4.0, 2, 1.0, 0.15, 3);
        assert_eq!(f.push(f64::NAN), 3);
        assert_eq!(f.push(1.0), 3);
        assert_eq!(f.push(0.0), 1);
        assert_eq!(f.push(-5.0), 1);
        f.set_budget(0);
        assert_eq!(f.push(1.0), 1);
    }

    #[test]
    fn a_full_grant_beside_one_busy_thread_gives_a_core_back() {
        // Two CPUs, our two kernel threads pinned one per CPU, one busy
        // thread of a neighbour sharing a CPU with one of them: we get 1.5
        // of the 2.0 busy CPUs (demand 1.5), it gets 0.5. With the default
        // band the cap comes down to one; at one core each the split is
        // even (demand 1.0) and the cap stays.
        let band = crate::budget::NeighbourConfig::default().band;
        let mut f = ShareFilter::new(1.0, 2, 0.3, band, 2);
        for i in 0..30 {
            f.push(0.75 + 0.02 * wobble(i));
        }
        assert_eq!(f.cap(), 1);
        assert_eq!(flips(&mut f, |i| 0.5 + 0.05 * wobble(i)), 0);
        // Alone again: back to two.
        for _ in 0..10 {
            f.push(1.0);
        }
        assert_eq!(f.cap(), 2);
        // The old boundaries (half a core, band 0.15) kept two cores.
        let (d, c) = (1.5f64, 2.0f64);
        assert!(d >= c - 1.0 + 0.5 - 0.15);
        assert!(d < c - 1.0 + OFFSET - band);
    }

    #[test]
    fn two_aware_pools_end_on_an_even_split() {
        // Two CPUs, two pools that want every core, CPU shared per busy
        // thread: a pool holding `a` of the `a + b` cores sees share
        // `a / (a + b)`. Started uneven (two cores and one), both end on
        // one core each.
        let mut a = ShareFilter::new(1.0, 2, 0.3, 0.15, 2);
        let mut b = ShareFilter::new(1.0, 2, 0.3, 0.15, 2);
        for _ in 0..50 {
            b.push(0.3);
        }
        let (mut ca, mut cb) = (a.cap(), b.cap());
        assert_eq!((ca, cb), (2, 1));
        for i in 0..200u32 {
            let total = (ca + cb) as f64;
            let noise = 0.03 * wobble(i);
            ca = a.push(ca as f64 / total + noise);
            cb = b.push(cb as f64 / total - noise);
        }
        assert_eq!((ca, cb), (1, 1));
    }
}
