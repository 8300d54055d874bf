//! A VM's TCP workloads as the builder spawns them: DID's (NetPIPE, iperf,
//! memcached) here, ES2's in [`super::es2`]; each is the guest's programs
//! and sockets plus its peer host's program.

use super::es2;
use crate::calibration::Calibration;
use crate::guest::tcp::TcpConfig;
use crate::guest::Kernel;
use crate::scenario::IperfDirection;
use crate::workloads::iperf::{IperfCosts, IperfGuest, IperfPeer};
use crate::workloads::memcached::MemcachedWorker;
use crate::workloads::netpipe::{NetpipeEcho, NetpipeTransmitter};
use crate::workloads::peer::PeerApp;
use crate::world::t_ns;

/// The window of `guest.tcp_rcvbuf = "fixed-512k"`: the model's earlier
/// fixed receive buffer (kept for sensitivity runs).
pub(super) const TCP_RCVBUF_FIXED: u32 = 512 * 1024;

/// The socket buffers `guest.tcp_rcvbuf` asks for, on top of `base`.
pub(in crate::world) fn rcvbuf_config(
    base: TcpConfig,
    mode: crate::scenario::TcpRcvbuf,
    hz: u32,
) -> TcpConfig {
    use crate::guest::tcp::RcvAutotune;
    use crate::scenario::TcpRcvbuf;
    let jiffy = crate::engine::SEC / u64::from(hz.max(1));
    let linux = TcpConfig::linux(RcvAutotune::Off);
    let autotuned = |autotune| TcpConfig {
        rcvbuf: linux.rcvbuf,
        rcvbuf_max: linux.rcvbuf_max,
        autotune,
        jiffy,
        ..base
    };
    match mode {
        TcpRcvbuf::Autotune36 => autotuned(RcvAutotune::Linux36),
        TcpRcvbuf::Autotune44 => autotuned(RcvAutotune::Linux44),
        TcpRcvbuf::Fixed512k => TcpConfig {
            rcvbuf: TCP_RCVBUF_FIXED,
            rcvbuf_max: TCP_RCVBUF_FIXED,
            autotune: RcvAutotune::Off,
            jiffy,
            ..base
        },
    }
}

/// The TCP workload's connection id.
pub(super) const TCP_FLOW: u16 = 1;
/// The SIP B2BUA's flows to the client (UAC) and to the server (UAS).
pub(super) const SIP_UAC_FLOW: u16 = 1;
pub(super) const SIP_UAS_FLOW: u16 = 2;
/// The B2BUA's radiusclient's flow to its RADIUS server.
pub(super) const SIP_RADIUS_FLOW: u16 = 3;

/// A TCP workload: the guest's programs (each serving the connections
/// whose index is its own modulo their number), the peer host's program,
/// the socket options both ends open with, the number of connections and
/// the peer's CPUs.
pub(super) struct TcpWorkload {
    pub(super) guest: Vec<Box<dyn crate::guest::app::App>>,
    pub(super) peer: Box<dyn PeerApp>,
    pub(super) tcp: TcpConfig,
    pub(super) conns: usize,
    pub(super) peer_cpus: usize,
    /// The guest programs wait on their connections with epoll
    /// (`Sys::conns`), however many they have; otherwise the one program
    /// uses its one socket directly (`Sys::tcp`).
    pub(super) epoll: bool,
    /// Connection i's guest program (`owner[i]`); empty: i modulo the
    /// programs.
    pub(super) owner: Vec<usize>,
    /// Program j runs on vCPU j modulo the vCPUs (else all on CPU 0).
    pub(super) spread: bool,
    /// Its equal programs share their CPU fairly (`Kernel::set_fair_share`).
    pub(super) fair: bool,
    /// The guest's sockets listen: the client opens a connection per
    /// request (ApacheBench without keep-alive).
    pub(super) listen: bool,
}

