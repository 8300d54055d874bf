//! The platform: builds a machine, hypervisor, guests and workloads from a
//! scenario, and runs the event loop that moves cores between guest mode,
//! VM exits and VM entries. This is where the hardware decides, from VMCS
//! controls and LAPIC state, whether a guest action or an interrupt exits.

mod blk;
pub mod event;
mod net;
mod sched;
mod vectors;
mod workloads;

use crate::calibration::Calibration;
use crate::check::Checker;
use crate::engine::{from_ns, from_s, from_us, EventQueue, RngStream, Summary, Time, MS, SEC};
use crate::guest::app::Metrics;
use crate::guest::blk::VirtioBlkGuest;
use crate::guest::itr::{ItrDriver, ItrParams};
use crate::guest::net::{Devices, VirtioNetGuest};
use crate::guest::tcp::{Tcp, TcpConfig};
use crate::guest::{Action, GuestConfig, GuestCosts, Instr, Kernel, VfReg};
use crate::hv::exits::ExitInfo;
use crate::hv::host::{HostKernel, HostTimer, HOST_DEVICE_VECTOR_BASE, HOST_TIMER_VECTOR};
use crate::hv::scheme::{self, Scheme};
use crate::hv::vhost::{VhostCosts, VhostNet, VhostWorker};
use crate::hv::{HvCosts, HvCx, HvState, VcpuState, VfAssignment, VmState};
use crate::hw::virtio_blk::VirtioBlkDev;
use crate::hw::virtio_net::VirtioNetDev;
use crate::hw::x86::core::CoreMode;
use crate::hw::x86::idt::NP_VECTOR;
use crate::hw::x86::iommu::Remapped;
use crate::hw::x86::lapic::{decode_icr, msr, ApicClocks, DeliveryMode, Ipi, IpiDest};
use crate::hw::x86::nic::{IrqAction, Link, Nic, NicConfig, RxPacket};
use crate::hw::x86::vmcs::{ApicMmioOutcome, WrmsrOutcome};
use crate::hw::x86::Machine;
use crate::report::trace::{Trace, TraceKind};
use crate::scenario::{IperfDirection, ItrMode, NetDevice, Scenario};
use crate::workloads::burn::Burn;
use crate::workloads::cyclictest::Cyclictest;
use crate::workloads::fio::Fio;
use crate::workloads::iperf::{IperfCosts, IperfGuest, IperfPeer};
use crate::workloads::memcached::MemcachedWorker;
use crate::workloads::netpipe::{NetpipeEcho, NetpipeTransmitter};
use crate::workloads::peer::{PeerApp, PeerCosts, PeerHost};
use crate::workloads::sip::{B2buaCosts, CallPattern, SipB2bua, SipUac, SipUas};
use crate::workloads::udp::{UdpReceiver, UdpSender};
use crate::workloads::whileloop::WhileLoop;
use event::{schedule_apic_effect, Ev};

/// The port the background device-emulation exits write: a device QEMU
/// emulates in user space (no ioeventfd behind it).
pub const EMULATED_DEVICE_PORT: u16 = 0x0CF8;

/// The guest's MSI-X vectors for its virtio-net RX and TX queues.
pub const VIRTIO_NET_VECTORS: [u8; 2] = [0x51, 0x52];

/// The virtio-net device's notify port (queue q at port + q).
pub const VIRTIO_NOTIFY_PORT: u16 = 0xC050;

/// The guest's MSI-X vector for its virtio-blk request queue.
pub const VIRTIO_BLK_VECTOR: u8 = 0x53;

/// The virtio-blk device's notify port.
pub const VIRTIO_BLK_NOTIFY_PORT: u16 = 0xC090;

/// The ioeventfd of virtio-blk device `d`'s request queue (virtio-net
/// device d's are 2d and 2d + 1, far below).
fn blk_kick_fd(d: usize) -> u16 {
    0x8000 + d as u16
}

/// The ioeventfds of virtio-net device `d`'s RX and TX queues.
fn net_kick_fds(d: usize) -> [u16; 2] {
    [2 * d as u16, 2 * d as u16 + 1]
}

/// Linux 3.x `tcp_rmem[1]`: a socket's initial receive buffer.
const TCP_RMEM_DEFAULT: u32 = 512 * 1024;

/// The TCP workload's connection id.
const TCP_FLOW: u16 = 1;
/// The SIP B2BUA's flows to the client (UAC) and to the server (UAS).
const SIP_UAC_FLOW: u16 = 1;
const SIP_UAS_FLOW: u16 = 2;

/// A TCP workload: the guest's programs (each serving the connections
/// whose index is its own modulo their number), the peer host's program,
/// the socket options both ends open with, the number of connections and
/// the peer's CPUs.
struct TcpWorkload {
    guest: Vec<Box<dyn crate::guest::app::App>>,
    peer: Box<dyn PeerApp>,
    tcp: TcpConfig,
    conns: usize,
    peer_cpus: usize,
    /// The guest programs wait on their connections with epoll
    /// (`Sys::conns`), however many they have; otherwise the one program
    /// uses its one socket directly (`Sys::tcp`).
    epoll: bool,
    /// Connection i's guest program (`owner[i]`); empty: i modulo the
    /// programs.
    owner: Vec<usize>,
    /// Program j runs on vCPU j modulo the vCPUs (else all on CPU 0).
    spread: bool,
    /// Its equal programs share their CPU fairly (`Kernel::set_fair_share`).
    fair: bool,
}

