//! The platform: builds a machine, hypervisor, guests and workloads from a
//! scenario, and runs the event loop that moves cores between guest mode,
//! VM exits and VM entries. This is where the hardware decides, from VMCS
//! controls and LAPIC state, whether a guest action or an interrupt exits.

mod blk;
mod build;
pub mod event;
mod net;
mod sched;

pub use build::{
    VIRTIO_BLK_NOTIFY_PORT, VIRTIO_BLK_VECTOR, VIRTIO_NET_VECTORS, VIRTIO_NOTIFY_PORT,
};

use crate::check::Checker;
use crate::engine::{from_ns, from_s, from_us, EventQueue, RngStream, Summary, Time, MS, SEC};
use crate::guest::app::Metrics;
use crate::guest::net::Devices;
use crate::guest::{Action, Instr, Kernel, VfReg};
use crate::hv::exits::ExitInfo;
use crate::hv::scheme::Scheme;
use crate::hv::{HvCosts, HvCx, HvState};
use crate::hw::x86::core::CoreMode;
use crate::hw::x86::idt::NP_VECTOR;
use crate::hw::x86::iommu::Remapped;
use crate::hw::x86::lapic::{decode_icr, msr, DeliveryMode, Ipi, IpiDest};
use crate::hw::x86::nic::{IrqAction, RxPacket};
use crate::hw::x86::vmcs::{ApicMmioOutcome, WrmsrOutcome};
use crate::hw::x86::Machine;
use crate::report::trace::{Trace, TraceKind};
use crate::scenario::Scenario;
use crate::workloads::udp::UdpSender;
use event::{schedule_apic_effect, Ev};

/// The port the background device-emulation exits write: a device QEMU
/// emulates in user space (no ioeventfd behind it).
pub const EMULATED_DEVICE_PORT: u16 = 0x0CF8;

/// Longest single work segment: long computations are cut into chunks so a
/// preempted chunk leaves at most one stale completion event this far ahead.
const MAX_SEGMENT: Time = MS;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Handler,
    HostIrq,
    Entering,
}

#[derive(Clone, Copy, Debug)]
struct ExitState {
    vcpu: usize,
    info: ExitInfo,
    start: Time,
    stage: Stage,
    timer_landed: bool,
    /// False for the pseudo-exit that resumes a rescheduled vCPU.
    record: bool,
}

/// Build errors.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The scenario names something that cannot be built.
    #[error("scenario: {0}")]
    Scenario(String),
    /// A calibration value out of its range.
    #[error("{0}")]
    Calibration(#[from] crate::calibration::CalibrationError),
}

/// A built, runnable simulation.
pub struct World {
    q: EventQueue<Ev>,
    m: Machine,
    hv: HvState,
    scheme: Box<dyn Scheme>,
    guests: Vec<Kernel>,
    /// The invariant checker.
    pub checker: Checker,
    costs: HvCosts,
    exits: Vec<Option<ExitState>>,
    bg_pending: Vec<u8>,
    bg_rate: [f64; 2],
    rng_bg: Vec<RngStream>,
    rng_exit: RngStream,
    clients: Vec<Option<UdpSender>>,
    msi_latency: Time,
    vf_owner: Vec<(usize, u8)>,
    timer_due: Vec<Option<Time>>,
    /// Exits a guest timer expiry landed in, by reason (service times).
    pub timer_exits: [Summary; crate::hv::exits::ExitReason::COUNT],
    /// MSIs blocked by the IOMMU.
    pub msi_faults: u64,
    /// Datagrams the NIC dropped for lack of descriptors (from counters).
    measure_start: Time,
    end: Time,
    lost_grace: Time,
    scenario: Scenario,
    /// The VM whose finite task ends the run when it exits (a one-VM
    /// WhileLoop).
    ends_run: Option<usize>,
    deschedule_pending: Vec<bool>,
    rng_host: RngStream,
    ptimer_gen: Vec<u64>,
    tsc_hz: u64,
    /// Per VF: its counters at the end of the warm-up.
    nic_base: Vec<crate::hw::x86::nic::VfCounters>,
    /// The vhost side of the VMs' virtio-net devices, if any.
    pv: Option<Box<net::PvPath>>,
    /// Each VM's virtio-net device, if it has one.
    net_dev_of_vm: Vec<Option<usize>>,
    /// When the receive side of the host's port is next free (frames from
    /// every load generator cross it).
    port_rx_free: Time,
    /// The peer hosts of the VM's connections and flows.
    peers: Vec<net::PeerLink>,
    /// The timeline, when asked for.
    trace: Option<Box<Trace>>,
    /// The host side of each virtio-blk device (device d serves
    /// `m.virtio_blk[d]`): its own QEMU main loop and thread pool.
    blk: Vec<blk::BlkPath>,
    /// Each VM's virtio-blk device, if it has one.
    blk_dev_of_vm: Vec<Option<usize>>,
    /// VF transmit: the doorbell-to-fetch delay.
    tx_fetch: Time,
    /// The last dispatched events, when asked for (race explorer).
    event_log: Option<Box<EventLog>>,
    /// The host scheduler, when host threads share the vCPUs' cores.
    sched: Option<Box<sched::SchedState>>,
    /// Per vCPU: halt polling in progress (since, generation).
    polling: Vec<Option<(Time, u64)>>,
    poll_gen: u64,
    /// Per vCPU: when its current (or last) halt began.
    halt_start: Vec<Time>,
}

/// A ring of the last dispatched events: the counterexample trace of a
/// race explorer. Fixed capacity, so recording never allocates.
pub struct EventLog {
    ring: Vec<(Time, Ev)>,
    next: usize,
    full: bool,
}

impl EventLog {
    fn new(capacity: usize) -> Self {
        EventLog {
            ring: Vec::with_capacity(capacity.max(1)),
            next: 0,
            full: false,
        }
    }

    fn push(&mut self, at: Time, ev: Ev) {
        if self.ring.len() < self.ring.capacity() {
            self.ring.push((at, ev));
        } else {
            self.ring[self.next] = (at, ev);
            self.full = true;
        }
        self.next = (self.next + 1) % self.ring.capacity();
    }

    /// The logged events, oldest first.
    pub fn events(&self) -> impl Iterator<Item = &(Time, Ev)> {
        let (a, b) = if self.full {
            self.ring.split_at(self.next)
        } else {
            (&self.ring[..0], &self.ring[..])
        };
        b.iter().chain(a.iter())
    }
}

fn t_us(e: &crate::calibration::Entry) -> Time {
    from_us(e.value)
}
fn t_ns(e: &crate::calibration::Entry) -> Time {
    from_ns(e.value)
}

impl World {
    /// Runs to the end of the measured interval. `progress` is called about
    /// every simulated 100 ms with the fraction done.
    pub fn run(&mut self, mut progress: impl FnMut(f64)) {
        let step = 100 * MS;
        let mut next_report = step;
        while let Some((now, ev)) = self.q.pop_until(self.end) {
            if let Some(log) = &mut self.event_log {
                log.push(now, ev);
            }
            self.dispatch(ev, now);
            if self
                .ends_run
                .is_some_and(|vm| self.guests[vm].counters.tasks_exited > 0)
            {
                // A finite workload (WhileLoop) is done: the run ends here
                // (after the warm-up: `build` refuses a shorter loop).
                debug_assert!(now > self.measure_start);
                self.end = now;
                break;
            }
            if now >= next_report {
                next_report += step;
                progress(now as f64 / self.end as f64);
            }
        }
        self.q.advance_to(self.end);
        // Close open guest-mode stretches for time in guest.
        for c in 0..self.m.cores.len() {
            if let CoreMode::Guest { vcpu } = self.m.cores[c].mode {
                self.account_guest_time(c, vcpu, self.end);
            }
        }
        self.checker.finish(self.end, self.lost_grace);
    }

    /// Perturbs the event order from now on (race exploration): ties break
    /// in an order drawn from `seed`, and messages in flight (MSIs, IPIs,
    /// the host's schedule-out/in decisions) arrive up to `max_jitter` late.
    pub fn perturb(&mut self, seed: u64, max_jitter: Time, shuffle_ties: bool) {
        self.q.perturb(seed, max_jitter, shuffle_ties);
    }

