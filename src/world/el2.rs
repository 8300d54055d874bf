//! ARM with EL2 on the platform: the sibling of `world::vmx`. What a core
//! in guest mode does about pending interrupts (HCR_EL2.IMO/FMO route a
//! physical IRQ/FIQ to EL2 or to the guest; the virtual CPU interface and,
//! with GICv4, the resident vPE's vLPIs signal the guest's virtual IRQ),
//! how the guest kernel's operations execute (ICC_EOIR1_EL1, CNTV_CVAL_EL0,
//! ICC_SGI1R_EL1 and WFI, each trapping or not as the EL2 controls say),
//! and the exit -> handler -> host interrupts -> vgic flush -> entry path,
//! with the world switches of VHE or split mode. The scheme
//! (`hv::arm::ArmScheme`) acts only through `hv::arm::ArmCx`.

use super::arch::{ArchExit, OpResult};
use super::build::VIRTIO_NET_VECTORS;
use super::event::Ev;
use super::World;
use crate::engine::{Summary, Time, SEC};
use crate::guest::app::Metrics;
use crate::guest::{Clockevent, KernelOp, RESCHEDULE_VECTOR};
use crate::hv::arm::intids::{
    nic_spi, virtio_spi, DOORBELL_LPI_BASE, GUEST_CALL_FUNC_SGI, GUEST_RESCHEDULE_SGI, KICK_SGI,
    NIC_SPI_BASE, VF_VLPI, VIRTIO_SPI_BASE,
};
use crate::hv::arm::{
    vtimer_write, ArmCosts, ArmCx, ArmExit, ArmExitReason, ArmScheme, ArmVcpu, EventClass,
    ExitAction,
};
use crate::hw::arm::cpu_interface::{encode_sgi1r, IccReg};
use crate::hw::arm::el2::SysregOutcome;
use crate::hw::arm::intid::{CoreSet, MAINTENANCE_PPI, SPI_BASE, SPI_LIMIT, SPURIOUS, VTIMER_PPI};
use crate::hw::arm::its::MsiOutcome;
use crate::hw::arm::machine::ArmMachine;
use crate::hw::arm::priority::Group;
use crate::hw::arm::timer::{CntReg, CTL_ENABLE, CTL_IMASK};
use crate::hw::arm::vcpu_interface::LrState;
use crate::hw::x86::core::CoreMode;
use crate::report::trace::TraceKind;

/// The vector a guest handler runs for an interrupt it did not expect
/// (Linux's `handle_bad_irq`): never raised, so the checker reports it.
const UNEXPECTED_VECTOR: u8 = 0x30;

/// The guest's clockevent on ARM: the EL1 virtual timer (arch_timer,
/// `arch_timer_set_next_event_virt` writes CNTV_CVAL and CNTV_CTL); Linux
/// registers it with a minimum delta of 0xF ticks; it has no boot-time
/// setup writes (no LVT, no divider).
pub(super) fn arch_timer_clockevent(frequency_hz: u64) -> Clockevent {
    Clockevent {
        tick: SEC / frequency_hz.max(1),
        min_delta_ticks: 0xF,
        init_steps: 0,
    }
}

/// One exit in progress on a core.
#[derive(Clone, Copy, Debug)]
pub(super) struct El2Exit {
    vcpu: usize,
    exit: Option<ArmExit>,
    start: Time,
    stage: El2Stage,
    /// Halt polling began (a halted vCPU polls once per WFI).
    polled: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum El2Stage {
    /// The handler's work.
    Handler,
    /// Host interrupts taken between steps (or a vCPU being loaded).
    HostIrq,
    /// kvm_vcpu_halt polling for an interrupt.
    Polling,
    /// The vgic flush before entry.
    Entering,
}

/// Per VM: exits by reason and their service time (the `arm.exits.*`
/// metrics: an exit counts when it begins, its time when it resumes).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ArmVmStats {
    exits: [u64; ArmExitReason::ALL.len()],
    exit_time: [Time; ArmExitReason::ALL.len()],
}

/// The ARM side of a world.
pub(super) struct El2World {
    pub(super) m: ArmMachine,
    pub(super) scheme: Box<dyn ArmScheme>,
    pub(super) vcpus: Vec<ArmVcpu>,
    pub(super) costs: ArmCosts,
    kicks: u64,
    exits: Vec<Option<El2Exit>>,
    /// Per core: why the last SGI it received was sent.
    sgi_class: Vec<EventClass>,
    /// Per vCPU: halt polling (generation).
    polling: Vec<Option<u64>>,
    poll_gen: u64,
    /// Per vCPU: a wake-up is on its way.
    waking: Vec<bool>,
    /// Per vCPU: when its vPE's doorbell rang, until it next enters.
    doorbell_at: Vec<Option<Time>>,
    /// Per vCPU: the guest event its last doorbell was rung for (a vLPI
    /// is a device interrupt, a GICv4.1 vSGI an IPI).
    doorbell_class: Vec<EventClass>,
    /// Per core: at the last scheduler tick, the core was idle while the
    /// host scheduler ran a vCPU thread there (the vCPU it names).
    idle_current: Vec<Option<usize>>,
    stats: Vec<ArmVmStats>,
    /// Per vCPU: the service time of each completed exit that began in
    /// the measured interval, by reason (the exit table, as x86's
    /// `ExitStats` records at VM entry or at the block that ends a WFx).
    exit_table: Vec<[Summary; ArmExitReason::ALL.len()]>,
    timer_vector: u8,
    vf_vector: u8,
    measuring: bool,
    /// Per vCPU: since when its guest has been idle in guest mode (a WFI
    /// that did not trap, on did-arm's dedicated cores, or the idle=poll
    /// loop): guest time to the host, idle time to the guest.
    idle_since: Vec<Option<Time>>,
    /// Per vCPU: that guest-mode idle time in the measured interval.
    idle_time: Vec<Time>,
    /// The VMs' NICs are wired to SPIs (`net.device = "spi-nic"`; VM
    /// `vm`'s NIC is VF `vm` on SPI `nic_spi(vm)`), not MSIs to the ITS.
    wired_nic: bool,
    /// Per VM: its NIC drives its interrupt line high (from an interrupt
    /// until its driver masks it at the device).
    nic_line: Vec<bool>,
    /// Per vCPU: since when it halts in a WFI that trapped (until it runs
    /// again): KVM's halt-poll bookkeeping.
    halt_start: Vec<Option<Time>>,
    /// Per vCPU: since when KVM halt-polls for it.
    poll_since: Vec<Option<Time>>,
    /// Halt polling in the measured interval: its time and episodes.
    poll_time: Time,
    polls: u64,
    /// Per vCPU: since when its guest kernel runs its idle task (from its
    /// WFI, trapped or not, or its idle=poll loop, to the interrupt that
    /// ends it): /proc/stat's idle as the guest's mpstat reads it.
    idle_task_since: Vec<Option<Time>>,
    /// Per vCPU: that idle-task time in the measured interval.
    idle_task_time: Vec<Time>,
    /// The board's cpuidle states (`[machine] board`), if any.
    pub(in crate::world) cpuidle: Option<CpuIdle>,
    /// Per core: a core leaving an idle state is awake at this time.
    idle_exit_at: Vec<Option<Time>>,
    /// Per vCPU: in an untrapped WFI, the exit latency of the idle state
    /// its core entered.
    wfi_exit_latency: Vec<Option<Time>>,
    /// Per core: the host interrupt work just taken on it, which a kick
    /// it caused on that core (a halt-polling or blocked vCPU's) follows.
    irq_charge: Vec<Time>,
}

/// A board's cpuidle states (tegra194: C1 = WFI, C6 = core power-gated),
/// as the menu governor uses them: the deepest state whose target
/// residency the predicted idle covers.
#[derive(Clone, Copy, Debug)]
pub(in crate::world) struct CpuIdle {
    /// C1's exit latency.
    pub c1_exit: Time,
    /// C6's exit latency.
    pub c6_exit: Time,
    /// C6's target residency.
    pub c6_residency: Time,
}

impl CpuIdle {
    /// The exit latency of the state an idle predicted to last `predicted`
    /// enters.
    pub(super) fn exit_latency(&self, predicted: Time) -> Time {
        if predicted >= self.c6_residency {
            self.c6_exit
        } else {
            self.c1_exit
        }
    }
}

