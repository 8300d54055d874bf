//! vCanal on the platform (vcanal.md §2): each vCanal VM's channel in its
//! guest memory, the vCanal service on its dedicated host core, the host's
//! network stack under it, the physical link to the client host, and the
//! completion interrupt through the active scheme.
//!
//! The path of one socket call:
//! 1. the guest program's libCanal writes an INR into the VM's channel
//!    pages and enqueues it (no exit; `workloads::vcanal`);
//! 2. the service core's polling thread gives the VMs turns in the channel
//!    scheduler's order (`hv::vcanal::service::Service::turn`): it copies
//!    and checks each INR, translates binds, and issues the VM's queued
//!    calls to idle network-pool threads, waking each ([`Ev::CanalStep`]);
//! 3. a pool thread, a host thread of its own under the host scheduler
//!    ([`Ev::CanalPoolStep`]), runs the call on the host's stack: the same TCP model
//!    the guests use ([`Tcp`]), or a UDP socket queue, whose frames cross
//!    the host NIC and the 10 GbE link to the client host ([`PeerHost`]);
//!    a call that must wait (send buffer full, nothing to receive) blocks
//!    the thread until the host stack's receive path wakes it;
//! 4. the thread writes the result into the INR (`Service::complete`); if
//!    the waiter asked for an interrupt (`want_irq`), the completion
//!    interrupt is raised through the scheme like a back end's irqfd.
//!
//! The polling thread and the pool threads are threads of the host
//! scheduler (`hv::sched`, CFS), pinned to the service core (§2.1, §3).
//! The poller never sleeps (`workload.vcanal.poller_yield` and
//! `poller_nice` say how it gives way); a pool thread sleeps until a call
//! is issued to it or the host stack wakes it. A thread's chain of work
//! items stops while it is off its core.
//!
//! The host NIC's interrupts are steered to the service core (§2.1, §3):
//! frames from the client host wait in its RX ring until its moderated
//! interrupt fires (`workload.vcanal.host_nic_itr`: ixgbe's adaptive
//! interval by default, as the client host's NIC). The interrupt is a host
//! vector (`hv::host::HOST_NIC_VECTOR`): ixgbe's handler and NAPI's
//! softirq run the frames up the host stack at once on the core that took
//! it, in polls of at most 64 frames and within `net_rx_action`'s budget
//! (300 frames, 2 ms); what is left waits for ksoftirqd.
//!
//! "vCanal w/o Affinity" (`workload.vcanal.affinity = false`, §3): the
//! service's threads may run on any core, and the NIC's interrupt goes to
//! `nic_irq_core`, where the receive path runs in the interrupted context
//! (a vCPU's external-interrupt exit, or a core in host mode).
//!
//! Simplifications (named, not hidden): an interrupt taken while one of
//! the service's threads runs delays that thread's next work item, not the
//! one in flight; ksoftirqd's pass runs after a wake-up as interrupt-context
//! time, not as a thread of its own;
//! netperf's connect() takes a connection already established. The HTTP
//! server's connections either are established before the run and queued
//! on its listener (ab -k), or, without keep-alive (ab's default), each of
//! ab's requests opens one: the host stack answers the SYN on the flow's
//! passive socket, queues the connection on the listener after the final
//! ACK, and the guest's accept(), recv(), send() and close() are INRs run
//! by the pool (close sends the FIN and takes the socket off every epoll
//! interest list, as Linux's close of the last reference does).

use super::event::Ev;
use super::host_link::HostStack;
use super::host_link::{HostLink, Towards};
use super::World;
use crate::calibration::Calibration;
use crate::engine::Time;
use crate::guest::app::{Datagram, Metrics};
use crate::guest::libcanal::inr::{Call, Errno, SockAddr, SockType};
use crate::guest::libcanal::{LibCanal, LibCanalParams};
use crate::guest::tcp::{Tcp, TcpConfig, TcpState};
use crate::guest::Kernel;
use crate::hv::vcanal::channel::ChannelLayout;
use crate::hv::vcanal::service::{Dispatch, HostSocket, Outcome, Service, ServiceParams, SlotKind};
use crate::hv::vcanal::VcanalCosts;
use crate::hw::guest_memory::GuestMemory;
use crate::hw::wire::{Frame, Transport};
use crate::hw::x86::nic::Link;
use crate::scenario::{NetperfDirection, NetperfTest, Scenario};
use crate::workloads::iperf::{IperfCosts, IperfPeer};
use crate::workloads::netperf::RECV_BYTES;
use crate::workloads::peer::PeerHost;
use crate::workloads::udp_rr::{UdpRrEcho, UdpRrPeerClient};
use crate::workloads::vcanal::{CanalAppCosts, CanalNetperf, CanalTest, PEER};
use crate::world::{t_ns, t_us};
use std::collections::VecDeque;

/// The helper driver's announcement hypercall (RAX), argument the
/// channel's GPA (vcanal.md §2.1: "one exit on KVM").
pub const ANNOUNCE_HYPERCALL: u32 = 0x7643_0001;

/// The helper driver's doorbell port ("w/o Polling"), an ioeventfd.
pub const DOORBELL_PORT: u16 = 0xC0A0;

/// The ioeventfd of VM `vm`'s doorbell (above virtio's and virtio-blk's).
pub fn doorbell_fd(vm: usize) -> u16 {
    0xA000 + vm as u16
}

/// The guest vector of the helper driver's completion interrupt.
pub const COMPLETION_VECTOR: u8 = 0x55;

/// Where the helper driver puts the channel (GPA), and its size: a
/// 256-slot ring (4 KiB) and 64 INRs (5 KiB), "a few guest pages" (§5).
pub const CHANNEL_BASE: u64 = 0x10000;

/// The channel the helper driver lays out at [`CHANNEL_BASE`].
const CHANNEL: ChannelLayout = ChannelLayout {
    base: CHANNEL_BASE,
    ring_capacity: 256,
    pool_len: 64,
};

/// The guest's RAM as the service checks buffers against it.
const GUEST_RAM: u64 = 1 << 30;

/// The flow of a VM's one connection or UDP flow with the client host.
const FLOW: u16 = 1;

/// When the client host's UDP_RR client sends its first request: after
/// the guest's server has had time to boot and bind (a datagram to an
/// unbound port is dropped, and netperf's RR does not retransmit).
const RR_CLIENT_START: Time = crate::engine::MS;

/// A host socket the service opened for a guest.
struct HostSock {
    vm: usize,
    kind: SlotKind,
    tcp: Option<Tcp>,
    udp_rx: VecDeque<Datagram>,
    /// The flow its frames carry on the link.
    flow: u16,
    /// The guest port its bind() named.
    guest_port: Option<u16>,
    /// listen() was called on it.
    listening: bool,
    /// An established connection in the accept queue of the VM's listener
    /// on this guest port (taken off it by accept()).
    queued_for: Option<u16>,
    /// A passive socket for one of ab's connection slots (no keep-alive):
    /// each connection it opens is queued for this guest port.
    accept_port: Option<u16>,
    /// An epoll instance's interest list: (the guest's socket-array index,
    /// the host socket), a bounded list.
    interest: Vec<(u32, HostSocket)>,
}

impl HostSock {
    fn new(vm: usize, kind: SlotKind, flow: u16) -> Self {
        HostSock {
            vm,
            kind,
            tcp: None,
            udp_rx: VecDeque::new(),
            flow,
            guest_port: None,
            listening: false,
            queued_for: None,
            accept_port: None,
            interest: Vec::new(),
        }
    }
}

/// Entries an epoll instance's interest list holds (the host's memory per
/// instance is bounded; Linux bounds it by `max_user_watches`).
const EPOLL_INTEREST: usize = 64;

/// `MSG_DONTWAIT`, as libCanal passes it in a recv's flags.
const MSG_DONTWAIT: u32 = crate::workloads::vcanal_http::MSG_DONTWAIT;

/// What a network-pool thread is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Thread {
    /// Asleep, waiting for a call.
    Idle,
    /// Has a call to run (just issued, or woken): runnable.
    Ready(Dispatch),
    /// The work item of its call runs. When it ends, the answer is written
    /// (`answer`), or the thread sleeps until the host stack wakes it
    /// (None); `again`: the host stack already did (a wake-up during the
    /// item, as `prepare_to_wait` then re-checking would see), so it tries
    /// again at once.
    Running {
        d: Dispatch,
        answer: Option<(Outcome, Option<SockAddr>)>,
        again: bool,
    },
    /// Asleep: its call waits for the host stack.
    Blocked(Dispatch),
}

/// A network-pool thread: a host thread of its own (vcanal.md §2.4).
#[derive(Clone, Copy, Debug)]
struct PoolThread {
    state: Thread,
    /// When it last went idle (a sequence number): with a condition
    /// variable the longest-idle thread is woken first.
    idle_since: u64,
    /// Current on a core.
    on_cpu: bool,
    /// A `CanalPoolStep` for it is queued.
    step_queued: bool,
}

/// One of the vCanal service's host threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CanalThread {
    /// The polling thread (channel scheduler and translator).
    Poller,
    /// Network-pool thread `i`.
    Pool(usize),
}

/// NAPI's weight of the host NIC's queue: frames one poll may take
/// (ixgbe's `netif_napi_add(..., 64)`).
pub(super) const NAPI_WEIGHT: usize = 64;

/// `net_rx_action`'s budget for one softirq: `netdev_budget` frames over
/// every poll (Linux 3.5: 300) ...
pub(super) const NETDEV_BUDGET: usize = 300;

/// ... and its time limit (Linux 3.5: `jiffies + 2`, 2 ms at HZ=1000;
/// `netdev_budget_usecs` = 2000 from 4.12). Past either, the softirq is
/// raised again and ksoftirqd takes it.
pub(super) const SOFTIRQ_TIME: Time = 2 * crate::engine::MS;

/// What one `net_rx_action` pass did ([`net_rx_action`]).
pub(super) struct NetRx {
    /// When it ended.
    pub(super) end: Time,
    /// NAPI polls it made.
    pub(super) polls: u64,
    /// Whether the softirq's budget ran out with frames left (for
    /// ksoftirqd).
    pub(super) left: bool,
}

/// `net_rx_action` from `t` in a softirq that began at `at`: NAPI polls,
/// each costing `napi_poll` and taking at most [`NAPI_WEIGHT`] frames
/// through `frame` (one frame at its time: what it cost, or `None` when
/// the ring is empty), until a poll takes fewer than its weight
/// (napi_complete) or the budget ([`NETDEV_BUDGET`] frames,
/// [`SOFTIRQ_TIME`]) is spent.
pub(super) fn net_rx_action(
    at: Time,
    mut t: Time,
    napi_poll: Time,
    mut frame: impl FnMut(Time) -> Option<Time>,
) -> NetRx {
    let mut budget = NETDEV_BUDGET;
    let mut polls = 0;
    let left = loop {
        t += napi_poll;
        polls += 1;
        let mut work = 0;
        while work < NAPI_WEIGHT {
            let Some(cost) = frame(t) else {
                break;
            };
            work += 1;
            t += cost;
        }
        budget = budget.saturating_sub(work);
        if work < NAPI_WEIGHT {
            // napi_complete: the ring is drained.
            break false;
        }
        if budget == 0 || t - at >= SOFTIRQ_TIME {
            break true;
        }
    };
    NetRx {
        end: t,
        polls,
        left,
    }
}

/// One vCanal VM.
struct CanalVm {
    mem: GuestMemory,
    /// The host end of its connection, taken by its connect().
    conn: Option<Tcp>,
    /// The host socket its data flows on.
    sock: Option<HostSocket>,
    /// Its client host's TCP connections (flows `FLOW..`), when it has
    /// several: the host socket of each.
    flow_socks: Vec<HostSocket>,
    /// The client host.
    peer: PeerHost,
    /// The peer's deadline as last scheduled.
    peer_timer: Option<Time>,
}

/// Counters of the service core.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    busy: Time,
    turns: u64,
    idle_turns: u64,
    calls: u64,
    blocked: u64,
    irqs: u64,
    rx_frames: u64,
    tx_frames: u64,
    nic_irqs: u64,
    /// NAPI polls, and softirqs that ran out of budget (left to ksoftirqd).
    napi_polls: u64,
    softirq_deferrals: u64,
}

