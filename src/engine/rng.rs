//! Seeded random-number streams.
//!
//! Every stochastic source (a client's inter-arrival jitter, a background exit
//! process) draws from its own stream, derived from the run seed and a stable
//! stream name. Adding a source therefore never perturbs the draws of another,
//! and the same scenario with the same seed gives the same numbers.

use rand_core::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::sync::Arc;

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
}

/// Seeded variance of per-operation costs: each cost charged is the
/// calibrated mean times a factor of mean 1 and coefficient of variation
/// `cv`, drawn from a lognormal. At `cv = 0` it draws nothing and returns
/// the cost as given.
///
/// The factor is read from a table of the lognormal's quantiles at
/// [`CostVariance::STRATA`] equally likely strata, indexed by ten bits of
/// a random draw (one 64-bit draw serves six charges). A charge is then a
/// shift, a load and an integer multiply: no logarithm, root, sine or
/// exponential per charge, which made the variance cost ~10% of a
/// guest-heavy run's instructions (docs/performance.md).
pub struct CostVariance {
    /// The factors, in units of 2^-[`FACTOR_SHIFT`], shared by every VM
    /// of a run (one table per CV, not per VM), and the stream that draws
    /// them; None when off.
    on: Option<(Arc<FactorTable>, RngStream)>,
    /// Random bits not yet used, and how many indices they still hold.
    bits: u64,
    left: u32,
}

/// The factor's table: [`CostVariance::STRATA`] factors, lowest first. A
/// fixed-size array, so that indexing it with a masked draw needs no
/// bounds check.
pub type FactorTable = [u32; CostVariance::STRATA];

/// Fixed-point scale of the table's factors.
const FACTOR_SHIFT: u32 = 24;
/// Bits of a draw that index the table.
const INDEX_BITS: u32 = 10;

impl CostVariance {
    /// Equally likely strata in the factor's table.
    pub const STRATA: usize = 1 << INDEX_BITS;

    /// No variance.
    pub fn off() -> Self {
        CostVariance {
            on: None,
            bits: 0,
            left: 0,
        }
    }

    /// Variance `cv` drawn from the stream `name` of the run seeded with
    /// `seed`.
    pub fn new(cv: f64, seed: u64, name: &str) -> Self {
        Self::with_table(Self::table(cv), seed, name)
    }

    /// The factor table of variance `cv`, to share among the VMs of a run
    /// with [`Self::with_table`]; None for no variance.
    pub fn table(cv: f64) -> Option<Arc<FactorTable>> {
        if cv <= 0.0 || !cv.is_finite() {
            return None;
        }
        Some(Arc::new(factor_table(cv)))
    }

    /// Variance by the factors of `table` (from [`Self::table`]; None is
    /// off), drawn from the stream `name` of the run seeded with `seed`.
    pub fn with_table(table: Option<Arc<FactorTable>>, seed: u64, name: &str) -> Self {
        CostVariance {
            on: table.map(|t| (t, RngStream::new(seed, name))),
            bits: 0,
            left: 0,
        }
    }

    /// Whether costs vary.
    pub fn is_on(&self) -> bool {
        self.on.is_some()
    }

    /// One charge of a cost whose mean is `cost` (picoseconds).
    #[inline]
    pub fn vary(&mut self, cost: u64) -> u64 {
        match &mut self.on {
            Some((table, r)) if cost > 0 => {
                if self.left == 0 {
                    self.bits = r.next_u64();
                    self.left = 64 / INDEX_BITS;
                }
                let i = (self.bits & (Self::STRATA as u64 - 1)) as usize;
                self.bits >>= INDEX_BITS;
                self.left -= 1;
                let f = table[i] as u128;
                let half = 1u128 << (FACTOR_SHIFT - 1);
                (((cost as u128 * f + half) >> FACTOR_SHIFT) as u64).max(1)
            }
            _ => cost,
        }
    }
}

/// The lognormal factor's quantiles at the mid-points of
/// [`CostVariance::STRATA`] equally likely strata, then stretched about 1
/// so that the table's own mean is 1 and its own CV is `cv` exactly (the
/// mid-points cut the tails, which alone would understate the CV by ~1%).
fn factor_table(cv: f64) -> FactorTable {
    let n = CostVariance::STRATA;
    // Lognormal: CV^2 = exp(sigma^2) - 1.
    let sigma = (1.0 + cv * cv).ln().sqrt();
    let raw: Vec<f64> = (0..n)
        .map(|i| (sigma * normal_quantile((i as f64 + 0.5) / n as f64)).exp())
        .collect();
    let mean = raw.iter().sum::<f64>() / n as f64;
    let sd = (raw.iter().map(|x| (x / mean - 1.0).powi(2)).sum::<f64>() / n as f64).sqrt();
    let stretch = cv / sd;
    let mut table = [0u32; CostVariance::STRATA];
    for (t, x) in table.iter_mut().zip(&raw) {
        let f = (1.0 + (x / mean - 1.0) * stretch).max(0.0);
        *t = (f * (1u64 << FACTOR_SHIFT) as f64).round() as u32;
    }
    table
}