impl El2World {
    /// The ARM side of a world of `cores` cores and `vms` VMs.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        m: ArmMachine,
        scheme: Box<dyn ArmScheme>,
        vcpus: Vec<ArmVcpu>,
        costs: ArmCosts,
        cores: usize,
        vms: usize,
        timer_vector: u8,
        vf_vector: u8,
        wired_nic: bool,
    ) -> Self {
        let n = vcpus.len();
        El2World {
            m,
            scheme,
            vcpus,
            costs,
            kicks: 0,
            exits: vec![None; cores],
            sgi_class: vec![EventClass::Other; cores],
            polling: vec![None; n],
            poll_gen: 0,
            waking: vec![false; n],
            doorbell_at: vec![None; n],
            doorbell_class: vec![EventClass::Device; n],
            idle_current: vec![None; cores],
            stats: vec![ArmVmStats::default(); vms],
            exit_table: vec![[Summary::default(); ArmExitReason::ALL.len()]; n],
            timer_vector,
            vf_vector,
            measuring: false,
            idle_since: vec![None; n],
            idle_time: vec![0; n],
            wired_nic,
            nic_line: vec![false; vms],
            halt_start: vec![None; n],
            poll_since: vec![None; n],
            poll_time: 0,
            polls: 0,
            idle_task_since: vec![None; n],
            idle_task_time: vec![0; n],
            cpuidle: None,
            idle_exit_at: vec![None; cores],
            wfi_exit_latency: vec![None; n],
            irq_charge: vec![0; cores],
        }
    }

    /// Whether VM `vm`'s NIC is on a wire it holds high now.
    pub(super) fn nic_line_held(&self, vm: usize) -> bool {
        self.wired_nic && self.nic_line.get(vm) == Some(&true)
    }

    /// The guest of VM `vm`'s INTID for its handler `vector` (its irq
    /// domain: Linux numbers arm64 IPIs from SGI 0, the virtual timer is
    /// PPI 27, the VF's MSI its first LPI, a wired NIC its SPI).
    pub(super) fn intid_of(&self, vector: u8, vm: usize) -> u32 {
        match vector {
            v if v == self.timer_vector => VTIMER_PPI,
            v if v == self.vf_vector && self.wired_nic => nic_spi(vm),
            v if v == self.vf_vector => VF_VLPI,
            v if v == VIRTIO_NET_VECTORS[0] => virtio_spi(vm, 0),
            v if v == VIRTIO_NET_VECTORS[1] => virtio_spi(vm, 1),
            RESCHEDULE_VECTOR => GUEST_RESCHEDULE_SGI,
            crate::guest::rps::CALL_FUNCTION_SINGLE_VECTOR => GUEST_CALL_FUNC_SGI,
            _ => SPURIOUS,
        }
    }

    /// The guest handler an acknowledged INTID runs.
    fn vector_of(&self, intid: u32) -> u8 {
        match intid {
            VTIMER_PPI => self.timer_vector,
            VF_VLPI => self.vf_vector,
            i if self.wired_nic
                && (NIC_SPI_BASE..NIC_SPI_BASE + self.nic_line.len() as u32).contains(&i) =>
            {
                self.vf_vector
            }
            GUEST_RESCHEDULE_SGI => RESCHEDULE_VECTOR,
            GUEST_CALL_FUNC_SGI => crate::guest::rps::CALL_FUNCTION_SINGLE_VECTOR,
            i if (VIRTIO_SPI_BASE..VIRTIO_SPI_BASE + 2 * self.nic_line.len() as u32)
                .contains(&i) =>
            {
                VIRTIO_NET_VECTORS[((i - VIRTIO_SPI_BASE) % 2) as usize]
            }
            _ => UNEXPECTED_VECTOR,
        }
    }

    /// `vcpu`'s halt polling (if any) ended at `now`: its time counts if
    /// it began in the measured interval.
    fn poll_end(&mut self, vcpu: usize, now: Time, measure_start: Time) {
        if let Some(since) = self.poll_since[vcpu].take() {
            if self.measuring && since >= measure_start {
                self.poll_time += now - since;
                self.polls += 1;
            }
        }
    }

    /// `vcpu`'s guest kernel enters its idle task at `now`.
    pub(super) fn idle_task_start(&mut self, vcpu: usize, now: Time) {
        self.idle_task_since[vcpu].get_or_insert(now);
    }

    /// `vcpu`'s idle task ends at `now` (an interrupt reached it).
    fn idle_task_end(&mut self, vcpu: usize, now: Time, measure_start: Time) {
        if let Some(since) = self.idle_task_since[vcpu].take() {
            self.idle_task_time[vcpu] += now.saturating_sub(since.max(measure_start));
        }
    }

    /// Whether `vcpu` is halt-polling (kvm_vcpu_halt before it blocks).
    pub(super) fn is_polling(&self, vcpu: usize) -> bool {
        self.polling[vcpu].is_some()
    }

    /// The end of the warm-up.
    pub(super) fn reset_stats(&mut self) {
        self.stats.iter_mut().for_each(|s| *s = Default::default());
        self.exit_table
            .iter_mut()
            .for_each(|t| *t = Default::default());
        self.idle_time.fill(0);
        self.idle_task_time.fill(0);
        self.poll_time = 0;
        self.polls = 0;
        self.measuring = true;
    }

    /// `vcpu`'s guest idles in guest mode from `now` (an untrapped WFI,
    /// or the idle=poll loop), unless it already does.
    pub(super) fn guest_idle_start(&mut self, vcpu: usize, now: Time) {
        self.idle_since[vcpu].get_or_insert(now);
        self.idle_task_start(vcpu, now);
    }

    /// `vcpu`'s guest-mode idle (if any) ends at `until`: its part in the
    /// measured interval (from `measure_start`) counts as guest idle.
    pub(super) fn guest_idle_end(&mut self, vcpu: usize, until: Time, measure_start: Time) {
        if let Some(since) = self.idle_since[vcpu].take() {
            self.idle_time[vcpu] += until.saturating_sub(since.max(measure_start));
        }
    }

    /// Each VM's ARM exits by reason (VM 0's by their plain names), as
    /// `perf kvm stat` on arm64 names them, and their mean service time.
    pub(super) fn metrics(&self, out: &mut Metrics, dur: f64, vms: &[crate::hv::VmState]) {
        for (vm, s) in self.stats.iter().enumerate() {
            let p = crate::report::vm_prefix(vm);
            if let Some(v) = vms.get(vm) {
                self.cpu_metrics(&p, v, out, dur);
            }
            let total: u64 = s.exits.iter().sum();
            out.insert(format!("{p}arm.exits_per_s"), total as f64 / dur);
            if let Some(v) = vms.get(vm) {
                self.mpstat_metrics(&p, v, out, dur);
            }
            for r in ArmExitReason::ALL {
                let n = s.exits[r as usize];
                if n > 0 {
                    out.insert(format!("{p}arm.exits.{}", r.name()), n as f64);
                    out.insert(
                        format!("{p}arm.exit_us.{}", r.name()),
                        crate::engine::as_us(s.exit_time[r as usize]) / n as f64,
                    );
                }
            }
        }
    }
}

impl El2World {
    /// A VM's CPU time as `mpstat -P <its vCPUs' cores>` would split it,
    /// averaged over its vCPUs: the host's view (`%guest`: guest mode,
    /// which includes a WFI that does not trap; `%sys` + `%irq`: the
    /// exits' service at EL2 and in the host kernel, from the exit table,
    /// so a WFx exit counts up to its block; the rest idle or another
    /// thread's) and the guest's own (busy = guest mode outside its idle
    /// task: an untrapped WFI or the idle=poll loop).
    /// mpstat reads these from /proc/stat's per-CPU guest, system, irq and
    /// idle counters (Linux `account_guest_time`, `vtime_account_*`).
    fn cpu_metrics(&self, p: &str, vm: &crate::hv::VmState, out: &mut Metrics, dur: f64) {
        let cpu_time = vm.vcpus.len() as f64 * dur * crate::engine::SEC as f64;
        if cpu_time <= 0.0 {
            return;
        }
        let pct = |t: Time| 100.0 * t as f64 / cpu_time;
        let exits: Time = vm
            .vcpus
            .iter()
            .flat_map(|&v| self.exit_table[v].iter())
            .map(|s| s.total)
            .sum();
        let idle: Time = vm.vcpus.iter().map(|&v| self.idle_time[v]).sum();
        let guest = vm.stats.guest_time;
        let (g, h) = (pct(guest), pct(exits));
        out.insert(format!("{p}cpu.guest_pct"), g);
        out.insert(format!("{p}cpu.host_pct"), h);
        // In whole nanoseconds, so that a fully busy core shows 0 exactly.
        let rest = (cpu_time as Time).saturating_sub(guest + exits);
        out.insert(format!("{p}cpu.idle_pct"), pct(rest));
        out.insert(
            format!("{p}cpu.guest_busy_pct"),
            pct(guest.saturating_sub(idle)),
        );
    }

    /// CPU utilisation as mpstat computes it inside the guest (the
    /// client's view of its own CPUs: 100 − %idle from /proc/stat, where
    /// idle is the time its idle task runs, trapped WFI included, since
    /// the guest has no steal-time source on this host): per vCPU
    /// (`cpu.mpstat.cpuN.busy_pct`) and averaged (`cpu.mpstat.busy_pct`).
    /// Also KVM's halt polling: its mean time per episode and episodes/s.
    fn mpstat_metrics(&self, p: &str, vm: &crate::hv::VmState, out: &mut Metrics, dur: f64) {
        let span = dur * crate::engine::SEC as f64;
        if span <= 0.0 || vm.vcpus.is_empty() {
            return;
        }
        let mut sum = 0.0;
        for (i, &v) in vm.vcpus.iter().enumerate() {
            let busy = 100.0 * (1.0 - (self.idle_task_time[v] as f64 / span).min(1.0));
            out.insert(format!("{p}cpu.mpstat.cpu{i}.busy_pct"), busy);
            sum += busy;
        }
        out.insert(
            format!("{p}cpu.mpstat.busy_pct"),
            sum / vm.vcpus.len() as f64,
        );
        if p.is_empty() {
            let mean = if self.polls > 0 {
                crate::engine::as_us(self.poll_time) / self.polls as f64
            } else {
                0.0
            };
            out.insert("arm.halt_poll_us_mean".into(), mean);
            out.insert("arm.halt_polls_per_s".into(), self.polls as f64 / dur);
        }
    }