    /// Ends the run at `t` (simulated time from the start) instead of the
    /// scenario's end, if that is earlier. Everything before `t` happens as
    /// in the full run.
    pub fn stop_at(&mut self, t: Time) {
        self.end = self.end.min(t);
    }

    /// Keeps the last `capacity` dispatched events (see [`Self::event_log`]).
    pub fn enable_event_log(&mut self, capacity: usize) {
        self.event_log = Some(Box::new(EventLog::new(capacity)));
    }

    /// The event log, if enabled.
    pub fn event_log(&self) -> Option<&EventLog> {
        self.event_log.as_deref()
    }

    /// Records a timeline of `[from, to)` (simulated time from the start of
    /// the run, warm-up included), at most `limit` events.
    pub fn enable_trace(&mut self, from: Time, to: Time, limit: usize) {
        self.trace = Some(Box::new(Trace::new(from, to, limit)));
    }

    /// The timeline, if one was recorded.
    pub fn trace(&self) -> Option<&Trace> {
        self.trace.as_deref()
    }

    /// When the measured interval starts (the end of the warm-up).
    pub fn measure_start(&self) -> Time {
        self.measure_start
    }

    /// Physical cores of the machine.
    pub fn cores(&self) -> usize {
        self.m.cores.len()
    }

    #[inline]
    fn trace_event(&mut self, kind: TraceKind, core: usize, start: Time, end: Time) {
        if let Some(t) = &mut self.trace {
            t.record(kind, core, start, end);
        }
    }

    /// Events processed so far.
    pub fn events(&self) -> u64 {
        self.q.popped()
    }

    fn dispatch(&mut self, ev: Ev, now: Time) {
        match ev {
            Ev::Segment { core, gen } => {
                let core = core as usize;
                let start = self.m.cores[core].seg.start;
                if !self.m.cores[core].complete(gen) {
                    return;
                }
                match self.m.cores[core].mode {
                    CoreMode::Guest { .. } | CoreMode::Native { .. } => {
                        let (k, c) = self.kcpu(self.kernel_of(core));
                        self.guests[k].charge(c, now - start);
                        self.guest_run(core);
                    }
                    CoreMode::Host { .. } => self.exit_stage_done(core),
                    CoreMode::Idle => {}
                }
            }
            Ev::LapicTimer { core, gen } => {
                let core = core as usize;
                if self.m.lapics[core]
                    .timer_expired(now, gen)
                    .is_some_and(|e| {
                        if let Some((d, g)) = e.rearmed {
                            self.q.schedule(
                                d,
                                Ev::LapicTimer {
                                    core: core as u16,
                                    gen: g,
                                },
                            );
                        }
                        e.vector.is_some()
                    })
                {
                    self.note_timer_landing(core, now);
                    self.poke(core);
                }
            }
            Ev::ApicArrive { core, vector, mode } => {
                let core = core as usize;
                match mode {
                    DeliveryMode::Nmi => {
                        self.m.lapics[core].accept_nmi();
                    }
                    DeliveryMode::Fixed | DeliveryMode::LowestPriority => {
                        self.m.lapics[core].accept_fixed(vector);
                    }
                }
                self.poke(core);
            }
            Ev::Msi {
                handle,
                requester_id,
            } => {
                let msi = crate::hw::x86::iommu::RemappableMsi {
                    handle,
                    requester_id,
                };
                match self.m.irt.remap_any(msi) {
                    Ok(Remapped::Interrupt(r)) => {
                        self.deliver_msi(r.dest_apic_id, r.vector, r.mode, now)
                    }
                    // VT-d posted interrupt: post to the descriptor; notify
                    // NDST with NV if ON was clear and SN is clear.
                    Ok(Remapped::Posted { descriptor, vector }) => {
                        match self.m.pi_desc.get_mut(descriptor as usize) {
                            Some(pi) => {
                                if pi.post(vector) {
                                    let (nv, ndst) = (pi.nv, pi.ndst);
                                    self.deliver_msi(ndst, nv, DeliveryMode::Fixed, now);
                                }
                            }
                            None => self.msi_faults += 1,
                        }
                    }
                    Err(_) => self.msi_faults += 1,
                }
            }
            Ev::NicItr { vf, vector, gen } => {
                if let Ok(a) = self.m.nic.itr_check(vf, vector, gen, now) {
                    self.nic_action(a);
                }
            }
            Ev::WireRx { vf, len, sent, seq } => {
                let pkt = RxPacket {
                    len,
                    arrived: now,
                    frame: crate::hw::wire::Frame::udp(
                        0,
                        len.saturating_sub(crate::hw::wire::UDP_HEADERS),
                        seq,
                        sent,
                    ),
                };
                if let Ok((_, a)) = self.m.nic.receive(vf, pkt, now) {
                    self.nic_action(a);
                }
            }
            Ev::ClientTx { vm } => {
                if let Some(c) = &mut self.clients[vm as usize] {
                    let frame = c.frame_bytes;
                    let seq = c.sent;
                    let next = c.advance();
                    let arrive = now + self.m.link.delivery_time(frame);
                    self.q.schedule(
                        arrive,
                        Ev::WireRx {
                            vf: vm,
                            len: frame,
                            sent: now,
                            seq,
                        },
                    );
                    self.q.schedule(next, Ev::ClientTx { vm });
                }
            }
            Ev::Background { vcpu, kind } => {
                let vcpu = vcpu as usize;
                let r = self.bg_rate[kind as usize];
                let dt = from_s(self.rng_bg[vcpu].exponential(1.0 / r));
                self.q.schedule_in(
                    dt.max(1),
                    Ev::Background {
                        vcpu: vcpu as u16,
                        kind,
                    },
                );
                self.bg_pending[vcpu] |= 1 << kind;
                self.look_again(vcpu);
            }
            Ev::Eventfd { fd } => {
                self.pv_eventfd(fd);
                self.blk_eventfd(fd);
            }
            Ev::BlkStep { dev } => self.blk_step(dev as usize),
            Ev::VhostStep { worker } => self.pv_vhost_step(worker as usize),
            Ev::VhostNapEnd { worker, gen } => self.pv_nap_end(worker as usize, gen),
            Ev::ToPeer { peer } => self.peer_receive(peer as usize),
            Ev::ToGuest { peer } => self.peer_frame_arrives(peer as usize),
            Ev::PeerTimer { peer, key } => self.peer_timer(peer as usize, key),
            Ev::VfTxDone { vf } => self.vf_tx_done(vf),
            Ev::WarmupEnd => self.reset_stats(now),
            Ev::HostIpi { core } => {
                let rate = self.scenario.host.ipi_per_s;
                let dt = from_s(self.rng_host.exponential(1.0 / rate));
                self.q.schedule_in(dt.max(1), Ev::HostIpi { core });
                if now > 0 {
                    let (mut cx, scheme) = self.cx();
                    let from = cx.hv.designated_core;
                    scheme.send_host_ipi(
                        &mut cx,
                        from,
                        core as usize,
                        crate::hv::host::RESCHEDULE_VECTOR,
                    );
                }
            }
            Ev::PreemptionTimer { core, gen } => {
                let core = core as usize;
                if self.ptimer_gen[core] == gen
                    && matches!(self.m.cores[core].mode, CoreMode::Guest { .. })
                {
                    self.vm_exit(core, ExitInfo::PreemptionTimer, None);
                }
            }
            Ev::GuestPoke { vcpu } => self.look_again(vcpu as usize),
            Ev::Deschedule { vcpu } => self.deschedule(vcpu as usize),
            Ev::Reschedule { vcpu } => self.reschedule(vcpu as usize),
            Ev::SchedTick { core } => self.sched_tick(core as usize),
            Ev::WakeVcpu { vcpu } => self.sched_wake_vcpu(vcpu as usize),
            Ev::HaltPollEnd { vcpu, gen } => self.halt_poll_end(vcpu as usize, gen),
            Ev::Resched { core } => self.sched_switch(core as usize),
        }
    }

