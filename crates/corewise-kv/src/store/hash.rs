//! A small multiplicative hash for keys.
//!
//! The store hashes every key twice (shard choice, then the shard's map);
//! SipHash's flood resistance costs more than the whole lookup here, and
//! shards bound the damage of a collision attack to one shard's map. This is
//! an FxHash-style word-at-a-time mix written for this crate.

use std::hash::{BuildHasher, Hasher};

const K: u64 = 0x517c_c1b7_2722_0a95;

/// Hashes a key to 64 bits.
///
/// ```
/// assert_eq!(corewise_kv::store::hash_key(b"a"), corewise_kv::store::hash_key(b"a"));
/// assert_ne!(corewise_kv::store::hash_key(b"a"), corewise_kv::store::hash_key(b"b"));
/// ```
pub fn hash_key(key: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(key);
    h.finish()
}

/// The hasher state.
///
/// ```
/// use corewise_kv::store::{hash_key, FxHasher};
/// use std::hash::Hasher;
/// let mut h = FxHasher::default();
/// h.write(b"key");
/// assert_eq!(h.finish(), hash_key(b"key"));
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct FxHasher(u64);

impl FxHasher {
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 56));
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        // A final avalanche so the high bits (shard choice) depend on all.
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x
    }
}

/// Builds [`FxHasher`]s for the shard maps.
///
/// ```
/// use corewise_kv::store::FxBuild;
/// use std::collections::HashMap;
/// let mut m: HashMap<Vec<u8>, u32, FxBuild> = HashMap::with_hasher(FxBuild);
/// m.insert(b"k".to_vec(), 1);
/// assert_eq!(m.get(&b"k"[..]), Some(&1));
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct FxBuild;

impl BuildHasher for FxBuild {
    type Hasher = FxHasher;
    fn build_hasher(&self) -> FxHasher {
        FxHasher::default()
    }
}
