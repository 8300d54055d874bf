//! A hart's hypervisor-extension state (RISC-V Privileged ISA v1.12 §8
//! and AIA v1.0 §6): the HS-level CSRs that decide what a hart running a
//! guest (V = 1) does with an interrupt or an instruction: take it in VS
//! mode, trap to HS mode (an exit), or wait.
//!
//! - `hstatus.VGEIN` names the guest interrupt file whose signal is the
//!   guest's VS external interrupt (VSEIP); `hstatus.VTW` makes a WFI in VS
//!   mode raise a virtual-instruction exception.
//! - `hideleg` delegates the VS-level interrupts (VSSI, VSTI, VSEI) to VS
//!   mode; `hvip` lets the hypervisor inject each of them by software.
//! - `hgeie` enables, per guest file, the supervisor guest external
//!   interrupt (SGEI) that a file's signal raises at HS level (`hgeip`
//!   is the IMSIC's, [`super::imsic::Imsic::hgeip`]).
//! - `vsie` is the guest's enable of its three interrupts.
//! - `henvcfg.STCE` gives VS mode its own timer compare, `vstimecmp`
//!   (Sstc); without it a VS-mode `stimecmp` access is a virtual
//!   instruction and the guest asks for a timer by the SBI call.

/// Interrupt numbers (`scause` with the interrupt bit, `mip`/`hip` bits).
pub mod irq {
    /// Supervisor software interrupt (the host's IPI without an IMSIC).
    pub const SSI: u32 = 1;
    /// VS-level software interrupt.
    pub const VSSI: u32 = 2;
    /// Supervisor timer interrupt.
    pub const STI: u32 = 5;
    /// VS-level timer interrupt.
    pub const VSTI: u32 = 6;
    /// Supervisor external interrupt.
    pub const SEI: u32 = 9;
    /// VS-level external interrupt.
    pub const VSEI: u32 = 10;
    /// Supervisor guest external interrupt.
    pub const SGEI: u32 = 12;
}

/// Exception codes a guest's trap to HS mode carries in `scause` (the
/// ones KVM RISC-V's `kvm_riscv_vcpu_exit` dispatches on).
pub mod exc {
    /// Illegal instruction.
    pub const ILLEGAL_INSN: u32 = 2;
    /// Environment call from VS mode (an SBI call; KVM's
    /// EXC_SUPERVISOR_SYSCALL).
    pub const VS_ECALL: u32 = 10;
    /// Load guest-page fault (G-stage: an unmapped MMIO read).
    pub const LOAD_GUEST_PAGE_FAULT: u32 = 21;
    /// Virtual instruction (a WFI with VTW, a CSR access VS mode may not
    /// make).
    pub const VIRTUAL_INSN: u32 = 22;
    /// Store/AMO guest-page fault (G-stage: an unmapped MMIO write).
    pub const STORE_GUEST_PAGE_FAULT: u32 = 23;
}

/// `hstatus.VGEIN` (bits 17:12).
pub const HSTATUS_VGEIN_SHIFT: u32 = 12;
/// Its mask after the shift.
pub const HSTATUS_VGEIN_MASK: u64 = 0x3F;
/// `hstatus.VTW` (bit 21).
pub const HSTATUS_VTW: u64 = 1 << 21;
/// `henvcfg.STCE` (bit 63).
pub const HENVCFG_STCE: u64 = 1 << 63;
/// The VS interrupt bits of `hideleg`/`hvip`/`hip`.
pub const VS_BITS: u64 = (1 << irq::VSSI) | (1 << irq::VSTI) | (1 << irq::VSEI);

/// What a VS-mode instruction does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VsOutcome {
    /// It executes in VS mode (no trap).
    Executes,
    /// It raises a virtual-instruction exception to HS mode.
    VirtualInstruction,
}

/// A VS-mode CSR access the hart may virtualize.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VsCsr {
    /// `stimecmp` (becomes `vstimecmp`).
    Stimecmp,
    /// `stopei` (becomes `vstopei`: the guest file VGEIN selects).
    Stopei,
    /// `sireg` (becomes `vsireg`).
    Sireg,
    /// `sip`/`sie` (alias `hvip`/`hie`'s VS bits, always allowed).
    SipSie,
}

