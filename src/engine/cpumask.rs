//! Fixed-size sets of CPUs (a host's cores, one guest's vCPUs), wide
//! enough for the largest host a scenario may describe. Fixed-size and
//! `Copy`, so masks can be combined on the event loop's hot path without
//! allocating.

/// A set of CPU indices below `64 * W`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BitMask<const W: usize>([u64; W]);

/// A set of host cores: up to [`CPUMASK_BITS`], the most a machine may
/// have.
pub type CpuMask = BitMask<8>;

/// Cores a [`CpuMask`] can name (indices `0..CPUMASK_BITS`).
pub const CPUMASK_BITS: usize = 512;

/// A set of one guest's vCPUs: up to [`VCPUMASK_BITS`], the most vCPUs a
/// VM may have. Half a [`CpuMask`]: a guest CPU keeps several.
pub type VcpuMask = BitMask<4>;

/// vCPUs a [`VcpuMask`] can name.
pub const VCPUMASK_BITS: usize = 256;

impl<const W: usize> Default for BitMask<W> {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl<const W: usize> BitMask<W> {
    /// No CPU.
    pub const EMPTY: Self = BitMask([0; W]);

    /// Indices a mask can hold.
    pub const BITS: usize = 64 * W;

    /// CPUs `0..n` (all of them past [`Self::BITS`]).
    pub fn first_n(n: usize) -> Self {
        let mut m = Self::EMPTY;
        for (w, word) in m.0.iter_mut().enumerate() {
            let lo = w * 64;
            *word = match n.saturating_sub(lo) {
                0 => 0,
                k if k >= 64 => u64::MAX,
                k => (1u64 << k) - 1,
            };
        }
        m
    }

    /// CPUs 0..64 as the bits of `b` (bit i = CPU i).
    pub fn from_bits(b: u64) -> Self {
        let mut m = Self::EMPTY;
        m.0[0] = b;
        m
    }

    /// Just CPU `c`.
    pub fn single(c: usize) -> Self {
        let mut m = Self::EMPTY;
        m.insert(c);
        m
    }

    /// The CPUs of `it`.
    pub fn of(it: impl IntoIterator<Item = usize>) -> Self {
        let mut m = Self::EMPTY;
        it.into_iter().for_each(|c| m.insert(c));
        m
    }

    /// Adds `c`. Panics past [`Self::BITS`]: scenario validation keeps
    /// every index below it.
    #[inline]
    pub fn insert(&mut self, c: usize) {
        self.0[c / 64] |= 1 << (c % 64);
    }

    /// Removes `c`.
    #[inline]
    pub fn remove(&mut self, c: usize) {
        if c < Self::BITS {
            self.0[c / 64] &= !(1 << (c % 64));
        }
    }

    /// Whether `c` is in the set.
    #[inline]
    pub fn contains(&self, c: usize) -> bool {
        c < Self::BITS && self.0[c / 64] & (1 << (c % 64)) != 0
    }

    /// No CPU in the set.
    #[inline]
    pub fn is_empty(&self) -> bool {
        // One OR chain, no early exit: a guest tests empty masks on every
        // step.
        self.0.iter().fold(0, |a, &w| a | w) == 0
    }

    /// How many CPUs.
    pub fn count(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The lowest CPU in the set.
    #[inline]
    pub fn first(&self) -> Option<usize> {
        self.0
            .iter()
            .enumerate()
            .find(|(_, &w)| w != 0)
            .map(|(i, &w)| i * 64 + w.trailing_zeros() as usize)
    }

    /// Removes and returns the lowest CPU.
    #[inline]
    pub fn pop_first(&mut self) -> Option<usize> {
        if self.is_empty() {
            return None;
        }
        let c = self.first()?;
        self.0[c / 64] &= self.0[c / 64] - 1;
        Some(c)
    }

    /// The CPUs in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                (w != 0).then(|| {
                    let b = w.trailing_zeros() as usize;
                    w &= w - 1;
                    i * 64 + b
                })
            })
        })
    }

    /// The CPUs in either set.
    #[inline]
    pub fn union(mut self, o: Self) -> Self {
        self.0.iter_mut().zip(o.0).for_each(|(a, b)| *a |= b);
        self
    }

    /// The CPUs in both sets.
    #[inline]
    pub fn intersection(mut self, o: Self) -> Self {
        self.0.iter_mut().zip(o.0).for_each(|(a, b)| *a &= b);
        self
    }
}

impl<const W: usize> std::ops::BitOrAssign for BitMask<W> {
    fn bitor_assign(&mut self, o: Self) {
        *self = self.union(o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn behaves_as_a_set_of_indices(
            a in proptest::collection::btree_set(0usize..CPUMASK_BITS, 0..40),
            b in proptest::collection::btree_set(0usize..CPUMASK_BITS, 0..40),
            n in 0usize..600,
        ) {
            let (ma, mb) = (CpuMask::of(a.iter().copied()), CpuMask::of(b.iter().copied()));
            prop_assert_eq!(ma.iter().collect::<Vec<_>>(), a.iter().copied().collect::<Vec<_>>());
            prop_assert_eq!(ma.count(), a.len());
            prop_assert_eq!(ma.first(), a.first().copied());
            prop_assert_eq!(ma.is_empty(), a.is_empty());
            let u: Vec<usize> = a.union(&b).copied().collect();
            prop_assert_eq!(ma.union(mb).iter().collect::<Vec<_>>(), u);
            let i: Vec<usize> = a.intersection(&b).copied().collect();
            prop_assert_eq!(ma.intersection(mb).iter().collect::<Vec<_>>(), i);
            let f: Vec<usize> = (0..n.min(CPUMASK_BITS)).collect();
            prop_assert_eq!(CpuMask::first_n(n).iter().collect::<Vec<_>>(), f);
            let mut m = ma;
            let mut popped = vec![];
            while let Some(c) = m.pop_first() {
                popped.push(c);
            }
            prop_assert_eq!(popped, a.iter().copied().collect::<Vec<_>>());
            for &c in &b {
                m.insert(c);
                prop_assert!(m.contains(c));
                m.remove(c);
                prop_assert!(!m.contains(c));
            }
            prop_assert!(!m.contains(CPUMASK_BITS));
        }
    }
}
