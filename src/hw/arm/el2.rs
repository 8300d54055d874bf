//! The EL2 controls of one vCPU and what they decide: the ARM counterpart
//! of the VMCS "outcome" functions in [`crate::hw::x86::vmcs`] (Arm ARM
//! D1.3 "Asynchronous exception routing", HCR_EL2; GICv3 spec §12.1.9 and
//! §12.5 trap controls; did-arm.md §2.1, §2.5, §2.7).
//!
//! HCR_EL2 says where a physical IRQ/FIQ taken while the guest runs goes
//! (IMO/FMO/TGE: to EL2, i.e. an exit), whether WFI/WFE trap (TWI/TWE), and
//! whether the host kernel itself runs at EL2 (E2H: VHE) or KVM is split
//! between a lowvisor at EL2 and a highvisor at EL1, which doubles the
//! world switches of an exit (did-arm.md §2.1: 2 with VHE, 4 split). With
//! IMO = 1 the guest's ICC_* accesses become ICV_* accesses to the virtual
//! CPU interface, without trapping — except what ICH_HCR_EL2 traps (TALL0,
//! TALL1, TC, TDIR) and the SGI-generation registers, which trap to EL2
//! whenever IMO/FMO route interrupts there (how KVM emulates guest SGIs,
//! did-arm.md §2.7). KVM's emulated distributor is not mapped at stage 2,
//! so every guest GICD access is a stage-2 abort: an exit.

use crate::hw::arm::cpu_interface::{IccReg, RegScope};
use crate::hw::arm::vcpu_interface::IchHcr;

/// HCR_EL2 bits the model uses.
pub mod hcr {
    /// VM: stage-2 translation on.
    pub const VM: u64 = 1 << 0;
    /// FMO: physical FIQs to EL2, virtual FIQs enabled.
    pub const FMO: u64 = 1 << 3;
    /// IMO: physical IRQs to EL2, virtual IRQs enabled.
    pub const IMO: u64 = 1 << 4;
    /// TWI: trap WFI.
    pub const TWI: u64 = 1 << 13;
    /// TWE: trap WFE.
    pub const TWE: u64 = 1 << 14;
    /// TGE: trap general exceptions (EL0 is the host's).
    pub const TGE: u64 = 1 << 27;
    /// E2H: the host OS runs at EL2 (VHE).
    pub const E2H: u64 = 1 << 34;
}

/// HCR_EL2, the bits that bear on interrupts, decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HcrEl2 {
    /// VM.
    pub vm: bool,
    /// IMO.
    pub imo: bool,
    /// FMO.
    pub fmo: bool,
    /// TWI.
    pub twi: bool,
    /// TWE.
    pub twe: bool,
    /// E2H.
    pub e2h: bool,
    /// TGE.
    pub tge: bool,
}

impl HcrEl2 {
    /// Decodes the bits above; HCR_EL2's many other controls are ignored.
    pub fn decode(v: u64) -> Self {
        let b = |m: u64| v & m != 0;
        HcrEl2 {
            vm: b(hcr::VM),
            imo: b(hcr::IMO),
            fmo: b(hcr::FMO),
            twi: b(hcr::TWI),
            twe: b(hcr::TWE),
            e2h: b(hcr::E2H),
            tge: b(hcr::TGE),
        }
    }

    /// The bits above as a register value.
    pub fn encode(&self) -> u64 {
        let f = |on: bool, m: u64| if on { m } else { 0 };
        f(self.vm, hcr::VM)
            | f(self.imo, hcr::IMO)
            | f(self.fmo, hcr::FMO)
            | f(self.twi, hcr::TWI)
            | f(self.twe, hcr::TWE)
            | f(self.e2h, hcr::E2H)
            | f(self.tge, hcr::TGE)
    }
}

/// How KVM is laid out across exception levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HypMode {
    /// VHE (E2H = 1): host kernel and KVM at EL2.
    Vhe,
    /// Split mode: lowvisor at EL2, highvisor in the host kernel at EL1.
    Split,
}

/// Where a guest access to an ICC system register goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SysregOutcome {
    /// It traps to EL2 (an exit; ESR_EL2.EC = 0x18).
    Trap,
    /// It is an ICV_* access to the virtual CPU interface (no exit).
    Virtual,
    /// It reaches the physical CPU interface (the guest owns it).
    Physical,
}

/// Where a guest access to the distributor's MMIO frame goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmioOutcome {
    /// Stage-2 data abort: an exit, the hypervisor emulates the access.
    Stage2Abort,
    /// The frame is mapped to the guest; the access reaches the device.
    Direct,
}

/// The EL2 state of one vCPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct El2Controls {
    /// HCR_EL2 as loaded while the vCPU runs.
    pub hcr: HcrEl2,
    /// The hypervisor emulates the distributor (KVM's vgic): GICD is not
    /// mapped at stage 2.
    pub emulated_distributor: bool,
}