/// A VM's TCP workload.
fn tcp_workload(
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
        });
    }
    if let Some(i) = &w.iperf {
        let costs = IperfCosts {
            syscall,
            copy_per_kib: t_ns(&g.copy_per_kib_ns),
        };
        let to_vm = i.direction == IperfDirection::ToVm;
        // Receive-buffer autotuning is not modelled (see iperf.toml).
        let tcp = TcpConfig {
            rcvbuf: TCP_RMEM_DEFAULT,
            ..TcpConfig::default()
        };
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
        });
    }
    if let Some(m) = &w.memcached {
        let shape = workloads::memcached_shape(m);
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
            rcvbuf: TCP_RMEM_DEFAULT,
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
            peer: workloads::memcached_client(m, shape, seed, syscall),
            tcp,
            conns,
            peer_cpus: m.client_threads as usize,
            epoll: true,
            owner: Vec::new(),
            // memcached -t N: its worker threads spread over the vCPUs.
            spread: true,
            fair: m.client == crate::scenario::MemcachedClientKind::Memaslap,
        });
    }
    workloads::tcp_workload(w, cal)
}

/// Priority of in-guest CPU burners: below every workload task (the UDP
/// receiver runs at -20).
const BURN_PRIO: i32 = -40;

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
    stop_on_task_exit: bool,
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

/// A VM's timer and CPU tasks: cyclictest at the highest priority, a
/// WhileLoop at normal priority. VM 0's cyclictest phase stream keeps its
/// single-VM name.
fn spawn_timer_and_cpu_tasks(
    kernel: &mut Kernel,
    cpu: usize,
    w: &crate::scenario::WorkloadSpec,
    s: &Scenario,
    vm: usize,
    loop_ends_run: bool,
    cal: &Calibration,
) -> Result<(), BuildError> {
    let g = &cal.guest;
    if let Some(c) = &w.cyclictest {
        let stream = if vm == 0 {
            "cyclictest-phase".to_string()
        } else {
            format!("cyclictest-phase.vm{vm}")
        };
        kernel.spawn_on(
            cpu,
            Box::new(Cyclictest::new(
                from_us(c.interval_us),
                from_s(RngStream::new(s.seed, &stream).uniform() * c.interval_us * 1e-6),
                t_ns(&g.syscall_ns),
                t_ns(&g.cyclictest_loop_ns),
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
                "workload.whileloop.iterations: {} iterations need {} s of CPU, which ends \
                 within warmup_s = {} s and leaves nothing to measure; lower warmup_s or \
                 raise the iterations",
                l.iterations,
                crate::engine::as_s(lp.work()),
                s.warmup_s
            )));
        }
        kernel.spawn_on(cpu, Box::new(lp), 0, false);
    }
    Ok(())
}

/// The peer's side of a TCP workload: its program, socket options,
/// connections and CPUs.
type PeerSide = (Box<dyn PeerApp>, TcpConfig, usize, usize);

/// Spawns a TCP workload's programs in `kernel` with their sockets (flows
/// from [`TCP_FLOW`]); program i runs on CPU `(first_cpu + i) % cpus` (a
/// multi-threaded server spreads its threads over the vCPUs). Returns the
/// peer's side.
fn spawn_tcp(kernel: &mut Kernel, w: TcpWorkload, first_cpu: usize, gso: Gso) -> PeerSide {
    let threads = w.guest.len();
    // Each end's TSO/GSO is its own host's setting.
    let guest_tcp = TcpConfig {
        gso: gso.guest,
        ..w.tcp
    };
    let peer_tcp = TcpConfig {
        gso: gso.peer,
        ..w.tcp
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
            kernel.tcp_open(TCP_FLOW + j as u16, guest_tcp, Some(t));
        }
    } else {
        for (j, app) in w.guest.into_iter().enumerate() {
            let t = kernel.spawn_on(cpu(j), app, 0, false);
            let owner = &w.owner;
            let flows = (0..w.conns)
                .filter(|&i| owner.get(i).map_or(i % threads == j, |&o| o == j))
                .map(|i| TCP_FLOW + i as u16);
            kernel.tcp_open_many(flows, guest_tcp, t);
        }
    }
    (w.peer, peer_tcp, w.conns, w.peer_cpus)
}

/// Which ends of a TCP workload send TSO/GSO packets.
#[derive(Clone, Copy, Debug)]
struct Gso {
    /// The guest (`guest.gso`).
    guest: bool,
    /// The peer host (`net.peer_gso`).
    peer: bool,
}

/// The UDP receiver: "sender and receiver at the lowest priority" (DID §5.2).
fn spawn_udp_receiver(kernel: &mut Kernel, cpu: usize, cal: &Calibration) {
    kernel.spawn_on(
        cpu,
        Box::new(UdpReceiver::new(t_ns(&cal.guest.udp_recv_per_packet_ns))),
        -20,
        true,
    );
}

/// The guest's view of its virtio-blk device, if the VM has one
/// (`dev`) and a Fio job drives it.
fn virtio_blk_guest(
    w: &crate::scenario::WorkloadSpec,
    dev: Option<usize>,
) -> Option<VirtioBlkGuest> {
    let f = w.fio.as_ref()?;
    dev?;
    Some(VirtioBlkGuest {
        vector: VIRTIO_BLK_VECTOR,
        notify_port: VIRTIO_BLK_NOTIFY_PORT,
        guard: from_us(f.guard_ms * 1000.0),
    })
}

impl World {
    /// Gives VM `vm` (kernel `kernel`) virtio-blk device `d` and the Fio
    /// job on vCPU `cpu` that drives it: the request queue in guest
    /// memory and an ioeventfd for its notify port.
    #[allow(clippy::too_many_arguments)]
    fn add_fio(
        m: &mut Machine,
        hv: &mut HvState,
        kernel: &mut Kernel,
        s: &Scenario,
        cal: &Calibration,
        vm: usize,
        d: usize,
        f: &crate::scenario::FioSpec,
        seed: u64,
        cpu: usize,
    ) -> Result<(), BuildError> {
        let job = Fio::new(
            seed,
            f.block_bytes,
            f.read_pct / 100.0,
            f.disk_bytes,
            t_ns(&cal.guest.syscall_ns),
        );
        let t = kernel.spawn_on(cpu, Box::new(job), 0, false);
        kernel.attach_blk(t);
        let dev = VirtioBlkDev::new(128, s.net.event_idx, VIRTIO_BLK_NOTIFY_PORT)
            .map_err(|e| BuildError::Scenario(e.to_string()))?;
        debug_assert_eq!(m.virtio_blk.len(), d, "devices numbered in VM order");
        m.virtio_blk.push(dev);
        // KVM_IOEVENTFD for the request queue's notify port.
        hv.ioeventfds
            .push((vm, VIRTIO_BLK_NOTIFY_PORT, blk_kick_fd(d)));
        Ok(())
    }

