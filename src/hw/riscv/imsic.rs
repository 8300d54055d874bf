//! The Incoming MSI Controller (AIA v1.0 §3): one per hart, with an
//! S-level interrupt file and GEILEN guest interrupt files. A file is two
//! bit arrays over its identities (pending `eip`, enabled `eie`), a
//! delivery switch (`eidelivery`) and a threshold (`eithreshold`). Devices
//! and harts set a pending bit by a 32-bit store of the identity to the
//! file's `seteipnum` register (its MMIO page); the hart reads the top
//! pending-and-enabled identity through `stopei` (or `vstopei` for the
//! guest file `hstatus.VGEIN` selects) and claims it by writing that CSR.
//!
//! Priority is the identity: a smaller number is the higher priority
//! (§3.8). A file signals its hart (SEIP for the S file; bit g of `hgeip`
//! for guest file g) exactly while `eidelivery` = 1 and `topei` ≠ 0.

use super::params::AiaParams;

/// `eidelivery`'s value that enables delivery from the file (§3.8.1).
pub const EIDELIVERY_ON: u64 = 1;
/// `*iselect` numbers of the file's indirectly accessed registers (§3.8).
pub const ISELECT_EIDELIVERY: u32 = 0x70;
/// `eithreshold`.
pub const ISELECT_EITHRESHOLD: u32 = 0x72;
/// `eip0` (on RV64 only the even ones exist: `eip2k` covers identities
/// 64k..64k+63).
pub const ISELECT_EIP0: u32 = 0x80;
/// `eie0`.
pub const ISELECT_EIE0: u32 = 0xC0;
/// Offset of `seteipnum_le` in a file's page.
pub const SETEIPNUM_LE: u64 = 0x0;
/// Offset of `seteipnum_be`.
pub const SETEIPNUM_BE: u64 = 0x4;

/// An access to a register the file does not implement (an odd `eip`/`eie`
/// on RV64, or an `iselect` outside the file's range): an illegal
/// instruction (§2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IllegalSelect(pub u32);

/// One interrupt file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterruptFile {
    ids: u32,
    eidelivery: u64,
    eithreshold: u32,
    /// Pending bits, bit `i % 64` of word `i / 64` for identity `i`.
    eip: Vec<u64>,
    /// Enable bits.
    eie: Vec<u64>,
}

impl InterruptFile {
    /// A file of `ids` identities, reset: delivery off, threshold 0, every
    /// bit clear.
    pub fn new(ids: u32) -> Self {
        let words = (ids as usize + 1).div_ceil(64);
        InterruptFile {
            ids,
            eidelivery: 0,
            eithreshold: 0,
            eip: vec![0; words],
            eie: vec![0; words],
        }
    }

    /// Its identity count.
    pub fn ids(&self) -> u32 {
        self.ids
    }

    fn valid(&self, id: u32) -> bool {
        (1..=self.ids).contains(&id)
    }

    /// A 32-bit store of `id` to `seteipnum`: identity `id`'s pending bit
    /// is set. An identity outside 1..=N is ignored (§3.5: "writes of
    /// unimplemented identities are ignored"). Returns whether a bit was
    /// set that was not already.
    pub fn setipnum(&mut self, id: u32) -> bool {
        if !self.valid(id) {
            return false;
        }
        let (w, b) = (id as usize / 64, id % 64);
        let was = self.eip[w] >> b & 1 != 0;
        self.eip[w] |= 1 << b;
        !was
    }

    /// A store to the file's MMIO page at `offset` (`seteipnum_le` or
    /// `seteipnum_be`); other offsets are reserved and ignored.
    pub fn mmio_write(&mut self, offset: u64, value: u32) -> bool {
        match offset {
            SETEIPNUM_LE => self.setipnum(value),
            SETEIPNUM_BE => self.setipnum(value.swap_bytes()),
            _ => false,
        }
    }

    /// Identity `id`'s pending bit.
    pub fn pending(&self, id: u32) -> bool {
        self.valid(id) && self.eip[id as usize / 64] >> (id % 64) & 1 != 0
    }

    /// Identity `id`'s enable bit.
    pub fn enabled(&self, id: u32) -> bool {
        self.valid(id) && self.eie[id as usize / 64] >> (id % 64) & 1 != 0
    }

