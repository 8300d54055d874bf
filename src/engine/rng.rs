//! Seeded random-number streams.
//!
//! Every stochastic source (a client's inter-arrival jitter, a background exit
//! process) draws from its own stream, derived from the run seed and a stable
//! stream name. Adding a source therefore never perturbs the draws of another,
//! and the same scenario with the same seed gives the same numbers.

use rand_core::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

/// One independent random stream.
pub struct RngStream {
    rng: Pcg64Mcg,
}

/// SplitMix64 finaliser: spreads (seed, stream id) into well-mixed seeds.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a, to turn a stream name into a stable id.
fn name_id(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

impl RngStream {
    /// The stream called `name` of the run seeded with `seed`.
    pub fn new(seed: u64, name: &str) -> Self {
        let s = mix(seed ^ mix(name_id(name)));
        RngStream {
            rng: Pcg64Mcg::seed_from_u64(s),
        }
    }

    /// A uniform u64.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// A uniform f64 in [0, 1).
    #[inline]
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// An exponential variate with the given mean (inverse-CDF method).
    #[inline]
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.uniform()).ln()
    }

    /// Two independent standard normal variates (Box-Muller).
    #[inline]
    pub fn normal_pair(&mut self) -> (f64, f64) {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        let r = (-2.0 * u1.ln()).sqrt();
        let (sin, cos) = (std::f64::consts::TAU * u2).sin_cos();
        (r * cos, r * sin)
    }
}

/// Seeded variance of per-operation costs: each cost charged is the
/// calibrated mean times a lognormal factor of mean 1 and coefficient of
/// variation `cv`. At `cv = 0` it draws nothing and returns the cost as
/// given.
pub struct CostVariance {
    sigma: f64,
    rng: Option<RngStream>,
    /// The second normal of the last Box-Muller pair, not yet used.
    spare: Option<f64>,
}

impl CostVariance {
    /// No variance.
    pub fn off() -> Self {
        CostVariance {
            sigma: 0.0,
            rng: None,
            spare: None,
        }
    }

    /// Variance `cv` drawn from the stream `name` of the run seeded with
    /// `seed`.
    pub fn new(cv: f64, seed: u64, name: &str) -> Self {
        if cv <= 0.0 || !cv.is_finite() {
            return Self::off();
        }
        // Lognormal: CV^2 = exp(sigma^2) - 1.
        CostVariance {
            sigma: (1.0 + cv * cv).ln().sqrt(),
            rng: Some(RngStream::new(seed, name)),
            spare: None,
        }
    }

    /// Whether costs vary.
    pub fn is_on(&self) -> bool {
        self.rng.is_some()
    }

    /// One charge of a cost whose mean is `cost` (picoseconds).
    #[inline]
    pub fn vary(&mut self, cost: u64) -> u64 {
        match &mut self.rng {
            Some(r) if cost > 0 => {
                let z = match self.spare.take() {
                    Some(z) => z,
                    None => {
                        let (a, b) = r.normal_pair();
                        self.spare = Some(b);
                        a
                    }
                };
                let s = self.sigma;
                let f = (s * z - 0.5 * s * s).exp();
                ((cost as f64 * f).round() as u64).max(1)
            }
            _ => cost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_variance_returns_the_cost_exactly() {
        let mut v = CostVariance::new(0.0, 7, "costs");
        assert!(!v.is_on());
        for c in [0, 1, 1_300_000, 1_500_000] {
            assert_eq!(v.vary(c), c);
        }
    }

    #[test]
    fn variance_keeps_the_mean_and_has_the_stated_cv() {
        for cv in [0.1, 0.2] {
            let mut v = CostVariance::new(cv, 7, "costs");
            let n = 200_000;
            let xs: Vec<f64> = (0..n).map(|_| v.vary(1_000_000) as f64).collect();
            let mean = xs.iter().sum::<f64>() / n as f64;
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
            let got = var.sqrt() / mean;
            assert!((mean / 1e6 - 1.0).abs() < 0.003, "cv {cv}: mean {mean}");
            assert!(
                (got - cv).abs() < 0.01 * cv.max(0.1) * 2.0,
                "cv {cv}: {got}"
            );
        }
    }

    #[test]
    fn variance_streams_repeat_by_seed_and_differ_across_seeds() {
        let draw = |seed| {
            let mut v = CostVariance::new(0.1, seed, "costs");
            (0..8).map(|_| v.vary(1_000_000)).collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn same_seed_and_name_repeat() {
        let mut a = RngStream::new(7, "client");
        let mut b = RngStream::new(7, "client");
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn streams_differ_by_name_and_seed() {
        let x = RngStream::new(7, "client").next_u64();
        assert_ne!(x, RngStream::new(7, "background").next_u64());
        assert_ne!(x, RngStream::new(8, "client").next_u64());
    }

    #[test]
    fn exponential_mean_is_close() {
        let mut r = RngStream::new(1, "exp");
        let n = 200_000;
        let m: f64 = (0..n).map(|_| r.exponential(8.65)).sum::<f64>() / n as f64;
        assert!((m - 8.65).abs() < 0.1, "mean {m}");
        let u: f64 = (0..n).map(|_| r.uniform()).sum::<f64>() / n as f64;
        assert!((u - 0.5).abs() < 0.01);
    }
}
