//! corewise-arbiter: the core arbiter daemon and its client library.
//!
//! The daemon owns the machine's cores and grants whole cores to
//! applications (Arachne's core arbiter, OSDI 2018, with per-user limits). A
//! thread library talks to it through [`client`]: one socket per kernel thread
//! (a thread without a core sleeps in a read on it), and one read-only shared
//! page per application, so "must I release my core?" is a memory load.
//!
//! Modules, one role each:
//! - [`protocol`]: versioned wire messages and the total decoder;
//! - [`client`]: the library applications link;
//! - [`shm`]: the shared page;
//! - [`daemon`]: socket loop, startup and teardown; [`daemon::state`] its bookkeeping;
//! - [`policy`]: how many cores each application gets, and which;
//! - [`fence`]: cgroup v1, cgroup v2 and affinity-only backends;
//! - [`topology`]: CPU lists, hyperthread siblings and packages;
//! - [`config`]: per-user limits;
//! - [`status`]: the status table.
//!
//! The daemon side (`config`, `daemon`, `fence`, `policy`, `status` and the
//! binary) is the default feature `daemon`; a thread library depends on the
//! crate with `default-features = false` and gets only the client, the
//! protocol and the shared page, without clap, serde, toml or
//! tracing-subscriber.
//!
//! ```
//! use corewise_arbiter::config::Limits;
//! // An anti-social request is clipped to the user's limits.
//! let l = Limits { max_cores: 2, max_priority: 3, ..Limits::default() };
//! assert_eq!(l.clip([8, 0, 0, 0, 0, 0, 0, 0]).effective, [0, 0, 0, 2, 0, 0, 0, 0]);
//! ```

pub mod client;
#[cfg(feature = "daemon")]
pub mod config;
pub mod cpulist;
#[cfg(feature = "daemon")]
pub mod daemon;
#[cfg(feature = "daemon")]
pub mod fence;
#[cfg(feature = "daemon")]
pub mod policy;
pub mod protocol;
pub mod shm;
#[cfg(feature = "daemon")]
pub mod status;
pub mod topology;
#[cfg(feature = "daemon")]
pub mod warm;

pub use client::{connect, Client, ClientError, CoreThread, RequestAck};
pub use topology::CoreId;
