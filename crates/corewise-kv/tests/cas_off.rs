//! memcached's `-C` (CAS values off) against the real binary, side by
//! side with memcached given the same flag when it is installed: CAS 0
//! everywhere a client sees one, a `cas` that never matches, compare
//! values of `ma`, `md` and the binary counters and delete that match 0,
//! an append's compare ignored, `E` refused, items 8 bytes smaller; and
//! how compare values steer a meta set with CAS on (mode by mode, as
//! memcached's `do_store_item` reads them).

mod common;

use common::{frame, Client, Pair};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn raw(r: &[u8]) -> String {
    String::from_utf8_lossy(r).into_owned()
}

#[test]
fn with_cas_off_every_cas_is_0_and_a_cas_never_matches() {
    let both = Pair::start_alike(&["-C"]);
    let check = |req: &str, want: &str| both.check(req.as_bytes(), want, raw);
    check("set a 0 0 1\r\nx\r\n", "STORED\r\n");
    check("gets a\r\n", "VALUE a 0 1 0\r\nx\r\nEND\r\n");
    check("gats 0 a\r\n", "VALUE a 0 1 0\r\nx\r\nEND\r\n");
    check("mg a c v\r\n", "VA 1 c0\r\nx\r\n");
    // Whatever it compares, a `cas` finds the item changed.
    check("cas a 0 0 1 0\r\ny\r\n", "EXISTS\r\n");
    check("cas a 0 0 1 1\r\ny\r\n", "EXISTS\r\n");
    check("cas nokey 0 0 1 0\r\ny\r\n", "NOT_FOUND\r\n");
    check("ms a 1 C0\r\nz\r\n", "EX\r\n");
    check("ms a 1 MR C0\r\nz\r\n", "EX\r\n");
    check("ms a 1 I C0\r\nz\r\n", "EX\r\n");
    check("ms gone 1 C0\r\nz\r\n", "NF\r\n");
    check("ms a 1 c\r\nz\r\n", "HD c0\r\n");
    // An add ignores the compare value; an append too, with CAS off.
    check("ms a 1 ME C0\r\nz\r\n", "NS\r\n");
    check("ms a 1 MA C9 c\r\nz\r\n", "HD c0\r\n");
    check("mg a v\r\n", "VA 2\r\nzz\r\n");
    // Counters and deletes compare with 0.
    check("set n 0 0 1\r\n5\r\n", "STORED\r\n");
    check("ma n c\r\n", "HD c0\r\n");
    check("ma n c C0\r\n", "HD c0\r\n");
    check("ma n c C7\r\n", "EX\r\n");
    check("md n C3 q\r\n", "EX\r\n");
    check("md n C0\r\n", "HD\r\n");
    // No CAS to set: `E` is refused, in each command's words (an `ms`
    // still has its data block skipped).
    check("set n 0 0 1\r\n5\r\n", "STORED\r\n");
    check("ma n E5\r\n", "CLIENT_ERROR invalid or duplicate flag\r\n");
    check(
        "md n E5 q\r\n",
        "CLIENT_ERROR invalid or duplicate flag\r\n",
    );
    check("mg n E5 v\r\n", "CLIENT_ERROR invalid flag\r\n");
    check("ms n 1 E5\r\nz\r\n", "CLIENT_ERROR invalid flag\r\n");
    // Refused where it stands, before the flags after it are read.
    check("mg n E\r\n", "CLIENT_ERROR invalid flag\r\n");
    check("mg n E5 v v\r\n", "CLIENT_ERROR invalid flag\r\n");
    check("ms n 5 E5 MZ\r\nabcde\r\n", "CLIENT_ERROR invalid flag\r\n");
    // The size histogram needs CAS values.
    check(
        "stats sizes_enable\r\n",
        "STAT sizes_status error\r\nSTAT sizes_error cas_support_disabled\r\n",
    );
    check("stats sizes\r\n", "STAT sizes_status disabled\r\nEND\r\n");
    check("mg n v\r\n", "VA 1\r\n5\r\n");
    for port in both.ports() {
        let mut c = Client::connect(port);
        let stats = c.stats("");
        let get = |name: &str| {
            stats
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no stat {name} on {port}"))
        };
        // Five `cas`-like requests on an existing item, two on missing
        // ones, none matched.
        assert_eq!(
            (get("cas_badval"), get("cas_misses"), get("cas_hits")),
            ("5".into(), "2".into(), "0".into()),
            "port {port}"
        );
        let settings = c.stats("settings");
        assert!(
            settings.contains(&("cas_enabled".into(), "no".into())),
            "port {port}: {settings:?}"
        );
    }
}

