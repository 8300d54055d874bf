//! VM-exit reasons (KVM's names) and per-VM exit accounting.

use crate::engine::{Summary, Time};
use serde::Serialize;

/// The VM-exit reasons the model produces, named as KVM's tracepoints and
/// `perf kvm stat` name them (basic exit reason numbers from the SDM).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
pub enum ExitReason {
    /// 0: an exception or NMI arrived (NMI exiting, exception bitmap).
    EXCEPTION_NMI,
    /// 1: a maskable external interrupt arrived with external-interrupt exiting on.
    EXTERNAL_INTERRUPT,
    /// 7: interrupt-window exiting: the guest became interruptible.
    PENDING_INTERRUPT,
    /// 12: HLT with HLT exiting on.
    HLT,
    /// 30: IN/OUT to an intercepted port.
    IO_INSTRUCTION,
    /// 31: RDMSR of an intercepted MSR.
    MSR_READ,
    /// 32: WRMSR of an intercepted MSR.
    MSR_WRITE,
    /// 45: EOI virtualization of a vector set in the EOI-exit bitmap.
    EOI_INDUCED,
    /// 48: guest-physical access not allowed by EPT.
    EPT_VIOLATION,
    /// 52: the VMX preemption timer counted down to zero.
    PREEMPTION_TIMER,
    /// 44: an access to the APIC-access page (an xAPIC guest's LAPIC
    /// MMIO) that is not virtualized.
    APIC_ACCESS,
    /// 56: a virtualized APIC-page write that needs emulation (trap-like).
    APIC_WRITE,
    /// 18: VMCALL (a hypercall).
    VMCALL,
}

impl ExitReason {
    /// Every reason, in report order.
    pub const ALL: [ExitReason; ExitReason::COUNT] = [
        ExitReason::EXCEPTION_NMI,
        ExitReason::EXTERNAL_INTERRUPT,
        ExitReason::PENDING_INTERRUPT,
        ExitReason::HLT,
        ExitReason::IO_INSTRUCTION,
        ExitReason::MSR_READ,
        ExitReason::MSR_WRITE,
        ExitReason::EOI_INDUCED,
        ExitReason::EPT_VIOLATION,
        ExitReason::PREEMPTION_TIMER,
        ExitReason::APIC_ACCESS,
        ExitReason::APIC_WRITE,
        ExitReason::VMCALL,
    ];

    /// Number of reasons modelled.
    pub const COUNT: usize = 13;

    /// KVM's name for the reason.
    pub fn name(self) -> &'static str {
        match self {
            ExitReason::EXCEPTION_NMI => "EXCEPTION_NMI",
            ExitReason::EXTERNAL_INTERRUPT => "EXTERNAL_INTERRUPT",
            ExitReason::PENDING_INTERRUPT => "PENDING_INTERRUPT",
            ExitReason::HLT => "HLT",
            ExitReason::IO_INSTRUCTION => "IO_INSTRUCTION",
            ExitReason::MSR_READ => "MSR_READ",
            ExitReason::MSR_WRITE => "MSR_WRITE",
            ExitReason::EOI_INDUCED => "EOI_INDUCED",
            ExitReason::EPT_VIOLATION => "EPT_VIOLATION",
            ExitReason::PREEMPTION_TIMER => "PREEMPTION_TIMER",
            ExitReason::APIC_ACCESS => "APIC_ACCESS",
            ExitReason::APIC_WRITE => "APIC_WRITE",
            ExitReason::VMCALL => "VMCALL",
        }
    }

    /// Index into per-reason arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// What caused an exit, with the exit-qualification data a handler reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitInfo {
    /// NMI exit (the vector is always 2; the source is found in software).
    Nmi,
    /// External interrupt.
    ExternalInterrupt {
        /// With the VM-exit control "acknowledge interrupt on exit", the
        /// vector the processor acknowledged from the LAPIC as it exited
        /// (valid in the exit interruption-information field, SDM 27.2.2).
        /// None without it: the interrupt is still requested in the LAPIC
        /// and the host takes it when it enables interrupts.
        vector: Option<u8>,
    },
    /// Interrupt window opened.
    PendingInterrupt,
    /// WRMSR.
    MsrWrite {
        /// ECX.
        msr: u32,
        /// EDX:EAX.
        value: u64,
    },
    /// IN/OUT: the exit qualification names the port.
    IoInstruction {
        /// I/O port.
        port: u16,
    },
    /// EPT violation.
    EptViolation,
    /// Preemption timer.
    PreemptionTimer,
    /// An exception in the exception bitmap, raised while delivering an
    /// event (IDT-vectoring information holds the interrupt being delivered).
    Exception {
        /// The exception vector (#NP = 11).
        vector: u8,
        /// The external interrupt whose delivery faulted, if any.
        idt_vectoring: Option<u8>,
    },
    /// EOI-induced exit after EOI virtualization cleared `vector`.
    EoiInduced {
        /// The vector whose EOI-exit-bitmap bit is set.
        vector: u8,
    },
    /// HLT with "HLT exiting" on.
    Hlt,
    /// An xAPIC guest's store to its LAPIC page that exits as an APIC
    /// access (fault-like: the handler decodes the instruction).
    ApicAccess {
        /// Register offset in the APIC page (0xB0 = EOI).
        offset: u16,
        /// The value stored.
        value: u32,
    },
    /// A store written to the virtual-APIC page that then exits as an
    /// APIC write (trap-like).
    ApicWrite {
        /// Register offset.
        offset: u16,
        /// The value written.
        value: u32,
    },
    /// VMCALL: a hypercall (RAX, RBX).
    Vmcall {
        /// Hypercall number (RAX).
        nr: u32,
        /// Argument (RBX).
        arg: u64,
    },
}

