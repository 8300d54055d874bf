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
//! ApacheBench over vsock (`[vm.workload.nginx]`, docs/vcanal.md
//! "ApacheBench over virtio-vsock"): the guest's server threads
//! (`workloads::vsock::VsockHttpThread`) accept, serve and close AF_VSOCK
//! connections on the guest's socket table (`guest::vsock::VsockStack`);
//! on the host, socat `TCP-LISTEN,fork VSOCK-CONNECT` ([`HttpRelay`]):
//! its parent accepts each of ab's TCP connections and forks a child,
//! which connects to the guest over vsock, copies both ways, and closes
//! both sockets once both streams ended. The parent and the children take
//! the relay's place in the core's FIFO.
//!
//! Several VMs (docs/vcanal.md, "Several VMs over vsock"): each VM over
//! vsock has its own device and guest CID, its own back end and worker
//! (`vhost_vsock_dev_open` → `vhost_dev_init`: a worker per device), its
//! own relay and netserver; they share the core and the wire. Among the
//! workers, and among the relays, the one that ran last keeps the core
//! while it has work and its CFS slice lasts (`hv::sched::CfsParams`).
//! The back end takes only packets from its own guest's CID.
//!
//! Simplifications (named): the workers, the relays and the host NIC's
//! softirq share the workers' core (`host.io_cores[0]`) as one FIFO of
//! work items, as vCanal's service core runs its poller, pool and softirq
//! (a switch between threads costs a thread switch);
//! the host NIC takes an interrupt per batch of frames that wait (no
//! moderation, as `workload.vcanal.host_nic_itr = "off"`); a handler
//! turn takes what the ring holds when it starts and its time is charged
//! after (packets added during it wait for the next turn, and the ring's
//! notifications are off only at its start); the connection to the client
//! host is established before the run.

use super::event::Ev;
use super::host_link::{HostLink, HostStack, Towards};
use super::World;
use crate::calibration::Calibration;
use crate::engine::Time;
use crate::guest::app::Metrics;
use crate::guest::tcp::TcpState;
use crate::guest::tcp::{Tcp, TcpConfig};
use crate::guest::vsock::{State as VState, VsockDriver, VsockDriverCosts, VsockStack};
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
    s.net.device == NetDevice::VirtioVsock && (w.netperf.is_some() || w.nginx.is_some())
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

/// Costs of the relay's core beyond the host stack's: a thread switch
/// and a worker's wake-up.
#[derive(Clone, Copy, Debug)]
struct CoreCosts {
    switch: Time,
    wakeup: Time,
}

/// Which thread's work item ran last on the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Thread {
    None,
    /// VM k's vhost-vsock worker.
    Worker(usize),
    /// VM k's relay.
    Relay(usize),
    /// socat's listening parent (ApacheBench over vsock).
    Parent,
    /// A relay child, by process id.
    Child(u32),
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

/// The phase of one relay process (socat's child for one accepted TCP
/// connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChildPhase {
    /// Forked: its socket() and connect() to the guest come next.
    Forked,
    /// REQUEST sent, waiting for the guest's RESPONSE.
    Connecting,
    /// Copying both ways.
    Relaying,
    /// The guest's stream ended and the TCP side was shut down (FIN to
    /// ab); waiting for ab's FIN to end the TCP stream.
    Draining,
}

/// One relay process.
#[derive(Clone, Copy, Debug)]
struct Child {
    /// Its TCP connection's slot (ab's connection slot).
    slot: usize,
    /// Which of the slot's connections it serves (its passive opens).
    conn_no: u32,
    /// Its vsock socket (a slot of the back end's host sockets).
    vs: Option<usize>,
    phase: ChildPhase,
    /// A process id, for the switch between processes.
    pid: u32,
}

/// Counters of the HTTP relay.
#[derive(Clone, Copy, Debug, Default)]
struct HttpCounters {
    accepts: u64,
    forks: u64,
    exits: u64,
    /// The guest refused a connection (RST to the REQUEST).
    refused: u64,
    parent_busy: Time,
}

/// ApacheBench over virtio-vsock, the host side: the host's TCP socket of
/// each of ab's connection slots (flow `FLOW + i`, a passive socket that
/// answers each SYN), socat's listening parent, which accepts each
/// connection and forks a child for it, and the children, each of which
/// connects a vsock socket to the guest's server and copies between the
/// two until both streams end.
struct HttpRelay {
    socks: Vec<Tcp>,
    /// The guest port slot i's connections go to (the port of the server
    /// thread that owns ab's process).
    guest_port: Vec<u32>,
    children: Vec<Child>,
    /// The next ephemeral port a child's vsock socket binds
    /// (`vsock_auto_bind`: from 1024 up).
    next_port: u32,
    next_pid: u32,
    /// Where the round robin over the children stands.
    cursor: usize,
    fork: Time,
    accept: Time,
    conn_request: Time,
    syn_recv_sock: Time,
    counters: HttpCounters,
}

impl HttpRelay {
    /// The slot's TCP socket still carries child `c`'s connection (its
    /// slot has not opened the next one).
    fn tcp_of(&self, c: &Child) -> Option<&Tcp> {
        let t = &self.socks[c.slot];
        (t.connections_opened() == c.conn_no).then_some(t)
    }

