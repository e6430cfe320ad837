//! The binary protocol over real sockets, in both server modes: large
//! values that span many reads, pipelined quiet commands, a value over
//! `-I` sent in pieces, a broken stream, and text clients alongside.

mod common;

use common::{frame, Server};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const GET: u8 = 0x00;
const SET: u8 = 0x01;
const GETKQ: u8 = 0x0d;
const NOOP: u8 = 0x0a;
const STAT: u8 = 0x10;

fn set(key: &[u8], value: &[u8], opaque: u32) -> Vec<u8> {
    frame(SET, &[0, 0, 0, 7, 0, 0, 0, 0], key, value, opaque)
}

/// A response: opcode, status, opaque, key, value.
type Resp = (u8, u16, u32, Vec<u8>, Vec<u8>);

fn read_resp(s: &mut TcpStream) -> Resp {
    let mut h = [0u8; 24];
    s.read_exact(&mut h).expect("response header");
    assert_eq!(h[0], 0x81, "response magic");
    let key_len = usize::from(u16::from_be_bytes([h[2], h[3]]));
    let extras = usize::from(h[4]);
    let body = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
    let mut b = vec![0; body];
    s.read_exact(&mut b).expect("response body");
    let value = b.split_off(extras + key_len);
    (
        h[1],
        u16::from_be_bytes([h[6], h[7]]),
        u32::from_be_bytes([h[12], h[13], h[14], h[15]]),
        b[extras..].to_vec(),
        value,
    )
}

fn connect(srv: &Server) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", srv.port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

fn binary_session(mode: &str) {
    let mut srv = Server::start(&["--mode", mode, "-I", "1m"]);
    let mut b = connect(&srv);
    let mut text = srv.client();

    // A 600 KB value: many reads on the way in and out.
    let big: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
    b.write_all(&set(b"big", &big, 1)).unwrap();
    let (op, st, opaque, _, _) = read_resp(&mut b);
    assert_eq!((op, st, opaque), (SET, 0, 1));
    b.write_all(&frame(GET, &[], b"big", &[], 2)).unwrap();
    let (_, st, _, _, v) = read_resp(&mut b);
    assert_eq!(st, 0);
    assert!(v == big, "the value comes back intact");

    // Pipelined quiet gets: only hits answer, the noop closes the batch.
    let mut batch = Vec::new();
    for i in 0..100u32 {
        batch.extend(set(
            format!("k{i}").as_bytes(),
            format!("v{i}").as_bytes(),
            i,
        ));
    }
    for i in 0..200u32 {
        batch.extend(frame(GETKQ, &[], format!("k{i}").as_bytes(), &[], i));
    }
    batch.extend(frame(NOOP, &[], &[], &[], 999));
    b.write_all(&batch).unwrap();
    for i in 0..100u32 {
        assert_eq!(read_resp(&mut b).2, i, "set {i}");
    }
    for i in 0..100u32 {
        let (op, st, opaque, key, value) = read_resp(&mut b);
        assert_eq!((op, st, opaque), (GETKQ, 0, i));
        assert_eq!(key, format!("k{i}").as_bytes());
        assert_eq!(value, format!("v{i}").as_bytes());
    }
    assert_eq!(read_resp(&mut b).2, 999, "the misses were silent");

    // Both protocols see the same items.
    assert_eq!(text.cmd("get k7"), "VALUE k7 7 2");
    assert_eq!(text.block(2), b"v7");
    assert_eq!(text.line(), "END");

    // Over -I, sent in pieces: "too large", and the connection goes on.
    let huge = set(b"huge", &vec![b'x'; 2 << 20], 5);
    for piece in huge.chunks(64 * 1024) {
        b.write_all(piece).unwrap();
    }
    let (_, st, opaque, _, msg) = read_resp(&mut b);
    assert_eq!((st, opaque, msg.as_slice()), (3, 5, &b"Too large."[..]));
    b.write_all(&frame(GET, &[], b"k3", &[], 6)).unwrap();
    assert_eq!(read_resp(&mut b).4, b"v3");

    // `stat detail ...` as memcached answers it in binary: the dump is one
    // statistic named `detailed` holding the text dump, END included; the
    // switches answer with the terminator alone.
    let stat = |b: &mut TcpStream, key: &[u8]| -> Vec<Resp> {
        b.write_all(&frame(STAT, &[], key, &[], 8)).unwrap();
        let mut all = Vec::new();
        loop {
            let r = read_resp(b);
            let end = r.3.is_empty();
            all.push(r);
            if end {
                return all;
            }
        }
    };
    let dump = stat(&mut b, b"detail dump");
    assert_eq!(dump.len(), 2);
    assert_eq!(
        (dump[0].3.as_slice(), dump[0].4.as_slice()),
        (&b"detailed"[..], &b"END\r\n"[..])
    );
    assert_eq!(stat(&mut b, b"detail on").len(), 1);
    b.write_all(&set(b"p:x", b"1", 9)).unwrap();
    assert_eq!(read_resp(&mut b).1, 0);
    let dump = stat(&mut b, b"detail dump");
    assert_eq!(
        dump[0].4,
        b"PREFIX p get 0 hit 0 set 1 del 0\r\nEND\r\n",
        "{:?}",
        String::from_utf8_lossy(&dump[0].4)
    );
    assert_eq!(stat(&mut b, b"detail off").len(), 1);

    // A broken stream closes that connection only.
    b.write_all(&[0x42; 24]).unwrap();
    let mut rest = Vec::new();
    let _ = b.read_to_end(&mut rest);
    assert!(rest.is_empty(), "nothing answered to a bad magic");
    assert_eq!(text.cmd("get k9"), "VALUE k9 7 2");
    assert_eq!(text.block(2), b"v9");
    assert!(srv.alive());
}

#[test]
fn binary_protocol_conn_mode() {
    binary_session("conn");
}

#[test]
fn binary_protocol_dispatch_mode() {
    binary_session("dispatch");
}