impl ExitInfo {
    /// For an APIC-page store, the x2APIC MSR of the same register (the
    /// emulated LAPIC handles both the same way).
    pub fn apic_msr(&self) -> Option<(u32, u64)> {
        match *self {
            ExitInfo::ApicAccess { offset, value } | ExitInfo::ApicWrite { offset, value } => {
                Some((0x800 + u32::from(offset >> 4), u64::from(value)))
            }
            _ => None,
        }
    }

    /// The basic exit reason.
    pub fn reason(&self) -> ExitReason {
        match self {
            ExitInfo::Nmi | ExitInfo::Exception { .. } => ExitReason::EXCEPTION_NMI,
            ExitInfo::ExternalInterrupt { .. } => ExitReason::EXTERNAL_INTERRUPT,
            ExitInfo::PendingInterrupt => ExitReason::PENDING_INTERRUPT,
            ExitInfo::MsrWrite { .. } => ExitReason::MSR_WRITE,
            ExitInfo::IoInstruction { .. } => ExitReason::IO_INSTRUCTION,
            ExitInfo::EptViolation => ExitReason::EPT_VIOLATION,
            ExitInfo::PreemptionTimer => ExitReason::PREEMPTION_TIMER,
            ExitInfo::EoiInduced { .. } => ExitReason::EOI_INDUCED,
            ExitInfo::Hlt => ExitReason::HLT,
            ExitInfo::ApicAccess { .. } => ExitReason::APIC_ACCESS,
            ExitInfo::ApicWrite { .. } => ExitReason::APIC_WRITE,
            ExitInfo::Vmcall { .. } => ExitReason::VMCALL,
        }
    }
}

/// Exit accounting of one VM: service time (exit to next entry) per reason,
/// and the time spent in guest mode.
#[derive(Clone, Debug, Default)]
pub struct ExitStats {
    /// Per-reason service-time summaries, indexed by `ExitReason::index`.
    pub by_reason: [Summary; ExitReason::COUNT],
    /// Total time in guest mode (VM entry to the next exit).
    pub guest_time: Time,
    /// Service-time summaries of the exits ES2 counts, by its causes
    /// (indexed as [`super::es2::Cause::ALL`]).
    pub by_cause: [Summary; 3],
}

impl ExitStats {
    /// Records one completed exit.
    #[inline]
    pub fn record(&mut self, reason: ExitReason, service: Time) {
        self.by_reason[reason.index()].record(service);
    }

    /// Records one completed exit, by its reason and its ES2 cause.
    #[inline]
    pub fn record_info(&mut self, info: &ExitInfo, service: Time) {
        self.record(info.reason(), service);
        if let Some(c) = super::es2::Cause::of(info) {
            self.by_cause[c as usize].record(service);
        }
    }

    /// All exits.
    pub fn total(&self) -> Summary {
        let mut s = Summary::default();
        for r in &self.by_reason {
            s.merge(r);
        }
        s
    }
}

/// The guest events an exit can be charged to: the rows of did-arm.md
/// §3's exits-per-event table, for every architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventClass {
    /// The guest programs its timer.
    TimerProgram,
    /// Its timer expires.
    TimerExpiry,
    /// It ends an interrupt.
    Eoi,
    /// A device interrupt for it.
    Device,
    /// One of its vCPUs IPIs another.
    VcpuIpi,
    /// The host sends a virtual interrupt to one of its vCPUs from another
    /// core.
    HostIpi,
    /// It idles (WFI).
    Idle,
    /// An exit no guest event explains (a maintenance interrupt, a host
    /// interrupt of its own).
    Other,
}

impl EventClass {
    /// Every class, table order.
    pub const ALL: [EventClass; 8] = [
        EventClass::TimerProgram,
        EventClass::TimerExpiry,
        EventClass::Eoi,
        EventClass::Device,
        EventClass::VcpuIpi,
        EventClass::HostIpi,
        EventClass::Idle,
        EventClass::Other,
    ];

    /// Metric key.
    pub fn key(self) -> &'static str {
        match self {
            EventClass::TimerProgram => "timer_program",
            EventClass::TimerExpiry => "timer_expiry",
            EventClass::Eoi => "eoi",
            EventClass::Device => "device",
            EventClass::VcpuIpi => "vcpu_ipi",
            EventClass::HostIpi => "host_ipi",
            EventClass::Idle => "idle",
            EventClass::Other => "other",
        }
    }

    /// Index into per-class arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_maps_to_reason_and_stats_accumulate() {
        assert_eq!(
            ExitInfo::MsrWrite {
                msr: 0x80b,
                value: 0
            }
            .reason(),
            ExitReason::MSR_WRITE
        );
        assert_eq!(
            ExitInfo::ExternalInterrupt { vector: Some(0x41) }
                .reason()
                .name(),
            "EXTERNAL_INTERRUPT"
        );
        let mut s = ExitStats::default();
        s.record(ExitReason::MSR_WRITE, 850_000);
        s.record(ExitReason::EXTERNAL_INTERRUPT, 1_970_000);
        s.record(ExitReason::MSR_WRITE, 850_000);
        assert_eq!(s.by_reason[ExitReason::MSR_WRITE.index()].count, 2);
        assert_eq!(s.total().count, 3);
        assert_eq!(s.total().total, 3_670_000);
        for (i, r) in ExitReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }
}
