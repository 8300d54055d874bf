//! The x86 instructions a guest kernel's platform operations become (see
//! `crate::guest::KernelOp` and `world::vmx::lower`): what the processor
//! executes in VMX non-root mode, where the VMCS decides whether it exits.

use crate::engine::Time;
use crate::guest::VfReg;

/// A privileged x86 instruction of the guest; the hardware decides whether
/// it exits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Instr {
    /// WRMSR 0x80B (x2APIC EOI), completing the handler of `vector`.
    Eoi {
        /// The vector the guest believes it completes.
        vector: u8,
    },
    /// WRMSR to TMICT (one-shot mode) or IA32_TSC_DEADLINE (TSC-deadline
    /// mode) for the guest's next clockevent. `deadline` is the expiry the
    /// guest expects (None = stop).
    ArmTimer {
        /// TMICT or IA32_TSC_DEADLINE.
        msr: u32,
        /// Initial count, or the TSC deadline.
        value: u64,
        /// Expected expiry.
        deadline: Option<Time>,
        /// Timer vector (for the checker).
        vector: u8,
    },
    /// OUT to an I/O port (a virtio queue notify).
    PioWrite {
        /// Port.
        port: u16,
        /// Value written (the queue index for QUEUE_NOTIFY).
        value: u32,
    },
    /// Any other WRMSR.
    WrMsr {
        /// MSR index.
        msr: u32,
        /// Value.
        value: u64,
    },
    /// HLT (with interrupts on: the idle loop's `sti; hlt`).
    Hlt,
    /// MMIO write to the VF's BAR (mapped into the guest: never exits).
    VfWrite {
        /// VF.
        vf: u16,
        /// Register.
        reg: VfReg,
    },
    /// VMCALL at CPL 0: RAX = hypercall number, RBX = argument (KVM's
    /// `kvm_emulate_hypercall` ABI). In VMX non-root mode it always exits.
    Vmcall {
        /// RAX.
        nr: u32,
        /// RBX.
        arg: u64,
    },
    /// `lock bts` of bit `vector` in the PIR of the posted-interrupt
    /// descriptor page of the guest's CPU `cpu`, a page of guest memory
    /// after the hypervisor moved the descriptor there
    /// (did-implementation.md §2 `osnet_map_pid`, §3). A store: never exits.
    PirSet {
        /// The guest CPU whose descriptor page it is.
        cpu: u32,
        /// The bit set.
        vector: u8,
    },
    /// Directvisor's replacement `send_IPI` (did-implementation.md §3):
    /// `lock bts` of `vector` in CPU `cpu`'s descriptor page, then WRMSR
    /// ICR with the posted-interrupt notification vector to that CPU's
    /// APIC ID as the guest read it from its x2APIC ID register.
    PostedIpi {
        /// Target guest CPU.
        cpu: u32,
        /// The vector set in its PIR.
        vector: u8,
    },
}
