//! virtio-vsock with vhost-vsock on the platform (docs/vcanal.md,
//! "virtio-vsock"): today's nearest peer of vCanal's socket channel.
//!
//! The path of the VM's stream, netperf TCP_STREAM to the client host:
//! 1. the guest program's `send()` runs the guest's virtio-vsock driver
//!    (`guest::vsock::VsockDriver`): RW packets within the host socket's
//!    credit go into the TX ring, and when `virtqueue_kick_prepare` asks
//!    for it the driver writes the TX queue's notify port: an I/O
//!    instruction, which the hypervisor's ioeventfd turns into the back
//!    end's kick (the same exit virtio-net's kick takes under each scheme);
//! 2. the vhost-vsock worker (`hv::vhost_vsock::VhostVsock`) runs its TX
//!    handler on its host core: each packet goes to the host's socket
//!    layer, where the relay's listener accepted the connection; its
//!    signal (`vhost_signal`, EVENT_IDX) goes through [`World::irqfd`], so
//!    the active scheme injects or posts the guest's interrupt;
//! 3. the relay (socat `VSOCK-LISTEN` → `TCP`, a named assumption of the
//!    scenarios) reads the vsock socket and writes its TCP socket: the
//!    host's TCP, the same model the guests' and vCanal's host stack use,
//!    whose frames cross the host NIC and the 10 GbE link to the client
//!    host's netserver; its reads return credit to the guest
//!    (CREDIT_UPDATE through the worker's RX handler and the guest's RX
//!    ring and interrupt);
//! 4. the guest's interrupt handler wakes the sender sleeping on its
//!    socket; the driver's RX work takes the update, refills the RX ring
//!    (and notifies its queue) and reclaims sent buffers.
//!
//! Simplifications (named): the worker, the relay and the host NIC's
//! softirq share the worker's core (`host.io_cores[0]`) as one FIFO of
//! work items, as vCanal's service core runs its poller, pool and softirq
//! (a switch between the worker and the relay costs a thread switch);
//! the host NIC takes an interrupt per batch of frames that wait (no
//! moderation, as `workload.vcanal.host_nic_itr = "off"`); a handler
//! turn takes what the ring holds when it starts and its time is charged
//! after (packets added during it wait for the next turn, and the ring's
//! notifications are off only at its start); the connection to the client
//! host is established before the run.

use super::event::Ev;
use super::host_link::{HostLink, Towards};
use super::World;
use crate::calibration::Calibration;
use crate::engine::Time;
use crate::guest::app::Metrics;
use crate::guest::tcp::{Tcp, TcpConfig};
use crate::guest::vsock::{VsockDriver, VsockDriverCosts};
use crate::guest::Kernel;
use crate::hv::vhost_vsock::{Relay, RelayCosts, VhostVsock, VsockCosts, VsockCounters, VsockVq};
use crate::hw::virtio_vsock::{VirtioVsockDev, CID_HOST};
use crate::hw::wire::{Frame, Transport};
use crate::hw::x86::nic::Link;
use crate::scenario::{NetDevice, Scenario, WorkloadSpec};
use crate::workloads::iperf::{IperfCosts, IperfPeer};
use crate::workloads::netperf::RECV_BYTES;
use crate::workloads::peer::PeerHost;
use crate::workloads::vsock::{VsockNetperf, VsockPorts};
use crate::world::{t_ns, t_us};
use std::collections::VecDeque;

/// The device's notify ports: RX queue, then TX (virtio-pci's
/// QUEUE_NOTIFY, one port per queue as the model's virtio-net has them).
pub const VSOCK_NOTIFY_PORT: u16 = 0xC0B0;

/// The guest vector of the device's interrupt (its RX and TX queues share
/// one MSI-X vector, as virtio-vsock's `vp_find_vqs` falls back to when it
/// asks for no per-queue vectors).
pub const VSOCK_VECTOR: u8 = 0x56;

/// The ioeventfds of VM `vm`'s RX and TX queue notifies (above vCanal's
/// doorbells).
pub fn kick_fds(vm: usize) -> [u16; 2] {
    [0xB000 + 2 * vm as u16, 0xB000 + 2 * vm as u16 + 1]
}

/// `VHOST_VSOCK_QUEUE_SIZE` in QEMU's vhost-vsock: 128 entries per queue.
const QUEUE_SIZE: u16 = 128;