    /// The exit tables by arm64 exception class ([`ArmExitReason`]): per
    /// VM the sum of its vCPUs', per vCPU its own (`vms[vm]` lists the
    /// VM's vCPUs in index order).
    pub(super) fn exit_tables(&self, vms: &[crate::hv::VmState]) -> crate::report::ExitTables {
        let per_vcpu = |vm: &crate::hv::VmState| -> Vec<Vec<Summary>> {
            vm.vcpus
                .iter()
                .map(|&v| self.exit_table[v].to_vec())
                .collect()
        };
        let vcpus: Vec<Vec<Vec<Summary>>> = vms.iter().map(per_vcpu).collect();
        let sum = |cs: &Vec<Vec<Summary>>| -> Vec<Summary> {
            let mut t = vec![Summary::default(); ArmExitReason::ALL.len()];
            for c in cs {
                for (a, b) in t.iter_mut().zip(c) {
                    a.merge(b);
                }
            }
            t
        };
        crate::report::ExitTables {
            names: ArmExitReason::ALL.iter().map(|r| r.name()).collect(),
            vms: vcpus.iter().map(sum).collect(),
            vcpus,
        }
    }
}

impl World {
    /// An exit of `vcpu` that began at `start` with `exit` ended now: its
    /// service time in the exit table if it began while measuring.
    fn el2_exit_done(&mut self, vcpu: usize, exit: Option<ArmExit>, start: Time) {
        let now = self.q.now();
        let measure_start = self.measure_start;
        let a = self.el2.as_deref_mut().expect("an ARM world");
        if let Some(x) = exit {
            if a.measuring && start >= measure_start {
                a.exit_table[vcpu][x.reason() as usize].record(now - start);
            }
        }
    }

    fn arm(&mut self) -> &mut El2World {
        self.el2.as_mut().expect("an ARM world")
    }

    /// The scheme with its context.
    fn arm_cx(&mut self) -> (ArmCx<'_>, &mut Box<dyn ArmScheme>) {
        let now = self.q.now();
        let a = self.el2.as_deref_mut().expect("an ARM world");
        (
            ArmCx {
                now,
                m: &mut a.m,
                hv: &mut self.hv,
                vcpus: &mut a.vcpus,
                q: &mut self.q,
                costs: &a.costs,
                kicks: &mut a.kicks,
                charged: 0,
            },
            &mut a.scheme,
        )
    }

    /// What the guest on `core` does about pending interrupts: an FIQ or
    /// IRQ that exits, a physical Group-1 IRQ the guest takes itself
    /// (IMO = 0), a virtual IRQ from its list registers or resident vPE,
    /// or nothing.
    pub(super) fn el2_pending(&mut self, core: usize) -> Option<Result<ArchExit, u8>> {
        let CoreMode::Guest { vcpu } = self.m.cores[core].mode else {
            return None;
        };
        let (k, c) = self.kcpu(vcpu);
        let if_on = self.guests[k].interrupts_enabled(c);
        let now = self.q.now();
        let a = self.el2.as_deref_mut().expect("an ARM world");
        // A core in an idle state wakes after its exit latency: what is
        // pending waits until then.
        if let Some(lat) = a.wfi_exit_latency[vcpu].filter(|&l| l > 0) {
            let m = &a.m;
            if m.irq_line(core) || m.fiq_line(core) {
                match a.idle_exit_at[core] {
                    None => {
                        a.idle_exit_at[core] = Some(now + lat);
                        self.q
                            .schedule_in(lat, Ev::ArmIdleExit { core: core as u16 });
                        return None;
                    }
                    Some(t) if now < t => return None,
                    Some(_) => {
                        a.idle_exit_at[core] = None;
                        a.wfi_exit_latency[vcpu] = None;
                    }
                }
            }
        }
        let m = &mut a.m;
        let ctl = m.el2[core];
        if ctl.physical_fiq_exits() && m.fiq_line(core) {
            return Some(Ok(ArchExit::El2(ArmExit::Fiq)));
        }
        if m.irq_line(core) {
            if ctl.physical_irq_exits() {
                return Some(Ok(ArchExit::El2(ArmExit::Irq)));
            }
            if if_on {
                let intid = m.cpus[core].read_iar1(&mut m.dist, &mut m.redists[core]);
                if intid != SPURIOUS {
                    return Some(Err(self.el2_taken(core, intid)));
                }
            }
        }
        if ctl.virtual_irqs_enabled() && if_on {
            let mut direct = m.redists[core].direct_vlpis(&mut m.vlpis);
            if m.vifs[vcpu].virq_line(direct.as_ref()) {
                let intid = m.vifs[vcpu].read_iar1(direct.as_mut());
                if intid != SPURIOUS {
                    return Some(Err(self.el2_taken(core, intid)));
                }
            }
        }
        None
    }

    /// The guest acknowledged `intid`: the handler it runs. The timer's
    /// (`arch_timer_handler_virt`) first masks the timer (CNTV_CTL.IMASK),
    /// which drops its output.
    fn el2_taken(&mut self, core: usize, intid: u32) -> u8 {
        let now = self.q.now();
        let ms = self.measure_start;
        let vcpu = self.kernel_of(core);
        let a = self.el2.as_deref_mut().expect("an ARM world");
        if vcpu < a.idle_task_since.len() {
            a.idle_task_end(vcpu, now, ms);
            a.wfi_exit_latency[vcpu] = None;
        }
        let vector = a.vector_of(intid);
        if intid == VTIMER_PPI {
            let ctl = a.m.timers[core].read(CntReg::VCtl, now) & (CTL_ENABLE | CTL_IMASK);
            vtimer_write(
                &mut a.m,
                &mut self.q,
                core,
                CntReg::VCtl,
                ctl | CTL_IMASK,
                now,
            );
        }
        vector
    }