    /// ab's side of child `c`'s TCP stream has ended: its FIN came (or
    /// the slot already carries ab's next connection).
    fn tcp_ended(&self, c: &Child) -> bool {
        self.tcp_of(c).is_none_or(|t| {
            t.at_eof() || matches!(t.state(), TcpState::TimeWait | TcpState::Closed)
        })
    }
}

/// One VM's share of the vsock path: its device, the back end its own
/// vhost-vsock worker runs (Linux starts one worker per device:
/// `vhost_vsock_dev_open` → `vhost_dev_init`), its relay and the relay's
/// TCP connection to its own netserver on the client host.
pub(super) struct VsockVm {
    /// The VM.
    pub(super) vm: usize,
    /// Its device (the rings the guest driver and the worker share).
    pub(super) dev: VirtioVsockDev,
    back: VhostVsock,
    relay: Relay,
    /// The TX / RX handler is queued (kicked, or requeued at a weight).
    tx_work: bool,
    rx_work: bool,
    tcp: Tcp,
    peer: PeerHost,
    peer_timer: Option<Time>,
    /// The back end's counters at the end of the warm-up.
    back_base: VsockCounters,
    /// The most bytes the host socket held unread (at most its
    /// `buf_alloc` when the guest keeps to its credit).
    queued_max: u32,
    /// Bytes its relay moved since the warm-up.
    relay_bytes: u64,
}

/// The vsock path of the machine: one [`VsockVm`] per VM over vsock, all
/// of whose workers and relays share one host core with the host NIC's
/// softirq, and one 10 GbE wire to the client host.
pub(super) struct VsockPath {
    /// The VMs over vsock, by VM number.
    pub(super) vms: Vec<VsockVm>,
    vc: VsockCosts,
    rc: RelayCosts,
    stack: HostStack,
    cc: CoreCosts,
    /// The workers' (and relays') core.
    pub(super) core: usize,
    /// The core sleeps (no `VsockStep` queued).
    asleep: bool,
    last: Thread,
    /// The last turn asked to signal its VM's guest (the index in `vms`):
    /// raised when it ends.
    signal: Option<usize>,
    /// Frames from the client host, with the VM whose relay they are for.
    rx: VecDeque<(usize, Frame)>,
    /// The wire to the client host, frames tagged with their VM's index.
    wire: HostLink<usize>,
    out: Vec<(Time, Frame)>,
    mss: u32,
    counters: Counters,
    /// The worker, and the relay, that ran last, and since when: it keeps
    /// the core while it has work (a thread runs until it blocks: the vhost
    /// worker until its work list is empty, socat until select() finds
    /// nothing) or until its CFS slice is used up; then the next runnable
    /// one in VM order takes its turn.
    worker_last: usize,
    worker_since: Time,
    relay_last: usize,
    relay_since: Time,
    /// The CFS slice of one of the core's threads (`sched_slice` with
    /// every worker and relay runnable, Linux 4.4's tunables).
    slice: Time,
    /// ApacheBench over vsock: the per-connection relays and their TCP
    /// sockets (None for the netperf stream).
    http: Option<Box<HttpRelay>>,
}

