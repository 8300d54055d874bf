//! RISC-V hardware models for the Advanced Interrupt Architecture (AIA
//! v1.0) on harts with the hypervisor extension: per hart the
//! H-extension CSRs ([`hart`]) and an IMSIC with an S-level file and
//! GEILEN guest files ([`imsic`]); the APLIC for wired sources in MSI
//! mode ([`aplic`]); the RISC-V IOMMU's MSI translation, flat or MRIF
//! ([`iommu`]); the G-stage mappings of the guests' IMSIC windows
//! ([`gstage`]); their layout on one machine ([`machine`]); sizes apart
//! ([`params`]). The sibling of [`crate::hw::x86`] and [`crate::hw::arm`];
//! docs/riscv.md is the specification in the project's words.
//!
//! # How an interrupt flows
//!
//! A VF's MSI to a vCPU whose guest file is on its hart (no exit):
//!
//! ```text
//! VF MSI (gpa, eiid) ──► RiscvIommu::translate_msi      MSI PTE flat: the guest file's page
//!                    ──► InterruptFile::setipnum(eiid)  pending bit set
//!                    ──► Imsic::hgeip()                 bit g while the file signals
//!   VGEIN = g        ──► HartCsrs::vs_interrupt         VSEI taken in VS mode
//!                    ──► InterruptFile::claim           the guest's csrrw vstopei
//!   VGEIN ≠ g        ──► HartCsrs::sgei                 hgeip & hgeie: an SGEI to HS (the
//!                                                       host wakes the file's vCPU)
//! ```
//!
//! A wired device's line goes through the APLIC (`Aplic::set_line`): in MSI
//! mode its domain sends the MSI its `target` names, which lands in that
//! hart's file like any other (`RiscvMachine::wired`).
//!
//! Without a guest file (KVM's software file) the MSI lands in an MRIF or
//! the host's S file; the host sets `hvip.VSEIP` and every `vstopei`
//! access is a virtual-instruction exit it emulates.

#![deny(missing_docs)]

pub mod aplic;
pub mod gstage;
pub mod hart;
pub mod imsic;
pub mod iommu;
pub mod machine;
pub mod params;

#[cfg(test)]
mod tests {
    use super::hart::{irq, VsCsr, VsOutcome, VS_BITS};
    use super::imsic::{ISELECT_EIDELIVERY, SETEIPNUM_LE};
    use super::iommu::{MsiContext, MsiPte, MsiTranslation};
    use super::machine::{Landed, RiscvMachine};
    use super::params::AiaParams;

    /// Two harts, two guest files each; the guest's file 1 on hart 1.
    fn machine() -> RiscvMachine {
        let mut m = RiscvMachine::new(AiaParams::new(2, 2), 1, &[2]).unwrap();
        let f = m.imsics[1].guest_mut(1).unwrap();
        f.write_ireg(ISELECT_EIDELIVERY, 1).unwrap();
        f.set_enabled(40, true);
        for h in &mut m.harts {
            h.hideleg = VS_BITS;
            h.vsie = VS_BITS;
        }
        m.harts[1].set_vgein(1);
        m
    }

    #[test]
    fn a_vf_msi_reaches_the_running_guest_through_its_file_without_the_host() {
        let mut m = machine();
        let page = m.params.file_address(1, 1);
        m.iommu.contexts[0] = MsiContext {
            enabled: true,
            mask: 0,
            pattern: 0x1000_0000 >> 12,
            table: vec![MsiPte::Flat { addr: page }],
        };
        let (t, landed) = m.device_msi(0, 0x1000_0000, 40);
        assert!(matches!(t, MsiTranslation::Write { .. }));
        assert_eq!(
            landed,
            Landed::File {
                hart: 1,
                file: 1,
                set: true
            }
        );
        let hgeip = m.hgeip(1);
        assert_eq!(m.harts[1].vs_interrupt(hgeip, 0, true), Some(irq::VSEI));
        assert_eq!(m.harts[1].sgei(hgeip), 0, "no SGEI: hgeie is clear");
        assert_eq!(m.harts[1].vs_csr(VsCsr::Stopei), VsOutcome::Executes);
        assert_eq!(m.imsics[1].guest_mut(1).unwrap().claim(), 40);
        assert_eq!(m.harts[1].vs_interrupt(m.hgeip(1), 0, true), None);
    }

    #[test]
    fn a_wired_source_reaches_a_guest_file_through_the_aplic_in_msi_mode() {
        use super::aplic::{AplicMsi, DOMAINCFG_DM, DOMAINCFG_IE, SOURCECFG_D};
        let mut m = machine();
        for d in 0..2 {
            m.aplic.write_domaincfg(d, DOMAINCFG_IE | DOMAINCFG_DM);
        }
        m.aplic.write_sourcecfg(0, 5, SOURCECFG_D);
        m.aplic.write_sourcecfg(1, 5, 6); // level high
        let to = AplicMsi {
            hart: 1,
            guest: 1,
            eiid: 40,
        };
        m.aplic.write_target(1, 5, to);
        m.aplic.set_enabled(1, 5, true);
        assert_eq!(
            m.wired(5, true),
            Landed::File {
                hart: 1,
                file: 1,
                set: true
            }
        );
        assert_eq!(
            m.harts[1].vs_interrupt(m.hgeip(1), 0, true),
            Some(irq::VSEI)
        );
        // Unrouted: an out-of-range hart is dropped.
        m.aplic.write_target(
            1,
            5,
            AplicMsi {
                hart: 9,
                guest: 0,
                eiid: 1,
            },
        );
        let _ = m.wired(5, false);
        assert_eq!(m.wired(5, true), Landed::Elsewhere);
    }

    #[test]
    fn a_file_whose_vcpu_is_not_loaded_raises_an_sgei_only_where_enabled() {
        let mut m = machine();
        m.harts[1].set_vgein(0); // the vCPU blocked: no file selected
        m.harts[1].hgeie = 1 << 1; // KVM enabled its SGEI
        let addr = m.params.file_address(1, 1) + SETEIPNUM_LE;
        assert!(matches!(m.store(addr, 40), Landed::File { set: true, .. }));
        assert_eq!(m.harts[1].sgei(m.hgeip(1)), 1 << 1);
        assert_eq!(m.harts[0].sgei(m.hgeip(0)), 0, "hart 0 sees nothing");
        assert_eq!(m.harts[1].vs_interrupt(m.hgeip(1), 0, true), None);
    }
}