    /// Schedule-out: the host takes `vcpu`'s core (deferred to the end of an
    /// exit in progress).
    fn deschedule(&mut self, vcpu: usize) {
        let core = self.hv.vcpus[vcpu].core;
        match self.m.cores[core].mode {
            CoreMode::Guest { vcpu: v } if v == vcpu => {
                let now = self.q.now();
                self.pause_guest(core);
                self.account_guest_time(core, vcpu, now);
                self.put(core, vcpu);
            }
            CoreMode::Host { vcpu: v } if v == vcpu => self.deschedule_pending[vcpu] = true,
            _ => {}
        }
    }

    fn put(&mut self, core: usize, vcpu: usize) {
        self.m.cores[core].mode = CoreMode::Idle;
        self.hv.sched_out(vcpu);
        let (mut cx, scheme) = self.cx();
        scheme.vcpu_put(&mut cx, vcpu);
        let now = self.q.now();
        self.checker.set_running(vcpu, false, now);
        if self.hv.vcpus[vcpu].halted {
            self.checker.set_blocked(vcpu, true, now);
        }
        self.idle_host_interrupts(core);
        self.sched_after_put(core);
        // Pulled to another core while it finished its exit here: it comes
        // in there now.
        let elsewhere = self.sched.as_ref().and_then(|st| {
            let c = st.s.thread(vcpu).core;
            (c != core && st.s.current(c) == Some(vcpu)).then_some(c)
        });
        if elsewhere.is_some() {
            self.reschedule(vcpu);
        }
    }

    /// Enters `vcpu`, still loaded on `core` in host mode, through the
    /// last exit stages (pending host interrupts, then the entry).
    fn resume(&mut self, core: usize, vcpu: usize) {
        let now = self.q.now();
        self.exits[core] = Some(ExitState {
            vcpu,
            info: ExitInfo::Hlt,
            start: now,
            stage: Stage::HostIrq,
            timer_landed: false,
            record: false,
        });
        self.exit_stage_done(core);
    }

    /// `vmx_vcpu_load` and `kvm_arch_vcpu_load` on a core other than the
    /// one `vcpu`'s VMCS was last loaded on (`from`): `loaded_vmcs_clear`
    /// VMCLEARs it there by a function-call IPI and waits for it, and the
    /// hrtimer of its emulated LAPIC timer follows it (`kvm_migrate_timers`).
    fn vcpu_migrate(
        cx: &mut HvCx,
        scheme: &mut Box<dyn crate::hv::scheme::Scheme>,
        vcpu: usize,
        from: usize,
    ) {
        let to = cx.hv.vcpus[vcpu].core;
        scheme.send_host_ipi(cx, to, from, crate::hv::host::CALL_FUNCTION_SINGLE_VECTOR);
        // smp_call_function_single(wait = 1): the IPI, the handler, the
        // acknowledgement back.
        cx.charge(2 * cx.costs.ipi_latency + cx.costs.call_function);
        cx.migrate_guest_timer(vcpu, from);
    }

    /// Schedule-in: load `vcpu` and enter it.
    fn reschedule(&mut self, vcpu: usize) {
        if std::mem::take(&mut self.deschedule_pending[vcpu]) {
            return;
        }
        if self.hv.vcpus[vcpu].halted {
            // A sleeping vCPU comes back when it is kicked, not before.
            return;
        }
        let here = self.hv.vcpus[vcpu].core;
        let core = match &self.sched {
            // The core the host scheduler runs the thread on; it may have
            // given that core to another thread since this schedule-in was
            // decided.
            Some(st) => {
                let c = st.s.thread(vcpu).core;
                if st.s.current(c) != Some(vcpu) {
                    return;
                }
                c
            }
            None => here,
        };
        if self.m.cores[core].mode != CoreMode::Idle {
            return;
        }
        let now = self.q.now();
        if core != here {
            self.hv.vcpus[vcpu].core = core;
        }
        // kvm_sched_in (the preempt notifier), then kvm_arch_vcpu_load.
        self.hv.sched_in(vcpu);
        let migrate = self.hv.vcpus[vcpu].vmcs_core.filter(|&c| c != core);
        let load_work = {
            let (mut cx, scheme) = self.cx();
            if let Some(old) = migrate {
                Self::vcpu_migrate(&mut cx, scheme, vcpu, old);
            }
            scheme.vcpu_load(&mut cx, vcpu);
            cx.hv.vcpus[vcpu].vmcs_core = Some(core);
            cx.charged
        };
        if migrate.is_some() {
            if let Some(st) = &mut self.sched {
                st.note_migration();
            }
        }
        self.checker.set_running(vcpu, true, now);
        self.hv.last_vcpu[core] = Some(vcpu);
        self.m.cores[core].mode = CoreMode::Host { vcpu };
        self.exits[core] = Some(ExitState {
            vcpu,
            info: ExitInfo::PreemptionTimer,
            start: now,
            stage: Stage::HostIrq,
            timer_landed: false,
            record: false,
        });
        if load_work > 0 {
            // The load's own work (a migration's IPI round trip, IRT
            // entries the scheme rewrites), before the entry path goes on.
            self.start_segment(core, load_work);
        } else {
            self.exit_stage_done(core);
        }
    }

    /// Ends a guest-mode stretch of `vcpu` on `core` at `until`: adds the
    /// part inside the measured interval to its VM's time in guest.
    fn account_guest_time(&mut self, core: usize, vcpu: usize, until: Time) {
        let entered = self.m.cores[core].guest_since;
        self.trace_event(TraceKind::Guest, core, entered, until);
        let vm = self.hv.vcpus[vcpu].vm;
        let since = self.m.cores[core].guest_since.max(self.measure_start);
        self.hv.vms[vm].stats.guest_time += until.saturating_sub(since);
    }

    /// An interrupt message from the IOMMU reaches the LAPIC `dest_apic_id`.
    fn deliver_msi(&mut self, dest_apic_id: u32, vector: u8, mode: DeliveryMode, now: Time) {
        match self.m.core_of_apic(dest_apic_id) {
            Some(core) => self.dispatch(
                Ev::ApicArrive {
                    core: core as u16,
                    vector,
                    mode,
                },
                now,
            ),
            None => self.msi_faults += 1,
        }
    }

    fn reset_stats(&mut self, now: Time) {
        for vm in &mut self.hv.vms {
            vm.stats = Default::default();
        }
        for c in &mut self.m.cores {
            c.guest_since = c.guest_since.max(now);
        }
        for g in &mut self.guests {
            g.reset_metrics();
        }
        self.timer_exits = Default::default();
        for r in self.hv.redirect.iter_mut().flatten() {
            r.reset_counters();
        }
        if let Some(pv) = &mut self.pv {
            for d in &mut pv.devs {
                d.counters = Default::default();
            }
            for w in &mut pv.workers {
                w.counters = Default::default();
            }
        }
        self.scheme.reset_metrics();
        for link in &mut self.peers {
            link.peer.reset_metrics();
        }
        for b in &mut self.blk {
            b.backend.counters = Default::default();
        }
        for (vf, base) in self.nic_base.iter_mut().enumerate() {
            *base = self.m.nic.counters(vf as u16).unwrap_or_default();
        }
        self.measure_start = now;
        self.checker.descheduled_delay = crate::engine::LatencyHistogram::new();
        self.checker.waited_schedule_in = crate::engine::LatencyHistogram::new();
        self.sched_reset(now);
    }

    /// The kernel (VM) and CPU in it of `vcpu` (the kernel index of a
    /// bare-metal core).
    fn kcpu(&self, vcpu: usize) -> (usize, usize) {
        let v = &self.hv.vcpus[vcpu];
        (v.vm, v.index)
    }

    fn kernel_of(&self, core: usize) -> usize {
        match self.m.cores[core].mode {
            CoreMode::Guest { vcpu } | CoreMode::Host { vcpu } => vcpu,
            CoreMode::Native { kernel } => kernel,
            CoreMode::Idle => 0,
        }
    }

    fn nic_action(&mut self, a: IrqAction) {
        match a {
            IrqAction::None => {}
            IrqAction::Fire { vf, vector, msi } => {
                if vector == 0 {
                    if let Some(&(vm, v)) = self.vf_owner.get(vf as usize) {
                        let now = self.q.now();
                        self.checker.raised(vm, v, now);
                    }
                }
                self.q.schedule_in_async(
                    self.msi_latency,
                    Ev::Msi {
                        handle: msi.handle,
                        requester_id: msi.requester_id,
                    },
                );
            }
            IrqAction::CheckAt {
                vf,
                vector,
                at,
                gen,
            } => self.q.schedule(at, Ev::NicItr { vf, vector, gen }),
        }
    }

