//! Placement at creation time (Arachne): the policy names the acceptable
//! cores for the thread's class; power of two choices picks the less loaded
//! of two random candidates by their `MaskAndCount`; an atomic bit set
//! claims a free slot; the thread's function goes into the slot's first
//! cache line; `wakeup_time = 0` makes it runnable; a sleeping core is woken.
//! No queue is touched and no memory is allocated for small closures.
//! A thread that spawns several threads in one run claims slots ahead on
//! the chosen core (as many as that core's lead over the other choice, or
//! in a long burst a share of what it has spread so far) and fills them
//! without touching the core's occupancy word again, fetching each slot's
//! line before it writes it (see [`crate::reserve`] and [`claim`]; a
//! departure from Arachne's one claim per spawn).
//!
//! A spawn that finds every slot of its cores taken hands the thread to a
//! core's inbox and makes the spawning user thread yield when the call
//! returns: the cores are behind, and a spawner that keeps its core while
//! the threads it made wait piles up threads, each a context and a stack
//! (19 800 waited at once on one core in a 20 000-thread loop; 8 000 per
//! core in the `sleepers` benchmark, whose threads then slept 50-80 ms
//! for 10 and twice as many stacks were made).

use super::placement::{below, next_random};
use crate::error::SpawnError;
use crate::policy::{CoreMask, CorePolicy, ThreadClass};
use crate::runtime::Shared;
use crate::sched::{Core, ThreadContext};
use crate::shim::Ordering;
use crate::thread::ThreadId;

/// How a thread is to be created.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpawnOptions {
    pub(crate) class: ThreadClass,
    pub(crate) core: Option<usize>,
    pub(crate) name: Option<String>,
    pub(crate) wait: bool,
}

