//! Stage 5, workloads and peers: each VM's programs in its guest kernel
//! (timer and CPU tasks, TCP and datagram workloads, Fio, SIP, the UDP
//! receiver, burners) and the hosts on the other end of its network: the
//! peer host of each connection or flow, attached over the link to its VF
//! or behind the bridge to its virtio-net device, and the UDP load
//! generator.

use super::devices::DeviceMap;
use super::es2;
use super::rng_stream;
use super::tcp::{self, Gso, PeerSide, SIP_RADIUS_FLOW, SIP_UAC_FLOW, SIP_UAS_FLOW, TCP_FLOW};
use super::topology::Topology;
use super::BuildError;
use crate::calibration::Calibration;
use crate::engine::{as_s, from_s, from_us, RngStream, Time};
use crate::guest::tcp::Tcp;
use crate::guest::Kernel;
use crate::hw::x86::nic::Link;
use crate::scenario::{Scenario, VirtioPeer, VmView};
use crate::workloads::burn::Burn;
use crate::workloads::cyclictest::Cyclictest;
use crate::workloads::fio::Fio;
use crate::workloads::peer::{PeerCosts, PeerHost};
use crate::workloads::sip::{B2buaCosts, CallPattern, RadiusServer, SipB2bua, SipUac, SipUas};
use crate::workloads::udp::{UdpReceiver, UdpSender};
use crate::workloads::whileloop::WhileLoop;
use crate::world::{net, t_ns, t_us};

/// Priority of in-guest CPU burners: below every workload task (the UDP
/// receiver runs at -20).
const BURN_PRIO: i32 = -40;

/// What the workloads put outside the guests.
pub(in crate::world) struct Outside {
    /// The peer hosts, in the order their first frames go out.
    pub peers: Vec<net::PeerLink>,
    /// Per VM: its UDP load generator, if it has one.
    pub clients: Vec<Option<UdpSender>>,
    /// The VM whose finite task (a WhileLoop) ends the run when it exits.
    pub ends_run: Option<usize>,
}

/// A VM's timer and CPU tasks: cyclictest at the highest priority, a
/// WhileLoop at normal priority.
fn spawn_timer_and_cpu_tasks(
    kernel: &mut Kernel,
    s: &Scenario,
    cal: &Calibration,
    vm: usize,
    v: &VmView,
    loop_ends_run: bool,
) -> Result<(), BuildError> {
    let (g, w, cpu) = (&cal.guest, v.workload, v.app_vcpu);
    if let Some(c) = &w.cyclictest {
        let phase = RngStream::new(s.seed, &rng_stream("cyclictest-phase", vm)).uniform();
        kernel.spawn_on(
            cpu,
            Box::new({
                let ct = Cyclictest::new(
                    from_us(c.interval_us),
                    from_s(phase * c.interval_us * 1e-6),
                    t_ns(&g.syscall_ns),
                    t_ns(&g.cyclictest_loop_ns),
                );
                match c.mode {
                    crate::scenario::workloads::CyclictestMode::Nanosleep => ct,
                    crate::scenario::workloads::CyclictestMode::PosixTimer => {
                        ct.with_posix_timer(t_ns(&g.posix_timer_signal_ns))
                    }
                }
            }),
            99,
            false,
        );
        if c.main_thread {
            // rt-tests' main thread, a normal task on the same vCPU (the
            // VM has one): a pass is the sleep's return and re-entry and
            // the loop's checks.
            use crate::workloads::cyclictest::{CyclictestMain, MAIN_PERIOD_US, TIMER_SLACK_NS};
            kernel.spawn_on(
                cpu,
                Box::new(CyclictestMain::new(
                    from_us(MAIN_PERIOD_US as f64),
                    TIMER_SLACK_NS * crate::engine::NS,
                    t_ns(&g.syscall_ns) + t_ns(&g.cyclictest_loop_ns),
                )),
                0,
                false,
            );
        }
    }
    // The kernel test modules start at an arbitrary moment relative to
    // the tick, as cyclictest does.
    if let Some(h) = &w.hrtimer_latency {
        let phase = RngStream::new(s.seed, &rng_stream("hrtimer-latency-phase", vm)).uniform();
        let interval = from_us(h.interval_us);
        let first = interval + from_s(phase * h.interval_us * 1e-6);
        kernel.load_hrtimer_latency(cpu, first, interval);
    }
    if let Some(i) = &w.ipi_latency {
        let phase = RngStream::new(s.seed, &rng_stream("ipi-latency-phase", vm)).uniform();
        let interval = from_us(i.interval_us);
        let first = interval + from_s(phase * i.interval_us * 1e-6);
        kernel.load_ipi_latency(0, 1, first, interval);
    }
    if let Some(x) = &w.vmexit {
        // kvm-unit-tests runs its tests as the kernel of CPU 0, from the
        // end of the warm-up.
        kernel.spawn_on(
            0,
            Box::new(crate::workloads::vmexit::Vmexit::new(
                x.tests.clone(),
                x.iterations,
                (cal.cpu.ghz.value * 1e9) as u64,
                from_s(s.warmup_s),
                s.guest.timer_vector,
                s.guest.lapic_timer == crate::scenario::LapicTimer::TscDeadline,
                v.cores.len() > 1,
            )),
            99,
            false,
        );
    }
    if let Some(l) = &w.whileloop {
        let lp = WhileLoop::new(
            l.iterations,
            g.whileloop_cycles_per_iter.value,
            cal.cpu.ghz.value,
        );
        // When the run ends with the loop, the loop needs at least its
        // CPU time: one no longer than the warm-up could end before the
        // measured interval begins (nothing measured).
        if loop_ends_run && lp.work() <= from_s(s.warmup_s) {
            return Err(BuildError::Scenario(format!(
                "{}.whileloop.iterations: {} iterations need {} s of CPU, which ends \
                 within warmup_s = {} s and leaves nothing to measure; lower warmup_s or \
                 raise the iterations",
                v.workload_key,
                l.iterations,
                as_s(lp.work()),
                s.warmup_s
            )));
        }
        kernel.spawn_on(cpu, Box::new(lp), 0, false);
    }
    Ok(())
}

