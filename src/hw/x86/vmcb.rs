//! AMD SVM's virtual-machine control block (AMD64 APM vol. 2 ch. 15,
//! appendix B): the control-area fields the interrupt path reads. The
//! intercept vectors (INTR, NMI, VINTR, HLT, IOIO_PROT, MSR_PROT), the
//! MSR permission map for the x2APIC registers, the virtual-interrupt
//! fields of V_INTR (V_TPR, V_IRQ, V_INTR_PRIO, V_IGN_TPR, V_INTR_VECTOR),
//! EVENTINJ, the AVIC enables and the #VMEXIT codes, named as Linux's
//! `SVM_EXIT_REASONS` (and so `perf kvm stat` on an AMD host) names them.
//! The sibling of `vmcs.rs`; no hypervisor logic here.

use super::lapic::msr;

/// Why a guest left SVM guest mode: the EXITCODE with the EXITINFO1/2 the
/// handler reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SvmExit {
    /// 0x60 INTR: a physical maskable interrupt with the INTR intercept.
    /// The interrupt stays pending in the LAPIC (SVM has no "acknowledge
    /// on exit"); the host takes it when it sets GIF and RFLAGS.IF.
    Intr,
    /// 0x61 NMI.
    Nmi,
    /// 0x64 VINTR: the guest became able to take the virtual interrupt
    /// V_IRQ requests (KVM's interrupt window).
    Vintr,
    /// 0x78 HLT.
    Hlt,
    /// 0x7B IOIO: an IN/OUT the I/O permission map intercepts.
    Ioio {
        /// The port (EXITINFO1[31:16]).
        port: u16,
    },
    /// 0x7C MSR with EXITINFO1 = 1 (WRMSR).
    MsrWrite {
        /// ECX.
        msr: u32,
        /// EDX:EAX.
        value: u64,
    },
    /// 0x81 VMMCALL.
    Vmmcall {
        /// RAX.
        nr: u32,
        /// RBX.
        arg: u64,
    },
    /// 0x400 NPF: a nested page fault; for an xAPIC guest's store to
    /// its APIC page without AVIC, the register offset and value KVM's
    /// MMIO emulation finds.
    Npf {
        /// (APIC register offset, value) of an APIC-page store.
        apic: Option<(u16, u32)>,
    },
    /// 0x401 AVIC_INCOMPLETE_IPI (APM 15.29.10.2): an ICR write the AVIC
    /// could not complete. EXITINFO1 holds the ICR, EXITINFO2 the cause
    /// (bits 63:32) and the index of the table entry it failed on.
    AvicIncompleteIpi {
        /// The ICR (high:low).
        icr: u64,
        /// Why.
        cause: IncompleteIpiCause,
        /// The physical or logical APIC ID table index it stopped at.
        index: u32,
    },
    /// 0x402 AVIC_UNACCELERATED_ACCESS (APM 15.29.10.3): an access to a
    /// guest APIC register the AVIC does not virtualize. A trap-style exit
    /// comes after the write reached the backing page; a fault-style one
    /// before the instruction completes.
    AvicUnacceleratedAccess {
        /// APIC register offset (EXITINFO1[11:4] << 4).
        offset: u16,
        /// A write (EXITINFO1 bit 32).
        write: bool,
        /// The value written.
        value: u32,
        /// Trap (the write is already in the backing page) or fault.
        trap: bool,
    },
}

/// EXITINFO2[63:32] of an AVIC_INCOMPLETE_IPI exit (APM table 15-24;
/// Linux's `enum avic_ipi_failure_cause`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncompleteIpiCause {
    /// 0: not a fixed, edge-triggered IPI (NMI, INIT, SIPI, level...): the
    /// AVIC delivers only those; nothing was delivered.
    InvalidIntType,
    /// 1: a valid target whose IsRunning was clear: its backing page IRR
    /// was set, but no doorbell went out; software must wake it.
    TargetNotRunning,
    /// 2: a physical ID table entry past the table's limit or not valid,
    /// or a logical ID table entry not valid.
    InvalidTarget,
    /// 3: the target's backing page pointer is not valid.
    InvalidBackingPage,
}