/// The standard normal's quantile function (inverse CDF), by P. J.
/// Acklam's rational approximations (relative error below 1.2e-9): a
/// central rational function of q = p - 1/2 for 0.02425 <= p <= 0.97575,
/// and one of sqrt(-2 ln p) in each tail.
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    const LOW: f64 = 0.02425;
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < LOW {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - LOW {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
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
    fn normal_quantile_matches_known_values() {
        // Phi^-1 at p, from standard tables.
        for (p, z) in [
            (0.5, 0.0),
            (0.975, 1.959_963_984_540_054),
            (0.841_344_746_068_542_9, 1.0),
            (0.01, -2.326_347_874_040_841),
            (0.001, -3.090_232_306_167_813),
            (0.999, 3.090_232_306_167_813),
        ] {
            let got = normal_quantile(p);
            assert!((got - z).abs() < 1e-8, "p {p}: {got} vs {z}");
        }
    }

    #[test]
    fn factor_table_has_mean_one_and_the_stated_cv() {
        for cv in [0.05, 0.1, 0.3, 1.0] {
            let t: Vec<f64> = factor_table(cv)
                .iter()
                .map(|&f| f as f64 / (1u64 << FACTOR_SHIFT) as f64)
                .collect();
            assert_eq!(t.len(), CostVariance::STRATA);
            assert!(t.windows(2).all(|w| w[0] <= w[1]), "cv {cv}: not sorted");
            assert!(t[0] > 0.0, "cv {cv}: a factor of 0");
            let mean = t.iter().sum::<f64>() / t.len() as f64;
            let sd = (t.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / t.len() as f64).sqrt();
            assert!((mean - 1.0).abs() < 1e-6, "cv {cv}: mean {mean}");
            assert!((sd - cv).abs() < 1e-5, "cv {cv}: sd {sd}");
            // Right-skewed like the lognormal: the median is below the mean.
            assert!(t[t.len() / 2] < 1.0, "cv {cv}");
        }
    }

    #[test]
    fn every_stratum_is_drawn_about_equally_often() {
        let mut v = CostVariance::new(0.1, 3, "costs");
        let table = *v.on.as_ref().expect("on").0;
        let mut seen = vec![0u32; CostVariance::STRATA];
        let cost = 1u64 << 20;
        for _ in 0..CostVariance::STRATA * 200 {
            let c = v.vary(cost);
            // The first stratum whose charge reaches `c`, by vary's rounding.
            let charge =
                |f: u32| (cost as u128 * f as u128 + (1 << (FACTOR_SHIFT - 1))) >> FACTOR_SHIFT;
            let f = table.partition_point(|&f| charge(f) < c as u128);
            seen[f] += 1;
        }
        // Neighbouring factors can round to the same charge; compare
        // the two halves and the extremes instead of every stratum.
        let low: u32 = seen[..CostVariance::STRATA / 2].iter().sum();
        let n = (CostVariance::STRATA * 200) as f64;
        assert!((low as f64 / n - 0.5).abs() < 0.01, "low half {low}");
        assert!(seen[0] > 0, "the lowest stratum was never drawn");
    }

    #[test]
    fn a_shared_table_draws_as_a_table_of_ones_own() {
        let table = CostVariance::table(0.2);
        let mut a = CostVariance::new(0.2, 5, "vm0");
        let mut b = CostVariance::with_table(table.clone(), 5, "vm0");
        let mut c = CostVariance::with_table(table, 5, "vm1");
        let (mut ac, mut same_as_other) = (0, 0);
        for i in 1..2_000u64 {
            let x = a.vary(i * 1_000);
            assert_eq!(x, b.vary(i * 1_000));
            ac += u64::from(x != i * 1_000);
            same_as_other += u64::from(x == c.vary(i * 1_000));
        }
        assert!(ac > 1_900, "the costs vary: {ac}");
        assert!(
            same_as_other < 100,
            "each VM its own stream: {same_as_other}"
        );
        assert!(CostVariance::table(0.0).is_none());
        assert!(!CostVariance::with_table(None, 5, "vm0").is_on());
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