    /// The guest kernel's operation `op` on `core`, as the instruction it
    /// is on arm64.
    pub(super) fn el2_op(&mut self, core: usize, vcpu: usize, op: KernelOp) -> OpResult {
        let now = self.q.now();
        let vm = self.hv.vcpus[vcpu].vm;
        match op {
            KernelOp::EndOfInterrupt { vector } => {
                self.trace_event(TraceKind::Eoi { vector }, core, vcpu, now, now);
                let a = self.arm();
                let intid = a.intid_of(vector, vm);
                let m = &mut a.m;
                let cleared =
                    match m.el2[core].sysreg_outcome(IccReg::Eoir1, true, &m.vifs[vcpu].hcr()) {
                        SysregOutcome::Trap => {
                            return OpResult::Exit(
                                ArchExit::El2(ArmExit::Sys64 {
                                    reg: IccReg::Eoir1,
                                    value: u64::from(intid),
                                }),
                                Some(vector),
                            );
                        }
                        // ICV_EOIR1_EL1: the LR deactivates; with HW = 1 the
                        // physical INTID too.
                        SysregOutcome::Virtual => {
                            let mut direct = m.redists[core].direct_vlpis(&mut m.vlpis);
                            let out = m.vifs[vcpu].guest_eoir(
                                intid,
                                direct.as_mut(),
                                &mut m.dist,
                                &mut m.redists[core],
                            );
                            let level = m.vifs[vcpu].maintenance_line();
                            let _ = m.redists[core].set_ppi_line(MAINTENANCE_PPI, level);
                            out.ok().and_then(|o| o.dropped).map(|_| vector)
                        }
                        // ICC_EOIR1_EL1 on the core's own interface.
                        SysregOutcome::Physical => m.cpus[core]
                            .write_eoir1(intid, &mut m.dist, &mut m.redists[core])
                            .ok()
                            .and_then(|o| o.dropped)
                            .map(|_| vector),
                    };
                self.checker.eoi(vcpu, vector, cleared, now);
                // A level SPI deactivated while its line is still high is
                // pending again: its target core (maybe another) looks.
                if (SPI_BASE..SPI_LIMIT).contains(&intid) && intid >= NIC_SPI_BASE {
                    let b = self.arm().m.dist.bank();
                    if b.is_pending(intid) && !b.is_active(intid) {
                        let vm = (intid - NIC_SPI_BASE) as u16;
                        self.q
                            .schedule_in_async(0, Ev::NicSpi { vm, assert: false });
                    }
                }
                OpResult::Continue
            }
            // CNTV_CVAL_EL0 then CNTV_CTL_EL0: EL1 virtual timer accesses
            // never trap (no CNTHCTL_EL2 trap is set by any scheme).
            KernelOp::ProgramClockevent {
                ticks,
                deadline,
                vector,
            } => {
                self.checker.timer_programmed(vcpu, vector, deadline, now);
                let a = self.el2.as_deref_mut().expect("an ARM world");
                match deadline {
                    Some(_) => {
                        let cval = a.m.timers[core].cntvct(now) + u64::from(ticks);
                        vtimer_write(&mut a.m, &mut self.q, core, CntReg::VCval, cval, now);
                        vtimer_write(&mut a.m, &mut self.q, core, CntReg::VCtl, CTL_ENABLE, now);
                    }
                    None => {
                        vtimer_write(&mut a.m, &mut self.q, core, CntReg::VCtl, 0, now);
                    }
                }
                OpResult::Continue
            }
            KernelOp::ClockeventInit { .. } => OpResult::Continue,
            KernelOp::SendIpi { cpu, vector } => {
                let Some(&t) = self.hv.vms[vm].vcpus.get(cpu as usize) else {
                    return OpResult::Continue;
                };
                self.checker.raised_on(t, vector, now);
                let a = self.el2.as_deref_mut().expect("an ARM world");
                let intid = a.intid_of(vector, vm);
                let mut targets = CoreSet::EMPTY;
                targets.insert(a.vcpus[t].vmpidr_core);
                let value = encode_sgi1r(intid, &targets, false, &a.m.params.topology);
                let m = &mut a.m;
                match m.el2[core].sysreg_outcome(IccReg::Sgi1r, true, &m.vifs[vcpu].hcr()) {
                    SysregOutcome::Trap => OpResult::Exit(
                        ArchExit::El2(ArmExit::Sys64 {
                            reg: IccReg::Sgi1r,
                            value,
                        }),
                        None,
                    ),
                    SysregOutcome::Virtual | SysregOutcome::Physical => {
                        if let Ok(req) = m.cpus[core].write_sgi1r(value) {
                            for d in req.targets.iter() {
                                self.q.schedule_in_async(
                                    a.costs.sgi_latency,
                                    Ev::ArmSgi {
                                        core: d as u16,
                                        intid: req.intid as u8,
                                        class: EventClass::VcpuIpi as u8,
                                    },
                                );
                            }
                        }
                        OpResult::Continue
                    }
                }
            }
            KernelOp::Idle => {
                let a = self.arm();
                a.idle_task_start(vcpu, now);
                if a.m.el2[core].wfi_traps() {
                    OpResult::Exit(ArchExit::El2(ArmExit::Wfx), None)
                } else {
                    // WFI in the guest: the core waits for its IRQ, in the
                    // idle state the board's governor picks for the time
                    // to its next timer event.
                    a.guest_idle_start(vcpu, now);
                    if let Some(c) = a.cpuidle {
                        let predicted = a.m.timers[core]
                            .next_fire(crate::hw::arm::timer::TimerChannel::Virtual, now)
                            .map_or(Time::MAX, |t| t.saturating_sub(now));
                        a.wfi_exit_latency[vcpu] = Some(c.exit_latency(predicted));
                    }
                    OpResult::Wait
                }
            }
            KernelOp::VfWrite { vf, reg } => {
                self.vf_store(vf, reg, now);
                OpResult::Continue
            }
            // A virtio-pci queue notify: a store to the notify region of
            // the device's BAR, which the VM's stage 2 leaves unmapped so
            // that it aborts to EL2 (KVM's ioeventfd on its MMIO bus).
            KernelOp::QueueNotify { port, .. } => {
                if self.arm().m.el2[core].hcr.vm {
                    OpResult::Exit(ArchExit::El2(ArmExit::DataAbort { port }), None)
                } else {
                    OpResult::Continue
                }
            }
            // Refused at build on ARM (the x86 DID module; the vmexit
            // micro-benchmarks, whose self-IPI and TPR tests are x86's).
            KernelOp::Hypercall { .. }
            | KernelOp::PirSet { .. }
            | KernelOp::PostedIpi { .. }
            | KernelOp::SelfIpi { .. }
            | KernelOp::TaskPriority { .. } => OpResult::Continue,
        }
    }

    /// The guest event an exit on `core` is charged to.
    fn el2_exit_class(&self, core: usize, exit: ArmExit) -> EventClass {
        let a = self.el2.as_deref().expect("an ARM world");
        match exit {
            ArmExit::Sys64 {
                reg: IccReg::Sgi1r, ..
            } => EventClass::VcpuIpi,
            ArmExit::Sys64 {
                reg: IccReg::Eoir1, ..
            } => EventClass::Eoi,
            ArmExit::Sys64 { .. } | ArmExit::DataAbort { .. } => EventClass::Other,
            ArmExit::Wfx => EventClass::Idle,
            ArmExit::Fiq => EventClass::HostIpi,
            ArmExit::Irq => {
                let m = &a.m;
                match m.cpus[core].highest_pending(&m.dist, &m.redists[core]) {
                    Some(c) if c.intid == VTIMER_PPI => EventClass::TimerExpiry,
                    Some(c) if c.intid < 16 => a.sgi_class[core],
                    Some(c) if (DOORBELL_LPI_BASE..DOORBELL_LPI_BASE + 1024).contains(&c.intid) => {
                        let v = (c.intid - DOORBELL_LPI_BASE) as usize;
                        a.doorbell_class
                            .get(v)
                            .copied()
                            .unwrap_or(EventClass::Device)
                    }
                    Some(c) if c.intid >= VF_VLPI => EventClass::Device,
                    // A wired device's SPI (a NIC on its line).
                    Some(c) if (SPI_BASE..SPI_LIMIT).contains(&c.intid) => EventClass::Device,
                    _ => EventClass::Other,
                }
            }
        }
    }

    /// The guest on `core` exits to EL2 with `exit`.
    pub(super) fn el2_exit(&mut self, core: usize, exit: ArmExit) {
        let now = self.q.now();
        self.pause_guest(core);
        let CoreMode::Guest { vcpu } = self.m.cores[core].mode else {
            return;
        };
        self.account_guest_time(core, vcpu, now);
        self.m.cores[core].mode = CoreMode::Host { vcpu };
        let class = self.el2_exit_class(core, exit);
        let vm = self.hv.vcpus[vcpu].vm;
        let a = self.arm();
        // Out of guest mode the vCPU interface's state is saved: its
        // maintenance interrupt no longer signals.
        let _ = a.m.redists[core].set_ppi_line(MAINTENANCE_PPI, false);
        let switches = Time::from(a.m.el2[core].world_switches_per_exit());
        let mut base = switches * a.costs.world_switch;
        match exit {
            ArmExit::Sys64 { .. } => base += a.costs.sysreg_decode,
            ArmExit::DataAbort { .. } => base += a.costs.mmio_decode,
            _ => {}
        }
        if exit == ArmExit::Wfx {
            a.halt_start[vcpu] = Some(now);
        }
        if a.measuring {
            a.stats[vm].exits[exit.reason() as usize] += 1;
        }
        if let Some(e) = &mut self.event_exits {
            e.exit(vm, class);
        }
        let (action, charged) = {
            let (mut cx, scheme) = self.arm_cx();
            let act = scheme.handle_exit(&mut cx, vcpu, exit);
            (act, cx.charged)
        };
        if action == ExitAction::Halt {
            self.hv.vcpus[vcpu].halted = true;
        }
        self.arm().exits[core] = Some(El2Exit {
            vcpu,
            exit: Some(exit),
            start: now,
            stage: El2Stage::Handler,
            polled: false,
        });
        self.el2_kicks();
        self.start_segment(core, base + charged);
    }

    /// The host takes the physical interrupts pending at `core`'s CPU
    /// interface (FIQs, and IRQs unless the loaded guest owns Group 1 with
    /// IMO clear). Returns the work charged.
    fn el2_host_irqs(&mut self, core: usize) -> Time {
        let mut charged = 0;
        for _ in 0..64 {
            let a = self.el2.as_deref_mut().expect("an ARM world");
            let m = &mut a.m;
            let irqs_for_host = m.el2[core].hcr.imo || self.hv.vcpu_on(core).is_none();
            let group = if m.fiq_line(core) {
                Group::G0
            } else if irqs_for_host && m.irq_line(core) {
                Group::G1
            } else {
                break;
            };
            let intid = m.cpus[core].acknowledge(group, &mut m.dist, &mut m.redists[core]);
            if intid == SPURIOUS {
                break;
            }
            let (c, forwarded) = {
                let (mut cx, scheme) = self.arm_cx();
                let f = scheme.host_irq(&mut cx, core, intid);
                (cx.charged, f)
            };
            charged += c.max(1);
            let m = &mut self.arm().m;
            let eoi_mode = m.cpus[core].read_ctlr() & crate::hw::arm::cpu_interface::CTLR_EOIMODE;
            let _ = m.cpus[core].write_eoir1(intid, &mut m.dist, &mut m.redists[core]);
            // EOImode 1 (Linux at EL2): priority drop only; a forwarded
            // interrupt (the virtual timer's, a wired NIC's SPI: in an HW
            // list register) stays active for the guest to deactivate,
            // any other is deactivated now (gic_eoimode1_eoi_irq).
            if eoi_mode != 0 && !forwarded {
                let _ = m.cpus[core].write_dir(intid, &mut m.dist, &mut m.redists[core]);
            }
        }
        // A polling or idle core's kick (below) runs after this work.
        self.arm().irq_charge[core] = charged;
        self.el2_kicks();
        self.arm().irq_charge[core] = 0;
        charged
    }