/// The guest's context id (`guest-cid=3`, the first a guest may have).
const GUEST_CID: u64 = 3;

/// The guest socket's ephemeral port and the relay's listening port
/// (`socat VSOCK-LISTEN:5000,fork TCP:client:port`).
const GUEST_PORT: u32 = 1024;
/// The port the relay listens on.
pub const RELAY_PORT: u32 = 5000;

/// The flow of the relay's TCP connection to the client host.
const FLOW: u16 = 1;

/// Whether VM workload `w` runs over virtio-vsock.
pub(super) fn runs_over_vsock(s: &Scenario, w: &WorkloadSpec) -> bool {
    s.net.device == NetDevice::VirtioVsock && w.netperf.is_some()
}

/// The guest driver's interrupt as its kernel sees it: a handler that
/// queues the RX/TX work and wakes the task sleeping on the socket.
pub(super) fn wait_driver(
    s: &Scenario,
    w: &WorkloadSpec,
    cal: &Calibration,
) -> Option<crate::guest::WaitQueueDriver> {
    runs_over_vsock(s, w).then(|| crate::guest::WaitQueueDriver {
        vector: VSOCK_VECTOR,
        handler: t_ns(&cal.vsock.irq_handler_ns),
        announce: None,
        doorbell: None,
    })
}

/// Costs of the host's stack under the relay (the host runs the same
/// Linux as the guests on the same class of NIC, as vCanal's host stack).
#[derive(Clone, Copy, Debug)]
struct Stack {
    copy_per_kib: Time,
    tcp_tx_segment: Time,
    tcp_rx_segment: Time,
    xmit: Time,
    napi_poll: Time,
    nic_irq: Time,
    switch: Time,
    wakeup: Time,
}

/// Which thread's work item ran last on the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Thread {
    None,
    Worker,
    Relay,
}

/// Counters of the worker's core.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    worker_busy: Time,
    relay_busy: Time,
    softirq_busy: Time,
    tx_turns: u64,
    rx_turns: u64,
    irqs: u64,
    relay_steps: u64,
    relay_bytes: u64,
    credit_updates: u64,
    nic_irqs: u64,
    rx_frames: u64,
    tx_frames: u64,
    wakeups: u64,
}

/// The vsock path of the machine (one VM).
pub(super) struct VsockPath {
    /// The VM.
    pub(super) vm: usize,
    /// Its device (the rings the guest driver and the worker share).
    pub(super) dev: VirtioVsockDev,
    back: VhostVsock,
    relay: Relay,
    vc: VsockCosts,
    rc: RelayCosts,
    stack: Stack,
    /// The worker's (and relay's) core.
    pub(super) core: usize,
    /// The TX / RX handler is queued (kicked, or requeued at a weight).
    tx_work: bool,
    rx_work: bool,
    /// The core sleeps (no `VsockStep` queued).
    asleep: bool,
    last: Thread,
    /// The last turn asked to signal the guest: raised when it ends.
    signal: bool,
    tcp: Tcp,
    peer: PeerHost,
    peer_timer: Option<Time>,
    rx: VecDeque<Frame>,
    /// The wire to the client host.
    wire: HostLink<()>,
    out: Vec<(Time, Frame)>,
    mss: u32,
    counters: Counters,
    /// The back end's counters at the end of the warm-up.
    back_base: VsockCounters,
    /// The most bytes the host socket held unread (at most its
    /// `buf_alloc` when the guest keeps to its credit).
    queued_max: u32,
}