#[test]
fn a_refused_meta_set_skips_its_data_whatever_its_length() {
    let both = Pair::start_alike(&["-C"]);
    // Over the item size limit, with a flag refused: the data block is
    // still swallowed, not read as commands (nor a reason to drop the
    // connection).
    for head in ["ms a 2000000 E5\r\n", "ms a 2000000 T\r\n"] {
        let mut req = head.as_bytes().to_vec();
        req.extend(std::iter::repeat_n(b'x', 2_000_000));
        req.extend_from_slice(b"\r\n");
        let want = if head.contains("E5") {
            "CLIENT_ERROR invalid flag\r\n"
        } else {
            "CLIENT_ERROR bad token in command line format\r\n"
        };
        both.check(&req, want, raw);
    }
}

#[test]
fn with_cas_off_a_flush_in_the_past_drops_only_what_was_stored_by_then() {
    let both = Pair::start_alike(&["-C"]);
    let ports = both.ports();
    for &port in &ports {
        common::exchange(port, b"set old 0 0 1\r\n1\r\n");
    }
    std::thread::sleep(Duration::from_millis(2_200));
    for &port in &ports {
        let now = Client::connect(port).stat("time");
        let req = format!(
            "set new 0 0 1\r\n2\r\nflush_all {}\r\nget old new\r\n",
            now - 1
        );
        assert_eq!(
            raw(&common::exchange(port, req.as_bytes())),
            "STORED\r\nOK\r\nVALUE new 0 1\r\n2\r\nEND\r\n",
            "port {port}"
        );
    }
}

