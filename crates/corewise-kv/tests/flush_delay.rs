//! `flush_all <delay>` as memcached 1.6.18 times it: the flush sets
//! `oldest_live = realtime(delay) - 1`, and once the server clock reaches
//! that second every item stored up to and during it is gone. So a delay
//! of N seconds takes effect one second early, a delay of 1 at once (with
//! the items stored later in the same second), and an item stored in the
//! cut-off second itself is dropped as soon as it is stored; items stored
//! after it stay. An absolute time before memcached's start flushes
//! nothing and cancels a waiting flush. Each exchange runs against
//! corewise-kv and, when installed, memcached.

mod common;

use common::{bin_exchange, exchange, frame, Memcached, Pair, Server};
use std::time::{Duration, Instant};

fn text(r: &[u8]) -> String {
    String::from_utf8_lossy(r).into_owned()
}

/// A binary flush (0x08, or 0x18 quiet) with its expiration extras.
fn bin_flush(op: u8, delay: u32) -> Vec<u8> {
    frame(op, &delay.to_be_bytes(), &[], &[], 9)
}

/// Runs `req` until its reply is `want`, at most three times: a server
/// second that ends in the middle of the exchange changes the answer.
fn within_a_second(port: u16, req: &[u8], want: &str, who: &str) {
    let mut got = String::new();
    for _ in 0..3 {
        got = text(&exchange(port, req));
        if got == want {
            return;
        }
    }
    assert_eq!(got, want, "{who} on {:?}", text(req));
}

/// Both servers' ports, named.
fn ports(both: &Pair) -> Vec<(u16, &'static str)> {
    let mut v = vec![(both.server.port, "corewise-kv")];
    if let Some(m) = &both.memcached {
        v.push((m.1, "memcached"));
    }
    v
}

#[test]
fn a_delay_of_one_flushes_at_once_with_the_rest_of_the_second() {
    let both = Pair::start(&[]);
    for (port, who) in ports(&both) {
        within_a_second(
            port,
            b"set a 0 0 1\r\nx\r\nflush_all 1 noreply\r\nget a\r\nset b 0 0 1\r\ny\r\nget b\r\n",
            "STORED\r\nEND\r\nSTORED\r\nEND\r\n",
            who,
        );
        within_a_second(
            port,
            b"set a 0 0 1\r\nx\r\nflush_all 1\r\nget a\r\nset b 0 0 1\r\ny\r\nget b\r\n",
            "STORED\r\nOK\r\nEND\r\nSTORED\r\nEND\r\n",
            who,
        );
        // The binary flush's expiration extras mean the same; without
        // extras it is immediate, and what is stored next stays.
        let set = |key: &[u8], opaque| frame(0x01, &[0; 8], key, b"v", opaque);
        let get = |key: &[u8], opaque| frame(0x00, &[], key, &[], opaque);
        let ok = |op, opaque, v: &[u8]| Some((op, 0, opaque, v.to_vec()));
        let missed = |opaque| Some((0x00, 1, opaque, b"Not found".to_vec()));
        let steps = [
            (set(b"k", 1), ok(0x01, 1, b"")),
            (bin_flush(0x08, 1), ok(0x08, 9, b"")),
            (get(b"k", 2), missed(2)),
            (set(b"k2", 3), ok(0x01, 3, b"")),
            (get(b"k2", 4), missed(4)),
            (frame(0x18, &[], &[], &[], 9), None),
            (set(b"k3", 5), ok(0x01, 5, b"")),
            (get(b"k3", 6), ok(0x00, 6, b"v")),
        ];
        let frames: Vec<Vec<u8>> = steps.iter().map(|(f, _)| f.clone()).collect();
        let want: Vec<_> = steps.into_iter().filter_map(|(_, w)| w).collect();
        let mut got = Vec::new();
        for _ in 0..3 {
            got = bin_exchange(port, &frames);
            if got == want {
                break;
            }
        }
        assert_eq!(got, want, "{who}: binary flush with expiration 1");
    }
}

#[test]
fn no_delay_a_negative_one_or_a_time_long_past() {
    let both = Pair::start(&[]);
    // No delay, or a negative one: at once, and what is stored next stays.
    both.check(
        b"set a 0 0 1\r\nx\r\nflush_all\r\nget a\r\nset a 0 0 1\r\ny\r\nget a\r\n\
          flush_all -1 noreply\r\nget a\r\nset a 0 0 1\r\nz\r\nget a\r\n",
        "STORED\r\nOK\r\nEND\r\nSTORED\r\nVALUE a 0 1\r\ny\r\nEND\r\n\
         END\r\nSTORED\r\nVALUE a 0 1\r\nz\r\nEND\r\n",
        text,
    );
    // An absolute time before the server started (1970 here) flushes
    // nothing: memcached's realtime() gives it 1, so oldest_live is 0.
    both.check(
        b"flush_all 2592001\r\nget a\r\nflush_all 2592001 noreply\r\nget a\r\n",
        "OK\r\nVALUE a 0 1\r\nz\r\nEND\r\nVALUE a 0 1\r\nz\r\nEND\r\n",
        text,
    );
}

