//! Binary requests whose header does not fit their opcode, side by side
//! with memcached 1.6.18 when it is installed: a body laid out wrongly
//! (extras, key or value where the opcode has none, a key over 250 bytes)
//! is answered "Invalid arguments" and the connection closed; extras and
//! key longer than the body, "Unknown command" and closed; the retired
//! verbosity opcode, "Unknown command" and the connection goes on.

mod common;

use common::{frame, Memcached, Server};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const NOOP: u8 = 0x0a;

/// Sends `req` then a noop on a fresh connection; returns (opcode, status,
/// opaque) of every response and whether the server then closed.
fn replies(port: u16, req: &[u8]) -> (Vec<(u8, u16, u32)>, bool) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    s.write_all(req).unwrap();
    // The server may have closed already: the noop may not go out.
    let _ = s.write_all(&frame(NOOP, &[], &[], &[], 99));
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
        // Both answers in: no need to wait for a close that is not coming.
        if got.len() >= 48 && got.ends_with(&frame(NOOP, &[], &[], &[], 99)[8..]) {
            break false;
        }
    };
    let mut out = Vec::new();
    let mut p = 0;
    while let Some(h) = got.get(p..p + 24) {
        let body = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
        out.push((
            h[1],
            u16::from_be_bytes([h[6], h[7]]),
            u32::from_be_bytes([h[12], h[13], h[14], h[15]]),
        ));
        p += 24 + body;
    }
    (out, closed)
}

fn run(mode: &str) {
    let s = Server::start(&["--mode", mode]);
    let mc = Memcached::start();
    let invalid = |op: u8| (vec![(op, 4u16, 1u32)], true);
    let mut cases = vec![
        // get with extras, set without, a 251-byte key
        (frame(0x00, &[0; 4], b"k", &[], 1), invalid(0x00)),
        (frame(0x01, &[], b"k", b"v", 1), invalid(0x01)),
        (frame(0x01, &[0; 8], &[b'k'; 251], b"v", 1), invalid(0x01)),
        // noop and version with a key, delete with a value, flush with
        // two bytes of extras, incr without a key
        (frame(NOOP, &[], b"k", &[], 1), invalid(NOOP)),
        (frame(0x0b, &[], b"k", &[], 1), invalid(0x0b)),
        (frame(0x04, &[], b"k", b"zz", 1), invalid(0x04)),
        (frame(0x08, &[0; 2], &[], &[], 1), invalid(0x08)),
        (frame(0x05, &[0; 20], &[], &[], 1), invalid(0x05)),
        // verbosity: unknown, the connection goes on
        (
            frame(0x1b, &[], &[], &[], 1),
            (vec![(0x1b, 0x81, 1), (NOOP, 0, 99)], false),
        ),
        // quit and quitq with a body: invalid, not a quit
        (frame(0x07, &[0; 4], &[], &[], 1), invalid(0x07)),
        (frame(0x17, &[], &[], b"x", 1), invalid(0x17)),
        // SASL, which neither serves: its layout is checked first (a list
        // with a body, an auth or step without a key or with extras are
        // invalid); a well-formed one is unknown and the connection goes on
        (frame(0x20, &[], b"k", &[], 1), invalid(0x20)),
        (frame(0x21, &[], &[], &[], 1), invalid(0x21)),
        (frame(0x22, &[0; 4], b"PLAIN", &[], 1), invalid(0x22)),
        (
            frame(0x20, &[], &[], &[], 1),
            (vec![(0x20, 0x81, 1), (NOOP, 0, 99)], false),
        ),
        (
            frame(0x21, &[], b"PLAIN", b"\0u\0p", 1),
            (vec![(0x21, 0x81, 1), (NOOP, 0, 99)], false),
        ),
        // stat groups binary memcached does not serve: not found
        (
            frame(0x10, &[], b"conns", &[], 1),
            (vec![(0x10, 1, 1), (NOOP, 0, 99)], false),
        ),
        (
            frame(0x10, &[], b"items2", &[], 1),
            (vec![(0x10, 1, 1), (NOOP, 0, 99)], false),
        ),
        // the size histogram's switches: one statistic, no empty response
        // after it
        (
            frame(0x10, &[], b"sizes_enable", &[], 1),
            (vec![(0x10, 0, 1), (NOOP, 0, 99)], false),
        ),
        (
            frame(0x10, &[], b"sizes_disable", &[], 1),
            (vec![(0x10, 0, 1), (NOOP, 0, 99)], false),
        ),
    ];
    // A key of 10 bytes in a body of 5.
    let mut short = frame(0x00, &[], b"abcde", &[], 1);
    short[3] = 10;
    cases.push((short, (vec![(0x00, 0x81, 1)], true)));
    for (req, want) in cases {
        assert_eq!(replies(s.port, &req), want, "corewise-kv on {req:?}");
        if let Some(m) = &mc {
            assert_eq!(replies(m.1, &req), want, "memcached on {req:?}");
        }
    }
}

#[test]
fn malformed_binary_conn_mode() {
    run("conn");
}

#[test]
fn malformed_binary_dispatch_mode() {
    run("dispatch");
}
