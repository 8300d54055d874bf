//! The RISC-V IOMMU's MSI address translation (RISC-V IOMMU v1.0 §2.3.3,
//! §3.1.3.6, §9.5): a device context's `msiptp` points at an MSI page
//! table; a device write whose guest-physical page matches
//! `msi_addr_pattern` under `msi_addr_mask` is an MSI to a virtual
//! interrupt file, whose number is the page's bits under the mask (packed
//! low). Its MSI PTE either
//!
//! - translates it in **flat** (basic) mode to a physical page, normally a
//!   guest interrupt file of some hart's IMSIC: the device's write lands
//!   there and the guest takes it with no hypervisor (the proposal of the
//!   RFC "iommu/riscv: Add guest file irqbypass support", 2024–25), or
//! - records it in a **memory-resident interrupt file** (MRIF): the IOMMU
//!   sets the identity's pending bit in memory and, if it is enabled
//!   there, sends the notice MSI the PTE names (NPPN, NID) to the host,
//!   which then injects it by software.
//!
//! A write that does not match goes on through G-stage translation like
//! any DMA.

/// A memory-resident interrupt file (IOMMU v1.0 §9.5.1): pending and
/// enable bits for identities 1..=2047, stored as interleaved doublewords
/// (here two arrays).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mrif {
    /// Pending bits.
    pub eip: [u64; 32],
    /// Enable bits.
    pub eie: [u64; 32],
}

impl Mrif {
    /// Sets identity `id`'s pending bit; whether it is enabled (so a
    /// notice is due). Identity 0 and ≥ 2048 are dropped.
    pub fn set(&mut self, id: u32) -> bool {
        if id == 0 || id >= 2048 {
            return false;
        }
        let (w, b) = (id as usize / 64, id % 64);
        self.eip[w] |= 1 << b;
        self.eie[w] >> b & 1 != 0
    }

    /// Sets identity `id`'s enable bit.
    pub fn enable(&mut self, id: u32) {
        if id != 0 && id < 2048 {
            self.eie[id as usize / 64] |= 1 << (id % 64);
        }
    }

    /// Takes the pending bits (the host draining the MRIF into a file).
    pub fn take(&mut self, out: &mut [u64]) {
        for (o, p) in out.iter_mut().zip(self.eip.iter_mut()) {
            *o |= std::mem::take(p);
        }
    }
}

/// An MSI page-table entry (§9.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsiPte {
    /// V = 0.
    Invalid,
    /// M = 3, basic translation: the physical page (address) of an
    /// interrupt file.
    Flat {
        /// The target page's physical address.
        addr: u64,
    },
    /// M = 1, MRIF mode.
    Mrif {
        /// The MRIF (index into [`RiscvIommu::mrifs`]).
        mrif: usize,
        /// The notice MSI's physical address (NPPN << 12).
        notice_addr: u64,
        /// The notice MSI's data (NID).
        nid: u32,
    },
}

/// A device context's MSI fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MsiContext {
    /// `msiptp.MODE` = Flat (else Off: no MSI translation).
    pub enabled: bool,
    /// `msi_addr_mask` (page-number bits that select the file).
    pub mask: u64,
    /// `msi_addr_pattern`.
    pub pattern: u64,
    /// The MSI page table, indexed by interrupt file number.
    pub table: Vec<MsiPte>,
}

/// What an MSI write became.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsiTranslation {
    /// Written to physical `addr` (an interrupt file's page) with `data`.
    Write {
        /// The physical address.
        addr: u64,
        /// The data (the identity).
        data: u32,
    },
    /// Recorded in MRIF `mrif`; the notice MSI sent to the host, if due.
    Mrif {
        /// Which MRIF.
        mrif: usize,
        /// The notice (address, NID), when the identity is enabled there.
        notice: Option<(u64, u32)>,
    },
    /// Not an MSI address: on through G-stage translation.
    Untranslated,
    /// The MSI PTE is invalid or out of the table (a fault record).
    Fault,
}

/// The IOMMU's MSI translation state: device contexts by device ID and
/// the MRIFs in memory.
#[derive(Clone, Debug, Default)]
pub struct RiscvIommu {
    /// Device contexts.
    pub contexts: Vec<MsiContext>,
    /// MRIFs.
    pub mrifs: Vec<Mrif>,
}

