//! incr/decr keep a value's length when the result is shorter, as
//! memcached 1.6.18 does: it writes the number over the value in place and
//! fills the rest with spaces when the number fits (`res + 2 <= nbytes`),
//! and makes a new item of the number's exact length when it does not.
//! Either way the item gets a new CAS. The padded value still reads as a
//! number (`strtoull` stops at the first space). The expected bytes were
//! taken from memcached 1.6.18; when `memcached` is on PATH each exchange
//! also runs against it.
//!
//! memcached also makes a new item when a read still holds the old one: a
//! get's reference lasts until some time after its reply went out, even
//! for an incr from another connection. So here a key is read only after
//! its last change.

mod common;

use common::{bin_exchange, frame, Pair};

fn text(r: &[u8]) -> String {
    String::from_utf8_lossy(r).into_owned()
}

#[test]
fn text_incr_decr_pad_a_shorter_result() {
    let both = Pair::start(&[]);
    let check = |req: &[u8], want: &str| both.check(req, want, text);

    // Shorter: written in place and padded, a new CAS each time; the
    // padded value is a number for the next incr. Longer: the exact length.
    // No key changes after it was read (see the module docs: memcached
    // holds a read item until some time after its reply went out).
    check(
        b"set n 0 0 3\r\n007\r\nincr n 1\r\nincr n 1\r\ngets n\r\n",
        "STORED\r\n8\r\n9\r\nVALUE n 0 3 3\r\n9  \r\nEND\r\n",
    );
    check(
        b"set g 0 0 2\r\n99\r\nincr g 1\r\ndecr g 1\r\ngets g\r\n",
        "STORED\r\n100\r\n99\r\nVALUE g 0 3 6\r\n99 \r\nEND\r\n",
    );
    // Wrapping at 2^64 keeps all twenty bytes; a NUL and what follows it,
    // or a tab, are padded over like the rest; decr stops at 0.
    check(
        b"set w 0 0 20\r\n18446744073709551615\r\nincr w 2\r\nget w\r\n\
          set z 0 0 3\r\n1\0x\r\nincr z 1\r\nget z\r\nset t 0 0 2\r\n5\t\r\nincr t 1\r\nget t\r\n\
          set d 0 0 3\r\n100\r\ndecr d 1\r\ndecr d 500 noreply\r\nget d\r\n",
        "STORED\r\n1\r\nVALUE w 0 20\r\n1                   \r\nEND\r\n\
         STORED\r\n2\r\nVALUE z 0 3\r\n2  \r\nEND\r\nSTORED\r\n6\r\nVALUE t 0 2\r\n6 \r\nEND\r\n\
         STORED\r\n99\r\nVALUE d 0 3\r\n0  \r\nEND\r\n",
    );
}

#[test]
fn meta_arithmetic_pads_a_shorter_result() {
    let both = Pair::start(&[]);
    let check = |req: &[u8], want: &str| both.check(req, want, text);

    // `ma` answers with the number; the value keeps its four bytes through
    // an incr, a decrement (`MD`), an incr by more and decrements to 0,
    // with a new CAS each time.
    check(
        b"set m 0 0 4\r\n0010\r\nma m\r\nma m MD D5 v\r\nma m MI D100 v c\r\n\
          ma m MD D200 q\r\nma m M- D1 q\r\ngets m\r\n",
        "STORED\r\nHD\r\nVA 1\r\n6\r\nVA 3 c4\r\n106\r\nVALUE m 0 4 6\r\n0   \r\nEND\r\n",
    );
    // A counter `N` creates has the initial value's length; a longer
    // result gets its own length.
    check(
        b"ma vv N0 J7 v\r\nma vv MD v\r\nget vv\r\nset h 0 0 2\r\n99\r\nma h v\r\nget h\r\n",
        "VA 1\r\n7\r\nVA 1\r\n6\r\nVALUE vv 0 1\r\n6\r\nEND\r\n\
         STORED\r\nVA 3\r\n100\r\nVALUE h 0 3\r\n100\r\nEND\r\n",
    );
}

#[test]
fn binary_incr_decr_pad_a_shorter_result() {
    let both = Pair::start(&[]);
    // Increment (0x05), decrement (0x06) and their quiet forms (0x15,
    // 0x16): extras are the delta, the initial value and an expiration
    // (0xffffffff: no counter is created on a miss).
    let arith = |op: u8, key: &[u8], delta: u64, opaque: u32, create: bool| {
        let mut extras = delta.to_be_bytes().to_vec();
        extras.extend_from_slice(&5u64.to_be_bytes());
        extras.extend_from_slice(&(if create { 0u32 } else { u32::MAX }).to_be_bytes());
        frame(op, &extras, key, &[], opaque)
    };
    // Each key: the value stored first (none: the counter is created with
    // the initial value 5), its operations (opcode, delta, result) and the
    // value read back. The quiet forms answer nothing when they succeed.
    type Case = (
        &'static [u8],
        Option<&'static [u8]>,
        &'static [(u8, u64, u64)],
        &'static [u8],
    );
    let cases: [Case; 6] = [
        // Shorter: padded, and read as a number by the next incr.
        (b"b1", Some(b"007"), &[(0x05, 1, 8), (0x05, 1, 9)], b"9  "),
        (b"b2", Some(b"0100"), &[(0x06, 1, 99)], b"99  "),
        (b"b3", Some(b"0100"), &[(0x16, 91, 9)], b"9   "),
        // Exactly the value's length, then one digit more.
        (b"b4", Some(b"0010"), &[(0x15, 991, 1001)], b"1001"),
        (b"b5", Some(b"1001"), &[(0x15, 9000, 10001)], b"10001"),
        // A created counter has the initial value's length.
        (b"b6", None, &[(0x05, 1, 5)], b"5"),
    ];
    let (mut frames, mut want) = (Vec::new(), Vec::new());
    for (key, stored, ops, read) in cases {
        if let Some(v) = stored {
            frames.push(frame(0x01, &[0; 8], key, v, 0));
            want.push((0x01, 0, 0, vec![]));
        }
        for &(op, delta, result) in ops {
            frames.push(arith(op, key, delta, 2, stored.is_none()));
            if op < 0x10 {
                want.push((op, 0, 2, result.to_be_bytes().to_vec()));
            }
        }
        frames.push(frame(0x00, &[], key, &[], 3));
        want.push((0x00, 0, 3, read.to_vec()));
    }
    // A binary get holds its item until its reply is sent, so no key is
    // changed again after it is read.
    assert_eq!(bin_exchange(both.server.port, &frames), want, "corewise-kv");
    if let Some(m) = &both.memcached {
        assert_eq!(bin_exchange(m.1, &frames), want, "memcached");
    }
}