/// Where a new thread goes: a claimed slot, or (every slot of its cores
/// taken) a spare context that waits in a core's inbox.
enum Target {
    Slot(&'static Core, usize),
    Spare(&'static ThreadContext, CoreMask),
}

/// Creates a user thread that runs `job` in `shared`'s runtime.
pub(crate) fn spawn_job<F>(
    shared: &'static Shared,
    opts: SpawnOptions,
    job: F,
) -> Result<ThreadId, SpawnError>
where
    F: FnOnce() + Send + 'static,
{
    // The spawner's core (its reservations, its spare contexts) is used
    // below: not handed over meanwhile.
    let _entry = crate::sched::handoff::Entry::enter();
    let target = if opts.wait {
        shared.limit_wait.wait_for(|| choose(shared, &opts))?
    } else {
        choose(shared, &opts)?
    };
    let class = opts.class.to_u32()
        | if opts.core.is_some() {
            crate::sched::PINNED
        } else {
            0
        };
    let ctx: &'static ThreadContext = match target {
        Target::Slot(core, slot) => core.slot(slot),
        Target::Spare(ctx, _) => ctx,
    };
    if let Some(name) = opts.name {
        ctx.set_name(Some(name.into_boxed_str()));
    }
    let inv = &ctx.invocation;
    inv.class.store(class, Ordering::Relaxed);
    // A new generation publishes the function: `ThreadId`s of the slot's
    // earlier threads go stale (their signals become spurious wakeups of
    // this one, which are allowed). Only the spawner that claimed the slot
    // writes it, so no locked instruction.
    // SAFETY: we own the slot (claimed it) or the spare context (took it
    // from a pool), and have not published it yet.
    let generation = unsafe { inv.put(job) };
    // The generation the publication made, not the slot's now: from the
    // publication on, the thread may run (a stale signal, or a core being
    // given back makes it runnable), end, and the slot hold a later
    // thread before this line.
    let id = ThreadId::of_generation(ctx, generation);
    match target {
        Target::Slot(..) => {
            // From the publication on, the slot's dispatcher may take the
            // thread for a blocked one and park it before this signal (a
            // sweep parks every published thread that has no signal since
            // it last ran): the signal then finds it parked and places it,
            // as any signal does. Else it wakes the context's core, read
            // after the swap: the thread may have been moved meanwhile
            // (see `park::evict_all`).
            crate::sched::park::signal_context(ctx);
        }
        Target::Spare(ctx, candidates) => {
            // A spare is in no slot, so nothing parks it: the signal only
            // makes it runnable.
            let _ = ctx.wakeup().signal();
            shared.detached.fetch_add(1, Ordering::Relaxed);
            crate::sched::placement::place_in(shared, ctx, candidates);
            // Every slot of the thread's cores is taken: the cores are
            // behind. A spawning user thread yields when the call returns,
            // so its own core runs what waits there instead of the spawner
            // piling up threads (each a context and a stack) faster than
            // the cores can start them.
            if let Some(me) = crate::sched::current::current_slot() {
                crate::sched::handoff::yield_after_call(me);
            }
        }
    }
    Ok(id)
}

/// Chooses the new thread's place (see [`Target`]).
fn choose(shared: &'static Shared, opts: &SpawnOptions) -> Result<Target, SpawnError> {
    if shared.shutdown.load(Ordering::Relaxed) {
        return Err(SpawnError::ShuttingDown);
    }
    let active = CoreMask(shared.active_mask.load(Ordering::Acquire));
    let candidates = match opts.core {
        Some(c) if active.contains(c) => CoreMask::single(c),
        Some(c) => return Err(SpawnError::CoreUnavailable(c)),
        None if active.is_empty() => {
            // No core runs at this instant: the runtime is between cores
            // (one given back and the next not running yet, as when the
            // arbiter daemon is lost or a grant moves). The thread waits
            // in the shared inbox, which the next core to run drains
            // (`place_in` with no candidate); failing would make a spawn
            // from outside the runtime succeed or not by its timing.
            return crate::sched::park::take_spare(shared, None)
                .map(|ctx| Target::Spare(ctx, CoreMask(0)));
        }
        None => {
            let m = super::placement::class_cores(shared, opts.class, active);
            if m.is_empty() {
                return Err(SpawnError::NoCoreForClass(opts.class));
            }
            m
        }
    };
    // The core the spawning user thread runs on, if it belongs to this
    // runtime: its reservations on other cores (see `crate::reserve`) and
    // its spare contexts. Looked up after the policy ran (which may switch
    // out, and the thread resume on another core in a new run).
    // Exclusive threads never claim ahead (their core is theirs alone).
    let from = crate::sched::current::current_slot()
        .map(|s| s.core())
        .filter(|c| std::ptr::eq(c.runtime(), shared));
    let earlier = from.map_or(0, |c| c.reserved.count_spawn());
    let earlier = if opts.class == ThreadClass::Exclusive {
        0
    } else {
        earlier
    };
    if let Some((core, slot)) = claim(shared, candidates, from, earlier) {
        if still_active(core) {
            return Ok(Target::Slot(core, slot));
        }
        // The core was given back after this spawn read the active cores:
        // its dispatcher may have looked at its slots for the last time
        // already, and nobody would run the thread. Give the slot back and
        // choose among the cores that are still active.
        core.mask.release(slot);
        return choose(shared, opts);
    }
    // Every slot of the candidates is taken: the thread waits in an inbox.
    match crate::sched::park::take_spare(shared, from) {
        Ok(ctx) => Ok(Target::Spare(ctx, candidates)),
        Err(e) => {
            if opts.core.is_none() {
                shared.policy.spawn_failed(opts.class, candidates);
            }
            Err(e)
        }
    }
}

/// After a slot of `core` was claimed (a locked read-modify-write of its
/// occupancy word): whether the core still runs, so the thread will be run.
///
/// A core being given back clears its `active` flag and then, after a
/// fence, looks at its occupancy one last time before its dispatcher
/// leaves (see `park::evict_all`); a spawner sets its slot's bit and then,
/// after a fence, reads the flag. One of the two sees the other: either
/// the dispatcher sees the bit and stays until the thread has moved
/// elsewhere, or the spawner sees the core inactive and chooses again.
/// Without this check a spawn that read the active cores just before a
/// core went claimed a slot on it after its last look: one thread in
/// about 20 000 spawns never ran (the `spawn_sweep` test, beside other
/// work). On x86-64 the claim's locked instruction is the fence, so this
/// is one load of a line that changes only when cores come and go.
#[inline]
fn still_active(core: &Core) -> bool {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    crate::shim::fence(Ordering::SeqCst);
    // Acquire: a core seen inactive is out of `active_mask` (cleared before
    // the flag) for the next choice.
    core.active.load(Ordering::Acquire)
}

/// Claims a slot on one of `candidates`: the less loaded of two random
/// choices first, then any. A spawn that is not the first of its thread's
/// run (`earlier` spawns came before it) may claim more slots on the
/// chosen core, kept by the spawning core `from` for its next spawns (see
/// `crate::reserve`): as many as the chosen core's lead over the other
/// choice, so the next spawns land where placement would have put them
/// anyway (with one acceptable core, [`RESERVE`](crate::reserve::RESERVE)),
/// and in a long burst at least an eighth of the threads the burst has put
/// on each candidate so far ([`BURST_SHARE`](crate::reserve::BURST_SHARE));
/// never more than `RESERVE`.
///
/// The lead alone sized too few: a spawner's own core fills with the
/// threads it made (they wait for it to switch out) about as fast as the
/// other core drains, so the lead stayed at a slot or two and about two
/// spawns in three claimed on the other core's word, a locked instruction
/// on a line that core writes at every thread's end (creation throughput
/// from one spawner 6.4-8.7 M/s with the lead, 9.2-10.2 M/s with
/// `RESERVE` from the second spawn on, in five alternating pairs at a
/// round trip of ~125 ns). A fixed 8 from the start, though, spread a
/// burst of 40 threads over two cores 16 and 24; the share keeps a burst
/// within an eighth or so of even and reaches 8 after 128 spawns on two
/// cores.
#[inline]
fn claim(
    shared: &'static Shared,
    candidates: CoreMask,
    from: Option<&'static Core>,
    earlier: u32,
) -> Option<(&'static Core, usize)> {
    let cores = &shared.cores;
    if let Some((c, s, next)) = from.and_then(|a| a.reserved.take(candidates.0)) {
        // The next spawn writes the next reserved slot's first line:
        // fetching it again now overlaps that transfer with this spawn
        // (where the claim's fetch was a read; see `prefetch_reserved`).
        if let Some(n) = next.filter(|_| !reserved_to_own()) {
            cores[c].slot(n).prefetch_first_line();
        }
        return Some((&cores[c], s));
    }
    let n = candidates.len();
    let (first, second, lead) = if n == 1 {
        (
            candidates.0.trailing_zeros() as usize,
            None,
            crate::reserve::RESERVE,
        )
    } else {
        let r = next_random();
        let (a, b) = if n == 2 {
            // Both candidates are the two choices; the random bit only
            // breaks ties.
            let lo = candidates.0.trailing_zeros() as usize;
            let hi = 63 - candidates.0.leading_zeros() as usize;
            if r & 1 == 0 {
                (lo, hi)
            } else {
                (hi, lo)
            }
        } else {
            // Multiply-shift range reduction: no division on this path.
            let ia = below(r as u32, n);
            let mut ib = below((r >> 32) as u32, n - 1);
            if ib >= ia {
                ib += 1;
            }
            (candidates.nth(ia)?, candidates.nth(ib)?)
        };
        let (ca, cb) = (cores[a].mask.count(), cores[b].mask.count());
        if ca <= cb {
            (a, Some(b), cb - ca)
        } else {
            (b, Some(a), ca - cb)
        }
    };
    let ahead = if from.is_none() || earlier == 0 {
        1
    } else {
        let share = earlier / (crate::reserve::BURST_SHARE * n as u32);
        lead.max(share).min(crate::reserve::RESERVE)
    };
    if let Some(s) = claim_on(&cores[first], from, ahead, candidates.0) {
        return Some((&cores[first], s));
    }
    if let Some(b) = second {
        if let Some(s) = cores[b].mask.claim() {
            return Some((&cores[b], s));
        }
        for c in candidates.iter().filter(|&c| c != first && c != b) {
            if let Some(s) = cores[c].mask.claim() {
                return Some((&cores[c], s));
            }
        }
    }
    None
}

/// Claims a free slot on `target`, and with `ahead > 1` up to `ahead - 1`
/// more, kept by the spawning core `from` for its next spawns.
#[inline]
fn claim_on(
    target: &'static Core,
    from: Option<&'static Core>,
    ahead: u32,
    candidates: u64,
) -> Option<usize> {
    match from {
        Some(a) if ahead > 1 => {
            let (s, more) = target.mask.claim_ahead(ahead)?;
            // The slots' first lines, which the next spawns write, start
            // moving here now, all at once.
            let mut m = more;
            while m != 0 {
                prefetch_reserved(target.slot(m.trailing_zeros() as usize));
                m &= m - 1;
            }
            a.reserved.keep(target.index, more, candidates);
            Some(s)
        }
        _ => target.mask.claim(),
    }
}

/// Starts fetching the first line of `slot`, which this spawner has just
/// reserved and writes at a later spawn (see [`claim_on`]): to own
/// (`prefetchw`) on AMD's (and Hygon's) CPUs, shared elsewhere. Asked of
/// CPUID once.
///
/// On an Intel Xeon host (2026-11-29, round trip ~125 ns) creation
/// throughput from one spawner was 8.4-9.0 M/s with no prefetch,
/// 10.1-11.8 M/s with a read prefetch (`prefetcht0`) and 8.3-9.9 M/s with
/// `prefetchw`, so Intel keeps the read. On an AMD EPYC (Zen 4) host the
/// read prefetch cost a third of it (2026-12-01: 15.9-18.3 M/s with it,
/// 21.4-28.4 without, at a round trip of ~65 ns): the line comes over
/// shared and the spawner's write must then take it for its own, while
/// the receiving core's scan reads the same lines (reserved slots count as
/// occupied). Fetched to own at the claim, creation there with the vCPUs
/// far apart (a round trip of ~310-330 ns) went from 4.6-5.0 M/s without
/// a prefetch to 9.8-11.0 M/s in one spell, and from 5.7-8.8 to 8.7-9.6
/// M/s in another, and stayed within its noise close by (~65-90 ns), in
/// alternating runs of `examples/creation_rate.rs` and `primitives
/// --quick`. A second `prefetchw` of the next reserved slot at
/// each spawn from the reservation, as the read scheme does, added
/// nothing, so on AMD only the claim fetches. The receiving core's own prefetch of the next slot it will
/// run (`dispatch::prefetch_next`) is a read everywhere.
#[inline]
fn prefetch_reserved(slot: &ThreadContext) {
    if reserved_to_own() {
        slot.prefetch_first_line_to_own();
    } else {
        slot.prefetch_first_line();
    }
}

/// Whether [`prefetch_reserved`] fetches to own (AMD, Hygon) rather than
/// shared; shared in the loom models (a prefetch is no event there).
#[inline]
fn reserved_to_own() -> bool {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    {
        // 0: not asked yet, 1: shared, 2: to own.
        match RESERVED_TO_OWN.load(std::sync::atomic::Ordering::Relaxed) {
            0 => ask_reserved_to_own(),
            v => v == 2,
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    false
}

/// [`reserved_to_own`]'s answer once asked: 0 not yet, 1 no, 2 yes.
#[cfg(all(target_arch = "x86_64", not(loom)))]
static RESERVED_TO_OWN: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Asks CPUID for the vendor and records [`reserved_to_own`]'s answer
/// (two threads asking at once both store the same one).
#[cfg(all(target_arch = "x86_64", not(loom)))]
#[cold]
#[inline(never)]
fn ask_reserved_to_own() -> bool {
    // SAFETY: `cpuid` exists on every x86_64 CPU and only reads
    // identification registers (a safe function since Rust 1.94; the
    // block keeps older compilers, down to the workspace's 1.85,
    // building).
    #[allow(unused_unsafe)]
    let leaf = unsafe { std::arch::x86_64::__cpuid(0) };
    let amd = is_amd_vendor(leaf.ebx, leaf.edx, leaf.ecx);
    RESERVED_TO_OWN.store(
        if amd { 2 } else { 1 },
        std::sync::atomic::Ordering::Relaxed,
    );
    amd
}

/// Whether CPUID leaf 0's vendor string (in `ebx`, `edx`, `ecx` order)
/// names AMD or Hygon (AMD's design licensed in China).
#[cfg(all(not(loom), any(test, target_arch = "x86_64")))]
fn is_amd_vendor(ebx: u32, edx: u32, ecx: u32) -> bool {
    let mut v = [0u8; 12];
    v[..4].copy_from_slice(&ebx.to_le_bytes());
    v[4..8].copy_from_slice(&edx.to_le_bytes());
    v[8..].copy_from_slice(&ecx.to_le_bytes());
    &v == b"AuthenticAMD" || &v == b"HygonGenuine"
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::below;

    #[test]
    fn vendor_strings_are_told_apart() {
        let words = |s: &[u8; 12]| {
            let w = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
            (w(0), w(4), w(8))
        };
        for (vendor, amd) in [
            (b"AuthenticAMD", true),
            (b"HygonGenuine", true),
            (b"GenuineIntel", false),
            (b"CentaurHauls", false),
        ] {
            let (b, d, c) = words(vendor);
            assert_eq!(super::is_amd_vendor(b, d, c), amd, "{vendor:?}");
        }
    }

    #[test]
    fn below_covers_the_range_evenly() {
        for n in 1..=64usize {
            let mut seen = vec![0u32; n];
            // The midpoints of 64n equal parts of the u32 range.
            for k in 0..(n as u64 * 64) {
                let x = ((2 * k + 1) * (1u64 << 32) / (2 * 64 * n as u64)) as u32;
                let i = below(x, n);
                assert!(i < n, "below({x}, {n}) = {i}");
                seen[i] += 1;
            }
            assert!(seen.iter().all(|&c| c == 64), "n = {n}: {seen:?}");
        }
    }
}