/// The costs of a peer host's stack and its NIC's receive moderation
/// (`net.peer_itr`).
pub(in crate::world) fn peer_costs(s: &Scenario, cal: &Calibration) -> PeerCosts {
    use crate::guest::itr::{ItrDriver, ItrParams};
    use crate::scenario::PeerItr;
    let p = &cal.peer;
    let n = &cal.nic;
    let adaptive = ItrParams {
        lowest_reg: n.itr_lowest_reg.value as u32,
        low_reg: n.itr_low_reg.value as u32,
        bulk_reg: n.itr_bulk_reg.value as u32,
        low_threshold: n.itr_low_threshold_bytes_per_us.value as u64,
        bulk_threshold: n.itr_bulk_threshold_bytes_per_us.value as u64,
        driver: ItrDriver::Adaptive,
    };
    PeerCosts {
        rx_segment: t_ns(&p.rx_segment_ns),
        tx_segment: t_ns(&p.tx_segment_ns),
        wakeup: t_us(&p.wakeup_us),
        udp_rx: t_ns(&p.udp_rx_datagram_ns),
        udp_tx: t_ns(&p.udp_tx_datagram_ns),
        gro_merge: t_ns(&p.gro_merge_ns),
        rx_itr: match s.net.peer_itr {
            PeerItr::Off => 0,
            PeerItr::Fixed | PeerItr::Adaptive => t_us(&p.rx_itr_us),
        },
        rx_adaptive: (s.net.peer_itr == PeerItr::Adaptive)
            .then(|| (adaptive, t_us(&n.itr_unit_us))),
        gro_off: !s.net.peer_gro,
    }
}

/// The peer host's side of VM `vm`'s TCP workload, attached to it.
fn tcp_peer(
    s: &Scenario,
    devs: &DeviceMap,
    vm: usize,
    side: PeerSide,
    costs: PeerCosts,
    bridge: Time,
    veb_delay: Time,
) -> Result<net::PeerLink, BuildError> {
    let (app, tcp, conns, cpus) = side;
    let conns = (0..conns)
        .map(|_| Tcp::new(tcp))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| BuildError::Scenario(e.to_string()))?;
    let host = PeerHost::new(conns, TCP_FLOW, app, costs, cpus);
    let bridged = devs.net_dev[vm].is_some();
    let attach = match (bridged, s.net.vf_peer) {
        // A process on the VM's host reaches the VF through the PF and the
        // NIC's embedded switch (`net.vf_peer = "host"`).
        (false, VirtioPeer::Host) => net::Attach::Veb {
            vf: vm as u16,
            delay: veb_delay,
        },
        _ => peer_attach(s, bridged, vm, bridge),
    };
    Ok(net::PeerLink::new(host, attach, vm))
}