/// The vCanal path of the machine.
pub(super) struct CanalPath {
    service: Service,
    costs: VcanalCosts,
    stack: HostStack,
    /// The service core.
    pub(super) core: usize,
    vms: Vec<Option<CanalVm>>,
    /// Stands for a VM without a channel in its (idle) turns.
    no_mem: GuestMemory,
    socks: Vec<HostSock>,
    /// The network pool's threads.
    pool: Vec<PoolThread>,
    /// Pool threads the host stack made ready, to wake.
    to_wake: Vec<usize>,
    /// The latency of handing a call to a sleeping pool thread (a futex
    /// wake and the switch to it).
    dispatch: Time,
    issued: Vec<Dispatch>,
    /// Frames the host NIC received, not yet processed.
    rx: VecDeque<(usize, Frame)>,
    /// The wire to the client host; each frame tagged with its VM.
    wire: HostLink<usize>,
    out: Vec<(Time, Frame)>,
    mss: u32,
    counters: Counters,
    /// The service sleeps while its channels are empty and is woken by
    /// doorbells and NIC interrupts ("w/o Polling"), instead of polling.
    kicked: bool,
    /// It sleeps now (no `CanalStep` queued).
    asleep: bool,
    /// Idle turns in a row (a whole round of them: every channel empty).
    idle_run: usize,
    /// Waking the sleeping service thread.
    wakeup: Time,
    /// Each VM's service totals at the end of the warm-up.
    stats_base: Vec<crate::hv::vcanal::service::VmStats>,
    /// The host NIC's receive interrupt moderation.
    nic: NicItr,
    /// The service's threads are pinned to `core` (§2.1), or ("w/o
    /// Affinity", §3) may run on every core.
    affinity: bool,
    /// The core the NIC's interrupt goes to, where its receive path runs:
    /// the service core, or ("w/o Affinity") `nic_irq_core`.
    irq_core: usize,
    /// The polling thread is on a core now.
    on_cpu: bool,
    /// A `CanalStep` is queued (the polling thread's chain of work items
    /// stops while it is off its core).
    step_queued: bool,
    /// The poller calls `sched_yield` after a round that found every
    /// channel empty.
    yields: bool,
    /// The poller's nice level.
    poller_nice: i32,
    /// Which idle pool thread takes a call.
    pool_wake: crate::scenario::VcanalPoolWake,
    /// The next `idle_since` sequence number.
    idle_seq: u64,
    /// A host thread switch (one of the service's threads switched in
    /// after another thread on its core).
    switch: Time,
    /// The poller's and the pool's (migrations, switches in, run-queue
    /// wait) at the end of the warm-up.
    sched_base: (u64, u64, Time),
    pool_base: (u64, u64, Time),
    /// When the receive path last taken on `irq_core` ends (the next
    /// interrupt's waits for it), and its time in the measured interval.
    irq_busy_until: Time,
    irq_busy: Time,
    /// Receive-path time taken on `irq_core` while one of the service's
    /// threads ran there: its next work item starts that much later.
    stolen: Time,
    /// ksoftirqd's wake-up (the softirq left over for it).
    softirqd_wakeup: Time,
    /// A ksoftirqd pass is queued.
    softirqd_queued: bool,
}

/// The service host NIC's receive interrupt throttle (82599/X520 EITR, as
/// the client host's NIC in `workloads::peer`): frames wait in the RX ring
/// until the interrupt fires, at most once per interval, counted from the
/// last one (a frame after a quiet spell interrupts at once). Adaptive:
/// after each poll the driver moves the interval by the byte rate
/// (`guest::itr`).
#[derive(Clone, Copy, Debug)]
pub(super) struct NicItr {
    /// Fixed interval (0 with no moderation).
    interval: Time,
    pub(super) adaptive: Option<(crate::guest::itr::ItrParams, Time)>,
    pub(super) state: Option<crate::guest::itr::DynamicItr>,
    /// When the armed interrupt fires.
    pub(super) armed: Option<Time>,
    /// It fired: the service core takes it between work items.
    pub(super) fired: bool,
    pub(super) last: Option<Time>,
}

impl NicItr {
    /// Its interrupt is taken at `at`: the driver's adaptive state counts
    /// the frames waiting (`lens`, their lengths).
    pub(super) fn take_irq(&mut self, at: Time, lens: impl Iterator<Item = u32>) {
        self.fired = false;
        self.last = Some(at);
        if let Some(st) = &mut self.state {
            for l in lens {
                st.count(l);
            }
        }
    }

    /// After napi_complete the driver updates the interval.
    pub(super) fn napi_complete(&mut self) {
        if let (Some(st), Some((p, _))) = (&mut self.state, self.adaptive) {
            st.update(&p);
        }
    }

    pub(super) fn new(
        mode: crate::scenario::PeerItr,
        p: &crate::workloads::peer::PeerCosts,
    ) -> Self {
        use crate::scenario::PeerItr;
        let adaptive = (mode == PeerItr::Adaptive)
            .then_some(p.rx_adaptive)
            .flatten();
        NicItr {
            interval: match mode {
                PeerItr::Off => 0,
                PeerItr::Fixed | PeerItr::Adaptive => p.rx_itr,
            },
            adaptive,
            state: adaptive.map(|(a, _)| crate::guest::itr::DynamicItr::new(&a)),
            armed: None,
            fired: false,
            last: None,
        }
    }

    pub(super) fn moderated(&self) -> bool {
        self.interval > 0 || self.state.is_some()
    }

    pub(super) fn current(&self) -> Time {
        match (self.state, self.adaptive) {
            (Some(st), Some((_, unit))) => Time::from(st.eitr >> 3) * unit,
            _ => self.interval,
        }
    }
}

fn canal_costs(cal: &Calibration) -> VcanalCosts {
    let v = &cal.vcanal;
    VcanalCosts {
        inr_build: t_ns(&v.inr_build_ns),
        enqueue: t_ns(&v.enqueue_ns),
        completion_poll: t_ns(&v.completion_poll_ns),
        spin_poll: t_ns(&v.spin_poll_ns),
        sched_yield: t_ns(&v.sched_yield_ns),
        radix_lookup: t_ns(&v.radix_lookup_ns),
        page_walk: t_ns(&v.page_walk_ns),
        dequeue: t_ns(&v.dequeue_ns),
        service_per_call: t_ns(&v.service_per_call_ns),
        port_translation: t_ns(&v.port_translation_ns),
        completion_write: t_ns(&v.completion_write_ns),
        idle_poll_round: t_ns(&v.idle_poll_round_ns),
    }
}

/// The service core a scenario's vCanal VMs name (all the same), if any.
pub(super) fn service_core(s: &Scenario) -> Result<Option<usize>, String> {
    let mut core = None;
    for (i, v) in s.vms.iter().enumerate() {
        let Some(spec) = &v.workload.vcanal else {
            continue;
        };
        let c = spec
            .service_core
            .unwrap_or(s.machine.cores.saturating_sub(1));
        let key = format!("{}.vcanal.service_core", v.workload_key(i));
        if c >= s.machine.cores {
            return Err(format!(
                "{key}: {c} must be a core of the machine (0..{})",
                s.machine.cores
            ));
        }
        if core.is_some_and(|k| k != c) {
            return Err(format!(
                "{key}: every vCanal VM must name the same service core"
            ));
        }
        core = Some(c);
    }
    Ok(core)
}

/// Builds the vCanal path: each vCanal VM's channel pages and its
/// program (spawned in its kernel on its application vCPU), the client host, the
/// service. None when no VM uses vCanal.
pub(super) fn build(
    s: &Scenario,
    cal: &Calibration,
    link: Link,
    guests: &mut [Kernel],
) -> Result<Option<CanalPath>, String> {
    let Some(core) = service_core(s)? else {
        return Ok(None);
    };
    let g = &cal.guest;
    let costs = canal_costs(cal);
    let syscall = t_ns(&g.syscall_ns);
    let peer_costs = crate::world::build::peer_costs(s, cal);
    // The host's TCP: Linux defaults with TSO/GSO on (its NIC's, as the
    // client host's `net.peer_gso`); both ends' receive buffers as the
    // other TCP workloads' (`guest.tcp_rcvbuf`).
    let tcp = crate::world::build::rcvbuf_config(
        TcpConfig {
            gso: s.net.peer_gso,
            ..TcpConfig::default()
        },
        s.guest.tcp_rcvbuf,
        s.guest.hz,
    );
    let views = s.vm_views();
    let mut vms = Vec::with_capacity(views.len());
    let mut http_socks = Vec::new();
    for (vm, v) in views.iter().enumerate() {
        if let (Some(spec), Some(n)) = (&v.workload.vcanal, &v.workload.nginx) {
            let kernel = guests.get_mut(vm).ok_or("VM count mismatch")?;
            let (mut canal_vm, socks) =
                build_http(vm, spec, n, cal, (costs, syscall, peer_costs), tcp, kernel)?;
            let start = http_socks.len() as HostSocket;
            canal_vm.flow_socks = (0..socks.len() as HostSocket).map(|k| start + k).collect();
            vms.push(Some(canal_vm));
            http_socks.extend(socks);
            continue;
        }
        {
            let (Some(spec), Some(n)) = (&v.workload.vcanal, &v.workload.netperf) else {
                vms.push(None);
                continue;
            };
            let (mem, lib) = channel(spec, CHANNEL.size())?;
            let test = match (n.test, n.direction) {
                (NetperfTest::UdpRr, NetperfDirection::Send) => CanalTest::UdpRrClient,
                (NetperfTest::UdpRr, NetperfDirection::Recv) => CanalTest::UdpRrServer,
                _ => CanalTest::TcpStreamSend,
            };
            let app = CanalNetperf::new(
                lib,
                test,
                n.msg_bytes,
                CanalAppCosts::new(costs, syscall, spec),
            );
            let kernel = guests.get_mut(vm).ok_or("VM count mismatch")?;
            kernel.spawn_on(v.app_vcpu, Box::new(app), 0, false);
            let (conn, peer) = match test {
                CanalTest::TcpStreamSend => {
                    let (host, far) = Tcp::pair(tcp, tcp).map_err(|e| e.to_string())?;
                    let iperf = IperfCosts {
                        syscall,
                        copy_per_kib: t_ns(&g.copy_per_kib_ns),
                    };
                    let app = IperfPeer::new(false, RECV_BYTES, iperf).instances(1, "netperf");
                    (
                        Some(host),
                        PeerHost::new(vec![far], FLOW, Box::new(app), peer_costs, 1),
                    )
                }
                CanalTest::UdpRrClient => (
                    None,
                    PeerHost::udp(FLOW, Box::new(UdpRrEcho::new(syscall)), peer_costs),
                ),
                CanalTest::UdpRrServer => (
                    None,
                    PeerHost::udp(
                        FLOW,
                        Box::new(
                            UdpRrPeerClient::new(FLOW, n.msg_bytes, syscall)
                                .starting_at(RR_CLIENT_START),
                        ),
                        peer_costs,
                    ),
                ),
            };
            vms.push(Some(CanalVm {
                mem,
                conn,
                sock: None,
                flow_socks: Vec::new(),
                peer,
                peer_timer: None,
            }));
        }
    }
    let pool = s
        .vms
        .iter()
        .filter_map(|v| v.workload.vcanal.as_ref())
        .map(|v| v.pool_threads as usize)
        .max()
        .unwrap_or(8);
    let nvm = vms.len();
    // "w/o Affinity": the first vCanal VM's setting for the machine's one
    // service (every vCanal VM shares it).
    let first = views
        .iter()
        .find_map(|v| v.workload.vcanal.as_ref().map(|c| (v, c)));
    let affinity = first.is_none_or(|(_, c)| c.affinity);
    let yields = first.is_some_and(|(_, c)| c.poller_yield);
    let poller_nice = first.map_or(0, |(_, c)| i32::from(c.poller_nice));
    let pool_wake = first.map_or(Default::default(), |(_, c)| c.pool_wake);
    let irq_core = match first {
        Some((v, c)) if !c.affinity => {
            let key = format!("{}.vcanal", v.workload_key);
            if c.kick {
                return Err(format!(
                    "{key}.affinity: false with kick = true (a sleeping service thread that floats) is not modelled"
                ));
            }
            let irq = c.nic_irq_core.unwrap_or(v.cores[v.app_vcpu]);
            if irq >= s.machine.cores {
                return Err(format!(
                    "{key}.nic_irq_core: {irq} must be a core of the machine (0..{})",
                    s.machine.cores
                ));
            }
            irq
        }
        _ => core,
    };
    Ok(Some(CanalPath {
        service: Service::new(nvm, ServiceParams::default()),
        costs,
        stack: HostStack::new(cal),
        core,
        vms,
        no_mem: GuestMemory::new(0, 0, 0).map_err(|e| e.to_string())?,
        socks: {
            // The HTTP servers' connections first (their indices are the
            // flow_socks the builder gave), then room for what the guests
            // open: a listener and an epoll instance per server thread.
            let mut v = Vec::with_capacity(4 * nvm.max(1) + 3 * http_socks.len());
            v.extend(http_socks);
            v
        },
        // Thread 0 waited first (the pool's threads start in order).
        pool: (0..pool)
            .map(|i| PoolThread {
                state: Thread::Idle,
                idle_since: i as u64,
                on_cpu: false,
                step_queued: false,
            })
            .collect(),
        pool_wake,
        idle_seq: pool as u64,
        to_wake: Vec::with_capacity(pool),
        dispatch: t_ns(&cal.vcanal.pool_dispatch_ns),
        issued: Vec::with_capacity(pool),
        rx: VecDeque::with_capacity(1024),
        wire: HostLink::new(link),
        out: Vec::with_capacity(1024),
        mss: tcp.mss,
        counters: Counters::default(),
        stats_base: vec![Default::default(); nvm],
        kicked: views
            .iter()
            .any(|v| v.workload.vcanal.as_ref().is_some_and(|c| c.kick)),
        nic: {
            // The service host's NIC is of the client host's class (the
            // paper's two X520s), with its own moderation setting.
            let mode = s
                .vms
                .iter()
                .filter_map(|v| v.workload.vcanal.as_ref())
                .map(|v| v.host_nic_itr)
                .next()
                .unwrap_or_default();
            let mut own = s.clone();
            own.net.peer_itr = mode;
            NicItr::new(mode, &crate::world::build::peer_costs(&own, cal))
        },
        asleep: false,
        idle_run: 0,
        wakeup: t_us(&cal.vhost.wakeup_us),
        affinity,
        irq_core,
        on_cpu: true,
        step_queued: true,
        yields,
        poller_nice,
        switch: t_ns(&g.context_switch_ns),
        sched_base: (0, 0, 0),
        pool_base: (0, 0, 0),
        irq_busy_until: 0,
        irq_busy: 0,
        stolen: 0,
        softirqd_wakeup: t_us(&cal.vhost.wakeup_us),
        softirqd_queued: false,
    }))
}

