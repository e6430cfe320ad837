//! Property tests of the decoder: arbitrary bytes never panic and always
//! make progress; well-formed requests decode to what was sent, however
//! the bytes are split across reads.

use corewise_kv::protocol::{Decoded, Decoder, Limits, Request, StoreCmd};
use proptest::prelude::*;

/// Feeds `chunks` one by one, as reads would, and collects what decodes.
fn feed(chunks: &[Vec<u8>], limits: Limits) -> Vec<String> {
    let mut dec = Decoder::new(limits);
    let mut buf = Vec::new();
    let mut got = Vec::new();
    for c in chunks {
        buf.extend_from_slice(c);
        let mut pos = 0;
        loop {
            let (used, d) = dec.decode(&buf[pos..]);
            assert!(used <= buf.len() - pos);
            pos += used;
            match d {
                Decoded::Incomplete => break,
                other => {
                    assert!(used > 0, "no progress on {other:?}");
                    got.push(format!("{other:?}"));
                }
            }
        }
        buf.drain(..pos);
    }
    got
}

fn split(data: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
    points.sort_unstable();
    let mut out = Vec::new();
    let mut at = 0;
    for p in points {
        out.push(data[at..p].to_vec());
        at = p;
    }
    out.push(data[at..].to_vec());
    out
}

fn key() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_:.-]{1,40}"
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..2048),
                                   cuts in proptest::collection::vec(any::<usize>(), 0..4)) {
        let chunks = split(&data, &cuts);
        feed(&chunks, Limits { item_max: 64, ..Limits::default() });
    }

    #[test]
    fn commandish_bytes_never_panic(words in proptest::collection::vec(
        prop_oneof![
            Just("get".to_string()), Just("set".to_string()), Just("ms".to_string()),
            Just("mg".to_string()), Just("cas".to_string()), Just("incr".to_string()),
            Just("noreply".to_string()), Just("\r\n".to_string()), Just("-1".to_string()),
            "[0-9]{1,22}", "[a-zA-Z]{1,5}", Just(" ".to_string()),
        ], 0..40),
        cuts in proptest::collection::vec(any::<usize>(), 0..4)) {
        let data = words.join(" ").into_bytes();
        let chunks = split(&data, &cuts);
        feed(&chunks, Limits { item_max: 16, ..Limits::default() });
    }

    #[test]
    fn long_lines_decode_the_same_however_split(len in 2000usize..2100, newline in any::<bool>(),
                                                get in any::<bool>(),
                                                cuts in proptest::collection::vec(any::<usize>(), 0..5)) {
        // Around the 2 KiB limit: a line that is not a multi-get closes the
        // connection (Quit) when longer, whether or not its newline came
        // with it; a multi-get is read. Splitting must not change that.
        let mut data = if get { b"get ".to_vec() } else { Vec::new() };
        data.resize(len, b'k');
        if newline {
            data.extend_from_slice(b"\r\n");
        }
        data.extend_from_slice(b"version\r\n");
        let whole = feed(std::slice::from_ref(&data), Limits::default());
        let chunks = split(&data, &cuts);
        prop_assert_eq!(&feed(&chunks, Limits::default()), &whole);
        let quit = format!("{:?}", Decoded::Request(Request::Quit));
        // Without its own newline the line runs on into "version".
        let newline_at = if newline { len + 1 } else { len + 8 };
        let long = newline_at > 2048;
        prop_assert_eq!(whole.first() == Some(&quit), !get && long);
    }

    #[test]
    fn storage_requests_round_trip(k in key(), flags in any::<u32>(), exptime in -10i64..100_000,
                                   value in proptest::collection::vec(any::<u8>(), 0..300),
                                   cuts in proptest::collection::vec(any::<usize>(), 0..5)) {
        let mut data = format!("set {k} {flags} {exptime} {}\r\n", value.len()).into_bytes();
        data.extend_from_slice(&value);
        data.extend_from_slice(b"\r\nget ");
        data.extend_from_slice(k.as_bytes());
        data.extend_from_slice(b"\r\n");
        let chunks = split(&data, &cuts);
        let got = feed(&chunks, Limits::default());
        let expect_set = Request::Store {
            cmd: StoreCmd::Set, key: k.as_bytes(), flags, exptime, data: &value, cas: 0, noreply: false,
        };
        prop_assert_eq!(got.len(), 2);
        prop_assert_eq!(&got[0], &format!("{:?}", Decoded::Request(expect_set)));
        prop_assert!(got[1].starts_with("Request(Get"));
    }
}