/// `pext`: the bits of `v` under `mask`, packed low (§2.3.3's
/// "extract").
fn extract(v: u64, mask: u64) -> u64 {
    let (mut out, mut bit, mut m) = (0, 0, mask);
    while m != 0 {
        let low = m.trailing_zeros();
        out |= (v >> low & 1) << bit;
        bit += 1;
        m &= m - 1;
    }
    out
}

impl RiscvIommu {
    /// An IOMMU with `devices` device contexts (MSI translation off) and
    /// `mrifs` MRIFs.
    pub fn new(devices: usize, mrifs: usize) -> Self {
        RiscvIommu {
            contexts: (0..devices)
                .map(|_| MsiContext {
                    enabled: false,
                    mask: 0,
                    pattern: 0,
                    table: Vec::new(),
                })
                .collect(),
            mrifs: vec![Mrif::default(); mrifs],
        }
    }

    /// Device `dev` writes `data` to guest-physical `gpa`.
    pub fn translate_msi(&mut self, dev: usize, gpa: u64, data: u32) -> MsiTranslation {
        let Some(c) = self.contexts.get(dev) else {
            return MsiTranslation::Fault;
        };
        let page = gpa >> 12;
        if !c.enabled || (page & !c.mask) != (c.pattern & !c.mask) {
            return MsiTranslation::Untranslated;
        }
        let file = extract(page, c.mask) as usize;
        match c.table.get(file).copied().unwrap_or(MsiPte::Invalid) {
            MsiPte::Invalid => MsiTranslation::Fault,
            MsiPte::Flat { addr } => MsiTranslation::Write {
                addr: addr | (gpa & 0xFFF),
                data,
            },
            MsiPte::Mrif {
                mrif,
                notice_addr,
                nid,
            } => {
                let Some(m) = self.mrifs.get_mut(mrif) else {
                    return MsiTranslation::Fault;
                };
                let due = m.set(data);
                MsiTranslation::Mrif {
                    mrif,
                    notice: due.then_some((notice_addr, nid)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iommu() -> RiscvIommu {
        let mut io = RiscvIommu::new(1, 1);
        // The guest sees its interrupt files at 0x2800_0000 + n pages.
        io.contexts[0] = MsiContext {
            enabled: true,
            mask: 0x3,
            pattern: 0x2800_0000 >> 12,
            table: vec![MsiPte::Invalid; 4],
        };
        io
    }

    #[test]
    fn flat_mode_rewrites_the_address_to_the_guest_file() {
        let mut io = iommu();
        io.contexts[0].table[1] = MsiPte::Flat { addr: 0x2804_3000 };
        assert_eq!(
            io.translate_msi(0, 0x2800_1000, 7),
            MsiTranslation::Write {
                addr: 0x2804_3000,
                data: 7
            }
        );
        assert_eq!(io.translate_msi(0, 0x2800_2000, 7), MsiTranslation::Fault);
        assert_eq!(
            io.translate_msi(0, 0x8000_0000, 7),
            MsiTranslation::Untranslated
        );
    }

    #[test]
    fn mrif_mode_records_and_notices_only_enabled_identities() {
        let mut io = iommu();
        io.contexts[0].table[0] = MsiPte::Mrif {
            mrif: 0,
            notice_addr: 0x2800_0000,
            nid: 200,
        };
        assert_eq!(
            io.translate_msi(0, 0x2800_0000, 5),
            MsiTranslation::Mrif {
                mrif: 0,
                notice: None
            }
        );
        io.mrifs[0].enable(6);
        assert_eq!(
            io.translate_msi(0, 0x2800_0000, 6),
            MsiTranslation::Mrif {
                mrif: 0,
                notice: Some((0x2800_0000, 200))
            }
        );
        let mut bits = [0u64; 32];
        io.mrifs[0].take(&mut bits);
        assert_eq!(bits[0], (1 << 5) | (1 << 6));
    }

    #[test]
    fn extract_packs_the_masked_bits_low() {
        assert_eq!(extract(0b1011_0110, 0b1100_0010), 0b101);
    }
}