/// Builds the vsock path: per VM over vsock, the device, the guest
/// driver and program (spawned on the VM's application vCPU), the back
/// end, the relay and its connection to the client host. None when no VM
/// runs over vsock.
pub(super) fn build(
    s: &Scenario,
    cal: &Calibration,
    link: Link,
    guests: &mut [Kernel],
) -> Result<Option<VsockPath>, String> {
    let views = s.vm_views();
    let over: Vec<usize> = views
        .iter()
        .enumerate()
        .filter(|(_, v)| runs_over_vsock(s, v.workload))
        .map(|(vm, _)| vm)
        .collect();
    if over.is_empty() {
        return Ok(None);
    }
    if over.len() > 1 && over.iter().any(|&vm| views[vm].workload.nginx.is_some()) {
        return Err(
            "net.device: ApacheBench over virtio-vsock is modelled for one VM (one socat parent and its children)"
                .into(),
        );
    }
    let core = *s.host.io_cores.first().ok_or("host.io_cores: empty")?;
    let g = &cal.guest;
    let syscall = t_ns(&g.syscall_ns);
    let drv_costs = VsockDriverCosts {
        tx_pkt: t_ns(&cal.vsock.guest_tx_pkt_ns),
        rx_pkt: t_ns(&cal.vsock.guest_rx_pkt_ns),
        copy_per_kib: t_ns(&g.copy_per_kib_ns),
    };
    let ports = VsockPorts {
        rx: VSOCK_NOTIFY_PORT,
        tx: VSOCK_NOTIFY_PORT + 1,
    };
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
    let peer_costs = crate::world::build::peer_costs(s, cal);
    let mut vms = Vec::with_capacity(over.len());
    let mut http = None;
    for (k, &vm) in over.iter().enumerate() {
        let v = &views[vm];
        // Each VM its own context id, from the first a guest may have
        // (`guest-cid=3`, 4, ...: QEMU's vhost-vsock-pci takes one per
        // device).
        let cid = GUEST_CID + k as u64;
        let mut dev = VirtioVsockDev::new(QUEUE_SIZE, s.net.event_idx, cid)
            .map_err(|e| format!("net.device: {e}"))?;
        let kernel = guests.get_mut(vm).ok_or("VM count mismatch")?;
        let (host, peer) = if let Some(n) = &v.workload.nginx {
            let (peer, h) =
                build_http(n, cal, &mut dev, drv_costs, ports, tcp, peer_costs, kernel)?;
            http = Some(Box::new(h));
            (Tcp::new(tcp).map_err(|e| e.to_string())?, peer)
        } else {
            let n = v.workload.netperf.as_ref().ok_or("netperf missing")?;
            let (drv, req) = VsockDriver::probe(
                &mut dev,
                (cid, GUEST_PORT),
                (CID_HOST, RELAY_PORT),
                drv_costs,
            );
            let app = VsockNetperf::new(drv, req, ports, n.msg_bytes, syscall);
            kernel.spawn_on(v.app_vcpu, Box::new(app), 0, false);
            let (host, far) = Tcp::pair(tcp, tcp).map_err(|e| e.to_string())?;
            let iperf = IperfCosts {
                syscall,
                copy_per_kib: t_ns(&g.copy_per_kib_ns),
            };
            let netserver = IperfPeer::new(false, RECV_BYTES, iperf).instances(1, "netperf");
            let peer = PeerHost::new(vec![far], FLOW, Box::new(netserver), peer_costs, 1);
            (host, peer)
        };
        let fds = kick_fds(vm);
        let back = match &http {
            Some(h) => VhostVsock::new(vm, fds, NO_LISTENER).with_sockets(h.children.capacity()),
            None => VhostVsock::new(vm, fds, RELAY_PORT),
        }
        .with_guest_cid(cid);
        vms.push(VsockVm {
            vm,
            dev,
            back,
            relay: Relay::new(s.net.vsock_relay_buf_bytes),
            tx_work: false,
            rx_work: false,
            tcp: host,
            peer,
            peer_timer: None,
            back_base: VsockCounters::default(),
            queued_max: 0,
            relay_bytes: 0,
        });
    }
    Ok(Some(VsockPath {
        vms,
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
        stack: HostStack::new(cal),
        cc: CoreCosts {
            switch: t_ns(&g.context_switch_ns),
            wakeup: t_us(&cal.vhost.wakeup_us),
        },
        core,
        asleep: true,
        last: Thread::None,
        signal: None,
        rx: VecDeque::with_capacity(1024),
        wire: HostLink::new(link),
        out: Vec::with_capacity(1024),
        mss: tcp.mss,
        counters: Counters::default(),
        worker_last: 0,
        worker_since: 0,
        relay_last: 0,
        relay_since: 0,
        slice: {
            let p = crate::hv::sched::CfsParams::linux44(s.machine.cores);
            let threads = 2 * over.len() as u64;
            p.period(threads) / threads
        },
        http,
    }))
}

/// The back end's listening port when nothing on the host listens (the
/// relays connect to the guest): `VMADDR_PORT_ANY`, which no packet names.
const NO_LISTENER: u32 = u32::MAX;

/// The server's AF_VSOCK port of thread j: `HTTP_PORT + j`, as the
/// kernel-socket and vCanal servers number theirs.
const HTTP_PORT: u32 = 80;

/// Sockets the guest's table holds: ab's connections, those lingering
/// until the relay's RST, and those queued on the listeners.
const GUEST_SOCKETS: usize = 256;

/// ApacheBench over vsock: the guest's socket table with a listener per
/// server thread, the threads, the client host's ab (a connection per
/// request), and the host's relay side.
#[allow(clippy::too_many_arguments)]
fn build_http(
    n: &crate::scenario::NginxSpec,
    cal: &Calibration,
    dev: &mut VirtioVsockDev,
    drv_costs: VsockDriverCosts,
    ports: VsockPorts,
    tcp: TcpConfig,
    peer_costs: crate::workloads::peer::PeerCosts,
    kernel: &mut Kernel,
) -> Result<(PeerHost, HttpRelay), String> {
    use crate::workloads::http::{ab_process_of, AbClient, ClientNames, HttpShape};
    use crate::workloads::vsock::{VsockHttpCosts, VsockHttpThread};
    let g = &cal.guest;
    let workers = n.workers as usize;
    let ab = n.ab_processes as usize;
    let conns = ab * n.concurrency as usize;
    let listen: Vec<u32> = (0..workers).map(|j| HTTP_PORT + j as u32).collect();
    // nginx's listen backlog (511, NGX_LISTEN_BACKLOG).
    let stack = VsockStack::probe(dev, drv_costs, &listen, 511, GUEST_SOCKETS.max(4 * conns));
    let stack = std::rc::Rc::new(std::cell::RefCell::new(stack));
    let shape = HttpShape {
        request: n.request_bytes,
        response: n.header_bytes + n.page_bytes,
        keep_alive: false,
    };
    let costs = VsockHttpCosts {
        syscall: t_ns(&g.syscall_ns),
        request: t_ns(&g.nginx_request_ns),
        connection: t_ns(&g.http_connection_ns),
    };
    let cpus = kernel.cpus();
    for (j, &port) in listen.iter().enumerate() {
        let app = VsockHttpThread::new(stack.clone(), j, port, ports, shape, costs, conns.max(1));
        kernel.spawn_on(j % cpus, Box::new(app), 0, false);
    }
    // Both ends without Nagle, as vCanal's host sockets and the
    // kernel-socket server's (a named simplification for socat, which
    // does not set TCP_NODELAY: its response's sub-MSS tail would wait
    // for ab's ACK of the first two segments).
    let tcp = TcpConfig {
        nagle: false,
        ..tcp
    };
    let mut far = Vec::with_capacity(conns);
    let mut socks = Vec::with_capacity(conns);
    let mut guest_port = Vec::with_capacity(conns);
    for i in 0..conns {
        // ab replaces its end at its first poll; the host's answers each SYN.
        far.push(Tcp::new(tcp).map_err(|e| e.to_string())?);
        socks.push(Tcp::listen(tcp).map_err(|e| e.to_string())?);
        guest_port.push(HTTP_PORT + (ab_process_of(i, ab) % workers.max(1)) as u32);
    }
    let names = ClientNames {
        prefix: "nginx",
        percentiles: "latency",
    };
    let client = AbClient::new(shape, conns, t_ns(&cal.peer.ab_request_ns), names)
        .connection_costs(t_ns(&cal.peer.tcp_connect_ns), t_ns(&cal.peer.tcp_close_ns));
    let peer = PeerHost::new(far, FLOW, Box::new(client), peer_costs, ab);
    let relay = HttpRelay {
        socks,
        guest_port,
        children: Vec::with_capacity(4 * conns),
        next_port: 1024,
        next_pid: 1,
        cursor: 0,
        fork: t_us(&cal.vsock.relay_fork_us),
        accept: t_ns(&cal.vcanal.host_accept_ns),
        conn_request: t_ns(&g.tcp_conn_request_ns),
        syn_recv_sock: t_ns(&g.tcp_syn_recv_sock_ns),
        counters: HttpCounters::default(),
    };
    Ok((peer, relay))
}