/// Where a VM's backed guest memory puts the server threads' epoll event
/// pages: the page after the channel.
fn events_gpa() -> u64 {
    (CHANNEL.base + CHANNEL.size()).div_ceil(4096) * 4096
}

/// A VM's guest memory backed from the channel's base for `backed` bytes,
/// with the channel laid out in it (announced at boot), and the libCanal
/// that uses it with the scenario's poll budget.
fn channel(
    spec: &crate::scenario::VcanalSpec,
    backed: u64,
) -> Result<(GuestMemory, LibCanal), String> {
    let mut mem =
        GuestMemory::new(GUEST_RAM, CHANNEL.base, backed as usize).map_err(|e| e.to_string())?;
    CHANNEL.init(&mut mem).map_err(|e| e.to_string())?;
    let lib = LibCanal::new(
        LibCanalParams {
            poll_budget: spec.effective_poll_budget(),
            ..LibCanalParams::default()
        },
        CHANNEL,
    );
    Ok((mem, lib))
}

/// An HTTP server over vCanal in VM `vm` (vcanal.md §4, ApacheBench): its
/// threads spawned in its kernel, the client host's ApacheBench with its
/// connections, and the host ends of those connections, numbered from 0
/// in the order of the flows (the caller places them first in the socket
/// table). The host's connections are established (the model's TCP has no
/// handshake, so ApacheBench keeps them open, `ab -k`) and wait in the
/// accept queue of the listener whose guest port their owner thread binds.
fn build_http(
    vm: usize,
    spec: &crate::scenario::VcanalSpec,
    n: &crate::scenario::NginxSpec,
    cal: &Calibration,
    (costs, syscall, peer_costs): (VcanalCosts, Time, crate::workloads::peer::PeerCosts),
    tcp: TcpConfig,
    kernel: &mut Kernel,
) -> Result<(CanalVm, Vec<HostSock>), String> {
    use crate::workloads::http::{ab_process_of, AbClient, ClientNames, HttpShape};
    use crate::workloads::vcanal_http::{CanalHttpShape, CanalHttpThread, HTTP_PORT, MAX_THREADS};
    let workers = n.workers as usize;
    if workers > MAX_THREADS {
        return Err(format!(
            "workload.nginx.workers: {workers} is more than vCanal's HTTP server runs ({MAX_THREADS})"
        ));
    }
    let events = events_gpa();
    let backed = events + (MAX_THREADS as u64) * 4096 - CHANNEL.base;
    let (mem, lib) = channel(spec, backed)?;
    let lib = std::rc::Rc::new(std::cell::RefCell::new(lib));
    let app_costs = CanalAppCosts::new(costs, syscall, spec);
    let shape = CanalHttpShape {
        request: n.request_bytes,
        response: n.header_bytes + n.page_bytes,
        work: t_ns(&cal.guest.nginx_request_ns),
        keep_alive: n.keep_alive,
        connection: t_ns(&cal.guest.http_connection_ns),
    };
    let cpus = kernel.cpus();
    for j in 0..workers {
        let app = CanalHttpThread::new(lib.clone(), j, shape, app_costs, events);
        kernel.spawn_on(j % cpus, Box::new(app), 0, false);
    }
    // nginx sets TCP_NODELAY on keep-alive connections (as the
    // kernel-socket server's configuration, world::build::es2).
    let tcp = TcpConfig {
        nagle: false,
        ..tcp
    };
    let ab = n.ab_processes as usize;
    let conns = ab * n.concurrency as usize;
    let mut far = Vec::with_capacity(conns);
    let mut socks = Vec::with_capacity(conns);
    for i in 0..conns {
        let port = HTTP_PORT + (ab_process_of(i, ab) % workers) as u16;
        let mut h = HostSock::new(vm, SlotKind::Stream, FLOW + i as u16);
        if n.keep_alive {
            let (host, client) = Tcp::pair(tcp, tcp).map_err(|e| e.to_string())?;
            far.push(client);
            h.tcp = Some(host);
            h.queued_for = Some(port);
        } else {
            // ab connects per request: the slot's host socket answers
            // each SYN; ab replaces its end at its first poll.
            far.push(Tcp::new(tcp).map_err(|e| e.to_string())?);
            h.tcp = Some(Tcp::listen(tcp).map_err(|e| e.to_string())?);
            h.accept_port = Some(port);
        }
        socks.push(h);
    }
    let http = HttpShape {
        request: n.request_bytes,
        response: n.header_bytes + n.page_bytes,
        keep_alive: n.keep_alive,
    };
    let names = ClientNames {
        prefix: "nginx",
        percentiles: "latency",
    };
    let client = AbClient::new(http, conns, t_ns(&cal.peer.ab_request_ns), names)
        .connection_costs(t_ns(&cal.peer.tcp_connect_ns), t_ns(&cal.peer.tcp_close_ns));
    let peer = PeerHost::new(far, FLOW, Box::new(client), peer_costs, ab);
    Ok((
        CanalVm {
            mem,
            conn: None,
            sock: None,
            // Placed first in the table by the caller: VM by VM, so this
            // VM's start at the count of those before it.
            flow_socks: Vec::new(),
            peer,
            peer_timer: None,
        },
        socks,
    ))
}

impl CanalPath {
    /// VM `vm`'s channel pages, if it has them.
    pub(super) fn mem_mut(&mut self, vm: usize) -> Option<&mut GuestMemory> {
        self.vms.get_mut(vm)?.as_mut().map(|v| &mut v.mem)
    }

    /// The service's threads as the host scheduler is given them: pinned
    /// to the service core, or ("w/o Affinity") free.
    pub(super) fn sched_threads(&self) -> crate::world::sched::CanalThreads {
        crate::world::sched::CanalThreads {
            core: self.core,
            allowed: if self.affinity {
                crate::engine::CpuMask::single(self.core)
            } else {
                crate::engine::CpuMask::EMPTY
            },
            pool: self.pool.len(),
            poller_nice: self.poller_nice,
        }
    }
}

impl World {
    /// The helper driver's announcement reached the host (a VMCALL exit):
    /// the service checks the channel against the VM's memory and starts
    /// polling it.
    pub(super) fn canal_hypercall(&mut self, vm: usize, nr: u32, arg: u64) {
        let Some(c) = &mut self.canal else {
            return;
        };
        if nr != ANNOUNCE_HYPERCALL || arg != CHANNEL.base {
            return;
        }
        if let Some(Some(v)) = c.vms.get(vm) {
            // A second announcement is refused (`AlreadyAnnounced`) and
            // changes nothing: the first channel stays in service.
            let _ = c.service.announce(vm, CHANNEL, &v.mem);
        }
    }

    /// Starts the service core's loop and the client hosts' timers.
    pub(super) fn canal_start(&mut self) {
        let Some(c) = &mut self.canal else {
            return;
        };
        for vm in 0..c.vms.len() {
            self.canal_peer_sync(vm);
        }
        self.q.schedule(0, Ev::CanalStep);
    }

    /// The scheduler thread of the service's thread `who`.
    fn canal_tid(&self, who: CanalThread) -> Option<crate::hv::sched::Tid> {
        self.sched.as_ref().and_then(|st| st.canal_tid(who))
    }

    /// The core the service's thread `who` is on (or last ran on).
    fn canal_core_of(&self, who: CanalThread) -> Option<usize> {
        let st = self.sched.as_ref()?;
        st.canal_tid(who).map(|t| st.s.thread(t).core)
    }

    /// Receive-path time taken on the NIC's core while one of the
    /// service's threads ran there, which a work item of `who` starting
    /// now waits for.
    fn canal_take_stolen(&mut self, who: CanalThread) -> Time {
        let core = self.canal_core_of(who);
        let Some(c) = self.canal.as_deref_mut() else {
            return 0;
        };
        if core == Some(c.irq_core) {
            std::mem::take(&mut c.stolen)
        } else {
            0
        }
    }

