//! The hypervisor: VMs and vCPUs pinned to cores, VM-exit dispatch with a
//! handler cost per reason, the host kernel's timers, KVM's emulated LAPIC,
//! and the interrupt-delivery **schemes**, one module each behind
//! [`scheme::Scheme`] (ARM's and RISC-V's behind their own traits in
//! [`arm`] and [`riscv`]). Hypervisor code touches the platform only through
//! [`HvCx`]: LAPIC registers, VMCS fields, IRT entries, device registers.

pub mod arm;
pub mod blk_backend;
pub mod es2;
pub mod exits;
pub mod host;
pub mod kvmtool_net;
pub mod riscv;
pub mod sched;
pub mod scheme;
pub mod vcanal;
pub mod vhost;
pub mod vhost_vsock;
pub mod x86;

// The x86 schemes keep their paths (`hv::did`, ...).
pub use x86::{apicv, bare_metal, did, directvisor, eli, elvis, kvm, kvm2026, naive, svm, vlapic};

use crate::engine::{EventQueue, Time};
use crate::guest::Kernel;
use crate::hw::x86::core::CoreMode;
use crate::hw::x86::iommu::Irte;
use crate::hw::x86::lapic::{msr, ApicEffect, DeliveryMode, Lapic};
use crate::hw::x86::Machine;
use crate::world::event::{schedule_apic_effect, Ev};
use exits::ExitStats;
use host::{HostKernel, HostTimer};

/// How long a remote IPI takes: nominally, and at the latest (the bound
/// a perturbed run's jitter stays within).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpiTiming {
    /// ICR write to the destination's IRR.
    pub latency: Time,
    /// The latest it lands.
    pub max: Time,
}

/// Costs the hypervisor charges, from the calibration file.
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct HvCosts {
    pub roundtrip: Time,
    pub external_interrupt: Time,
    pub msr_write_eoi: Time,
    pub msr_write_tmict: Time,
    pub msr_write_other: Time,
    pub io_instruction_mean: Time,
    pub io_instruction_ioeventfd: Time,
    pub ept_violation_mean: Time,
    pub pending_interrupt: Time,
    pub exception_np: Time,
    pub nmi: Time,
    pub tick_handler: Time,
    pub hrtimer_interrupt: Time,
    pub kvm_timer_fn: Time,
    pub irq_handler: Time,
    pub ipi_latency: Time,
    /// The delivery bound of a remote IPI (the latest it may land after
    /// its ICR write): what a scheme that must know an IPI has landed
    /// waits for (DID's and ELVIS's entry quiesce).
    pub ipi_latency_max: Time,
    pub self_ipi: Time,
    pub irt_update: Time,
    pub call_function: Time,
    pub hlt: Time,
    pub vcpu_wakeup: Time,
    pub apic_access_decode: Time,
    /// APIC timer period after the host's divide-by-16.
    pub apic_timer_period: Time,
    /// An AMD host's SVM and AVIC costs.
    pub svm: SvmCosts,
}

/// The SVM and AVIC costs (calibration `[svm]`, docs/amd.md).
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct SvmCosts {
    pub roundtrip: Time,
    pub intr: Time,
    pub vintr: Time,
    pub avic_incomplete_ipi: Time,
    pub avic_trap: Time,
    pub avic_load_put: Time,
    pub doorbell_latency: Time,
    pub ga_log: Time,
    pub erratum_1235_window: Time,
}

impl HvCosts {
    /// A remote IPI's latency and delivery bound.
    pub fn ipi_timing(&self) -> IpiTiming {
        IpiTiming {
            latency: self.ipi_latency,
            max: self.ipi_latency_max,
        }
    }

