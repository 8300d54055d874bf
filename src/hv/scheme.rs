//! The interrupt-delivery scheme interface. A scheme is a set of hooks the
//! generic hypervisor calls at the points where real hypervisors differ; it
//! acts only by setting hardware state through [`HvCx`] (VMCS controls, the
//! MSR bitmap, IRT entries, LAPIC registers) and its own bookkeeping.

use super::exits::ExitInfo;
use super::host::{HostTimer, CALL_FUNCTION_SINGLE_VECTOR, HOST_TIMER_VECTOR, RESCHEDULE_VECTOR};
use super::vlapic;
use super::HvCx;
use crate::hw::x86::lapic::ApicBitmap;

/// What an exit handler reports back to the generic exit path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitOutcome {
    /// For an EOI write: what the LAPIC that took it cleared.
    pub eoi_cleared: Option<Option<u8>>,
}

/// One interrupt-delivery design.
pub trait Scheme {
    /// Name used in scenarios and reports.
    fn name(&self) -> &'static str;

    /// Whether VMs run under a hypervisor at all (false for bare metal).
    fn virtualized(&self) -> bool {
        true
    }

    /// Whether VM `vm`'s guest loads the DID authors' guest module
    /// (did-implementation.md §3), a guest modification the scheme needs:
    /// the guest then enables the direct timer and ICR pass-through by
    /// hypercalls and posts its IPIs. Default: an unmodified guest.
    fn guest_loads_did_module(&self, _vm: usize) -> bool {
        false
    }

    /// Whether the VMs run on AMD SVM (`world::svm`: VMCBs, AVIC) rather
    /// than VT-x. Default: VT-x.
    fn svm(&self) -> bool {
        false
    }

    /// An SVM #VMEXIT's reason-specific work (`svm_invoke_exit_handler`).
    /// Default: KVM's SVM handlers.
    fn handle_svm_exit(
        &mut self,
        cx: &mut HvCx,
        vcpu: usize,
        exit: crate::hw::x86::vmcb::SvmExit,
    ) -> ExitOutcome {
        super::svm::exit(self, cx, vcpu, exit)
    }

