//! Directvisor — the DID authors' public KVM code (`Xivid/big`
//! mvm-4.10.1, the multi-VM branch; `kangdazhi/big` host, the single-VM
//! one), as did-implementation.md §2–§4 reads it. It is stock KVM with
//! APICv and VT-d posted interrupts, plus hypercalls a guest module
//! (`guest::did_module`) issues on each vCPU:
//!
//! * §2 hypercall 300 `SET_X2APIC_ID`: the vCPU's virtual x2APIC ID :=
//!   the physical APIC ID of its pCPU (each vCPU pinned 1:1 on a dedicated
//!   core: nothing is saved or restored at schedule-in/out).
//! * §2 hypercall 100 `SETUP_DTID`: the PID moves to a guest page (the
//!   VF's posted IRTE follows it); HLT exiting off; the MSR bitmap stops
//!   intercepting writes of TMICT (0x838) and TDCR (0x83e) and reads of
//!   TMCCT (0x839); on the pCPU's real LAPIC LVTT := periodic | 0xf2 (the
//!   posted-interrupt notification vector) and TMICT := 0x616d. A guest
//!   TMICT write then counts down on the real timer, whose expiry is a
//!   notification: posted-interrupt processing moves the PIR (where the
//!   guest pre-set its timer vector) into the vIRR, no exit.
//! * §2 hypercall 302: ICR writes pass through; the guest's IPIs are real
//!   physical IPIs of the notification vector after it set the vector in
//!   the target's PIR (no sender exit, no receiver exit).
//! * §2 "MSR bitmap": the multi-VM branch (X 4505f6a) edits a per-vCPU
//!   copy of the bitmap; the single-VM branch (K) edited KVM's global
//!   x2APIC bitmaps, which every vCPU of every VM uses, so a second,
//!   unmodified VM's TMICT writes reached the real LAPIC and it "lost its
//!   timer interrupts" (X 6ad3c0d). `[hv] directvisor_global_msr_bitmap`
//!   models the single-VM rule; the default is the multi-VM branch.
//! * §2 "Other VMCS controls" and §4: external-interrupt exiting, NMI
//!   exiting and posted-interrupt processing stay on (NV = 0xf2), EOI is
//!   APICv's virtual EOI, every other external interrupt exits.
//! * §5 hole: the guest never sets ON, and `vmx_sync_pir_to_irr` skips the
//!   PIR when ON is clear, so a notification that lands in root mode is
//!   acknowledged by the host and the vector waits for the next one (the
//!   periodic LVTT bounds the wait).
//!
//! ## The hole in a trace: cyclictest's one 792 µs sample
//!
//! `exitless reproduce directvisor` shows cyclictest at p99 ≈ 2 µs and a
//! maximum of ≈ 792 µs. `exitless run validation/directvisor/cyclictest.toml
//! --trace t.json --trace-window 0:2000` shows it: at 1,633,769.6 µs the
//! vCPU takes one of its background `IO_INSTRUCTION` exits (23.2 µs, the
//! calibrated QEMU port access); the physical LVTT, on the notification
//! vector since `SETUP_DTID`, expires at ≈ 1,633,791 µs, inside that exit.
//! In root mode the notification is an ordinary host interrupt, which
//! KVM's handler acknowledges and ignores; ON is clear (the module sets only
//! PIR bits), so the entry's `vmx_sync_pir_to_irr` leaves the timer bit in
//! the PIR. Nothing re-raises it until the periodic LVTT fires again one
//! period later (the period is the guest's last TMICT, 791 µs here): the
//! guest's handler runs at 1,634,581 µs and cyclictest wakes ≈ 792 µs late.
//! It is the public code's behaviour, not a model artefact (a notification
//! in root mode with a PIR bit and ON clear is lost the same way in
//! `vmx.c`); with the background exits off it never happens. The metric
//! `directvisor.root_notifications_on_clear` counts these notifications;
//! `tests/model/directvisor.rs` asserts the chain.

use super::apicv::Apicv;
use crate::guest::did_module as hc;
use crate::hv::exits::ExitInfo;
use crate::hv::scheme::{ExitOutcome, Scheme};
use crate::hv::HvCx;
use crate::hw::x86::core::CoreMode;
use crate::hw::x86::lapic::msr;
use crate::hw::x86::vmcs::KVM_POSTED_INTR_VECTOR;

/// LVTT timer mode periodic (bit 17).
const LVTT_PERIODIC: u64 = 1 << 17;
/// The TMICT `osnet_set_lapic` writes (did-implementation.md §2).
const OSNET_TMICT: u64 = 0x616d;

/// `[hv]` options of `directvisor`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirectvisorOptions {
    /// The single-VM branch's global x2APIC MSR bitmap (K host): a
    /// hypercall's pass-through reaches every vCPU of every VM.
    pub global_msr_bitmap: bool,
    /// VMs whose guest does not load the module (ordinary VMs on the
    /// same host).
    pub plain_vms: Vec<usize>,
}

/// The `directvisor` scheme.
pub struct Directvisor {
    apicv: Apicv,
    opts: DirectvisorOptions,
    /// Hypercalls handled, by the ones the module issues.
    hypercalls: u64,
    /// Notifications the host took in root mode while the vCPU's PIR held
    /// requests and ON was clear: their vectors wait for the next
    /// notification (the §5 hole).
    root_notifications_on_clear: u64,
}

impl Directvisor {
    /// Directvisor with `opts` (VT-d posted interrupts always on).
    pub fn new(opts: DirectvisorOptions) -> Self {
        Directvisor {
            apicv: Apicv::new(true),
            opts,
            hypercalls: 0,
            root_notifications_on_clear: 0,
        }
    }