    /// The exit service time of a write to the LAPIC register x2APIC names
    /// `msr` (EOI, TMICT, or any other).
    pub fn apic_register_write(&self, msr: u32) -> Time {
        match msr {
            msr::EOI => self.msr_write_eoi,
            // KVM's TSC-deadline write (kvm_set_lapic_tscdeadline_msr)
            // restarts the same hrtimer a TMICT write does.
            msr::TMICT | msr::TSC_DEADLINE => self.msr_write_tmict,
            _ => self.msr_write_other,
        }
    }
}

/// An SR-IOV VF assigned to a VM.
#[derive(Clone, Copy, Debug)]
pub struct VfAssignment {
    /// VF index on the NIC.
    pub vf: u16,
    /// IRT entry of its queue vector.
    pub irte: u16,
    /// Vector the guest programmed into the VF's MSI-X entry.
    pub guest_vector: u8,
    /// Host vector KVM uses for the VF's host IRQ.
    pub host_vector: u8,
    /// Requester id (bus/device/function) of the VF.
    pub requester_id: u16,
    /// Queue pairs of the function (1 but for a native kernel's RSS).
    /// Queue q's MSI-X vector carries `guest_vector + q` through IRT entry
    /// [`VfAssignment::queue_irte`]`(q)`.
    pub queues: u8,
    /// Distance between the IRT entries of consecutive queues' vectors.
    pub irte_stride: u16,
}

impl VfAssignment {
    /// IRT entry of queue `q`'s vector (queue 0: [`VfAssignment::irte`]).
    pub fn queue_irte(&self, q: u8) -> u16 {
        self.irte + u16::from(q) * self.irte_stride
    }

    /// The vector queue `q`'s interrupt carries (the driver requests one
    /// IRQ per queue vector, `ixgbe_request_msix_irqs`).
    pub fn queue_vector(&self, q: u8) -> u8 {
        self.guest_vector.wrapping_add(q)
    }

    /// A remappable IRT entry for this VF's queue vector, checked against
    /// its requester id.
    pub fn irte(&self, dest_apic_id: u32, vector: u8, mode: DeliveryMode) -> Irte {
        Irte {
            present: true,
            dest_apic_id,
            vector,
            mode,
            level_triggered: false,
            source_check: crate::hw::x86::iommu::SourceCheck::RequesterId(self.requester_id),
        }
    }
}

/// One VM.
#[derive(Clone, Debug)]
pub struct VmState {
    /// Its vCPUs (global indices; the guest's APIC ID of `vcpus[i]` is i).
    pub vcpus: Vec<usize>,
    /// The vCPUs its VF's MSI names (the guest's IRQ affinity).
    pub irq_affinity: Vec<usize>,
    /// The MSI asks for lowest-priority delivery among `irq_affinity`.
    pub msi_lowest_priority: bool,
    /// Its VF, if any.
    pub vf: Option<VfAssignment>,
    /// The guest vectors of its paravirtual devices' queues (the irqfd
    /// routes), e.g. virtio-net RX and TX.
    pub pv_vectors: Vec<u8>,
    /// Its guest runs the LAPIC in xAPIC (MMIO) mode rather than x2APIC:
    /// KVM sets the VMCS up for it (`vmx_set_virtual_apic_mode`).
    pub xapic: bool,
    /// Exit accounting.
    pub stats: ExitStats,
    /// The same per vCPU, by its index in the VM (`perf kvm stat --vcpu`).
    pub vcpu_stats: Vec<ExitStats>,
    /// On an AMD host: exits by SVM exit code, for the VM and per vCPU
    /// (`ExitStats` keeps the time in guest for both vendors).
    pub svm_stats: Vec<[crate::engine::Summary; crate::hw::x86::vmcb::SvmExitCode::ALL.len()]>,
}