    /// Gives VM `vm` (kernel `kernel`) virtio-net device `d`: its queues in
    /// guest memory, filled by the driver's probe, and an ioeventfd for
    /// each queue's notify port.
    fn add_virtio_net(
        m: &mut Machine,
        hv: &mut HvState,
        kernel: &mut Kernel,
        s: &Scenario,
        vm: usize,
        d: usize,
    ) -> Result<(), BuildError> {
        let dev = VirtioNetDev::new(s.net.queue_size, s.net.event_idx, VIRTIO_NOTIFY_PORT)
            .map_err(|e| BuildError::Scenario(e.to_string()))?;
        debug_assert_eq!(m.virtio_net.len(), d, "devices numbered in VM order");
        m.virtio_net.push(dev);
        // virtnet_probe: fill the RX ring, TX interrupts off.
        kernel.virtio_net_probe(&mut m.virtio_net[d]);
        // KVM_IOEVENTFD for each queue's notify port.
        let fds = net_kick_fds(d);
        hv.ioeventfds.push((vm, VIRTIO_NOTIFY_PORT, fds[0]));
        hv.ioeventfds.push((vm, VIRTIO_NOTIFY_PORT + 1, fds[1]));
        Ok(())
    }

    /// The vhost back ends of the virtio-net devices and their worker
    /// threads: one per device (stock), or ES2's joint threads of
    /// `combining_level` devices; worker w pinned to `io_cores[w % len]`.
    fn pv_path(
        s: &Scenario,
        cal: &Calibration,
        net_dev_of_vm: &[Option<usize>],
        vcpu_cores_mask: u64,
    ) -> Result<net::PvPath, BuildError> {
        let v = &cal.vhost;
        let es2 = s.hv.es2();
        let per = es2.devices_per_worker();
        let devs: Vec<(usize, usize)> = net_dev_of_vm
            .iter()
            .enumerate()
            .filter_map(|(vm, d)| d.map(|d| (vm, d)))
            .collect();
        let nworkers = devs.len().div_ceil(per);
        let io_cores = if s.host.io_cores.is_empty() {
            // A host core of its own: the first from 2 up that no vCPU
            // may run on (core 0 is the host's, core 1 the usual VM core).
            let cores = s.machine.cores;
            vec![(2..cores)
                .find(|c| vcpu_cores_mask & (1 << c) == 0)
                .unwrap_or(0)]
        } else {
            s.host.io_cores.clone()
        };
        let tap = v.tap_queue_frames.value as usize;
        Ok(net::PvPath {
            devs: devs
                .iter()
                .map(|&(vm, d)| VhostNet::new(vm, d, d / per, net_kick_fds(d), tap))
                .collect(),
            vectors: vec![VIRTIO_NET_VECTORS; devs.len()],
            workers: (0..nworkers)
                .map(|w| VhostWorker::new(io_cores[w % io_cores.len()], es2.vhost_policy()))
                .collect(),
            threads: vec![
                net::IoThread {
                    on_cpu: true,
                    ..Default::default()
                };
                nworkers
            ],
            costs: VhostCosts {
                wakeup: t_us(&v.wakeup_us),
                tx_per_frame: t_ns(&v.tx_per_frame_ns),
                rx_per_frame: t_ns(&v.rx_per_frame_ns),
                copy_per_kib: t_ns(&v.copy_per_kib_ns),
                signal: t_ns(&v.signal_ns),
                poll_iteration: t_ns(&v.poll_iteration_ns),
            },
            nap: from_us(es2.sleep_us),
            side_core: false,
        })
    }

    /// Builds the world a scenario describes.
    pub fn build(s: &Scenario, cal: &Calibration) -> Result<World, BuildError> {
        let scheme = scheme::by_name_with(&s.scheme, &s.hv)
            .ok_or_else(|| BuildError::Scenario(format!("unknown scheme {}", s.scheme)))?;
        Self::build_with(s, cal, scheme)
    }

