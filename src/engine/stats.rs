//! Statistics: running summaries and HDR latency histograms.

use super::time::{Time, NS};
use hdrhistogram::Histogram;

/// Count, sum, min, max and sum of squares of a series of durations: what a
/// `perf kvm stat` row needs, without storing samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub count: u64,
    /// Sum of the samples.
    pub total: Time,
    /// Smallest sample (0 when empty).
    pub min: Time,
    /// Largest sample.
    pub max: Time,
    /// Sum of squares, in ns², for the standard deviation.
    sum_sq_ns: f64,
}

impl Summary {
    /// Adds one sample.
    #[inline]
    pub fn record(&mut self, t: Time) {
        if self.count == 0 || t < self.min {
            self.min = t;
        }
        self.max = self.max.max(t);
        self.count += 1;
        self.total += t;
        let ns = t as f64 / NS as f64;
        self.sum_sq_ns += ns * ns;
    }

    /// Mean sample (0 when empty).
    pub fn mean(&self) -> Time {
        self.total.checked_div(self.count).unwrap_or(0)
    }

    /// Mean sample in µs; NaN when empty (a mean over no samples is not
    /// 0: a report shows it as null).
    pub fn mean_us(&self) -> f64 {
        if self.count == 0 {
            return f64::NAN;
        }
        self.mean() as f64 / super::time::US as f64
    }

    /// Sample standard deviation in ns (0 with fewer than two samples).
    pub fn stddev_ns(&self) -> f64 {
        if self.count < 2 {
            return 0.0;
        }
        let n = self.count as f64;
        let mean = self.total as f64 / NS as f64 / n;
        ((self.sum_sq_ns - n * mean * mean) / (n - 1.0))
            .max(0.0)
            .sqrt()
    }

    /// Merges another summary into this one.
    pub fn merge(&mut self, o: &Summary) {
        if o.count == 0 {
            return;
        }
        if self.count == 0 || o.min < self.min {
            self.min = o.min;
        }
        self.max = self.max.max(o.max);
        self.count += o.count;
        self.total += o.total;
        self.sum_sq_ns += o.sum_sq_ns;
    }
}

/// A latency histogram (HDR, 3 significant digits, nanosecond resolution,
/// 1 ns .. 100 s) that also keeps an exact mean.
pub struct LatencyHistogram {
    h: Histogram<u64>,
    sum: Summary,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram. Allocates once, here; `record` never allocates.
    pub fn new() -> Self {
        LatencyHistogram {
            h: Histogram::new_with_bounds(1, 100_000_000_000, 3)
                .expect("static HDR bounds are valid"),
            sum: Summary::default(),
        }
    }

    /// Records one latency (clamped into the histogram's range).
    #[inline]
    pub fn record(&mut self, t: Time) {
        let ns = (t / NS).clamp(1, 100_000_000_000);
        self.h.saturating_record(ns);
        self.sum.record(t);
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.sum.count
    }

    /// Exact mean.
    pub fn mean(&self) -> Time {
        self.sum.mean()
    }

    /// Largest sample.
    pub fn max(&self) -> Time {
        self.sum.max
    }

    /// Exact mean in µs; NaN when empty (see [`Summary::mean_us`]).
    pub fn mean_us(&self) -> f64 {
        self.sum.mean_us()
    }

    /// Value at percentile `p` in units of `unit` picoseconds; NaN when
    /// empty (a percentile of no samples is not 0).
    pub fn percentile_in(&self, p: f64, unit: Time) -> f64 {
        if self.sum.count == 0 {
            return f64::NAN;
        }
        self.percentile(p) as f64 / unit as f64
    }

    /// Adds every sample of `o` (the distribution of both, as if each
    /// sample had been recorded here).
    pub fn merge(&mut self, o: &LatencyHistogram) {
        // Same bounds and precision on both sides: `add` cannot fail.
        let _ = self.h.add(&o.h);
        self.sum.merge(&o.sum);
    }

    /// Value at percentile `p` (0..=100), to HDR precision.
    pub fn percentile(&self, p: f64) -> Time {
        if self.sum.count == 0 {
            return 0;
        }
        self.h.value_at_quantile(p / 100.0) * NS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::time::US;

    #[test]
    fn no_samples_give_nan_not_zero() {
        let h = LatencyHistogram::new();
        assert!(h.mean_us().is_nan());
        assert!(h.percentile_in(99.0, US).is_nan());
        assert!(Summary::default().mean_us().is_nan());
        let mut h = LatencyHistogram::new();
        h.record(3 * US);
        assert_eq!(h.mean_us(), 3.0);
    }

    #[test]
    fn summary_tracks_extremes_and_stddev() {
        let mut s = Summary::default();
        for v in [
            2 * US,
            4 * US,
            4 * US,
            4 * US,
            5 * US,
            5 * US,
            7 * US,
            9 * US,
        ] {
            s.record(v);
        }
        assert_eq!(s.count, 8);
        assert_eq!(s.min, 2 * US);
        assert_eq!(s.max, 9 * US);
        assert_eq!(s.mean(), 5 * US);
        // sample stddev of 2,4,4,4,5,5,7,9 is sqrt(32/7) µs
        assert!((s.stddev_ns() - (32.0f64 / 7.0).sqrt() * 1000.0).abs() < 1e-6);
        let mut t = Summary::default();
        t.record(US);
        s.merge(&t);
        assert_eq!(s.min, US);
        assert_eq!(s.count, 9);
    }

    #[test]
    fn histogram_percentiles() {
        let mut h = LatencyHistogram::new();
        for i in 1..=1000u64 {
            h.record(i * US);
        }
        assert_eq!(h.count(), 1000);
        let p99 = h.percentile(99.0);
        assert!((989 * US..=991 * US).contains(&p99), "{p99}");
        assert_eq!(h.mean(), 500 * US + US / 2);
        assert_eq!(h.max(), 1000 * US);
    }

    #[test]
    fn merged_histograms_give_percentiles_over_all_samples() {
        let (mut a, mut b) = (LatencyHistogram::new(), LatencyHistogram::new());
        for i in 1..=90 {
            a.record(i * US);
        }
        for _ in 0..10 {
            b.record(1_000 * US);
        }
        // A mean of the two p95s would be ~547 us; over all 100 samples
        // p95 is one of b's.
        a.merge(&b);
        assert_eq!(a.count(), 100);
        let p95 = a.percentile(95.0);
        assert!((999 * US..=1_001 * US).contains(&p95), "{p95}");
        assert_eq!(a.max(), 1_000 * US);
    }
}