impl VsockPath {
    /// VM k's relay's TCP output from `at`: each segment's transmit path
    /// on the core, then the host NIC and the link. Returns the time it
    /// took.
    fn flush(&mut self, k: usize, at: Time) -> Time {
        let per = self.stack.tcp_tx_segment + self.stack.xmit;
        let mut t = at;
        let m = &mut self.vms[k];
        while let Some(seg) = m.tcp.poll_output(t) {
            t += per;
            let f = Frame::tcp_gso(FLOW, seg, self.mss, t);
            self.wire.send(Towards::Peer, k, f, t);
            self.counters.tx_frames += 1;
        }
        t - at
    }

    /// Every VM's relay TCP output from `at` (timers and ACKs).
    fn flush_all(&mut self, at: Time) -> Time {
        let mut t = at;
        for k in 0..self.vms.len() {
            t += self.flush(k, t);
        }
        t - at
    }

    /// The thread to run among the VMs' workers (or relays): `last`, if
    /// it has work and its slice since `since` is not used up at `now`,
    /// else the first after it in VM order (wrapping, `last` itself last)
    /// for which `ready` holds.
    fn next_ready(
        &self,
        (last, since): (usize, Time),
        now: Time,
        ready: impl Fn(&Self, usize) -> bool,
    ) -> Option<usize> {
        let n = self.vms.len();
        if now.saturating_sub(since) < self.slice && ready(self, last) {
            return Some(last);
        }
        (1..=n).map(|j| (last + j) % n).find(|&k| ready(self, k))
    }

    /// The host NIC's interrupt and NAPI poll: every waiting frame up the
    /// host stack to the relay's socket. Returns the time it took.
    fn receive(&mut self, at: Time) -> Time {
        self.counters.nic_irqs += 1;
        let mut t = at + self.stack.nic_irq + self.stack.napi_poll;
        while let Some((k, f)) = self.rx.pop_front() {
            self.counters.rx_frames += 1;
            if let Transport::Tcp(seg) = f.transport {
                t += self.stack.tcp_rx_segment;
                if self.http.is_some() {
                    t += self.http_segment(f.flow, seg, t);
                    continue;
                }
                self.vms[k].tcp.on_segment(seg, t);
                t += self.flush(k, t);
            }
        }
        t - at
    }

    /// VM k's netserver's output in `out` goes on the link to the host.
    fn peer_out(&mut self, k: usize) {
        for i in 0..self.out.len() {
            let (leave, f) = self.out[i];
            self.wire.send(Towards::Host, k, f, leave);
        }
        self.out.clear();
    }

    /// A switch to `th` on the core: a thread switch if another thread's
    /// item ran last.
    fn switch_to(&mut self, th: Thread) -> Time {
        let cost = if self.last != th && self.last != Thread::None {
            self.cc.switch
        } else {
            0
        };
        self.last = th;
        cost
    }

    /// ApacheBench over vsock: slot `i`'s TCP output from `at` (the
    /// transmit path of each segment on the core). The time it took.
    fn http_flush_slot(&mut self, i: usize, at: Time) -> Time {
        let per = self.stack.tcp_tx_segment + self.stack.xmit;
        let Some(h) = self.http.as_deref_mut() else {
            return 0;
        };
        let mut t = at;
        while let Some(seg) = h.socks[i].poll_output(t) {
            t += per;
            let f = Frame::tcp_gso(FLOW + i as u16, seg, self.mss, t);
            self.wire.send(Towards::Peer, 0, f, t);
            self.counters.tx_frames += 1;
        }
        t - at
    }

    /// Every slot's TCP output from `at` (timers and ACKs).
    fn http_flush(&mut self, at: Time) -> Time {
        let n = self.http.as_ref().map_or(0, |h| h.socks.len());
        let mut t = at;
        for i in 0..n {
            t += self.http_flush_slot(i, t);
        }
        t - at
    }

