//! Large values arrive intact, byte for byte, through the text, meta and
//! binary protocols, in both modes: a 1 MiB value, a multi-get of several
//! 300 KB values (past the spill threshold, so the reply is sent in
//! pieces), and a value appended to, prepended to and replaced while a
//! reply of its old bytes is still being sent to a client that is not
//! reading yet. Replies carry values of a few KiB or more by reference
//! and send them with vectored writes; these tests see what a client
//! sees.

mod common;

use common::{frame, Server};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Duration;

const MIB: usize = 1 << 20;
const KB300: usize = 300 * 1000;

/// `len` pseudo-random bytes from `seed` (no two offsets alike, so a
/// segment sent twice, out of place or short shows as a mismatch).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// Sets the receive buffer of `s` to `bytes`.
fn set_rcvbuf(s: &TcpStream, bytes: libc::c_int) {
    // SAFETY: setsockopt reads `bytes` (a c_int, the size given) on an
    // open socket.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "SO_RCVBUF");
}

fn read_exact(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    s.read_exact(&mut v).expect("reply");
    v
}

fn read_line(s: &mut TcpStream) -> String {
    let mut v = Vec::new();
    let mut b = [0u8; 1];
    while !v.ends_with(b"\r\n") {
        s.read_exact(&mut b).expect("reply line");
        v.push(b[0]);
    }
    v.truncate(v.len() - 2);
    String::from_utf8(v).unwrap()
}

/// Stores `value` under `key` over a connection of its own.
fn set(port: u16, key: &str, value: &[u8]) {
    let mut s = connect(port);
    let mut req = format!("set {key} 7 0 {}\r\n", value.len()).into_bytes();
    req.extend_from_slice(value);
    req.extend_from_slice(b"\r\n");
    s.write_all(&req).unwrap();
    assert_eq!(read_line(&mut s), "STORED", "set {key}");
}

/// Reads one text `VALUE` (header line, data, CRLF) and checks it.
fn expect_value(s: &mut TcpStream, key: &str, want: &[u8]) {
    let head = read_line(s);
    assert_eq!(head, format!("VALUE {key} 7 {}", want.len()));
    let data = read_exact(s, want.len() + 2);
    assert!(&data[..want.len()] == want, "{key}: value bytes differ");
    assert_eq!(&data[want.len()..], b"\r\n");
}

/// Reads one meta `VA` reply and checks it.
fn expect_meta(s: &mut TcpStream, want: &[u8]) {
    assert_eq!(read_line(s), format!("VA {} f7", want.len()));
    let data = read_exact(s, want.len() + 2);
    assert!(&data[..want.len()] == want, "mg: value bytes differ");
    assert_eq!(&data[want.len()..], b"\r\n");
}

/// Reads one binary response and checks it is a hit with `key` (empty
/// for GET) and `want` as its value.
fn expect_binary(s: &mut TcpStream, opaque: u32, key: &[u8], want: &[u8]) {
    let h = read_exact(s, 24);
    assert_eq!(
        (h[0], u16::from_be_bytes([h[6], h[7]])),
        (0x81, 0),
        "status"
    );
    let key_len = usize::from(u16::from_be_bytes([h[2], h[3]]));
    let extras = usize::from(h[4]);
    let body = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
    assert_eq!(u32::from_be_bytes([h[12], h[13], h[14], h[15]]), opaque);
    assert_eq!(
        (extras, key_len, body),
        (4, key.len(), 4 + key.len() + want.len())
    );
    let b = read_exact(s, body);
    assert_eq!(u32::from_be_bytes([b[0], b[1], b[2], b[3]]), 7, "flags");
    assert_eq!(&b[4..4 + key_len], key);
    assert!(&b[4 + key_len..] == want, "binary: value bytes differ");
}

