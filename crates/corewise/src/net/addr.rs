//! Socket addresses between their std and kernel forms, and the
//! first-address-that-works loop of std's `ToSocketAddrs` calls.

use rustix::net::AddressFamily;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};

/// A `SocketAddr` from a kernel socket address.
pub(crate) fn sockaddr_to_std(s: &libc::sockaddr_storage) -> io::Result<SocketAddr> {
    match s.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says it is a sockaddr_in, which fits.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Ok(SocketAddr::from((
                u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says it is a sockaddr_in6, which fits.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Ok(SocketAddr::V6(std::net::SocketAddrV6::new(
                a.sin6_addr.s6_addr.into(),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not an IP socket address",
        )),
    }
}

/// The kernel form of `a`.
pub(crate) fn std_to_sockaddr(a: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_in fits in the storage, which is aligned for it.
            let p = unsafe {
                &mut *(&mut s as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            p.sin_family = libc::AF_INET as _;
            p.sin_port = v4.port().to_be();
            p.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above, for sockaddr_in6.
            let p = unsafe {
                &mut *(&mut s as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            p.sin6_family = libc::AF_INET6 as _;
            p.sin6_port = v6.port().to_be();
            p.sin6_addr.s6_addr = v6.ip().octets();
            p.sin6_flowinfo = v6.flowinfo();
            p.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (s, len as libc::socklen_t)
}

/// The address family of `a`.
pub(crate) fn family(a: &SocketAddr) -> AddressFamily {
    if a.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    }
}

/// The addresses `addrs` stands for. std's `to_socket_addrs` looks a
/// host name up with `getaddrinfo`, which blocks its kernel thread for as
/// long as DNS takes; on a user thread that would stall every thread of the
/// core, so there it runs on a syscall thread while only the caller waits
/// (see `blocking::off_core`). On an OS thread it is called directly.
pub(crate) fn resolve<A: ToSocketAddrs + Send>(addrs: A) -> io::Result<Vec<SocketAddr>> {
    crate::blocking::off_core(move || addrs.to_socket_addrs().map(Iterator::collect))
}

/// Tries each address of `addrs` (see [`resolve`]) with `f`, returning the
/// first success or the last error.
pub(crate) fn each_addr<T>(
    addrs: impl ToSocketAddrs + Send,
    mut f: impl FnMut(&SocketAddr) -> io::Result<T>,
) -> io::Result<T> {
    let mut last = None;
    for a in resolve(addrs)? {
        match f(&a) {
            Ok(v) => return Ok(v),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "could not resolve to any address",
        )
    }))
}