impl El2Controls {
    /// KVM on a VHE host, as it runs a guest: VM, IMO, FMO, TWI, TWE, E2H
    /// (TGE clear while the guest runs), emulated distributor.
    pub fn kvm_vhe() -> Self {
        El2Controls {
            hcr: HcrEl2 {
                vm: true,
                imo: true,
                fmo: true,
                twi: true,
                twe: true,
                e2h: true,
                tge: false,
            },
            emulated_distributor: true,
        }
    }

    /// KVM in split (nVHE) mode: the same without E2H.
    pub fn kvm_split() -> Self {
        let mut c = Self::kvm_vhe();
        c.hcr.e2h = false;
        c
    }

    /// The proposal's dedicated-core setup (did-arm.md §2.5): WFI no longer
    /// traps, so an idle vCPU waits in the guest.
    pub fn untrapped_wfi(mut self) -> Self {
        self.hcr.twi = false;
        self
    }

    /// VHE or split.
    pub fn mode(&self) -> HypMode {
        if self.hcr.e2h {
            HypMode::Vhe
        } else {
            HypMode::Split
        }
    }

    /// Context switches for one exit and the entry back (did-arm.md §2.1):
    /// guest → EL2 → guest with VHE; guest → lowvisor → highvisor →
    /// lowvisor → guest in split mode.
    pub fn world_switches_per_exit(&self) -> u32 {
        match self.mode() {
            HypMode::Vhe => 2,
            HypMode::Split => 4,
        }
    }

    /// IMO as it behaves: with TGE set it reads as 1 without E2H and as 0
    /// with E2H (Arm ARM, HCR_EL2.IMO).
    pub fn effective_imo(&self) -> bool {
        if self.hcr.tge {
            !self.hcr.e2h
        } else {
            self.hcr.imo
        }
    }

    /// FMO as it behaves (same rule as [`Self::effective_imo`]).
    pub fn effective_fmo(&self) -> bool {
        if self.hcr.tge {
            !self.hcr.e2h
        } else {
            self.hcr.fmo
        }
    }

    /// Whether a physical IRQ taken while the guest runs exits to EL2
    /// (IMO, or TGE, which routes every physical interrupt to EL2).
    pub fn physical_irq_exits(&self) -> bool {
        self.hcr.tge || self.hcr.imo
    }

    /// Whether a physical FIQ taken while the guest runs exits to EL2.
    pub fn physical_fiq_exits(&self) -> bool {
        self.hcr.tge || self.hcr.fmo
    }

    /// Whether the virtual IRQ from the virtual CPU interface can reach the
    /// guest (IMO set, TGE clear).
    pub fn virtual_irqs_enabled(&self) -> bool {
        self.hcr.imo && !self.hcr.tge
    }

    /// Whether a guest WFI traps to EL2.
    pub fn wfi_traps(&self) -> bool {
        self.hcr.twi
    }

    /// Whether a guest WFE traps to EL2.
    pub fn wfe_traps(&self) -> bool {
        self.hcr.twe
    }

    /// Where a guest (EL1) access to ICC register `reg` goes, given the
    /// vCPU interface's ICH_HCR_EL2 trap bits. SGI-generation registers
    /// trap on TC or whenever IMO (FMO for SGI0R) routes interrupts to EL2;
    /// group registers trap on TALL1/TALL0 and otherwise go to the virtual
    /// interface under IMO/FMO; common ones trap on TC (and DIR writes on
    /// TDIR) and go virtual under IMO or FMO.
    pub fn sysreg_outcome(&self, reg: IccReg, write: bool, ich: &IchHcr) -> SysregOutcome {
        let imo = self.effective_imo();
        let fmo = self.effective_fmo();
        let routed = |trap: bool, virt: bool| {
            if trap {
                SysregOutcome::Trap
            } else if virt {
                SysregOutcome::Virtual
            } else {
                SysregOutcome::Physical
            }
        };
        match reg.scope() {
            RegScope::SgiGeneration => {
                let routed_to_el2 = if reg == IccReg::Sgi0r { fmo } else { imo };
                if ich.tc || routed_to_el2 {
                    SysregOutcome::Trap
                } else {
                    SysregOutcome::Physical
                }
            }
            RegScope::Group1 => routed(ich.tall1, imo),
            RegScope::Group0 => routed(ich.tall0, fmo),
            RegScope::Common => routed(
                ich.tc || (reg == IccReg::Dir && write && ich.tdir),
                imo || fmo,
            ),
        }
    }