    /// A VM was created: program its vCPUs' VMCS controls and MSR bitmaps,
    /// and its devices' IRT entries.
    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize);

    /// Schedule-in of `vcpu` on its core, before its first entry there.
    fn vcpu_load(&mut self, cx: &mut HvCx, vcpu: usize) {
        cx.hv.vcpus[vcpu].loaded = true;
    }

    /// Whether the host may schedule `vcpu` out now. A scheme whose guest
    /// owns the physical LAPIC must refuse while the guest has an
    /// interrupt in service there: the next thread on the core would
    /// inherit the in-service bit. The host scheduler then tries again at
    /// its next tick.
    fn preemptible(&self, _cx: &HvCx, _vcpu: usize) -> bool {
        true
    }

    /// `kvm_arch_vcpu_blocking`: `vcpu` halted and its thread is about to
    /// sleep (called before its `vcpu_put`).
    fn vcpu_blocking(&mut self, _cx: &mut HvCx, _vcpu: usize) {}

    /// `kvm_arch_vcpu_unblocking`: `vcpu`'s thread was woken.
    fn vcpu_unblocking(&mut self, _cx: &mut HvCx, _vcpu: usize) {}

    /// `kvm_cpu_has_interrupt` at a HLT exit: whether an interrupt is
    /// pending for `vcpu`, so it must not sleep. Default: the emulated
    /// LAPIC has a deliverable vector, or the physical LAPIC of its core
    /// latched one for it.
    fn vcpu_has_interrupt(&self, cx: &HvCx, vcpu: usize) -> bool {
        let core = cx.hv.vcpus[vcpu].core;
        cx.hv.vcpus[vcpu].vlapic.deliverable().is_some() || !cx.m.lapics[core].irr.is_empty()
    }

    /// Halt polling (`halt_poll_ns`): how long the host spins waiting for
    /// an interrupt for halted `vcpu` before its thread sleeps. 0: sleep at
    /// once (stock KVM of the period).
    fn halt_poll_window(&self, _vcpu: usize) -> crate::engine::Time {
        0
    }

    /// A halt of `vcpu` ended after `block` (polling included), woken
    /// while still polling or not: where a polling scheme grows or
    /// shrinks its window.
    fn halt_ended(&mut self, _vcpu: usize, _block: crate::engine::Time, _in_poll: bool) {}

    /// Schedule-out of `vcpu` from its core.
    fn vcpu_put(&mut self, cx: &mut HvCx, vcpu: usize) {
        cx.hv.vcpus[vcpu].loaded = false;
    }

    /// Handles an exit's reason-specific work (for an external interrupt
    /// acknowledged on exit, the generic path EOIs it afterwards).
    /// Default: stock KVM.
    fn handle_exit(&mut self, cx: &mut HvCx, vcpu: usize, info: ExitInfo) -> ExitOutcome {
        super::kvm::exit(self, cx, vcpu, info)
    }

    /// A maskable interrupt `vector` was accepted by host code on `core`
    /// (in an EXTERNAL_INTERRUPT exit, between exit handlers, or on an idle
    /// core). The generic path EOIs the physical LAPIC afterwards.
    fn host_interrupt(&mut self, cx: &mut HvCx, core: usize, vector: u8) {
        self.host_idt(cx, core, vector);
    }

    /// The host needs `vector` (reschedule, TLB shootdown) handled on core
    /// `to`: send it. Stock Linux sends a fixed IPI.
    fn send_host_ipi(&mut self, cx: &mut HvCx, from: usize, to: usize, vector: u8) {
        cx.send_ipi(from, to, vector, crate::hw::x86::lapic::DeliveryMode::Fixed);
    }

    /// An NMI reached host code on `core`.
    fn host_nmi(&mut self, _cx: &mut HvCx, _core: usize) {}

    /// Raise virtual interrupt `vector` for `vcpu` (from the emulated timer,
    /// a back end, or a device interrupt taken by the host). Default: KVM's
    /// emulated LAPIC, kicking the vCPU out of guest mode.
    fn virtual_interrupt(&mut self, cx: &mut HvCx, vcpu: usize, vector: u8) {
        super::kvm::raise(cx, vcpu, vector);
    }

    /// Before the last step of an entry of `vcpu`: how much longer the host
    /// must wait with interrupts on (a message still in flight to the core
    /// must land in host mode, not in this guest). Default: none.
    fn entry_quiesce(&self, _cx: &HvCx, _vcpu: usize) -> crate::engine::Time {
        0
    }

    /// Last step before VM entry of `vcpu` (host interrupts are off).
    /// Default: KVM's `inject_pending_event`.
    fn prepare_entry(&mut self, cx: &mut HvCx, vcpu: usize) {
        vlapic::inject_pending(cx, vcpu);
    }

    /// The warm-up is over: counters restart.
    fn reset_metrics(&mut self) {}

    /// Adds the scheme's own counters (mechanism events: bounces, mode
    /// switches) to a run's metrics, named `<scheme>.<counter>`.
    fn metrics(&self, _out: &mut crate::guest::app::Metrics) {}

    /// The ISR that the guest's EOI writes act on, as this scheme keeps it:
    /// the invariant checker compares it with what the guest has in service.
    /// Default: the emulated LAPIC's.
    fn guest_isr(&self, cx: &HvCx, vcpu: usize) -> ApicBitmap {
        cx.hv.vcpus[vcpu].vlapic.isr
    }

    /// Whether this VM's paravirtual back ends run on a dedicated host core
    /// that polls their virtqueues (ELVIS) instead of sleeping until a
    /// kick: the guest's kicks are then suppressed for good.
    fn backend_polls(&self) -> bool {
        false
    }

    /// A host hrtimer expired.
    fn host_timer(&mut self, cx: &mut HvCx, t: HostTimer) {
        match t {
            HostTimer::Tick { core } => {
                cx.charge(cx.costs.tick_handler);
                let next = cx.now + cx.hv.host.tick_period;
                cx.hv.host.add(core, next, HostTimer::Tick { core });
            }
            HostTimer::GuestTimer { vcpu, gen } => {
                cx.charge(cx.costs.kvm_timer_fn);
                if let Some(v) = vlapic::timer_fired(cx, vcpu, gen) {
                    self.virtual_interrupt(cx, vcpu, v);
                }
            }
            HostTimer::ParkedTimer { vcpu, vector } => self.virtual_interrupt(cx, vcpu, vector),
        }
    }

    /// The host IDT: what Linux+KVM does with a host vector.
    fn host_idt(&mut self, cx: &mut HvCx, core: usize, vector: u8) {
        match vector {
            HOST_TIMER_VECTOR => {
                cx.charge(cx.costs.hrtimer_interrupt);
                // The one-shot timer fired: whatever was programmed is used up.
                cx.hv.host.programmed[core] = None;
                while let Some(t) = cx.hv.host.pop_expired(core, cx.now) {
                    self.host_timer(cx, t);
                }
                cx.host_timer_reprogram(core);
            }
            RESCHEDULE_VECTOR => cx.charge(cx.costs.irq_handler / 2),
            // KVM's __loaded_vmcs_clear for a vCPU that moved away.
            CALL_FUNCTION_SINGLE_VECTOR => cx.charge(cx.costs.call_function),
            v => {
                if let Some((vm, a)) = cx.hv.vf_by_host_vector(core, v) {
                    // The assigned device's host IRQ handler (irqfd to kvm_set_irq).
                    cx.charge(cx.costs.irq_handler);
                    let vcpu = cx.hv.msi_destination(vm);
                    self.virtual_interrupt(cx, vcpu, a.guest_vector);
                }
            }
        }
    }
}