    /// The guest's LAPIC timer expired while its core was in host mode: the
    /// exit it landed in is noted (DID §5.4's breakdown).
    fn note_timer_landing(&mut self, core: usize, now: Time) {
        if let CoreMode::Host { vcpu } = self.m.cores[core].mode {
            if self.timer_due[vcpu].is_some_and(|d| d <= now) {
                self.timer_due[vcpu] = None;
                if let Some(e) = &mut self.exits[core] {
                    e.timer_landed = true;
                }
            }
        }
    }

    /// Something changed in `core`'s LAPIC: let the core react.
    fn poke(&mut self, core: usize) {
        match self.m.cores[core].mode {
            CoreMode::Guest { .. } | CoreMode::Native { .. } => {
                self.pause_guest(core);
                self.guest_run(core);
            }
            // Host code takes interrupts between exit-handling steps, and
            // at once while it polls for a halted vCPU.
            CoreMode::Host { vcpu } => self.halt_poll_check(core, vcpu),
            CoreMode::Idle => self.idle_host_interrupts(core),
        }
    }

    fn cx(&mut self) -> (HvCx<'_>, &mut Box<dyn Scheme>) {
        let now = self.q.now();
        (
            HvCx {
                now,
                m: &mut self.m,
                hv: &mut self.hv,
                q: &mut self.q,
                guests: &self.guests,
                costs: &self.costs,
                charged: 0,
            },
            &mut self.scheme,
        )
    }

    /// A host-only idle core handles interrupts at once (its own time is
    /// not modelled: nothing else runs there).
    fn idle_host_interrupts(&mut self, core: usize) {
        let (mut cx, scheme) = self.cx();
        if cx.m.lapics[core].take_nmi() {
            scheme.host_nmi(&mut cx, core);
        }
        while let Some(v) = cx.m.lapics[core].ack() {
            scheme.host_interrupt(&mut cx, core, v);
            cx.m.lapics[core].eoi();
        }
    }

    /// VM entry with the "activate VMX-preemption timer" control set: the
    /// timer starts from the VMCS value and counts down at TSC >> rate.
    fn arm_preemption_timer(&mut self, core: usize, vcpu: usize) {
        let vmcs = &self.m.vmcs[vcpu];
        if !vmcs.pin.preemption_timer {
            return;
        }
        let ticks =
            (vmcs.preemption_timer_value as u128) << crate::hw::x86::vmcs::PREEMPTION_TIMER_RATE;
        let ps = (ticks * SEC as u128 / self.tsc_hz.max(1) as u128) as Time;
        self.ptimer_gen[core] += 1;
        let gen = self.ptimer_gen[core];
        self.q.schedule_in(
            ps,
            Ev::PreemptionTimer {
                core: core as u16,
                gen,
            },
        );
    }

    /// Starts a work segment of `len` on `core` and schedules its end.
    fn start_segment(&mut self, core: usize, len: Time) {
        let now = self.q.now();
        let (end, gen) = self.m.cores[core].start(now, len);
        self.q.schedule(
            end,
            Ev::Segment {
                core: core as u16,
                gen,
            },
        );
    }

    fn pause_guest(&mut self, core: usize) {
        let now = self.q.now();
        let ran = self.m.cores[core].preempt(now);
        if ran > 0 {
            let (k, c) = self.kcpu(self.kernel_of(core));
            self.guests[k].charge(c, ran);
        }
    }

    /// What the core must do now about pending events, in guest mode: an
    /// exit, a delivery through the guest IDT, or nothing.
    fn interrupt_decision(&mut self, core: usize) -> Option<Result<ExitInfo, u8>> {
        let mode = self.m.cores[core].mode;
        let (k, c) = self.kcpu(self.kernel_of(core));
        let if_on = self.guests[k].interrupts_enabled(c);
        let lapic = &mut self.m.lapics[core];
        match mode {
            CoreMode::Native { .. } => {
                if lapic.deliverable().is_some() && if_on {
                    return lapic.ack().map(Err);
                }
                None
            }
            CoreMode::Guest { vcpu } => {
                if self.bg_pending[vcpu] != 0 {
                    let kind = self.bg_pending[vcpu].trailing_zeros();
                    self.bg_pending[vcpu] &= !(1 << kind);
                    return Some(Ok(if kind == 0 {
                        ExitInfo::IoInstruction {
                            port: EMULATED_DEVICE_PORT,
                        }
                    } else {
                        ExitInfo::EptViolation
                    }));
                }
                let vmcs = &self.m.vmcs[vcpu];
                if lapic.nmi_pending() && vmcs.nmi_exits() {
                    lapic.take_nmi();
                    return Some(Ok(ExitInfo::Nmi));
                }
                if let Some(v) = lapic.deliverable() {
                    if vmcs.posted_notification_absorbed(v) {
                        // Posted-interrupt processing (SDM 29.6): the CPU
                        // acknowledges and EOIs the notification, moves PIR
                        // into the virtual IRR and clears ON; no exit.
                        lapic.ack();
                        lapic.eoi();
                        let pir = self.m.pi_desc[vcpu].take();
                        self.m.vapic[vcpu].sync_pir(pir);
                        return self.interrupt_decision(core);
                    }
                    if vmcs.external_interrupt_exits() {
                        // SDM 27.2.2: with "acknowledge interrupt on exit" the
                        // processor acknowledges the LAPIC and saves the
                        // vector; without it the interrupt stays in the IRR.
                        let vector = if vmcs.exit.ack_interrupt_on_exit {
                            Some(lapic.ack()?)
                        } else {
                            None
                        };
                        return Some(Ok(ExitInfo::ExternalInterrupt { vector }));
                    }
                    if if_on {
                        let v = lapic.ack()?;
                        return Some(self.through_idt(vcpu, v));
                    }
                }
                if vmcs.proc2.virtual_interrupt_delivery && if_on {
                    // Virtual-interrupt delivery (SDM 29.2): RVI above VPPR.
                    if let Some(v) = self.m.vapic[vcpu].deliver() {
                        return Some(self.through_idt(vcpu, v));
                    }
                }
                let vmcs = &self.m.vmcs[vcpu];
                if vmcs.proc.interrupt_window_exiting && if_on {
                    return Some(Ok(ExitInfo::PendingInterrupt));
                }
                None
            }
            _ => None,
        }
    }

    /// Event delivery through the IDT the guest-state IDTR points at: the
    /// gate's handler runs, or a not-present gate raises #NP, which exits if
    /// the exception bitmap says so (ELI's bounce of host vectors).
    fn through_idt(&self, vcpu: usize, vector: u8) -> Result<ExitInfo, u8> {
        match self.m.idt_gate(vcpu, vector) {
            Some(g) => Err(g),
            None if self.m.vmcs[vcpu].exception_exits(NP_VECTOR) => Ok(ExitInfo::Exception {
                vector: NP_VECTOR,
                idt_vectoring: Some(vector),
            }),
            // The guest's own #NP handler would run: the interrupt never
            // reaches a handler for it, which the checker reports as lost.
            None => Err(vector),
        }
    }

    fn deliver(&mut self, core: usize, vector: u8) {
        let vcpu = self.kernel_of(core);
        let (k, c) = self.kcpu(vcpu);
        let now = self.q.now();
        self.checker.handler_entered(vcpu, vector, now);
        self.trace_event(TraceKind::Deliver { vector }, core, now, now);
        self.guests[k].take_interrupt(c, vector);
    }