fn one_mib_and_multi_get(mode: &str) {
    let s = Server::start(&["--mode", mode, "-m", "64", "-I", "4m"]);
    let big = pattern(1, MIB);
    set(s.port, "big", &big);
    let parts: Vec<Vec<u8>> = (0..5)
        .map(|i| pattern(10 + i, KB300 + i as usize))
        .collect();
    for (i, p) in parts.iter().enumerate() {
        set(s.port, &format!("p{i}"), p);
    }
    // A value just under and one at the reference threshold's usual
    // sizes, and a tiny one, between the large ones.
    let small = pattern(3, 5);
    let mid = pattern(4, 8 * 1024);
    set(s.port, "small", &small);
    set(s.port, "mid", &mid);

    // Text: get, and a multi-get with misses among the hits.
    let mut c = connect(s.port);
    c.write_all(b"get big\r\nget p0 small p1 nope p2 mid p3 p4 big\r\n")
        .unwrap();
    expect_value(&mut c, "big", &big);
    assert_eq!(read_line(&mut c), "END");
    for (k, v) in [
        ("p0", &parts[0]),
        ("small", &small),
        ("p1", &parts[1]),
        ("p2", &parts[2]),
        ("mid", &mid),
        ("p3", &parts[3]),
        ("p4", &parts[4]),
        ("big", &big),
    ] {
        expect_value(&mut c, k, v);
    }
    assert_eq!(read_line(&mut c), "END");

    // Meta: `mg <key> v f`, pipelined.
    c.write_all(b"mg big v f\r\nmg p3 v f\r\nmg small v f\r\nmn\r\n")
        .unwrap();
    expect_meta(&mut c, &big);
    expect_meta(&mut c, &parts[3]);
    expect_meta(&mut c, &small);
    assert_eq!(read_line(&mut c), "MN");

    // Binary: GET and GETK, pipelined, on a connection of its own.
    let mut b = connect(s.port);
    let mut req = frame(0x00, &[], b"big", &[], 1);
    for (i, k) in ["p0", "p1", "p2", "p3", "p4"].iter().enumerate() {
        req.extend_from_slice(&frame(0x0c, &[], k.as_bytes(), &[], 2 + i as u32));
    }
    req.extend_from_slice(&frame(0x00, &[], b"small", &[], 9));
    b.write_all(&req).unwrap();
    expect_binary(&mut b, 1, b"", &big);
    for (i, p) in parts.iter().enumerate() {
        expect_binary(&mut b, 2 + i as u32, format!("p{i}").as_bytes(), p);
    }
    expect_binary(&mut b, 9, b"", &small);
}

#[test]
fn large_values_arrive_intact_conn() {
    one_mib_and_multi_get("conn");
}

#[test]
fn large_values_arrive_intact_dispatch() {
    one_mib_and_multi_get("dispatch");
}

/// How the slow client asks for the old value `COPIES` times.
#[derive(Clone, Copy, Debug)]
enum Proto {
    Text,
    Meta,
    Binary,
}

/// Replies asked for in one go: more than the socket buffers hold (the
/// server's send buffer grows to 4 MiB at most by default), so the server
/// is in the middle of sending one of them while the value changes.
const COPIES: usize = 10;

