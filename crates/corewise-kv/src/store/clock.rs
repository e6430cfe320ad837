//! Server time and memcached's expiry rule.
//!
//! Items carry their deadline as whole seconds on a server clock that starts
//! at 1 when the store is created (0 means "never expires"), as memcached
//! does: a monotonic clock cannot jump when the wall clock is set, and a
//! 32-bit second counter keeps items small. Clients give expiry either as a
//! relative number of seconds (up to 30 days) or as an absolute unix time;
//! [`Clock::deadline`] turns both into server time.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Relative expiry times above this many seconds (30 days) are absolute
/// unix times.
///
/// ```
/// use corewise_kv::store::{Clock, Deadline, MAX_RELATIVE_EXPIRY};
/// let c = Clock::new();
/// // Up to 30 days: seconds from now.
/// assert_eq!(c.deadline(MAX_RELATIVE_EXPIRY), Deadline::At(c.now() + MAX_RELATIVE_EXPIRY as u32));
/// // Beyond: a unix time, here long past.
/// assert_eq!(c.deadline(MAX_RELATIVE_EXPIRY + 1), Deadline::Past);
/// ```
pub const MAX_RELATIVE_EXPIRY: i64 = 60 * 60 * 24 * 30;

/// How many seconds before its real start memcached dates its start
/// (`process_started`, `ITEM_UPDATE_INTERVAL` + 2), which decides where
/// an absolute `flush_all` time stops meaning anything.
const MEMCACHED_START_LEAD: i64 = 62;

/// What an expiry argument means for an item.
///
/// ```
/// use corewise_kv::store::{Deadline, SetMode, Store};
/// let s = Store::new(1 << 20, 1);
/// s.store(SetMode::Set, b"k", 0, s.clock().deadline(60), b"v", None);
/// assert_eq!(s.inspect(b"k").unwrap().0, 60);
/// assert_eq!(s.clock().deadline(0), Deadline::Never);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// Never expires.
    Never,
    /// Expires at this server second (the item is gone once now ≥ it).
    At(u32),
    /// Already expired: storing it is a no-op that still answers success,
    /// and it removes an existing item.
    Past,
}

/// The server clock: seconds since the store started, plus the unix time
/// of that start.
///
/// ```
/// use corewise_kv::store::{Clock, Deadline};
/// let c = Clock::new();
/// assert_eq!(c.deadline(0), Deadline::Never);
/// assert_eq!(c.deadline(-1), Deadline::Past);
/// assert!(matches!(c.deadline(10), Deadline::At(t) if t >= 11));
/// ```
#[derive(Debug, Clone)]
pub struct Clock {
    start: Instant,
    start_unix: i64,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// A clock that starts now.
    ///
    /// ```
    /// use corewise_kv::store::Clock;
    /// let c = Clock::new();
    /// assert_eq!(c.now(), 1);
    /// assert!(c.start_unix() > 1_600_000_000);
    /// ```
    pub fn new() -> Self {
        let start_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        Self {
            start: Instant::now(),
            start_unix,
        }
    }

    /// Server seconds now (1 at start).
    ///
    /// ```
    /// use corewise_kv::store::Clock;
    /// let c = Clock::new();
    /// let t = c.now();
    /// assert!(t >= 1 && c.now() >= t);
    /// ```
    pub fn now(&self) -> u32 {
        (self.start.elapsed().as_secs().min(u32::MAX as u64 - 1) as u32).saturating_add(1)
    }

    /// Unix time now, as the server sees it.
    ///
    /// ```
    /// use corewise_kv::store::Clock;
    /// let c = Clock::new();
    /// assert_eq!(c.unix_now(), c.start_unix() + i64::from(c.now()) - 1);
    /// ```
    pub fn unix_now(&self) -> i64 {
        self.start_unix + i64::from(self.now()) - 1
    }

    /// memcached's `realtime(exptime)` for a `flush_all` argument, in its
    /// own time base (see [`memcached_time`](Self::memcached_time)): now
    /// for 0 or less, now plus a relative delay, and an absolute unix time
    /// as seconds since memcached's dated start (1 at or before it).
    ///
    /// ```
    /// use corewise_kv::store::Clock;
    /// let c = Clock::new();
    /// let now = c.memcached_time(c.now());
    /// assert_eq!(c.memcached_realtime(0), now);
    /// assert_eq!(c.memcached_realtime(10), now + 10);
    /// assert_eq!(c.memcached_realtime(c.start_unix() - 60), 2);
    /// assert_eq!(c.memcached_realtime(1_000_000_000), 1);
    /// ```
    pub fn memcached_realtime(&self, exptime: i64) -> u64 {
        let now = self.memcached_time(self.now());
        if exptime <= 0 {
            now
        } else if exptime <= MAX_RELATIVE_EXPIRY {
            now + exptime as u64
        } else {
            let started = self.start_unix - MEMCACHED_START_LEAD;
            if exptime <= started {
                1
            } else {
                (exptime - started) as u64
            }
        }
    }