    /// Runs the guest on `core` until it computes, spins, or exits.
    fn guest_run(&mut self, core: usize) {
        loop {
            match self.interrupt_decision(core) {
                Some(Ok(info)) => return self.vm_exit(core, info, None),
                Some(Err(v)) => {
                    self.deliver(core, v);
                    continue;
                }
                None => {}
            }
            let vcpu = self.kernel_of(core);
            let (k, c) = self.kcpu(vcpu);
            let now = self.q.now();
            let mut dev = Devices {
                nic: &mut self.m.nic,
                virtio_net: match self.net_dev_of_vm[k] {
                    Some(d) => self.m.virtio_net.get_mut(d),
                    None => None,
                },
                virtio_blk: match self.blk_dev_of_vm[k] {
                    Some(d) => self.m.virtio_blk.get_mut(d),
                    None => None,
                },
            };
            let action = self.guests[k].next(c, now, &mut dev);
            let pokes = self.guests[k].take_pokes(c);
            if pokes != 0 {
                self.poke_siblings(k, pokes);
            }
            if self.pv.is_some() {
                self.pv_poll_observe();
            }
            match action {
                Action::Compute(d) => {
                    self.start_segment(core, d.min(MAX_SEGMENT));
                    return;
                }
                Action::Spin => return,
                Action::InterruptsEnabled => {}
                Action::Returned(v) => {
                    self.checker.handler_returned(vcpu, v);
                }
                // sti; hlt: in guest mode with HLT exiting it exits;
                // otherwise the core waits for an interrupt (a poke).
                Action::Instr(Instr::Hlt) => {
                    if let CoreMode::Guest { vcpu } = self.m.cores[core].mode {
                        if self.m.vmcs[vcpu].proc.hlt_exiting {
                            return self.vm_exit(core, ExitInfo::Hlt, None);
                        }
                    }
                    return;
                }
                Action::Instr(i) => {
                    if let Some((info, eoi)) = self.execute(core, vcpu, i) {
                        return self.vm_exit(core, info, eoi);
                    }
                }
            }
        }
    }

    /// EOI virtualization (SDM 29.1.4): the virtual-APIC page takes the
    /// EOI; an EOI-exit-bitmap vector then exits.
    fn virtualized_eoi(
        &mut self,
        k: usize,
        vcpu: usize,
        eoi: Option<u8>,
        now: Time,
    ) -> Option<(ExitInfo, Option<u8>)> {
        let cleared = self.m.vapic[vcpu].eoi();
        if let Some(expected) = eoi {
            self.checker.eoi(k, expected, cleared, now);
        }
        match cleared {
            Some(v) if self.m.vmcs[vcpu].eoi_exit_bitmap.test(v) => {
                Some((ExitInfo::EoiInduced { vector: v }, None))
            }
            _ => None,
        }
    }

    /// Whether vCPU `k`'s guest drives its LAPIC in xAPIC mode.
    fn guest_xapic(&self, k: usize) -> bool {
        self.hv.vms[self.hv.vcpus[k].vm].xapic
    }

    /// An xAPIC guest's store of `value` to the LAPIC register that x2APIC
    /// names `reg`, at offset `(reg - 0x800) << 4` of its APIC page, as the
    /// VMCS's APIC-access controls take it (SDM 29.4.3).
    fn xapic_store(
        &mut self,
        k: usize,
        vcpu: usize,
        reg: u32,
        value: u64,
        eoi: Option<u8>,
        now: Time,
    ) -> Option<(ExitInfo, Option<u8>)> {
        let offset = ((reg - msr::X2APIC_FIRST) << 4) as u16;
        let value = value as u32;
        match self.m.vmcs[vcpu].apic_mmio_write_outcome(offset) {
            ApicMmioOutcome::ApicAccessExit => Some((ExitInfo::ApicAccess { offset, value }, eoi)),
            ApicMmioOutcome::ApicWriteExit => Some((ExitInfo::ApicWrite { offset, value }, eoi)),
            ApicMmioOutcome::EoiVirtualization => self.virtualized_eoi(k, vcpu, eoi, now),
            ApicMmioOutcome::TprVirtualization => {
                let _ = self.m.vapic[vcpu].write_tpr(u64::from(value));
                None
            }
            // Refused at build (SMP xAPIC guests are not modelled); the
            // write exits as KVM's fallback would.
            ApicMmioOutcome::IpiVirtualization => {
                Some((ExitInfo::ApicWrite { offset, value }, None))
            }
        }
    }

    /// Executes a guest instruction. Returns the exit it causes, if any
    /// (with the vector an exiting EOI completes).
    fn execute(&mut self, core: usize, k: usize, i: Instr) -> Option<(ExitInfo, Option<u8>)> {
        let now = self.q.now();
        let vmcs = match self.m.cores[core].mode {
            CoreMode::Guest { vcpu } => Some(vcpu),
            _ => None,
        };
        let (reg, value, eoi) = match i {
            Instr::Eoi { vector } => {
                self.trace_event(TraceKind::Eoi { vector }, core, now, now);
                (msr::EOI, 0, Some(vector))
            }
            Instr::ArmTimer {
                count,
                deadline,
                vector,
            } => {
                self.checker.timer_programmed(k, vector, deadline, now);
                self.timer_due[k] = deadline;
                (msr::TMICT, count as u64, None)
            }
            Instr::WrMsr { msr: r, value } => {
                if r == msr::ICR {
                    self.guest_ipi_sent(k, value, now);
                }
                (r, value, None)
            }
            // Handled by guest_run before it gets here.
            Instr::Hlt => return None,
            Instr::PioWrite { port, .. } => {
                // KVM exits on every IN/OUT; on bare metal there is no
                // virtio device behind the port.
                let exits = vmcs.is_some_and(|v| self.m.vmcs[v].proc.unconditional_io_exiting);
                return exits.then_some((ExitInfo::IoInstruction { port }, None));
            }
            Instr::VfWrite { vf, reg } => {
                // The VF's BAR is mapped into the guest: MMIO goes straight
                // to the device in every scheme.
                match reg {
                    VfReg::Eitr(vec, v) => {
                        if let Ok(a) = self.m.nic.write_eitr(vf, vec, v, now) {
                            self.nic_action(a);
                        }
                    }
                    VfReg::Tdt => {
                        let fetch = self.tx_fetch;
                        if let Ok(Some(t)) = self.m.nic.tx_doorbell(vf, now, fetch, &self.m.link) {
                            self.q.schedule(t, Ev::VfTxDone { vf });
                        }
                    }
                    VfReg::Eims(bits) => {
                        if let Ok(acts) = self.m.nic.write_eims(vf, bits, now) {
                            for a in acts {
                                self.nic_action(a);
                            }
                        }
                    }
                }
                return None;
            }
        };
        // An xAPIC guest stores to its LAPIC page instead: in guest mode
        // the VMCS's APIC-access controls decide (SDM 29.4); on bare metal
        // the store reaches the LAPIC as the MSR write would.
        if let (Some(vcpu), true) = (vmcs, self.guest_xapic(k)) {
            if (msr::X2APIC_FIRST..=msr::X2APIC_LAST).contains(&reg) {
                return self.xapic_store(k, vcpu, reg, value, eoi, now);
            }
        }
        // In guest mode the VMCS decides where the write goes (SDM 25.1.3,
        // 29.5); a faulting virtualized write (#GP) changes nothing, as a
        // faulting physical one.
        let outcome = vmcs.map(|v| (v, self.m.vmcs[v].wrmsr_outcome(reg)));
        match outcome {
            Some((_, WrmsrOutcome::VmExit)) => {
                return Some((ExitInfo::MsrWrite { msr: reg, value }, eoi));
            }
            Some((vcpu, WrmsrOutcome::EoiVirtualization)) => {
                return self.virtualized_eoi(k, vcpu, eoi, now);
            }
            Some((vcpu, WrmsrOutcome::TprVirtualization)) => {
                let _ = self.m.vapic[vcpu].write_tpr(value);
                return None;
            }
            Some((vcpu, WrmsrOutcome::SelfIpiVirtualization)) => {
                let _ = self.m.vapic[vcpu].self_ipi(value);
                return None;
            }
            Some((vcpu, WrmsrOutcome::IpiVirtualization)) => {
                if self.ipi_virtualization(vcpu, value) {
                    return None;
                }
                // Anything else is an APIC-write VM exit, handled as KVM
                // handles an ICR write.
                return Some((ExitInfo::MsrWrite { msr: reg, value }, None));
            }
            Some((_, WrmsrOutcome::Msr)) | None => {}
        }
        let eff = self.m.lapics[core].write_msr(reg, value, now);
        if let Ok(eff) = eff {
            let r = schedule_apic_effect(&mut self.q, &self.m, core, eff, self.costs.ipi_latency);
            if let (Some(expected), Some(cleared)) = (eoi, r) {
                // The guest completes the handler the IDT ran for the
                // physical vector (they differ under a remapping shadow IDT).
                let cleared = match vmcs {
                    Some(v) => cleared.map(|c| self.m.idt_gate(v, c).unwrap_or(c)),
                    None => cleared,
                };
                self.checker.eoi(k, expected, cleared, now);
            }
        }
        None
    }

