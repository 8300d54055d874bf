//! Building ES2's workloads (netperf, nginx, Apache, ping, memaslap) into
//! a VM's guest kernel and its peer hosts, beside the TCP workloads of
//! [`super::tcp::tcp_workload`]: the TCP ones as [`TcpWorkload`]s, the
//! datagram ones (netperf UDP_STREAM, ping) as programs in the guest and
//! one single-threaded peer process per flow.

use super::tcp::{TcpWorkload, TCP_FLOW};
use crate::calibration::Calibration;
use crate::engine::{from_s, RngStream, Time};
use crate::guest::app::App;
use crate::guest::tcp::TcpConfig;
use crate::guest::Kernel;
use crate::scenario::{
    MemcachedClientKind, MemcachedSpec, NetperfDirection, NetperfTest, WorkloadSpec,
};
use crate::workloads::http::{
    ab_process_of, AbClient, ClientNames, HttpShape, HttpThread, HttpWorker, ServerCosts,
};
use crate::workloads::iperf::{IperfCosts, IperfGuest, IperfPeer, Name};
use crate::workloads::memcached::{MemaslapClient, MemcachedClient, MemcachedShape};
use crate::workloads::netperf::{
    NetperfCosts, UdpStreamRecv, UdpStreamSend, UdpStreamSink, UdpStreamSource, RECV_BYTES,
};
use crate::workloads::peer::PeerApp;
use crate::workloads::ping::PingClient;
use crate::workloads::udp_rr::{UdpRrClient, UdpRrEcho, UdpRrPeerClient, UdpRrServer};
use crate::world::t_ns;

/// The first flow of a VM's datagram workloads (instance j uses flow
/// `DGRAM_FLOW + j`).
const DGRAM_FLOW: u16 = 1;

/// memcached's request mix: DID's 4 gets per set unless `get_pct` says
/// otherwise (memaslap's default: 9:1).
pub(super) fn memcached_shape(m: &MemcachedSpec) -> MemcachedShape {
    let sets = match (m.get_pct, m.client) {
        (Some(p), _) => MemcachedShape::sets_for_get_pct(p),
        (None, MemcachedClientKind::OpenLoop) => (1, 5),
        (None, MemcachedClientKind::Memaslap) => MemcachedShape::sets_for_get_pct(90.0),
    };
    MemcachedShape {
        key: m.key_bytes,
        value: m.value_bytes,
        sets,
    }
}

/// memcached's load generator: the open-loop one or memaslap.
pub(super) fn memcached_client(
    m: &MemcachedSpec,
    shape: MemcachedShape,
    seed: u64,
    syscall: Time,
) -> Box<dyn PeerApp> {
    let conns = m.connections as usize;
    match m.client {
        MemcachedClientKind::OpenLoop => Box::new(MemcachedClient::new(
            shape,
            seed,
            conns,
            m.rate_rps.unwrap_or(1.0),
            syscall,
        )),
        MemcachedClientKind::Memaslap => Box::new(MemaslapClient::new(
            shape,
            seed,
            conns,
            m.concurrency as usize,
            syscall,
        )),
    }
}

