//! KVM with APICv (Intel APIC virtualization with posted interrupts), as
//! DID §2.4/§5.9 compares it: virtual interrupts are posted (PIR bit + ON,
//! then a notification IPI with the posted-interrupt vector if the vCPU is
//! in guest mode) and delivered by the CPU from the virtual-APIC page
//! without an exit; EOI is virtualized (no exit unless the vector is in the
//! EOI-exit bitmap). External device interrupts still exit
//! (external-interrupt exiting stays on) and timer register writes still
//! trap. A preempted vCPU's descriptor gets SN set, so posts wait until it
//! is loaded again (upstream `vmx_vcpu_pi_put`).

use super::kvm;
use super::scheme::Scheme;
use super::HvCx;
use crate::hw::x86::lapic::{ApicBitmap, DeliveryMode};
use crate::hw::x86::vmcs::Vmcs;

/// The `apicv` scheme.
#[derive(Default)]
pub struct Apicv {
    /// VT-d posted interrupts for the VF (`hv.vtd_posted_interrupts`): its
    /// IRTE is in posted format, so its interrupts reach a running guest
    /// without an exit.
    pub vtd_posted_interrupts: bool,
}

impl Scheme for Apicv {
    fn name(&self) -> &'static str {
        "apicv"
    }

    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        // The VF's MSI-X is a host IRQ, as in stock KVM, unless VT-d posted
        // interrupts are on (below).
        kvm::setup(cx, vm);
        for &vcpu in &cx.hv.vms[vm].vcpus.clone() {
            let vmcs = Vmcs::kvm_apicv();
            let nv = vmcs.posted_intr_nv;
            cx.m.vmcs[vcpu] = vmcs;
            let core = cx.hv.vcpus[vcpu].core;
            let pi = &mut cx.m.pi_desc[vcpu];
            pi.nv = nv;
            pi.ndst = cx.m.cores[core].apic_id;
        }
        if let (true, Some(a)) = (self.vtd_posted_interrupts, cx.hv.vms[vm].vf) {
            // vmx_update_pi_irte: posted format, the guest's vector, the
            // vCPU's descriptor.
            let vcpu = cx.hv.vms[vm].vcpus[0];
            let irte = a.irte(0, a.guest_vector, DeliveryMode::Fixed);
            if cx.m.irt.write_posted(a.irte, irte, vcpu as u16).is_ok() {
                cx.m.irt.invalidate(a.irte);
            }
            cx.charge(cx.costs.irt_update);
        }
    }

    fn vcpu_load(&mut self, cx: &mut HvCx, vcpu: usize) {
        // vmx_vcpu_pi_load: point NDST at this core, clear SN.
        let core = cx.hv.vcpus[vcpu].core;
        cx.m.pi_desc[vcpu].ndst = cx.m.cores[core].apic_id;
        cx.m.pi_desc[vcpu].sn = false;
        cx.hv.vcpus[vcpu].loaded = true;
    }

    fn vcpu_put(&mut self, cx: &mut HvCx, vcpu: usize) {
        // vmx_vcpu_pi_put for a preempted vCPU: suppress notifications.
        cx.m.pi_desc[vcpu].sn = true;
        cx.hv.vcpus[vcpu].loaded = false;
    }

    /// `vmx_deliver_posted_interrupt`: post, and notify the core if the vCPU
    /// is in guest mode there; otherwise the request is synced at entry.
    fn virtual_interrupt(&mut self, cx: &mut HvCx, vcpu: usize, vector: u8) {
        // The emulated LAPIC's IRR is not the guest's with APICv: the timer
        // path latched the vector there, the virtual-APIC page is what counts.
        cx.hv.vcpus[vcpu].vlapic.irr.clear(vector);
        let notify = cx.m.pi_desc[vcpu].post(vector);
        if notify && cx.in_guest_mode(vcpu) {
            let core = cx.hv.vcpus[vcpu].core;
            let from = cx.hv.designated_core;
            let nv = cx.m.pi_desc[vcpu].nv;
            cx.send_ipi(from, core, nv, DeliveryMode::Fixed);
        }
    }

    /// `vmx_sync_pir_to_irr`: move posted requests into the virtual IRR and
    /// RVI before entry; the CPU delivers them once the guest is
    /// interruptible.
    fn prepare_entry(&mut self, cx: &mut HvCx, vcpu: usize) {
        if cx.m.pi_desc[vcpu].on || !cx.m.pi_desc[vcpu].pir.is_empty() {
            let pir = cx.m.pi_desc[vcpu].take();
            cx.m.vapic[vcpu].sync_pir(pir);
        }
    }

    fn guest_isr(&self, cx: &HvCx, vcpu: usize) -> ApicBitmap {
        cx.m.vapic[vcpu].visr
    }

    /// The posted-interrupt notification vector taken in host mode needs no
    /// work (`kvm_posted_intr_ipi`); the rest is the host IDT.
    fn host_interrupt(&mut self, cx: &mut HvCx, core: usize, vector: u8) {
        if vector != crate::hw::x86::vmcs::KVM_POSTED_INTR_VECTOR {
            self.host_idt(cx, core, vector);
        }
    }
}