    /// A TCP segment of flow `flow` up the host stack to its slot's
    /// socket at `t`: a SYN on the passive socket (`tcp_v4_conn_request`),
    /// the final ACK that queues the connection for accept()
    /// (`tcp_v4_syn_recv_sock`), or data and ACKs. The time it took past
    /// the segment's receive.
    fn http_segment(&mut self, flow: u16, seg: crate::hw::wire::TcpSegment, t: Time) -> Time {
        let Some(h) = self.http.as_deref_mut() else {
            return 0;
        };
        let Some(i) = flow
            .checked_sub(FLOW)
            .map(usize::from)
            .filter(|&i| i < h.socks.len())
        else {
            return 0;
        };
        let tcp = &mut h.socks[i];
        let before = tcp.state();
        tcp.on_segment(seg, t);
        let after = tcp.state();
        let mut cost = 0;
        if after == TcpState::SynReceived && before != after {
            cost += h.conn_request;
        } else if before == TcpState::SynReceived && after != before {
            cost += h.syn_recv_sock;
        }
        cost + self.http_flush_slot(i, t + cost)
    }

    /// The earliest deadline of the slots' TCP sockets.
    fn http_next_timer(&self) -> Option<Time> {
        self.http
            .as_ref()
            .and_then(|h| h.socks.iter().filter_map(|t| t.next_timer()).min())
    }

    /// Runs the slots' TCP timers that are due at `now`.
    fn http_timers(&mut self, now: Time) {
        if let Some(h) = self.http.as_deref_mut() {
            for t in &mut h.socks {
                if t.next_timer().is_some_and(|d| d <= now) {
                    t.on_timer(now);
                }
            }
        }
    }

    /// Relay child `c`'s vsock socket.
    fn child_sock(&self, c: &Child) -> Option<&crate::guest::vsock::VsockConn> {
        c.vs.and_then(|i| self.vms[0].back.socks.get(i))
            .and_then(|s| s.as_ref())
    }

    /// Whether relay child `c` has something to do: its connect, the
    /// guest's answer to it, bytes to move either way (select() says
    /// readable on one side and writable on the other), the end of the
    /// guest's stream, or the end of ab's.
    fn child_ready(&self, h: &HttpRelay, c: &Child) -> bool {
        let vs = self.child_sock(c);
        match c.phase {
            ChildPhase::Forked => true,
            ChildPhase::Connecting => vs.is_none_or(|s| s.state != VState::Connecting),
            ChildPhase::Relaying => {
                let (Some(s), Some(tcp)) = (vs, h.tcp_of(c)) else {
                    // A socket gone under it: the child ends.
                    return true;
                };
                let tcp = Some(tcp);
                let up = s.state == VState::Established
                    && s.credit.space() > 0
                    && tcp.is_some_and(|t| t.readable() > 0);
                let down = s.credit.rx_bytes > 0 && tcp.is_some_and(|t| t.send_space() > 0);
                up || down || s.at_eof()
            }
            ChildPhase::Draining => h.tcp_ended(c),
        }
    }

    /// Whether socat's parent or one of its children has work.
    fn http_ready(&self) -> bool {
        let Some(h) = self.http.as_deref() else {
            return false;
        };
        h.socks.iter().any(|t| t.accept_pending())
            || h.children.iter().any(|c| self.child_ready(h, c))
    }

    /// One work item of the relay side at `at`: socat's parent accepts a
    /// connection and forks its child, or the next ready child (round
    /// robin) runs. The time it took.
    fn http_step(&mut self, at: Time) -> Time {
        let rc = self.rc;
        let Some(h) = self.http.as_deref() else {
            return 0;
        };
        if let Some(i) = h.socks.iter().position(|t| t.accept_pending()) {
            // select() on the listener, accept(), fork().
            let mut t = self.switch_to(Thread::Parent);
            let h = self.http.as_deref_mut().expect("http");
            h.socks[i].accept();
            let pid = h.next_pid;
            h.next_pid = h.next_pid.wrapping_add(1);
            h.children.push(Child {
                slot: i,
                conn_no: h.socks[i].connections_opened(),
                vs: None,
                phase: ChildPhase::Forked,
                pid,
            });
            h.counters.accepts += 1;
            h.counters.forks += 1;
            let cost = rc.select + rc.syscall + h.accept + h.fork;
            h.counters.parent_busy += cost;
            t += cost;
            return t;
        }
        let n = h.children.len();
        let Some(k) = (0..n)
            .map(|j| (h.cursor + j) % n)
            .find(|&k| self.child_ready(h, &h.children[k]))
        else {
            return 0;
        };
        let c = h.children[k];
        let mut t = self.switch_to(Thread::Child(c.pid));
        t += self.child_step(k, at + t);
        if let Some(h) = self.http.as_deref_mut() {
            h.cursor = k + 1;
        }
        t
    }

