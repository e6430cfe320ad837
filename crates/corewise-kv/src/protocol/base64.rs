//! Standard base64 (RFC 4648, with padding) for meta commands' `b` flag,
//! which lets clients use binary keys.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn value(c: u8) -> Option<u32> {
    match c {
        b'A'..=b'Z' => Some(u32::from(c - b'A')),
        b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
        b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// Decodes `src` (padded) into `out`; `None` if it is not valid base64.
///
/// ```
/// let mut out = Vec::new();
/// assert!(corewise_kv::protocol::decode_base64(b"Zm9vYg==", &mut out).is_some());
/// assert_eq!(out, b"foob");
/// assert!(corewise_kv::protocol::decode_base64(b"Zm9", &mut out).is_none());
/// ```
pub fn decode_base64(src: &[u8], out: &mut Vec<u8>) -> Option<()> {
    out.clear();
    if src.len() % 4 != 0 {
        return None;
    }
    let chunks = src.len() / 4;
    for (n, c) in src.chunks_exact(4).enumerate() {
        let last = n + 1 == chunks;
        let pad = match (c[2], c[3]) {
            (b'=', b'=') if last => 2,
            (_, b'=') if last => 1,
            _ => 0,
        };
        let mut acc = 0u32;
        for (i, &b) in c.iter().enumerate() {
            let v = if i >= 4 - pad { 0 } else { value(b)? };
            acc = (acc << 6) | v;
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..4 - pad]);
    }
    Some(())
}

/// Appends the base64 encoding of `src` to `out`.
///
/// ```
/// let mut out = Vec::new();
/// corewise_kv::protocol::encode_base64(b"foob", &mut out);
/// assert_eq!(out, b"Zm9vYg==");
/// ```
pub fn encode_base64(src: &[u8], out: &mut Vec<u8>) {
    for c in src.chunks(3) {
        let b = [c[0], *c.get(1).unwrap_or(&0), *c.get(2).unwrap_or(&0)];
        let acc = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= c.len() {
                out.push(ALPHABET[((acc >> (18 - 6 * i)) & 63) as usize]);
            } else {
                out.push(b'=');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut enc = Vec::new();
            encode_base64(&data, &mut enc);
            let mut dec = Vec::new();
            prop_assert!(decode_base64(&enc, &mut dec).is_some());
            prop_assert_eq!(dec, data);
        }
    }
}
