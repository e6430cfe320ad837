//! corewise-kv: a memcached-compatible key-value server on corewise user
//! threads.
//!
//! The crate is split by role: [`protocol`] turns bytes into requests (a
//! pure, fuzzable parser), [`store`] holds the items (sharded, LRU, memory
//! limit, expiry, CAS), [`exec`] runs a request against the store and
//! writes memcached's reply ([`exec_binary`] for the binary protocol) into
//! a [`reply`] that carries large values by reference, [`config`] reads memcached's command-line
//! flags, [`admin`] runs memcached's operator commands, [`watch`] is the
//! live log of `watch`, [`listen`] is the listening socket (TCP or a unix
//! socket) and what it accepts, and [`server`] moves bytes between sockets and the rest, either
//! with one user thread per connection or with a dispatch thread that
//! creates a short-lived user thread per ready connection (Arachne's
//! memcached port).

pub mod admin;
pub mod config;
pub mod exec;
pub mod exec_binary;
pub mod listen;
pub mod process;
pub mod protocol;
pub mod reply;
mod runtime_stats;
pub mod server;
pub mod store;
pub mod watch;