/// Builds a scheme by name with default options.
pub fn by_name(name: &str) -> Option<Box<dyn Scheme>> {
    by_name_with(name, &SchemeOptions::default())
}

/// Per-scenario options of the schemes (`[hv]` in a scenario).
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SchemeOptions {
    /// `apicv`: deliver the VF's interrupts as VT-d posted interrupts
    /// (posted-format IRTEs) instead of host IRQs that exit.
    pub vtd_posted_interrupts: bool,
    /// `eli`, `elvis`: how host interrupts aimed at a core that runs an
    /// ELI guest reach the host (docs/papers.md ELI §2.7, protection 3).
    pub eli_critical: super::eli::Critical,
    /// `kvm-2026`: posted timer interrupts from a housekeeping core.
    pub posted_timers: Option<bool>,
    /// `kvm-2026`: halt polling.
    pub halt_poll: Option<bool>,
    /// `kvm-2026`: cap of the halt-polling window, µs (default 200).
    pub halt_poll_max_us: Option<f64>,
    /// `kvm-2026`: IPI virtualization (SMP guests' IPIs without sender exits).
    pub ipiv: Option<bool>,
    /// `kvm-2026`: APIC-timer virtualization (Intel ISE 319433-059 ch. 8):
    /// a TSC-deadline guest's timer writes and expiries without exits
    /// (default false; needs `guest.lapic_timer = "tsc-deadline"` to act).
    pub apic_timer_virt: Option<bool>,
    /// ES2 hybrid I/O handling in the vhost back end (any virtualized
    /// scheme): `off` (stock vhost), `perceptive` or `optimistic`; both
    /// merge devices into joint I/O threads.
    pub es2_hybrid: super::es2::Es2Hybrid,
    /// ES2 perceptive mode: TX requests per handler turn before it
    /// requeues in polling mode (`poll_quota`; the paper: at most 4 for
    /// TCP, 16 for UDP). Default 4.
    pub es2_quota: Option<u32>,
    /// ES2 optimistic mode: turns a TX handler keeps polling after the
    /// VM's last ingress packet (`max_poll_count`). Default 1000.
    pub es2_max_poll_count: Option<u32>,
    /// ES2: devices one joint I/O thread serves (`combining_level`).
    /// Default 4.
    pub es2_combining_level: Option<u32>,
    /// ES2: the joint thread's interruptible sleep when only polling
    /// handlers remain, µs. Default 10.
    pub es2_sleep_us: Option<f64>,
    /// ES2 intelligent interrupt redirection: a virtio device's MSI goes
    /// to a running vCPU of its lowest-priority set (or the one likely to
    /// run next).
    pub es2_redirect: bool,
    /// `directvisor`: the single-VM branch's global x2APIC MSR bitmap
    /// (did-implementation.md §2 "MSR bitmap"): a guest's pass-through
    /// reaches every vCPU of every VM. Default: per-vCPU (multi-VM branch).
    pub directvisor_global_msr_bitmap: bool,
    /// `directvisor`: VMs whose guest does not load the DID module
    /// (ordinary VMs on the same host).
    pub directvisor_plain_vms: Vec<usize>,
    /// `kvm-avic`: `x2avic` (Zen 4 and later, the default) or `xavic`
    /// (an x2APIC guest then inhibits AVIC).
    pub avic_mode: Option<AvicModeSpec>,
    /// `kvm-avic`: the IOMMU posts the VF's interrupts in GuestMode
    /// (default on).
    pub avic_iommu: Option<bool>,
    /// `kvm-avic`: the processor has erratum 1235 and KVM keeps IPI
    /// virtualization on (as before Linux 6.11 disabled it on Zen 1/2):
    /// an IPI to a vCPU that just cleared IsRunning can be lost.
    pub avic_erratum_1235: bool,
    /// RISC-V schemes (`kvm-riscv`, `kvm-riscv-sw`): the harts implement
    /// Sstc and KVM gives it to the guest (default true); false: the
    /// guest's timer is the SBI set_timer call (the older baseline).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub riscv_sstc: Option<bool>,
    /// `kvm-riscv`: the deliberately wrong guest-file migration that reads
    /// and clears the old file without ORing its pending bits into the
    /// new one (the checker and the race explorer must report the loss).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub riscv_migrate_drop_pending: bool,
}

