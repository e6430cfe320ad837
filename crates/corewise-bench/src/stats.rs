//! Medians and percentiles of sample sets.

/// Summary of one sample set, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Median (50th percentile).
    pub median: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// The `p`-th percentile (0..=100) of `sorted` by the nearest-rank method;
/// `None` for an empty slice or a `p` outside 0..=100.
pub fn percentile_sorted<T: Copy + Into<f64>>(sorted: &[T], p: f64) -> Option<f64> {
    if sorted.is_empty() || !(0.0..=100.0).contains(&p) {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    let idx = rank.clamp(1, sorted.len()) - 1;
    sorted.get(idx).map(|&v| v.into())
}

/// Median of `sorted`: the mean of the two middle values for an even count.
pub fn median_sorted(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    if n % 2 == 1 {
        Some(sorted[n / 2])
    } else {
        Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0)
    }
}

impl Summary {
    /// Summarises `samples` (NaNs are dropped); `None` when nothing is left.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
        v.sort_by(f64::total_cmp);
        Some(Summary {
            count: v.len(),
            median: median_sorted(&v)?,
            p99: percentile_sorted(&v, 99.0)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_empty() {
        assert_eq!(median_sorted(&[]), None);
        assert_eq!(median_sorted(&[1.0, 2.0, 9.0]), Some(2.0));
        assert_eq!(median_sorted(&[1.0, 2.0, 4.0, 9.0]), Some(3.0));
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile_sorted(&v, 99.0), Some(99.0));
        assert_eq!(percentile_sorted(&v, 100.0), Some(100.0));
        assert_eq!(percentile_sorted(&v, 0.0), Some(1.0));
        assert_eq!(percentile_sorted(&v, 50.0), Some(50.0));
        assert_eq!(percentile_sorted(&v, 101.0), None);
        let w: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(percentile_sorted(&w, 99.0), Some(990.0));
    }

    #[test]
    fn summary_ignores_order_and_nan() {
        let s = Summary::of(&[5.0, f64::NAN, 1.0, 3.0]).expect("summary");
        assert_eq!(s.count, 3);
        assert_eq!(s.median, 3.0);
        assert_eq!(s.p99, 5.0);
        assert_eq!(Summary::of(&[f64::NAN]), None);
    }
}