/// Builds the vsock path: the device, the guest driver and program
/// (spawned on the VM's application vCPU), the back end, the relay and its
/// connection to the client host. None when no VM runs over vsock.
pub(super) fn build(
    s: &Scenario,
    cal: &Calibration,
    link: Link,
    guests: &mut [Kernel],
) -> Result<Option<VsockPath>, String> {
    let views = s.vm_views();
    let mut found = views
        .iter()
        .enumerate()
        .filter(|(_, v)| runs_over_vsock(s, v.workload));
    let Some((vm, v)) = found.next() else {
        return Ok(None);
    };
    if found.next().is_some() {
        return Err(
            "net.device: virtio-vsock is modelled for one VM (one worker core and relay)".into(),
        );
    }
    let n = v.workload.netperf.as_ref().ok_or("netperf missing")?;
    let core = *s.host.io_cores.first().ok_or("host.io_cores: empty")?;
    let g = &cal.guest;
    let syscall = t_ns(&g.syscall_ns);
    let mut dev = VirtioVsockDev::new(QUEUE_SIZE, s.net.event_idx, GUEST_CID)
        .map_err(|e| format!("net.device: {e}"))?;
    let (drv, req) = VsockDriver::probe(
        &mut dev,
        (GUEST_CID, GUEST_PORT),
        (CID_HOST, RELAY_PORT),
        VsockDriverCosts {
            tx_pkt: t_ns(&cal.vsock.guest_tx_pkt_ns),
            rx_pkt: t_ns(&cal.vsock.guest_rx_pkt_ns),
            copy_per_kib: t_ns(&g.copy_per_kib_ns),
        },
    );
    let ports = VsockPorts {
        rx: VSOCK_NOTIFY_PORT,
        tx: VSOCK_NOTIFY_PORT + 1,
    };
    let app = VsockNetperf::new(drv, req, ports, n.msg_bytes, syscall);
    let kernel = guests.get_mut(vm).ok_or("VM count mismatch")?;
    kernel.spawn_on(v.app_vcpu, Box::new(app), 0, false);
    // The relay's TCP to the client host: Linux defaults with TSO/GSO as
    // the host's NIC has them, both receive buffers as the other TCP
    // workloads' (as vCanal's host stack).
    let tcp = crate::world::build::rcvbuf_config(
        TcpConfig {
            gso: s.net.peer_gso,
            ..TcpConfig::default()
        },
        s.guest.tcp_rcvbuf,
        s.guest.hz,
    );
    let (host, far) = Tcp::pair(tcp, tcp).map_err(|e| e.to_string())?;
    let iperf = IperfCosts {
        syscall,
        copy_per_kib: t_ns(&g.copy_per_kib_ns),
    };
    let netserver = IperfPeer::new(false, RECV_BYTES, iperf).instances(1, "netperf");
    let peer_costs = crate::world::build::peer_costs(s, cal);
    let peer = PeerHost::new(vec![far], FLOW, Box::new(netserver), peer_costs, 1);
    let fds = kick_fds(vm);
    Ok(Some(VsockPath {
        vm,
        dev,
        back: VhostVsock::new(vm, fds, RELAY_PORT),
        relay: Relay::new(s.net.vsock_relay_buf_bytes),
        vc: VsockCosts {
            tx_per_pkt: t_ns(&cal.vsock.tx_pkt_ns),
            rx_per_pkt: t_ns(&cal.vsock.rx_pkt_ns),
            copy_per_kib: t_ns(&cal.vsock.copy_per_kib_ns),
            signal: t_ns(&cal.vsock.signal_ns),
        },
        rc: RelayCosts {
            syscall: t_ns(&cal.vsock.relay_syscall_ns),
            copy_per_kib: t_ns(&cal.vsock.relay_copy_per_kib_ns),
            select: t_ns(&cal.vsock.relay_select_ns),
        },
        stack: Stack {
            copy_per_kib: t_ns(&g.copy_per_kib_ns),
            tcp_tx_segment: t_ns(&g.tcp_tx_segment_ns),
            tcp_rx_segment: t_ns(&g.tcp_rx_segment_ns),
            xmit: t_ns(&g.vf_xmit_ns),
            napi_poll: t_ns(&g.napi_poll_base_ns),
            nic_irq: t_us(&cal.host.irq_handler_us),
            switch: t_ns(&g.context_switch_ns),
            wakeup: t_us(&cal.vhost.wakeup_us),
        },
        core,
        tx_work: false,
        rx_work: false,
        asleep: true,
        last: Thread::None,
        signal: false,
        tcp: host,
        peer,
        peer_timer: None,
        rx: VecDeque::with_capacity(1024),
        wire: HostLink::new(link),
        out: Vec::with_capacity(1024),
        mss: tcp.mss,
        counters: Counters::default(),
        back_base: VsockCounters::default(),
        queued_max: 0,
    }))
}

impl VsockPath {
    /// The relay's TCP output from `at`: each segment's transmit path on
    /// the core, then the host NIC and the link. Returns the time it took.
    fn flush(&mut self, at: Time) -> Time {
        let per = self.stack.tcp_tx_segment + self.stack.xmit;
        let mut t = at;
        while let Some(seg) = self.tcp.poll_output(t) {
            t += per;
            let f = Frame::tcp_gso(FLOW, seg, self.mss, t);
            self.wire.send(Towards::Peer, (), f, t);
            self.counters.tx_frames += 1;
        }
        t - at
    }

