//! The design DID's §2.2 warns against, kept runnable so the invariant
//! checker can be seen to catch it: KVM's emulated-LAPIC injection, but the
//! EOI MSR passed through to the physical LAPIC by the MSR bitmap. The
//! guest's EOIs then hit a LAPIC that never saw the injected interrupt
//! (DID Fig. 3a) and the emulated ISR is never cleared.

use super::kvm;
use crate::hv::scheme::Scheme;
use crate::hv::HvCx;
use crate::hw::x86::lapic::msr;

/// The `naive` scheme: stock KVM (the trait's defaults, so injection and
/// the checker's view go through the emulated LAPIC) with one change.
#[derive(Default)]
pub struct Naive;

impl Scheme for Naive {
    fn name(&self) -> &'static str {
        "naive"
    }

    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        kvm::setup(cx, vm);
        for &vcpu in &cx.hv.vms[vm].vcpus.clone() {
            // Direct EOI without direct delivery: the whole mistake.
            let _ = cx.m.vmcs[vcpu]
                .msr_bitmap
                .set_write_intercept(msr::EOI, false);
        }
    }
}
