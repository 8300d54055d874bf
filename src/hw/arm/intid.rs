//! INTID classes, the bitmaps the GIC blocks keep their per-INTID state in,
//! and the error type they share (GICv3/v4 architecture specification, IHI
//! 0069, §2.2 "INTIDs").
//!
//! | INTIDs | class |
//! |---|---|
//! | 0..=15 | SGI, banked per core |
//! | 16..=31 | PPI, banked per core |
//! | 32..=1019 | SPI, one shared line each |
//! | 1020..=1023 | special (1023: spurious, nothing pending) |
//! | 8192.. | LPI, message-based, no active state |

/// First SGI.
pub const SGI_BASE: u32 = 0;
/// First PPI (one past the last SGI).
pub const PPI_BASE: u32 = 16;
/// First SPI (one past the last PPI).
pub const SPI_BASE: u32 = 32;
/// One past the last SPI.
pub const SPI_LIMIT: u32 = 1020;
/// The spurious INTID an acknowledge returns when nothing can be taken.
pub const SPURIOUS: u32 = 1023;
/// First LPI.
pub const LPI_BASE: u32 = 8192;
/// The PPI the virtual CPU interface's maintenance interrupt uses (the
/// recommended one, gem5's `maint_int`; Arm BSA).
pub const MAINTENANCE_PPI: u32 = 25;
/// The EL1 virtual timer's PPI (CNTV).
pub const VTIMER_PPI: u32 = 27;
/// The EL1 physical timer's PPI (CNTP).
pub const PTIMER_PPI: u32 = 30;
/// The model's limit on cores (a [`CoreSet`] holds this many).
pub const MAX_CORES: usize = 256;

/// The class an INTID belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntidClass {
    /// Software-generated, 0..=15.
    Sgi,
    /// Private peripheral, 16..=31.
    Ppi,
    /// Shared peripheral, 32..=1019.
    Spi,
    /// 1020..=1023.
    Special,
    /// Reserved or extended ranges the model does not implement (1024..8191).
    Reserved,
    /// Locality-specific peripheral, 8192 and above.
    Lpi,
}

/// The class of `intid`.
pub fn class(intid: u32) -> IntidClass {
    match intid {
        0..=15 => IntidClass::Sgi,
        16..=31 => IntidClass::Ppi,
        32..=1019 => IntidClass::Spi,
        1020..=1023 => IntidClass::Special,
        1024..=8191 => IntidClass::Reserved,
        _ => IntidClass::Lpi,
    }
}

/// Errors a GIC block returns for software's bad input (where hardware would
/// ignore the access, report SError, or behave UNPREDICTABLY, the model
/// refuses and says why). Nothing here panics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GicError {
    /// The INTID is not one this block implements.
    #[error("INTID {0} is not implemented here")]
    Intid(u32),
    /// An MMIO offset with no register behind it.
    #[error("no register at offset {0:#x}")]
    Offset(u64),
    /// A write to a read-only register.
    #[error("register at offset {0:#x} is read-only")]
    ReadOnly(u64),
    /// A value with reserved bits set, or a reserved encoding.
    #[error("reserved bits set writing {value:#x} to {reg}")]
    Reserved {
        /// The register written.
        reg: &'static str,
        /// The value refused.
        value: u64,
    },
    /// A list register index past ICH_VTR_EL2.ListRegs.
    #[error("list register {0} is not implemented")]
    ListRegister(usize),
    /// A vPE id past the vPE table.
    #[error("vPE {0} is not implemented")]
    Vpe(u16),
    /// A core index past the topology.
    #[error("core {0} does not exist")]
    Core(usize),
    /// LPIs are used while GICR_CTLR.EnableLPIs is 0.
    #[error("LPIs are disabled at this redistributor")]
    LpisDisabled,
    /// A GICv4/v4.1 feature on a platform without it.
    #[error("{0} is not implemented on this GIC")]
    Unsupported(&'static str),
}

/// A fixed-size bitmap over a contiguous range of indices, allocated once.
///
/// Bit `i` is bit `i % 64` of word `i / 64`. Out-of-range indices read as 0
/// and are never set, so callers check ranges and report errors; the bitmap
/// itself never panics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bitmap {
    words: Box<[u64]>,
    len: u32,
}

impl Bitmap {
    /// `len` bits, all clear.
    pub fn new(len: u32) -> Self {
        Bitmap {
            words: vec![0; len.div_ceil(64) as usize].into_boxed_slice(),
            len,
        }
    }