    /// Builds the world a scenario describes with a scheme of the caller's
    /// (a design under study, written outside this crate); the scenario's
    /// `scheme` key only has to name a known scheme.
    pub fn build_with(
        s: &Scenario,
        cal: &Calibration,
        mut scheme: Box<dyn Scheme>,
    ) -> Result<World, BuildError> {
        // A calibration built in code has not been through from_toml.
        cal.check()?;
        let virtualized = scheme.virtualized();
        let cores = s.machine.cores;
        let views = s.vm_views();
        let nvm = views.len();
        if !virtualized && nvm > 1 {
            return Err(BuildError::Scenario(format!(
                "scheme {}: several VMs need a hypervisor",
                scheme.name()
            )));
        }
        // VM 0 carries the paravirtual devices and peers (several-VM
        // scenarios are limited to VF, timer and CPU workloads).
        let w0 = views[0].workload;
        let vm_core = views[0].core;
        let bus_period_ps = (1e6 / cal.apic.bus_mhz.value).round() as u64;
        let clocks = ApicClocks {
            bus_period_ps,
            tsc_hz: (cal.cpu.ghz.value * 1e9) as u64,
        };
        let apic_timer_period = bus_period_ps * 16;
        let itr = ItrParams {
            lowest_reg: cal.nic.itr_lowest_reg.value as u32,
            low_reg: cal.nic.itr_low_reg.value as u32,
            bulk_reg: cal.nic.itr_bulk_reg.value as u32,
            low_threshold: cal.nic.itr_low_threshold_bytes_per_us.value as u64,
            bulk_threshold: cal.nic.itr_bulk_threshold_bytes_per_us.value as u64,
            driver: match s.nic.itr {
                ItrMode::Ixgbevf36 => ItrDriver::Ixgbevf36,
                ItrMode::Dynamic => ItrDriver::Adaptive,
                ItrMode::Off | ItrMode::Fixed => ItrDriver::Static,
            },
        };
        let itr_unit_ps = from_us(cal.nic.itr_unit_us.value);
        let initial_eitr = match s.nic.itr {
            ItrMode::Ixgbevf36 | ItrMode::Dynamic => itr.low_reg,
            ItrMode::Off => 0,
            ItrMode::Fixed => {
                // The EITR interval field is 9 bits (bits 11:3) of
                // itr_unit_us each.
                let units = (s.nic.itr_interval_us * 1e6 / itr_unit_ps as f64).round();
                if units > 511.0 {
                    return Err(BuildError::Scenario(format!(
                        "nic.itr_interval_us = {} exceeds the EITR field: at most {} us with this calibration's nic.itr_unit_us",
                        s.nic.itr_interval_us,
                        511.0 * cal.nic.itr_unit_us.value
                    )));
                }
                (units as u32).max(1) << 3
            }
        };
        // One VF per VM, each its own PCIe function.
        let requester_ids: Vec<u16> = (0..nvm as u16).map(|i| 0x0110 + i).collect();
        let nic = Nic::new(
            NicConfig {
                vfs: nvm as u16,
                rx_ring_size: cal.nic.rx_ring_size.value as u16,
                vectors_per_vf: 2,
                itr_unit_ps,
                initial_eitr,
            },
            &requester_ids,
        )
        .map_err(|e| BuildError::Scenario(e.to_string()))?;
        let link = Link {
            bits_per_sec: (cal.nic.link_gbps.value * 1e9) as u64,
            propagation_ps: 500_000,
        };
        // Every vCPU, VM by VM: (VM, index in the VM, core).
        let vcpu_list: Vec<(usize, usize, usize)> = views
            .iter()
            .enumerate()
            .flat_map(|(i, v)| v.cores.iter().enumerate().map(move |(j, &c)| (i, j, c)))
            .collect();
        let nvcpu = vcpu_list.len();
        // The cores each vCPU may run on, and all of them.
        let vcpu_allowed: Vec<u64> = views
            .iter()
            .flat_map(|v| v.allowed.iter().copied())
            .collect();
        let vcpu_cores_mask = vcpu_allowed.iter().fold(0u64, |m, &a| m | a);
        if !virtualized && vcpu_allowed.iter().any(|a| a.count_ones() > 1) {
            return Err(BuildError::Scenario(format!(
                "scheme {}: allowed_cores needs a hypervisor (bare metal runs its kernel on its core)",
                scheme.name()
            )));
        }
        if !virtualized && nvcpu > 1 {
            return Err(BuildError::Scenario(format!(
                "scheme {}: SMP guests on bare metal are not modelled",
                scheme.name()
            )));
        }
        let vm_vcpus: Vec<Vec<usize>> = (0..nvm)
            .map(|i| (0..nvcpu).filter(|&k| vcpu_list[k].0 == i).collect())
            .collect();
        let mut m = Machine::new(cores, nvcpu, clocks, nic, link);
        // Each VM's peers use `net.device`; UDP PacketGen always comes
        // through the VF.
        let vm_has_vf = |w: &crate::scenario::WorkloadSpec| {
            w.udp.is_some() || (w.peers() && s.net.device == NetDevice::Vf)
        };
        let vm_has_virtio = |w: &crate::scenario::WorkloadSpec| {
            virtualized && s.net.device == NetDevice::Virtio && w.peers()
        };
        // VM i's virtio-blk device, if its workload runs Fio: devices
        // numbered in VM order.
        let mut blk_dev_of_vm: Vec<Option<usize>> = Vec::with_capacity(nvm);
        for v in &views {
            let next = blk_dev_of_vm.iter().flatten().count();
            blk_dev_of_vm.push((virtualized && v.workload.fio.is_some()).then_some(next));
        }
        // VM i's virtio-net device, if it has one: devices numbered in VM
        // order.
        let mut net_dev_of_vm: Vec<Option<usize>> = Vec::with_capacity(nvm);
        for v in &views {
            let next = net_dev_of_vm.iter().flatten().count();
            net_dev_of_vm.push(vm_has_virtio(v.workload).then_some(next));
        }
        let has_virtio = net_dev_of_vm.iter().any(|d| d.is_some());
        // VM i's VF is VF i, its queue vector's IRT entry i.
        let mut vfs = Vec::with_capacity(nvm);
        for (i, v) in views.iter().enumerate() {
            // The guest's vectors must be distinct: fixed ones first, so a
            // collision names the key that moved.
            let mut guest_vectors = Vec::with_capacity(5);
            if net_dev_of_vm[i].is_some() {
                guest_vectors.push(("the virtio-net RX queue", VIRTIO_NET_VECTORS[0]));
                guest_vectors.push(("the virtio-net TX queue", VIRTIO_NET_VECTORS[1]));
            }
            if blk_dev_of_vm[i].is_some() {
                guest_vectors.push(("the virtio-blk request queue", VIRTIO_BLK_VECTOR));
            }
            guest_vectors.push(("guest.timer_vector", s.guest.timer_vector));
            if v.cores.len() > 1 {
                guest_vectors.push((
                    "the guest's RESCHEDULE_VECTOR (SMP)",
                    crate::guest::RESCHEDULE_VECTOR,
                ));
            }
            if !v.rps_cpus.is_empty() {
                guest_vectors.push((
                    "the guest's CALL_FUNCTION_SINGLE_VECTOR (RPS)",
                    crate::guest::rps::CALL_FUNCTION_SINGLE_VECTOR,
                ));
            }
            if vm_has_vf(v.workload) {
                guest_vectors.push(("guest.vf_vector", s.guest.vf_vector));
            }
            vectors::check_guest_vectors(&guest_vectors)?;
            let a = vm_has_vf(v.workload).then_some(VfAssignment {
                vf: i as u16,
                irte: i as u16,
                guest_vector: s.guest.vf_vector,
                host_vector: HOST_DEVICE_VECTOR_BASE + i as u8,
                requester_id: requester_ids[i],
            });
            if a.is_some() {
                m.nic
                    .program_msix(i as u16, 0, i as u16)
                    .map_err(|e| BuildError::Scenario(e.to_string()))?;
            }
            vfs.push(a);
        }
        let costs = HvCosts {
            roundtrip: t_us(&cal.vmx.exit_entry_roundtrip_us),
            external_interrupt: t_us(&cal.exit.external_interrupt_us),
            msr_write_eoi: t_us(&cal.exit.msr_write_eoi_us),
            msr_write_tmict: t_us(&cal.exit.msr_write_tmict_us),
            msr_write_other: t_us(&cal.exit.msr_write_other_us),
            io_instruction_mean: t_us(&cal.exit.io_instruction_us),
            io_instruction_ioeventfd: t_us(&cal.exit.io_instruction_ioeventfd_us),
            ept_violation_mean: t_us(&cal.exit.ept_violation_us),
            pending_interrupt: t_us(&cal.exit.pending_interrupt_us),
            exception_np: t_us(&cal.exit.exception_np_us),
            nmi: t_us(&cal.exit.nmi_us),
            tick_handler: t_us(&cal.host.tick_handler_us),
            hrtimer_interrupt: t_us(&cal.host.hrtimer_interrupt_us),
            kvm_timer_fn: t_us(&cal.host.kvm_timer_fn_us),
            irq_handler: t_us(&cal.host.irq_handler_us),
            ipi_latency: t_us(&cal.host.ipi_latency_us),
            self_ipi: t_us(&cal.host.self_ipi_us),
            irt_update: t_us(&cal.host.irt_update_us),
            call_function: t_us(&cal.host.call_function_us),
            hlt: t_us(&cal.exit.hlt_us),
            vcpu_wakeup: t_us(&cal.host.vcpu_wakeup_us),
            apic_access_decode: t_us(&cal.exit.apic_access_decode_us),
            apic_timer_period,
        };
        let hz = cal.host.hz.value.max(1.0);
        let mut hv = HvState {
            vms: (0..nvm)
                .map(|i| VmState {
                    vcpus: vm_vcpus[i].clone(),
                    irq_affinity: views[i]
                        .irq_affinity
                        .iter()
                        .map(|&j| vm_vcpus[i][j])
                        .collect(),
                    msi_lowest_priority: views[i].msi_mode
                        == crate::scenario::MsiMode::LowestPriority,
                    vf: vfs[i],
                    pv_vectors: {
                        let mut v = Vec::new();
                        if net_dev_of_vm[i].is_some() {
                            v.extend(VIRTIO_NET_VECTORS);
                        }
                        if blk_dev_of_vm[i].is_some() {
                            v.push(VIRTIO_BLK_VECTOR);
                        }
                        v
                    },
                    stats: Default::default(),
                    xapic: s.guest.apic == crate::guest::ApicMode::Xapic,
                })
                .collect(),
            vcpus: vcpu_list
                .iter()
                .zip(&vcpu_allowed)
                .map(|(&(vm, index, core), &allowed)| VcpuState {
                    vm,
                    index,
                    core,
                    allowed,
                    vmcs_core: None,
                    vlapic: crate::hv::vlapic::new(clocks),
                    loaded: false,
                    halted: false,
                    arb_prio: 0,
                })
                .collect(),
            last_vcpu: vec![None; cores],
            redirect: (0..nvm)
                .map(|i| {
                    (virtualized && s.hv.es2_redirect)
                        .then(|| crate::hv::es2::Redirect::new(&vm_vcpus[i]))
                })
                .collect(),
            host: HostKernel::new(cores, (SEC as f64 / hz) as Time),
            designated_core: 0,
            ioeventfds: Vec::new(),
        };

        // The guest kernel and its tasks.
        let g = &cal.guest;
        let gcfg = GuestConfig {
            timer_vector: s.guest.timer_vector,
            vf_vector: s.guest.vf_vector,
            vf: vfs[0].map(|a| a.vf),
            hz: s.guest.hz,
            tick: s.guest.tick,
            irq_nesting: s.guest.irq_nesting,
            idle: s.guest.idle,
            apic_timer_period,
            rcvbuf_packets: s.guest.rcvbuf_packets,
            napi_weight: s
                .guest
                .napi_weight
                .unwrap_or(cal.nic.napi_weight.value as u32),
            refill_batch: cal.nic.rx_refill_batch.value as u16,
            netdev_budget: cal.nic.netdev_budget.value as u32,
            gro: s.guest.gro,
            itr,
            costs: GuestCosts {
                irq_entry: t_ns(&g.irq_entry_ns),
                irq_exit: t_ns(&g.irq_exit_ns),
                hrtimer_interrupt: t_ns(&g.hrtimer_interrupt_ns),
                tick_handler: t_ns(&g.tick_handler_ns),
                vf_irq_handler: t_ns(&g.vf_irq_handler_ns),
                napi_poll_base: t_ns(&g.napi_poll_base_ns),
                rx_per_packet: t_ns(&g.rx_per_packet_ns),
                gro_merge: t_ns(&g.gro_merge_ns),
                itr_update: t_ns(&g.itr_update_ns),
                context_switch: t_ns(&g.context_switch_ns),
                syscall: t_ns(&g.syscall_ns),
                tcp_rx_segment: t_ns(&g.tcp_rx_segment_ns),
                tcp_tx_segment: t_ns(&g.tcp_tx_segment_ns),
                udp_tx_datagram: t_ns(&g.udp_tx_datagram_ns),
                virtio_xmit: t_ns(&g.virtio_xmit_ns),
                vf_xmit: t_ns(&g.vf_xmit_ns),
                blk_submit: t_ns(&g.blk_submit_ns),
                blk_complete: t_ns(&g.blk_complete_ns),
                icmp_echo: t_ns(&g.icmp_echo_ns),
                rx_protocol: t_ns(&g.rx_protocol_ns),
                rps_enqueue: t_ns(&g.rps_enqueue_ns),
                call_function_ipi: t_ns(&g.call_function_ipi_ns),
            },
            virtio_blk: virtio_blk_guest(w0, blk_dev_of_vm[0]),
            rps_cpus: views[0].rps_cpus.clone(),
            virtio_net: net_dev_of_vm[0].is_some().then_some(VirtioNetGuest {
                rx_vector: VIRTIO_NET_VECTORS[0],
                tx_vector: VIRTIO_NET_VECTORS[1],
                notify_port: VIRTIO_NOTIFY_PORT,
            }),
        };
        // The other VMs' kernels: the same guest, their own VF,
        // virtio-net and virtio-blk devices.
        let other_cfgs: Vec<GuestConfig> = (1..nvm)
            .map(|i| GuestConfig {
                vf: vfs[i].map(|a| a.vf),
                virtio_blk: virtio_blk_guest(views[i].workload, blk_dev_of_vm[i]),
                rps_cpus: views[i].rps_cpus.clone(),
                virtio_net: if net_dev_of_vm[i].is_some() {
                    gcfg.virtio_net
                } else {
                    None
                },
                ..gcfg.clone()
            })
            .collect();
        let mut kernel = Kernel::smp(gcfg, views[0].cores.len());
        spawn_timer_and_cpu_tasks(&mut kernel, views[0].app_vcpu, w0, s, 0, nvm == 1, cal)?;
        // Each VM's TCP workload (VM 0's over virtio or its VF, the
        // others' over their VFs): its programs and sockets in the guest,
        // its peer's program.
        let mut peer_apps = Vec::new();
        let gso = Gso {
            guest: s.guest.gso,
            peer: s.net.peer_gso,
        };
        if let Some(w) = tcp_workload(w0, s.seed, cal) {
            peer_apps.push((0, spawn_tcp(&mut kernel, w, views[0].app_vcpu, gso)));
        }
        // Datagram workloads' peers: over the link to the VF, or (VM 0
        // over virtio) behind the bridge.
        let link_wire = m.link;
        let wire_of =
            |bridged: bool| move |len: u32| if bridged { 0 } else { link_wire.wire_time(len) };
        let mut dgram_peers = vec![(
            0,
            workloads::spawn_datagram(&mut kernel, w0, cal, wire_of(has_virtio), s.seed, 0),
        )];
        if let (Some(f), Some(d)) = (&w0.fio, blk_dev_of_vm[0]) {
            let cpu = views[0].app_vcpu;
            Self::add_fio(&mut m, &mut hv, &mut kernel, s, cal, 0, d, f, s.seed, cpu)?;
        }
        if let Some(d) = net_dev_of_vm[0] {
            Self::add_virtio_net(&mut m, &mut hv, &mut kernel, s, 0, d)?;
        }
        if let Some(sp) = &w0.sip {
            let costs = B2buaCosts {
                message: t_ns(&g.sip_message_ns),
                auth: t_ns(&g.sip_auth_ns),
                syscall: t_ns(&g.syscall_ns),
            };
            kernel.spawn(
                Box::new(SipB2bua::new(SIP_UAC_FLOW, SIP_UAS_FLOW, sp.calls, costs)),
                0,
                true,
            );
        }
        if w0.udp.is_some() {
            spawn_udp_receiver(&mut kernel, views[0].app_vcpu, cal);
        }
        let mut guests = vec![kernel];
        for (i, cfg) in other_cfgs.into_iter().enumerate() {
            let vm = i + 1;
            let v = &views[vm];
            let mut k = Kernel::smp(cfg, v.cores.len());
            spawn_timer_and_cpu_tasks(&mut k, v.app_vcpu, v.workload, s, vm, false, cal)?;
            // The same programs as VM 0 would run, drawing their own random
            // streams.
            let seed = s.seed ^ (vm as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            if let Some(w) = tcp_workload(v.workload, seed, cal) {
                peer_apps.push((vm, spawn_tcp(&mut k, w, v.app_vcpu, gso)));
            }
            dgram_peers.push((
                vm,
                workloads::spawn_datagram(&mut k, v.workload, cal, wire_of(false), s.seed, vm),
            ));
            if let (Some(f), Some(d)) = (&v.workload.fio, blk_dev_of_vm[vm]) {
                Self::add_fio(&mut m, &mut hv, &mut k, s, cal, vm, d, f, seed, v.app_vcpu)?;
            }
            if v.workload.udp.is_some() {
                spawn_udp_receiver(&mut k, v.app_vcpu, cal);
            }
            if let Some(d) = net_dev_of_vm[vm] {
                Self::add_virtio_net(&mut m, &mut hv, &mut k, s, vm, d)?;
            }
            guests.push(k);
        }
        for (vm, v) in views.iter().enumerate() {
            if v.burn {
                // Below every other task (SCHED_IDLE-like).
                for cpu in 0..v.cores.len() {
                    guests[vm].spawn_on(cpu, Box::new(Burn::new()), BURN_PRIO, false);
                }
            }
        }

        let mut q = EventQueue::with_capacity(4096);
        let mut checker = Checker::with_vcpus(vcpu_list.iter().map(|v| v.0).collect());
        let mut first_on_core: Vec<Option<usize>> = vec![None; cores];
        for (k, v) in vcpu_list.iter().enumerate() {
            first_on_core[v.2].get_or_insert(k);
        }
        checker.early_tolerance = apic_timer_period * 2;

        // Host boot: LAPIC timers of every core serve host hrtimers; the
        // scheduler tick runs where a vCPU thread runs.
        {
            let mut cx = HvCx {
                now: 0,
                m: &mut m,
                hv: &mut hv,
                q: &mut q,
                guests: &guests,
                costs: &costs,
                charged: 0,
            };
            if virtualized {
                for c in 0..cores {
                    cx.apic_write(c, msr::LVT_TIMER, HOST_TIMER_VECTOR as u64);
                    cx.apic_write(c, msr::TDCR, 0b0011);
                }
                let p = cx.hv.host.tick_period;
                for c in 0..cores {
                    if vcpu_cores_mask & (1 << c) != 0 {
                        cx.host_timer_start(c, p, HostTimer::Tick { core: c });
                    }
                }
            }
            for vm in 0..nvm {
                scheme.setup_vm(&mut cx, vm);
            }
            // The first vCPU pinned to each core starts there; the others
            // wait in the host scheduler's run queue.
            for (c, first) in first_on_core.iter().enumerate() {
                if let Some(v) = *first {
                    cx.hv.sched_in(v);
                    scheme.vcpu_load(&mut cx, v);
                    cx.hv.vcpus[v].vmcs_core = Some(c);
                    cx.hv.last_vcpu[c] = Some(v);
                }
            }
        }
        for (c, first) in first_on_core.iter().enumerate() {
            if let Some(v) = *first {
                m.cores[c].mode = if virtualized {
                    CoreMode::Guest { vcpu: v }
                } else {
                    CoreMode::Native { kernel: v }
                };
            }
        }
        for (k, v) in vcpu_list.iter().enumerate() {
            if first_on_core[v.2] != Some(k) {
                checker.set_running(k, false, 0);
            }
        }

        let clients: Vec<Option<UdpSender>> = views
            .iter()
            .map(|v| {
                v.workload
                    .udp
                    .as_ref()
                    .map(|u| UdpSender::new(u.rate_pps, u.payload_bytes))
            })
            .collect();
        for (vm, c) in clients.iter().enumerate() {
            if c.is_some() {
                q.schedule(0, Ev::ClientTx { vm: vm as u16 });
            }
        }
        let bg_on = virtualized && s.background.enabled;
        let bg_rate = if bg_on {
            [
                cal.background.io_instruction_per_s.value,
                cal.background.ept_violation_per_s.value,
            ]
        } else {
            [0.0, 0.0]
        };
        // One background stream per VM (the paper's rates are an idle
        // VM's), on its first vCPU; VM 0's keeps its single-VM name.
        let mut rng_bg: Vec<RngStream> = vcpu_list
            .iter()
            .map(|&(i, j, _)| match (i, j) {
                (0, 0) => RngStream::new(s.seed, "background"),
                (i, 0) => RngStream::new(s.seed, &format!("background.vm{i}")),
                (i, j) => RngStream::new(s.seed, &format!("background.vm{i}.cpu{j}")),
            })
            .collect();
        for (vcpu, rng) in rng_bg.iter_mut().enumerate() {
            if vcpu_list[vcpu].1 != 0 {
                continue;
            }
            for (k, r) in bg_rate.iter().enumerate() {
                if *r > 0.0 {
                    let dt = from_s(rng.exponential(1.0 / r));
                    q.schedule(
                        dt,
                        Ev::Background {
                            vcpu: vcpu as u16,
                            kind: k as u8,
                        },
                    );
                }
            }
        }
        let warm = from_s(s.warmup_s);
        q.schedule(warm, Ev::WarmupEnd);
        if virtualized {
            for (at_ms, for_ms) in s.preemptions.iter().flat_map(|p| p.occurrences()) {
                let at = from_us(at_ms * 1000.0);
                q.schedule_async(at, Ev::Deschedule { vcpu: 0 });
                q.schedule_async(at + from_us(for_ms * 1000.0), Ev::Reschedule { vcpu: 0 });
            }
        }
        if virtualized && s.host.ipi_per_s > 0.0 {
            q.schedule(
                0,
                Ev::HostIpi {
                    core: vm_core as u16,
                },
            );
        }
        let p = &cal.peer;
        let peer_costs = PeerCosts {
            rx_segment: t_ns(&p.rx_segment_ns),
            tx_segment: t_ns(&p.tx_segment_ns),
            wakeup: t_us(&p.wakeup_us),
            udp_rx: t_ns(&p.udp_rx_datagram_ns),
            udp_tx: t_ns(&p.udp_tx_datagram_ns),
        };
        let bridge = t_ns(&p.bridge_ns);
        let mut peers = Vec::new();
        for (vm, (app, tcp, conns, cpus)) in peer_apps {
            let conns = (0..conns)
                .map(|_| Tcp::new(tcp))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| BuildError::Scenario(e.to_string()))?;
            let host = PeerHost::new(conns, TCP_FLOW, app, peer_costs, cpus);
            let attach = if net_dev_of_vm[vm].is_some() {
                match s.net.peer {
                    crate::scenario::VirtioPeer::Host => net::Attach::Bridge { delay: bridge },
                    crate::scenario::VirtioPeer::Remote => net::Attach::Uplink { delay: bridge },
                }
            } else {
                // Each VM's load generator sends to its VF over the link.
                net::Attach::Wire { vf: vm as u16 }
            };
            let mut link = net::PeerLink::new(host, attach);
            link.vm = vm;
            peers.push(link);
        }
        for (vm, list) in dgram_peers {
            for p in list {
                let host = if p.icmp {
                    PeerHost::icmp(p.flow, p.app, peer_costs)
                } else {
                    PeerHost::udp(p.flow, p.app, peer_costs)
                };
                let attach = if has_virtio && vm == 0 {
                    net::Attach::Bridge { delay: bridge }
                } else {
                    net::Attach::Wire { vf: vm as u16 }
                };
                let mut link = net::PeerLink::new(host, attach);
                link.vm = vm;
                peers.push(link);
            }
        }
        if let Some(sp) = &w0.sip {
            // SIPp's UAC on the load generator, its UAS on the VM's host
            // (DID §5.8), each a single-threaded process.
            let msg = t_ns(&p.sipp_message_ns);
            let pattern = CallPattern {
                rate_cps: sp.rate_cps,
                duration: from_s(sp.call_duration_s),
                calls: sp.calls,
            };
            let uac = Box::new(SipUac::new(SIP_UAC_FLOW, pattern, msg));
            let uac = PeerHost::udp(SIP_UAC_FLOW, uac, peer_costs);
            let uas = PeerHost::udp(
                SIP_UAS_FLOW,
                Box::new(SipUas::new(sp.calls, msg)),
                peer_costs,
            );
            let (uac_at, uas_at) = if has_virtio {
                (
                    net::Attach::Uplink { delay: bridge },
                    net::Attach::Bridge { delay: bridge },
                )
            } else {
                let delay = t_us(&cal.nic.veb_loopback_us);
                (
                    net::Attach::Wire { vf: 0 },
                    net::Attach::Veb { vf: 0, delay },
                )
            };
            peers.push(net::PeerLink::new(uac, uac_at));
            peers.push(net::PeerLink::new(uas, uas_at));
        }
        let pv = has_virtio
            .then(|| Self::pv_path(s, cal, &net_dev_of_vm, vcpu_cores_mask))
            .transpose()?
            .map(Box::new);
        // Each VM's QEMU: its own main loop and thread pool.
        let mut blk = Vec::new();
        for (vm, v) in views.iter().enumerate() {
            if let (Some(f), Some(d)) = (&v.workload.fio, blk_dev_of_vm[vm]) {
                debug_assert_eq!(blk.len(), d, "devices numbered in VM order");
                let kick = blk_kick_fd(d);
                blk.push(blk::BlkPath::new(
                    cal,
                    vm,
                    kick,
                    VIRTIO_BLK_VECTOR,
                    f.disk_bytes,
                ));
            }
        }
        let mut w = World {
            q,
            m,
            hv,
            scheme,
            guests,
            checker,
            exits: vec![None; cores],
            bg_pending: vec![0; nvcpu],
            bg_rate,
            rng_bg,
            rng_exit: RngStream::new(s.seed, "exit-service"),
            clients,
            msi_latency: t_us(&cal.nic.msi_latency_us),
            vf_owner: (0..nvm).map(|vm| (vm, s.guest.vf_vector)).collect(),
            timer_due: vec![None; nvcpu],
            timer_exits: Default::default(),
            msi_faults: 0,
            measure_start: warm,
            end: warm + from_s(s.duration_s),
            lost_grace: from_us(s.check.lost_grace_ms * 1000.0),
            costs,
            scenario: s.clone(),
            // A WhileLoop ends a one-VM run; among several VMs it is a
            // CPU-bound guest.
            stop_on_task_exit: nvm == 1 && w0.whileloop.is_some(),
            deschedule_pending: vec![false; nvcpu],
            ptimer_gen: vec![0; cores],
            tsc_hz: clocks.tsc_hz,
            rng_host: RngStream::new(s.seed, "host-ipi"),
            nic_base: vec![Default::default(); nvm],
            pv,
            net_dev_of_vm,
            port_rx_free: 0,
            peers,
            trace: None,
            blk,
            blk_dev_of_vm,
            tx_fetch: t_us(&cal.nic.tx_fetch_us),
            event_log: None,
            sched: None,
            polling: vec![None; nvcpu],
            poll_gen: 0,
            halt_start: vec![0; nvcpu],
        };
        if virtualized {
            for (c, first) in first_on_core.iter().enumerate() {
                if let Some(v) = *first {
                    w.arm_preemption_timer(c, v);
                }
            }
        }
        if let (Some(pv), true) = (&mut w.pv, w.scheme.backend_polls()) {
            // vhost_vq_enable_vqpoll: the workers poll; kicks stay off.
            pv.side_core = true;
            for d in &mut pv.devs {
                d.polling = true;
                let vq = &mut w.m.virtio_net[d.dev];
                vq.tx_disable_notify();
                vq.rx_disable_notify();
            }
        }
        for p in 0..w.peers.len() {
            w.peer_sent(p);
        }
        if virtualized {
            let tick = w.hv.host.tick_period;
            let vcpus: Vec<sched::VcpuThread> = vcpu_list
                .iter()
                .zip(&vcpu_allowed)
                .map(|(&(vm, _, core), &allowed)| sched::VcpuThread { vm, core, allowed })
                .collect();
            let io_cores: Vec<usize> =
                w.pv.as_ref()
                    .map(|pv| pv.workers.iter().map(|k| k.core).collect())
                    .unwrap_or_default();
            w.sched = sched::SchedState::build(s, &vcpus, &io_cores, tick).map(Box::new);
            w.sched_io_threads();
            w.sched_start();
        }
        for (c, first) in first_on_core.iter().enumerate() {
            if first.is_some() {
                w.guest_run(c);
            }
        }
        Ok(w)
    }

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
            if self.stop_on_task_exit && self.guests[0].counters.tasks_exited > 0 {
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