    /// The guest on `vcpu` wrote its ICR: the checker notes the IPI as
    /// raised for its target (unicast fixed IPIs to a sibling; the model's
    /// guests send no other kind).
    fn guest_ipi_sent(&mut self, vcpu: usize, icr: u64, now: Time) {
        let Ok(Ipi {
            dest: IpiDest::Physical(id),
            vector,
            mode: DeliveryMode::Fixed,
        }) = decode_icr(icr)
        else {
            return;
        };
        let vm = self.hv.vcpus[vcpu].vm;
        if let Some(t) = self.hv.vcpu_by_apic_id(vm, id) {
            self.checker.raised_on(t, vector, now);
        }
    }

    /// IPI virtualization (SDM 30.1.6, "virtualizing ICR writes"): a
    /// unicast fixed physical-mode IPI is posted by the processor to the
    /// descriptor the VM's PID-pointer table gives for the destination's
    /// virtual APIC ID, with a notification if ON was clear and SN is not
    /// set. No VM exit.
    fn ipi_virtualization(&mut self, vcpu: usize, icr: u64) -> bool {
        // Physical destination mode (bit 11 clear), which decode_icr does
        // not look at, and a legal vector.
        let physical = (icr >> 11) & 1 == 0;
        let Ok(Ipi {
            dest: IpiDest::Physical(dest),
            vector,
            mode: DeliveryMode::Fixed,
        }) = decode_icr(icr)
        else {
            return false;
        };
        if !physical || vector < 0x10 {
            return false;
        }
        let Some(&pid) = self.m.vmcs[vcpu].pid_table.get(dest as usize) else {
            return false;
        };
        let Some(pi) = self.m.pi_desc.get_mut(pid as usize) else {
            return false;
        };
        if pi.post(vector) {
            let (nv, ndst) = (pi.nv, pi.ndst);
            if let Some(to) = self.m.core_of_apic(ndst) {
                // The notification is an ordinary IPI from the sender's core.
                self.q.schedule_in_async(
                    self.costs.ipi_latency,
                    Ev::ApicArrive {
                        core: to as u16,
                        vector: nv,
                        mode: DeliveryMode::Fixed,
                    },
                );
            }
        }
        true
    }

    /// Something `vcpu` acts on changed: if it is in guest mode, its core
    /// stops what it was doing and looks again.
    fn look_again(&mut self, vcpu: usize) {
        let core = self.hv.vcpus[vcpu].core;
        if self.m.cores[core].mode == (CoreMode::Guest { vcpu }) {
            self.pause_guest(core);
            self.guest_run(core);
        }
    }

    /// The guest kernel set need_resched on sibling CPUs whose idle loop
    /// polls it (`pokes`, a bitmask): each that is in guest mode looks
    /// again now.
    fn poke_siblings(&mut self, vm: usize, pokes: u64) {
        let mut p = pokes;
        while p != 0 {
            let c = p.trailing_zeros() as usize;
            p &= p - 1;
            let Some(&vcpu) = self.hv.vms[vm].vcpus.get(c) else {
                continue;
            };
            let core = self.hv.vcpus[vcpu].core;
            if self.m.cores[core].mode == (CoreMode::Guest { vcpu }) {
                self.q.schedule_in(0, Ev::GuestPoke { vcpu: vcpu as u16 });
            }
        }
    }

    fn exit_cost(&mut self, vm: usize, info: ExitInfo) -> Time {
        let c = &self.costs;
        let rt = c.roundtrip;
        let mut sample = |mean: Time| {
            rt + from_s(
                self.rng_exit
                    .exponential(mean.saturating_sub(rt) as f64 / SEC as f64),
            )
        };
        match info {
            // The measured 1.97 µs covers the host IRQ handler, charged apart.
            ExitInfo::ExternalInterrupt { .. } => {
                c.external_interrupt.saturating_sub(c.irq_handler)
            }
            ExitInfo::EoiInduced { .. } => c.msr_write_eoi,
            ExitInfo::MsrWrite { msr, .. } => c.apic_register_write(msr),
            ExitInfo::IoInstruction { port } => match self.hv.ioeventfd(vm, port) {
                Some(_) => c.io_instruction_ioeventfd,
                None => sample(self.costs.io_instruction_mean),
            },
            ExitInfo::EptViolation => sample(self.costs.ept_violation_mean),
            ExitInfo::PendingInterrupt | ExitInfo::PreemptionTimer => c.pending_interrupt,
            ExitInfo::Hlt => c.hlt,
            // The same register's MSR-write exit, plus decoding the store
            // for the fault-like APIC access.
            ExitInfo::ApicAccess { .. } | ExitInfo::ApicWrite { .. } => {
                let base = c.apic_register_write(info.apic_msr().map_or(0, |(m, _)| m));
                if matches!(info, ExitInfo::ApicAccess { .. }) {
                    base + c.apic_access_decode
                } else {
                    base
                }
            }
            ExitInfo::Nmi => c.nmi,
            // Like EXTERNAL_INTERRUPT, the host handler is charged apart.
            ExitInfo::Exception { .. } => c.exception_np.saturating_sub(c.irq_handler),
        }
    }

    fn vm_exit(&mut self, core: usize, info: ExitInfo, eoi_expect: Option<u8>) {
        let now = self.q.now();
        self.pause_guest(core);
        let CoreMode::Guest { vcpu } = self.m.cores[core].mode else {
            return;
        };
        self.account_guest_time(core, vcpu, now);
        // The preemption timer counts only in guest mode.
        self.ptimer_gen[core] += 1;
        self.m.cores[core].mode = CoreMode::Host { vcpu };
        self.exits[core] = Some(ExitState {
            vcpu,
            info,
            start: now,
            stage: Stage::Handler,
            timer_landed: false,
            record: true,
        });
        let base = self.exit_cost(self.hv.vcpus[vcpu].vm, info);
        let (mut cx, scheme) = self.cx();
        let out = scheme.handle_exit(&mut cx, vcpu, info);
        if matches!(info, ExitInfo::ExternalInterrupt { vector: Some(_) }) {
            // The host's handler EOIs the vector acknowledged on exit.
            cx.m.lapics[core].eoi();
        }
        let charged = cx.charged;
        if let (Some(expected), Some(cleared)) = (eoi_expect, out.eoi_cleared) {
            self.checker.eoi(vcpu, expected, cleared, now);
        }
        self.start_segment(core, base + charged);
    }

    fn exit_stage_done(&mut self, core: usize) {
        let Some(mut e) = self.exits[core] else {
            return;
        };
        if e.stage != Stage::Entering {
            // Host interrupts are enabled between handler steps.
            let (mut cx, scheme) = self.cx();
            let mut took = false;
            if cx.m.lapics[core].take_nmi() {
                scheme.host_nmi(&mut cx, core);
                took = true;
            } else if let Some(v) = cx.m.lapics[core].ack() {
                scheme.host_interrupt(&mut cx, core, v);
                cx.m.lapics[core].eoi();
                took = true;
            }
            if took {
                let charged = cx.charged.max(1);
                e.stage = Stage::HostIrq;
                self.exits[core] = Some(e);
                self.start_segment(core, charged);
                return;
            }
            let wait = scheme.entry_quiesce(&cx, e.vcpu);
            if wait > 0 {
                e.stage = Stage::HostIrq;
                self.exits[core] = Some(e);
                self.start_segment(core, wait);
                return;
            }
            scheme.prepare_entry(&mut cx, e.vcpu);
            let charged = cx.charged;
            e.stage = Stage::Entering;
            self.exits[core] = Some(e);
            if charged > 0 {
                self.start_segment(core, charged);
                return;
            }
        }
        self.vm_entry(core);
    }