    /// The number of bits.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the bitmap has no bits at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether bit `i` is set.
    pub fn test(&self, i: u32) -> bool {
        i < self.len && self.words[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    /// Sets bit `i`; true if it was clear (false if set already or out of range).
    pub fn set(&mut self, i: u32) -> bool {
        if i >= self.len {
            return false;
        }
        let w = &mut self.words[(i / 64) as usize];
        let was = *w & (1 << (i % 64)) != 0;
        *w |= 1 << (i % 64);
        !was
    }

    /// Clears bit `i`; true if it was set.
    pub fn clear(&mut self, i: u32) -> bool {
        if i >= self.len {
            return false;
        }
        let w = &mut self.words[(i / 64) as usize];
        let was = *w & (1 << (i % 64)) != 0;
        *w &= !(1 << (i % 64));
        was
    }

    /// Sets or clears bit `i`.
    pub fn assign(&mut self, i: u32, on: bool) {
        if on {
            self.set(i);
        } else {
            self.clear(i);
        }
    }

    /// Clears every bit.
    pub fn clear_all(&mut self) {
        self.words.iter_mut().for_each(|w| *w = 0);
    }

    /// Whether no bit is set.
    pub fn none(&self) -> bool {
        self.words.iter().all(|w| *w == 0)
    }

    /// How many bits are set.
    pub fn count(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    /// The 64-bit words, lowest indices first.
    pub fn words(&self) -> &[u64] {
        &self.words
    }

    /// The 32-bit register chunk `n` (bits 32n..32n+31, lowest in bit 0),
    /// 0 past the end: the layout of `GICD_ISENABLER<n>` and friends.
    pub fn word32(&self, n: u32) -> u32 {
        match self.words.get((n / 2) as usize) {
            Some(w) => (w >> ((n % 2) * 32)) as u32,
            None => 0,
        }
    }

    /// Replaces chunk `n` with `v` (bits past `len` are dropped).
    pub fn write_word32(&mut self, n: u32, v: u32) {
        for b in 0..32 {
            self.assign(n * 32 + b, v & (1 << b) != 0);
        }
    }

    /// The set bits, lowest first (no allocation).
    pub fn ones(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(wi, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let b = w.trailing_zeros();
                w &= w - 1;
                Some(wi as u32 * 64 + b)
            })
        })
    }
}

/// A set of cores (indices below [`MAX_CORES`]), fixed-size so that routing
/// an SGI allocates nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CoreSet([u64; MAX_CORES / 64]);

impl CoreSet {
    /// The empty set.
    pub const EMPTY: CoreSet = CoreSet([0; MAX_CORES / 64]);

    /// Adds `core` (ignored past [`MAX_CORES`]).
    pub fn insert(&mut self, core: usize) {
        if core < MAX_CORES {
            self.0[core / 64] |= 1 << (core % 64);
        }
    }

    /// Removes `core`.
    pub fn remove(&mut self, core: usize) {
        if core < MAX_CORES {
            self.0[core / 64] &= !(1 << (core % 64));
        }
    }

    /// Whether `core` is in the set.
    pub fn contains(&self, core: usize) -> bool {
        core < MAX_CORES && self.0[core / 64] & (1 << (core % 64)) != 0
    }

    /// How many cores the set holds.
    pub fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    /// The cores, lowest first.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..MAX_CORES).filter(move |c| self.contains(*c))
    }

    /// Cores `0..n`.
    pub fn first(n: usize) -> Self {
        let mut s = CoreSet::EMPTY;
        (0..n.min(MAX_CORES)).for_each(|c| s.insert(c));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_the_intid_space() {
        assert_eq!(class(0), IntidClass::Sgi);
        assert_eq!(class(15), IntidClass::Sgi);
        assert_eq!(class(16), IntidClass::Ppi);
        assert_eq!(class(VTIMER_PPI), IntidClass::Ppi);
        assert_eq!(class(32), IntidClass::Spi);
        assert_eq!(class(1019), IntidClass::Spi);
        assert_eq!(class(SPURIOUS), IntidClass::Special);
        assert_eq!(class(4096), IntidClass::Reserved);
        assert_eq!(class(LPI_BASE), IntidClass::Lpi);
    }

    #[test]
    fn bitmap_sets_clears_and_iterates_across_words() {
        let mut b = Bitmap::new(130);
        assert!(b.none());
        for i in [0, 63, 64, 127, 129] {
            assert!(b.set(i));
            assert!(!b.set(i), "second set reports no change");
        }
        assert!(!b.set(130), "out of range is never set");
        assert!(!b.test(130));
        assert_eq!(b.count(), 5);
        assert_eq!(b.ones().collect::<Vec<_>>(), vec![0, 63, 64, 127, 129]);
        assert_eq!(b.word32(1), 1 << 31);
        assert_eq!(b.word32(2), 1);
        assert_eq!(b.word32(9), 0);
        assert!(b.clear(63));
        assert!(!b.clear(63));
        b.write_word32(4, 0b11);
        assert!(b.test(128) && b.test(129) && !b.test(130));
        b.clear_all();
        assert!(b.none());
    }

    #[test]
    fn core_sets() {
        let mut s = CoreSet::EMPTY;
        s.insert(3);
        s.insert(200);
        s.insert(MAX_CORES);
        assert_eq!(s.len(), 2);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![3, 200]);
        s.remove(3);
        assert!(!s.contains(3));
        assert_eq!(CoreSet::first(5).len(), 5);
    }
}