#[test]
fn a_time_long_past_cancels_a_waiting_flush() {
    let both = Pair::start(&[]);
    both.check(
        b"set a 0 0 1\r\nx\r\nflush_all 2\r\nflush_all 2592001\r\n",
        "STORED\r\nOK\r\nOK\r\n",
        text,
    );
    std::thread::sleep(Duration::from_millis(2500));
    both.check(
        b"get a\r\nset b 0 0 1\r\ny\r\nget b\r\n",
        "VALUE a 0 1\r\nx\r\nEND\r\nSTORED\r\nVALUE b 0 1\r\ny\r\nEND\r\n",
        text,
    );
}

/// How a scenario sends `flush_all 2`: its bytes on a text connection, or
/// a binary frame on a connection of its own.
enum Flush {
    Text(&'static [u8]),
    Binary(u8),
}

/// `flush_all 2` at server second T: items stored before and after it stay
/// until second T + 1 begins, then every one of them is gone, and so is an
/// item stored during T + 1; items stored from T + 2 on stay.
fn delayed_flush(port: u16, who: &str, flush: &Flush) {
    let start = Instant::now();
    let mut req = b"flush_all\r\nset a 0 0 1\r\nx\r\n".to_vec();
    let mut want = "OK\r\nSTORED\r\n".to_string();
    match flush {
        Flush::Text(line) => {
            req.extend_from_slice(line);
            if !line.ends_with(b"noreply\r\n") {
                want.push_str("OK\r\n");
            }
        }
        Flush::Binary(op) => {
            assert_eq!(text(&exchange(port, &req)), want, "{who}");
            let got = bin_exchange(port, &[bin_flush(*op, 2)]);
            let acked = if *op == 0x08 { 1 } else { 0 };
            assert_eq!(got.len(), acked, "{who}: binary flush answer {got:?}");
            req.clear();
            want.clear();
        }
    }
    req.extend_from_slice(b"set b 0 0 1\r\ny\r\nget a b\r\n");
    want.push_str("STORED\r\nVALUE a 0 1\r\nx\r\nVALUE b 0 1\r\ny\r\nEND\r\n");
    within_a_second(port, &req, &want, who);

    // Both go when the next server second begins (not the one after).
    let gone = |keys: &str| exchange(port, format!("get {keys}\r\n").as_bytes()) == b"END\r\n";
    while !gone("a b") {
        assert!(
            start.elapsed() < Duration::from_millis(1800),
            "{who}: a delay of 2 had not taken effect after {:?}",
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // An item stored in that second goes too.
    assert_eq!(
        text(&exchange(port, b"set c 0 0 1\r\nz\r\nget c\r\n")),
        "STORED\r\nEND\r\n",
        "{who}: an item stored in the cut-off second"
    );
    // From the second after it, items stay.
    let mut n = 0;
    loop {
        n += 1;
        let req = format!("set d{n} 0 0 1\r\nw\r\nget d{n}\r\n");
        if exchange(port, req.as_bytes()) != b"STORED\r\nEND\r\n" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(4),
            "{who}: items stored after the flush never stayed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let req = format!("get a b c d{n}\r\n");
    assert_eq!(
        text(&exchange(port, req.as_bytes())),
        format!("VALUE d{n} 0 1\r\nw\r\nEND\r\n"),
        "{who}"
    );
}

fn delayed_flush_both(flush: Flush) {
    let s = Server::start(&[]);
    delayed_flush(s.port, "corewise-kv", &flush);
    if let Some(m) = Memcached::start() {
        delayed_flush(m.1, "memcached", &flush);
    }
}

#[test]
fn a_delay_of_two_takes_effect_a_second_early() {
    delayed_flush_both(Flush::Text(b"flush_all 2\r\n"));
}

#[test]
fn a_delay_of_two_with_noreply() {
    delayed_flush_both(Flush::Text(b"flush_all 2 noreply\r\n"));
}

#[test]
fn a_binary_flush_with_a_delay_of_two() {
    delayed_flush_both(Flush::Binary(0x08));
    delayed_flush_both(Flush::Binary(0x18));
}