/// Where VM `vm`'s peer host attaches: with virtio-net (`bridged`), a
/// process behind the bridge or (`net.peer = "remote"`) the load generator
/// across the link through the host's NIC and the bridge; without, the
/// load generator sending to the VM's VF over the link.
fn peer_attach(s: &Scenario, bridged: bool, vm: usize, bridge: Time) -> net::Attach {
    match (bridged, s.net.peer) {
        (true, VirtioPeer::Host) => net::Attach::Bridge { delay: bridge },
        // Under kvm-tools' back end the host NIC's receive path, the bridge
        // and the xmit are charged on the host's cores (`world::kvmtool_net`),
        // in place of a fixed bridge delay.
        (true, VirtioPeer::Remote) if s.net.backend == crate::scenario::NetBackend::KvmtoolTap => {
            net::Attach::Uplink { delay: 0 }
        }
        (true, VirtioPeer::Remote) => net::Attach::Uplink { delay: bridge },
        (false, _) => net::Attach::Wire { vf: vm as u16 },
    }
}

/// SIPp's UAC on the load generator and its UAS on the VM's host (DID
/// §5.8), each a single-threaded process, and the B2BUA's RADIUS server
/// where the scenario puts it.
fn sip_peers(
    sp: &crate::scenario::SipSpec,
    cal: &Calibration,
    vm: usize,
    bridged: bool,
    costs: PeerCosts,
    bridge: Time,
) -> Vec<net::PeerLink> {
    let msg = t_ns(&cal.peer.sipp_message_ns);
    let pattern = CallPattern {
        rate_cps: sp.rate_cps,
        duration: from_s(sp.call_duration_s),
        calls: sp.calls,
    };
    let uac = Box::new(SipUac::new(SIP_UAC_FLOW, pattern, msg));
    let uac = PeerHost::udp(SIP_UAC_FLOW, uac, costs);
    let uas = PeerHost::udp(SIP_UAS_FLOW, Box::new(SipUas::new(sp.calls, msg)), costs);
    let vf = vm as u16;
    let (uac_at, uas_at) = if bridged {
        (
            net::Attach::Uplink { delay: bridge },
            net::Attach::Bridge { delay: bridge },
        )
    } else {
        let delay = t_us(&cal.nic.veb_loopback_us);
        (net::Attach::Wire { vf }, net::Attach::Veb { vf, delay })
    };
    let mut peers = vec![
        net::PeerLink::new(uac, uac_at, vm),
        net::PeerLink::new(uas, uas_at, vm),
    ];
    if sp.radius == crate::scenario::SipRadius::LoadGenerator {
        // Beside the UAC: attached as it is.
        let server = RadiusServer::new(t_ns(&cal.peer.radius_request_ns));
        let server = PeerHost::udp(SIP_RADIUS_FLOW, Box::new(server), costs);
        peers.push(net::PeerLink::new(server, uac_at, vm));
    }
    peers
}