/// A VM's ES2 TCP workload: netperf TCP_STREAM, nginx or Apache.
pub(super) fn tcp_workload(w: &WorkloadSpec, cal: &Calibration) -> Option<TcpWorkload> {
    let g = &cal.guest;
    let syscall = t_ns(&g.syscall_ns);
    let copy_per_kib = t_ns(&g.copy_per_kib_ns);
    // Over vCanal the VM's sockets are the host's (world::vcanal).
    if let Some(n) = w
        .netperf
        .as_ref()
        .filter(|n| n.test == NetperfTest::TcpStream && w.vcanal.is_none())
    {
        let costs = IperfCosts {
            syscall,
            copy_per_kib,
        };
        let threads = n.threads as usize;
        let vm_sends = n.direction == NetperfDirection::Send;
        // The sender writes msg_bytes per call, the receiver reads what
        // arrived up to its receive size.
        let (guest_len, peer_len) = if vm_sends {
            (n.msg_bytes, RECV_BYTES)
        } else {
            (RECV_BYTES, n.msg_bytes)
        };
        // The receive buffer is `guest.tcp_rcvbuf`'s (spawn_tcp).
        let tcp = TcpConfig::default();
        return Some(TcpWorkload {
            guest: (0..threads)
                .map(|j| {
                    let name = Name {
                        prefix: "netperf",
                        instance: (threads > 1).then_some(j),
                    };
                    Box::new(IperfGuest::new(vm_sends, guest_len, costs).named(name))
                        as Box<dyn App>
                })
                .collect(),
            peer: Box::new(
                IperfPeer::new(!vm_sends, peer_len, costs).instances(threads, "netperf"),
            ),
            tcp,
            conns: threads,
            peer_cpus: threads,
            epoll: false,
            owner: Vec::new(),
            spread: true,
            fair: true,
            listen: false,
        });
    }
    let ab_cost = t_ns(&cal.peer.ab_request_ns);
    let (ab_connect, ab_close) = (t_ns(&cal.peer.tcp_connect_ns), t_ns(&cal.peer.tcp_close_ns));
    // nginx sets tcp_nodelay for keep-alive connections; the model's one
    // socket configuration serves both ends.
    let tcp = TcpConfig {
        nagle: false,
        ..TcpConfig::default()
    };
    // Over vCanal nginx is vCanal's HTTP server (world::vcanal).
    if let Some(n) = w.nginx.as_ref().filter(|_| w.vcanal.is_none()) {
        let shape = HttpShape {
            request: n.request_bytes,
            response: n.header_bytes + n.page_bytes,
            keep_alive: n.keep_alive,
        };
        let costs = ServerCosts {
            request: t_ns(&g.nginx_request_ns),
            syscall,
            copy_per_kib,
            // accept4, then epoll_ctl(ADD) of the new connection.
            accept: 2 * syscall + t_ns(&g.tcp_accept_ns),
            close: syscall + t_ns(&g.tcp_close_ns),
            connection: t_ns(&g.http_connection_ns),
        };
        let (ab, workers) = (n.ab_processes as usize, n.workers as usize);
        let conns = ab * n.concurrency as usize;
        // One port per worker: ab process p talks to worker p mod workers.
        let owner: Vec<usize> = (0..conns).map(|i| ab_process_of(i, ab) % workers).collect();
        let names = ClientNames {
            prefix: "nginx",
            percentiles: "latency",
        };
        return Some(TcpWorkload {
            guest: (0..workers)
                .map(|j| {
                    Box::new(HttpWorker::new(
                        shape,
                        costs,
                        j,
                        TCP_FLOW,
                        owner.clone(),
                        "nginx",
                    )) as Box<dyn App>
                })
                .collect(),
            peer: Box::new(
                AbClient::new(shape, conns, ab_cost, names).connection_costs(ab_connect, ab_close),
            ),
            tcp,
            conns,
            peer_cpus: ab,
            epoll: true,
            owner,
            spread: true,
            fair: true,
            listen: !n.keep_alive,
        });
    }
    if let Some(a) = &w.apache {
        let shape = HttpShape {
            request: a.request_bytes,
            response: a.header_bytes + a.page_bytes,
            keep_alive: a.keep_alive,
        };
        let costs = ServerCosts {
            request: t_ns(&g.apache_request_ns),
            syscall,
            copy_per_kib,
            accept: syscall + t_ns(&g.tcp_accept_ns),
            close: syscall + t_ns(&g.tcp_close_ns),
            connection: t_ns(&g.http_connection_ns),
        };
        let ab = a.ab_processes as usize;
        let conns = ab * a.concurrency as usize;
        let names = ClientNames {
            prefix: "apache",
            percentiles: "served",
        };
        // One thread per connection, each blocked in read() on its own.
        return Some(TcpWorkload {
            guest: (0..conns)
                .map(|_| Box::new(HttpThread::new(shape, costs, "apache")) as Box<dyn App>)
                .collect(),
            peer: Box::new(
                AbClient::new(shape, conns, ab_cost, names).connection_costs(ab_connect, ab_close),
            ),
            tcp,
            conns,
            peer_cpus: ab,
            epoll: false,
            owner: Vec::new(),
            spread: true,
            fair: true,
            listen: !a.keep_alive,
        });
    }
    None
}