impl SchemeOptions {
    /// The RISC-V schemes' options these give.
    pub fn riscv(&self) -> super::riscv::RiscvConfig {
        super::riscv::RiscvConfig {
            no_sstc: !self.riscv_sstc.unwrap_or(true),
            migrate_drop_pending: self.riscv_migrate_drop_pending,
        }
    }
}

/// The AVIC flavour (`hv.avic_mode`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum AvicModeSpec {
    /// xAVIC: the xAPIC page only (Zen 1-3).
    Xavic,
    /// x2AVIC: x2APIC MSRs too (Zen 4 and later).
    X2avic,
}

impl SchemeOptions {
    /// The `kvm-2026` options these give (defaults: everything on).
    pub fn kvm2026(&self) -> super::kvm2026::Kvm2026Options {
        let d = super::kvm2026::Kvm2026Options::default();
        super::kvm2026::Kvm2026Options {
            posted_timers: self.posted_timers.unwrap_or(d.posted_timers),
            halt_poll: self.halt_poll.unwrap_or(d.halt_poll),
            halt_poll_max_us: self.halt_poll_max_us.unwrap_or(d.halt_poll_max_us),
            ipiv: self.ipiv.unwrap_or(d.ipiv),
            apic_timer_virt: self.apic_timer_virt.unwrap_or(d.apic_timer_virt),
        }
    }
}

impl SchemeOptions {
    /// The `kvm-avic` options these give.
    pub fn avic(&self) -> super::svm::AvicOptions {
        super::svm::AvicOptions {
            mode: match self.avic_mode {
                Some(AvicModeSpec::Xavic) => crate::hw::x86::avic::AvicMode::XAvic,
                _ => crate::hw::x86::avic::AvicMode::X2Avic,
            },
            iommu: self.avic_iommu.unwrap_or(true),
            // With the erratum fix (Linux 6.11+) an affected processor
            // runs without IPI virtualization; the option models the
            // kernel before it.
            ipiv: true,
        }
    }
}