    /// A host-mode step on `core` ended.
    pub(super) fn el2_stage_done(&mut self, core: usize) {
        let Some(mut e) = self.arm().exits[core] else {
            return;
        };
        match e.stage {
            El2Stage::Entering => return self.el2_entry(core),
            El2Stage::Polling => return,
            El2Stage::Handler | El2Stage::HostIrq => {}
        }
        let charged = self.el2_host_irqs(core);
        if charged > 0 {
            e.stage = El2Stage::HostIrq;
            self.arm().exits[core] = Some(e);
            return self.start_segment(core, charged);
        }
        let vcpu = e.vcpu;
        if self.hv.vcpus[vcpu].halted {
            let (runnable, window) = {
                let (cx, scheme) = self.arm_cx();
                (scheme.has_pending(&cx, vcpu), scheme.halt_poll(&cx, vcpu))
            };
            if runnable {
                self.hv.vcpus[vcpu].halted = false;
            } else if !e.polled && window > 0 && !self.sched_core_contended(core, vcpu) {
                // (Polling only while no other thread wants the core:
                // single_task_running.)
                // kvm_vcpu_halt: poll for an interrupt before blocking.
                e.stage = El2Stage::Polling;
                e.polled = true;
                let now = self.q.now();
                let a = self.arm();
                a.poll_gen += 1;
                let gen = a.poll_gen;
                a.polling[vcpu] = Some(gen);
                a.poll_since[vcpu] = Some(now);
                a.exits[core] = Some(e);
                self.q.schedule_in(
                    window,
                    Ev::ArmPollEnd {
                        vcpu: vcpu as u16,
                        gen,
                    },
                );
                return;
            } else {
                return self.el2_block(core, vcpu);
            }
        }
        let charged = {
            let (mut cx, scheme) = self.arm_cx();
            scheme.flush(&mut cx, vcpu);
            cx.charged
        };
        self.el2_kicks();
        e.stage = El2Stage::Entering;
        self.arm().exits[core] = Some(e);
        if charged > 0 {
            self.start_segment(core, charged);
        } else {
            self.el2_entry(core);
        }
    }

    /// The entry: back in guest mode; the exit's service time recorded.
    fn el2_entry(&mut self, core: usize) {
        let now = self.q.now();
        let Some(e) = self.arm().exits[core].take() else {
            return;
        };
        let vcpu = e.vcpu;
        let vm = self.hv.vcpus[vcpu].vm;
        let measure_start = self.measure_start;
        let a = self.arm();
        if let Some(x) = e.exit {
            if a.measuring && e.start >= measure_start {
                a.stats[vm].exit_time[x.reason() as usize] += now - e.start;
            }
        }
        self.el2_exit_done(vcpu, e.exit, e.start);
        if let Some(since) = self.arm().halt_start[vcpu].take() {
            // The WFI's halt is over: KVM's halt-poll bookkeeping.
            let (mut cx, scheme) = self.arm_cx();
            scheme.halt_ended(&mut cx, vcpu, now - since);
        }
        if std::mem::take(&mut self.deschedule_pending[vcpu]) {
            // The schedule-out waited for the exit to end.
            return self.el2_put(core, vcpu);
        }
        let a = self.arm();
        let level = a.m.vifs[vcpu].maintenance_line();
        let _ = a.m.redists[core].set_ppi_line(MAINTENANCE_PPI, level);
        a.doorbell_at[vcpu] = None;
        self.trace_event(TraceKind::el2_slice(e.exit), core, e.vcpu, e.start, now);
        self.m.cores[core].mode = CoreMode::Guest { vcpu };
        self.m.cores[core].guest_since = now;
        self.guest_run(core);
    }

    /// kvm_vcpu_halt gave up polling: the vCPU thread blocks (schedule
    /// out: its timer becomes a background hrtimer, its vPE non-resident).
    fn el2_block(&mut self, core: usize, vcpu: usize) {
        let now = self.q.now();
        // A schedule-out asked for during the WFI exit is moot: the thread
        // blocks, and the kick that makes an interrupt pending wakes it.
        self.deschedule_pending[vcpu] = false;
        // The WFx exit ends here: the thread blocks instead of entering.
        if let Some(e) = self.arm().exits[core].take() {
            self.el2_exit_done(e.vcpu, e.exit, e.start);
            self.trace_event(TraceKind::el2_slice(e.exit), core, e.vcpu, e.start, now);
        }
        self.arm().polling[vcpu] = None;
        let ms = self.measure_start;
        self.arm().poll_end(vcpu, now, ms);
        {
            let (mut cx, scheme) = self.arm_cx();
            scheme.vcpu_put(&mut cx, vcpu, true);
        }
        // GIC rule: nothing the guest has acknowledged may stay active in a
        // list register across the schedule-out (the guest is in WFI, so
        // its handlers are done).
        let a = self.el2.as_deref().expect("an ARM world");
        let vif = &a.m.vifs[vcpu];
        let active = (0..vif.list_registers()).find_map(|n| {
            vif.lr(n)
                .ok()
                .filter(|l| matches!(l.state, LrState::Active | LrState::PendingActive))
                .map(|l| l.vintid)
        });
        if let Some(v) = active {
            self.checker.gic_violation(
                vcpu,
                v,
                now,
                format!("vINTID {v} active in a list register when vCPU {vcpu} was scheduled out"),
            );
        }
        self.m.cores[core].mode = CoreMode::Idle;
        self.checker.set_running(vcpu, false, now);
        self.checker.set_blocked(vcpu, true, now);
        self.el2_host_irqs(core);
        // A thread the scheduler switched this core to while the WFI exit
        // ran comes in now; then the vCPU's thread sleeps, and if it still
        // held the core, the scheduler runs the next thread here.
        self.sched_after_put(core);
        self.sched_vcpu_blocked(core, vcpu);
        self.trace_sched(core);
    }

    /// At a scheduler tick on `core`: the host scheduler and the core
    /// agree. A core left idle for a whole tick while the scheduler runs a
    /// runnable vCPU thread there is a schedule-in that never happened
    /// (the vCPU's interrupts would wait until something else moves the
    /// core). One tick of grace covers the wake-up latency between the
    /// scheduler's pick and the load.
    pub(super) fn el2_sched_check(&mut self, core: usize) {
        let now = self.q.now();
        let current = self.sched.as_ref().and_then(|st| st.s.current(core));
        let stuck = current.filter(|&v| {
            v < self.hv.vcpus.len()
                && self.m.cores[core].mode == CoreMode::Idle
                && !self.hv.vcpus[v].halted
                && !self.deschedule_pending[v]
        });
        let before = std::mem::replace(&mut self.arm().idle_current[core], stuck);
        if let Some(v) = stuck.filter(|&v| before == Some(v)) {
            self.checker.gic_violation(
                v,
                0,
                now,
                format!("core {core} idle for a scheduler tick while the host scheduler runs vCPU {v} there (its schedule-in never happened)"),
            );
        }
    }

    /// A thread became runnable on the core where `vcpu` halt-polls: the
    /// poll loop sees `single_task_running` false and the vCPU blocks.
    pub(super) fn el2_stop_polling(&mut self, vcpu: usize) {
        if self.arm().polling[vcpu].is_some() {
            let core = self.hv.vcpus[vcpu].core;
            self.el2_block(core, vcpu);
        }
    }

    /// kvm_arch_vcpu_put of a preempted (runnable) `vcpu` on `core`: the
    /// scheme saves its vgic and timer state and drops its vPE's
    /// residency; the core is the host's until the next schedule-in.
    pub(super) fn el2_put(&mut self, core: usize, vcpu: usize) {
        let now = self.q.now();
        self.m.cores[core].mode = CoreMode::Idle;
        self.hv.sched_out(vcpu);
        {
            let (mut cx, scheme) = self.arm_cx();
            scheme.vcpu_put(&mut cx, vcpu, false);
        }
        let a = self.arm();
        let _ = a.m.redists[core].set_ppi_line(MAINTENANCE_PPI, false);
        self.checker.set_running(vcpu, false, now);
        self.el2_host_irqs(core);
        self.sched_after_put(core);
        // Pulled to another core while it finished its exit here: it comes
        // in there now.
        let elsewhere = self.sched.as_ref().is_some_and(|st| {
            let c = st.s.thread(vcpu).core;
            c != core && st.s.current(c) == Some(vcpu)
        });
        if elsewhere {
            self.el2_reschedule(vcpu);
        }
    }