    /// The host NIC's interrupt and NAPI poll: every waiting frame up the
    /// host stack to the relay's socket. Returns the time it took.
    fn receive(&mut self, at: Time) -> Time {
        self.counters.nic_irqs += 1;
        let mut t = at + self.stack.nic_irq + self.stack.napi_poll;
        while let Some(f) = self.rx.pop_front() {
            self.counters.rx_frames += 1;
            if let Transport::Tcp(seg) = f.transport {
                t += self.stack.tcp_rx_segment;
                self.tcp.on_segment(seg, t);
                t += self.flush(t);
            }
        }
        t - at
    }

    /// The client host's output in `out` goes on the link to the host.
    fn peer_out(&mut self) {
        for i in 0..self.out.len() {
            let (leave, f) = self.out[i];
            self.wire.send(Towards::Host, (), f, leave);
        }
        self.out.clear();
    }

    /// A switch to `th` on the core: a thread switch if another thread's
    /// item ran last.
    fn switch_to(&mut self, th: Thread) -> Time {
        let cost = if self.last != th && self.last != Thread::None {
            self.stack.switch
        } else {
            0
        };
        self.last = th;
        cost
    }

    /// Bytes the relay can move now: queued on the vsock socket, and room
    /// in its TCP socket's send buffer.
    fn relay_ready(&self) -> u32 {
        let queued = self.back.conn.as_ref().map_or(0, |c| c.credit.rx_bytes);
        queued.min(self.tcp.send_space())
    }
}

impl World {
    /// Starts the client host's timers (the core sleeps until a kick).
    pub(super) fn vsock_start(&mut self) {
        self.vsock_peer_sync();
    }

    /// An eventfd was signalled: a kick of one of the device's queues.
    pub(super) fn vsock_eventfd(&mut self, fd: u16) {
        let Some(v) = self.vsock.as_deref_mut() else {
            return;
        };
        match v.back.kicked(fd) {
            Some(VsockVq::Tx) => v.tx_work = true,
            Some(VsockVq::Rx) => v.rx_work = true,
            None => return,
        }
        if std::mem::take(&mut v.asleep) {
            // vhost_work_queue wakes the worker thread.
            v.counters.wakeups += 1;
            let at = self.q.now() + v.stack.wakeup;
            self.q.schedule(at, Ev::VsockStep);
        }
    }

    /// The core finished its last work item: the next one. The host NIC's
    /// frames first, then the worker's TX and RX handlers, then the relay.
    pub(super) fn vsock_step(&mut self) {
        let now = self.q.now();
        let measuring = now >= self.measure_start;
        let Some(v) = self.vsock.as_deref_mut() else {
            return;
        };
        let irq = std::mem::take(&mut v.signal);
        if v.tcp.next_timer().is_some_and(|t| t <= now) {
            v.tcp.on_timer(now);
        }
        let mut work = v.flush(now);
        if !v.rx.is_empty() {
            work += v.receive(now + work);
            if measuring {
                v.counters.softirq_busy += work;
            }
        } else if v.tx_work || v.rx_work {
            let mut t = v.switch_to(Thread::Worker);
            let turn = if v.tx_work {
                v.counters.tx_turns += 1;
                let turn = v.back.handle_tx(&mut v.dev, &v.vc);
                v.tx_work = turn.requeue;
                let queued = v.back.conn.as_ref().map_or(0, |c| c.credit.rx_bytes);
                v.queued_max = v.queued_max.max(queued);
                // Replies (RESPONSE, RST) on send_pkt_list:
                // vhost_transport_send_pkt queues the RX handler.
                v.rx_work |= turn.rx_pending;
                turn
            } else {
                v.counters.rx_turns += 1;
                let turn = v.back.handle_rx(&mut v.dev, &v.vc);
                // Out of guest buffers, the handler waits for the refill's
                // kick; at a weight it requeues.
                v.rx_work = turn.requeue;
                turn
            };
            v.signal = turn.signal;
            t += turn.cost;
            work += t;
            if measuring {
                v.counters.worker_busy += t;
            }
        } else if v.relay_ready() > 0 {
            let mut t = v.switch_to(Thread::Relay);
            let max = v.relay_ready();
            let (n, cost, update) = v.relay.step_max(&mut v.back, &v.rc, max);
            let sent = v.tcp.send(n);
            debug_assert_eq!(sent, n, "the relay wrote what its socket had room for");
            t += cost + v.stack.copy_per_kib * u64::from(n) / 1024;
            t += v.flush(now + work + t);
            v.counters.relay_steps += 1;
            v.counters.relay_bytes += u64::from(n);
            if update {
                v.counters.credit_updates += 1;
                v.rx_work = true;
            }
            work += t;
            if measuring {
                v.counters.relay_busy += t;
            }
        } else if work == 0 {
            // Nothing to do: the threads sleep (the worker until a kick,
            // the relay in select(), the softirq until the NIC's next
            // interrupt).
            v.asleep = true;
            v.last = Thread::None;
            // The relay socket's TCP timer (retransmission, persist) wakes
            // the core when it is due.
            if let Some(t) = v.tcp.next_timer() {
                self.q
                    .schedule(t.max(now + crate::engine::NS), Ev::VsockTcpTimer);
            }
        }
        if !v.asleep {
            self.q.schedule(now + work.max(1), Ev::VsockStep);
        }
        self.vsock_schedule();
        if irq {
            if let Some(v) = self.vsock.as_deref_mut() {
                v.counters.irqs += 1;
                let vm = v.vm;
                self.irqfd(vm, VSOCK_VECTOR);
            }
        }
    }