impl SchemeOptions {
    /// The ES2 options these give (defaults: the paper's).
    pub fn es2(&self) -> super::es2::Es2Options {
        let d = super::es2::Es2Options::default();
        super::es2::Es2Options {
            hybrid: self.es2_hybrid,
            quota: self.es2_quota.unwrap_or(d.quota),
            max_poll_count: self.es2_max_poll_count.unwrap_or(d.max_poll_count),
            combining_level: self.es2_combining_level.unwrap_or(d.combining_level),
            sleep_us: self.es2_sleep_us.unwrap_or(d.sleep_us),
            redirect: self.es2_redirect,
        }
    }
}

/// Builds a scheme by name with the scenario's options.
pub fn by_name_with(name: &str, opts: &SchemeOptions) -> Option<Box<dyn Scheme>> {
    Some(match name {
        "kvm" => Box::new(super::kvm::Kvm),
        "did" => Box::new(super::did::Did::default()),
        "naive" => Box::new(super::naive::Naive),
        "bare-metal" => Box::new(super::bare_metal::BareMetal),
        "eli" => Box::new(super::eli::Eli::new(opts.eli_critical)),
        "elvis" => Box::new(super::elvis::Elvis::new(opts.eli_critical)),
        "apicv" => Box::new(super::apicv::Apicv::new(opts.vtd_posted_interrupts)),
        "kvm-2026" => Box::new(super::kvm2026::Kvm2026::new(opts.kvm2026())),
        "kvm-svm" => Box::new(super::svm::KvmSvm::new(None)),
        "kvm-avic" => Box::new(super::svm::KvmSvm::new(Some(opts.avic()))),
        "directvisor" => Box::new(super::directvisor::Directvisor::new(
            super::directvisor::DirectvisorOptions {
                global_msr_bitmap: opts.directvisor_global_msr_bitmap,
                plain_vms: opts.directvisor_plain_vms.clone(),
            },
        )),
        _ => return None,
    })
}

/// Every scheme name `by_name` accepts.
pub const SCHEMES: [&str; 11] = [
    "bare-metal",
    "kvm",
    "apicv",
    "kvm-2026",
    "kvm-svm",
    "kvm-avic",
    "eli",
    "elvis",
    "did",
    "naive",
    "directvisor",
];

/// One line on each scheme, in the order of [`SCHEMES`].
pub const SCHEME_SUMMARIES: [&str; 11] = [
    "the same guest on the machine without a hypervisor",
    "stock KVM: external interrupts and EOI/timer writes exit; software-emulated LAPIC and injection",
    "KVM + APICv: posted interrupts, virtual-interrupt delivery, EOI virtualization ([hv] vtd_posted_interrupts for VT-d PI)",
    "KVM today: APICv + VT-d PI, posted timer interrupts, halt polling, IPIv ([hv] posted_timers, halt_poll, halt_poll_max_us, ipiv)",
    "KVM on AMD SVM without AVIC: INTR, HLT and x2APIC MSR writes intercepted; injection through EVENTINJ, the window through V_IRQ/VINTR",
    "KVM on AMD with AVIC: backing page, physical APIC ID table and doorbells, IOMMU guest virtual APIC with GA log ([hv] avic_mode, avic_iommu, avic_erratum_1235)",
    "ELI: shadow IDT, direct delivery and EOI of assigned interrupts, injection mode for the rest ([hv] eli_critical)",
    "ELVIS: ELI plus a vhost worker polling the virtqueues and exitless PV interrupts",
    "DID: interrupts and timer in guest mode as real IPIs, direct EOI, host traffic as NMIs (VEE '15)",
    "emulated injection plus direct EOI: the broken design of DID §2.2, for the checker",
    "Directvisor: the DID authors' KVM code; a guest module's hypercalls pass TMICT/ICR through, the real LAPIC timer and IPIs post on the notification vector, dedicated cores ([hv] directvisor_global_msr_bitmap, directvisor_plain_vms)",
];