    /// The polling thread finished its last work item: unless it was
    /// switched out meanwhile, the next one, a polling turn (vcanal.md
    /// §2.4): the calls it takes go to idle pool threads, which it wakes.
    pub(super) fn canal_step(&mut self) {
        let now = self.q.now();
        let Some(c) = self.canal.as_deref_mut() else {
            return;
        };
        c.step_queued = false;
        if !c.on_cpu || c.asleep {
            // Preempted while the item ran: the next waits for its next
            // turn on a core.
            return;
        }
        let stolen = self.canal_take_stolen(CanalThread::Poller);
        let Some(c) = self.canal.as_deref_mut() else {
            return;
        };
        // The host stack's TCP timers (the sender's retransmission).
        for s in 0..c.socks.len() {
            if let Some(tcp) = &mut c.socks[s].tcp {
                if tcp.next_timer().is_some_and(|t| t <= now) {
                    tcp.on_timer(now);
                }
            }
        }
        let start = now + stolen;
        let mut turn_irq = None;
        let mut work = 0;
        for s in 0..c.socks.len() {
            work += c.flush(s, start + work);
        }
        let vm = c.service.next_vm();
        let idle = c.pool.iter().filter(|t| t.state == Thread::Idle).count();
        c.issued.clear();
        let issued = &mut c.issued;
        let mem = match c.vms.get_mut(vm) {
            Some(Some(v)) => &mut v.mem,
            _ => &mut c.no_mem,
        };
        let r = c.service.turn(mem, idle, |d| issued.push(d));
        c.counters.turns += 1;
        let busy = match r {
            Ok(r) => {
                work += c.costs.turn(&r);
                if r.irqs > 0 {
                    // Answers written in the turn (refused INRs).
                    turn_irq = Some(vm);
                }
                // The turn issued at most `idle` calls: each finds an
                // idle thread, woken once the turn is over.
                for i in 0..c.issued.len() {
                    let d = c.issued[i];
                    let t = c.idle_thread();
                    debug_assert!(t.is_some(), "more calls issued than idle threads");
                    if let Some(t) = t {
                        c.pool[t].state = Thread::Ready(d);
                        c.to_wake.push(t);
                    }
                }
                if r.idle() {
                    c.counters.idle_turns += 1;
                }
                !r.idle()
            }
            Err(_) => {
                work += c.costs.idle_poll_round;
                false
            }
        };
        if busy && now >= self.measure_start {
            c.counters.busy += work;
        }
        c.idle_run = if busy { 0 } else { c.idle_run + 1 };
        let work = stolen + work.max(1);
        let sleep = c.kicked && c.idle_run >= c.vms.len();
        let yields = c.yields && !busy;
        if !sleep {
            self.q.schedule(now + work, Ev::CanalStep);
            c.step_queued = true;
        }
        // The calls issued go to their threads once the turn is over.
        self.canal_wake_pool(work);
        self.canal_schedule();
        let poller = self.canal_tid(CanalThread::Poller);
        if sleep {
            // Every channel came up empty: the service thread sleeps
            // until a doorbell wakes it ("w/o Polling").
            if let Some(c) = self.canal.as_deref_mut() {
                c.asleep = true;
            }
            if let Some(t) = poller {
                self.sched_sleep_thread(t);
            }
        } else if yields {
            // An empty round: a pool thread waiting for the core gets it
            // (the item just queued is a yield's return, not a turn).
            if let Some(t) = poller {
                self.sched_yield_thread(t);
            }
        }
        if let Some(vm) = turn_irq {
            self.canal_completion_irq(vm);
        }
    }

    /// The helper driver's completion interrupt for VM `vm`.
    fn canal_completion_irq(&mut self, vm: usize) {
        if let Some(c) = &mut self.canal {
            c.counters.irqs += 1;
        }
        self.irqfd(vm, COMPLETION_VECTOR);
    }

    /// Wakes the pool threads given a call or made ready by the host
    /// stack, `lat` from now; each starts its call once the hand-off
    /// (`vcanal.pool_dispatch_ns`: a futex wake and the switch to it) is
    /// over.
    fn canal_wake_pool(&mut self, lat: Time) {
        loop {
            let Some(t) = self.canal.as_deref_mut().and_then(|c| c.to_wake.pop()) else {
                return;
            };
            match self.canal_tid(CanalThread::Pool(t)) {
                Some(tid) => self.sched_wake_thread(tid, lat),
                // No scheduler (a unit test's world): it runs at once.
                None => self.canal_switched_in(CanalThread::Pool(t), 0, lat),
            }
        }
    }

    /// Pool thread `t`'s work item ended, or it was switched in: the
    /// answer of the call that ran is written; a ready call runs (while
    /// the thread is on a core); otherwise the thread sleeps.
    pub(super) fn canal_pool_step(&mut self, t: usize) {
        let now = self.q.now();
        let Some(c) = self.canal.as_deref_mut() else {
            return;
        };
        let Some(p) = c.pool.get_mut(t) else {
            return;
        };
        p.step_queued = false;
        let mut irq = None;
        match p.state {
            Thread::Running {
                answer: Some(_), ..
            } => irq = c.finish(t),
            Thread::Running {
                d,
                answer: None,
                again,
            } => {
                p.state = if again {
                    Thread::Ready(d)
                } else {
                    Thread::Blocked(d)
                };
            }
            _ => {}
        }
        let p = c.pool[t];
        match p.state {
            Thread::Ready(_) if p.on_cpu => {
                let stolen = self.canal_take_stolen(CanalThread::Pool(t));
                let Some(c) = self.canal.as_deref_mut() else {
                    return;
                };
                let at = now + stolen;
                let cost = c.run_thread(t, at).max(1);
                if now >= self.measure_start {
                    c.counters.busy += cost;
                }
                c.pool[t].step_queued = true;
                self.q
                    .schedule(at + cost, Ev::CanalPoolStep { thread: t as u16 });
                self.canal_schedule();
                self.canal_wake_pool(0);
            }
            // Preempted: it runs its call at its next turn on a core.
            Thread::Ready(_) => {}
            _ => {
                if let Some(tid) = self.canal_tid(CanalThread::Pool(t)) {
                    self.sched_sleep_thread(tid);
                }
            }
        }
        if let Some(vm) = irq {
            self.canal_completion_irq(vm);
        }
    }

    /// Schedules the arrival of the frames queued on the link since the
    /// last call, in each direction (the link is a FIFO: each event takes
    /// its direction's head).
    fn canal_schedule(&mut self) {
        let Some(c) = self.canal.as_deref_mut() else {
            return;
        };
        let q = &mut self.q;
        c.wire.schedule_arrivals(|t, dir| {
            q.schedule(
                t,
                match dir {
                    Towards::Peer => Ev::CanalToPeer,
                    Towards::Host => Ev::CanalToHost,
                },
            )
        });
    }

    /// The head frame towards the client host arrives there.
    pub(super) fn canal_to_peer(&mut self) {
        let now = self.q.now();
        let Some(c) = self.canal.as_deref_mut() else {
            return;
        };
        let Some((vm, f)) = c.wire.arrive(Towards::Peer) else {
            return;
        };
        let Some(Some(v)) = c.vms.get_mut(vm) else {
            return;
        };
        c.out.clear();
        v.peer.receive(f, now, &mut c.out);
        c.peer_out(vm);
        self.canal_peer_sync(vm);
    }

    /// The head frame from the client host reaches the host NIC: it waits
    /// in the RX ring for the NIC's interrupt (at once when it is not
    /// moderated).
    pub(super) fn canal_to_host(&mut self) {
        let Some(c) = self.canal.as_deref_mut() else {
            return;
        };
        if let Some((vm, f)) = c.wire.arrive(Towards::Host) {
            c.rx.push_back((vm, f));
        }
        if !c.nic.moderated() {
            return self.canal_raise_nic_irq();
        }
        if c.nic.armed.is_none() && !c.nic.fired {
            let now = self.q.now();
            let at = c.nic.last.map_or(now, |t| t + c.nic.current()).max(now);
            c.nic.armed = Some(at);
            self.q.schedule(at, Ev::CanalNicIrq);
        }
    }

    /// The host NIC's moderated receive interrupt fires.
    pub(super) fn canal_nic_irq(&mut self) {
        let now = self.q.now();
        let Some(c) = self.canal.as_deref_mut() else {
            return;
        };
        if c.nic.armed != Some(now) {
            return;
        }
        c.nic.armed = None;
        c.nic.fired = true;
        self.canal_raise_nic_irq();
    }

    /// The NIC's MSI-X goes to its core as a host vector: the service core
    /// (§2.1), or without affinity `nic_irq_core`, where on a vCPU's core
    /// it costs that vCPU an external-interrupt exit.
    fn canal_raise_nic_irq(&mut self) {
        let Some(core) = self.canal.as_ref().map(|c| c.irq_core) else {
            return;
        };
        self.q.schedule_in(
            0,
            Ev::ApicArrive {
                core: core as u16,
                vector: crate::hv::host::HOST_NIC_VECTOR,
                mode: crate::hw::x86::lapic::DeliveryMode::Fixed,
            },
        );
    }

    /// Host code on `core` took the host NIC's interrupt (in an exit,
    /// between exit steps, or in host mode): ixgbe's handler and its NAPI
    /// softirq run the frames up the host stack there, at once, after the
    /// receive path taken before. A thread of the service running there
    /// is delayed by it. Returns the time charged.
    pub(super) fn canal_host_nic_irq(&mut self, core: usize) -> Time {
        self.canal_softirq(core, true)
    }

    /// The receive path on `core`: the hard interrupt's (`irq`), or
    /// ksoftirqd's pass over what the last softirq left.
    fn canal_softirq(&mut self, core: usize, irq: bool) -> Time {
        let now = self.q.now();
        let service_thread_on = self
            .sched
            .as_ref()
            .is_some_and(|st| st.s.current(core).is_some_and(|t| st.canal_of(t).is_some()));
        let Some(c) = self.canal.as_deref_mut() else {
            return 0;
        };
        let start = now.max(c.irq_busy_until);
        let (t, left) = c.receive(start, irq);
        c.irq_busy_until = start + t;
        if now >= self.measure_start {
            c.irq_busy += t;
            if c.affinity && core == c.core {
                c.counters.busy += t;
            }
        }
        if service_thread_on {
            c.stolen += t;
        }
        if left && !c.softirqd_queued {
            // net_rx_action ran out of budget: ksoftirqd is woken for the
            // rest.
            c.softirqd_queued = true;
            let at = start + t + c.softirqd_wakeup;
            self.q.schedule(at, Ev::CanalSoftirqd);
        }
        self.canal_wake_pool(start + t - now);
        self.canal_schedule();
        start + t - now
    }

    /// ksoftirqd runs the receive path the softirq left over.
    pub(super) fn canal_softirqd(&mut self) {
        let Some(c) = self.canal.as_deref_mut() else {
            return;
        };
        c.softirqd_queued = false;
        let core = c.irq_core;
        self.canal_softirq(core, false);
    }

    /// The service's thread `who` was switched in on `core`, `lat` after
    /// now (a wake-up), or after a thread switch.
    pub(super) fn canal_switched_in(&mut self, who: CanalThread, _core: usize, lat: Time) {
        let now = self.q.now();
        let measured = now >= self.measure_start;
        let Some(c) = self.canal.as_deref_mut() else {
            return;
        };
        // Switching back to the poller is a thread switch; to a pool
        // thread, the hand-off of its call.
        let switch = match who {
            CanalThread::Poller => c.switch,
            CanalThread::Pool(_) => c.dispatch,
        };
        if measured {
            c.counters.busy += switch;
        }
        let at = now + lat.max(switch);
        match who {
            CanalThread::Poller => {
                c.on_cpu = true;
                if !c.step_queued && !c.asleep {
                    c.step_queued = true;
                    self.q.schedule(at, Ev::CanalStep);
                }
            }
            CanalThread::Pool(t) => {
                let Some(p) = c.pool.get_mut(t) else {
                    return;
                };
                p.on_cpu = true;
                if !p.step_queued {
                    p.step_queued = true;
                    self.q.schedule(at, Ev::CanalPoolStep { thread: t as u16 });
                }
            }
        }
    }

    /// The service's thread `who` was switched out.
    pub(super) fn canal_switched_out(&mut self, who: CanalThread) {
        let Some(c) = self.canal.as_deref_mut() else {
            return;
        };
        match who {
            CanalThread::Poller => c.on_cpu = false,
            CanalThread::Pool(t) => {
                if let Some(p) = c.pool.get_mut(t) {
                    p.on_cpu = false;
                }
            }
        }
    }

    /// The scheduler started: the polling thread is on a core (`on`) or
    /// waits in a run queue.
    pub(super) fn canal_thread_started(&mut self, on: bool) {
        if let Some(c) = self.canal.as_deref_mut() {
            c.on_cpu = on;
        }
    }

    /// A doorbell of a VM's helper driver (its ioeventfd).
    pub(super) fn canal_eventfd(&mut self, fd: u16) {
        let Some(c) = self.canal.as_deref_mut() else {
            return;
        };
        if (0..c.vms.len()).any(|vm| doorbell_fd(vm) == fd) {
            self.canal_wake();
        }
    }

