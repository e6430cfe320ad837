//! Operation records of one core: who waits for an operation and what it
//! returned.
//!
//! A record is named by a token, `generation << 32 | index`, which is what
//! goes into an SQE's `user_data` (or an epoll waiter list). The generation
//! makes a token unique over time: a completion, a cancel request or a
//! readiness event that arrives for a record that has since been reused
//! matches nothing. Records are touched only by the core's kernel thread
//! (its dispatcher and the user threads it runs), so there are no atomics.

use crate::thread::ThreadId;

/// `user_data` of completions nobody waits for (linked timeouts, cancels).
pub(crate) const IGNORE: u64 = u64::MAX;
/// `user_data` of the idle futex wait on the core's gate word.
pub(crate) const GATE: u64 = u64::MAX - 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    Pending,
    Done,
}

#[derive(Debug)]
struct Record {
    generation: u32,
    state: State,
    result: i32,
    waiter: Option<ThreadId>,
    next_free: u32,
}

/// A growable table of records with a free list.
#[derive(Debug, Default)]
pub(crate) struct Slab {
    records: Vec<Record>,
    free: Option<u32>,
    pending: u32,
}

const NONE: u32 = u32::MAX;

impl Slab {
    /// A table with room for `n` records before it grows.
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self {
            records: Vec::with_capacity(n),
            free: None,
            pending: 0,
        }
    }

    /// A pending record for `waiter`; returns its token.
    pub(crate) fn alloc(&mut self, waiter: Option<ThreadId>) -> u64 {
        let index = match self.free {
            Some(i) => {
                let next = self.records[i as usize].next_free;
                self.free = (next != NONE).then_some(next);
                i
            }
            None => {
                self.records.push(Record {
                    generation: 0,
                    state: State::Free,
                    result: 0,
                    waiter: None,
                    next_free: NONE,
                });
                (self.records.len() - 1) as u32
            }
        };
        let r = &mut self.records[index as usize];
        r.generation = r.generation.wrapping_add(1);
        r.state = State::Pending;
        r.result = 0;
        r.waiter = waiter;
        self.pending += 1;
        (u64::from(r.generation) << 32) | u64::from(index)
    }

    fn get(&self, token: u64) -> Option<&Record> {
        let r = self.records.get((token & 0xffff_ffff) as usize)?;
        (u64::from(r.generation) == token >> 32 && r.state != State::Free).then_some(r)
    }

    fn get_mut(&mut self, token: u64) -> Option<&mut Record> {
        let r = self.records.get_mut((token & 0xffff_ffff) as usize)?;
        (u64::from(r.generation) == token >> 32 && r.state != State::Free).then_some(r)
    }

    /// Completes a pending record with `result` and returns its waiter to
    /// signal; `None` when the token is stale or already complete.
    pub(crate) fn complete(&mut self, token: u64, result: i32) -> Option<Option<ThreadId>> {
        let r = self.get_mut(token)?;
        if r.state != State::Pending {
            return None;
        }
        r.state = State::Done;
        r.result = result;
        let waiter = r.waiter;
        self.pending -= 1;
        Some(waiter)
    }

    /// The result of a completed record (`None`: still pending or stale).
    pub(crate) fn result(&self, token: u64) -> Option<i32> {
        self.get(token)
            .and_then(|r| (r.state == State::Done).then_some(r.result))
    }

    /// Whether the record is still pending.
    pub(crate) fn is_pending(&self, token: u64) -> bool {
        self.get(token).is_some_and(|r| r.state == State::Pending)
    }

    /// Frees a record (pending or done); its token becomes stale.
    pub(crate) fn free(&mut self, token: u64) {
        let free = self.free;
        let Some(r) = self.get_mut(token) else { return };
        let was_pending = r.state == State::Pending;
        r.state = State::Free;
        r.waiter = None;
        r.next_free = free.unwrap_or(NONE);
        self.free = Some((token & 0xffff_ffff) as u32);
        if was_pending {
            self.pending -= 1;
        }
    }

    /// Records still waiting for their event.
    pub(crate) fn pending(&self) -> u32 {
        self.pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_go_stale_when_records_are_reused() {
        let mut s = Slab::with_capacity(2);
        let a = s.alloc(None);
        assert!(s.is_pending(a));
        assert_eq!(s.complete(a, 7), Some(None));
        assert_eq!(s.complete(a, 8), None, "completed once");
        assert_eq!(s.result(a), Some(7));
        s.free(a);
        let b = s.alloc(None);
        assert_eq!(a & 0xffff_ffff, b & 0xffff_ffff, "index reused");
        assert_ne!(a, b);
        assert_eq!(s.complete(a, 1), None, "stale token");
        assert_eq!(s.pending(), 1);
        s.free(b);
        assert_eq!(s.pending(), 0);
    }
}
