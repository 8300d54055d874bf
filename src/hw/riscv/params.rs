//! Parameters of the RISC-V interrupt hardware: harts, the IMSIC's files
//! and their identities, the MMIO layout of the interrupt files, the
//! timebase. Kept apart from the blocks they size, as `hw::arm::params`
//! is for the GIC. Every array a block owns is allocated once from these.

/// The smallest and largest identity counts an interrupt file may have
/// (AIA v1.0 §3.1: a multiple of 64 minus 1, from 63 to 2047).
pub const MIN_IDS: u32 = 63;
/// The largest identity count.
pub const MAX_IDS: u32 = 2047;

/// One interrupt file's MMIO page (AIA v1.0 §3.5: 4 KiB, `seteipnum_le`
/// at offset 0, `seteipnum_be` at 4).
pub const FILE_PAGE: u64 = 0x1000;

/// The AIA of one machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AiaParams {
    /// Harts, each with an IMSIC.
    pub harts: usize,
    /// Guest interrupt files per hart's IMSIC: the H extension's GEILEN
    /// (guest external interrupt lines; `hgeie`/`hgeip` bits 1..=GEILEN).
    pub guest_files: usize,
    /// Identities per interrupt file (the S file and every guest file).
    pub ids: u32,
    /// Physical address of hart 0's S-level file; a hart's guest files
    /// follow its S file page by page (Linux's `guest_index_bits` layout:
    /// hart `h`, file `g` at `base + (h << (12 + guest_bits)) + (g << 12)`).
    pub imsic_base: u64,
    /// The timebase (`time` CSR) frequency.
    pub timebase_hz: u64,
    /// The hart implements Sstc (`stimecmp`, `vstimecmp`).
    pub sstc: bool,
}

impl AiaParams {
    /// A machine of `harts` harts with `guest_files` guest files each and
    /// 255 identities per file (QEMU `virt`'s default `aia-guests` files
    /// have 255 identities); a 10 MHz timebase (QEMU `virt`, SiFive).
    pub fn new(harts: usize, guest_files: usize) -> Self {
        AiaParams {
            harts,
            guest_files,
            ids: 255,
            imsic_base: 0x2800_0000,
            timebase_hz: 10_000_000,
            sstc: true,
        }
    }

    /// Bits of a file index inside a hart's IMSIC region (file 0 is the S
    /// file; guest files 1..=GEILEN), rounded up to a power of two.
    pub fn guest_index_bits(&self) -> u32 {
        let files = self.guest_files as u64 + 1;
        64 - (files - 1).leading_zeros().min(64)
    }

    /// The physical page of hart `hart`'s file `file` (0 = S, g = guest
    /// file g).
    pub fn file_address(&self, hart: usize, file: usize) -> u64 {
        self.imsic_base + ((hart as u64) << (12 + self.guest_index_bits())) + ((file as u64) << 12)
    }

    /// The hart and file an address falls in, if it is an implemented
    /// interrupt file's page.
    pub fn file_at(&self, addr: u64) -> Option<(usize, usize)> {
        let off = addr.checked_sub(self.imsic_base)?;
        let hart = (off >> (12 + self.guest_index_bits())) as usize;
        let file = ((off >> 12) & ((1 << self.guest_index_bits()) - 1)) as usize;
        (hart < self.harts && file <= self.guest_files).then_some((hart, file))
    }

    /// Whether the numbers are ones the architecture allows: identities
    /// 63..=2047 and 64k − 1, GEILEN ≤ 63 (`hgeie` is XLEN − 1 bits wide
    /// on RV64), at least one hart.
    pub fn validate(&self) -> Result<(), String> {
        if self.harts == 0 {
            return Err("at least one hart".into());
        }
        if !(MIN_IDS..=MAX_IDS).contains(&self.ids) || !(self.ids + 1).is_multiple_of(64) {
            return Err(format!(
                "{} identities: an interrupt file has 64k - 1, from 63 to 2047",
                self.ids
            ));
        }
        if self.guest_files > 63 {
            return Err(format!("GEILEN {} > 63", self.guest_files));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_addresses_round_trip_and_stay_apart() {
        let p = AiaParams::new(4, 5);
        assert_eq!(p.guest_index_bits(), 3);
        for h in 0..4 {
            for f in 0..=5 {
                assert_eq!(p.file_at(p.file_address(h, f)), Some((h, f)));
            }
        }
        // Index 6 and 7 exist in the layout but no file implements them.
        assert_eq!(p.file_at(p.file_address(0, 6)), None);
        assert_eq!(p.file_at(p.imsic_base - 1), None);
    }

    #[test]
    fn identities_must_be_64k_minus_1() {
        let mut p = AiaParams::new(1, 1);
        assert!(p.validate().is_ok());
        p.ids = 100;
        assert!(p.validate().is_err());
        p.ids = 2047;
        assert!(p.validate().is_ok());
        p.ids = 4095;
        assert!(p.validate().is_err());
    }
}