    /// Server second `sec` in memcached's own time base (its
    /// `current_time`, seconds since a start it dates 62 seconds early),
    /// for the one place memcached shows that base: `stats settings`'
    /// `oldest`. Second 0 is the one before the server's first.
    ///
    /// ```
    /// use corewise_kv::store::Clock;
    /// let c = Clock::new();
    /// assert_eq!(c.memcached_time(1), 62);
    /// assert_eq!(c.memcached_time(0), 61);
    /// ```
    pub fn memcached_time(&self, sec: u32) -> u64 {
        u64::from(sec) + MEMCACHED_START_LEAD as u64 - 1
    }

    /// Unix time of the server start.
    ///
    /// ```
    /// use corewise_kv::store::Clock;
    /// let c = Clock::new();
    /// let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    /// assert!((wall - c.start_unix()).abs() <= 1);
    /// ```
    pub fn start_unix(&self) -> i64 {
        self.start_unix
    }

    /// The deadline an expiry argument names (memcached's rule: 0 never,
    /// negative already past, up to 30 days relative, else absolute).
    ///
    /// ```
    /// use corewise_kv::store::{Clock, Deadline};
    /// let c = Clock::new();
    /// assert_eq!(c.deadline(0), Deadline::Never);
    /// assert_eq!(c.deadline(-5), Deadline::Past);
    /// assert_eq!(c.deadline(10), Deadline::At(c.now() + 10));
    /// // An absolute unix time an hour from now.
    /// assert!(matches!(c.deadline(c.unix_now() + 3600), Deadline::At(t) if t >= 3600));
    /// ```
    pub fn deadline(&self, exptime: i64) -> Deadline {
        if exptime == 0 {
            return Deadline::Never;
        }
        if exptime < 0 {
            return Deadline::Past;
        }
        let server = if exptime > MAX_RELATIVE_EXPIRY {
            // Absolute unix time; anything at or before our start is past.
            if exptime <= self.start_unix {
                return Deadline::Past;
            }
            exptime - self.start_unix + 1
        } else {
            i64::from(self.now()) + exptime
        };
        Deadline::At(server.clamp(1, i64::from(u32::MAX)) as u32)
    }

    /// The last server second whose items `flush_all <exptime>` makes
    /// invalid, as memcached 1.6.18 computes it (`realtime(exptime) - 1`):
    /// items stored up to and during that second are gone once it comes,
    /// so a delay of N seconds takes effect one second early, and a delay
    /// of 1 at once (for the rest of this second's items too). 0 or a
    /// negative number: the second before this one (every item there is
    /// now). An absolute unix time counts from memcached's start, which it
    /// dates 62 seconds early (`ITEM_UPDATE_INTERVAL` + 2): one at most a
    /// second after that date gives memcached a cut-off of 0, its "no
    /// flush", so `None`: such a flush invalidates nothing and cancels a
    /// pending one.
    ///
    /// ```
    /// use corewise_kv::store::Clock;
    /// let c = Clock::new();
    /// let now = c.now();
    /// assert_eq!(c.flush_cutoff(0), Some(now - 1)); // everything stored so far
    /// assert_eq!(c.flush_cutoff(-3), Some(now - 1));
    /// assert_eq!(c.flush_cutoff(1), Some(now)); // ... and what this second stores
    /// assert_eq!(c.flush_cutoff(10), Some(now + 9)); // from the 9th second on
    /// assert_eq!(c.flush_cutoff(c.unix_now() + 10), Some(now + 9)); // absolute
    /// assert_eq!(c.flush_cutoff(2_592_001), None); // 1970: no flush at all
    /// ```
    pub fn flush_cutoff(&self, exptime: i64) -> Option<u32> {
        let realtime = self.memcached_realtime(exptime);
        if realtime <= 1 {
            return None;
        }
        // `realtime - 1` in memcached's base, as a server second (that base
        // is `memcached_time`'s: ours plus LEAD - 1), clamped.
        let cutoff = realtime.saturating_sub(MEMCACHED_START_LEAD as u64);
        Some(cutoff.min(u64::from(u32::MAX)) as u32)
    }

    /// Seconds left before `at` (for `mg t`, `me`): -1 for never.
    ///
    /// ```
    /// use corewise_kv::store::Clock;
    /// let c = Clock::new();
    /// assert_eq!(c.ttl_left(0), -1); // never expires
    /// assert_eq!(c.ttl_left(c.now() + 30), 30);
    /// assert_eq!(c.ttl_left(1), 0); // already due
    /// ```
    pub fn ttl_left(&self, at: u32) -> i64 {
        if at == 0 {
            -1
        } else {
            (i64::from(at) - i64::from(self.now())).max(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_times() {
        let c = Clock::new();
        let future = c.unix_now() + 100;
        assert!(matches!(c.deadline(future), Deadline::At(t) if t > 90));
        assert_eq!(c.deadline(MAX_RELATIVE_EXPIRY + 1), Deadline::Past);
        assert!(matches!(c.deadline(MAX_RELATIVE_EXPIRY), Deadline::At(_)));
    }
}
