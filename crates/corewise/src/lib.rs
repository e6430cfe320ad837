//! corewise: core-aware user-level threads for Linux.
//!
//! User threads are created in about the time of a cache-line transfer on
//! another core and scheduled without ready queues (Arachne); a thread
//! blocks without blocking its core, and an idle core sleeps in the kernel
//! instead of spinning (Fred/libfibre). Cores come from an arbiter, in
//! process by default.
//!
//! ```
//! let rt = corewise::Runtime::new().unwrap();
//! let h = rt.spawn(|| {
//!     let child = corewise::spawn(|| 20).unwrap();
//!     child.join().unwrap() + 22
//! }).unwrap();
//! assert_eq!(h.join().unwrap(), 42);
//! ```
//!
//! # Coming from `std::thread`
//!
//! - [`run`] is the entry point: `corewise::run(|| ..)` builds a runtime and
//!   runs the closure as a user thread ([`Builder::run`] for settings).
//!   [`spawn`] outside a runtime fails with [`SpawnError::NotInRuntime`].
//! - [`scope()`] (and [`Runtime::scope`]) are `std::thread::scope`: threads
//!   that borrow from the stack, all joined before it returns.
//! - [`thread_local!`] gives per-*user*-thread values. `std::thread_local!`
//!   inside a user thread is per kernel thread: the user threads of a core
//!   share its value, and since a user thread may move to another core
//!   whenever it blocks, yields or its core is released, the value it sees
//!   can change within one function.
//! - [`Runtime::stats`] reports each core's threads, utilization and load,
//!   and the cores granted and how often they changed.
//!
//! ```
//! corewise::thread_local!(static HITS: std::cell::Cell<u32> = std::cell::Cell::new(0));
//! let mut data = vec![1, 2, 3];
//! let total = corewise::run(|| {
//!     corewise::scope(|s| {
//!         for x in data.iter_mut() {
//!             s.spawn(move || { HITS.set(HITS.get() + 1); *x *= 10 }).unwrap();
//!         }
//!     });
//!     HITS.get() // the scoped threads counted in their own values
//! }).unwrap();
//! assert_eq!((total, data), (0, vec![10, 20, 30]));
//! ```
//!
//! The map of the crate is `docs/architecture.md` in the repository;
//! each module's documentation says why it is built the way it is.

// The loom build compiles the cross-core protocols and their models
// without the runtime around them (see `#[cfg(not(loom))]` below), so the
// protocols' helpers that only the runtime calls are unused there.
#![cfg_attr(loom, allow(dead_code))]

mod deadline;
mod error;
pub mod policy;
mod prefetch;
mod sched;
mod shim;
pub mod sync;

#[cfg(not(loom))]
pub mod arbiter;
#[cfg(not(loom))]
pub mod blocking;
#[cfg(not(loom))]
pub mod budget;
#[cfg(not(loom))]
mod clock;
#[cfg(not(loom))]
mod fdtable;
#[cfg(not(loom))]
pub mod fs;
#[cfg(not(loom))]
pub mod io;
#[cfg(not(loom))]
pub mod local;
#[cfg(not(loom))]
pub mod net;
#[cfg(not(loom))]
mod reserve;
#[cfg(not(loom))]
mod runtime;
#[cfg(not(loom))]
mod scope;
#[cfg(not(loom))]
pub mod thread;

pub use error::{BuildError, JoinError, PanicPayload, SpawnError};
pub use policy::{
    CoreLoad, CoreMask, CorePolicy, CoreView, DefaultPolicy, PolicyConfig, ThreadClass, PRIORITIES,
};

#[cfg(not(loom))]
pub use arbiter::{ArbiterChoice, ArbiterKind};
#[cfg(not(loom))]
pub use blocking::blocking;
#[cfg(not(loom))]
pub use budget::{
    cpu_budget, cpu_budget_of, BudgetError, BudgetHandle, BudgetReason, BudgetWatcher, CpuBudget,
    CpuList, NeighbourShare,
};
#[cfg(not(loom))]
pub use io::IoBackend;
#[cfg(not(loom))]
pub use local::LocalKey;
#[cfg(not(loom))]
pub use runtime::{
    run, runtime_stats, Builder, CoreStats, RunError, Runtime, RuntimeStats, DEFAULT_IDLE_SPIN,
    DEFAULT_STACK_SIZE, HANDOFF_ENV,
};
#[cfg(not(loom))]
pub use scope::{scope, Scope, ScopedJoinHandle};
#[cfg(not(loom))]
pub use thread::{
    block, block_until, current, current_core, signal, sleep, spawn, spawn_wait, spawn_with,
    yield_now, JoinHandle, ThreadId,
};
