//! The corewise runtime's figures in the `stats` reply, so memcached
//! dashboards see the cores next to the cache's counters.
//!
//! A module of its own so the general `stats` reply stays as memcached
//! defines it plus one call: every name here starts with `corewise_`, and
//! the figures come from `corewise::runtime_stats()`, the runtime the
//! connection's user thread runs in (none outside a runtime: nothing is
//! written).

use std::fmt::Display;
use std::io::Write;

/// Appends the runtime's figures as `STAT corewise_...` lines: the cores
/// (asked for, granted, held, taken, given back), parked threads, and per
/// core `corewise_core{N}_...` (active, CPU, threads, queued, utilization
/// and load factor over the last window, dispatches, sleeps).
pub(crate) fn write(out: &mut Vec<u8>) {
    let Some(s) = corewise::runtime_stats() else {
        return;
    };
    let mut stat = |name: &str, value: &dyn Display| {
        let _ = write!(out, "STAT corewise_{name} {value}\r\n");
    };
    stat("cores", &s.cores.len());
    stat("requested_cores", &s.requested_cores);
    stat("granted_cores", &s.granted_cores);
    stat("active_cores", &s.active_cores);
    stat("cores_added", &s.cores_added);
    stat("cores_released", &s.cores_released);
    stat("parked_threads", &s.parked);
    for c in &s.cores {
        let k = c.core;
        stat(&format!("core{k}_active"), &u8::from(c.active));
        if c.cpu != usize::MAX {
            stat(&format!("core{k}_cpu"), &c.cpu);
        }
        stat(&format!("core{k}_threads"), &c.threads);
        stat(&format!("core{k}_queued"), &c.queued);
        stat(
            &format!("core{k}_utilization"),
            &format_args!("{:.3}", c.utilization),
        );
        stat(
            &format!("core{k}_load_factor"),
            &format_args!("{:.3}", c.load_factor),
        );
        stat(&format!("core{k}_dispatches"), &c.dispatches);
        stat(&format!("core{k}_sleeps"), &c.sleeps);
    }
}