/// One vCPU.
pub struct VcpuState {
    /// Owning VM.
    pub vm: usize,
    /// Its place in the VM (its APIC ID in the guest).
    pub index: usize,
    /// KVM's `apic_arb_prio`: lowest-priority deliveries it has taken.
    pub arb_prio: u64,
    /// The core it runs on, or ran on last.
    pub core: usize,
    /// The cores its thread may run on (bit i = core i; one bit when
    /// pinned).
    pub allowed: crate::engine::CpuMask,
    /// KVM's `loaded_vmcs->cpu`: the core its VMCS was last loaded on
    /// (none before its first schedule-in).
    pub vmcs_core: Option<usize>,
    /// KVM's emulated LAPIC of this vCPU (the register file the guest sees
    /// when its APIC accesses exit).
    pub vlapic: Lapic,
    /// Loaded on its core (scheduled in).
    pub loaded: bool,
    /// Halted (KVM's `KVM_MP_STATE_HALTED`): its thread sleeps until an
    /// interrupt for it is pending.
    pub halted: bool,
}

/// Hypervisor state shared by all schemes.
pub struct HvState {
    /// VMs.
    pub vms: Vec<VmState>,
    /// vCPUs.
    pub vcpus: Vec<VcpuState>,
    /// Host kernel timers.
    pub host: HostKernel,
    /// DID's designated timer core (a host-only core).
    pub designated_core: usize,
    /// KVM_IOEVENTFD registrations: a write of VM `vm`'s guest to `port`
    /// signals eventfd `fd` instead of going to QEMU: (vm, port, fd).
    pub ioeventfds: Vec<(usize, u16, u16)>,
    /// Per core: the vCPU last scheduled in there (kept across its
    /// schedule-out until another is loaded).
    pub last_vcpu: Vec<Option<usize>>,
    /// Per VM: ES2's interrupt redirection state, when it is on.
    pub redirect: Vec<Option<es2::Redirect>>,
    /// Per core: the vCPUs whose `core` it is, in increasing order
    /// ([`HvState::index`]; [`HvState::move_vcpu`] keeps it): the lookups
    /// by core look at these, not at every vCPU.
    pub on_core: Vec<Vec<usize>>,
    /// Per host vector: the VMs whose VF's host IRQ uses it.
    pub vf_by_vector: Vec<Vec<usize>>,
    /// Per VM: its ioeventfds, (port, fd) in registration order.
    pub ioeventfds_by_vm: Vec<Vec<(u16, u16)>>,
}

impl HvState {
    /// Builds the lookups by core, by host vector and by VM from `vcpus`,
    /// `vms` and `ioeventfds`, for a machine of `cores` cores.
    pub fn index(&mut self, cores: usize) {
        self.on_core = vec![Vec::new(); cores];
        for (i, v) in self.vcpus.iter().enumerate() {
            self.on_core[v.core].push(i);
        }
        for l in &mut self.on_core {
            // A vCPU that moves in must not allocate on the event loop.
            l.reserve(1);
        }
        self.vf_by_vector = vec![Vec::new(); 256];
        for (i, vm) in self.vms.iter().enumerate() {
            if let Some(a) = vm.vf {
                self.vf_by_vector[a.host_vector as usize].push(i);
            }
        }
        self.ioeventfds_by_vm = vec![Vec::new(); self.vms.len()];
        for &(vm, port, fd) in &self.ioeventfds {
            self.ioeventfds_by_vm[vm].push((port, fd));
        }
    }

    /// `vcpu`'s thread now runs on `core`.
    pub fn move_vcpu(&mut self, vcpu: usize, core: usize) {
        let from = self.vcpus[vcpu].core;
        if from == core {
            return;
        }
        self.vcpus[vcpu].core = core;
        let l = &mut self.on_core[from];
        if let Some(i) = l.iter().position(|&v| v == vcpu) {
            l.remove(i);
        }
        let l = &mut self.on_core[core];
        let i = l.partition_point(|&v| v < vcpu);
        l.insert(i, vcpu);
    }

    /// The vCPU loaded on `core`, if any.
    pub fn vcpu_on(&self, core: usize) -> Option<usize> {
        self.on_core
            .get(core)?
            .iter()
            .copied()
            .find(|&v| self.vcpus[v].loaded)
    }