    /// Where a guest access to the distributor's MMIO frame goes.
    pub fn distributor_mmio_outcome(&self) -> MmioOutcome {
        if self.emulated_distributor {
            MmioOutcome::Stage2Abort
        } else {
            MmioOutcome::Direct
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hcr_round_trips_and_ignores_other_controls() {
        let c = El2Controls::kvm_vhe();
        let v = c.hcr.encode();
        assert_eq!(
            v,
            hcr::VM | hcr::IMO | hcr::FMO | hcr::TWI | hcr::TWE | hcr::E2H
        );
        assert_eq!(HcrEl2::decode(v | (1 << 31)), c.hcr, "RW is not modelled");
    }

    #[test]
    fn kvm_exits_on_physical_interrupts_and_wfi() {
        for c in [El2Controls::kvm_vhe(), El2Controls::kvm_split()] {
            assert!(c.physical_irq_exits() && c.physical_fiq_exits());
            assert!(c.virtual_irqs_enabled());
            assert!(c.wfi_traps() && c.wfe_traps());
            assert_eq!(c.distributor_mmio_outcome(), MmioOutcome::Stage2Abort);
        }
        assert!(!El2Controls::kvm_vhe().untrapped_wfi().wfi_traps());
        assert!(El2Controls::kvm_vhe().untrapped_wfi().wfe_traps());
    }

    #[test]
    fn world_switches_vhe_vs_split() {
        assert_eq!(El2Controls::kvm_vhe().mode(), HypMode::Vhe);
        assert_eq!(El2Controls::kvm_vhe().world_switches_per_exit(), 2);
        assert_eq!(El2Controls::kvm_split().mode(), HypMode::Split);
        assert_eq!(El2Controls::kvm_split().world_switches_per_exit(), 4);
    }

    #[test]
    fn guest_gic_accesses_go_virtual_except_sgis() {
        let c = El2Controls::kvm_vhe();
        let ich = IchHcr {
            en: true,
            ..IchHcr::default()
        };
        for r in [
            IccReg::Iar1,
            IccReg::Eoir1,
            IccReg::Pmr,
            IccReg::Dir,
            IccReg::Ctlr,
        ] {
            assert_eq!(
                c.sysreg_outcome(r, true, &ich),
                SysregOutcome::Virtual,
                "{r:?}"
            );
        }
        assert_eq!(
            c.sysreg_outcome(IccReg::Sgi1r, true, &ich),
            SysregOutcome::Trap
        );
        // ICH_HCR_EL2 traps.
        let tall1 = IchHcr { tall1: true, ..ich };
        assert_eq!(
            c.sysreg_outcome(IccReg::Iar1, false, &tall1),
            SysregOutcome::Trap
        );
        assert_eq!(
            c.sysreg_outcome(IccReg::Pmr, true, &tall1),
            SysregOutcome::Virtual
        );
        let tdir = IchHcr { tdir: true, ..ich };
        assert_eq!(
            c.sysreg_outcome(IccReg::Dir, true, &tdir),
            SysregOutcome::Trap
        );
        assert_eq!(
            c.sysreg_outcome(IccReg::Eoir1, true, &tdir),
            SysregOutcome::Virtual
        );
        let tc = IchHcr { tc: true, ..ich };
        assert_eq!(
            c.sysreg_outcome(IccReg::Pmr, true, &tc),
            SysregOutcome::Trap
        );
        assert_eq!(
            c.sysreg_outcome(IccReg::Iar1, false, &tc),
            SysregOutcome::Virtual
        );
    }

    #[test]
    fn without_imo_the_guest_owns_the_physical_interface() {
        // An ELI/Directvisor-style partition: interrupts not routed to EL2.
        let mut c = El2Controls::kvm_vhe();
        c.hcr.imo = false;
        c.hcr.fmo = false;
        c.emulated_distributor = false;
        let ich = IchHcr::default();
        assert!(!c.physical_irq_exits());
        assert!(!c.virtual_irqs_enabled());
        assert_eq!(
            c.sysreg_outcome(IccReg::Iar1, false, &ich),
            SysregOutcome::Physical
        );
        assert_eq!(
            c.sysreg_outcome(IccReg::Sgi1r, true, &ich),
            SysregOutcome::Physical
        );
        let tc = IchHcr { tc: true, ..ich };
        assert_eq!(
            c.sysreg_outcome(IccReg::Sgi1r, true, &tc),
            SysregOutcome::Trap
        );
        assert_eq!(c.distributor_mmio_outcome(), MmioOutcome::Direct);
    }

    #[test]
    fn tge_routes_everything_to_el2_and_imo_behaves_by_e2h() {
        let mut c = El2Controls::kvm_vhe();
        c.hcr.tge = true;
        c.hcr.imo = false;
        assert!(c.physical_irq_exits());
        assert!(!c.effective_imo(), "E2H=1: IMO behaves as 0");
        assert!(!c.virtual_irqs_enabled());
        let ich = IchHcr::default();
        assert_eq!(
            c.sysreg_outcome(IccReg::Iar1, false, &ich),
            SysregOutcome::Physical
        );
        c.hcr.e2h = false;
        assert!(c.effective_imo(), "E2H=0: IMO behaves as 1");
    }
}