/// The exit codes modelled, in report order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SvmExitCode {
    /// 0x60.
    Intr,
    /// 0x61.
    Nmi,
    /// 0x64.
    Vintr,
    /// 0x78.
    Hlt,
    /// 0x7B.
    Ioio,
    /// 0x7C.
    Msr,
    /// 0x81.
    Vmmcall,
    /// 0x400.
    Npf,
    /// 0x401.
    AvicIncompleteIpi,
    /// 0x402.
    AvicUnacceleratedAccess,
}

impl SvmExitCode {
    /// Every code, report order.
    pub const ALL: [SvmExitCode; 10] = [
        SvmExitCode::Intr,
        SvmExitCode::Nmi,
        SvmExitCode::Vintr,
        SvmExitCode::Hlt,
        SvmExitCode::Ioio,
        SvmExitCode::Msr,
        SvmExitCode::Vmmcall,
        SvmExitCode::Npf,
        SvmExitCode::AvicIncompleteIpi,
        SvmExitCode::AvicUnacceleratedAccess,
    ];

    /// The EXITCODE value (APM appendix C).
    pub fn code(self) -> u32 {
        match self {
            SvmExitCode::Intr => 0x60,
            SvmExitCode::Nmi => 0x61,
            SvmExitCode::Vintr => 0x64,
            SvmExitCode::Hlt => 0x78,
            SvmExitCode::Ioio => 0x7B,
            SvmExitCode::Msr => 0x7C,
            SvmExitCode::Vmmcall => 0x81,
            SvmExitCode::Npf => 0x400,
            SvmExitCode::AvicIncompleteIpi => 0x401,
            SvmExitCode::AvicUnacceleratedAccess => 0x402,
        }
    }

    /// Linux's name for it (`SVM_EXIT_REASONS`, what `perf kvm stat
    /// report` prints on an AMD host).
    pub fn name(self) -> &'static str {
        match self {
            SvmExitCode::Intr => "interrupt",
            SvmExitCode::Nmi => "nmi",
            SvmExitCode::Vintr => "vintr",
            SvmExitCode::Hlt => "hlt",
            SvmExitCode::Ioio => "io",
            SvmExitCode::Msr => "msr",
            SvmExitCode::Vmmcall => "hypercall",
            SvmExitCode::Npf => "npf",
            SvmExitCode::AvicIncompleteIpi => "avic_incomplete_ipi",
            SvmExitCode::AvicUnacceleratedAccess => "avic_unaccelerated_access",
        }
    }

    /// Index into per-code arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl SvmExit {
    /// The EXITCODE.
    pub fn code(&self) -> SvmExitCode {
        match self {
            SvmExit::Intr => SvmExitCode::Intr,
            SvmExit::Nmi => SvmExitCode::Nmi,
            SvmExit::Vintr => SvmExitCode::Vintr,
            SvmExit::Hlt => SvmExitCode::Hlt,
            SvmExit::Ioio { .. } => SvmExitCode::Ioio,
            SvmExit::MsrWrite { .. } => SvmExitCode::Msr,
            SvmExit::Vmmcall { .. } => SvmExitCode::Vmmcall,
            SvmExit::Npf { .. } => SvmExitCode::Npf,
            SvmExit::AvicIncompleteIpi { .. } => SvmExitCode::AvicIncompleteIpi,
            SvmExit::AvicUnacceleratedAccess { .. } => SvmExitCode::AvicUnacceleratedAccess,
        }
    }
}

/// The intercept vectors' bits the interrupt path looks at (VMCB offsets
/// 0x0C and 0x10).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Intercepts {
    /// INTR: physical maskable interrupts exit.
    pub intr: bool,
    /// NMI.
    pub nmi: bool,
    /// VINTR: taking a virtual interrupt exits instead.
    pub vintr: bool,
    /// HLT.
    pub hlt: bool,
    /// IOIO_PROT: IN/OUT consult the I/O permission map (KVM intercepts
    /// every port).
    pub ioio_prot: bool,
    /// MSR_PROT: RDMSR/WRMSR consult the MSR permission map.
    pub msr_prot: bool,
}