    /// Wakes the sleeping polling thread ("w/o Polling").
    fn canal_wake(&mut self) {
        let poller = self.canal_tid(CanalThread::Poller);
        let Some(c) = self.canal.as_deref_mut() else {
            return;
        };
        if std::mem::take(&mut c.asleep) {
            c.idle_run = 0;
            let lat = c.wakeup;
            match poller {
                Some(t) => self.sched_wake_thread(t, lat),
                None => self.canal_switched_in(CanalThread::Poller, 0, lat),
            }
        }
    }

    /// A client host's timer.
    pub(super) fn canal_peer_timer(&mut self, vm: usize) {
        let now = self.q.now();
        let Some(c) = self.canal.as_deref_mut() else {
            return;
        };
        let Some(Some(v)) = c.vms.get_mut(vm) else {
            return;
        };
        if v.peer_timer != Some(now) {
            return;
        }
        v.peer_timer = None;
        c.out.clear();
        v.peer.timer(now, &mut c.out);
        c.peer_out(vm);
        self.canal_peer_sync(vm);
    }

    /// Re-arms VM `vm`'s client host's timer if its deadline moved.
    fn canal_peer_sync(&mut self, vm: usize) {
        let now = self.q.now();
        let Some(c) = self.canal.as_deref_mut() else {
            return;
        };
        let Some(Some(v)) = c.vms.get_mut(vm) else {
            return;
        };
        let next = v.peer.next_timer().map(|t| t.max(now));
        if next.is_some() && next != v.peer_timer {
            v.peer_timer = next;
            if let Some(t) = next {
                self.q.schedule(t, Ev::CanalPeerTimer { vm: vm as u16 });
            }
        }
        // Frames the peer sent travel to the host NIC.
        self.canal_schedule();
    }

    /// vCanal's metrics over the measured interval.
    pub(super) fn canal_metrics(&self, out: &mut Metrics, dur: f64) {
        let Some(c) = &self.canal else {
            return;
        };
        for (vm, v) in c.vms.iter().enumerate() {
            let Some(v) = v else {
                continue;
            };
            let mut m = Metrics::new();
            v.peer.metrics(&mut m);
            let prefix = crate::report::vm_prefix(vm);
            for (k, x) in m {
                *out.entry(format!("{prefix}{k}")).or_insert(0.0) += x;
            }
            let (st, b) = (c.service.stats(vm), c.stats_base[vm]);
            out.insert(
                format!("{prefix}vcanal.inrs_taken"),
                (st.taken - b.taken) as f64,
            );
            out.insert(
                format!("{prefix}vcanal.completion_irqs"),
                (st.irqs - b.irqs) as f64,
            );
        }
        let k = &c.counters;
        let s = dur.max(1e-12);
        out.insert(
            "vcanal.service_core_busy_pct".into(),
            100.0 * k.busy as f64 / (s * crate::engine::SEC as f64),
        );
        out.insert("vcanal.turns_per_s".into(), k.turns as f64 / s);
        out.insert("vcanal.idle_turns_per_s".into(), k.idle_turns as f64 / s);
        out.insert("vcanal.host_calls_per_s".into(), k.calls as f64 / s);
        out.insert("vcanal.host_blocked_per_s".into(), k.blocked as f64 / s);
        out.insert("vcanal.irqs_per_s".into(), k.irqs as f64 / s);
        out.insert("vcanal.host_rx_frames_per_s".into(), k.rx_frames as f64 / s);
        out.insert("vcanal.host_tx_frames_per_s".into(), k.tx_frames as f64 / s);
        out.insert("vcanal.host_nic_irqs_per_s".into(), k.nic_irqs as f64 / s);
        out.insert("vcanal.napi_polls_per_s".into(), k.napi_polls as f64 / s);
        out.insert(
            "vcanal.softirq_deferrals_per_s".into(),
            k.softirq_deferrals as f64 / s,
        );
        if !c.affinity {
            out.insert(
                "vcanal.nic_irq_core_busy_pct".into(),
                100.0 * c.irq_busy as f64 / (s * crate::engine::SEC as f64),
            );
        }
        // The service's threads under the host scheduler: the poller's by
        // the `service_` names, the pool's summed over its threads.
        let Some(st) = self.sched.as_ref() else {
            return;
        };
        let now = self.q.now();
        let pct = |w: f64| 100.0 * w / (s * crate::engine::SEC as f64);
        if let Some(t) = st.canal_thread() {
            let th = st.s.thread(t);
            let (m0, s0, w0) = c.sched_base;
            let waited = st.s.waited(t, now).saturating_sub(w0) as f64;
            out.insert(
                "vcanal.service_migrations_per_s".into(),
                th.migrations.saturating_sub(m0) as f64 / s,
            );
            out.insert(
                "vcanal.service_switches_in_per_s".into(),
                th.switches_in.saturating_sub(s0) as f64 / s,
            );
            out.insert("vcanal.service_runqueue_wait_pct".into(), pct(waited));
        }
        let (m, sw, w) = canal_pool_totals(st, c.pool.len(), now);
        let (m0, s0, w0) = c.pool_base;
        out.insert(
            "vcanal.pool_migrations_per_s".into(),
            m.saturating_sub(m0) as f64 / s,
        );
        out.insert(
            "vcanal.pool_switches_in_per_s".into(),
            sw.saturating_sub(s0) as f64 / s,
        );
        out.insert(
            "vcanal.pool_runqueue_wait_pct".into(),
            pct(w.saturating_sub(w0) as f64),
        );
    }

    /// The end of the warm-up.
    pub(super) fn canal_reset(&mut self) {
        let now = self.q.now();
        let base = self.sched.as_ref().and_then(|st| {
            st.canal_thread().map(|t| {
                let th = st.s.thread(t);
                (th.migrations, th.switches_in, st.s.waited(t, now))
            })
        });
        let pool = self.canal.as_ref().map_or(0, |c| c.pool.len());
        let pool_base = self
            .sched
            .as_ref()
            .map(|st| canal_pool_totals(st, pool, now));
        if let Some(c) = &mut self.canal {
            if let Some(b) = base {
                c.sched_base = b;
            }
            if let Some(b) = pool_base {
                c.pool_base = b;
            }
            c.irq_busy = 0;
            c.counters = Counters::default();
            for vm in 0..c.vms.len() {
                c.stats_base[vm] = c.service.stats(vm);
            }
            for v in c.vms.iter_mut().flatten() {
                v.peer.reset_metrics();
            }
        }
    }
}

/// The pool threads' (migrations, switches in, run-queue wait), summed.
fn canal_pool_totals(
    st: &crate::world::sched::SchedState,
    pool: usize,
    now: Time,
) -> (u64, u64, Time) {
    (0..pool)
        .filter_map(|i| st.canal_tid(CanalThread::Pool(i)))
        .fold((0, 0, 0), |(m, s, w), t| {
            let th = st.s.thread(t);
            (
                m + th.migrations,
                s + th.switches_in,
                w + st.s.waited(t, now),
            )
        })
}

impl CanalPath {
    /// The peer's output in `out` goes on the link towards the host, in
    /// order (the link is a FIFO).
    fn peer_out(&mut self, vm: usize) {
        for i in 0..self.out.len() {
            let (leave, f) = self.out[i];
            self.wire.send(Towards::Host, vm, f, leave);
        }
        self.out.clear();
    }

    /// A frame of VM `vm`'s host socket leaves the host NIC at `leave`.
    fn emit(&mut self, vm: usize, f: Frame, leave: Time) {
        self.wire.send(Towards::Peer, vm, f, leave);
        self.counters.tx_frames += 1;
    }

    /// Host socket `s`'s TCP output from `at`: each segment's transmit
    /// path on the service core. Returns the time it took.
    fn flush(&mut self, s: usize, at: Time) -> Time {
        let vm = self.socks[s].vm;
        let mss = self.mss;
        let per = self.stack.tcp_tx_segment + self.stack.xmit;
        let mut t = at;
        loop {
            let Some(tcp) = &mut self.socks[s].tcp else {
                return 0;
            };
            let Some(seg) = tcp.poll_output(t) else {
                break;
            };
            t += per;
            let flow = self.socks[s].flow;
            self.emit(vm, Frame::tcp_gso(flow, seg, mss, t), t);
        }
        t - at
    }

    /// The host NIC's receive path from `at`: its interrupt handler (`irq`;
    /// not for ksoftirqd's pass) and NAPI's polls (`net_rx_action`), each
    /// taking at most [`NAPI_WEIGHT`] waiting frames up the host stack,
    /// until the ring is empty or the softirq's budget ([`NETDEV_BUDGET`]
    /// frames, [`SOFTIRQ_TIME`]) is spent; pool threads waiting on those
    /// sockets are made ready. Returns the time it took and whether frames
    /// were left for ksoftirqd.
    fn receive(&mut self, at: Time, irq: bool) -> (Time, bool) {
        let mut t = at;
        if irq {
            self.counters.nic_irqs += 1;
            self.nic.take_irq(at, self.rx.iter().map(|(_, f)| f.len()));
            t += self.stack.nic_irq;
        }
        let r = net_rx_action(at, t, self.stack.napi_poll, |t| {
            let (vm, f) = self.rx.pop_front()?;
            Some(self.receive_frame(vm, f, t))
        });
        self.counters.napi_polls += r.polls;
        if r.left {
            self.counters.softirq_deferrals += 1;
        } else {
            self.nic.napi_complete();
        }
        (r.end - at, r.left)
    }

    /// One frame up the host stack at `t`, to its socket: the time it took.
    fn receive_frame(&mut self, vm: usize, f: Frame, t: Time) -> Time {
        self.counters.rx_frames += 1;
        let at = t;
        let mut t = t;
        // A connection of several goes to its flow's socket; the one
        // flow of a stream or datagram socket to the VM's.
        let Some(s) = self.vms.get(vm).and_then(|v| v.as_ref()).and_then(|v| {
            match f.flow.checked_sub(FLOW).map(usize::from) {
                Some(k) if !v.flow_socks.is_empty() => v.flow_socks.get(k).copied(),
                _ => v.sock,
            }
        }) else {
            // No socket for it (yet): dropped, as Linux drops a
            // datagram to an unbound port.
            return self.stack.rx_per_packet;
        };
        let s = s as usize;
        match f.transport {
            Transport::Tcp(seg) => {
                t += self.stack.tcp_rx_segment;
                let sock = &mut self.socks[s];
                if let Some(tcp) = &mut sock.tcp {
                    let before = tcp.state();
                    tcp.on_segment(seg, t);
                    let after = tcp.state();
                    if after == TcpState::SynReceived && before != after {
                        t += self.stack.conn_request;
                    } else if before == TcpState::SynReceived && after != before {
                        // tcp_v4_syn_recv_sock: onto the listener's
                        // accept queue.
                        t += self.stack.syn_recv_sock;
                        sock.queued_for = sock.accept_port;
                    }
                }
                t += self.flush(s, t);
            }
            Transport::Udp { .. } | Transport::Icmp { .. } => {
                t += self.stack.rx_per_packet;
                if let Some(d) = Datagram::of(&f) {
                    let q = &mut self.socks[s].udp_rx;
                    if q.len() < crate::workloads::peer::PEER_UDP_RCVBUF_DATAGRAMS {
                        q.push_back(d);
                    }
                }
            }
        }
        self.wake(vm);
        t - at
    }

    /// Pool threads blocked on `vm`'s calls try again: each is made ready
    /// and queued to be woken (`to_wake`); one whose call is running will
    /// try again when its item ends.
    fn wake(&mut self, vm: usize) {
        for t in 0..self.pool.len() {
            match &mut self.pool[t].state {
                Thread::Blocked(d) if d.vm == vm => {
                    self.pool[t].state = Thread::Ready(*d);
                    self.to_wake.push(t);
                }
                Thread::Running {
                    d,
                    answer: None,
                    again,
                } if d.vm == vm => *again = true,
                _ => {}
            }
        }
    }