    /// Relay child `k` runs at `at`. The time it took.
    fn child_step(&mut self, k: usize, at: Time) -> Time {
        let (rc, st) = (self.rc, self.stack);
        let Some(h) = self.http.as_deref_mut() else {
            return 0;
        };
        let mut c = h.children[k];
        let mut cost = 0;
        let mut exit = false;
        if c.phase == ChildPhase::Forked {
            // socket(AF_VSOCK) and connect() to the server's port: the
            // REQUEST goes to the guest through the worker's RX handler.
            let port = h.next_port;
            h.next_port = if h.next_port == u32::MAX - 1 {
                1024
            } else {
                h.next_port + 1
            };
            cost += 2 * rc.syscall;
            match self.vms[0]
                .back
                .connect(port, GUEST_CID, h.guest_port[c.slot])
            {
                Some(i) => {
                    c.vs = Some(i);
                    c.phase = ChildPhase::Connecting;
                    self.vms[0].rx_work = true;
                }
                None => exit = true,
            }
        } else if c.phase == ChildPhase::Connecting {
            match c
                .vs
                .and_then(|i| self.vms[0].back.socks[i].as_ref())
                .map(|s| s.state)
            {
                Some(VState::Connecting) => {}
                Some(VState::Established) => c.phase = ChildPhase::Relaying,
                _ => {
                    // The guest reset the connection: socat fails and
                    // exits, closing ab's connection.
                    h.counters.refused += 1;
                    if h.socks[c.slot].connections_opened() == c.conn_no {
                        h.socks[c.slot].close();
                    }
                    exit = true;
                }
            }
        }
        if c.phase == ChildPhase::Relaying
            && (c
                .vs
                .and_then(|i| self.vms[0].back.socks[i].as_ref())
                .is_none()
                || h.socks[c.slot].connections_opened() != c.conn_no)
        {
            // Its vsock socket was freed or ab's connection is gone (not
            // seen in a served run): socat ends the transfer.
            c.phase = ChildPhase::Draining;
        } else if c.phase == ChildPhase::Relaying && !exit {
            // One select(), then each direction that is ready.
            cost += rc.select;
            let buf = self.vms[0].relay.buf;
            let live = h.socks[c.slot].connections_opened() == c.conn_no;
            let vi = c.vs.expect("connected");
            if let Some(s) = self.vms[0].back.socks[vi].as_mut() {
                let tcp = &mut h.socks[c.slot];
                // ab → guest: read() the TCP socket, write() the vsock one.
                if live && s.state == VState::Established && tcp.readable() > 0 {
                    let n = tcp.readable().min(buf).min(s.credit.space());
                    if n > 0 {
                        if let Some(p) = s.send(n) {
                            tcp.recv(p.len);
                            self.vms[0].back.send_pkt.push_back(p);
                            self.vms[0].rx_work = true;
                            cost += 2 * rc.syscall
                                + st.copy_per_kib * u64::from(p.len) / 1024
                                + rc.copy_per_kib * u64::from(p.len) / 1024;
                        }
                    }
                }
                // guest → ab: read() the vsock socket, write() the TCP one.
                let s = self.vms[0].back.socks[vi].as_mut().expect("open");
                let room = if live { tcp.send_space() } else { 0 };
                if s.credit.rx_bytes > 0 && room > 0 {
                    let (n, update) = s.recv(buf.min(room));
                    let sent = tcp.send(n);
                    debug_assert_eq!(sent, n, "the relay wrote what its socket had room for");
                    if let Some(u) = update {
                        self.vms[0].back.send_pkt.push_back(u);
                        self.vms[0].rx_work = true;
                        self.counters.credit_updates += 1;
                    }
                    self.counters.relay_bytes += u64::from(n);
                    self.vms[0].relay_bytes += u64::from(n);
                    cost += 2 * rc.syscall
                        + rc.copy_per_kib * u64::from(n) / 1024
                        + st.copy_per_kib * u64::from(n) / 1024;
                }
                let s = self.vms[0].back.socks[vi].as_ref().expect("open");
                if s.at_eof() {
                    // The guest's stream ended: shutdown(SHUT_WR) of the
                    // TCP side (its FIN after the data).
                    if live {
                        tcp.close();
                    }
                    cost += rc.syscall;
                    c.phase = ChildPhase::Draining;
                }
            }
            self.counters.relay_steps += 1;
            if live {
                cost += self.http_flush_slot(c.slot, at + cost);
            }
        } else if c.phase == ChildPhase::Draining {
            // ab's FIN came: both streams ended; socat closes both
            // sockets and exits. The vsock close is an RST (the guest
            // shut down both directions).
            cost += 2 * rc.syscall;
            if let Some(i) = c.vs {
                self.vms[0].back.close(i);
                self.vms[0].rx_work = true;
            }
            exit = true;
        }
        let h = self.http.as_deref_mut().expect("http");
        if exit {
            if let Some(i) = c.vs {
                self.vms[0].back.reap(i);
            }
            h.children.swap_remove(k);
            h.counters.exits += 1;
        } else {
            h.children[k] = c;
        }
        cost
    }

    /// Bytes VM k's relay can move now: queued on the vsock socket, and
    /// room in its TCP socket's send buffer.
    fn relay_ready(&self, k: usize) -> u32 {
        let m = &self.vms[k];
        let queued = m.back.conn.as_ref().map_or(0, |c| c.credit.rx_bytes);
        queued.min(m.tcp.send_space())
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
        // The device whose queue the eventfd belongs to.
        let Some((m, q)) = v.vms.iter_mut().find_map(|m| {
            let q = m.back.kicked(fd)?;
            Some((m, q))
        }) else {
            return;
        };
        match q {
            VsockVq::Tx => m.tx_work = true,
            VsockVq::Rx => m.rx_work = true,
        }
        if std::mem::take(&mut v.asleep) {
            // vhost_work_queue wakes the worker thread.
            v.counters.wakeups += 1;
            let at = self.q.now() + v.cc.wakeup;
            self.q.schedule(at, Ev::VsockStep);
        }
    }