/// One hart's H-extension CSRs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HartCsrs {
    /// `hstatus`.
    pub hstatus: u64,
    /// `hideleg`.
    pub hideleg: u64,
    /// `hvip` (VS bits only are writable).
    pub hvip: u64,
    /// `hie`'s SGEIE and `hgeie`: guest files whose SGEI is enabled.
    pub hgeie: u64,
    /// `hvictl` (AIA §6.3.3: VTI, IID; KVM sets IID = 9 with VTI = 0 to
    /// read whether a VS external interrupt is pending).
    pub hvictl: u64,
    /// `vsie`, in `hie` positions (VSSIE bit 2, VSTIE 6, VSEIE 10).
    pub vsie: u64,
    /// `henvcfg`.
    pub henvcfg: u64,
    /// `vstimecmp` (the guest's compare, in `time` units plus
    /// `htimedelta`, which is 0 here).
    pub vstimecmp: u64,
    /// `stimecmp` (the host's own timer).
    pub stimecmp: u64,
    /// GEILEN: bits of `hgeie` that exist.
    pub geilen: u32,
    /// The hart implements Sstc.
    pub sstc: bool,
}

impl HartCsrs {
    /// A hart's reset state: nothing delegated, compares at their maximum
    /// (no timer interrupt), GEILEN `geilen`.
    pub fn new(geilen: usize, sstc: bool) -> Self {
        HartCsrs {
            vstimecmp: u64::MAX,
            stimecmp: u64::MAX,
            geilen: geilen as u32,
            sstc,
            ..Default::default()
        }
    }

    /// `hstatus.VGEIN`.
    pub fn vgein(&self) -> usize {
        (self.hstatus >> HSTATUS_VGEIN_SHIFT & HSTATUS_VGEIN_MASK) as usize
    }

    /// Writes `hstatus.VGEIN`; a value above GEILEN reads back as 0 (the
    /// field is WLRL: KVM only writes implemented numbers).
    pub fn set_vgein(&mut self, g: usize) {
        let g = if g as u32 <= self.geilen { g as u64 } else { 0 };
        self.hstatus = (self.hstatus & !(HSTATUS_VGEIN_MASK << HSTATUS_VGEIN_SHIFT))
            | (g << HSTATUS_VGEIN_SHIFT);
    }

    /// `hstatus.VTW`.
    pub fn vtw(&self) -> bool {
        self.hstatus & HSTATUS_VTW != 0
    }

    /// Sets or clears `hstatus.VTW`.
    pub fn set_vtw(&mut self, on: bool) {
        if on {
            self.hstatus |= HSTATUS_VTW;
        } else {
            self.hstatus &= !HSTATUS_VTW;
        }
    }

    /// `henvcfg.STCE`: VS mode owns `vstimecmp`. Only a hart with Sstc
    /// keeps the bit.
    pub fn stce(&self) -> bool {
        self.sstc && self.henvcfg & HENVCFG_STCE != 0
    }

    /// Sets `henvcfg.STCE` (read-only zero without Sstc).
    pub fn set_stce(&mut self, on: bool) {
        if on && self.sstc {
            self.henvcfg |= HENVCFG_STCE;
        } else {
            self.henvcfg &= !HENVCFG_STCE;
        }
    }

    /// Sets or clears `hvip` bit `irq` (VSSI, VSTI or VSEI).
    pub fn set_hvip(&mut self, irq: u32, on: bool) {
        let b = 1u64 << irq;
        if b & VS_BITS == 0 {
            return;
        }
        if on {
            self.hvip |= b;
        } else {
            self.hvip &= !b;
        }
    }

    /// Whether the guest's VS timer is pending at `time`: `hvip.VSTIP`,
    /// or, with STCE, `time` ≥ `vstimecmp`.
    pub fn vstip(&self, time: u64) -> bool {
        self.hvip & (1 << irq::VSTI) != 0 || (self.stce() && time >= self.vstimecmp)
    }

    /// `hip`'s VS bits at `time` with the IMSIC's `hgeip`: VSSIP from
    /// `hvip`; VSTIP ([`HartCsrs::vstip`]); VSEIP from `hvip` or from the
    /// guest file VGEIN selects.
    pub fn vs_pending(&self, hgeip: u64, time: u64) -> u64 {
        let mut p = self.hvip & ((1 << irq::VSSI) | (1 << irq::VSEI));
        if self.vstip(time) {
            p |= 1 << irq::VSTI;
        }
        let g = self.vgein();
        if g != 0 && hgeip >> g & 1 != 0 {
            p |= 1 << irq::VSEI;
        }
        p
    }

    /// The VS interrupt the guest takes now (its `sstatus.SIE` on is
    /// `sie`): among the delegated, pending and `vsie`-enabled ones, the
    /// highest priority (external, then software, then timer: Privileged
    /// ISA §3.1.9 order SEI, SSI, STI).
    pub fn vs_interrupt(&self, hgeip: u64, time: u64, sie: bool) -> Option<u32> {
        if !sie {
            return None;
        }
        let live = self.vs_pending(hgeip, time) & self.hideleg & self.vsie;
        [irq::VSEI, irq::VSSI, irq::VSTI]
            .into_iter()
            .find(|&i| live >> i & 1 != 0)
    }