    /// The vCPU whose fixed interrupts `core` takes: the one loaded there,
    /// else the one that last ran there. A fixed IPI sent to a vCPU while
    /// it ran can reach its core after the schedule-out; the core is still
    /// its until another vCPU is loaded.
    pub fn vcpu_owning(&self, core: usize) -> Option<usize> {
        self.vcpu_on(core)
            .or_else(|| self.last_vcpu.get(core).copied().flatten())
            .or_else(|| self.on_core.get(core)?.first().copied())
    }

    /// The vCPU whose core a remapped (hardware-delivered) device interrupt
    /// of `vm` is aimed at: the first of its IRQ affinity. An IRTE names
    /// one destination.
    pub fn device_home(&self, vm: usize) -> usize {
        let v = &self.vms[vm];
        v.irq_affinity.first().copied().unwrap_or(v.vcpus[0])
    }

    /// The vCPU KVM's software delivery picks for a device interrupt of
    /// `vm` (`kvm_irq_delivery_to_apic`): the one named, or with
    /// lowest-priority delivery the vCPU of the set with the smallest
    /// `apic_arb_prio` (ties to the lowest APIC ID), whose count then grows.
    pub fn device_vcpu(&mut self, vm: usize) -> usize {
        let v = &self.vms[vm];
        if !v.msi_lowest_priority || v.irq_affinity.len() < 2 {
            return self.device_home(vm);
        }
        let pick = v
            .irq_affinity
            .iter()
            .copied()
            .min_by_key(|&c| (self.vcpus[c].arb_prio, self.vcpus[c].index))
            .unwrap_or(v.vcpus[0]);
        self.vcpus[pick].arb_prio += 1;
        pick
    }

    /// Where a device MSI of `vm` delivered through KVM's irq routing
    /// (`kvm_set_irq`) goes: the vCPU KVM's delivery picks, unless ES2's
    /// redirection (§2.7) rewrites the destination of a lowest-priority
    /// MSI to a running vCPU of the VM. Any vCPU qualifies, not only the
    /// MSI's destination set: a guest in flat logical mode (the mode that
    /// uses lowest-priority delivery, up to 8 CPUs) allocates every device
    /// vector on all CPUs (Linux 4.4 `flat_vector_allocation_domain`,
    /// `APIC_ALL_CPUS`, because some CPUs do not honour the destination
    /// set under lowest priority), so a one-vCPU affinity that irqbalance
    /// wrote is still redirectable; fixed (physical) mode is not.
    pub fn msi_destination(&mut self, vm: usize) -> usize {
        let v = &self.vms[vm];
        let redirects = self.redirect[vm].is_some() && v.msi_lowest_priority;
        if !redirects {
            return self.device_vcpu(vm);
        }
        let original = self.device_home(vm);
        let (vms, vcpus) = (&self.vms, &self.vcpus);
        let r = self.redirect[vm].as_mut().expect("checked above");
        r.destination(original, &vms[vm].vcpus, |c| vcpus[c].index)
    }

    /// Where ES2's redirection would point `vm`'s VT-d posted-format IRTE
    /// now (None: redirection off, or the MSI is not lowest-priority).
    pub fn posted_irte_target(&self, vm: usize) -> Option<usize> {
        let v = &self.vms[vm];
        if !v.msi_lowest_priority {
            return None;
        }
        let r = self.redirect[vm].as_ref()?;
        r.peek(&v.vcpus, |c| self.vcpus[c].index)
    }

    /// KVM's preempt notifier `kvm_sched_in`: `vcpu` is about to run.
    pub fn sched_in(&mut self, vcpu: usize) {
        let vm = self.vcpus[vcpu].vm;
        if let Some(r) = &mut self.redirect[vm] {
            r.sched_in(vcpu);
        }
    }