/// The write-intercept bits of the MSR permission map for the x2APIC
/// range 0x800-0x8FF (its first 8 KB vector covers MSRs 0-0x1FFF with
/// two bits each; the model keeps the write bit of the x2APIC part). Any
/// other MSR is intercepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsrPermissionMap {
    x2apic_write: [u64; 4],
}

impl Default for MsrPermissionMap {
    /// Everything intercepted (KVM's fresh `msrpm`).
    fn default() -> Self {
        MsrPermissionMap {
            x2apic_write: [u64::MAX; 4],
        }
    }
}

impl MsrPermissionMap {
    /// Sets or clears the write intercept of `m` (an x2APIC MSR; others
    /// stay intercepted).
    pub fn set_write_intercept(&mut self, m: u32, intercept: bool) {
        if let Some(i) = x2apic_index(m) {
            let (w, b) = (i / 64, i % 64);
            if intercept {
                self.x2apic_write[w] |= 1 << b;
            } else {
                self.x2apic_write[w] &= !(1 << b);
            }
        }
    }

    /// Whether a WRMSR of `m` is intercepted.
    pub fn write_intercepted(&self, m: u32) -> bool {
        match x2apic_index(m) {
            Some(i) => self.x2apic_write[i / 64] >> (i % 64) & 1 == 1,
            None => true,
        }
    }
}

fn x2apic_index(m: u32) -> Option<usize> {
    (msr::X2APIC_FIRST..=msr::X2APIC_LAST)
        .contains(&m)
        .then(|| (m - msr::X2APIC_FIRST) as usize)
}

/// An event EVENTINJ injects at the next VMRUN (APM 15.20): only external
/// interrupts (TYPE = 0) are modelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventInj {
    /// VECTOR.
    pub vector: u8,
}

/// One vCPU's VMCB control area, as far as the interrupt path reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vmcb {
    /// The intercept vectors.
    pub intercept: Intercepts,
    /// The MSR permission map (MSRPM_BASE_PA).
    pub msrpm: MsrPermissionMap,
    /// V_TPR: the guest's virtual TPR (bits 3:0 = TPR[7:4]).
    pub v_tpr: u8,
    /// V_IRQ: a virtual interrupt is pending.
    pub v_irq: bool,
    /// V_INTR_PRIO: its priority (bits 3:0).
    pub v_intr_prio: u8,
    /// V_IGN_TPR: take it whatever V_TPR says.
    pub v_ign_tpr: bool,
    /// V_INTR_VECTOR: the vector the guest's IDT dispatches.
    pub v_intr_vector: u8,
    /// V_INTR_MASKING: the guest's RFLAGS.IF masks virtual interrupts
    /// only (KVM sets it).
    pub v_intr_masking: bool,
    /// EVENTINJ: injected at the next VMRUN.
    pub event_inj: Option<EventInj>,
    /// AVIC_ENABLE (V_INTR bit 31): the AVIC backing page, physical and
    /// logical ID tables are in use.
    pub avic_enable: bool,
    /// X2AVIC_ENABLE (V_INTR bit 30): x2APIC MSR accesses are virtualized
    /// through the backing page too.
    pub x2avic_enable: bool,
}

impl Default for Vmcb {
    fn default() -> Self {
        Vmcb::kvm_default()
    }
}

impl Vmcb {
    /// What KVM's `init_vmcb` programs: INTR, NMI, HLT, IOIO_PROT and
    /// MSR_PROT intercepted, V_INTR_MASKING on, every x2APIC MSR write
    /// intercepted, no AVIC.
    pub fn kvm_default() -> Self {
        Vmcb {
            intercept: Intercepts {
                intr: true,
                nmi: true,
                vintr: false,
                hlt: true,
                ioio_prot: true,
                msr_prot: true,
            },
            msrpm: MsrPermissionMap::default(),
            v_tpr: 0,
            v_irq: false,
            v_intr_prio: 0,
            v_ign_tpr: false,
            v_intr_vector: 0,
            v_intr_masking: true,
            event_inj: None,
            avic_enable: false,
            x2avic_enable: false,
        }
    }

