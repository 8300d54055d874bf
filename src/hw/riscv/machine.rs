//! The RISC-V interrupt hardware of one machine, laid out for the
//! platform: per hart its H-extension CSRs and its IMSIC; one APLIC; the
//! IOMMU's MSI translation; and the physical address map that takes a
//! store to an interrupt file's page to that file.

use super::aplic::Aplic;
use super::gstage::GStage;
use super::hart::HartCsrs;
use super::imsic::Imsic;
use super::iommu::{MsiTranslation, RiscvIommu};
use super::params::AiaParams;

/// Where a physical store landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Landed {
    /// In hart `hart`'s file `file` (0 = S, g = guest file g); whether a
    /// pending bit was newly set.
    File {
        /// The hart.
        hart: usize,
        /// The file.
        file: usize,
        /// A bit was newly set.
        set: bool,
    },
    /// Not an interrupt file's page.
    Elsewhere,
}

/// The machine.
#[derive(Clone, Debug)]
pub struct RiscvMachine {
    /// The parameters.
    pub params: AiaParams,
    /// Per hart: its H-extension CSRs.
    pub harts: Vec<HartCsrs>,
    /// Per hart: its IMSIC.
    pub imsics: Vec<Imsic>,
    /// The APLIC (wired sources).
    pub aplic: Aplic,
    /// The IOMMU's MSI translation.
    pub iommu: RiscvIommu,
    /// The G-stage mappings of the VMs' IMSIC windows.
    pub gstage: GStage,
}

impl RiscvMachine {
    /// A machine sized by `p`, with `devices` IOMMU device contexts and
    /// as many MRIFs, 32 wired sources, and VMs of `vm_vcpus[vm]` vCPUs.
    pub fn new(p: AiaParams, devices: usize, vm_vcpus: &[usize]) -> Result<Self, String> {
        p.validate()?;
        Ok(RiscvMachine {
            params: p,
            harts: (0..p.harts)
                .map(|_| HartCsrs::new(p.guest_files, p.sstc))
                .collect(),
            imsics: (0..p.harts).map(|_| Imsic::new(&p)).collect(),
            aplic: Aplic::new(32),
            iommu: RiscvIommu::new(devices, devices),
            gstage: GStage::new(vm_vcpus),
        })
    }

    /// A 32-bit store of `data` to physical `addr`.
    pub fn store(&mut self, addr: u64, data: u32) -> Landed {
        let Some((hart, file)) = self.params.file_at(addr) else {
            return Landed::Elsewhere;
        };
        let set = self.imsics[hart]
            .file_mut(file)
            .is_some_and(|f| f.mmio_write(addr & 0xFFF, data));
        Landed::File { hart, file, set }
    }

    /// Device `dev`'s MSI write (`gpa`, `data`) through the IOMMU: where
    /// it landed (a flat translation's store), or the translation itself.
    pub fn device_msi(&mut self, dev: usize, gpa: u64, data: u32) -> (MsiTranslation, Landed) {
        let t = self.iommu.translate_msi(dev, gpa, data);
        let landed = match t {
            MsiTranslation::Write { addr, data } => self.store(addr, data),
            MsiTranslation::Mrif {
                notice: Some((addr, nid)),
                ..
            } => self.store(addr, nid),
            _ => Landed::Elsewhere,
        };
        (t, landed)
    }

    /// Wired source `source`'s line changes to `level` at the APLIC; an
    /// MSI its domain sends is stored to the interrupt file its target
    /// names (hart, guest index; guest 0 is the S file).
    pub fn wired(&mut self, source: usize, level: bool) -> Landed {
        match self.aplic.set_line(source, level) {
            Some(msi) if msi.hart < self.params.harts => {
                let addr = self.params.file_address(msi.hart, msi.guest);
                self.store(addr, msi.eiid)
            }
            _ => Landed::Elsewhere,
        }
    }

    /// `hart`'s `hgeip`.
    pub fn hgeip(&self, hart: usize) -> u64 {
        self.imsics[hart].hgeip()
    }
}