    /// Schedules the arrival of the frames queued on the link since the
    /// last call (the link is a FIFO: each event takes its direction's
    /// head).
    fn vsock_schedule(&mut self) {
        let Some(v) = self.vsock.as_deref_mut() else {
            return;
        };
        let q = &mut self.q;
        v.wire.schedule_arrivals(|t, dir| {
            q.schedule(
                t,
                match dir {
                    Towards::Peer => Ev::VsockToPeer,
                    Towards::Host => Ev::VsockToHost,
                },
            )
        });
    }

    /// A deadline of the relay socket's TCP: it wakes the sleeping core
    /// (a running one looks at its timers at every item).
    pub(super) fn vsock_tcp_timer(&mut self) {
        let Some(v) = self.vsock.as_deref_mut() else {
            return;
        };
        let due = v.tcp.next_timer().is_some_and(|t| t <= self.q.now());
        if due && std::mem::take(&mut v.asleep) {
            self.q.schedule_in(0, Ev::VsockStep);
        }
    }

    /// The head frame towards the client host arrives there.
    pub(super) fn vsock_to_peer(&mut self) {
        let now = self.q.now();
        let Some(v) = self.vsock.as_deref_mut() else {
            return;
        };
        let Some(((), f)) = v.wire.arrive(Towards::Peer) else {
            return;
        };
        v.out.clear();
        v.peer.receive(f, now, &mut v.out);
        v.peer_out();
        self.vsock_peer_sync();
    }

    /// The head frame from the client host reaches the host NIC; its
    /// interrupt wakes the core if it sleeps.
    pub(super) fn vsock_to_host(&mut self) {
        let Some(v) = self.vsock.as_deref_mut() else {
            return;
        };
        if let Some(((), f)) = v.wire.arrive(Towards::Host) {
            v.rx.push_back(f);
        }
        if std::mem::take(&mut v.asleep) {
            self.q.schedule_in(0, Ev::VsockStep);
        }
    }

    /// The client host's timer.
    pub(super) fn vsock_peer_timer(&mut self) {
        let now = self.q.now();
        let Some(v) = self.vsock.as_deref_mut() else {
            return;
        };
        if v.peer_timer != Some(now) {
            return;
        }
        v.peer_timer = None;
        v.out.clear();
        v.peer.timer(now, &mut v.out);
        v.peer_out();
        self.vsock_peer_sync();
    }

    /// Re-arms the client host's timer if its deadline moved, and
    /// schedules what it sent.
    fn vsock_peer_sync(&mut self) {
        let now = self.q.now();
        let Some(v) = self.vsock.as_deref_mut() else {
            return;
        };
        let next = v.peer.next_timer().map(|t| t.max(now));
        if next.is_some() && next != v.peer_timer {
            v.peer_timer = next;
            if let Some(t) = next {
                self.q.schedule(t, Ev::VsockPeerTimer);
            }
        }
        self.vsock_schedule();
    }