    /// Whether a WRMSR of `m` exits.
    pub fn wrmsr_exits(&self, m: u32) -> bool {
        self.intercept.msr_prot && self.msrpm.write_intercepted(m)
    }

    /// The virtual interrupt V_IRQ requests, if the guest takes it now
    /// (APM 15.21.4): V_IRQ set, the guest interruptible, and V_IGN_TPR or
    /// V_INTR_PRIO above V_TPR. With the VINTR intercept it exits instead
    /// (`Err`).
    pub fn virtual_interrupt(&self, guest_if: bool) -> Option<Result<u8, ()>> {
        if !self.v_irq || !guest_if {
            return None;
        }
        if !self.v_ign_tpr && self.v_intr_prio <= self.v_tpr {
            return None;
        }
        Some(if self.intercept.vintr {
            Err(())
        } else {
            Ok(self.v_intr_vector)
        })
    }

    /// The guest took V_IRQ's interrupt: the processor clears V_IRQ.
    pub fn take_virtual_interrupt(&mut self) {
        self.v_irq = false;
    }

    /// KVM's `svm_set_vintr`: a dummy V_IRQ that ignores the TPR, with the
    /// VINTR intercept, so the guest exits as soon as it can take an
    /// interrupt (the interrupt window).
    pub fn request_interrupt_window(&mut self) {
        self.v_irq = true;
        self.v_ign_tpr = true;
        self.v_intr_prio = 0xF;
        self.v_intr_vector = 0;
        self.intercept.vintr = true;
    }

    /// KVM's `svm_clear_vintr`.
    pub fn clear_interrupt_window(&mut self) {
        self.v_irq = false;
        self.intercept.vintr = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_carry_the_numbers_and_names_linux_uses() {
        assert_eq!(SvmExitCode::Intr.code(), 0x60);
        assert_eq!(SvmExitCode::AvicIncompleteIpi.code(), 0x401);
        assert_eq!(SvmExitCode::Msr.name(), "msr");
        assert_eq!(SvmExitCode::Intr.name(), "interrupt");
        assert_eq!(
            SvmExitCode::AvicUnacceleratedAccess.name(),
            "avic_unaccelerated_access"
        );
        for (i, c) in SvmExitCode::ALL.iter().enumerate() {
            assert_eq!(c.index(), i);
        }
        assert_eq!(
            SvmExit::MsrWrite {
                msr: msr::EOI,
                value: 0
            }
            .code(),
            SvmExitCode::Msr
        );
    }

    #[test]
    fn the_msr_permission_map_intercepts_what_its_bits_say() {
        let mut v = Vmcb::kvm_default();
        assert!(v.wrmsr_exits(msr::EOI));
        v.msrpm.set_write_intercept(msr::EOI, false);
        assert!(!v.wrmsr_exits(msr::EOI));
        assert!(v.wrmsr_exits(msr::TMICT));
        // Outside the x2APIC range: always intercepted.
        v.msrpm.set_write_intercept(0x10, false);
        assert!(v.wrmsr_exits(0x10));
        v.intercept.msr_prot = false;
        assert!(!v.wrmsr_exits(msr::TMICT));
    }

    #[test]
    fn v_irq_is_taken_by_priority_and_if_or_exits_with_the_vintr_intercept() {
        let mut v = Vmcb::kvm_default();
        assert_eq!(v.virtual_interrupt(true), None);
        v.v_irq = true;
        v.v_intr_vector = 0x41;
        v.v_intr_prio = 4;
        v.v_tpr = 4;
        assert_eq!(v.virtual_interrupt(true), None, "priority not above V_TPR");
        v.v_tpr = 3;
        assert_eq!(v.virtual_interrupt(false), None, "guest IF clear");
        assert_eq!(v.virtual_interrupt(true), Some(Ok(0x41)));
        v.request_interrupt_window();
        assert_eq!(v.virtual_interrupt(true), Some(Err(())));
        v.clear_interrupt_window();
        assert_eq!(v.virtual_interrupt(true), None);
    }
}
