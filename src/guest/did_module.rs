//! The DID authors' guest module (`kangdazhi/big` guest `did/did.c`,
//! `Xivid/big` guest@81b75d8; did-implementation.md §3): the hypercall
//! numbers of `osnet_additional_hc.h` it issues, in the order the
//! multi-VM branch's `did.sh` enables them (§5). The kernel runs it on
//! each CPU at boot when its configuration says the module is loaded.

/// `SETUP_DTID(gpa of the guest's PID page)`: map the descriptor onto the
/// page, HLT exiting off, TMICT/TMCCT/TDCR pass through, physical LVTT on
/// the notification vector (§2 hypercall 100).
pub const HC_SETUP_DTID: u32 = 100;
/// `RESTORE_DTID` (§2 hypercall 101).
pub const HC_RESTORE_DTID: u32 = 101;
/// `SET_X2APIC_ID`: the virtual x2APIC ID := the physical APIC ID of the
/// current pCPU (§2 hypercall 300).
pub const HC_SET_X2APIC_ID: u32 = 300;
/// `RESTORE_X2APIC_ID` (§2 hypercall 301).
pub const HC_RESTORE_X2APIC_ID: u32 = 301;
/// `DISABLE_INTERCEPT_WRMSR_ICR`: ICR writes pass through (§2 hypercall 302).
pub const HC_DISABLE_INTERCEPT_WRMSR_ICR: u32 = 302;
/// `ENABLE_INTERCEPT_WRMSR_ICR` (§2 hypercall 303).
pub const HC_ENABLE_INTERCEPT_WRMSR_ICR: u32 = 303;

/// What the module does at step `stage` of its per-CPU enable
/// (X 81b75d8 order, did-implementation.md §5): 300, 100, the PIR timer
/// bit, the first direct TMICT write (the kernel's), then 302.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnableStep {
    /// Issue this hypercall with the CPU's number as its argument (for
    /// 100 it names the CPU's PID page).
    Hypercall(u32),
    /// Set the timer vector in this CPU's PIR (`hc_setup_dtid`, before the
    /// TMICT write).
    PirTimerBit,
    /// Write TMICT for the next event, now straight to the hardware; from
    /// here on the CPU's IPIs are posted (`set_apic_ipi`).
    ArmTimer,
    /// Done.
    Done,
}

/// Step `stage` of the per-CPU enable.
pub fn enable_step(stage: u8) -> EnableStep {
    match stage {
        0 => EnableStep::Hypercall(HC_SET_X2APIC_ID),
        1 => EnableStep::Hypercall(HC_SETUP_DTID),
        2 => EnableStep::PirTimerBit,
        3 => EnableStep::ArmTimer,
        4 => EnableStep::Hypercall(HC_DISABLE_INTERCEPT_WRMSR_ICR),
        _ => EnableStep::Done,
    }
}