/// Spawns every VM's programs in its kernel and builds the hosts on the
/// other end: peers in the order TCP (VM by VM), datagram (VM by VM), SIP.
pub(in crate::world) fn spawn(
    s: &Scenario,
    cal: &Calibration,
    topo: &Topology,
    devs: &DeviceMap,
    link: Link,
    guests: &mut [Kernel],
) -> Result<Outside, BuildError> {
    let g = &cal.guest;
    let p = &cal.peer;
    let peer_costs = peer_costs(s, cal);
    let bridge = t_ns(&p.bridge_ns);
    let gso = Gso {
        guest: s.guest.gso,
        peer: s.net.peer_gso,
    };
    let one_vm = topo.vms() == 1;
    let (mut tcp_peers, mut dgram_peers, mut sip) = (Vec::new(), Vec::new(), Vec::new());
    for (vm, v) in topo.views.iter().enumerate() {
        let kernel = &mut guests[vm];
        let w = v.workload;
        let bridged = devs.net_dev[vm].is_some();
        // A WhileLoop ends a one-VM run; among several VMs it is a
        // CPU-bound guest.
        spawn_timer_and_cpu_tasks(kernel, s, cal, vm, v, one_vm)?;
        // The same programs in every VM, each drawing its own random
        // streams.
        let seed = s.seed ^ (vm as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // Over virtio-vsock netperf's socket is AF_VSOCK (world::vsock).
        let vsock = crate::world::vsock::runs_over_vsock(s, w);
        if let Some(t) = tcp::tcp_workload(w, seed, cal).filter(|_| !vsock) {
            let rcvbuf = (s.guest.tcp_rcvbuf, s.guest.hz);
            let side = tcp::spawn_tcp(kernel, t, v.app_vcpu, gso, rcvbuf);
            let veb = t_us(&cal.nic.veb_loopback_us);
            tcp_peers.push(tcp_peer(s, devs, vm, side, peer_costs, bridge, veb)?);
        }
        // Datagram peers: over the link to the VF; with virtio-net, a
        // process behind the bridge or (`net.peer = "remote"`) the load
        // generator across the link, through the host's NIC and the bridge,
        // as the TCP peers.
        let local = bridged && s.net.peer == VirtioPeer::Host;
        let wire = |len: u32| if local { 0 } else { link.wire_time(len) };
        for d in es2::spawn_datagram(kernel, w, cal, wire, s.seed, vm) {
            let host = if d.icmp {
                PeerHost::icmp(d.flow, d.app, peer_costs)
            } else {
                PeerHost::udp(d.flow, d.app, peer_costs)
            };
            let attach = peer_attach(s, bridged, vm, bridge);
            dgram_peers.push(net::PeerLink::new(host, attach, vm));
        }
        if let (Some(f), Some(_)) = (&w.fio, devs.blk_dev[vm]) {
            let job = Fio::new(
                seed,
                f.block_bytes,
                f.read_pct / 100.0,
                f.disk_bytes,
                // fio's default engine (sync) seeks before each random
                // read/write (fio_syncio_prep's lseek), before the stamp.
                t_ns(&g.fio_io_ns) + t_ns(&g.syscall_ns),
                t_ns(&g.syscall_ns),
            );
            let t = kernel.spawn_on(v.app_vcpu, Box::new(job), 0, false);
            kernel.attach_blk(t);
        }
        if let Some(sp) = &w.sip {
            // Sippy's External_command: a worker thread and a
            // radiusclient process per authentication, each woken through
            // a pipe (two switches out to the process, three back to the
            // reactor), plus the process's own work each way.
            let switch = t_ns(&g.context_switch_ns);
            let client = t_ns(&g.radiusclient_ns);
            let costs = B2buaCosts {
                message: t_ns(&g.sip_message_ns),
                auth: t_ns(&g.sip_auth_ns),
                syscall: t_ns(&g.syscall_ns),
                radius_request: 2 * switch + client,
                radius_reply: 3 * switch + client,
            };
            let b2bua = SipB2bua::new(SIP_UAC_FLOW, SIP_UAS_FLOW, sp.calls, costs);
            let b2bua = match sp.radius {
                crate::scenario::SipRadius::LoadGenerator => b2bua.with_radius(SIP_RADIUS_FLOW),
                crate::scenario::SipRadius::Off => b2bua,
            };
            kernel.spawn(Box::new(b2bua), 0, true);
            sip.extend(sip_peers(sp, cal, vm, bridged, peer_costs, bridge));
        }
        if w.udp.is_some() {
            // "Sender and receiver at the lowest priority" (DID §5.2).
            kernel.spawn_on(
                v.app_vcpu,
                Box::new(UdpReceiver::new(t_ns(&g.udp_recv_per_packet_ns))),
                -20,
                true,
            );
        }
    }
    for (vm, v) in topo.views.iter().enumerate() {
        if v.burn {
            // Below every other task (SCHED_IDLE-like).
            for cpu in 0..v.cores.len() {
                guests[vm].spawn_on(cpu, Box::new(Burn::new()), BURN_PRIO, false);
            }
        }
    }
    let clients = topo
        .views
        .iter()
        .map(|v| {
            v.workload.udp.as_ref().map(|u| {
                // The load generator's sendto path spaces a burst.
                let spacing = t_ns(&cal.peer.udp_tx_datagram_ns);
                UdpSender::bursty(u.rate_pps, u.payload_bytes, u.burst, spacing)
            })
        })
        .collect();
    tcp_peers.append(&mut dgram_peers);
    tcp_peers.append(&mut sip);
    Ok(Outside {
        peers: tcp_peers,
        clients,
        ends_run: topo
            .views
            .iter()
            .position(|v| v.workload.whileloop.is_some())
            .filter(|_| one_vm),
    })
}
