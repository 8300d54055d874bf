//! The platform: builds a machine, hypervisor, guests and workloads from a
//! scenario, and runs the event loop that moves cores between guest mode,
//! VM exits and VM entries. This is where the hardware decides, from VMCS
//! controls and LAPIC state, whether a guest action or an interrupt exits.

mod arch;
mod blk;
mod build;
mod el2;
pub mod event;
mod event_exits;
mod host_link;
pub mod hs;
mod kvmtool_net;
mod metrics;
mod net;
mod peer_threads;
mod sched;
mod svm;
mod vcanal;
mod vmx;
mod vsock;

pub use build::{
    VIRTIO_BLK_NOTIFY_PORT, VIRTIO_BLK_VECTOR, VIRTIO_NET_VECTORS, VIRTIO_NOTIFY_PORT,
};

use crate::check::Checker;
use crate::engine::{from_ns, from_s, from_us, EventQueue, RngStream, Summary, Time, MS};
use crate::guest::net::Devices;
use crate::guest::{Action, Kernel};
use crate::hv::exits::ExitInfo;
use crate::hv::scheme::Scheme;
use crate::hv::{HvCosts, HvCx, HvState};
use crate::hw::x86::core::CoreMode;
use crate::hw::x86::iommu::Remapped;
use crate::hw::x86::lapic::DeliveryMode;
use crate::hw::x86::nic::{IrqAction, RxPacket};
use crate::hw::x86::Machine;
use crate::report::trace::{Trace, TraceKind};
use crate::scenario::Scenario;
use crate::workloads::udp::UdpSender;
use event::Ev;

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
    info: arch::ArchExit,
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
    /// Per vCPU: the guest deadline (APIC-timer virtualization) an
    /// `Ev::GuestDeadline` is scheduled for; 0: none.
    guest_deadline_watch: Vec<u64>,
    /// Exits a guest timer expiry landed in, by reason (service times).
    pub timer_exits: [Summary; crate::hv::exits::ExitReason::COUNT],
    /// MSIs blocked by the IOMMU.
    pub msi_faults: u64,
    /// Datagrams the NIC dropped for lack of descriptors (from counters).
    measure_start: Time,
    end: Time,
    lost_grace: Time,
    scenario: Scenario,
    /// The calibration entries this run changed from the shipped file
    /// (reported as provenance).
    calibration_changes: std::collections::BTreeMap<String, crate::calibration::Entry>,
    /// The VM whose finite task ends the run when it exits (a one-VM
    /// WhileLoop).
    ends_run: Option<usize>,
    /// The virtualization extension guests run with.
    arch: arch::Arch,
    deschedule_pending: Vec<bool>,
    rng_host: RngStream,
    ptimer_gen: Vec<u64>,
    tsc_hz: u64,
    /// Per VF: its counters at the end of the warm-up.
    nic_base: Vec<crate::hw::x86::nic::VfCounters>,
    /// Per VF, each RX queue's frames at the start of the measured
    /// interval (with several queues).
    nic_queue_base: Vec<[u64; crate::hw::x86::nic::MAX_QUEUES as usize]>,
    /// The vhost side of the VMs' virtio-net devices, if any.
    pv: Option<Box<net::PvPath>>,
    /// kvm-tools' userspace back end of the VMs' virtio-net devices, when
    /// `net.backend = "kvmtool-tap"` (then `pv` is `None`).
    kvmtool: Option<Box<kvmtool_net::KvmtoolPath>>,
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
    /// The ARM platform's interrupt hardware, scheme and KVM/ARM state
    /// (`arch` = ArmEl2 only).
    el2: Option<Box<el2::El2World>>,
    /// The RISC-V platform's harts, IMSICs, IOMMU, scheme and KVM RISC-V
    /// state (`arch` = RiscvHs only).
    hs: Option<Box<hs::HsWorld>>,
    /// Exits per guest event (always on ARM; on x86 when the scenario asks).
    event_exits: Option<Box<event_exits::EventExits>>,
    /// vCanal's service, host stack and client hosts, if a VM uses it.
    canal: Option<Box<vcanal::CanalPath>>,
    /// Work segments that ended in place, without the queue
    /// (`guest_run_from_segment`).
    segments_in_place: u64,
    /// Calibration `cpu.smt_shared_speed`: the speed of a guest's work on
    /// a logical CPU whose Hyper-Threading sibling is busy
    /// (`machine.smt`).
    smt_speed: f64,
    /// With `machine.smt`, in the measured interval: the planned work of
    /// the guest work segments started, and of those started beside a
    /// busy sibling.
    smt_work: [Time; 2],
    /// virtio-vsock's devices, workers, relays and client host, if VMs use it.
    vsock: Option<Box<vsock::VsockPath>>,
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
            // A guest's work segments may have run through to a later
            // time within this dispatch (`guest_run_from_segment`).
            let now = self.q.now();
            if self.run_ended() {
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
        if let Some(t) = &mut self.trace {
            t.finish(self.end);
        }
        // Close open guest-mode stretches for time in guest.
        for c in 0..self.m.cores.len() {
            if let CoreMode::Guest { vcpu } = self.m.cores[c].mode {
                self.account_guest_time(c, vcpu, self.end);
            }
        }
        self.arch_finish();
        self.checker.finish(self.end, self.lost_grace);
    }

    /// Whether the VM whose finite task ends the run has seen it exit.
    #[inline]
    fn run_ended(&self) -> bool {
        self.ends_run
            .is_some_and(|vm| self.guests[vm].counters.tasks_exited > 0)
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

    /// Records a trace event about `who` (a vCPU, VM or host thread: see
    /// [`TraceKind`]) when tracing.
    #[inline]
    fn trace_event(&mut self, kind: TraceKind, core: usize, who: usize, start: Time, end: Time) {
        if let Some(t) = &mut self.trace {
            t.record(kind, core, who, start, end);
        }
    }

    /// Records the host scheduler's state on `core` (the thread holding
    /// it, its run-queue length) when tracing.
    fn trace_sched(&mut self, core: usize) {
        let (Some(t), Some(st)) = (&mut self.trace, &self.sched) else {
            return;
        };
        t.sched(
            core,
            st.s.current(core),
            st.s.nr_running(core),
            self.q.now(),
        );
    }

    /// [`World::trace_sched`] on the core of host-scheduler thread `tid`;
    /// nothing to look up unless tracing.
    fn trace_sched_of(&mut self, tid: usize) {
        if self.trace.is_none() {
            return;
        }
        if let Some(core) = self.sched.as_ref().map(|st| st.s.thread(tid).core) {
            self.trace_sched(core);
        }
    }

    /// The names of the trace's tracks.
    pub fn trace_names(&self) -> crate::report::trace::TraceNames {
        let vcpus: Vec<(usize, usize)> = self.hv.vcpus.iter().map(|v| (v.vm, v.index)).collect();
        let mut host_threads: Vec<String> = Vec::new();
        if let Some(st) = &self.sched {
            for t in 0..st.s.threads() {
                host_threads.push(match vcpus.get(t) {
                    Some(&(vm, i)) => format!("vCPU thread vm{vm} vcpu{i}"),
                    None => match (st.io_worker_of(t), st.kvmtool_of(t)) {
                        (Some(w), _) => format!("vhost worker {w}"),
                        (None, Some(k)) => format!(
                            "kvmtool dev{} {} thread",
                            k / crate::hv::kvmtool_net::THREADS,
                            crate::hv::kvmtool_net::Role::of(k).name()
                        ),
                        (None, None) => match st.peer_of(t) {
                            Some((l, c)) => format!("peer {l} thread {c}"),
                            None => format!("host thread {t}"),
                        },
                    },
                });
            }
        }
        if let Some(pv) = &self.pv {
            for w in 0..pv.workers.len() {
                host_threads.push(format!("vhost worker {w}: work"));
            }
        }
        crate::report::trace::TraceNames {
            cores: self.m.cores.len(),
            vcpus,
            host_threads,
            vms: self.hv.vms.len(),
            intids: self.el2.as_deref().map_or_else(Vec::new, |a| {
                (0..self.hv.vms.len())
                    .map(|vm| (0..=255u8).map(|v| a.intid_of(v, vm)).collect())
                    .collect()
            }),
        }
    }

    /// The trace's id of vhost worker `w`'s work track: after the
    /// scheduler's threads.
    fn trace_vhost_track(&self, w: usize) -> usize {
        self.sched.as_ref().map_or(0, |st| st.s.threads()) + w
    }

    /// Events processed so far.
    pub fn events(&self) -> u64 {
        self.q.popped()
    }

    /// Of [`Self::events`], the work segments that ended in place (their
    /// completion would have popped next; see `guest_run_from_segment`).
    pub fn segments_in_place(&self) -> u64 {
        self.segments_in_place
    }

    fn dispatch(&mut self, ev: Ev, now: Time) {
        match ev {
            Ev::Segment { core, gen } => {
                let core = core as usize;
                let work = self.m.cores[core].seg.work;
                if !self.m.cores[core].complete(gen) {
                    return;
                }
                match self.m.cores[core].mode {
                    CoreMode::Guest { .. } | CoreMode::Native { .. } => {
                        let (k, c) = self.kcpu(self.kernel_of(core));
                        self.guests[k].charge(c, work);
                        self.guest_run_from_segment(core);
                    }
                    CoreMode::Host { .. } => self.arch_stage_done(core),
                    CoreMode::Idle => {}
                }
            }
            Ev::GuestDeadline { vcpu } => self.guest_deadline_due(vcpu as usize),
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
                    // Another IOMMU's entry format: the architecture's.
                    Ok(other) => self.arch_remapped(other),
                    Err(_) => self.msi_faults += 1,
                }
            }
            Ev::Doorbell { core } => self.arch_doorbell(core as usize),
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
                self.kvmtool_eventfd(fd);
                self.blk_eventfd(fd);
                self.canal_eventfd(fd);
                self.vsock_eventfd(fd);
            }
            Ev::KvmtoolStep { thread } => self.kvmtool_step(thread as usize),
            Ev::KvmtoolNicIrq => self.kvmtool_nic_irq(),
            Ev::KvmtoolSoftirqd => self.kvmtool_softirqd(),
            Ev::KvmtoolHostRxDone => self.kvmtool_host_rx_done(),
            Ev::BlkStep { dev } => self.blk_step(dev as usize),
            Ev::VhostStep { worker } => self.pv_vhost_step(worker as usize),
            Ev::VhostNapEnd { worker, gen } => self.pv_nap_end(worker as usize, gen),
            Ev::ToPeer { peer } => self.peer_receive(peer as usize),
            Ev::ToGuest { peer } => self.peer_frame_arrives(peer as usize),
            Ev::PeerTimer { peer, key } => self.peer_timer(peer as usize, key),
            Ev::PeerThreadStep { peer, cpu, gen } => {
                self.peer_thread_step(peer as usize, cpu as usize, gen)
            }
            Ev::VfTxDone { vf, queue } => self.vf_tx_done(vf, queue),
            Ev::WarmupEnd => self.reset_stats(now),
            Ev::HostIpi { core } => {
                let rate = self.scenario.host.ipi_per_s;
                let dt = from_s(self.rng_host.exponential(1.0 / rate));
                self.q.schedule_in(dt.max(1), Ev::HostIpi { core });
                if let Some(e) = &mut self.event_exits {
                    let vm = self
                        .hv
                        .vcpu_owning(core as usize)
                        .map_or(0, |v| self.hv.vcpus[v].vm);
                    if now > 0 {
                        e.event(vm, crate::hv::exits::EventClass::HostIpi);
                    }
                    e.kick[core as usize] = crate::hv::exits::EventClass::HostIpi;
                }
                if now > 0 && !self.arch_host_vipi(core as usize) {
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
            Ev::GuestPoke { vcpu } => {
                let vcpu = vcpu as usize;
                if self.runs_kernel_cpu(vcpu) {
                    let core = self.hv.vcpus[vcpu].core;
                    self.pause_guest(core);
                    self.guest_run(core);
                }
            }
            Ev::Deschedule { vcpu } => self.deschedule(vcpu as usize),
            Ev::Reschedule { vcpu } => self.reschedule(vcpu as usize),
            Ev::SchedTick { core } => self.sched_tick(core as usize),
            Ev::WakeVcpu { vcpu } => self.sched_wake_vcpu(vcpu as usize),
            Ev::HaltPollEnd { vcpu, gen } => self.halt_poll_end(vcpu as usize, gen),
            Ev::Resched { core } => self.sched_switch(core as usize),
            Ev::VtimerFire { .. }
            | Ev::ItsMsi { .. }
            | Ev::ItsSgir { .. }
            | Ev::ArmSgi { .. }
            | Ev::BgTimer { .. }
            | Ev::ArmPollEnd { .. }
            | Ev::ArmWake { .. }
            | Ev::ArmIdleExit { .. }
            | Ev::NicSpi { .. } => self.el2_event(ev, now),
            Ev::HsVsTimer { .. }
            | Ev::HsKvmTimer { .. }
            | Ev::HsHostIpi { .. }
            | Ev::HsMsi { .. }
            | Ev::HsPoke { .. }
            | Ev::HsWake { .. } => self.hs_event(ev, now),
            Ev::CanalStep => self.canal_step(),
            Ev::VsockStep => self.vsock_step(),
            Ev::VsockToPeer => self.vsock_to_peer(),
            Ev::VsockToHost => self.vsock_to_host(),
            Ev::VsockPeerTimer => self.vsock_peer_timer(),
            Ev::VsockTcpTimer => self.vsock_tcp_timer(),
            Ev::CanalToPeer => self.canal_to_peer(),
            Ev::CanalToHost => self.canal_to_host(),
            Ev::CanalNicIrq => self.canal_nic_irq(),
            Ev::CanalPoolStep { thread } => self.canal_pool_step(thread as usize),
            Ev::CanalSoftirqd => self.canal_softirqd(),
            Ev::CanalPeerTimer { vm } => self.canal_peer_timer(vm as usize),
        }
    }

    /// Schedule-out: the host takes `vcpu`'s core, at once from guest mode
    /// (the host interrupt that preempts it is an exit whose work the model
    /// does not charge), deferred to the end of an exit in progress.
    fn deschedule(&mut self, vcpu: usize) {
        let core = self.hv.vcpus[vcpu].core;
        match self.m.cores[core].mode {
            CoreMode::Guest { vcpu: v } if v == vcpu => {
                let now = self.q.now();
                self.pause_guest(core);
                self.account_guest_time(core, vcpu, now);
                self.arch_put(core, vcpu);
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
            info: arch::ArchExit::Vmx(ExitInfo::Hlt),
            start: now,
            stage: Stage::HostIrq,
            timer_landed: false,
            record: false,
        });
        self.arch_stage_done(core);
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

    /// The start of every architecture's schedule-in of `vcpu`: the core
    /// the host scheduler runs its thread on, with the vCPU moved there if
    /// its thread moved and `kvm_sched_in` (the preempt notifier) run.
    /// None when the schedule-in is void: a deschedule came first, the
    /// vCPU sleeps (it comes back when kicked), or the core was given to
    /// another thread or is not idle since the schedule-in was decided.
    pub(super) fn schedule_in_core(&mut self, vcpu: usize) -> Option<usize> {
        if std::mem::take(&mut self.deschedule_pending[vcpu]) || self.hv.vcpus[vcpu].halted {
            return None;
        }
        let here = self.hv.vcpus[vcpu].core;
        let core = match &self.sched {
            Some(st) => {
                let c = st.s.thread(vcpu).core;
                if st.s.current(c) != Some(vcpu) {
                    return None;
                }
                c
            }
            None => here,
        };
        if self.m.cores[core].mode != CoreMode::Idle {
            return None;
        }
        if core != here {
            self.hv.move_vcpu(vcpu, core);
        }
        self.hv.sched_in(vcpu);
        Some(core)
    }

    /// Schedule-in: load `vcpu` and enter it.
    fn reschedule(&mut self, vcpu: usize) {
        if self.arch_reschedule(vcpu) {
            return;
        }
        let Some(core) = self.schedule_in_core(vcpu) else {
            return;
        };
        let now = self.q.now();
        // kvm_arch_vcpu_load follows kvm_sched_in.
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
            info: arch::ArchExit::Vmx(ExitInfo::PreemptionTimer),
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
            self.arch_stage_done(core);
        }
    }

    /// Ends a guest-mode stretch of `vcpu` on `core` at `until`: adds the
    /// part inside the measured interval to its VM's time in guest.
    fn account_guest_time(&mut self, core: usize, vcpu: usize, until: Time) {
        let entered = self.m.cores[core].guest_since;
        self.trace_event(TraceKind::Guest, core, vcpu, entered, until);
        let vm = self.hv.vcpus[vcpu].vm;
        let since = self.m.cores[core].guest_since.max(self.measure_start);
        let index = self.hv.vcpus[vcpu].index;
        let guest = until.saturating_sub(since);
        let start = self.measure_start;
        if let Some(a) = self.el2.as_deref_mut() {
            a.guest_idle_end(vcpu, until, start);
        }
        self.hv.vms[vm].stats.guest_time += guest;
        self.hv.vms[vm].vcpu_stats[index].guest_time += guest;
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
                // A wired line the device already holds high: the new
                // cause is the same level, not another interrupt.
                let vm = self.vf_owner.get(vf as usize).map(|&(vm, _)| vm);
                let held = self
                    .el2
                    .as_deref()
                    .is_some_and(|a| vm.is_some_and(|vm| a.nic_line_held(vm)));
                // A queue pair's vector (only vector 0 with one queue)
                // carries the guest's vector for that queue.
                if vector < self.m.nic.config().queues && !held {
                    if let Some(&(vm, v)) = self.vf_owner.get(vf as usize) {
                        let v = v.wrapping_add(vector);
                        let now = self.q.now();
                        self.checker.raised(vm, v, now);
                        let home = self.hv.vcpus[self.hv.device_home(vm)].core;
                        self.trace_event(TraceKind::Raise { vector: v }, home, vm, now, now);
                        if let Some(e) = &mut self.event_exits {
                            e.event(vm, crate::hv::exits::EventClass::Device);
                        }
                    }
                }
                // On ARM the VF's MSI-X write lands in the ITS's translation
                // register (DeviceID the VF, EventID its vector); on RISC-V
                // in the IOMMU's MSI translation.
                if !self.arch_device_msi(vf, vector) {
                    self.q.schedule_in_async(
                        self.msi_latency,
                        Ev::Msi {
                            handle: msi.handle,
                            requester_id: msi.requester_id,
                        },
                    );
                }
            }
            IrqAction::CheckAt {
                vf,
                vector,
                at,
                gen,
            } => self.q.schedule(at, Ev::NicItr { vf, vector, gen }),
        }
    }

    /// A guest store to VF `vf`'s register `reg`. The VF's BAR is mapped
    /// into the guest: MMIO goes straight to the device in every scheme
    /// and on every architecture.
    fn vf_store(&mut self, vf: u16, reg: crate::guest::VfReg, now: Time) {
        use crate::guest::VfReg;
        match reg {
            VfReg::Eitr(vec, v) => {
                if let Ok(a) = self.m.nic.write_eitr(vf, vec, v, now) {
                    self.nic_action(a);
                }
            }
            VfReg::Tdt(queue) => {
                let fetch = self.tx_fetch;
                if let Ok(Some(t)) = self
                    .m
                    .nic
                    .tx_doorbell_on(vf, queue, now, fetch, &self.m.link)
                {
                    self.q.schedule(t, Ev::VfTxDone { vf, queue });
                }
            }
            VfReg::Eims(bits) => {
                if let Ok(acts) = self.m.nic.write_eims(vf, bits, now) {
                    for a in acts {
                        self.nic_action(a);
                    }
                }
            }
            VfReg::Eimc(bits) => {
                // Masked at the device: a wired interrupt line drops.
                if self.m.nic.write_eimc(vf, bits).is_ok() && self.el2.is_some() {
                    self.el2_nic_masked(vf);
                }
            }
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
    pub(super) fn poke(&mut self, core: usize) {
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
        let mut nic = false;
        while let Some(v) = cx.m.lapics[core].ack() {
            scheme.host_interrupt(&mut cx, core, v);
            cx.m.lapics[core].eoi();
            nic |= v == crate::hv::host::HOST_NIC_VECTOR;
        }
        if nic {
            // The host's own NIC (vCanal w/o Affinity, the bridged host) on a core in host
            // mode: its receive path runs there, after the one before
            // (the path keeps the core's busy time itself).
            self.host_nic_irq(core);
        }
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

    /// The speed a guest's (or native kernel's) work runs at on `core`:
    /// 1 on a core of its own; with Hyper-Threading (`machine.smt`),
    /// `cpu.smt_shared_speed` while its sibling is busy: a vCPU in guest
    /// mode or in an exit, a native kernel's CPU, or a host thread running
    /// there (docs/calibration-sources.md §25). Sampled when a segment
    /// starts.
    fn work_speed(&self, core: usize) -> f64 {
        let Some(sib) = self.m.cores[core].smt_sibling else {
            return 1.0;
        };
        let busy = self.m.cores[sib].mode != CoreMode::Idle
            || self
                .sched
                .as_ref()
                .is_some_and(|s| s.s.current(sib).is_some());
        if busy {
            self.smt_speed
        } else {
            1.0
        }
    }

    /// Starts a segment of the guest's work `len` on `core` (at the
    /// core's [`Self::work_speed`]) and schedules its end.
    fn start_work_segment(&mut self, core: usize, len: Time) {
        let now = self.q.now();
        let speed = self.work_speed(core);
        if self.m.cores[core].smt_sibling.is_some() && now >= self.measure_start {
            self.smt_work[0] += len;
            if speed < 1.0 {
                self.smt_work[1] += len;
            }
        }
        let (end, gen) = self.m.cores[core].start_at(now, len, speed);
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

    fn deliver(&mut self, core: usize, vector: u8) {
        let vcpu = self.kernel_of(core);
        let (k, c) = self.kcpu(vcpu);
        let now = self.q.now();
        self.checker.handler_entered(vcpu, vector, now);
        if let Some(e) = &mut self.event_exits {
            if vector == self.guests[k].config().timer_vector {
                e.event(k, crate::hv::exits::EventClass::TimerExpiry);
            }
        }
        self.trace_event(TraceKind::Deliver { vector }, core, vcpu, now, now);
        self.guests[k].take_interrupt(c, vector);
    }

    /// Runs the guest on `core` until it computes, spins, or exits: the
    /// architecture decides what pending interrupts do and how each of the
    /// kernel's operations executes (`arch`).
    pub(super) fn guest_run(&mut self, core: usize) {
        self.guest_steps(core, false);
    }

    /// [`Self::guest_run`] at the end of a segment's completion event,
    /// the last thing its dispatch does. A new segment that ends before
    /// every pending event would be the next event to pop and would run
    /// the guest again at once: it ends in place instead
    /// ([`EventQueue::pass_through`]), in the same order, with the same
    /// key, generation and charge as through the queue, and without the
    /// queue's work (docs/performance.md, session 32).
    fn guest_run_from_segment(&mut self, core: usize) {
        self.guest_steps(core, true);
    }

    /// Whether a segment that ends at `end` may end in place: it pops next
    /// in an unperturbed queue, inside the run, and the run is not over.
    #[inline]
    fn segment_passes_through(&self, end: Time) -> bool {
        end <= self.end && self.q.would_pop_next(end) && !self.run_ended()
    }

    fn guest_steps(&mut self, core: usize, from_segment: bool) {
        // The core runs the same vCPU (kernel CPU) for as long as this
        // loop goes on: every change of its mode is an exit, which returns.
        // So the per-VM lookups are made once.
        let vcpu = self.kernel_of(core);
        let (k, c) = self.kcpu(vcpu);
        let (net_dev, blk_dev) = (self.net_dev_of_vm[k], self.blk_dev_of_vm[k]);
        loop {
            debug_assert_eq!(self.kernel_of(core), vcpu);
            match self.arch_pending(core, k, c) {
                Some(Ok(exit)) => return self.arch_exit(core, exit, None),
                Some(Err(v)) => {
                    self.deliver(core, v);
                    continue;
                }
                None => {}
            }
            let now = self.q.now();
            // The guest runs again: the idle it waited in (if any) is over.
            let start = self.measure_start;
            if let Some(a) = self.el2.as_deref_mut() {
                a.guest_idle_end(vcpu, now, start);
            }
            let mut dev = Devices {
                nic: &mut self.m.nic,
                virtio_net: match net_dev {
                    Some(d) => self.m.virtio_net.get_mut(d),
                    None => None,
                },
                virtio_blk: match blk_dev {
                    Some(d) => self.m.virtio_blk.get_mut(d),
                    None => None,
                },
                shared: match &mut self.canal {
                    Some(c) => c.mem_mut(k),
                    None => None,
                },
                vsock: match self.vsock.as_deref_mut() {
                    Some(v) => v.vms.iter_mut().find(|m| m.vm == k).map(|m| &mut m.dev),
                    None => None,
                },
            };
            let action = self.guests[k].next(c, now, &mut dev);
            let pokes = self.guests[k].take_pokes(c);
            if !pokes.is_empty() {
                self.poke_siblings(k, pokes);
            }
            if self.pv.is_some() {
                self.pv_poll_observe();
            }
            match action {
                Action::Compute(d) => {
                    let len = d.min(MAX_SEGMENT);
                    let speed = self.work_speed(core);
                    if from_segment && speed >= 1.0 && self.segment_passes_through(now + len) {
                        // The segment's completion pops next: it ends here
                        // (as `dispatch` of `Ev::Segment` would end it).
                        let (end, gen) = self.m.cores[core].start(now, len);
                        self.q.pass_through(end);
                        if let Some(log) = &mut self.event_log {
                            log.push(
                                end,
                                Ev::Segment {
                                    core: core as u16,
                                    gen,
                                },
                            );
                        }
                        let done = self.m.cores[core].complete(gen);
                        debug_assert!(done);
                        if self.m.cores[core].smt_sibling.is_some() && now >= self.measure_start {
                            self.smt_work[0] += len;
                        }
                        self.segments_in_place += 1;
                        self.guests[k].charge(c, len);
                        continue;
                    }
                    self.start_work_segment(core, len);
                    return;
                }
                Action::Spin => {
                    // The idle=poll loop: guest time to the host, idle to
                    // the guest (the ARM CPU split, `cpu.*`).
                    if let Some(a) = self.el2.as_deref_mut() {
                        a.guest_idle_start(vcpu, now);
                    }
                    return;
                }
                Action::InterruptsEnabled => {}
                Action::Returned(v) => {
                    self.checker.handler_returned(vcpu, v);
                }
                Action::Op(op) => {
                    if let (Some(e), Some(class)) =
                        (&mut self.event_exits, event_exits::op_class(&op))
                    {
                        e.event(k, class);
                    }
                    match self.arch_op(core, vcpu, op) {
                        arch::OpResult::Continue => {}
                        // Idle: the core waits for an interrupt (a poke).
                        arch::OpResult::Wait => return,
                        arch::OpResult::Exit(exit, eoi) => return self.arch_exit(core, exit, eoi),
                    }
                }
            }
        }
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
    /// polls it (`pokes`): each that is in guest mode looks again now.
    fn poke_siblings(&mut self, vm: usize, pokes: crate::engine::VcpuMask) {
        for c in pokes.iter() {
            let Some(&vcpu) = self.hv.vms[vm].vcpus.get(c) else {
                continue;
            };
            if self.runs_kernel_cpu(vcpu) {
                self.q.schedule_in(0, Ev::GuestPoke { vcpu: vcpu as u16 });
            }
        }
    }

    /// `vcpu`'s core runs its kernel CPU now: in guest mode, or on bare
    /// metal (a native SMP kernel's CPUs are its cores).
    fn runs_kernel_cpu(&self, vcpu: usize) -> bool {
        let core = self.hv.vcpus[vcpu].core;
        match self.m.cores[core].mode {
            CoreMode::Guest { vcpu: v } => v == vcpu,
            // `kernel` names the kernel CPU (its vCPU index) that owns the
            // core, as `kernel_of` reads it.
            CoreMode::Native { kernel } => kernel == vcpu,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::Calibration;
    use crate::hw::x86::instr::Instr;
    use crate::hw::x86::lapic::msr;
    use build::blk_kick_fd;

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