    /// The core finished its last work item: the next one. The host NIC's
    /// frames first, then the workers' TX and RX handlers, then the relays
    /// (among the workers, and among the relays, the last one runs on
    /// while it has work).
    pub(super) fn vsock_step(&mut self) {
        let now = self.q.now();
        let measuring = now >= self.measure_start;
        let Some(v) = self.vsock.as_deref_mut() else {
            return;
        };
        let irq = v.signal.take();
        for m in &mut v.vms {
            if m.tcp.next_timer().is_some_and(|t| t <= now) {
                m.tcp.on_timer(now);
            }
        }
        v.http_timers(now);
        let mut work = v.flush_all(now);
        work += v.http_flush(now + work);
        let worker = v.next_ready((v.worker_last, v.worker_since), now, |v, k| {
            v.vms[k].tx_work || v.vms[k].rx_work
        });
        if !v.rx.is_empty() {
            work += v.receive(now + work);
            if measuring {
                v.counters.softirq_busy += work;
            }
        } else if let Some(k) = worker {
            if k != v.worker_last {
                v.worker_last = k;
                v.worker_since = now;
            }
            let mut t = v.switch_to(Thread::Worker(k));
            let vc = v.vc;
            let m = &mut v.vms[k];
            let turn = if m.tx_work {
                v.counters.tx_turns += 1;
                let turn = m.back.handle_tx(&mut m.dev, &vc);
                m.tx_work = turn.requeue;
                let queued = m.back.conn.as_ref().map_or(0, |c| c.credit.rx_bytes);
                let relays = m.back.socks.iter().flatten().map(|c| c.credit.rx_bytes);
                m.queued_max = m.queued_max.max(queued).max(relays.max().unwrap_or(0));
                // Replies (RESPONSE, RST) on send_pkt_list:
                // vhost_transport_send_pkt queues the RX handler.
                m.rx_work |= turn.rx_pending;
                turn
            } else {
                v.counters.rx_turns += 1;
                let turn = m.back.handle_rx(&mut m.dev, &vc);
                // Out of guest buffers, the handler waits for the refill's
                // kick; at a weight it requeues.
                m.rx_work = turn.requeue;
                turn
            };
            v.signal = turn.signal.then_some(k);
            t += turn.cost;
            work += t;
            if measuring {
                v.counters.worker_busy += t;
            }
        } else if v.http_ready() {
            let t = v.http_step(now + work);
            work += t;
            if measuring {
                v.counters.relay_busy += t;
            }
        } else if let Some(k) = v.next_ready((v.relay_last, v.relay_since), now, |v, k| {
            v.relay_ready(k) > 0
        }) {
            if k != v.relay_last {
                v.relay_last = k;
                v.relay_since = now;
            }
            let mut t = v.switch_to(Thread::Relay(k));
            let max = v.relay_ready(k);
            let rc = v.rc;
            let m = &mut v.vms[k];
            let (n, cost, update) = m.relay.step_max(&mut m.back, &rc, max);
            let sent = m.tcp.send(n);
            debug_assert_eq!(sent, n, "the relay wrote what its socket had room for");
            if update {
                m.rx_work = true;
            }
            m.relay_bytes += u64::from(n);
            t += cost + v.stack.copy_per_kib * u64::from(n) / 1024;
            t += v.flush(k, now + work + t);
            v.counters.relay_steps += 1;
            v.counters.relay_bytes += u64::from(n);
            if update {
                v.counters.credit_updates += 1;
            }
            work += t;
            if measuring {
                v.counters.relay_busy += t;
            }
        } else if work == 0 {
            // Nothing to do: the threads sleep (the workers until a kick,
            // the relays in select(), the softirq until the NIC's next
            // interrupt).
            v.asleep = true;
            v.last = Thread::None;
            // The relay sockets' TCP timers (retransmission, persist) wake
            // the core when the first is due.
            if let Some(t) = v.vms.iter().filter_map(|m| m.tcp.next_timer()).min() {
                self.q
                    .schedule(t.max(now + crate::engine::NS), Ev::VsockTcpTimer);
            }
            if let Some(t) = v.http_next_timer() {
                self.q
                    .schedule(t.max(now + crate::engine::NS), Ev::VsockTcpTimer);
            }
        }
        if !v.asleep {
            self.q.schedule(now + work.max(1), Ev::VsockStep);
        }
        self.vsock_schedule();
        if let Some(k) = irq {
            if let Some(v) = self.vsock.as_deref_mut() {
                v.counters.irqs += 1;
                let vm = v.vms[k].vm;
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
        let now = self.q.now();
        let due = v
            .vms
            .iter()
            .any(|m| m.tcp.next_timer().is_some_and(|t| t <= now))
            || v.http_next_timer().is_some_and(|t| t <= now);
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
        let Some((k, f)) = v.wire.arrive(Towards::Peer) else {
            return;
        };
        v.out.clear();
        v.vms[k].peer.receive(f, now, &mut v.out);
        v.peer_out(k);
        self.vsock_peer_sync();
    }

    /// The head frame from the client host reaches the host NIC; its
    /// interrupt wakes the core if it sleeps.
    pub(super) fn vsock_to_host(&mut self) {
        let Some(v) = self.vsock.as_deref_mut() else {
            return;
        };
        if let Some(kf) = v.wire.arrive(Towards::Host) {
            v.rx.push_back(kf);
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
        let mut due = false;
        for k in 0..v.vms.len() {
            if v.vms[k].peer_timer != Some(now) {
                continue;
            }
            due = true;
            v.vms[k].peer_timer = None;
            v.out.clear();
            v.vms[k].peer.timer(now, &mut v.out);
            v.peer_out(k);
        }
        if due {
            self.vsock_peer_sync();
        }
    }

    /// Re-arms the client host's timer if its deadline moved, and
    /// schedules what it sent.
    fn vsock_peer_sync(&mut self) {
        let now = self.q.now();
        let Some(v) = self.vsock.as_deref_mut() else {
            return;
        };
        for m in &mut v.vms {
            let next = m.peer.next_timer().map(|t| t.max(now));
            if next.is_some() && next != m.peer_timer {
                m.peer_timer = next;
                if let Some(t) = next {
                    self.q.schedule(t, Ev::VsockPeerTimer);
                }
            }
        }
        self.vsock_schedule();
    }

    /// The vsock path's metrics over the measured interval: the shared
    /// core's, then each VM's (VM 0's unprefixed, the others' as
    /// `vm<i>.`), and the VMs' aggregate stream.
    pub(super) fn vsock_metrics(&self, out: &mut Metrics, dur: f64) {
        let Some(v) = self.vsock.as_deref() else {
            return;
        };
        let s = dur.max(1e-12);
        let pct = |t: Time| 100.0 * t as f64 / (s * crate::engine::SEC as f64);
        // Each netserver's bytes over the whole measured interval (its
        // throughput_gbps spans its first to last byte, which a VM whose
        // threads wait out others' CFS slices would overstate).
        let (mut aggregate, mut least) = (0.0, f64::INFINITY);
        for m in &v.vms {
            let mut pm = Metrics::new();
            m.peer.metrics(&mut pm);
            let gbps = pm.get("netperf.bytes").copied().unwrap_or(0.0) * 8.0 / s / 1e9;
            aggregate += gbps;
            least = least.min(gbps);
            let prefix = crate::report::vm_prefix(m.vm);
            for (k, x) in pm {
                *out.entry(format!("{prefix}{k}")).or_insert(0.0) += x;
            }
            let (b, b0) = (&m.back.counters, &m.back_base);
            let mut put = |k: &str, x: f64| {
                out.insert(format!("{prefix}vsock.{k}"), x);
            };
            put("kicks_per_s", (b.kicks - b0.kicks) as f64 / s);
            put("tx_pkts_per_s", (b.tx_pkts - b0.tx_pkts) as f64 / s);
            put(
                "signals_suppressed_per_s",
                (b.signals_suppressed - b0.signals_suppressed) as f64 / s,
            );
            put("resets", (b.resets - b0.resets) as f64);
            put("dropped", (b.dropped - b0.dropped) as f64);
            put("misaddressed", (b.misaddressed - b0.misaddressed) as f64);
            // The stream's bytes at each hand-over: what the worker took
            // off the TX ring and what the relay moved since the warm-up,
            // what the host socket and the ring hold now, what the client
            // host's TCP acknowledged since the connection opened (with no
            // warm-up, tests check that they add up).
            put("host_rx_bytes", (b.tx_bytes - b0.tx_bytes) as f64);
            put("relay_bytes", m.relay_bytes as f64);
            let queued = m.back.conn.as_ref().map_or(0, |c| c.credit.rx_bytes);
            put("host_queued_bytes", f64::from(queued));
            put("host_queued_max_bytes", f64::from(m.queued_max));
            put("tx_ring_bytes", m.dev.tx_bytes_queued() as f64);
            put("relay_tcp_acked_bytes", m.tcp.bytes_acked() as f64);
            put("rx_no_buffer", (b.rx_no_buffer - b0.rx_no_buffer) as f64);
            // The host socket's peer: the device's own guest (no packet of
            // another VM reached it).
            if let Some(c) = &m.back.conn {
                put("host_conn_peer_cid", c.peer.0 as f64);
            }
            put("guest_cid", m.dev.guest_cid as f64);
        }
        let k = &v.counters;
        out.insert("vsock.vms".into(), v.vms.len() as f64);
        if v.http.is_none() {
            out.insert("vsock.aggregate_gbps".into(), aggregate);
            out.insert("vsock.min_vm_gbps".into(), least);
        }
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
        if let Some(h) = v.http.as_deref() {
            let k = &h.counters;
            out.insert("vsock.relay_forks_per_s".into(), k.forks as f64 / s);
            out.insert("vsock.relay_forks".into(), k.forks as f64);
            out.insert("vsock.relay_exits".into(), k.exits as f64);
            out.insert("vsock.relay_refused".into(), k.refused as f64);
            out.insert("vsock.relay_children".into(), h.children.len() as f64);
            out.insert("vsock.parent_busy_pct".into(), pct(k.parent_busy));
            out.insert(
                "vsock.host_socks_open".into(),
                v.vms[0].back.sockets_open() as f64,
            );
        }
    }

    /// The end of the warm-up.
    pub(super) fn vsock_reset(&mut self) {
        if let Some(v) = self.vsock.as_deref_mut() {
            v.counters = Counters::default();
            for m in &mut v.vms {
                m.back_base = m.back.counters;
                m.relay_bytes = 0;
                m.peer.reset_metrics();
            }
            if let Some(h) = v.http.as_deref_mut() {
                h.counters = HttpCounters::default();
            }
        }
    }
}