#[test]
fn with_cas_off_items_are_8_bytes_smaller() {
    let both = Pair::start_alike(&["-C"]);
    let check = |req: &[u8], want: &str| both.check(req, want, raw);
    // The largest value of key `k` with `-I 1m` is 8 bytes longer than
    // with CAS values (1 048 516).
    let value = |n: usize| {
        let mut r = format!("set k 0 0 {n}\r\n").into_bytes();
        r.extend(std::iter::repeat_n(b'x', n));
        r.extend_from_slice(b"\r\n");
        r
    };
    check(&value(1_048_524), "STORED\r\n");
    check(
        &value(1_048_525),
        "SERVER_ERROR object too large for cache\r\n",
    );
    check(b"mg k s\r\n", "EN\r\n");
    check(b"set n 0 0 1\r\n5\r\n", "STORED\r\n");
    // `me`'s size: 61 bytes with CAS values.
    let size = |r: &[u8]| {
        raw(r)
            .split(' ')
            .find(|w| w.starts_with("size="))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    both.check(b"me n\r\n", "size=53\r\n", size);
}

#[test]
fn with_cas_off_the_binary_protocol_shows_cas_0_and_ignores_a_request_cas() {
    let both = Pair::start_alike(&["-C"]);
    let set = |op: u8, key: &[u8], value: &[u8], cas: u64| {
        with_cas(frame(op, &[0, 0, 0, 0, 0, 0, 0, 0], key, value, 7), cas)
    };
    let arith = |key: &[u8], cas: u64| {
        let mut extras = 1u64.to_be_bytes().to_vec();
        extras.extend_from_slice(&0u64.to_be_bytes());
        extras.extend_from_slice(&0u32.to_be_bytes());
        with_cas(frame(0x05, &extras, key, &[], 7), cas)
    };
    for port in both.ports() {
        let got = |f: Vec<u8>| one(port, &f);
        // (status, cas)
        assert_eq!(got(set(0x01, b"k", b"v", 0)), (0, 0), "set, port {port}");
        assert_eq!(
            got(frame(0x00, &[], b"k", &[], 7)),
            (0, 0),
            "get, port {port}"
        );
        // A set or replace carrying a CAS is a plain one: the item holds
        // none to compare with.
        assert_eq!(
            got(set(0x01, b"k", b"w", 5)),
            (0, 0),
            "set with cas, port {port}"
        );
        assert_eq!(
            got(set(0x03, b"k", b"x", 5)),
            (0, 0),
            "replace with cas, port {port}"
        );
        assert_eq!(
            got(set(0x02, b"k", b"y", 5)),
            (2, 0),
            "add with cas, port {port}"
        );
        assert_eq!(got(set(0x01, b"n", b"1", 0)), (0, 0), "set n, port {port}");
        // Counters and deletes compare with the item's CAS, 0.
        assert_eq!(got(arith(b"n", 5)), (2, 0), "incr with cas 5, port {port}");
        assert_eq!(got(arith(b"n", 0)), (0, 0), "incr, port {port}");
        assert_eq!(
            got(with_cas(frame(0x04, &[], b"n", &[], 7), 5)),
            (2, 0),
            "delete with cas 5, port {port}"
        );
        assert_eq!(
            got(frame(0x04, &[], b"n", &[], 7)),
            (0, 0),
            "delete, port {port}"
        );
    }
}

#[test]
fn with_cas_off_a_flush_also_drops_what_is_stored_later_in_its_second() {
    // Without CAS values memcached tells flushed items by the second they
    // were stored in, up to and with the flush's own; with them, by their
    // CAS, so what is stored after the flush stays.
    for (flags, kept) in [(&["-C"][..], ""), (&[][..], "VALUE b 0 1\r\ny\r\n")] {
        let both = Pair::start_alike(flags);
        for port in both.ports() {
            let mut judged = 0;
            for round in 0..5 {
                let (a, b) = (format!("a{round}"), format!("b{round}"));
                let before = Client::connect(port).stat("time");
                let reply = common::exchange(
                    port,
                    format!(
                        "set {a} 0 0 1\r\nx\r\nflush_all\r\nset {b} 0 0 1\r\ny\r\nget {a} {b}\r\n"
                    )
                    .as_bytes(),
                );
                if Client::connect(port).stat("time") != before {
                    // The second turned meanwhile: nothing to judge.
                    continue;
                }
                judged += 1;
                assert_eq!(
                    raw(&reply),
                    format!("STORED\r\nOK\r\nSTORED\r\n{}END\r\n", kept.replace('b', &b)),
                    "port {port}, flags {flags:?}"
                );
            }
            assert!(judged > 0, "port {port}: every round straddled a second");
        }
    }
}

#[test]
fn with_cas_on_a_meta_set_reads_its_compare_value_by_mode() {
    let both = Pair::start_alike(&[]);
    let check = |req: &str, want: &str| both.check(req.as_bytes(), want, raw);
    // An add ignores it: stored when absent, not stored when present.
    check("ms e 1 ME C5\r\nz\r\n", "HD\r\n");
    check("ms e 1 ME C5\r\nz\r\n", "NS\r\n");
    // An append needs the item first, then a matching value.
    check("ms p 1 MA C5\r\nz\r\n", "NS\r\n");
    check("ms e 1 MA C5\r\nz\r\n", "EX\r\n");
    // A replace with one is a `cas`.
    check("ms q 1 MR C5\r\nz\r\n", "NF\r\n");
    check("ms e 1 MR C5\r\nz\r\n", "EX\r\n");
    // A compare value of 0 never matches a set, even an invalidating one,
    // and is no compare at all for a counter.
    check("ms e 1 I C0\r\nz\r\n", "EX\r\n");
    check("set n 0 0 1\r\n5\r\n", "STORED\r\n");
    check("ma n v C0\r\n", "VA 1\r\n6\r\n");
    // An `md` whose compare fails counts as a miss.
    check("md n C99\r\n", "EX\r\n");
    for port in both.ports() {
        assert_eq!(
            Client::connect(port).stat("delete_misses"),
            1,
            "port {port}"
        );
    }
}

/// `f` with its header's CAS set to `cas`.
fn with_cas(mut f: Vec<u8>, cas: u64) -> Vec<u8> {
    f[16..24].copy_from_slice(&cas.to_be_bytes());
    f
}

/// Sends one binary request and returns its response's status and CAS.
fn one(port: u16, f: &[u8]) -> (u16, u64) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(f).unwrap();
    let mut h = [0u8; 24];
    s.read_exact(&mut h).expect("response header");
    let body = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
    let mut b = vec![0; body];
    s.read_exact(&mut b).expect("response body");
    let status = u16::from_be_bytes([h[6], h[7]]);
    let cas = u64::from_be_bytes([h[16], h[17], h[18], h[19], h[20], h[21], h[22], h[23]]);
    (status, cas)
}
