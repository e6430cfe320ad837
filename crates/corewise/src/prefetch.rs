//! Cache hints for the lines a cross-core protocol touches next.
//!
//! A line another core wrote last costs a transfer when this core touches
//! it; a prefetch issued early overlaps that transfer with other work. Two
//! kinds: [`read`] brings the line over shared, which is what a reader
//! wants; [`to_own`] brings it over exclusive (`prefetchw`), which is what
//! a writer wants: a line fetched shared must be fetched again, to own,
//! when it is written. Both are hints only: they never fault, whatever the
//! address, and change nothing the program can see, so a stale address
//! costs one useless fetch.
//!
//! `prefetchw` is not in std's feature detection (CPUID 8000_0001h, ECX bit
//! 8): it is asked once and the answer cached. Every AMD x86_64 CPU has
//! it, and Intel's since Broadwell. Under loom `to_own` does nothing.

/// Starts fetching the line at `p`, shared (`prefetcht0`).
#[inline(always)]
pub(crate) fn read(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and changes no
    // state the program can see, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Starts fetching the line at `p` to own (`prefetchw`) where the CPU has
/// the instruction; elsewhere does nothing (a shared fetch would have to be
/// repeated by the write that follows).
#[inline]
pub(crate) fn to_own(p: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    if has_prefetchw() {
        prefetchw(p);
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = p;
}

/// `prefetchw [p]`; the caller checked [`has_prefetchw`].
#[cfg(all(target_arch = "x86_64", not(loom)))]
#[inline(always)]
fn prefetchw(p: *const u8) {
    // SAFETY: `prefetchw` is a hint: it never faults, whatever the
    // address, and changes no state the program can see; it touches no
    // stack and no flags.
    unsafe {
        std::arch::asm!(
            "prefetchw [{p}]",
            p = in(reg) p,
            options(nostack, preserves_flags, readonly)
        );
    }
}

/// Whether the CPU has `prefetchw`, asked of CPUID once.
#[cfg(all(target_arch = "x86_64", not(loom)))]
#[inline]
fn has_prefetchw() -> bool {
    // 0: not asked yet, 1: no, 2: yes.
    match HAS_PREFETCHW.load(std::sync::atomic::Ordering::Relaxed) {
        0 => ask_prefetchw(),
        v => v == 2,
    }
}

/// [`has_prefetchw`]'s answer once asked: 0 not yet, 1 no, 2 yes.
#[cfg(all(target_arch = "x86_64", not(loom)))]
static HAS_PREFETCHW: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Asks CPUID and records [`has_prefetchw`]'s answer (two threads asking
/// at once both store the same one).
#[cfg(all(target_arch = "x86_64", not(loom)))]
#[cold]
#[inline(never)]
fn ask_prefetchw() -> bool {
    use std::arch::x86_64::__cpuid;
    // SAFETY: `cpuid` exists on every x86_64 CPU and only reads
    // identification registers (a safe function since Rust 1.94; the
    // block keeps older compilers, down to the workspace's 1.85, building).
    // Leaf 8000_0000h says whether the extended leaf exists.
    #[allow(unused_unsafe)]
    let has = unsafe {
        __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
    };
    HAS_PREFETCHW.store(
        if has { 2 } else { 1 },
        std::sync::atomic::Ordering::Relaxed,
    );
    has
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn prefetching_any_address_is_harmless() {
        let line = [0u8; 64];
        for p in [
            line.as_ptr(),
            std::ptr::null(),
            std::ptr::dangling(),
            usize::MAX as *const u8,
        ] {
            read(p);
            to_own(p);
        }
        assert_eq!(line, [0u8; 64]);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_prefetchw_answer_is_asked_once_and_kept() {
        let first = has_prefetchw();
        assert_ne!(HAS_PREFETCHW.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert_eq!(has_prefetchw(), first);
        // What /proc/cpuinfo calls the same bit.
        if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
            if let Some(flags) = info.lines().find(|l| l.starts_with("flags")) {
                let named = flags.split_whitespace().any(|f| f == "3dnowprefetch");
                assert_eq!(first, named, "CPUID and /proc/cpuinfo disagree");
            }
        }
    }
}
