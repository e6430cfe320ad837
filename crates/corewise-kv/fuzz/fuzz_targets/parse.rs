//! Arbitrary bytes through the decoder and the executor: neither may panic,
//! the decoder must always make progress or ask for more, and replaying the
//! same bytes split at an arbitrary point must give the same replies.
#![no_main]

use corewise_kv::config::Config;
use corewise_kv::exec::{execute, write_error, Flow, Shared};
use corewise_kv::protocol::{Decoded, Decoder, Limits};
use libfuzzer_sys::fuzz_target;

fn run(shared: &Shared, chunks: &[&[u8]]) -> Vec<u8> {
    let mut dec = Decoder::new(Limits { item_max: 4096, ..Limits::default() });
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    let mut scratch = Vec::new();
    'outer: for c in chunks {
        buf.extend_from_slice(c);
        let mut pos = 0;
        loop {
            let (used, d) = dec.decode(&buf[pos..]);
            assert!(used <= buf.len() - pos);
            pos += used;
            match d {
                Decoded::Incomplete => break,
                Decoded::Request(r) => {
                    if execute(shared, &r, &mut out, &mut scratch) == Flow::Close {
                        break 'outer;
                    }
                }
                Decoded::Error(e) => write_error(e, &mut out),
            }
            assert!(used > 0, "a request or an error must consume input");
        }
        buf.drain(..pos);
    }
    out
}

fn shared() -> Shared {
    Shared::new(Config {
        memory_mb: 1,
        item_max: 4096,
        ..Config::default()
    })
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let whole = run(&shared(), &[data]);
    let cut = data[0] as usize % data.len();
    let split = run(&shared(), &[&data[..cut], &data[cut..]]);
    // Replies that carry times or CAS values can differ between runs only
    // through `stats` and the clock; compare when neither is involved.
    if !data.windows(5).any(|w| w == b"stats") && !data.windows(2).any(|w| w == b"me") {
        assert_eq!(whole, split);
    }
});
