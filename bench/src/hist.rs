//! Latency histogram: log-linear buckets with about 3 % precision.
//!
//! Owns: recording values (microseconds), merging histograms from several
//! worker processes, percentiles, and a sparse serialised form small enough to
//! travel on a worker's stdout as one JSON line. Values below 64 are exact;
//! above, each power of two is split into 32 buckets. The exact maximum is
//! kept beside the buckets.

use serde::{Deserialize, Serialize};

/// Sub-buckets per power of two (2^SUB_BITS).
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Values below this are stored exactly.
const LINEAR: u64 = 2 * SUB;
/// Enough buckets for every u64.
const BUCKETS: usize = (LINEAR + (64 - (SUB_BITS as u64 + 1)) * SUB) as usize;

/// A histogram of non-negative integer values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
    sum: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            max: 0,
            sum: 0,
        }
    }
}

fn index(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let e = 63 - v.leading_zeros() as u64; // >= SUB_BITS + 1
    let m = v >> (e - SUB_BITS as u64); // in [SUB, 2*SUB)
    (LINEAR + (e - (SUB_BITS as u64 + 1)) * SUB + (m - SUB)) as usize
}

/// The largest value that falls into bucket `i`.
fn upper(i: usize) -> u64 {
    let i = i as u64;
    if i < LINEAR {
        return i;
    }
    let e = (i - LINEAR) / SUB + SUB_BITS as u64 + 1;
    let m = (i - LINEAR) % SUB + SUB;
    let shift = e - SUB_BITS as u64;
    ((m + 1) << shift).wrapping_sub(1)
}

/// Sparse form: `[[bucket, count], …]` plus exact max and sum.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SparseHistogram {
    pub buckets: Vec<[u64; 2]>,
    pub max: u64,
    pub sum: u64,
}

impl Histogram {
    pub fn record(&mut self, v: u64) {
        self.counts[index(v)] += 1;
        self.total += 1;
        self.max = self.max.max(v);
        self.sum = self.sum.saturating_add(v);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn mean(&self) -> Option<f64> {
        (self.total > 0).then(|| self.sum as f64 / self.total as f64)
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
        self.sum = self.sum.saturating_add(other.sum);
    }

    /// The value at percentile `p` (0–100): the upper bound of the bucket that
    /// holds the ⌈p/100 · n⌉-th smallest value, capped at the exact maximum.
    /// `None` when empty.
    pub fn percentile(&self, p: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((p.clamp(0.0, 100.0) / 100.0) * self.total as f64)
            .ceil()
            .max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(upper(i).min(self.max));
            }
        }
        Some(self.max)
    }

    pub fn to_sparse(&self) -> SparseHistogram {
        SparseHistogram {
            buckets: self
                .counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(i, c)| [i as u64, *c])
                .collect(),
            max: self.max,
            sum: self.sum,
        }
    }

    pub fn from_sparse(s: &SparseHistogram) -> Histogram {
        let mut h = Histogram::default();
        for [i, c] in &s.buckets {
            if let Some(slot) = h.counts.get_mut(*i as usize) {
                *slot += c;
                h.total += c;
            }
        }
        h.max = s.max;
        h.sum = s.sum;
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_cover_u64() {
        let mut last = 0;
        for v in (0..100_000u64).chain([u64::MAX / 3, u64::MAX - 1, u64::MAX]) {
            let i = index(v);
            assert!(i < BUCKETS, "{v}");
            assert!(i >= last, "{v}");
            assert!(upper(i) >= v, "{v}: upper {}", upper(i));
            last = i;
        }
        assert_eq!(upper(index(u64::MAX)), u64::MAX);
    }

    #[test]
    fn precision_is_about_three_percent() {
        for v in [100u64, 1_000, 12_345, 1_000_000, 987_654_321] {
            let u = upper(index(v));
            assert!((u - v) as f64 / v as f64 <= 1.0 / 32.0 + 1e-9, "{v} -> {u}");
        }
    }

    #[test]
    fn percentiles_of_one_to_hundred() {
        let mut h = Histogram::default();
        assert_eq!(h.percentile(50.0), None);
        for v in 1..=100 {
            h.record(v);
        }
        // Values below 64 are exact.
        assert_eq!(h.percentile(50.0), Some(50));
        assert_eq!(h.percentile(1.0), Some(1));
        assert_eq!(h.percentile(0.0), Some(1));
        // 99 sits in the bucket [98, 99].
        assert_eq!(h.percentile(99.0), Some(99));
        assert_eq!(h.percentile(100.0), Some(100));
        assert_eq!(h.max(), 100);
        assert_eq!(h.mean(), Some(50.5));
    }

    #[test]
    fn percentile_is_capped_at_max() {
        let mut h = Histogram::default();
        h.record(1_000_001);
        assert_eq!(h.percentile(50.0), Some(1_000_001));
        assert_eq!(h.percentile(99.9), Some(1_000_001));
    }

    #[test]
    fn skewed_distribution() {
        let mut h = Histogram::default();
        for _ in 0..990 {
            h.record(10);
        }
        for _ in 0..10 {
            h.record(5_000);
        }
        assert_eq!(h.percentile(50.0), Some(10));
        assert_eq!(h.percentile(99.0), Some(10));
        let p = h.percentile(99.5).unwrap();
        assert!((5_000..=5_000 + 5_000 / 32).contains(&p), "{p}");
    }

    #[test]
    fn merge_and_sparse_roundtrip() {
        let mut a = Histogram::default();
        let mut b = Histogram::default();
        for v in 0..500 {
            a.record(v * 7);
            b.record(v * 13 + 1);
        }
        let back = Histogram::from_sparse(
            &serde_json::from_str(&serde_json::to_string(&a.to_sparse()).unwrap()).unwrap(),
        );
        assert_eq!(back, a);
        let mut m = a.clone();
        m.merge(&b);
        assert_eq!(m.count(), 1000);
        assert_eq!(m.max(), 499 * 13 + 1);
    }
}