/// A VM's TCP workload.
pub(super) fn tcp_workload(
    w: &crate::scenario::WorkloadSpec,
    seed: u64,
    cal: &Calibration,
) -> Option<TcpWorkload> {
    let g = &cal.guest;
    let syscall = t_ns(&g.syscall_ns);
    if let Some(n) = &w.netpipe {
        // NetPIPE sets TCP_NODELAY.
        let tcp = TcpConfig {
            nagle: false,
            ..TcpConfig::default()
        };
        return Some(TcpWorkload {
            guest: vec![Box::new(NetpipeEcho::new(n.msg_bytes, syscall))],
            peer: Box::new(NetpipeTransmitter::new(n.msg_bytes, syscall)),
            tcp,
            conns: 1,
            peer_cpus: 1,
            epoll: false,
            owner: Vec::new(),
            spread: false,
            fair: false,
            listen: false,
        });
    }
    if let Some(i) = &w.iperf {
        let costs = IperfCosts {
            syscall,
            copy_per_kib: t_ns(&g.copy_per_kib_ns),
        };
        let to_vm = i.direction == IperfDirection::ToVm;
        // The receive buffer is `guest.tcp_rcvbuf`'s (spawn_tcp).
        let tcp = TcpConfig::default();
        return Some(TcpWorkload {
            guest: vec![Box::new(IperfGuest::new(!to_vm, i.len_bytes, costs))],
            peer: Box::new(IperfPeer::new(to_vm, i.len_bytes, costs)),
            tcp,
            conns: 1,
            peer_cpus: 1,
            epoll: false,
            owner: Vec::new(),
            spread: false,
            fair: false,
            listen: false,
        });
    }
    if let Some(m) = &w.memcached {
        let shape = es2::memcached_shape(m);
        let conns = m.connections as usize;
        let threads = m.threads as usize;
        let costs = (
            t_ns(&g.memcached_get_ns),
            t_ns(&g.memcached_set_ns),
            syscall,
        );
        // The client sets TCP_NODELAY (the paper: Nagle off).
        let tcp = TcpConfig {
            nagle: false,
            ..TcpConfig::default()
        };
        return Some(TcpWorkload {
            guest: (0..threads)
                .map(|t| {
                    Box::new(MemcachedWorker::new(
                        shape, seed, t, threads, conns, TCP_FLOW, costs,
                    )) as Box<dyn crate::guest::app::App>
                })
                .collect(),
            peer: es2::memcached_client(m, shape, seed, syscall),
            tcp,
            conns,
            peer_cpus: m.client_threads as usize,
            epoll: true,
            owner: Vec::new(),
            // memcached -t N: its worker threads spread over the vCPUs.
            spread: true,
            fair: m.client == crate::scenario::MemcachedClientKind::Memaslap,
            listen: false,
        });
    }
    es2::tcp_workload(w, cal)
}

/// The peer's side of a TCP workload: its program, socket options,
/// connections and CPUs.
pub(super) type PeerSide = (Box<dyn PeerApp>, TcpConfig, usize, usize);

/// Spawns a TCP workload's programs in `kernel` with their sockets (flows
/// from [`TCP_FLOW`]); program i runs on CPU `(first_cpu + i) % cpus` (a
/// multi-threaded server spreads its threads over the vCPUs). Returns the
/// peer's side.
pub(super) fn spawn_tcp(
    kernel: &mut Kernel,
    w: TcpWorkload,
    first_cpu: usize,
    gso: Gso,
    rcvbuf: (crate::scenario::TcpRcvbuf, u32),
) -> PeerSide {
    let threads = w.guest.len();
    // Each end's TSO/GSO is its own host's setting; both ends size their
    // receive buffers as `guest.tcp_rcvbuf` says (the peer host runs the
    // same Linux: a named assumption).
    let tcp = rcvbuf_config(w.tcp, rcvbuf.0, rcvbuf.1);
    let guest_tcp = TcpConfig {
        gso: gso.guest,
        ..tcp
    };
    let peer_tcp = TcpConfig {
        gso: gso.peer,
        ..tcp
    };
    // The socket interface is the program's, not a matter of how many
    // connections it has (one memcached connection is still served from
    // the worker's epoll loop).
    let cpus = kernel.cpus();
    let cpu = |j: usize| {
        if w.spread {
            (first_cpu + j) % cpus
        } else {
            first_cpu
        }
    };
    if w.fair {
        kernel.set_fair_share();
    }
    if !w.epoll {
        // One socket each: program j's is flow TCP_FLOW + j.
        for (j, app) in w.guest.into_iter().enumerate() {
            let t = kernel.spawn_on(cpu(j), app, 0, false);
            let s = kernel.tcp_open(TCP_FLOW + j as u16, guest_tcp, Some(t));
            if w.listen {
                kernel.tcp_listen(s);
            }
        }
    } else {
        for (j, app) in w.guest.into_iter().enumerate() {
            let t = kernel.spawn_on(cpu(j), app, 0, false);
            let owner = &w.owner;
            let flows = (0..w.conns)
                .filter(|&i| owner.get(i).map_or(i % threads == j, |&o| o == j))
                .map(|i| TCP_FLOW + i as u16);
            for s in kernel.tcp_open_many(flows, guest_tcp, t) {
                if w.listen {
                    kernel.tcp_listen(s);
                }
            }
        }
    }
    (w.peer, peer_tcp, w.conns, w.peer_cpus)
}

/// Which ends of a TCP workload send TSO/GSO packets.
#[derive(Clone, Copy, Debug)]
pub(super) struct Gso {
    /// The guest (`guest.gso`).
    pub(super) guest: bool,
    /// The peer host (`net.peer_gso`).
    pub(super) peer: bool,
}
