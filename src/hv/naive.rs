//! The design DID's §2.2 warns against, kept runnable so the invariant
//! checker can be seen to catch it: KVM's emulated-LAPIC injection, but the
//! EOI MSR passed through to the physical LAPIC by the MSR bitmap. The
//! guest's EOIs then hit a LAPIC that never saw the injected interrupt
//! (DID Fig. 3a) and the emulated ISR is never cleared.

use super::exits::ExitInfo;
use super::kvm::Kvm;
use super::scheme::{ExitOutcome, Scheme};
use super::vlapic;
use super::HvCx;
use crate::hw::x86::lapic::{msr, ApicBitmap};

/// The `naive` scheme.
#[derive(Default)]
pub struct Naive;

impl Scheme for Naive {
    fn name(&self) -> &'static str {
        "naive"
    }

    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        Kvm::setup(cx, vm);
        for &vcpu in &cx.hv.vms[vm].vcpus.clone() {
            // Direct EOI without direct delivery: the whole mistake.
            let _ = cx.m.vmcs[vcpu]
                .msr_bitmap
                .set_write_intercept(msr::EOI, false);
        }
    }

    fn handle_exit(&mut self, cx: &mut HvCx, vcpu: usize, info: ExitInfo) -> ExitOutcome {
        Kvm::exit(self, cx, vcpu, info)
    }

    fn virtual_interrupt(&mut self, cx: &mut HvCx, vcpu: usize, vector: u8) {
        Kvm::raise(cx, vcpu, vector);
    }

    fn prepare_entry(&mut self, cx: &mut HvCx, vcpu: usize) {
        vlapic::inject_pending(cx, vcpu);
    }

    fn guest_isr(&self, cx: &HvCx, vcpu: usize) -> ApicBitmap {
        // Injection goes through the emulated LAPIC, so that is the ISR the
        // guest's handlers depend on.
        cx.hv.vcpus[vcpu].vlapic.isr
    }
}