    /// Sets or clears identity `id`'s enable bit (what a store to `eie2k`
    /// does for one bit; Linux's `imsic_local_sync` sets them one by one).
    pub fn set_enabled(&mut self, id: u32, on: bool) {
        if self.valid(id) {
            let (w, b) = (id as usize / 64, id % 64);
            if on {
                self.eie[w] |= 1 << b;
            } else {
                self.eie[w] &= !(1 << b);
            }
        }
    }

    /// Clears identity `id`'s pending bit (a store to `eip2k`).
    pub fn clear_pending(&mut self, id: u32) {
        if self.valid(id) {
            self.eip[id as usize / 64] &= !(1 << (id % 64));
        }
    }

    /// `*topei`'s identity: the smallest identity both pending and
    /// enabled, if below `eithreshold` when that is nonzero; 0 if none
    /// (§3.9). The field is the same in the priority and identity
    /// positions of the CSR ([`topei_csr`]).
    pub fn topei(&self) -> u32 {
        let limit = if self.eithreshold == 0 {
            self.ids + 1
        } else {
            self.eithreshold.min(self.ids + 1)
        };
        for (w, (p, e)) in self.eip.iter().zip(&self.eie).enumerate() {
            let live = p & e;
            if live != 0 {
                let id = (w * 64) as u32 + live.trailing_zeros();
                return if id < limit { id } else { 0 };
            }
        }
        0
    }

    /// A write to `*topei` (`csrrw rd, stopei, zero`: Linux's claim): the
    /// identity [`InterruptFile::topei`] reported is no longer pending.
    /// Returns that identity (0: nothing claimed).
    pub fn claim(&mut self) -> u32 {
        let id = self.topei();
        if id != 0 {
            self.clear_pending(id);
        }
        id
    }

    /// Whether the file signals its hart now: delivery on and an identity
    /// to report.
    pub fn signals(&self) -> bool {
        self.eidelivery == EIDELIVERY_ON && self.topei() != 0
    }

    /// An indirect read through `*iselect`/`*ireg` (RV64).
    pub fn read_ireg(&self, select: u32) -> Result<u64, IllegalSelect> {
        match select {
            ISELECT_EIDELIVERY => Ok(self.eidelivery),
            ISELECT_EITHRESHOLD => Ok(u64::from(self.eithreshold)),
            s => {
                let (arr, k) = self.array_word(s)?;
                Ok(if arr { self.eie[k] } else { self.eip[k] })
            }
        }
    }

    /// An indirect write through `*iselect`/`*ireg` (RV64): `eidelivery`
    /// keeps only its implemented values (0, 1), `eithreshold` its low
    /// bits, `eip0`/`eie0`'s bit 0 (identity 0) reads as zero.
    pub fn write_ireg(&mut self, select: u32, value: u64) -> Result<(), IllegalSelect> {
        match select {
            ISELECT_EIDELIVERY => self.eidelivery = value & EIDELIVERY_ON,
            ISELECT_EITHRESHOLD => self.eithreshold = (value as u32) & 0x7FF,
            s => {
                let (arr, k) = self.array_word(s)?;
                let mut v = value;
                if k == 0 {
                    v &= !1;
                }
                // Bits above N in the last word are not implemented.
                let top = (k as u32 + 1) * 64;
                if top > self.ids + 1 {
                    let keep = (self.ids + 1) - k as u32 * 64;
                    v &= if keep >= 64 { !0 } else { (1u64 << keep) - 1 };
                }
                if arr {
                    self.eie[k] = v;
                } else {
                    self.eip[k] = v;
                }
            }
        }
        Ok(())
    }

    /// The array (false: eip, true: eie) and word an `eipN`/`eieN` select
    /// names, on RV64 (even N only).
    fn array_word(&self, select: u32) -> Result<(bool, usize), IllegalSelect> {
        let (arr, n) = match select {
            s if (ISELECT_EIP0..ISELECT_EIP0 + 64).contains(&s) => (false, s - ISELECT_EIP0),
            s if (ISELECT_EIE0..ISELECT_EIE0 + 64).contains(&s) => (true, s - ISELECT_EIE0),
            s => return Err(IllegalSelect(s)),
        };
        let k = (n / 2) as usize;
        if n % 2 != 0 || k >= self.eip.len() {
            return Err(IllegalSelect(select));
        }
        Ok((arr, k))
    }