    /// The vsock path's metrics over the measured interval.
    pub(super) fn vsock_metrics(&self, out: &mut Metrics, dur: f64) {
        let Some(v) = self.vsock.as_deref() else {
            return;
        };
        let mut m = Metrics::new();
        v.peer.metrics(&mut m);
        let prefix = crate::report::vm_prefix(v.vm);
        for (k, x) in m {
            *out.entry(format!("{prefix}{k}")).or_insert(0.0) += x;
        }
        let s = dur.max(1e-12);
        let pct = |t: Time| 100.0 * t as f64 / (s * crate::engine::SEC as f64);
        let k = &v.counters;
        let (b, b0) = (&v.back.counters, &v.back_base);
        out.insert("vsock.worker_busy_pct".into(), pct(k.worker_busy));
        out.insert("vsock.relay_busy_pct".into(), pct(k.relay_busy));
        out.insert("vsock.softirq_busy_pct".into(), pct(k.softirq_busy));
        out.insert(
            "vsock.core_busy_pct".into(),
            pct(k.worker_busy + k.relay_busy + k.softirq_busy),
        );
        out.insert("vsock.tx_turns_per_s".into(), k.tx_turns as f64 / s);
        out.insert("vsock.rx_turns_per_s".into(), k.rx_turns as f64 / s);
        out.insert("vsock.irqs_per_s".into(), k.irqs as f64 / s);
        out.insert("vsock.worker_wakeups_per_s".into(), k.wakeups as f64 / s);
        out.insert("vsock.relay_calls_per_s".into(), k.relay_steps as f64 / s);
        out.insert(
            "vsock.relay_gbps".into(),
            k.relay_bytes as f64 * 8.0 / s / 1e9,
        );
        out.insert(
            "vsock.credit_updates_per_s".into(),
            k.credit_updates as f64 / s,
        );
        out.insert("vsock.host_nic_irqs_per_s".into(), k.nic_irqs as f64 / s);
        out.insert("vsock.host_rx_frames_per_s".into(), k.rx_frames as f64 / s);
        out.insert("vsock.host_tx_frames_per_s".into(), k.tx_frames as f64 / s);
        out.insert("vsock.kicks_per_s".into(), (b.kicks - b0.kicks) as f64 / s);
        out.insert(
            "vsock.tx_pkts_per_s".into(),
            (b.tx_pkts - b0.tx_pkts) as f64 / s,
        );
        out.insert(
            "vsock.signals_suppressed_per_s".into(),
            (b.signals_suppressed - b0.signals_suppressed) as f64 / s,
        );
        out.insert("vsock.resets".into(), (b.resets - b0.resets) as f64);
        out.insert("vsock.dropped".into(), (b.dropped - b0.dropped) as f64);
        // The stream's bytes at each hand-over: what the worker took off
        // the TX ring and what the relay moved since the warm-up, what the
        // host socket and the ring hold now, what the client host's TCP
        // acknowledged since the connection opened (with no warm-up, tests
        // check that they add up).
        out.insert(
            "vsock.host_rx_bytes".into(),
            (b.tx_bytes - b0.tx_bytes) as f64,
        );
        out.insert("vsock.relay_bytes".into(), k.relay_bytes as f64);
        let queued = v.back.conn.as_ref().map_or(0, |c| c.credit.rx_bytes);
        out.insert("vsock.host_queued_bytes".into(), f64::from(queued));
        out.insert(
            "vsock.host_queued_max_bytes".into(),
            f64::from(v.queued_max),
        );
        out.insert("vsock.tx_ring_bytes".into(), v.dev.tx_bytes_queued() as f64);
        out.insert(
            "vsock.relay_tcp_acked_bytes".into(),
            v.tcp.bytes_acked() as f64,
        );
        out.insert(
            "vsock.rx_no_buffer".into(),
            (b.rx_no_buffer - b0.rx_no_buffer) as f64,
        );
    }

    /// The end of the warm-up.
    pub(super) fn vsock_reset(&mut self) {
        if let Some(v) = self.vsock.as_deref_mut() {
            v.counters = Counters::default();
            v.back_base = v.back.counters;
            v.peer.reset_metrics();
        }
    }
}
