//! A core's idle time, written by its dispatcher and read by other threads
//! (the core manager, `Runtime::stats`, the handoff monitor).
//!
//! It is two words, the idle ticks of the periods that ended and the start
//! of the period going on, and a reader must see them from the same moment.
//! They were once read as "ticks, start, ticks again, retry if the ticks
//! moved", while the dispatcher ended a period by adding to the ticks and
//! then clearing the start: a reader between those two stores counted the
//! period twice, and its window's utilization came out 0 whatever ran. A
//! sequence count around the dispatcher's writes (a seqlock) makes every
//! read consistent. (The dispatcher's clock and the reader's still differ:
//! a period may end at the dispatcher's last clock read, before the time up
//! to which a reader counted it as going on; the core manager takes a
//! difference that goes back as no idle time, see `sample_loads`.)

use crate::shim::{fence, AtomicU64, Ordering};

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct IdleTime {
    /// Odd while the dispatcher changes the two words below.
    seq: AtomicU64,
    /// Clock ticks of the idle periods that ended.
    ticks: AtomicU64,
    /// Start of the idle period going on now (0: busy).
    since: AtomicU64,
}

impl IdleTime {
    /// The dispatcher (the only writer) changes the words in `f`.
    #[inline]
    fn write(&self, f: impl FnOnce(&AtomicU64, &AtomicU64)) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        f(&self.ticks, &self.since);
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// The dispatcher: an idle period starts at `now` (not 0).
    #[inline]
    pub(crate) fn begin(&self, now: u64) {
        self.write(|_, since| since.store(now, Ordering::Relaxed));
    }

    /// The dispatcher: the idle period going on ends at `now`.
    #[inline]
    pub(crate) fn end(&self, now: u64) {
        self.write(|ticks, since| {
            let start = since.load(Ordering::Relaxed);
            if start != 0 {
                let t = ticks.load(Ordering::Relaxed);
                ticks.store(t.wrapping_add(now.wrapping_sub(start)), Ordering::Relaxed);
                since.store(0, Ordering::Relaxed);
            }
        });
    }

    /// Whether an idle period is going on (a single word: no consistency
    /// with the ticks needed).
    #[inline]
    pub(crate) fn is_idle(&self) -> bool {
        self.since.load(Ordering::Relaxed) != 0
    }

    /// Idle ticks up to `now`, counting the idle period going on.
    pub(crate) fn until(&self, now: u64) -> u64 {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let ticks = self.ticks.load(Ordering::Relaxed);
                let since = self.since.load(Ordering::Relaxed);
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    let open = if since != 0 {
                        now.saturating_sub(since)
                    } else {
                        0
                    };
                    return ticks.wrapping_add(open);
                }
            }
            crate::shim::spin_loop();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn periods_add_up_and_the_open_one_counts_until_now() {
        let t = IdleTime::default();
        assert_eq!(t.until(100), 0);
        t.begin(10);
        assert!(t.is_idle());
        assert_eq!(t.until(25), 15);
        t.end(30);
        assert!(!t.is_idle());
        assert_eq!(t.until(1_000), 20);
        t.begin(50);
        t.end(55);
        assert_eq!(t.until(60), 25);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// A reader racing the end of an idle period sees the period once: as
    /// still open or as ended, never both.
    #[test]
    fn a_read_never_counts_an_ending_period_twice() {
        loom::model(|| {
            let t = Arc::new(IdleTime::default());
            t.begin(10);
            let reader = {
                let t = t.clone();
                // At "now" = 45: open since 10 -> 35; ended at 30 -> 20;
                // the next period open since 40 -> 20 + 5.
                loom::thread::spawn(move || t.until(45))
            };
            t.end(30);
            t.begin(40);
            let seen = reader.join().unwrap();
            assert!(seen == 35 || seen == 20 || seen == 25, "read {seen}");
            assert_eq!(t.until(45), 25);
        });
    }
}
