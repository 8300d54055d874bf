//! ELVIS — ELI for paravirtual I/O (IBM's vhost polling patches,
//! `docs/papers.md` (ELI and ELVIS in IBM's public code, §4); DID Table 1: "ELVIS:
//! guest modification yes").
//!
//! Two mechanisms on top of [`Eli`]:
//! * **Side-core polling**: the vhost worker runs on a dedicated host core
//!   and polls the guest's virtqueues (`vhost_vq_enable_vqpoll`): guest
//!   notifications stay disabled, so the guest never kicks (no
//!   IO_INSTRUCTION exits), and new buffers are seen within one poll
//!   iteration.
//! * **Exitless PV interrupts**: the back end's completion goes to the
//!   guest's core as a physical IPI with the device's vector, which the
//!   shadow IDT marks as the guest's own, so it is taken and completed
//!   (direct EOI) in guest mode — IBM's PV posted interrupts deliver the
//!   same way through a notification vector and a guest patch. When the
//!   vCPU is not in direct mode (exited, descheduled, or injecting), the
//!   interrupt is injected the ELI way. Every VM's devices use the same
//!   vectors, so an IPI still in flight when its vCPU is switched out
//!   must land in host mode before another VM enters the core (as DID's,
//!   docs/papers.md DID open point 1).

use super::eli::Eli;
use super::kvm;
use crate::hv::exits::ExitInfo;
use crate::hv::host::InFlightIpis;
use crate::hv::scheme::{ExitOutcome, Scheme};
use crate::hv::HvCx;
use crate::hw::x86::lapic::{ApicBitmap, DeliveryMode};

/// The `elvis` scheme.
#[derive(Default)]
pub struct Elvis {
    eli: Eli,
    /// The PV IPIs sent to running vCPUs' cores.
    in_flight: InFlightIpis,
}

impl Elvis {
    /// ELVIS on ELI with protection 3 done by `critical`.
    pub fn new(critical: super::eli::Critical) -> Self {
        Elvis {
            eli: Eli::new(critical),
            in_flight: InFlightIpis::default(),
        }
    }

    fn pv_vector(cx: &HvCx, vcpu: usize, vector: u8) -> bool {
        let vm = cx.hv.vcpus[vcpu].vm;
        cx.hv.vms[vm].pv_vectors.contains(&vector)
    }
}

impl Scheme for Elvis {
    fn name(&self) -> &'static str {
        "elvis"
    }

    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        self.eli.setup_vm(cx, vm);
        self.in_flight.resize(cx.m.cores.len());
        // The paravirtual devices' vectors belong to the guest: present in
        // the shadow IDT, so their IPIs reach its handlers.
        let vectors = cx.hv.vms[vm].pv_vectors.clone();
        for &vcpu in &cx.hv.vms[vm].vcpus.clone() {
            for &v in &vectors {
                cx.m.shadow_idt[vcpu].copy_gate(v, v);
            }
        }
    }

    fn handle_exit(&mut self, cx: &mut HvCx, vcpu: usize, info: ExitInfo) -> ExitOutcome {
        self.eli.handle_exit(cx, vcpu, info)
    }

    fn virtual_interrupt(&mut self, cx: &mut HvCx, vcpu: usize, vector: u8) {
        if Self::pv_vector(cx, vcpu, vector)
            && cx.in_guest_mode(vcpu)
            && !self.eli.in_injection_mode(vcpu)
        {
            let core = cx.hv.vcpus[vcpu].core;
            let from = cx.hv.designated_core;
            cx.send_ipi(from, core, vector, DeliveryMode::Fixed);
            let (now, timing) = (cx.now, cx.costs.ipi_timing());
            self.in_flight.sent(core, now, timing, vector, vcpu);
        } else {
            kvm::raise(cx, vcpu, vector);
        }
    }

    /// A PV IPI that reached the core after the vCPU left guest mode (or
    /// while it injects, or after its schedule-out) is taken by the host
    /// and injected.
    fn host_interrupt(&mut self, cx: &mut HvCx, core: usize, vector: u8) {
        // A PV IPI sent for a vCPU is that vCPU's, whoever holds the core
        // now.
        if let Some(vcpu) = self.in_flight.landed_for(core, vector, cx.now) {
            kvm::raise(cx, vcpu, vector);
            return;
        }
        if let Some(vcpu) = cx.hv.vcpu_owning(core) {
            if Self::pv_vector(cx, vcpu, vector) {
                kvm::raise(cx, vcpu, vector);
                return;
            }
        }
        self.host_idt(cx, core, vector);
    }

    /// The PV IPIs that landed for `vcpu` were taken; those in flight
    /// land in host mode (no other VM enters first: `entry_quiesce`).
    fn vcpu_put(&mut self, cx: &mut HvCx, vcpu: usize) {
        let core = cx.hv.vcpus[vcpu].core;
        self.in_flight.forget_landed(core, vcpu, cx.now);
        cx.hv.vcpus[vcpu].loaded = false;
    }

    /// Another vCPU enters this core only once every PV IPI sent here for
    /// a vCPU switched out has landed.
    fn entry_quiesce(&self, cx: &HvCx, vcpu: usize) -> crate::engine::Time {
        let core = cx.hv.vcpus[vcpu].core;
        self.in_flight.quiesce(core, vcpu, cx.now)
    }

    /// Records past their bound are consumed unless IRR still holds them
    /// (InFlightIpis::forget_consumed).
    fn prepare_entry(&mut self, cx: &mut HvCx, vcpu: usize) {
        let core = cx.hv.vcpus[vcpu].core;
        self.in_flight
            .forget_consumed(core, cx.now, &cx.m.lapics[core].irr);
        self.eli.prepare_entry(cx, vcpu)
    }

    fn guest_isr(&self, cx: &HvCx, vcpu: usize) -> ApicBitmap {
        self.eli.guest_isr(cx, vcpu)
    }

    fn preemptible(&self, cx: &HvCx, vcpu: usize) -> bool {
        self.eli.preemptible(cx, vcpu)
    }

    fn backend_polls(&self) -> bool {
        true
    }

    fn send_host_ipi(&mut self, cx: &mut HvCx, from: usize, to: usize, vector: u8) {
        self.eli.send_host_ipi(cx, from, to, vector)
    }

    fn host_nmi(&mut self, cx: &mut HvCx, core: usize) {
        self.eli.host_nmi(cx, core)
    }

    fn reset_metrics(&mut self) {
        self.eli.reset_metrics()
    }

    fn metrics(&self, out: &mut crate::guest::app::Metrics) {
        self.eli.metrics(out)
    }
}
