//! G-stage (guest-physical to host-physical) translation of the pages a
//! guest's interrupt files appear at (Privileged ISA §8.5): a guest store
//! to its IMSIC page either lands in the host page the hypervisor mapped
//! there (a guest interrupt file: no exit) or, unmapped, faults to HS mode
//! (a store guest-page fault the hypervisor emulates). Only the IMSIC
//! window is modelled; the rest of guest memory is always mapped.

use super::params::FILE_PAGE;

/// Where a guest sees its vCPUs' interrupt files: vCPU `i`'s page at
/// `GUEST_IMSIC_BASE + i * 4 KiB` (QEMU `virt`'s S-level IMSIC window).
pub const GUEST_IMSIC_BASE: u64 = 0x2800_0000;

/// The G-stage mappings of each VM's IMSIC window.
#[derive(Clone, Debug, Default)]
pub struct GStage {
    /// Per VM, per guest page (vCPU index): the host page, if mapped.
    maps: Vec<Vec<Option<u64>>>,
}

impl GStage {
    /// Windows for VMs of `vcpus[vm]` vCPUs, nothing mapped.
    pub fn new(vcpus: &[usize]) -> Self {
        GStage {
            maps: vcpus.iter().map(|&n| vec![None; n]).collect(),
        }
    }

    /// Maps VM `vm`'s page for vCPU `index` to host page `host` (or
    /// unmaps it with `None`): KVM's `kvm_riscv_gstage_ioremap` /
    /// `kvm_riscv_gstage_iounmap` of a VS-file.
    pub fn map(&mut self, vm: usize, index: usize, host: Option<u64>) {
        if let Some(p) = self.maps.get_mut(vm).and_then(|m| m.get_mut(index)) {
            *p = host;
        }
    }

    /// A guest-physical address in VM `vm`'s IMSIC window: the vCPU index
    /// it names and the host address it translates to (`None`: a guest
    /// page fault). Outside the window: `None` for both.
    pub fn translate(&self, vm: usize, gpa: u64) -> Option<(usize, Option<u64>)> {
        let off = gpa.checked_sub(GUEST_IMSIC_BASE)?;
        let index = (off / FILE_PAGE) as usize;
        let page = self.maps.get(vm)?.get(index)?;
        Some((index, page.map(|h| h + off % FILE_PAGE)))
    }

    /// The guest-physical page of VM vCPU `index`'s interrupt file.
    pub fn guest_page(index: usize) -> u64 {
        GUEST_IMSIC_BASE + index as u64 * FILE_PAGE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_lands_where_mapped_and_faults_where_not() {
        let mut g = GStage::new(&[2]);
        g.map(0, 1, Some(0x3000_5000));
        assert_eq!(
            g.translate(0, GStage::guest_page(1)),
            Some((1, Some(0x3000_5000)))
        );
        assert_eq!(g.translate(0, GStage::guest_page(0)), Some((0, None)));
        assert_eq!(g.translate(0, GStage::guest_page(2)), None);
        g.map(0, 1, None);
        assert_eq!(g.translate(0, GStage::guest_page(1)), Some((1, None)));
    }
}