    fn vm_entry(&mut self, core: usize) {
        let Some(e) = self.exits[core].take() else {
            return;
        };
        let now = self.q.now();
        let vcpu = e.vcpu;
        let vm = self.hv.vcpus[vcpu].vm;
        let service = now - e.start;
        let reason = e.info.reason();
        let kind = if e.record {
            TraceKind::Exit(reason)
        } else {
            TraceKind::ScheduleIn
        };
        self.trace_event(kind, core, e.start, now);
        let deschedule = std::mem::take(&mut self.deschedule_pending[vcpu]);
        if deschedule && !self.hv.vcpus[vcpu].halted {
            self.put(core, vcpu);
            return;
        }
        if e.record && e.start >= self.measure_start {
            self.hv.vms[vm].stats.record_info(&e.info, service);
            if e.timer_landed {
                self.timer_exits[reason.index()].record(service);
            }
        }
        if self.hv.vcpus[vcpu].halted {
            // kvm_vcpu_block: the vCPU thread sleeps instead of entering,
            // unless an interrupt came in since the HLT exit began
            // (kvm_vcpu_check_block looks again right before sleeping).
            let runnable = {
                let (cx, scheme) = self.cx();
                scheme.vcpu_has_interrupt(&cx, vcpu)
            };
            if !runnable {
                // A schedule-out that came during the HLT exit is moot:
                // the thread blocks (pi_pre_block and all), and the
                // kick that makes an interrupt pending wakes it.
                return self.halt(core, vcpu);
            }
            self.hv.vcpus[vcpu].halted = false;
        }
        if deschedule {
            self.put(core, vcpu);
            return;
        }
        self.m.cores[core].mode = CoreMode::Guest { vcpu };
        self.m.cores[core].guest_since = now;
        self.arm_preemption_timer(core, vcpu);
        if let Some(crate::hw::x86::vmcs::EntryEvent::ExternalInterrupt(v)) =
            self.m.vmcs[vcpu].entry_event.take()
        {
            match self.through_idt(vcpu, v) {
                Err(g) => self.deliver(core, g),
                Ok(info) => return self.vm_exit(core, info, None),
            }
        }
        let guest_isr = {
            let (cx, scheme) = self.cx();
            scheme.guest_isr(&cx, vcpu)
        };
        let (k, c) = self.kcpu(vcpu);
        let in_service = self.guests[k].in_service(c);
        self.checker.isr_at_entry(vcpu, in_service, guest_isr, now);
        self.guest_run(core);
    }

    /// The run's results.
    pub fn report(&self) -> crate::report::RunReport {
        crate::report::RunReport::from_world(self.snapshot())
    }

    /// One VM's guest and VF metrics over the measured interval.
    fn vm_metrics(&self, vm: usize, out: &mut Metrics, dur: f64) {
        let g = &self.guests[vm];
        g.metrics(out);
        let vf = vm as u16;
        let nic = self.m.nic.counters(vf).unwrap_or_default();
        let base = self.nic_base[vm];
        out.insert(
            "nic.rx_packets".into(),
            (nic.rx_packets - base.rx_packets) as f64,
        );
        out.insert(
            "nic.rx_missed".into(),
            (nic.rx_missed - base.rx_missed) as f64,
        );
        out.insert(
            "nic.interrupts_per_s".into(),
            (nic.interrupts - base.interrupts) as f64 / dur,
        );
        let gc = g.counters;
        out.insert("guest.irqs_per_s".into(), gc.irqs as f64 / dur);
        out.insert("guest.rx_packets".into(), gc.rx_packets as f64);
        out.insert("guest.socket_drops".into(), gc.socket_drops as f64);
        out.insert("guest.timer_irqs_per_s".into(), gc.timer_irqs as f64 / dur);
        if g.cpus() > 1 {
            out.insert("guest.ipis_sent_per_s".into(), gc.ipis_sent as f64 / dur);
            out.insert(
                "guest.resched_irqs_per_s".into(),
                gc.resched_irqs as f64 / dur,
            );
        }
        if g.rps_enabled() {
            let r = g.rps_counters();
            for (k, n) in [
                ("guest.call_function_irqs_per_s", r.call_function_irqs),
                ("guest.rps_ipis_per_s", r.ipis),
                ("guest.rps_steered_per_s", r.steered),
                ("guest.rps_steered_remote_per_s", r.steered_remote),
                ("guest.rps_batches_per_s", r.batches),
            ] {
                out.insert(k.into(), n as f64 / dur);
            }
            out.insert("guest.rps_backlog_drops".into(), r.drops as f64);
        }
    }

    /// Each virtio-net back end's counters, as its VM's metrics (VM 0's by
    /// their plain names), and its worker's.
    fn vhost_metrics(&self, pv: &net::PvPath, metrics: &mut Metrics, dur: f64) {
        let hybrid = self.scenario.hv.es2_hybrid != crate::hv::es2::Es2Hybrid::Off;
        for d in &pv.devs {
            let v = &d.counters;
            let w = &pv.workers[d.worker].counters;
            let prefix = crate::report::vm_prefix(d.vm);
            let mut put = |k: &str, n: f64| {
                metrics.insert(format!("{prefix}{k}"), n);
            };
            for (k, n) in [
                ("vhost.kicks", v.kicks),
                ("vhost.wakeups", w.wakeups),
                ("vhost.tx_frames", v.tx_frames),
                ("vhost.rx_frames", v.rx_frames),
                ("vhost.signals", v.signals),
                ("vhost.signals_suppressed", v.signals_suppressed),
                ("vhost.tap_drops", v.tap_drops),
            ] {
                put(k, n as f64);
            }
            if hybrid {
                put("vhost.quota_requeues", v.quota_requeues as f64);
                put("vhost.polling_turns", v.polling_turns as f64);
                put("vhost.empty_polls", v.empty_polls as f64);
                put("vhost.naps", w.naps as f64);
            }
        }
        {
            // ES2 §7's overhead: the I/O threads' CPU, % of one core.
            let busy: Time = pv.workers.iter().map(|w| w.counters.busy).sum();
            metrics.insert(
                "vhost.io_cpu_pct".into(),
                100.0 * busy as f64 / (dur * SEC as f64).max(1.0),
            );
        }
    }