fn changed_while_sent(mode: &str, proto: Proto) {
    let s = Server::start(&["--mode", mode, "-m", "64", "-I", "4m"]);
    let old = pattern(21, MIB);
    set(s.port, "k", &old);
    // A client with a small receive buffer, not reading yet.
    let mut slow = connect(s.port);
    set_rcvbuf(&slow, 64 * 1024);
    let req = match proto {
        Proto::Text => format!("get{}\r\n", " k".repeat(COPIES)).into_bytes(),
        Proto::Meta => b"mg k v f\r\n".repeat(COPIES),
        Proto::Binary => (0..COPIES as u32)
            .flat_map(|i| frame(0x00, &[], b"k", &[], i))
            .collect(),
    };
    slow.write_all(&req).unwrap();
    // Let the server take the requests and fill the socket.
    std::thread::sleep(Duration::from_millis(200));

    // Meanwhile, the value changes: append, prepend, then a new value,
    // checked after each step by another client.
    let mut c = connect(s.port);
    let tail = pattern(22, 70_000);
    let head = pattern(23, 9_000);
    let mut req = format!("append k 0 0 {}\r\n", tail.len()).into_bytes();
    req.extend_from_slice(&tail);
    req.extend_from_slice(b"\r\n");
    c.write_all(&req).unwrap();
    assert_eq!(read_line(&mut c), "STORED");
    let mut req = format!("prepend k 0 0 {}\r\n", head.len()).into_bytes();
    req.extend_from_slice(&head);
    req.extend_from_slice(b"\r\n");
    c.write_all(&req).unwrap();
    assert_eq!(read_line(&mut c), "STORED");
    let mut now = head.clone();
    now.extend_from_slice(&old);
    now.extend_from_slice(&tail);
    c.write_all(b"get k\r\n").unwrap();
    expect_value(&mut c, "k", &now);
    assert_eq!(read_line(&mut c), "END");
    let new = pattern(24, 600_000);
    set(s.port, "k", &new);

    // The slow client reads now. The requests are run one after
    // another as their replies go out, so each reply is one of the states
    // the value went through, in order: the first ones (those looked up
    // before the changes, one of them sent while they happened) of the
    // old value, whole; the rest of the last value (the intermediate
    // ones only if a lookup fell between two changes).
    set_rcvbuf(&slow, 4 << 20);
    let mut appended = old.clone();
    appended.extend_from_slice(&tail);
    let states = [&old, &appended, &now, &new];
    let mut at = 0;
    let mut olds = 0;
    for i in 0..COPIES {
        let (len, read): (usize, Vec<u8>) = match proto {
            Proto::Text => {
                let line = read_line(&mut slow);
                let len = line
                    .strip_prefix("VALUE k 7 ")
                    .unwrap_or_else(|| panic!("{line:?}"));
                let len = len.parse().unwrap();
                let data = read_exact(&mut slow, len + 2);
                assert_eq!(&data[len..], b"\r\n");
                (len, data[..len].to_vec())
            }
            Proto::Meta => {
                let line = read_line(&mut slow);
                let len = line.strip_prefix("VA ").and_then(|l| l.strip_suffix(" f7"));
                let len = len.unwrap_or_else(|| panic!("{line:?}")).parse().unwrap();
                let data = read_exact(&mut slow, len + 2);
                assert_eq!(&data[len..], b"\r\n");
                (len, data[..len].to_vec())
            }
            Proto::Binary => {
                let h = read_exact(&mut slow, 24);
                assert_eq!((h[0], h[4], u16::from_be_bytes([h[6], h[7]])), (0x81, 4, 0));
                assert_eq!(u32::from_be_bytes([h[12], h[13], h[14], h[15]]), i as u32);
                let body = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
                let b = read_exact(&mut slow, body);
                (body - 4, b[4..].to_vec())
            }
        };
        let Some(j) = states.iter().position(|s| s.len() == len && **s == read) else {
            panic!("{proto:?} reply {i} of {len} bytes is none of the value's states");
        };
        assert!(j >= at, "{proto:?} reply {i} went back to an older value");
        at = j;
        olds += usize::from(j == 0);
    }
    if let Proto::Text = proto {
        assert_eq!(read_line(&mut slow), "END");
    }
    // At least the reply being sent while the value changed (the socket
    // buffers hold less than a third of them).
    assert!(olds >= 2, "{proto:?}: only {olds} replies of the old value");
    println!("{mode} {proto:?}: {olds} of {COPIES} replies of the old value");
    // And then the new one.
    let mut c = connect(s.port);
    c.write_all(b"mg k v f\r\n").unwrap();
    expect_meta(&mut c, &new);
}

#[test]
fn a_value_changed_while_sent_conn_text() {
    changed_while_sent("conn", Proto::Text);
}

#[test]
fn a_value_changed_while_sent_conn_meta() {
    changed_while_sent("conn", Proto::Meta);
}

#[test]
fn a_value_changed_while_sent_conn_binary() {
    changed_while_sent("conn", Proto::Binary);
}

#[test]
fn a_value_changed_while_sent_dispatch_text() {
    changed_while_sent("dispatch", Proto::Text);
}

#[test]
fn a_value_changed_while_sent_dispatch_meta() {
    changed_while_sent("dispatch", Proto::Meta);
}

#[test]
fn a_value_changed_while_sent_dispatch_binary() {
    changed_while_sent("dispatch", Proto::Binary);
}