    /// Schedule-in of runnable `vcpu` on the core the host scheduler runs
    /// its thread on (kvm_arch_vcpu_load there), then the entry path. A
    /// vCPU whose thread moved is moved with it (`hv.move_vcpu`); the
    /// scheme's load follows it with the hardware (the vPE by VMOVP).
    pub(super) fn el2_reschedule(&mut self, vcpu: usize) {
        let Some(core) = self.schedule_in_core(vcpu) else {
            return;
        };
        let now = self.q.now();
        // The core is no longer idle under this thread: a tick that finds
        // it idle under a vCPU again starts a new episode (two ticks that
        // each fall in a different wake-up's latency are not a lost
        // schedule-in).
        self.arm().idle_current[core] = None;
        self.el2_check_core_left_clean(core, vcpu);
        let charged = self.load_vcpu_on(core, vcpu, now, |w| {
            let (mut cx, scheme) = w.arm_cx();
            scheme.vcpu_load(&mut cx, vcpu);
            cx.charged
        });
        self.el2_enter_after_load(core, vcpu, now, charged);
    }

    /// The host half of KVM_RUN after `vcpu` was loaded on `core` (its
    /// load cost `charged`): the entry half of a world-switch round trip
    /// (eret to the guest with VHE; hvc to the lowvisor, then eret, in
    /// split mode), run as the host-IRQ stage of an exit so pending work is
    /// looked at before the guest runs.
    fn el2_enter_after_load(&mut self, core: usize, vcpu: usize, now: Time, charged: Time) {
        let a = self.arm();
        let entry = Time::from(a.m.el2[core].world_switches_per_exit() / 2) * a.costs.world_switch;
        a.exits[core] = Some(El2Exit {
            vcpu,
            exit: None,
            start: now,
            stage: El2Stage::HostIrq,
            polled: false,
        });
        self.el2_kicks();
        self.start_segment(core, (charged + entry).max(1));
    }

    /// GIC rule at every schedule-in: the vCPU that left `core` took its
    /// state with it. No other vPE may still be resident on the core's
    /// redistributor (its vLPIs would reach this vCPU's interface) and the
    /// core's EL1 virtual timer must be disabled (its PPI 27 would be
    /// injected into this vCPU).
    fn el2_check_core_left_clean(&mut self, core: usize, vcpu: usize) {
        let now = self.q.now();
        let a = self.el2.as_deref().expect("an ARM world");
        let mine = a.vcpus[vcpu].vpeid;
        let stale_vpe = a.m.redists[core].resident().filter(|&p| p != mine);
        // (The vCPU that left may come back to its own core's timer: did-
        // arm keeps CNTV armed on a dedicated core while host threads run.)
        let other_left = self.hv.last_vcpu[core].is_some_and(|v| v != vcpu);
        let timer_on = other_left && a.m.timers[core].read(CntReg::VCtl, now) & CTL_ENABLE != 0;
        if let Some(p) = stale_vpe {
            self.checker.gic_violation(
                vcpu,
                0,
                now,
                format!("vPE {p} still resident on core {core} when vCPU {vcpu} was scheduled in"),
            );
        }
        if timer_on {
            self.checker.gic_violation(
                vcpu,
                VTIMER_PPI,
                now,
                format!(
                    "core {core}'s virtual timer still enabled when vCPU {vcpu} was scheduled in"
                ),
            );
        }
    }

    /// Kicks the scheme asked for (kvm_vcpu_kick): a vCPU in guest mode gets
    /// the host's reschedule SGI on its core, a polling one stops polling,
    /// a blocked one is woken.
    fn el2_kicks(&mut self) {
        self.drain_kicks(|w| std::mem::take(&mut w.arm().kicks), World::el2_kick);
    }

    fn el2_kick(&mut self, vcpu: usize) {
        let core = self.hv.vcpus[vcpu].core;
        let now = self.q.now();
        // A blocked vCPU's core idles in the board's idle state for the
        // time to its next timer event (its background hrtimer at the
        // guest's CNTV_CVAL): the wake-up waits for the state's exit.
        let idle_exit = self.el2_host_idle_exit(vcpu, now);
        let a = self.el2.as_deref_mut().expect("an ARM world");
        let why = a.vcpus[vcpu].kick_class;
        match self.m.cores[core].mode {
            CoreMode::Guest { vcpu: v } if v == vcpu => {
                self.q.schedule_in_async(
                    a.costs.sgi_latency,
                    Ev::ArmSgi {
                        core: core as u16,
                        intid: KICK_SGI as u8,
                        class: why as u8,
                    },
                );
            }
            // Halt polling saw the interrupt: on to the entry.
            CoreMode::Host { vcpu: v } if v == vcpu && a.polling[vcpu].take().is_some() => {
                let (now, ms) = (self.q.now(), self.measure_start);
                a.poll_end(vcpu, now, ms);
                if let Some(e) = &mut a.exits[core] {
                    e.stage = El2Stage::HostIrq;
                }
                // The host's handler for the interrupt that ended the
                // poll runs first, on this core.
                let c = std::mem::take(&mut a.irq_charge[core]);
                if c > 0 {
                    self.start_segment(core, c);
                } else {
                    self.el2_stage_done(core);
                }
            }
            CoreMode::Idle
                if self.sched.is_none() && self.hv.vcpus[vcpu].halted && !a.waking[vcpu] =>
            {
                a.waking[vcpu] = true;
                let irq = std::mem::take(&mut a.irq_charge[core]);
                self.q.schedule_in(
                    a.costs.vcpu_wakeup + idle_exit + irq,
                    Ev::ArmWake { vcpu: vcpu as u16 },
                );
            }
            // Under the host scheduler: the blocked vCPU's thread wakes
            // (kvm_vcpu_wake_up) and runs after a trip through the
            // scheduler, at once on an idle core, by preemption, or in its
            // turn; its core may be running another thread meanwhile.
            _ if self.sched.is_some()
                && self.hv.vcpus[vcpu].halted
                && !self.hv.vcpus[vcpu].loaded =>
            {
                let idle_core = self.m.cores[core].mode == CoreMode::Idle;
                let irq = std::mem::take(&mut a.irq_charge[core]);
                let lat = a.costs.vcpu_wakeup + if idle_core { idle_exit + irq } else { 0 };
                self.hv.vcpus[vcpu].halted = false;
                self.checker.set_blocked(vcpu, false, self.q.now());
                self.sched_wake_thread(vcpu, lat);
            }
            _ => {}
        }
    }

    /// The exit latency of the idle state the core of blocked `vcpu` is
    /// in (0 without a board's cpuidle states): the host's governor
    /// predicts the idle to last until the vCPU's background timer (its
    /// saved CNTV_CVAL), or long if its timer is off.
    fn el2_host_idle_exit(&self, vcpu: usize, now: Time) -> Time {
        let a = self.el2.as_deref().expect("an ARM world");
        let Some(c) = a.cpuidle else { return 0 };
        let core = self.hv.vcpus[vcpu].core;
        let (ctl, cval) = a.vcpus[vcpu].saved_timer;
        let t = &a.m.timers[core];
        let predicted = if ctl & CTL_ENABLE != 0 {
            let ticks = cval.saturating_sub(t.cntvct(now));
            let hz = a.m.params.timer.frequency_hz.max(1);
            Time::try_from(u128::from(ticks) * u128::from(SEC) / u128::from(hz))
                .unwrap_or(Time::MAX)
        } else {
            Time::MAX
        };
        c.exit_latency(predicted)
    }

    /// A blocked vCPU's thread runs again: kvm_arch_vcpu_load, then the
    /// entry path (which checks it has something to do).
    fn el2_wake(&mut self, vcpu: usize) {
        let now = self.q.now();
        self.arm().waking[vcpu] = false;
        let core = self.hv.vcpus[vcpu].core;
        if self.m.cores[core].mode != CoreMode::Idle || !self.hv.vcpus[vcpu].halted {
            return;
        }
        self.m.cores[core].mode = CoreMode::Host { vcpu };
        self.checker.set_blocked(vcpu, false, now);
        self.checker.set_running(vcpu, true, now);
        let charged = {
            let (mut cx, scheme) = self.arm_cx();
            scheme.vcpu_load(&mut cx, vcpu);
            cx.charged
        };
        self.el2_enter_after_load(core, vcpu, now, charged);
    }

    /// Something changed at `core`'s GIC: a guest looks again, a polling
    /// or idle host takes its interrupts now.
    fn el2_poke(&mut self, core: usize) {
        match self.m.cores[core].mode {
            CoreMode::Guest { .. } | CoreMode::Native { .. } => {
                self.pause_guest(core);
                self.guest_run(core);
            }
            CoreMode::Host { vcpu } => {
                if self.arm().polling[vcpu].is_some() {
                    self.el2_host_irqs(core);
                }
            }
            CoreMode::Idle => {
                self.el2_host_irqs(core);
            }
        }
    }

