//! What the load generator asks for: keys, value sizes and the get/set mix.
//!
//! Two workloads. `memtier` follows memtier_benchmark's defaults: keys
//! `memtier-<n>` drawn uniformly from the key range, 32-byte values, one
//! set per ten gets. `etc` imitates Facebook's ETC pool as measured by
//! Atikoglu et al. (SIGMETRICS 2012): key sizes from their generalized
//! extreme value fit (mostly 20–45 bytes), value sizes from their
//! generalized Pareto fit (mostly a few hundred bytes, a long tail),
//! Zipf-skewed key popularity, and about 3 % sets. Key sizes and value
//! sizes are fixed per key, so a get finds what the preload stored.

/// A small, fast PRNG (xorshift64*), seeded explicitly so that both servers
/// see the same request sequence.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (0 is replaced).
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n.max(1))) >> 64) as u64
    }

    /// Exponentially distributed with mean `mean`.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

/// Which workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// memtier_benchmark defaults: uniform keys, 32-byte values, 1:10.
    Memtier,
    /// Facebook ETC-like: small keys, mostly small values with a long
    /// tail, Zipf popularity, ~3 % sets.
    Etc,
}

/// One request to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `get <key>`.
    Get(u32),
    /// `set <key> 0 0 <size>`.
    Set(u32),
}

/// A workload: key names, value sizes, popularity and mix.
#[derive(Debug, Clone)]
pub struct Workload {
    keys: Vec<Vec<u8>>,
    sizes: Vec<u32>,
    /// Cumulative popularity (empty: uniform).
    cdf: Vec<f64>,
    set_ratio: f64,
}

/// Generalized extreme value quantile.
fn gev(mu: f64, sigma: f64, k: f64, u: f64) -> f64 {
    let u = u.clamp(1e-12, 1.0 - 1e-12);
    mu + sigma * ((-u.ln()).powf(-k) - 1.0) / k
}

/// Generalized Pareto quantile (location 0).
fn gpd(sigma: f64, k: f64, u: f64) -> f64 {
    let u = u.clamp(0.0, 1.0 - 1e-12);
    sigma * ((1.0 - u).powf(-k) - 1.0) / k
}

impl Workload {
    /// `n` keys of the given kind, with a fixed seed.
    pub fn new(kind: Kind, n: usize, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let n = n.max(1);
        match kind {
            Kind::Memtier => Workload {
                keys: (0..n)
                    .map(|i| format!("memtier-{i}").into_bytes())
                    .collect(),
                sizes: vec![32; n],
                cdf: Vec::new(),
                set_ratio: 1.0 / 11.0,
            },
            Kind::Etc => {
                let mut keys = Vec::with_capacity(n);
                let mut sizes = Vec::with_capacity(n);
                for i in 0..n {
                    let len = gev(30.7984, 8.20449, 0.078688, rng.unit())
                        .round()
                        .clamp(12.0, 250.0) as usize;
                    let mut k = format!("etc:{i}:").into_bytes();
                    while k.len() < len {
                        k.push(b'a' + (rng.below(26) as u8));
                    }
                    keys.push(k);
                    let v = gpd(214.476, 0.348238, rng.unit())
                        .round()
                        .clamp(1.0, 100_000.0);
                    sizes.push(v as u32);
                }
                // Zipf popularity, exponent 1 (rank 1 most popular); ranks
                // are shuffled over key ids by the key id order itself.
                let mut cdf = Vec::with_capacity(n);
                let mut acc = 0.0;
                for r in 1..=n {
                    acc += 1.0 / r as f64;
                    cdf.push(acc);
                }
                for c in &mut cdf {
                    *c /= acc;
                }
                Workload {
                    keys,
                    sizes,
                    cdf,
                    set_ratio: 0.03,
                }
            }
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// The key with this id.
    pub fn key(&self, id: u32) -> &[u8] {
        &self.keys[id as usize % self.keys.len()]
    }

    /// The value size of this key.
    pub fn size(&self, id: u32) -> usize {
        self.sizes[id as usize % self.sizes.len()] as usize
    }

    /// Makes every value `size` bytes (keys, popularity and mix stay).
    pub fn fix_size(&mut self, size: u32) {
        self.sizes.iter_mut().for_each(|s| *s = size);
    }

    /// Mean value size.
    pub fn mean_size(&self) -> f64 {
        self.sizes.iter().map(|&s| f64::from(s)).sum::<f64>() / self.sizes.len() as f64
    }

    /// Draws the next request.
    pub fn next(&self, rng: &mut Rng) -> Op {
        let id = if self.cdf.is_empty() {
            rng.below(self.keys.len() as u64) as u32
        } else {
            let u = rng.unit();
            self.cdf
                .partition_point(|&c| c < u)
                .min(self.keys.len() - 1) as u32
        };
        if rng.unit() < self.set_ratio {
            Op::Set(id)
        } else {
            Op::Get(id)
        }
    }

    /// Appends the wire form of `op` to `out`; `fill` provides value bytes
    /// (at least the largest value size).
    pub fn encode(&self, op: Op, fill: &[u8], out: &mut Vec<u8>) {
        match op {
            Op::Get(id) => {
                out.extend_from_slice(b"get ");
                out.extend_from_slice(self.key(id));
                out.extend_from_slice(b"\r\n");
            }
            Op::Set(id) => {
                let n = self.size(id).min(fill.len());
                out.extend_from_slice(b"set ");
                out.extend_from_slice(self.key(id));
                out.extend_from_slice(format!(" 0 0 {n}\r\n").as_bytes());
                out.extend_from_slice(&fill[..n]);
                out.extend_from_slice(b"\r\n");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etc_shape() {
        let w = Workload::new(Kind::Etc, 20_000, 7);
        let mut rng = Rng::new(1);
        let sets = (0..100_000)
            .filter(|_| matches!(w.next(&mut rng), Op::Set(_)))
            .count();
        assert!((2000..4000).contains(&sets), "{sets} sets");
        let mut sizes: Vec<usize> = (0..w.len() as u32).map(|i| w.size(i)).collect();
        sizes.sort_unstable();
        let median = sizes[sizes.len() / 2];
        assert!(median < 500, "median {median}");
        assert!(*sizes.last().unwrap() > 5_000, "no long tail");
        let key_median = {
            let mut k: Vec<usize> = (0..w.len() as u32).map(|i| w.key(i).len()).collect();
            k.sort_unstable();
            k[k.len() / 2]
        };
        assert!((20..50).contains(&key_median));
    }

    #[test]
    fn fixed_size() {
        let mut w = Workload::new(Kind::Memtier, 10, 1);
        w.fix_size(204_800);
        assert!((0..10).all(|i| w.size(i) == 204_800));
        let fill = vec![b'x'; 204_800];
        let mut out = Vec::new();
        w.encode(Op::Set(2), &fill, &mut out);
        assert!(out.starts_with(b"set memtier-2 0 0 204800\r\n"));
        assert_eq!(
            out.len(),
            "set memtier-2 0 0 204800\r\n".len() + 204_800 + 2
        );
    }

    #[test]
    fn encode_forms() {
        let w = Workload::new(Kind::Memtier, 10, 1);
        let mut out = Vec::new();
        w.encode(Op::Set(3), &[b'x'; 64], &mut out);
        w.encode(Op::Get(3), &[], &mut out);
        let expect = format!(
            "set memtier-3 0 0 32\r\n{}\r\nget memtier-3\r\n",
            "x".repeat(32)
        );
        assert_eq!(out, expect.as_bytes());
    }
}