    /// Reads every pending bit and clears them (KVM's migration reads the
    /// old VS-file with `csr_swap` of each `eip`): the bits, word by word,
    /// into `out` (ORed).
    pub fn take_pending(&mut self, out: &mut [u64]) {
        for (o, p) in out.iter_mut().zip(self.eip.iter_mut()) {
            *o |= std::mem::take(p);
        }
    }

    /// ORs pending bits into the file (KVM's `imsic_vsfile_local_update`).
    pub fn or_pending(&mut self, bits: &[u64]) {
        for (p, b) in self.eip.iter_mut().zip(bits) {
            *p |= b;
        }
        self.eip[0] &= !1;
    }

    /// The whole file to its reset state (KVM's `imsic_vsfile_local_clear`
    /// before a guest file is handed to a vCPU).
    pub fn clear(&mut self) {
        self.eidelivery = 0;
        self.eithreshold = 0;
        self.eip.fill(0);
        self.eie.fill(0);
    }

    /// The enable bits and control state (for a copy to another file).
    pub fn config(&self) -> (u64, u32, &[u64]) {
        (self.eidelivery, self.eithreshold, &self.eie)
    }

    /// Sets the enable bits and control state (the other half of a copy).
    pub fn set_config(&mut self, eidelivery: u64, eithreshold: u32, eie: &[u64]) {
        self.eidelivery = eidelivery & EIDELIVERY_ON;
        self.eithreshold = eithreshold & 0x7FF;
        for (d, s) in self.eie.iter_mut().zip(eie) {
            *d = *s;
        }
    }

    /// Words in each array.
    pub fn words(&self) -> usize {
        self.eip.len()
    }
}

/// `*topei`'s CSR value for `id` (§3.9: bits 26:16 the identity, bits
/// 10:0 its priority, which is the identity).
pub fn topei_csr(id: u32) -> u64 {
    (u64::from(id) << 16) | u64::from(id)
}

/// A hart's IMSIC: its S file and guest files 1..=GEILEN.
#[derive(Clone, Debug)]
pub struct Imsic {
    /// The S-level file (the host's).
    pub s_file: InterruptFile,
    /// Guest file g is `guest[g - 1]`.
    guest: Vec<InterruptFile>,
}

impl Imsic {
    /// An IMSIC sized by `p`.
    pub fn new(p: &AiaParams) -> Self {
        Imsic {
            s_file: InterruptFile::new(p.ids),
            guest: (0..p.guest_files)
                .map(|_| InterruptFile::new(p.ids))
                .collect(),
        }
    }

    /// GEILEN.
    pub fn guest_files(&self) -> usize {
        self.guest.len()
    }

    /// Guest file `g` (1..=GEILEN).
    pub fn guest(&self, g: usize) -> Option<&InterruptFile> {
        g.checked_sub(1).and_then(|i| self.guest.get(i))
    }

    /// Guest file `g`, mutably.
    pub fn guest_mut(&mut self, g: usize) -> Option<&mut InterruptFile> {
        g.checked_sub(1).and_then(|i| self.guest.get_mut(i))
    }

    /// File `file` (0 = S, g = guest file g).
    pub fn file_mut(&mut self, file: usize) -> Option<&mut InterruptFile> {
        if file == 0 {
            Some(&mut self.s_file)
        } else {
            self.guest_mut(file)
        }
    }

    /// `hgeip`: bit g set while guest file g signals (§3.8, the H
    /// extension's guest external interrupt lines).
    pub fn hgeip(&self) -> u64 {
        self.guest
            .iter()
            .enumerate()
            .filter(|(_, f)| f.signals())
            .fold(0, |acc, (i, _)| acc | 1 << (i + 1))
    }

