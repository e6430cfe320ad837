//! The scheduler engine: cores, their thread slots, the dispatcher, and
//! the protocols by which other cores create, wake, park and move threads.
//!
//! Everything here is crate-private; `thread` is the public front. The
//! pieces, from the words other cores touch to the loop that runs threads:
//!
//! - [`occupancy`]: the 56-bit slot occupancy word a spawner claims a slot in.
//! - [`wakeup`]: a slot's signal count and the dispatcher's private half.
//! - [`slot`]: a slot's first cache line (function, class, generation, signals).
//! - [`context`]: a user thread's context, which exists apart from any slot.
//! - [`coroutine`]: the switch into and out of a thread; overflow naming.
//! - [`stack`]: stacks carved from large mappings, guard pages, give-back.
//! - [`core`]: one core's slots, gate, inbox, statistics.
//! - [`idle`]: how an idle core sleeps and how a waker wakes it.
//! - [`idletime`]: a core's idle time, read consistently by other threads.
//! - [`inbox`]: the lock-free stack of threads handed to a core.
//! - [`park`]: threads leaving their slot, timers, spares, rebalancing.
//! - [`placement`]: which core a new or woken thread goes to.
//! - [`spawn`]: thread creation.
//! - [`dispatch`]: the loop each core's kernel thread runs.
//! - [`current`]: the running user thread, and its exit.
//! - [`handover`]: the box the monitor provisions a core's spares in.
//! - [`handoff`]: a core leaves a kernel thread stuck in a user thread's run.
//! - [`kthread`]: core owners and the spare kernel threads.
//! - [`monitor`]: the thread that finds stuck cores.

pub(crate) mod handover;
pub(crate) mod idle;
pub(crate) mod idletime;
pub(crate) mod inbox;
pub(crate) mod occupancy;
pub(crate) mod slot;
pub(crate) mod wakeup;

#[cfg(not(loom))]
pub(crate) mod context;
#[cfg(not(loom))]
pub(crate) mod core;
#[cfg(not(loom))]
pub(crate) mod coroutine;
#[cfg(not(loom))]
pub(crate) mod current;
#[cfg(not(loom))]
pub(crate) mod dispatch;
#[cfg(not(loom))]
pub(crate) mod handoff;
#[cfg(not(loom))]
pub(crate) mod kthread;
#[cfg(not(loom))]
pub(crate) mod monitor;
#[cfg(not(loom))]
pub(crate) mod park;
#[cfg(not(loom))]
pub(crate) mod placement;
#[cfg(not(loom))]
pub(crate) mod spawn;
#[cfg(not(loom))]
pub(crate) mod stack;

#[cfg(all(test, loom))]
mod models;

#[cfg(not(loom))]
pub(crate) use self::context::{ThreadContext, PINNED};
#[cfg(not(loom))]
pub(crate) use self::core::Core;
#[cfg(not(loom))]
pub(crate) use wakeup::BLOCKED;