/// A peer process of a datagram workload: its flow, its program, and
/// whether its socket is a raw ICMP one.
pub(super) struct DatagramPeer {
    pub(super) flow: u16,
    pub(super) app: Box<dyn PeerApp>,
    pub(super) icmp: bool,
}

/// Spawns a VM's datagram workload (netperf UDP_STREAM, ping) in
/// `kernel` and returns its peer processes. `wire`: one `msg_bytes`
/// datagram's time on the client host's link (0 when the peer is behind
/// the bridge). `vm` names the VM's ping phase stream.
pub(super) fn spawn_datagram(
    kernel: &mut Kernel,
    w: &WorkloadSpec,
    cal: &Calibration,
    wire: impl Fn(u32) -> Time,
    seed: u64,
    vm: usize,
) -> Vec<DatagramPeer> {
    let syscall = t_ns(&cal.guest.syscall_ns);
    let costs = NetperfCosts {
        syscall,
        sendto: t_ns(&cal.guest.sendto_syscall_ns),
        copy_per_kib: t_ns(&cal.guest.copy_per_kib_ns),
    };
    let mut peers = Vec::new();
    if let Some(n) = w
        .netperf
        .as_ref()
        .filter(|n| n.test == NetperfTest::UdpStream)
    {
        let threads = n.threads as usize;
        let cpus = kernel.cpus();
        for j in 0..threads {
            let flow = DGRAM_FLOW + j as u16;
            let instance = (threads > 1).then_some(j);
            let app: Box<dyn PeerApp> = match n.direction {
                NetperfDirection::Send => {
                    kernel.spawn_on(
                        j % cpus,
                        Box::new(UdpStreamSend::new(flow, n.msg_bytes, costs)),
                        0,
                        true,
                    );
                    Box::new(UdpStreamSink::new(syscall, instance))
                }
                NetperfDirection::Recv => {
                    let t = kernel.spawn_on(
                        j % cpus,
                        Box::new(UdpStreamRecv::new(costs, instance)),
                        0,
                        true,
                    );
                    kernel.udp_bind(flow, t);
                    let frame = n.msg_bytes + crate::hw::wire::UDP_HEADERS;
                    Box::new(UdpStreamSource::new(
                        flow,
                        n.msg_bytes,
                        wire(frame),
                        syscall,
                    ))
                }
            };
            peers.push(DatagramPeer {
                flow,
                app,
                icmp: false,
            });
        }
    }
    if let Some(n) = w
        .netperf
        .as_ref()
        .filter(|n| n.test == NetperfTest::UdpRr && w.vcanal.is_none())
    {
        let cpus = kernel.cpus();
        for j in 0..n.threads as usize {
            let flow = DGRAM_FLOW + j as u16;
            let app: Box<dyn PeerApp> = match n.direction {
                NetperfDirection::Send => {
                    let client = UdpRrClient::new(flow, n.msg_bytes, costs);
                    let t = kernel.spawn_on(j % cpus, Box::new(client), 0, true);
                    kernel.udp_bind(flow, t);
                    Box::new(UdpRrEcho::new(syscall))
                }
                NetperfDirection::Recv => {
                    let t = kernel.spawn_on(j % cpus, Box::new(UdpRrServer::new(costs)), 0, true);
                    kernel.udp_bind(flow, t);
                    Box::new(UdpRrPeerClient::new(flow, n.msg_bytes, syscall))
                }
            };
            peers.push(DatagramPeer {
                flow,
                app,
                icmp: false,
            });
        }
    }
    if let Some(p) = &w.ping {
        // The first request at a random phase of the interval.
        let stream = super::rng_stream("ping-phase", vm);
        let start = from_s(RngStream::new(seed, &stream).uniform() * p.interval_s);
        peers.push(DatagramPeer {
            flow: DGRAM_FLOW,
            app: Box::new(PingClient::new(
                DGRAM_FLOW,
                p.payload_bytes,
                from_s(p.interval_s),
                start,
                syscall,
            )),
            icmp: true,
        });
    }
    peers
}
