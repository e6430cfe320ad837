//! Core arbiter: protocol, client and daemon (work in progress).
