//! Deadlines from user-supplied timeouts.
//!
//! Every timed wait turns its `Duration` into an `Instant` here, so a
//! timeout too large for the clock (`Duration::MAX`, say) never panics:
//! as in std, it means "no deadline" and the wait ends only when what it
//! waits for happens.

use std::time::{Duration, Instant};

/// The instant `timeout` from now, or `None` (no deadline) when that lies
/// beyond the range of [`Instant`].
pub(crate) fn after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn huge_timeouts_have_no_deadline() {
        assert_eq!(after(Duration::MAX), None);
        assert_eq!(after(Duration::new(u64::MAX, 0)), None);
    }

    #[test]
    fn ordinary_timeouts_have_one() {
        let before = Instant::now();
        let d = after(Duration::from_secs(1)).expect("in range");
        assert!(d >= before + Duration::from_secs(1));
        assert!(d <= Instant::now() + Duration::from_secs(1));
    }
}