    /// `kvm_sched_out`: `vcpu` was descheduled.
    pub fn sched_out(&mut self, vcpu: usize) {
        let vm = self.vcpus[vcpu].vm;
        if let Some(r) = &mut self.redirect[vm] {
            r.sched_out(vcpu);
        }
    }

    /// The vCPU of `vm` whose guest APIC ID is `apic_id`.
    pub fn vcpu_by_apic_id(&self, vm: usize, apic_id: u32) -> Option<usize> {
        self.vms[vm].vcpus.get(apic_id as usize).copied()
    }

    /// The eventfd registered for VM `vm`'s writes to `port`, if any.
    pub fn ioeventfd(&self, vm: usize, port: u16) -> Option<u16> {
        self.ioeventfds_by_vm
            .get(vm)?
            .iter()
            .find(|&&(p, _)| p == port)
            .map(|&(_, fd)| fd)
    }

    /// The VM and assignment owning host vector `v` taken on `core`, if it
    /// is a VF's. Past [`host::HOST_DEVICE_VECTORS`] VFs, VFs share vectors
    /// (Linux's vectors are per core): the one whose VM's device vCPU
    /// runs on `core` owns it there.
    pub fn vf_by_host_vector(&self, core: usize, v: u8) -> Option<(usize, VfAssignment)> {
        let vms = self.vf_by_vector.get(v as usize)?;
        let vm = match vms[..] {
            [] => return None,
            [vm] => vm,
            _ => vms
                .iter()
                .copied()
                .find(|&vm| self.vcpus[self.device_home(vm)].core == core)
                .unwrap_or(vms[0]),
        };
        self.vms[vm].vf.map(|a| (vm, a))
    }
}

/// The hypervisor's handle on the platform during one hook.
pub struct HvCx<'a> {
    /// Current time.
    pub now: Time,
    /// Hardware.
    pub m: &'a mut Machine,
    /// Hypervisor state.
    pub hv: &'a mut HvState,
    /// Event queue (for effects of register writes).
    pub q: &'a mut EventQueue<Ev>,
    /// Guest kernels, read only: the VMCS guest-state area (RFLAGS.IF).
    pub guests: &'a [Kernel],
    /// Costs.
    pub costs: &'a HvCosts,
    /// Host work charged by this hook, added to the exit's service time.
    pub charged: Time,
}