    /// Runs pool thread `t`'s call at `at`. Returns the time it took; the
    /// answer is written when that time is over ([`Self::finish`]).
    fn run_thread(&mut self, t: usize, at: Time) -> Time {
        let Thread::Ready(d) = self.pool[t].state else {
            return 0;
        };
        let st = self.stack;
        // The hand-off to this thread (a futex wake and a switch) is the
        // scheduler's; the thread's own work starts with the system call.
        let mut cost = st.syscall;
        let outcome = match d.call {
            Call::Socket { ty, .. } => {
                let id = self.socks.len() as HostSocket;
                let kind = match ty {
                    SockType::Stream => SlotKind::Stream,
                    SockType::Dgram => SlotKind::Dgram,
                };
                let mut h = HostSock::new(d.vm, kind, FLOW);
                h.udp_rx = VecDeque::with_capacity(64);
                self.socks.push(h);
                Some((Outcome::NewSocket(id), None))
            }
            Call::EpollCreate => {
                let id = self.socks.len() as HostSocket;
                let mut h = HostSock::new(d.vm, SlotKind::Epoll, FLOW);
                h.interest = Vec::with_capacity(EPOLL_INTEREST);
                self.socks.push(h);
                Some((Outcome::NewSocket(id), None))
            }
            Call::Listen { .. } => {
                let s = d.socket.unwrap_or(0) as usize;
                match self.socks.get_mut(s) {
                    Some(x) if x.kind == SlotKind::Stream && x.guest_port.is_some() => {
                        x.listening = true;
                        Some((Outcome::Value(0), None))
                    }
                    // listen() on an unbound socket would autobind; the
                    // guests here always bind first.
                    _ => Some((Outcome::Failed(Errno::Einval), None)),
                }
            }
            Call::Accept { .. } => {
                let l = d.socket.unwrap_or(0) as usize;
                match self.socks.get(l) {
                    Some(x) if x.listening => {
                        let port = x.guest_port;
                        let vm = d.vm;
                        let next = self.socks.iter().position(|c| {
                            c.vm == vm && c.queued_for.is_some() && c.queued_for == port
                        });
                        match next {
                            Some(c) => {
                                // Off the accept queue: a socket of its own.
                                self.socks[c].queued_for = None;
                                if let Some(tcp) = &mut self.socks[c].tcp {
                                    tcp.accept();
                                }
                                cost += st.accept;
                                let from = SockAddr {
                                    ip: PEER.ip,
                                    port: 40000u16.wrapping_add(self.socks[c].flow),
                                };
                                Some((Outcome::NewSocket(c as HostSocket), Some(from)))
                            }
                            // Nothing queued: the thread sleeps until a
                            // connection arrives.
                            None => None,
                        }
                    }
                    _ => Some((Outcome::Failed(Errno::Einval), None)),
                }
            }
            Call::EpollCtl { op, fd, .. } => {
                let e = d.socket.unwrap_or(0) as usize;
                let target = d.target.unwrap_or(0);
                let r = match self.socks.get_mut(e) {
                    Some(x) if x.kind == SlotKind::Epoll => {
                        let at = x.interest.iter().position(|&(i, _)| i == fd);
                        match (op, at) {
                            (1, Some(_)) => Err(Errno::Einval),
                            (1, None) if x.interest.len() >= EPOLL_INTEREST => Err(Errno::Enobufs),
                            (1, None) => {
                                x.interest.push((fd, target));
                                Ok(0)
                            }
                            (2, Some(k)) => {
                                x.interest.swap_remove(k);
                                Ok(0)
                            }
                            (3, Some(_)) => Ok(0),
                            (2 | 3, None) => Err(Errno::Enotconn),
                            _ => Err(Errno::Einval),
                        }
                    }
                    _ => Err(Errno::Einval),
                };
                Some((
                    match r {
                        Ok(v) => Outcome::Value(v),
                        Err(e) => Outcome::Failed(e),
                    },
                    None,
                ))
            }
            Call::EpollWait {
                events,
                maxevents,
                timeout_ms,
                ..
            } => {
                let e = d.socket.unwrap_or(0) as usize;
                let room = (events.len / crate::guest::libcanal::inr::EPOLL_EVENT_SIZE)
                    .min(u64::from(maxevents)) as usize;
                match self.epoll_ready(e, d.vm, events.addr, room) {
                    Ok(0) if timeout_ms != 0 => None,
                    Ok(n) => {
                        cost += n as Time * st.epoll_event;
                        Some((Outcome::Value(n as u64), None))
                    }
                    Err(err) => Some((Outcome::Failed(err), None)),
                }
            }
            Call::Connect { .. } | Call::Bind { .. } => {
                let s = d.socket.unwrap_or(0) as usize;
                if let (Call::Bind { addr, .. }, Some(x)) = (d.call, self.socks.get_mut(s)) {
                    x.guest_port = Some(addr.port);
                }
                if let Some(Some(v)) = self.vms.get_mut(d.vm) {
                    v.sock = Some(s as HostSocket);
                    if self
                        .socks
                        .get(s)
                        .is_some_and(|x| x.kind == SlotKind::Stream)
                    {
                        self.socks[s].tcp = v.conn.take();
                    }
                }
                Some((Outcome::Value(0), None))
            }
            Call::Send { buf, .. } => {
                let s = d.socket.unwrap_or(0) as usize;
                match self.socks.get_mut(s).and_then(|x| x.tcp.as_mut()) {
                    Some(tcp) => {
                        let n = tcp.send(buf.len.min(u64::from(u32::MAX)) as u32);
                        if n == 0 {
                            None
                        } else {
                            cost += st.copy(u64::from(n));
                            cost += self.flush(s, at + cost);
                            Some((Outcome::Value(u64::from(n)), None))
                        }
                    }
                    None => Some((
                        Outcome::Failed(crate::guest::libcanal::inr::Errno::Enotconn),
                        None,
                    )),
                }
            }
            Call::SendTo { buf, .. } => {
                // The first sendto() binds the socket (Linux's autobind).
                if let Some(Some(v)) = self.vms.get_mut(d.vm) {
                    v.sock = v.sock.or(d.socket);
                }
                let len = buf.len.min(1472) as u32;
                cost += st.copy(u64::from(len)) + st.udp_tx + st.xmit;
                let f = Frame::udp(FLOW, len, 0, at + cost);
                self.emit(d.vm, f, at + cost);
                Some((Outcome::Value(u64::from(len)), None))
            }
            Call::RecvFrom { buf, .. } | Call::Recv { buf, .. } => {
                let s = d.socket.unwrap_or(0) as usize;
                match self.socks.get_mut(s) {
                    Some(x) if x.kind == SlotKind::Dgram => match x.udp_rx.pop_front() {
                        Some(dg) => {
                            let n = u64::from(dg.len).min(buf.len);
                            cost += st.copy(n);
                            Some((Outcome::Value(n), Some(PEER)))
                        }
                        None => None,
                    },
                    Some(x) => match x.tcp.as_mut() {
                        Some(tcp) => {
                            let n = tcp.recv(buf.len.min(u64::from(u32::MAX)) as u32);
                            let flags = match d.call {
                                Call::Recv { flags, .. } | Call::RecvFrom { flags, .. } => flags,
                                _ => 0,
                            };
                            if n > 0 {
                                // The copy into the guest's buffer, and the
                                // window update the read may send.
                                cost += st.copy(u64::from(n));
                                cost += self.flush(s, at + cost);
                                Some((Outcome::Value(u64::from(n)), None))
                            } else if flags & MSG_DONTWAIT != 0 {
                                Some((Outcome::Failed(Errno::Eagain), None))
                            } else {
                                None
                            }
                        }
                        None => Some((Outcome::Failed(Errno::Enotconn), None)),
                    },
                    None => Some((Outcome::Failed(Errno::Ebadf), None)),
                }
            }
            Call::Close { .. } => {
                let s = d.socket.unwrap_or(0) as usize;
                let vm = d.vm;
                if let Some(tcp) = self.socks.get_mut(s).and_then(|x| x.tcp.as_mut()) {
                    // tcp_close: the FIN after what is queued.
                    tcp.close();
                    cost += st.close;
                    cost += self.flush(s, at + cost);
                    // The last reference is gone: off every interest list.
                    for e in &mut self.socks {
                        if e.vm == vm && e.kind == SlotKind::Epoll {
                            e.interest.retain(|&(_, h)| h as usize != s);
                        }
                    }
                }
                Some((Outcome::Value(0), None))
            }
            _ => Some((Outcome::Value(0), None)),
        };
        self.counters.calls += 1;
        let Some((outcome, peer)) = outcome else {
            // The call waits for the host stack (a full send buffer,
            // nothing received): once the item ends the thread sleeps
            // until its receive path wakes it.
            self.pool[t].state = Thread::Running {
                d,
                answer: None,
                again: false,
            };
            self.counters.blocked += 1;
            return cost;
        };
        cost += self.costs.completion_write;
        // The thread stays busy until its work item ends; the answer is
        // written then (`finish`), not before the call has run.
        self.pool[t].state = Thread::Running {
            d,
            answer: Some((outcome, peer)),
            again: false,
        };
        cost
    }

    /// Epoll instance `e`'s ready sockets (level-triggered EPOLLIN: a
    /// listener with a connection queued, a socket with data): up to
    /// `room` `epoll_event` records written into VM `vm`'s memory at
    /// `gpa` (events, then the guest's index as the data). How many.
    fn epoll_ready(&mut self, e: usize, vm: usize, gpa: u64, room: usize) -> Result<usize, Errno> {
        use crate::guest::libcanal::inr::EPOLL_EVENT_SIZE;
        use crate::workloads::vcanal_http::EPOLLIN;
        let Some(x) = self.socks.get(e).filter(|x| x.kind == SlotKind::Epoll) else {
            return Err(Errno::Einval);
        };
        let Some(Some(v)) = self.vms.get_mut(vm) else {
            return Err(Errno::Efault);
        };
        let mut n = 0;
        for &(index, host) in &x.interest {
            if n >= room {
                break;
            }
            let Some(t) = self.socks.get(host as usize) else {
                continue;
            };
            let ready = if t.listening {
                let port = t.guest_port;
                self.socks
                    .iter()
                    .any(|c| c.vm == vm && c.queued_for.is_some() && c.queued_for == port)
            } else {
                t.tcp
                    .as_ref()
                    .is_some_and(|c| c.readable() > 0 && !c.is_closed_by_app())
                    || !t.udp_rx.is_empty()
            };
            if !ready {
                continue;
            }
            let at = gpa + n as u64 * EPOLL_EVENT_SIZE;
            // The guest's buffer lies in RAM (checked when the INR was
            // taken) but may be anywhere there: a write the service cannot
            // make is EFAULT, never a host fault.
            v.mem.write_u32(at, EPOLLIN).map_err(|_| Errno::Efault)?;
            v.mem
                .write_u64(at + 4, u64::from(index))
                .map_err(|_| Errno::Efault)?;
            n += 1;
        }
        Ok(n)
    }

    /// The idle pool thread the poller hands the next call to (§2.4): the
    /// longest-waiting one when the pool waits on a condition variable
    /// (futex_wake takes waiters first in, first out), else the first idle
    /// one in the pool's order.
    fn idle_thread(&self) -> Option<usize> {
        let idle = self
            .pool
            .iter()
            .enumerate()
            .filter(|(_, t)| t.state == Thread::Idle);
        match self.pool_wake {
            crate::scenario::VcanalPoolWake::Condvar => {
                idle.min_by_key(|(_, t)| t.idle_since).map(|(i, _)| i)
            }
            crate::scenario::VcanalPoolWake::FirstIdle => idle.map(|(i, _)| i).next(),
        }
    }