    fn snapshot(&self) -> crate::report::Snapshot<'_> {
        let mut metrics = Metrics::new();
        let dur = (self.end - self.measure_start) as f64 / SEC as f64;
        // VM 0's metrics by their plain names, VM i's prefixed `vm<i>.`.
        for vm in 0..self.guests.len() {
            if vm == 0 {
                self.vm_metrics(0, &mut metrics, dur);
            } else {
                let mut m = Metrics::new();
                self.vm_metrics(vm, &mut m, dur);
                for (k, v) in m {
                    metrics.insert(format!("vm{vm}.{k}"), v);
                }
            }
        }
        for link in &self.peers {
            if link.vm == 0 {
                link.peer.metrics(&mut metrics);
            } else {
                let mut m = Metrics::new();
                link.peer.metrics(&mut m);
                // A VM's several peer processes (netperf instances) sum.
                for (k, v) in m {
                    *metrics.entry(format!("vm{}.{k}", link.vm)).or_insert(0.0) += v;
                }
            }
        }
        self.scheme.metrics(&mut metrics);
        if self.sched.is_some() || !self.scenario.preemptions.is_empty() {
            self.sched_metrics(&mut metrics, self.end, dur);
            let w = &self.checker.waited_schedule_in;
            metrics.insert("irq.waited_schedule_in".into(), w.count() as f64);
            if w.count() > 0 {
                metrics.insert(
                    "irq.waited_schedule_in_mean_us".into(),
                    crate::engine::as_us(w.mean()),
                );
                metrics.insert(
                    "irq.waited_schedule_in_p99_us".into(),
                    crate::engine::as_us(w.percentile(99.0)),
                );
            }
            let d = &self.checker.descheduled_delay;
            metrics.insert("irq.descheduled".into(), d.count() as f64);
            if d.count() > 0 {
                metrics.insert(
                    "irq.descheduled_delay_mean_us".into(),
                    crate::engine::as_us(d.mean()),
                );
                metrics.insert(
                    "irq.descheduled_delay_p99_us".into(),
                    crate::engine::as_us(d.percentile(99.0)),
                );
                metrics.insert(
                    "irq.descheduled_delay_max_us".into(),
                    crate::engine::as_us(d.max()),
                );
            }
        }
        for b in &self.blk {
            b.metrics(&mut metrics);
        }
        if let Some(pv) = &self.pv {
            self.vhost_metrics(pv, &mut metrics, dur);
        }
        for (vm, r) in self.hv.redirect.iter().enumerate() {
            if let Some(r) = r {
                let p = crate::report::vm_prefix(vm);
                metrics.insert(format!("{p}es2.redirected"), r.redirected as f64);
                metrics.insert(format!("{p}es2.to_offline"), r.to_offline as f64);
            }
        }
        crate::report::Snapshot {
            scenario: &self.scenario,
            scheme: self.scheme.name(),
            duration: self.end - self.measure_start,
            vms: &self.hv.vms,
            metrics,
            checker: &self.checker,
            timer_exits: &self.timer_exits,
            msi_faults: self.msi_faults,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-vCPU world of `scheme` with no workload, its vCPU's core put
    /// back in guest mode so that guest instructions can be executed there.
    fn world_in_guest_mode(scheme: &str) -> (World, usize) {
        let text = format!(
            "scheme = \"{scheme}\"\nduration_s = 0.01\n[background]\nenabled = false\n[guest]\ntick = \"off\"\n"
        );
        let s = Scenario::parse(&text, &[]).expect("scenario parses");
        let mut w = World::build(&s, &Calibration::default_host()).expect("world builds");
        let core = w.hv.vcpus[0].core;
        w.exits[core] = None;
        w.m.cores[core].mode = CoreMode::Guest { vcpu: 0 };
        (w, core)
    }

    /// DID §4.2 with vCPUs that move: whenever the VF's vCPU is loaded, its
    /// IRT entry aims at the core it runs on now, in fixed mode; whenever
    /// it is not, the entry is in NMI mode. Two 1-vCPU VMs and a burner
    /// share cores 1-2 (three threads on two cores), so periodic balancing
    /// moves threads back and forth.
    #[test]
    fn did_irt_entries_follow_a_migrating_vcpu() {
        use crate::engine::US;
        let text = "scheme = \"did\"\nseed = 2\nduration_s = 1.0\nwarmup_s = 0.01\n\
                    [machine]\ncores = 4\n[[host.burners]]\ncores = [1, 2]\n\
                    [[vm]]\nvcpus = 1\ncopies = 2\nallowed_cores = [1, 2]\n\
                    [vm.workload.udp]\nrate_pps = 20000\n";
        let s = Scenario::parse(text, &[]).expect("scenario parses");
        let mut w = World::build(&s, &Calibration::default_host()).expect("world builds");
        let mut moved = 0;
        let mut checked = 0;
        for step in 1..=400u64 {
            w.end = step * 2 * MS + 37 * US * (step % 7);
            w.run(|_| {});
            for vm in 0..2 {
                let vcpu = w.hv.device_home(vm);
                let a = w.hv.vms[vm].vf.expect("a VF");
                let e = *w.m.irt.get(a.irte).expect("an IRT entry");
                let v = &w.hv.vcpus[vcpu];
                if v.loaded {
                    let apic = w.m.cores[v.core].apic_id;
                    assert_eq!(
                        (e.mode, e.dest_apic_id),
                        (DeliveryMode::Fixed, apic),
                        "at {} us VM {vm} runs on core {}",
                        w.end / US,
                        v.core
                    );
                    checked += 1;
                } else {
                    assert_eq!(e.mode, DeliveryMode::Nmi, "at {} us", w.end / US);
                }
                moved += (v.core != 1 + vm) as u32;
            }
        }
        assert!(checked > 100, "{checked}");
        assert!(
            moved > 10,
            "the vCPUs never left their first cores: {moved}"
        );
        let st = w.sched.as_ref().expect("a scheduler");
        assert!(st.migrations > 0);
    }

    /// Every VM whose workload has Fio gets its own virtio-blk device,
    /// ioeventfd (its notify port is the same in every VM: KVM keys the
    /// registration by VM) and QEMU back end; a VM without Fio has none.
    #[test]
    fn each_fio_vm_has_its_own_blk_device_kick_fd_and_back_end() {
        let text = "scheme = \"kvm\"\nduration_s = 0.01\nwarmup_s = 0.002\n\
                    [machine]\ncores = 4\n[[vm]]\ncore = 1\n[vm.workload.udp]\n\
                    rate_pps = 1000\n[[vm]]\ncore = 2\ncopies = 2\ncopies_cores = [2, 3]\n\
                    [vm.workload.fio]\n";
        let s = Scenario::parse(text, &[]).expect("scenario parses");
        let mut w = World::build(&s, &Calibration::default_host()).expect("world builds");
        assert_eq!(w.blk_dev_of_vm, [None, Some(0), Some(1)]);
        assert_eq!(w.m.virtio_blk.len(), 2);
        let port = VIRTIO_BLK_NOTIFY_PORT;
        assert_eq!(w.hv.ioeventfd(0, port), None);
        assert_eq!(w.hv.ioeventfd(1, port), Some(blk_kick_fd(0)));
        assert_eq!(w.hv.ioeventfd(2, port), Some(blk_kick_fd(1)));
        assert!(w.guests[0].config().virtio_blk.is_none());
        assert!(w.guests[2].config().virtio_blk.is_some());
        w.run(|_| {});
        for (d, vm) in [(0, 1), (1, 2)] {
            let b = &w.blk[d].backend;
            assert_eq!((b.vm, b.kick_fd), (vm, blk_kick_fd(d)));
            assert!(b.counters.requests > 50, "device {d}: {:?}", b.counters);
            // Queue depth 1: a kick per request (one may be in flight).
            assert!(b.counters.kicks.abs_diff(b.counters.requests) <= 1);
        }
    }

    /// SDM 29.5: under "virtualize x2APIC mode", a TPR write the MSR bitmap
    /// lets through sets VTPR, and with virtual-interrupt delivery a SELF
    /// IPI write is self-IPI virtualization (vIRR, RVI); the physical LAPIC
    /// sees neither.
    #[test]
    fn apicv_tpr_and_self_ipi_writes_go_to_the_virtual_apic_page() {
        let (mut w, core) = world_in_guest_mode("apicv");
        let wr = |w: &mut World, msr, value| w.execute(core, 0, Instr::WrMsr { msr, value });
        assert_eq!(wr(&mut w, msr::TPR, 0x50), None, "TPR write does not exit");
        assert_eq!(w.m.vapic[0].vtpr, 0x50);
        assert_eq!(w.m.lapics[core].tpr(), 0, "physical TPR untouched");
        let pending = w.q.len();
        assert_eq!(wr(&mut w, msr::SELF_IPI, 0x61), None);
        assert!(w.m.vapic[0].virr.test(0x61));
        assert_eq!(w.m.vapic[0].rvi, 0x61);
        assert_eq!(w.q.len(), pending, "no physical self-IPI was sent");
        assert!(!w.m.lapics[core].irr.test(0x61));
        // A lower self-IPI leaves RVI at the highest request.
        wr(&mut w, msr::SELF_IPI, 0x41);
        assert_eq!(w.m.vapic[0].rvi, 0x61);
        // VTPR masks class 6 until it is lowered.
        wr(&mut w, msr::TPR, 0x70);
        assert_eq!(w.m.vapic[0].deliverable(), None);
        wr(&mut w, msr::TPR, 0x20);
        assert_eq!(w.m.vapic[0].deliverable(), Some(0x61));
    }

    /// Stock KVM intercepts both: they exit instead.
    #[test]
    fn kvm_tpr_and_self_ipi_writes_exit() {
        let (mut w, core) = world_in_guest_mode("kvm");
        for (msr, value) in [(msr::TPR, 0x50), (msr::SELF_IPI, 0x61)] {
            let out = w.execute(core, 0, Instr::WrMsr { msr, value });
            assert_eq!(out, Some((ExitInfo::MsrWrite { msr, value }, None)));
        }
        assert_eq!(w.m.lapics[core].tpr(), 0);
        assert_eq!(w.m.vapic[0].vtpr, 0);
    }
}