    /// The ARM events.
    pub(super) fn el2_event(&mut self, ev: Ev, now: Time) {
        match ev {
            Ev::VtimerFire { core, gen } => {
                let core = core as usize;
                let a = self.arm();
                if let Some(level) =
                    a.m.timers[core].expired(crate::hw::arm::timer::TimerChannel::Virtual, now, gen)
                {
                    let _ = a.m.redists[core].set_ppi_line(VTIMER_PPI, level);
                    self.el2_poke(core);
                }
            }
            Ev::ItsMsi { device, event } => {
                let a = self.arm();
                let (its, mut t) = a.m.its_targets();
                let out = its.translate(u32::from(device), u32::from(event), &mut t);
                self.el2_its_outcome(out, EventClass::Device, now);
            }
            Ev::ItsSgir { value, class } => {
                let a = self.arm();
                let (its, mut t) = a.m.its_targets();
                let out = its.write_sgir(value, &mut t);
                let class = EventClass::ALL
                    .get(class as usize)
                    .copied()
                    .unwrap_or(EventClass::Other);
                self.el2_its_outcome(out, class, now);
            }
            Ev::ArmSgi { core, intid, class } => {
                let core = core as usize;
                let a = self.arm();
                if a.m.redists[core].raise_sgi(u32::from(intid)).is_ok() {
                    a.sgi_class[core] = EventClass::ALL
                        .get(class as usize)
                        .copied()
                        .unwrap_or(EventClass::Other);
                    self.el2_poke(core);
                }
            }
            Ev::BgTimer { vcpu, gen } => {
                let vcpu = vcpu as usize;
                if self.arm().vcpus[vcpu].bg_gen == gen {
                    {
                        let (mut cx, scheme) = self.arm_cx();
                        scheme.bg_timer(&mut cx, vcpu);
                    }
                    self.el2_kicks();
                }
            }
            Ev::ArmPollEnd { vcpu, gen } => {
                let vcpu = vcpu as usize;
                if self.arm().polling[vcpu] == Some(gen) {
                    let core = self.hv.vcpus[vcpu].core;
                    self.el2_block(core, vcpu);
                }
            }
            Ev::ArmWake { vcpu } => self.el2_wake(vcpu as usize),
            Ev::ArmIdleExit { core } => self.el2_poke(core as usize),
            Ev::NicSpi { vm, assert } => self.el2_nic_spi(usize::from(vm), assert),
            _ => {}
        }
    }

    /// What the ITS did with an MSI or a vSGI sent for guest event `class`:
    /// the core it reached looks again; a doorbell rung is remembered for
    /// the checker and for the exit it may cause.
    fn el2_its_outcome(&mut self, out: MsiOutcome, class: EventClass, now: Time) {
        let a = self.arm();
        match out {
            MsiOutcome::Lpi { core, .. } | MsiOutcome::VlpiResident { core, .. } => {
                self.el2_poke(core)
            }
            MsiOutcome::VlpiPending {
                core,
                vpeid,
                doorbell,
                ..
            } => {
                // A doorbell KVM left disabled (a preempted, runnable
                // vCPU's) signals nothing.
                let armed = doorbell.is_some_and(|d| {
                    a.m.redists[core]
                        .lpi_config(d.intid)
                        .is_some_and(|(_, on)| on)
                });
                if armed {
                    if let Some(v) = a.vcpus.iter().position(|v| v.vpeid == vpeid) {
                        a.doorbell_at[v].get_or_insert(now);
                        a.doorbell_class[v] = class;
                    }
                }
                self.el2_poke(core)
            }
            MsiOutcome::Fault(_) => self.msi_faults += 1,
        }
    }

    /// VM `vm`'s NIC SPI: its line reaching the distributor (`assert`,
    /// unless the driver masked the NIC meanwhile), or a look again after
    /// a deactivation left it pending. The core it is forwarded to looks.
    fn el2_nic_spi(&mut self, vm: usize, assert: bool) {
        let a = self.arm();
        let spi = nic_spi(vm);
        let core = if assert {
            if a.nic_line.get(vm) != Some(&true) {
                return;
            }
            a.m.dist.set_spi_line(spi, true).ok().flatten()
        } else {
            let d = &a.m.dist;
            let b = d.bank();
            let ready = b.is_pending(spi) && b.is_enabled(spi) && !b.is_active(spi);
            ready.then(|| d.target(spi)).flatten()
        };
        if let Some(c) = core {
            self.el2_poke(c);
        }
    }

    /// The driver masked VF `vf` at the device (VTEIMC): a wired NIC's
    /// line drops (its level SPI is no longer pending).
    pub(super) fn el2_nic_masked(&mut self, vf: u16) {
        let Some(&(vm, _)) = self.vf_owner.get(usize::from(vf)) else {
            return;
        };
        let a = self.arm();
        if !a.wired_nic {
            return;
        }
        if let Some(l) = a.nic_line.get_mut(vm) {
            *l = false;
            let _ = a.m.dist.set_spi_line(nic_spi(vm), false);
        }
    }

    /// The VF `vf` fired its MSI-X `vector`: the write reaches the ITS
    /// (DeviceID = the VF, EventID = its vector) after the device's MSI
    /// latency and the ITS's translation. A NIC on a wired SPI drives its
    /// line instead: high after the line's latency, until its driver
    /// masks it (a fire while it is high changes nothing).
    pub(super) fn el2_device_msi(&mut self, vf: u16, vector: u8) {
        let owner = self.vf_owner.get(usize::from(vf)).map(|&(vm, _)| vm);
        let a = self.arm();
        if a.wired_nic {
            let lat = a.costs.spi_line;
            let Some(vm) = owner else { return };
            if let Some(l) = a.nic_line.get_mut(vm) {
                if !*l {
                    *l = true;
                    self.q.schedule_in_async(
                        lat,
                        Ev::NicSpi {
                            vm: vm as u16,
                            assert: true,
                        },
                    );
                }
            }
            return;
        }
        let lat = self.msi_latency + self.arm().costs.its_translate;
        self.q.schedule_in_async(
            lat,
            Ev::ItsMsi {
                device: vf,
                event: u16::from(vector),
            },
        );
    }

    /// A back end signalled VM `vm`'s irqfd for guest handler `vector`
    /// (vhost's completion of a virtio-net queue): the ARM scheme
    /// delivers the device's SPI (`intids::virtio_spi`). A scheme that
    /// made it pending at the distributor has its target core look.
    pub(super) fn el2_irqfd(&mut self, vm: usize, vector: u8) {
        let now = self.q.now();
        self.checker.raised(vm, vector, now);
        let vcpu = self.hv.msi_destination(vm);
        let intid = self.arm().intid_of(vector, vm);
        {
            let (mut cx, scheme) = self.arm_cx();
            scheme.irqfd(&mut cx, vcpu, intid);
        }
        self.el2_kicks();
        let d = &self.arm().m.dist;
        let b = d.bank();
        if b.is_pending(intid) && b.is_enabled(intid) && !b.is_active(intid) {
            if let Some(c) = d.target(intid) {
                self.el2_poke(c);
            }
        }
    }

    /// The host, from its own core, sends a virtual interrupt (the guest's
    /// reschedule SGI) to the vCPU on `core` (did-arm.md §2.7 "pCPU0 →
    /// vCPU1").
    pub(super) fn el2_host_vipi(&mut self, core: usize) {
        let now = self.q.now();
        let Some(vcpu) = self.hv.vcpus.iter().position(|v| v.core == core) else {
            return;
        };
        self.checker.raised_on(vcpu, RESCHEDULE_VECTOR, now);
        {
            let (mut cx, scheme) = self.arm_cx();
            scheme.host_vipi(&mut cx, vcpu, GUEST_RESCHEDULE_SGI);
        }
        self.el2_kicks();
    }

