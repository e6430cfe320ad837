//! Where a thread goes: the cores its class may use (the policy's answer,
//! within the active cores), then power of two choices on their load, as
//! Arachne places new threads; a woken parked thread is placed the same
//! way, so long-lived threads rebalance on every wake-up.

use super::context::ThreadContext;
use crate::policy::{CoreMask, CorePolicy, CoreView, ThreadClass};
use crate::runtime::Shared;
use crate::shim::Ordering;
use std::cell::Cell;

/// The active cores (`active`) the policy lets a thread of `class` use.
pub(crate) fn class_cores(shared: &Shared, class: ThreadClass, active: CoreMask) -> CoreMask {
    let counts = |c: usize| shared.cores.get(c).map_or(u32::MAX, |k| k.mask.count());
    let view = CoreView {
        active,
        counts: &counts,
    };
    CoreMask(shared.policy.cores_for(class, &view).0 & active.0)
}

/// Places a runnable context that is in no slot: power of two choices among
/// the cores its class may use (all active cores but `exclude`), then the
/// chosen core's inbox. If every inbox is closed (cores changing hands), the
/// runtime's shared inbox, which every running core drains.
pub(crate) fn place(shared: &'static Shared, ctx: &'static ThreadContext, exclude: Option<usize>) {
    let mut active = shared.active_mask.load(Ordering::Acquire);
    if let Some(x) = exclude {
        active &= !(1u64 << x);
    }
    let allowed = class_cores(shared, ctx.class(), CoreMask(active));
    place_in(
        shared,
        ctx,
        if allowed.is_empty() {
            CoreMask(active)
        } else {
            allowed
        },
    );
}

/// [`place`] among `candidates` (which the caller computed).
/// The caller has counted the thread in `Shared::detached`.
pub(crate) fn place_in(shared: &'static Shared, ctx: &'static ThreadContext, candidates: CoreMask) {
    let cores = &shared.cores;
    let n = candidates.len();
    let first = match n {
        0 => None,
        1 => Some(candidates.0.trailing_zeros() as usize),
        _ => {
            let r = next_random();
            let ia = below(r as u32, n);
            let mut ib = below((r >> 32) as u32, n - 1);
            if ib >= ia {
                ib += 1;
            }
            match (candidates.nth(ia), candidates.nth(ib)) {
                (Some(a), Some(b)) => {
                    if cores[a].load() <= cores[b].load() {
                        Some(a)
                    } else {
                        Some(b)
                    }
                }
                (a, b) => a.or(b),
            }
        }
    };
    let order = first
        .into_iter()
        .chain(candidates.iter().filter(|&c| Some(c) != first));
    for c in order {
        let core = &cores[c];
        if core.inbox.push_counted(ctx, &core.queued) {
            core.gate.wake_after_rmw();
            return;
        }
    }
    // No candidate runs now: any core that runs takes it.
    let pushed = shared.homeless.push(ctx);
    debug_assert!(pushed, "the shared inbox is never closed");
    for core in cores.iter() {
        core.gate.wake_after_rmw();
    }
}

/// `x` scaled into `0..n` (Lemire's multiply-shift; `n` ≤ 64 here).
#[inline]
pub(crate) fn below(x: u32, n: usize) -> usize {
    ((u64::from(x) * n as u64) >> 32) as usize
}

thread_local! {
    static RNG: Cell<u64> = const { Cell::new(0) };
}

/// xorshift64*, seeded per OS thread. Not inlined: a user thread may move
/// between kernel threads, so the thread-local's address is looked up anew
/// on every call.
#[inline(never)]
pub(crate) fn next_random() -> u64 {
    RNG.with(|s| {
        let mut x = s.get();
        if x == 0 {
            x = crate::clock::now() | 1;
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}