    /// The vCPUs whose MSR bitmap a pass-through edit of `vcpu`'s reaches:
    /// its own copy (X 4505f6a), or with the global bitmap every vCPU.
    fn bitmap_users(&self, cx: &HvCx, vcpu: usize) -> Vec<usize> {
        if self.opts.global_msr_bitmap {
            (0..cx.hv.vcpus.len()).collect()
        } else {
            vec![vcpu]
        }
    }

    /// `osnet_setup_dtid` (hypercall 100).
    fn setup_dtid(&mut self, cx: &mut HvCx, vcpu: usize) {
        // osnet_map_pid: the descriptor now lives in the guest's page; the
        // routing update re-points the VF's posted IRTE at it. The model's
        // descriptor of the vCPU stands for that page.
        if cx.hv.vms[cx.hv.vcpus[vcpu].vm].vf.is_some() {
            cx.charge(cx.costs.irt_update);
        }
        cx.m.vmcs[vcpu].proc.hlt_exiting = false;
        for v in self.bitmap_users(cx, vcpu) {
            let b = &mut cx.m.vmcs[v].msr_bitmap;
            let _ = b.set_write_intercept(msr::TMICT, false);
            let _ = b.set_read_intercept(msr::TMCCT, false);
            let _ = b.set_write_intercept(msr::TDCR, false);
        }
        // The pCPU's timer is the vCPU's from now on: the host's timers
        // there stop (isolcpus, nohz=off; served by the housekeeping core
        // in the model).
        let core = cx.hv.vcpus[vcpu].core;
        let hk = cx.hv.designated_core;
        if core != hk {
            cx.hv.host.reassign(core, hk);
            cx.host_timer_reprogram(hk);
            cx.host_timer_forget(core);
        }
        // osnet_set_lapic.
        cx.apic_write(
            core,
            msr::LVT_TIMER,
            LVTT_PERIODIC | u64::from(KVM_POSTED_INTR_VECTOR),
        );
        cx.apic_write(core, msr::TMICT, OSNET_TMICT);
    }

    /// Hypercalls 302/303: ICR write pass-through on or off.
    fn icr_intercept(&mut self, cx: &mut HvCx, vcpu: usize, on: bool) {
        for v in self.bitmap_users(cx, vcpu) {
            let _ = cx.m.vmcs[v].msr_bitmap.set_write_intercept(msr::ICR, on);
        }
    }
}

impl Scheme for Directvisor {
    fn name(&self) -> &'static str {
        "directvisor"
    }

    fn guest_loads_did_module(&self, vm: usize) -> bool {
        !self.opts.plain_vms.contains(&vm)
    }

    super::apicv::apicv_passthrough!();

    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        self.apicv.setup_vm(cx, vm);
    }

    /// `kvm_cpu_has_interrupt` with APICv: ON, or a deliverable vIRR
    /// vector (a PIR bit without ON, the module's pre-set timer bit, is
    /// not seen).
    fn vcpu_has_interrupt(&self, cx: &HvCx, vcpu: usize) -> bool {
        cx.m.pi_desc[vcpu].on || cx.m.vapic[vcpu].deliverable().is_some()
    }

    /// `kvm_emulate_hypercall` with the module's numbers (§2 table).
    fn handle_exit(&mut self, cx: &mut HvCx, vcpu: usize, info: ExitInfo) -> ExitOutcome {
        let ExitInfo::Vmcall { nr, .. } = info else {
            return self.apicv.handle_exit(cx, vcpu, info);
        };
        self.hypercalls += 1;
        match nr {
            hc::HC_SET_X2APIC_ID => {
                let core = cx.hv.vcpus[vcpu].core;
                cx.m.vapic[vcpu].x2apic_id = Some(cx.m.cores[core].apic_id);
            }
            hc::HC_RESTORE_X2APIC_ID => cx.m.vapic[vcpu].x2apic_id = None,
            hc::HC_SETUP_DTID => self.setup_dtid(cx, vcpu),
            hc::HC_DISABLE_INTERCEPT_WRMSR_ICR => self.icr_intercept(cx, vcpu, false),
            hc::HC_ENABLE_INTERCEPT_WRMSR_ICR => self.icr_intercept(cx, vcpu, true),
            _ => {}
        }
        ExitOutcome::default()
    }

    fn host_interrupt(&mut self, cx: &mut HvCx, core: usize, vector: u8) {
        if vector == KVM_POSTED_INTR_VECTOR {
            if let CoreMode::Host { vcpu } = cx.m.cores[core].mode {
                let pi = &cx.m.pi_desc[vcpu];
                if !pi.on && !pi.pir.is_empty() {
                    self.root_notifications_on_clear += 1;
                }
            }
        }
        self.apicv.host_interrupt(cx, core, vector)
    }

    /// `vmx_sync_pir_to_irr`: the PIR moves only when ON is set.
    fn prepare_entry(&mut self, cx: &mut HvCx, vcpu: usize) {
        if cx.m.pi_desc[vcpu].on {
            let pir = cx.m.pi_desc[vcpu].take();
            cx.m.vapic[vcpu].sync_pir(pir);
        }
    }

    fn reset_metrics(&mut self) {
        self.hypercalls = 0;
        self.root_notifications_on_clear = 0;
    }

    fn metrics(&self, out: &mut crate::guest::app::Metrics) {
        out.insert("directvisor.hypercalls".into(), self.hypercalls as f64);
        out.insert(
            "directvisor.root_notifications_on_clear".into(),
            self.root_notifications_on_clear as f64,
        );
    }
}