    /// The S file's SEIP.
    pub fn seip(&self) -> bool {
        self.s_file.signals()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> InterruptFile {
        let mut f = InterruptFile::new(63);
        f.write_ireg(ISELECT_EIDELIVERY, 1).unwrap();
        f
    }

    #[test]
    fn topei_is_the_lowest_enabled_pending_identity() {
        let mut f = file();
        for id in [9, 5, 40] {
            f.set_enabled(id, true);
            f.setipnum(id);
        }
        f.setipnum(3); // pending, not enabled
        assert_eq!(f.topei(), 5);
        assert_eq!(topei_csr(f.topei()), (5 << 16) | 5);
        assert!(f.signals());
    }

    #[test]
    fn claim_clears_what_topei_reported_and_only_that() {
        let mut f = file();
        for id in [9, 5] {
            f.set_enabled(id, true);
            f.setipnum(id);
        }
        assert_eq!(f.claim(), 5);
        assert!(!f.pending(5));
        assert!(f.pending(9));
        assert_eq!(f.claim(), 9);
        assert_eq!(f.claim(), 0, "nothing left");
        assert!(!f.signals());
    }

    #[test]
    fn eithreshold_masks_identities_at_or_above_it() {
        let mut f = file();
        f.set_enabled(7, true);
        f.setipnum(7);
        f.write_ireg(ISELECT_EITHRESHOLD, 7).unwrap();
        assert_eq!(f.topei(), 0, "7 is not below the threshold 7");
        assert!(!f.signals());
        assert_eq!(f.claim(), 0);
        assert!(f.pending(7), "a masked identity stays pending");
        f.write_ireg(ISELECT_EITHRESHOLD, 8).unwrap();
        assert_eq!(f.topei(), 7);
        f.write_ireg(ISELECT_EITHRESHOLD, 0).unwrap();
        assert_eq!(f.topei(), 7, "0 disables the threshold");
    }

    #[test]
    fn setipnum_of_an_unimplemented_identity_is_ignored() {
        let mut f = file();
        assert!(!f.setipnum(0));
        assert!(!f.setipnum(64));
        assert!(!f.mmio_write(SETEIPNUM_LE, 5000));
        assert_eq!(f.read_ireg(ISELECT_EIP0).unwrap(), 0);
        assert!(f.mmio_write(SETEIPNUM_BE, 12u32.swap_bytes()));
        assert!(f.pending(12));
        assert!(!f.mmio_write(0x8, 13), "reserved offset");
    }

    #[test]
    fn delivery_off_holds_the_signal() {
        let mut f = InterruptFile::new(63);
        f.set_enabled(4, true);
        f.setipnum(4);
        assert_eq!(f.topei(), 4);
        assert!(!f.signals());
        f.write_ireg(ISELECT_EIDELIVERY, 0x4000_0001).unwrap();
        assert_eq!(f.read_ireg(ISELECT_EIDELIVERY).unwrap(), 1);
        assert!(f.signals());
    }

    #[test]
    fn rv64_has_only_even_eip_and_eie_registers() {
        let mut f = InterruptFile::new(127);
        assert_eq!(f.read_ireg(ISELECT_EIP0 + 1), Err(IllegalSelect(0x81)));
        assert!(f.write_ireg(ISELECT_EIE0 + 2, !0).is_ok());
        assert!(f.enabled(64) && f.enabled(127));
        assert_eq!(f.read_ireg(ISELECT_EIE0 + 4), Err(IllegalSelect(0xC4)));
        f.write_ireg(ISELECT_EIP0, !0).unwrap();
        assert!(!f.pending(0), "identity 0 does not exist");
        assert_eq!(f.read_ireg(0x71), Err(IllegalSelect(0x71)));
    }

    #[test]
    fn guest_files_drive_their_hgeip_bits() {
        let mut m = Imsic::new(&AiaParams::new(1, 3));
        assert_eq!(m.guest_files(), 3);
        assert!(m.guest(0).is_none(), "guest files are numbered from 1");
        let g2 = m.guest_mut(2).unwrap();
        g2.write_ireg(ISELECT_EIDELIVERY, 1).unwrap();
        g2.set_enabled(1, true);
        g2.setipnum(1);
        assert_eq!(m.hgeip(), 0b100);
        assert!(!m.seip());
    }

    #[test]
    fn take_and_or_move_pending_state_between_files() {
        let mut a = file();
        let mut b = file();
        a.setipnum(3);
        a.setipnum(60);
        b.setipnum(4);
        let mut bits = vec![0; a.words()];
        a.take_pending(&mut bits);
        assert!(!a.pending(3) && !a.pending(60));
        b.or_pending(&bits);
        assert!(b.pending(3) && b.pending(4) && b.pending(60));
    }
}