    /// The work item that ran pool thread `t`'s call ended: it writes the
    /// answer into the INR and goes idle. Returns the VM to interrupt, if
    /// its waiter asked for it.
    fn finish(&mut self, t: usize) -> Option<usize> {
        let Thread::Running {
            d,
            answer: Some((outcome, peer)),
            ..
        } = self.pool[t].state
        else {
            return None;
        };
        self.pool[t].state = Thread::Idle;
        self.pool[t].idle_since = self.idle_seq;
        self.idle_seq += 1;
        let irq = match self.vms.get_mut(d.vm) {
            Some(Some(v)) => self
                .service
                .complete(&d, outcome, peer, &mut v.mem)
                .unwrap_or(false),
            _ => false,
        };
        irq.then_some(d.vm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::Calibration;

    const BASE: &str = "scheme = \"kvm\"\nseed = 3\nduration_s = 0.02\nwarmup_s = 0.005\n\
                        [machine]\ncores = 4\n[guest]\ntick = \"periodic\"\n";

    fn world(extra: &str, sets: &[&str]) -> World {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let s = Scenario::parse(&format!("{BASE}{extra}"), &sets).expect("scenario parses");
        World::build(&s, &Calibration::default_host()).expect("world builds")
    }

    fn run(extra: &str, sets: &[&str]) -> (World, crate::report::RunReport) {
        let mut w = world(extra, sets);
        w.run(|_| {});
        let r = w.report();
        (w, r)
    }

    fn m(r: &crate::report::RunReport, k: &str) -> f64 {
        *r.metrics.get(k).unwrap_or_else(|| panic!("no metric {k}"))
    }

    const STREAM: &str = "[workload.netperf]\ntest = \"tcp-stream\"\nmsg_bytes = 16384\n\
                          [workload.vcanal]\n";
    const RR: &str = "[workload.netperf]\ntest = \"udp-rr\"\nmsg_bytes = 1\n[workload.vcanal]\n";

    /// The helper driver's boot-time hypercall announced the channel, the
    /// stream's bytes reached the client host through the host stack, and
    /// the guest's own network stack moved nothing (vcanal.md §1: the
    /// guest TCP/IP processing is bypassed).
    #[test]
    fn a_stream_goes_through_the_service_and_the_host_stack() {
        let (w, r) = run(STREAM, &[]);
        let c = w.canal.as_ref().expect("a vCanal path");
        assert_eq!(c.core, 3, "the default service core is the last one");
        assert!(c.service.ring_head(0).is_some(), "channel announced");
        assert!(m(&r, "netperf.throughput_gbps") > 1.0, "{:?}", r.metrics);
        assert_eq!(m(&r, "guest.tx_frames"), 0.0);
        assert!(m(&r, "vcanal.calls") > 100.0);
        assert!(m(&r, "vcanal.host_rx_frames_per_s") > 0.0, "ACKs came back");
        assert_eq!(r.violations(), 0);
        // The buffer is reused: after the first call every page hits.
        assert_eq!(m(&r, "vcanal.page_walks"), 0.0);
    }

    /// Without the hybrid address space every call walks its pages.
    #[test]
    fn without_the_hybrid_address_space_every_call_walks() {
        let (_, r) = run(STREAM, &["workload.vcanal.hybrid_address_space=false"]);
        let calls = m(&r, "vcanal.calls");
        // 16 KiB from a page-aligned buffer: four pages a call.
        assert!(m(&r, "vcanal.page_walks") >= 4.0 * (calls - 1.0), "{calls}");
    }

    /// Switching: waits longer than the poll budget end in interrupt mode,
    /// and each completion interrupt is a virtual interrupt through the
    /// scheme (under stock KVM an external-interrupt exit and an EOI
    /// exit), checked like any other.
    #[test]
    fn rr_completions_come_as_virtual_interrupts_through_the_scheme() {
        let (_, r) = run(RR, &[]);
        assert!(m(&r, "udp_rr.transactions") > 100.0);
        let sleeps = m(&r, "vcanal.sleeps");
        assert!(sleeps > 100.0);
        assert!(m(&r, "vcanal.completion_irqs") >= sleeps - 1.0);
        let v = &r.vms[0];
        // Most arrive while the vCPU runs (an external-interrupt exit); the
        // others find it in an exit already.
        let ext = v.exits_per_s_by_reason["EXTERNAL_INTERRUPT"];
        assert!(ext * 0.02 >= sleeps * 0.5, "{ext}/s for {sleeps} sleeps");
        let irqs = m(&r, "guest.irqs_per_s") - m(&r, "guest.timer_irqs_per_s");
        assert!(irqs * 0.02 >= sleeps * 0.9, "{irqs}/s for {sleeps} sleeps");
        assert_eq!(r.violations(), 0);
    }

    /// Polling only: no completion interrupt, no sleep; the round trip is
    /// shorter than with interrupts.
    #[test]
    fn polling_only_takes_no_interrupt_and_is_faster() {
        let (_, poll) = run(RR, &["workload.vcanal.notification=polling"]);
        let (_, irq) = run(RR, &["workload.vcanal.notification=interrupt"]);
        assert_eq!(m(&poll, "vcanal.sleeps"), 0.0);
        assert_eq!(m(&poll, "vcanal.completion_irqs"), 0.0);
        assert!(m(&irq, "vcanal.sleeps") > 100.0);
        assert!(m(&poll, "udp_rr.latency_us") < m(&irq, "udp_rr.latency_us"));
    }

    /// The VM as the UDP_RR server: the client host's requests reach the
    /// guest's recvfrom() through the host stack.
    #[test]
    fn the_vm_serves_udp_rr() {
        let (_, r) = run(RR, &["workload.netperf.direction=recv"]);
        assert!(m(&r, "udp_rr.transactions") > 100.0);
        assert!(m(&r, "udp_rr.served") >= m(&r, "udp_rr.transactions") - 1.0);
    }

    /// The service core may not run a vCPU; the error names the key.
    #[test]
    fn a_service_core_with_a_vcpu_is_refused() {
        let sets = ["workload.vcanal.service_core=1".to_string()];
        let s = Scenario::parse(&format!("{BASE}{STREAM}"), &sets).expect("parses");
        let e = World::build(&s, &Calibration::default_host())
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("workload.vcanal.service_core"), "{e}");
    }

    /// Several VMs share the service core (vcanal.md §4.5): each has its
    /// own channel, host socket and client host, and each makes progress;
    /// the service core may be core 0, the host's.
    #[test]
    fn vms_share_one_service_core() {
        let text = "scheme = \"kvm\"\nseed = 3\nduration_s = 0.02\nwarmup_s = 0.005\n\
                    [machine]\ncores = 4\n[[vm]]\nvcpus = 1\ncore = 1\ncopies = 3\n\
                    copies_cores = [1, 2, 3]\n[vm.workload.netperf]\ntest = \"udp-rr\"\n\
                    msg_bytes = 1\n[vm.workload.vcanal]\nservice_core = 0\n";
        let s = Scenario::parse(text, &[]).expect("scenario parses");
        let mut w = World::build(&s, &Calibration::default_host()).expect("world builds");
        w.run(|_| {});
        let c = w.canal.as_ref().expect("a vCanal path");
        assert_eq!(c.core, 0);
        let r = w.report();
        for vm in 0..3 {
            assert!(c.service.ring_head(vm).is_some(), "VM {vm} announced");
            let p = crate::report::vm_prefix(vm);
            assert!(m(&r, &format!("{p}udp_rr.transactions")) > 100.0, "VM {vm}");
        }
        assert_eq!(r.violations(), 0);
    }

    /// "w/o Polling" (vcanal.md §3, §7): every request rings the helper
    /// driver's doorbell, an I/O-instruction exit through the ioeventfd,
    /// and the service sleeps between requests instead of polling; with
    /// polling no request exits.
    #[test]
    fn without_polling_each_request_exits_and_the_service_sleeps() {
        let kick = [
            "workload.vcanal.notification=interrupt",
            "workload.vcanal.kick=true",
        ];
        let (_, r) = run(RR, &kick);
        let calls = m(&r, "vcanal.calls");
        let io = r.vms[0].exits_per_s_by_reason["IO_INSTRUCTION"] * 0.02;
        assert!(calls > 100.0);
        assert!(io >= calls - 1.0, "{io} I/O exits for {calls} calls");
        let (_, polled) = run(RR, &[]);
        // It sleeps after one empty round instead of polling on.
        let idle = m(&r, "vcanal.idle_turns_per_s");
        assert!(idle < 0.2 * m(&polled, "vcanal.idle_turns_per_s"), "{idle}");
        let io = polled.vms[0]
            .exits_per_s_by_reason
            .get("IO_INSTRUCTION")
            .copied()
            .unwrap_or(0.0);
        // Only the background device-emulation exits remain.
        assert!(io * 0.02 < 10.0, "{io}/s");
        assert_eq!(r.violations(), 0);
    }

    /// vCanal runs netperf's TCP_STREAM sender or UDP_RR; another
    /// netperf test with it is refused, naming the table.
    #[test]
    fn an_unsupported_netperf_test_is_refused() {
        let text = format!("{BASE}[workload.netperf]\ntest = \"udp-stream\"\n[workload.vcanal]\n");
        let e = Scenario::parse(&text, &[])
            .expect_err("refused")
            .to_string();
        assert!(e.contains("`workload.vcanal`"), "{e}");
    }

    /// ab with keep-alive: its connections wait on the listeners from
    /// the start.
    const HTTP: &str = "[workload.nginx]\nworkers = 2\nab_processes = 2\nconcurrency = 2\n\
                        keep_alive = true\n[workload.vcanal]\n";

    /// Runs `call` on the host as a pool thread would, naming host socket
    /// `socket` (of `kind`) and `target`: the outcome, or None when the
    /// call waits for the host stack.
    fn host_call(
        c: &mut CanalPath,
        call: crate::guest::libcanal::inr::InrCall,
        socket: Option<HostSocket>,
        target: Option<HostSocket>,
    ) -> Option<Outcome> {
        let kind = socket.and_then(|s| c.socks.get(s as usize)).map(|x| x.kind);
        let d = Dispatch {
            vm: 0,
            inr: 0,
            call,
            socket,
            kind,
            target,
            new_slot: None,
            host_port: None,
        };
        c.pool[0].state = Thread::Ready(d);
        c.run_thread(0, 0);
        let state = std::mem::replace(&mut c.pool[0].state, Thread::Idle);
        match state {
            Thread::Running {
                answer: Some((o, _)),
                ..
            } => Some(o),
            _ => None,
        }
    }

    fn new_sock(c: &mut CanalPath, call: crate::guest::libcanal::inr::InrCall) -> HostSocket {
        match host_call(c, call, None, None) {
            Some(Outcome::NewSocket(s)) => s,
            o => panic!("{o:?}"),
        }
    }

    /// The host side of the HTTP server's calls against a hostile or
    /// mistaken guest: each bad call is answered with an error, none
    /// reaches past the VM's memory or grows host memory without bound.
    #[test]
    fn hostile_accept_and_epoll_calls_are_answered_with_errors() {
        use crate::guest::libcanal::inr::Buf;
        let w = world(HTTP, &[]);
        let mut c = w.canal.expect("a vCanal path");
        // Sockets 0..4: ab's connections waiting to be accepted.
        assert_eq!(c.socks.len(), 4);
        let stream = Call::Socket {
            ty: SockType::Stream,
            protocol: 0,
        };
        let l = new_sock(&mut c, stream);
        let accept = Call::Accept { fd: 0 };
        // accept() on a socket that does not listen: EINVAL.
        let o = host_call(&mut c, accept, Some(l), None);
        assert_eq!(o, Some(Outcome::Failed(Errno::Einval)));
        // listen() before bind(): EINVAL.
        let listen = Call::Listen { fd: 0, backlog: 1 };
        let o = host_call(&mut c, listen, Some(l), None);
        assert_eq!(o, Some(Outcome::Failed(Errno::Einval)));
        // Bound to a port no connection targets, listening: accept waits.
        let bind = Call::Bind {
            fd: 0,
            addr: SockAddr { ip: 0, port: 8080 },
        };
        assert_eq!(
            host_call(&mut c, bind, Some(l), None),
            Some(Outcome::Value(0))
        );
        assert_eq!(
            host_call(&mut c, listen, Some(l), None),
            Some(Outcome::Value(0))
        );
        assert_eq!(host_call(&mut c, accept, Some(l), None), None);
        // epoll_ctl on a socket that is no epoll instance: EINVAL.
        let ctl = |fd, op| Call::EpollCtl {
            epfd: 0,
            op,
            fd,
            events: 1,
        };
        let o = host_call(&mut c, ctl(5, 1), Some(l), Some(l));
        assert_eq!(o, Some(Outcome::Failed(Errno::Einval)));
        let e = new_sock(&mut c, Call::EpollCreate);
        assert_eq!(
            host_call(&mut c, ctl(5, 1), Some(e), Some(0)),
            Some(Outcome::Value(0))
        );
        // The same index twice (Linux: EEXIST), an unknown op, a delete
        // of an index not in the list.
        let o = host_call(&mut c, ctl(5, 1), Some(e), Some(0));
        assert_eq!(o, Some(Outcome::Failed(Errno::Einval)));
        let o = host_call(&mut c, ctl(6, 9), Some(e), Some(0));
        assert_eq!(o, Some(Outcome::Failed(Errno::Einval)));
        let o = host_call(&mut c, ctl(6, 2), Some(e), Some(0));
        assert_eq!(o, Some(Outcome::Failed(Errno::Enotconn)));
        // A flood of adds: the interest list stops at its bound.
        for i in 0..2 * EPOLL_INTEREST as u32 {
            let _ = host_call(&mut c, ctl(100 + i, 1), Some(e), Some(1));
        }
        assert_eq!(c.socks[e as usize].interest.len(), EPOLL_INTEREST);
        assert_eq!(
            c.socks[e as usize].interest.capacity(),
            EPOLL_INTEREST,
            "no growth"
        );
        let o = host_call(&mut c, ctl(999, 1), Some(e), Some(1));
        assert_eq!(o, Some(Outcome::Failed(Errno::Enobufs)));
        // Data on connection 0, so its entry is ready.
        if let Some(t) = &mut c.socks[0].tcp {
            t.on_segment(
                crate::hw::wire::TcpSegment {
                    seq: 0,
                    len: 100,
                    ack: 0,
                    wnd: 65535,
                    psh: true,
                    syn: false,
                    fin: false,
                },
                0,
            );
        }
        assert!(c.socks[0].tcp.as_ref().unwrap().readable() > 0);
        let wait = |addr, len| Call::EpollWait {
            epfd: 0,
            events: Buf { addr, len },
            maxevents: 8,
            timeout_ms: -1,
        };
        // Its event buffer in guest RAM but not where the service can
        // write (the checks passed: inside RAM): EFAULT, no host fault.
        let o = host_call(&mut c, wait(0x2000_0000, 96), Some(e), None);
        assert_eq!(o, Some(Outcome::Failed(Errno::Efault)));
        // A buffer too small for one event: nothing written, and the
        // thread waits as for no event (Linux: EINVAL for maxevents 0;
        // here the length bounds the count).
        let ev = events_gpa();
        assert_eq!(host_call(&mut c, wait(ev, 11), Some(e), None), None);
        // A good one: index 5 ready, written into the VM's page.
        let o = host_call(&mut c, wait(ev, 96), Some(e), None);
        assert_eq!(o, Some(Outcome::Value(1)));
        let v = c.vms[0].as_ref().unwrap();
        assert_eq!(v.mem.read_u64(ev + 4), Ok(5));
        // recv with MSG_DONTWAIT on connection 1, which has nothing:
        // EAGAIN; without it the thread waits.
        let recv = |flags| Call::Recv {
            fd: 0,
            buf: Buf {
                addr: 0x100_0000,
                len: 1024,
            },
            flags,
        };
        let o = host_call(&mut c, recv(MSG_DONTWAIT), Some(1), None);
        assert_eq!(o, Some(Outcome::Failed(Errno::Eagain)));
        assert_eq!(host_call(&mut c, recv(0), Some(1), None), None);
        // epoll_wait naming a socket index past the host's table.
        let o = host_call(&mut c, wait(ev, 96), Some(9999), None);
        assert_eq!(o, Some(Outcome::Failed(Errno::Einval)));
    }

    /// The network pool's threads are host threads of their own (vcanal.md
    /// §2.4): each call is handed to a pool thread that the scheduler
    /// switches in, preempting the polling thread on the service core,
    /// which is switched back in when the thread sleeps. With affinity
    /// every one of the service's threads may run on the service core
    /// only; without, on every core. A pool run inline in the poller would
    /// switch nothing.
    #[test]
    fn the_pool_threads_are_scheduled_threads_of_their_own() {
        let (w, r) = run(STREAM, &[]);
        let calls = m(&r, "vcanal.host_calls_per_s");
        assert!(calls > 10_000.0, "{calls}");
        let pool = m(&r, "vcanal.pool_switches_in_per_s");
        assert!(pool >= 0.8 * calls, "{pool} switches in for {calls} calls");
        let poller = m(&r, "vcanal.service_switches_in_per_s");
        assert!(poller >= 0.5 * calls, "the poller is switched out and back");
        assert!(m(&r, "vcanal.service_runqueue_wait_pct") > 1.0);
        assert_eq!(m(&r, "vcanal.pool_migrations_per_s"), 0.0, "pinned");
        let c = w.canal.as_ref().expect("a vCanal path");
        let st = w
            .sched
            .as_ref()
            .expect("the service's threads are scheduled");
        let threads = c.pool.len();
        assert_eq!(threads, 8, "the default pool");
        for who in (0..threads)
            .map(CanalThread::Pool)
            .chain([CanalThread::Poller])
        {
            let t = st.canal_tid(who).expect("a scheduler thread");
            assert_eq!(
                st.s.thread(t).allowed,
                crate::engine::CpuMask::single(c.core),
                "{who:?}"
            );
        }
        let (w, _) = run(STREAM, &["workload.vcanal.affinity=false"]);
        let st = w.sched.as_ref().expect("scheduled");
        let t = st.canal_tid(CanalThread::Pool(7)).expect("pool thread 7");
        assert_eq!(st.s.thread(t).allowed.count(), 4, "free to run anywhere");
    }

    /// The poller hands a call to the pool thread idle longest when the
    /// pool waits on a condition variable (futex_wake is FIFO among equal
    /// waiters), and to the first idle one in order with `first-idle`.
    #[test]
    fn the_longest_idle_pool_thread_takes_the_next_call() {
        let mut w = world(STREAM, &[]);
        let c = w.canal.as_deref_mut().expect("a vCanal path");
        assert_eq!(c.pool_wake, crate::scenario::VcanalPoolWake::Condvar);
        for (t, since) in c.pool.iter_mut().zip([5u64, 3, 9, 1, 7, 2, 8, 6]) {
            t.idle_since = since;
        }
        assert_eq!(c.idle_thread(), Some(3));
        // Thread 3 ran its call and waits again, last in the queue.
        c.pool[3].idle_since = 10;
        assert_eq!(c.idle_thread(), Some(5), "the next longest waiter");
        let mut w = world(STREAM, &["workload.vcanal.pool_wake=first-idle"]);
        let c = w.canal.as_deref_mut().expect("a vCanal path");
        for (t, since) in c.pool.iter_mut().zip([5u64, 3, 9, 1, 7, 2, 8, 6]) {
            t.idle_since = since;
        }
        assert_eq!(c.idle_thread(), Some(0));
    }

    /// On a CPU-bound stream (no offloads) one call at a time goes round
    /// the pool under `condvar`: each thread wakes having slept through
    /// the others' calls, CFS places it behind the never-sleeping poller
    /// and it preempts it, so the pool hardly waits for the core. Under
    /// `first-idle` thread 0 runs every call, is far ahead of the poller in
    /// virtual time, and the two share the core by weight.
    #[test]
    fn a_pool_woken_in_fifo_order_preempts_the_poller() {
        let stream = ["guest.gso=false", "guest.gro=false", "net.peer_gso=false"];
        let exec = |w: &World| -> Vec<u64> {
            let st = w.sched.as_ref().expect("scheduled");
            (0..8)
                .map(|i| {
                    let t = st.canal_tid(CanalThread::Pool(i)).expect("a pool thread");
                    st.s.thread(t).sum_exec
                })
                .collect()
        };
        let (fifo_w, fifo) = run(STREAM, &stream);
        let mut sets = stream.to_vec();
        sets.push("workload.vcanal.pool_wake=first-idle");
        let (first_w, first) = run(STREAM, &sets);
        assert_eq!(fifo.violations(), 0);
        assert_eq!(first.violations(), 0);
        let f = exec(&fifo_w);
        let total: u64 = f.iter().sum();
        assert!(
            f.iter().all(|&e| e * 20 > total),
            "every thread takes calls: {f:?}"
        );
        let g = exec(&first_w);
        let total: u64 = g.iter().sum();
        assert!(g[0] * 10 > 9 * total, "thread 0 takes them: {g:?}");
        let wait = |r: &crate::report::RunReport| m(r, "vcanal.pool_runqueue_wait_pct");
        assert!(
            wait(&fifo) < 0.5 * wait(&first),
            "{} vs {}",
            wait(&fifo),
            wait(&first)
        );
        let gbps = |r: &crate::report::RunReport| m(r, "netperf.throughput_gbps");
        assert!(
            gbps(&fifo) > gbps(&first),
            "{} vs {}",
            gbps(&fifo),
            gbps(&first)
        );
    }

    /// A call that waits for the host stack blocks its pool thread only:
    /// with one thread blocked for the whole run on a socket nobody sends
    /// to, the other threads serve the VM's UDP_RR as before.
    #[test]
    fn a_blocked_call_does_not_block_another_pool_thread() {
        use crate::guest::libcanal::inr::Buf;
        let mut w = world(RR, &[]);
        let c = w.canal.as_deref_mut().expect("a vCanal path");
        let silent = c.socks.len();
        c.socks.push(HostSock::new(0, SlotKind::Dgram, FLOW + 99));
        let d = Dispatch {
            vm: 0,
            inr: 0,
            call: Call::RecvFrom {
                fd: 0,
                buf: Buf {
                    addr: 0x100_0000,
                    len: 64,
                },
                flags: 0,
            },
            socket: Some(silent as HostSocket),
            kind: Some(SlotKind::Dgram),
            target: None,
            new_slot: None,
            host_port: None,
        };
        c.pool[0].state = Thread::Blocked(d);
        w.run(|_| {});
        let r = w.report();
        let c = w.canal.as_ref().expect("a vCanal path");
        // Woken by every frame for the VM, it tried again and slept again.
        assert!(
            matches!(
                c.pool[0].state,
                Thread::Blocked(x) | Thread::Ready(x) | Thread::Running { d: x, answer: None, .. }
                    if x == d
            ),
            "{:?}",
            c.pool[0].state
        );
        assert!(m(&r, "udp_rr.transactions") > 100.0);
        assert!(m(&r, "vcanal.host_blocked_per_s") > 0.0);
        assert_eq!(r.violations(), 0);
    }

    /// The host NIC's receive path keeps NAPI's weight (64 frames a poll)
    /// and `net_rx_action`'s budget (300 frames): past it the rest is left
    /// for ksoftirqd, whose pass takes it without a hard interrupt.
    #[test]
    fn the_receive_path_keeps_napis_weight_and_the_softirq_budget() {
        let w = world(RR, &[]);
        let mut c = w.canal.expect("a vCanal path");
        for _ in 0..400 {
            c.rx.push_back((0, Frame::udp(FLOW, 1, 0, 0)));
        }
        let (t, left) = c.receive(0, true);
        assert!(left, "budget spent");
        // Five polls of 64: the fifth takes the budget below zero.
        assert_eq!(c.counters.napi_polls, 5);
        assert_eq!(c.rx.len(), 400 - 5 * NAPI_WEIGHT);
        assert_eq!(c.counters.softirq_deferrals, 1);
        assert_eq!(c.counters.nic_irqs, 1);
        let per_frame = c.stack.rx_per_packet;
        assert_eq!(
            t,
            c.stack.nic_irq + 5 * c.stack.napi_poll + 320 * per_frame,
            "the handler, five polls, 320 frames"
        );
        let (_, left) = c.receive(t, false);
        assert!(!left, "ksoftirqd drains the rest");
        assert!(c.rx.is_empty());
        assert_eq!(c.counters.napi_polls, 7, "64 + 16");
        assert_eq!(c.counters.nic_irqs, 1, "no hard interrupt for it");
    }

    /// Same scenario and seed, same run.
    #[test]
    fn runs_are_deterministic() {
        let (_, a) = run(RR, &[]);
        let (_, b) = run(RR, &[]);
        assert_eq!(a.metrics, b.metrics);
    }
}