impl HvCx<'_> {
    /// Adds host work to the current exit.
    pub fn charge(&mut self, t: Time) {
        self.charged += t;
    }

    /// Guest RFLAGS.IF of `vcpu`.
    pub fn guest_if(&self, vcpu: usize) -> bool {
        let v = &self.hv.vcpus[vcpu];
        self.guests[v.vm].interrupts_enabled(v.index)
    }

    /// Whether `vcpu`'s core is in guest mode running it right now.
    /// `kvm_vcpu_kick` for a halted vCPU: an interrupt is now pending for
    /// it, so its thread wakes (the world does it: the host scheduler
    /// decides when it runs).
    pub fn kick(&mut self, vcpu: usize) {
        if self.hv.vcpus[vcpu].halted {
            self.q
                .schedule_in(0, crate::world::event::Ev::WakeVcpu { vcpu: vcpu as u16 });
        }
    }

    /// Whether `vcpu` is in guest mode on its core.
    pub fn in_guest_mode(&self, vcpu: usize) -> bool {
        let c = self.hv.vcpus[vcpu].core;
        self.m.cores[c].mode == CoreMode::Guest { vcpu }
    }

    /// Host code writes a register of `core`'s physical LAPIC. Returns the
    /// EOI result for EOI writes.
    pub fn apic_write(&mut self, core: usize, reg: u32, value: u64) -> Option<Option<u8>> {
        let eff = self.m.lapics[core]
            .write_msr(reg, value, self.now)
            .unwrap_or(ApicEffect::None);
        schedule_apic_effect(self.q, self.m, core, eff, self.costs.ipi_timing())
    }

    /// Sends an IPI from `from` to `to` through `from`'s ICR.
    pub fn send_ipi(&mut self, from: usize, to: usize, vector: u8, mode: DeliveryMode) {
        let dm: u64 = match mode {
            DeliveryMode::Fixed => 0,
            DeliveryMode::LowestPriority => 1,
            DeliveryMode::Nmi => 4,
        };
        let id = self.m.cores[to].apic_id as u64;
        self.apic_write(from, msr::ICR, (id << 32) | (dm << 8) | vector as u64);
    }

    /// Writes an IRT entry and invalidates the interrupt-entry cache for it.
    pub fn irt_update(&mut self, index: u16, irte: Irte) {
        if self.m.irt.write(index, irte).is_ok() {
            self.m.irt.invalidate(index);
        }
        self.charge(self.costs.irt_update);
    }

    /// Arms a host hrtimer for `core` and reprograms the serving LAPIC.
    pub fn host_timer_start(&mut self, core: usize, at: Time, t: HostTimer) {
        let s = self.hv.host.add(core, at, t);
        self.host_timer_reprogram(s);
    }

    /// Cancels host timers matching `f`, which matches only timers of
    /// `vcpu`, and reprograms the serving LAPICs.
    pub fn host_timer_cancel(&mut self, vcpu: usize, f: impl FnMut(&HostTimer) -> bool) {
        let touched = self.hv.host.cancel_of(vcpu, f);
        for s in touched.iter() {
            self.host_timer_reprogram(s);
        }
    }

    /// Programs core `s`'s LAPIC timer (TMICT, one-shot) for its earliest
    /// host timer, unless its timer now belongs to a guest.
    pub fn host_timer_reprogram(&mut self, s: usize) {
        if self.hv.host.serving[s] != s {
            return;
        }
        let next = self.hv.host.next(s);
        if next == self.hv.host.programmed[s] {
            return;
        }
        self.hv.host.programmed[s] = next;
        let count = match next {
            None => 0,
            Some(t) => t
                .saturating_sub(self.now)
                .div_ceil(self.costs.apic_timer_period.max(1))
                .clamp(1, u32::MAX as u64),
        };
        self.apic_write(s, msr::TMICT, count);
    }

    /// Moves the first host timer matching `f` to be served by `to`'s LAPIC
    /// timer (an hrtimer migrated to a housekeeping core).
    pub fn host_timer_move(&mut self, f: impl FnMut(&HostTimer) -> bool, to: usize) {
        if let Some((s, at, t)) = self.hv.host.take_first(f) {
            self.host_timer_reprogram(s);
            let s2 = self.hv.host.serving[to];
            self.hv.host.add(s2, at, t);
            self.host_timer_reprogram(s2);
        }
    }

    /// `kvm_migrate_timers` when `vcpu` is loaded on a core other than
    /// `from`: the hrtimer emulating its LAPIC timer, if it ran on `from`'s
    /// queue, restarts on its new core (`hrtimer_start_expires` on the
    /// current CPU). One kept elsewhere (a housekeeping core) stays.
    pub fn migrate_guest_timer(&mut self, vcpu: usize, from: usize) {
        let s = self.hv.host.serving[from];
        let to = self.hv.host.serving[self.hv.vcpus[vcpu].core];
        if s == to {
            return;
        }
        let mine = |t: &HostTimer| matches!(t, HostTimer::GuestTimer { vcpu: v, .. } if *v == vcpu);
        if let Some((at, t)) = self.hv.host.take_first_on(s, mine) {
            self.host_timer_reprogram(s);
            self.hv.host.add(to, at, t);
            self.host_timer_reprogram(to);
        }
    }

    /// The host's view of `core`'s LAPIC timer is gone (a scheme handed it to
    /// a guest): forget what it programmed there.
    pub fn host_timer_forget(&mut self, core: usize) {
        self.hv.host.programmed[core] = None;
    }
}
