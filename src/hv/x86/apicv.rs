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
use crate::hv::scheme::Scheme;
use crate::hv::HvCx;
use crate::hw::x86::lapic::{ApicBitmap, DeliveryMode};
use crate::hw::x86::vmcs::Vmcs;

/// KVM's `POSTED_INTR_WAKEUP_VECTOR`: a blocked vCPU's descriptor notifies
/// the host with it.
pub const POSTED_INTR_WAKEUP_VECTOR: u8 = 0xF1;

/// The `Scheme` methods a scheme built on stock APICv (a field `apicv:
/// Apicv`) keeps unchanged: vCPU load and put, blocking and unblocking
/// (the PI descriptor's NDST, SN and wake-up vector), KVM's virtual
/// interrupts (posted), the guest's ISR (the virtual-APIC page). kvm-2026
/// and directvisor expand it inside their `impl Scheme`.
macro_rules! apicv_passthrough {
    () => {
        fn vcpu_load(&mut self, cx: &mut $crate::hv::HvCx, vcpu: usize) {
            self.apicv.vcpu_load(cx, vcpu)
        }

        fn vcpu_put(&mut self, cx: &mut $crate::hv::HvCx, vcpu: usize) {
            self.apicv.vcpu_put(cx, vcpu)
        }

        fn vcpu_blocking(&mut self, cx: &mut $crate::hv::HvCx, vcpu: usize) {
            self.apicv.vcpu_blocking(cx, vcpu)
        }

        fn vcpu_unblocking(&mut self, cx: &mut $crate::hv::HvCx, vcpu: usize) {
            self.apicv.vcpu_unblocking(cx, vcpu)
        }

        fn virtual_interrupt(&mut self, cx: &mut $crate::hv::HvCx, vcpu: usize, vector: u8) {
            self.apicv.virtual_interrupt(cx, vcpu, vector)
        }

        fn guest_isr(
            &self,
            cx: &$crate::hv::HvCx,
            vcpu: usize,
        ) -> $crate::hw::x86::lapic::ApicBitmap {
            self.apicv.guest_isr(cx, vcpu)
        }
    };
}
pub(crate) use apicv_passthrough;

/// The `apicv` scheme.
#[derive(Default)]
pub struct Apicv {
    /// VT-d posted interrupts for the VF (`hv.vtd_posted_interrupts`): its
    /// IRTE is in posted format, so its interrupts reach a running guest
    /// without an exit.
    pub vtd_posted_interrupts: bool,
    /// Per vCPU: halted with its descriptor on the wakeup vector.
    blocked: Vec<bool>,
    /// Per core: the blocked vCPUs whose descriptor names it (NDST), in
    /// increasing order (Linux's per-CPU `blocked_vcpu_on_cpu` list): the
    /// wakeup handler looks at these, not at every vCPU.
    blocked_on: Vec<Vec<usize>>,
    /// Per vCPU: the core whose list holds it while blocked.
    blocked_at: Vec<usize>,
}

impl Apicv {
    /// APICv, with VT-d posted interrupts for the VF if asked.
    pub fn new(vtd_posted_interrupts: bool) -> Self {
        Apicv {
            vtd_posted_interrupts,
            blocked: Vec::new(),
            blocked_on: Vec::new(),
            blocked_at: Vec::new(),
        }
    }
}

impl Apicv {
    /// Blocked `vcpu`'s descriptor now names `core`: it moves to that
    /// core's list.
    fn list_blocked(&mut self, vcpu: usize, core: usize) {
        self.unlist_blocked(vcpu);
        let l = &mut self.blocked_on[core];
        let i = l.partition_point(|&v| v < vcpu);
        l.insert(i, vcpu);
        self.blocked_at[vcpu] = core;
    }

    /// Takes `vcpu` off its core's list, if it is blocked.
    fn unlist_blocked(&mut self, vcpu: usize) {
        if self.blocked[vcpu] {
            let l = &mut self.blocked_on[self.blocked_at[vcpu]];
            if let Some(i) = l.iter().position(|&v| v == vcpu) {
                l.remove(i);
            }
        }
    }