    /// The SGEI that traps to HS mode: the guest files that signal and
    /// whose `hgeie` bit is set (`hgeip & hgeie`), as a mask.
    pub fn sgei(&self, hgeip: u64) -> u64 {
        hgeip & self.hgeie & !1
    }

    /// A WFI executed in VS mode.
    pub fn wfi(&self) -> VsOutcome {
        if self.vtw() {
            VsOutcome::VirtualInstruction
        } else {
            VsOutcome::Executes
        }
    }

    /// A VS-mode access to `csr`: `stimecmp` needs STCE; `stopei`/`sireg`
    /// need a VGEIN naming an implemented guest file (AIA §5.3: else a
    /// virtual-instruction exception, which KVM's SW file emulates).
    pub fn vs_csr(&self, csr: VsCsr) -> VsOutcome {
        let ok = match csr {
            VsCsr::Stimecmp => self.stce(),
            VsCsr::Stopei | VsCsr::Sireg => {
                let g = self.vgein();
                g != 0 && g as u32 <= self.geilen
            }
            VsCsr::SipSie => true,
        };
        if ok {
            VsOutcome::Executes
        } else {
            VsOutcome::VirtualInstruction
        }
    }

    /// Whether a WFI in VS mode that did not trap wakes: any interrupt
    /// pending and enabled for the hart, whatever the global enables
    /// (Privileged ISA §3.3.3), the host's own included.
    pub fn wfi_wakes(&self, hgeip: u64, time: u64, host_pending: bool) -> bool {
        host_pending
            || self.sgei(hgeip) != 0
            || self.vs_pending(hgeip, time) & self.hideleg & self.vsie != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guest_hart() -> HartCsrs {
        let mut h = HartCsrs::new(4, true);
        h.hideleg = VS_BITS;
        h.vsie = VS_BITS;
        h
    }

    #[test]
    fn a_guest_file_reaches_the_guest_only_through_vgein() {
        let mut h = guest_hart();
        let hgeip = 1 << 3; // guest file 3 signals
        h.set_vgein(2);
        assert_eq!(h.vs_interrupt(hgeip, 0, true), None, "file 2 is selected");
        h.hgeie = 1 << 3;
        assert_eq!(h.sgei(hgeip), 1 << 3, "file 3's signal is an SGEI for HS");
        h.set_vgein(3);
        assert_eq!(h.vs_interrupt(hgeip, 0, true), Some(irq::VSEI));
        assert!(h.vs_interrupt(hgeip, 0, false).is_none(), "SIE off");
    }

    #[test]
    fn vgein_above_geilen_is_no_file() {
        let mut h = guest_hart();
        h.set_vgein(9);
        assert_eq!(h.vgein(), 0);
        assert_eq!(h.vs_csr(VsCsr::Stopei), VsOutcome::VirtualInstruction);
        h.set_vgein(4);
        assert_eq!(h.vs_csr(VsCsr::Stopei), VsOutcome::Executes);
    }

    #[test]
    fn vstimecmp_needs_sstc_and_stce() {
        let mut h = guest_hart();
        h.vstimecmp = 100;
        assert_eq!(h.vs_csr(VsCsr::Stimecmp), VsOutcome::VirtualInstruction);
        assert!(!h.vstip(200), "without STCE vstimecmp drives nothing");
        h.set_stce(true);
        assert_eq!(h.vs_csr(VsCsr::Stimecmp), VsOutcome::Executes);
        assert!(!h.vstip(99) && h.vstip(100));
        assert_eq!(h.vs_interrupt(0, 150, true), Some(irq::VSTI));
        let mut old = HartCsrs::new(4, false);
        old.set_stce(true);
        assert!(!old.stce(), "no Sstc: STCE is read-only zero");
    }

    #[test]
    fn wfi_traps_only_with_vtw() {
        let mut h = guest_hart();
        assert_eq!(h.wfi(), VsOutcome::Executes);
        h.set_vtw(true);
        assert_eq!(h.wfi(), VsOutcome::VirtualInstruction);
        h.set_vtw(false);
        assert!(!h.wfi_wakes(0, 0, false));
        h.set_hvip(irq::VSSI, true);
        assert!(h.wfi_wakes(0, 0, false));
    }

    #[test]
    fn hvip_injects_and_external_wins_priority() {
        let mut h = guest_hart();
        h.set_hvip(irq::VSSI, true);
        h.set_hvip(irq::SEI, true); // not a VS bit: ignored
        assert_eq!(h.hvip, 1 << irq::VSSI);
        assert_eq!(h.vs_interrupt(0, 0, true), Some(irq::VSSI));
        h.set_hvip(irq::VSEI, true);
        assert_eq!(h.vs_interrupt(0, 0, true), Some(irq::VSEI));
        h.hideleg = 0;
        assert_eq!(h.vs_interrupt(0, 0, true), None, "not delegated");
    }
}