    /// At the end of the run: a doorbell rung longer than the lost grace
    /// ago for a vCPU that has not entered since, and a vCPU still blocked
    /// with an interrupt pending, were never woken.
    pub(super) fn el2_finish(&mut self) {
        let now = self.q.now();
        let grace = self.lost_grace;
        for v in 0..self.hv.vcpus.len() {
            // Blocked: halted and off its core (a woken vCPU waiting for its
            // core in the run queue is no longer halted).
            let blocked = self.hv.vcpus[v].halted && !self.hv.vcpus[v].loaded;
            if let Some(t) = self.arm().doorbell_at[v] {
                if blocked && now.saturating_sub(t) > grace {
                    self.checker.gic_violation(
                        v,
                        0,
                        now,
                        format!(
                            "the doorbell of vCPU {v} rang at {:.3} us and never woke it",
                            crate::engine::as_us(t)
                        ),
                    );
                }
            }
            if !blocked {
                continue;
            }
            let pending = {
                let (cx, scheme) = self.arm_cx();
                scheme.has_pending(&cx, v)
            };
            if pending && !self.arm().waking[v] {
                self.checker.gic_violation(
                    v,
                    0,
                    now,
                    format!("vCPU {v} left blocked in WFI with an interrupt pending (no doorbell or kick woke it)"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::Calibration;
    use crate::scenario::Scenario;

    /// A 2-vCPU ARM world of `scheme`, its vCPU 0 in guest mode on core 1.
    fn world(scheme: &str) -> World {
        let text = format!(
            "arch = \"arm64\"\nscheme = \"{scheme}\"\nduration_s = 0.01\n[machine]\ncores = 3\n\
             [guest]\ntick = \"off\"\n[[vm]]\nvcpus = 2\ncore = 1\n"
        );
        let s = Scenario::parse(&text, &[]).expect("scenario parses");
        World::build(&s, &Calibration::default_host()).expect("world builds")
    }

    #[test]
    fn the_arch_timer_clockevent_ticks_at_the_counter_frequency_with_no_setup() {
        let c = arch_timer_clockevent(100_000_000);
        assert_eq!(c.tick, 10_000, "10 ns in ps");
        assert_eq!((c.min_delta_ticks, c.init_steps), (0xF, 0));
    }

    #[test]
    fn guest_handlers_map_to_linux_arm64_intids_and_back() {
        let w = world("kvm-arm");
        let a = w.el2.as_deref().unwrap();
        for (vector, intid) in [
            (a.timer_vector, VTIMER_PPI),
            (a.vf_vector, VF_VLPI),
            (RESCHEDULE_VECTOR, 0),
            (crate::guest::rps::CALL_FUNCTION_SINGLE_VECTOR, 1),
        ] {
            assert_eq!(a.intid_of(vector, 0), intid);
            assert_eq!(a.vector_of(intid), vector);
        }
        assert_eq!(a.vector_of(2), UNEXPECTED_VECTOR);
    }

    /// KVM/ARM: SGI1R traps (IMO), WFI traps (TWI), programming the
    /// virtual timer never does; did-arm: the SGI is a physical write and
    /// WFI waits in the guest.
    #[test]
    fn each_scheme_traps_what_its_el2_controls_say() {
        let mut w = world("kvm-arm");
        let ipi = KernelOp::SendIpi {
            cpu: 1,
            vector: crate::guest::rps::CALL_FUNCTION_SINGLE_VECTOR,
        };
        let timer = KernelOp::ProgramClockevent {
            ticks: 1000,
            deadline: Some(10_000_000),
            vector: 0xEF,
        };
        assert!(matches!(
            w.el2_op(1, 0, ipi),
            OpResult::Exit(
                ArchExit::El2(ArmExit::Sys64 {
                    reg: IccReg::Sgi1r,
                    ..
                }),
                None
            )
        ));
        assert_eq!(w.el2_op(1, 0, timer), OpResult::Continue);
        assert!(matches!(
            w.el2_op(1, 0, KernelOp::Idle),
            OpResult::Exit(ArchExit::El2(ArmExit::Wfx), None)
        ));
        let mut w = world("did-arm");
        assert_eq!(w.el2_op(1, 0, ipi), OpResult::Continue);
        assert_eq!(w.el2_op(1, 0, KernelOp::Idle), OpResult::Wait);
        // The SGI is on its way to vCPU 1's core.
        assert!(!w.q.is_empty());
    }

    /// GIC rule: a vCPU scheduled out (blocked) with a virtual interrupt
    /// still active in one of its list registers is a violation.
    #[test]
    fn an_active_list_register_at_schedule_out_is_a_gic_violation() {
        use crate::hw::arm::vcpu_interface::ListRegister;
        let mut w = world("kvm-arm");
        let vif = &mut w.el2.as_deref_mut().unwrap().m.vifs[0];
        vif.inject(ListRegister::pending(VF_VLPI, 0xA0)).unwrap();
        assert_eq!(vif.read_iar1(None), VF_VLPI);
        w.m.cores[1].mode = CoreMode::Host { vcpu: 0 };
        w.hv.vcpus[0].halted = true;
        w.el2_block(1, 0);
        assert_eq!(w.checker.count(crate::check::ViolationKind::GicState), 1);
        assert!(w.checker.violations()[0]
            .detail
            .contains("active in a list register"));
        assert_eq!(w.m.cores[1].mode, CoreMode::Idle);
    }

    /// kvm-arm-v4 under the host scheduler with floating vCPU threads:
    /// whenever a vCPU is loaded with its vPE resident, the ITS's vPE table
    /// names the core it runs on (VMOVP at vgic_v4_load followed every
    /// move), and vLPIs still reach the guests without device exits.
    #[test]
    fn the_vpe_follows_its_vcpu_thread_by_vmovp() {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("scenarios/explore/arm-shared-cores.toml"),
        )
        .unwrap();
        let sets = [
            "scheme=kvm-arm-v4".to_string(),
            "duration_s=0.5".to_string(),
        ];
        let s = Scenario::parse(&text, &sets).expect("scenario parses");
        let mut w = World::build(&s, &Calibration::default_host()).expect("world builds");
        let (mut checked, mut moved) = (0, 0u32);
        for step in 1..=250u64 {
            w.end = step * 2 * crate::engine::MS + 37 * crate::engine::US * (step % 7);
            w.run(|_| {});
            let a = w.el2.as_deref().unwrap();
            for v in 0..w.hv.vcpus.len() {
                let core = w.hv.vcpus[v].core;
                let vpeid = a.vcpus[v].vpeid;
                if w.hv.vcpus[v].loaded && a.m.redists[core].resident() == Some(vpeid) {
                    assert_eq!(a.m.its.vpe(vpeid).unwrap().core, core, "vCPU {v}");
                    checked += 1;
                }
                moved += u32::from(w.hv.vcpus[v].vmcs_core != Some([1, 2, 2, 1][v]));
            }
        }
        assert!(checked > 30, "{checked}");
        assert!(moved > 10, "the vCPUs never moved: {moved}");
        assert!(w.sched.as_ref().unwrap().migrations > 0);
        assert_eq!(
            w.checker.violations().len(),
            0,
            "{:?}",
            w.checker.violations()
        );
    }

    /// A core the host scheduler gave to a runnable vCPU but that stays
    /// idle (its schedule-in was dropped) is reported at the second tick,
    /// not at the first (the wake-up latency between pick and load).
    #[test]
    fn a_core_left_idle_under_a_scheduled_vcpu_is_reported() {
        let text =
            "arch = \"arm64\"\nscheme = \"kvm-arm\"\nduration_s = 0.01\n[machine]\ncores = 2\n\
                    [guest]\ntick = \"off\"\n[[vm]]\ncore = 1\ncopies = 2\ncopies_cores = [1, 1]\n";
        let s = Scenario::parse(text, &[]).expect("scenario parses");
        let mut w = World::build(&s, &Calibration::default_host()).expect("world builds");
        assert_eq!(w.sched.as_ref().unwrap().s.current(1), Some(0));
        // vCPU 0's schedule-in lost: the core idles under it.
        w.m.cores[1].mode = CoreMode::Idle;
        w.el2_sched_check(1);
        assert_eq!(w.checker.count(crate::check::ViolationKind::GicState), 0);
        w.el2_sched_check(1);
        assert_eq!(w.checker.count(crate::check::ViolationKind::GicState), 1);
        assert!(w.checker.violations()[0].detail.contains("never happened"));
    }

    /// A NIC on a wired SPI: every SPI the distributor forwarded was
    /// acknowledged on the core GICD_IROUTER names and deactivated once
    /// (KVM/ARM: by the guest's EOI through the HW = 1 list register after
    /// the host's priority drop; did-arm: by the guest's own EOImode-0
    /// EOI), at most one interrupt per NIC fire (a fire while the line is
    /// high is the same level).
    #[test]
    fn a_wired_nic_spi_is_acknowledged_and_deactivated_once_per_interrupt() {
        for (scheme, route, core) in [
            ("kvm-arm", "vcpu-core", 1),
            ("kvm-arm", "cpu0", 0),
            ("kvm-arm-v4", "vcpu-core", 1),
            ("did-arm", "vcpu-core", 1),
        ] {
            let text = format!(
                "arch = \"arm64\"\nscheme = \"{scheme}\"\nduration_s = 0.02\n[machine]\ncores = 2\n\
                 [guest]\ntick = \"off\"\n[net]\ndevice = \"spi-nic\"\n\
                 [arm]\nnic_spi_affinity = \"{route}\"\n[[vm]]\ncore = 1\n\
                 [vm.workload.udp]\nrate_pps = 20000\n"
            );
            let s = Scenario::parse(&text, &[]).expect("scenario parses");
            let mut w = World::build(&s, &Calibration::default_host()).expect("world builds");
            w.run(|_| {});
            let a = w.el2.as_deref().unwrap();
            let spi = nic_spi(0);
            let d = a.m.dist.counters();
            let fired = w.m.nic.counters(0).unwrap().interrupts;
            let what = format!("{scheme} {route}");
            assert!(d.acks > 300, "{what}: {d:?}");
            assert!(d.acks <= fired, "{what}: {d:?} {fired}");
            assert!(d.acks - d.deactivations <= 1, "{what}: {d:?}");
            assert_eq!(a.m.dist.target(spi), Some(core), "{what}");
            assert!(a.m.cpus[core].counters().acks >= d.acks, "{what}");
            assert_eq!(w.checker.violations().len(), 0, "{what}");
        }
    }

    /// The guest's EOI of an interrupt it never acknowledged drops nothing:
    /// the checker sees an EOI with nothing in service.
    #[test]
    fn an_eoi_with_nothing_active_clears_nothing() {
        let mut w = world("kvm-arm");
        let op = KernelOp::EndOfInterrupt { vector: 0xEF };
        assert_eq!(w.el2_op(1, 0, op), OpResult::Continue);
        assert_eq!(
            w.checker
                .count(crate::check::ViolationKind::EoiWithoutInService),
            1
        );
    }
}