    /// ES2's redirection for VT-d posted interrupts (docs/papers.md ES2,
    /// §2.8 of the digest): the VF's posted-format IRTE is pointed at the
    /// descriptor of the vCPU redirection picks now, rewritten (and its
    /// cache entry invalidated) only when the pick changes.
    fn redirect_posted_irte(&self, cx: &mut HvCx, vm: usize) {
        if !self.vtd_posted_interrupts {
            return;
        }
        let (Some(a), Some(target)) = (cx.hv.vms[vm].vf, cx.hv.posted_irte_target(vm)) else {
            return;
        };
        if cx.m.irt.posted_descriptor(a.irte) == Some(target as u16) {
            return;
        }
        let irte = a.irte(0, a.guest_vector, DeliveryMode::Fixed);
        if cx.m.irt.write_posted(a.irte, irte, target as u16).is_ok() {
            cx.m.irt.invalidate(a.irte);
        }
        cx.charge(cx.costs.irt_update);
    }
}

impl Scheme for Apicv {
    fn name(&self) -> &'static str {
        "apicv"
    }

    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        // The VF's MSI-X is a host IRQ, as in stock KVM, unless VT-d posted
        // interrupts are on (below).
        kvm::setup(cx, vm);
        self.blocked.resize(cx.hv.vcpus.len(), false);
        self.blocked_at.resize(cx.hv.vcpus.len(), 0);
        if self.blocked_on.len() != cx.m.cores.len() {
            // Room for every vCPU that starts on the core, so blocking
            // does not allocate on the event loop.
            self.blocked_on = (0..cx.m.cores.len())
                .map(|c| Vec::with_capacity(cx.hv.on_core[c].len() + 1))
                .collect();
        }
        let xapic = cx.hv.vms[vm].xapic;
        for &vcpu in &cx.hv.vms[vm].vcpus.clone() {
            let mut vmcs = Vmcs::kvm_apicv();
            vmcs.set_virtual_apic_mode(xapic);
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
            let vcpu = cx.hv.device_home(vm);
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
        if self.blocked[vcpu] {
            self.list_blocked(vcpu, core);
        }
        cx.m.pi_desc[vcpu].sn = false;
        cx.hv.vcpus[vcpu].loaded = true;
        self.redirect_posted_irte(cx, cx.hv.vcpus[vcpu].vm);
    }

    fn vcpu_put(&mut self, cx: &mut HvCx, vcpu: usize) {
        // vmx_vcpu_pi_put for a preempted vCPU: suppress notifications; a
        // blocking one keeps them, aimed at the wakeup vector.
        if !self.blocked[vcpu] {
            cx.m.pi_desc[vcpu].sn = true;
        }
        cx.hv.vcpus[vcpu].loaded = false;
        self.redirect_posted_irte(cx, cx.hv.vcpus[vcpu].vm);
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
        cx.kick(vcpu);
    }

    /// `pi_pre_block`: a halting vCPU's descriptor notifies the wakeup
    /// vector on this core, not the guest, and is not suppressed, so a
    /// VT-d posted interrupt wakes it.
    fn vcpu_blocking(&mut self, cx: &mut HvCx, vcpu: usize) {
        let core = cx.hv.vcpus[vcpu].core;
        let pi = &mut cx.m.pi_desc[vcpu];
        pi.nv = POSTED_INTR_WAKEUP_VECTOR;
        pi.ndst = cx.m.cores[core].apic_id;
        self.list_blocked(vcpu, core);
        self.blocked[vcpu] = true;
    }

    /// `pi_post_block`: notifications go to the guest again.
    fn vcpu_unblocking(&mut self, cx: &mut HvCx, vcpu: usize) {
        cx.m.pi_desc[vcpu].nv = cx.m.vmcs[vcpu].posted_intr_nv;
        self.unlist_blocked(vcpu);
        self.blocked[vcpu] = false;
    }

    /// Posted requests and the virtual IRR count as pending.
    fn vcpu_has_interrupt(&self, cx: &HvCx, vcpu: usize) -> bool {
        let pi = &cx.m.pi_desc[vcpu];
        pi.on || !pi.pir.is_empty() || cx.m.vapic[vcpu].deliverable().is_some()
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
    /// `pi_wakeup_handler`: the wakeup vector wakes every blocked vCPU of
    /// this core whose descriptor has ON set.
    fn host_interrupt(&mut self, cx: &mut HvCx, core: usize, vector: u8) {
        match vector {
            crate::hw::x86::vmcs::KVM_POSTED_INTR_VECTOR => {}
            POSTED_INTR_WAKEUP_VECTOR => {
                let apic = cx.m.cores[core].apic_id;
                for &v in &self.blocked_on[core] {
                    if cx.m.pi_desc[v].ndst == apic && cx.m.pi_desc[v].on {
                        cx.kick(v);
                    }
                }
            }
            _ => self.host_idt(cx, core, vector),
        }
    }
}
