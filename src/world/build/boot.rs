//! Stage 6, power-on: the host boots (LAPIC timers, scheduler ticks), the
//! scheme sets up each VM, the first vCPU on each core is loaded, the
//! run's first events are queued, and every core starts.

use super::devices::DeviceMap;
use super::rng_stream;
use super::topology::Topology;
use super::workloads::Outside;
use crate::calibration::Calibration;
use crate::check::Checker;
use crate::engine::{from_s, from_us, EventQueue, RngStream, Time};
use crate::guest::Kernel;
use crate::hv::host::{HostTimer, HOST_TIMER_VECTOR};
use crate::hv::scheme::Scheme;
use crate::hv::{HvCosts, HvCx, HvState};
use crate::hw::x86::core::CoreMode;
use crate::hw::x86::lapic::msr;
use crate::hw::x86::Machine;
use crate::scenario::Scenario;
use crate::world::event::Ev;
use crate::world::{blk, net, sched, t_us, World};

/// Everything the earlier stages built.
pub(in crate::world) struct Parts<'s> {
    pub topo: Topology<'s>,
    pub m: Machine,
    pub devs: DeviceMap,
    pub hv: HvState,
    pub costs: HvCosts,
    pub guests: Vec<Kernel>,
    pub outside: Outside,
    pub pv: Option<net::PvPath>,
    pub kvmtool: Option<crate::world::kvmtool_net::KvmtoolPath>,
    pub blk: Vec<blk::BlkPath>,
    pub canal: Option<crate::world::vcanal::CanalPath>,
    pub vsock: Option<crate::world::vsock::VsockPath>,
}

/// The host's boot: every core's LAPIC timer serves host hrtimers, and
/// the scheduler tick runs where a vCPU thread may run.
fn host_boot(cx: &mut HvCx, topo: &Topology) {
    for c in 0..topo.cores {
        cx.apic_write(c, msr::LVT_TIMER, HOST_TIMER_VECTOR as u64);
        cx.apic_write(c, msr::TDCR, 0b0011);
    }
    let p = cx.hv.host.tick_period;
    for c in 0..topo.cores {
        if topo.vcpu_cores_mask.contains(c) {
            cx.host_timer_start(c, p, HostTimer::Tick { core: c });
        }
    }
}

/// Background exits (the paper's rates are an idle VM's): one stream per
/// vCPU, the events on each VM's first vCPU.
fn background(
    s: &Scenario,
    cal: &Calibration,
    topo: &Topology,
    q: &mut EventQueue<Ev>,
) -> ([f64; 2], Vec<RngStream>) {
    let rate = if topo.virtualized && s.background.enabled {
        [
            cal.background.io_instruction_per_s.value,
            cal.background.ept_violation_per_s.value,
        ]
    } else {
        [0.0, 0.0]
    };
    let mut rngs: Vec<RngStream> = topo
        .vcpus
        .iter()
        .map(|p| {
            let name = rng_stream("background", p.vm);
            match p.index {
                0 => RngStream::new(s.seed, &name),
                j => RngStream::new(s.seed, &format!("background.vm{}.cpu{j}", p.vm)),
            }
        })
        .collect();
    for (vcpu, rng) in rngs.iter_mut().enumerate() {
        if topo.vcpus[vcpu].index != 0 {
            continue;
        }
        for (kind, r) in rate.iter().enumerate() {
            if *r > 0.0 {
                let dt = from_s(rng.exponential(1.0 / r));
                q.schedule(
                    dt,
                    Ev::Background {
                        vcpu: vcpu as u16,
                        kind: kind as u8,
                    },
                );
            }
        }
    }
    (rate, rngs)
}

/// The run's first events: the load generators' first datagrams, the
/// background exits, the end of the warm-up, scripted preemptions and
/// host IPIs.
fn first_events(
    s: &Scenario,
    cal: &Calibration,
    topo: &Topology,
    outside: &Outside,
    warm: Time,
    q: &mut EventQueue<Ev>,
) -> ([f64; 2], Vec<RngStream>) {
    for (vm, c) in outside.clients.iter().enumerate() {
        if c.is_some() {
            q.schedule(0, Ev::ClientTx { vm: vm as u16 });
        }
    }
    let rng = background(s, cal, topo, q);
    let virtualized = topo.virtualized;
    q.schedule(warm, Ev::WarmupEnd);
    // Scripted preemptions and host IPIs aim at the one VM's first vCPU
    // (the scenario refuses them with several VMs).
    let target = 0;
    if virtualized {
        for (at_ms, for_ms) in s.preemptions.iter().flat_map(|p| p.occurrences()) {
            let at = from_us(at_ms * 1000.0);
            q.schedule_async(at, Ev::Deschedule { vcpu: target });
            q.schedule_async(
                at + from_us(for_ms * 1000.0),
                Ev::Reschedule { vcpu: target },
            );
        }
    }
    if virtualized && s.host.ipi_per_s > 0.0 {
        let core = topo.vcpus[target as usize].core as u16;
        q.schedule(0, Ev::HostIpi { core });
    }
    rng
}

/// The checker's stranded bound for `check.stranded_us` (0: off).
pub(super) fn stranded_bound(us: f64) -> Time {
    if us > 0.0 {
        from_us(us)
    } else {
        Time::MAX
    }
}

/// Powers the platform on and returns the runnable world.
pub(in crate::world) fn power_on(
    s: &Scenario,
    cal: &Calibration,
    mut scheme: Box<dyn Scheme>,
    parts: Parts,
) -> World {
    let Parts {
        topo,
        mut m,
        devs,
        mut hv,
        costs,
        guests,
        outside,
        pv,
        kvmtool,
        blk,
        canal,
        vsock,
    } = parts;
    let nvm = topo.vms();
    let svm = scheme.svm();
    if svm && s.hv.avic_erratum_1235 {
        // A family 17h processor (AMD revision guide erratum 1235).
        m.avic_erratum.window = Some(costs.svm.erratum_1235_window);
    }
    let virtualized = topo.virtualized;
    let mut q = EventQueue::with_capacity(4096);
    let mut checker = Checker::with_vcpus(topo.vcpus.iter().map(|p| p.vm).collect());
    checker.early_tolerance = devs.apic_timer_period * 2;
    checker.stranded_bound = stranded_bound(s.check.stranded_us);
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
            host_boot(&mut cx, &topo);
        }
        for vm in 0..nvm {
            scheme.setup_vm(&mut cx, vm);
        }
        // The first vCPU placed on each core starts there; the others
        // wait in the host scheduler's run queue.
        for (c, first) in topo.first_on_core.iter().enumerate() {
            if let Some(v) = *first {
                cx.hv.sched_in(v);
                scheme.vcpu_load(&mut cx, v);
                cx.hv.vcpus[v].vmcs_core = Some(c);
                cx.hv.last_vcpu[c] = Some(v);
            }
        }
    }
    for (c, first) in topo.first_on_core.iter().enumerate() {
        if let Some(v) = *first {
            m.cores[c].mode = if virtualized {
                CoreMode::Guest { vcpu: v }
            } else {
                CoreMode::Native { kernel: v }
            };
        }
    }
    for (k, p) in topo.vcpus.iter().enumerate() {
        if topo.first_on_core[p.core] != Some(k) {
            checker.set_running(k, false, 0);
        }
    }
    let warm = from_s(s.warmup_s);
    let (bg_rate, rng_bg) = first_events(s, cal, &topo, &outside, warm, &mut q);
    let cores = topo.cores;
    let mut w = World::assemble(Assembly {
        s,
        cal,
        q,
        m,
        hv,
        scheme,
        guests,
        checker,
        costs,
        outside,
        tsc_hz: devs.clocks.tsc_hz,
        net_dev: devs.net_dev,
        blk_dev: devs.blk_dev,
        warm,
        arch: crate::world::arch::Arch::x86(svm),
    });
    w.bg_rate = bg_rate;
    w.rng_bg = rng_bg;
    w.pv = pv.map(Box::new);
    w.kvmtool = kvmtool.map(Box::new);
    w.blk = blk;
    w.event_exits = s
        .report
        .exits_per_event
        .then(|| Box::new(crate::world::event_exits::EventExits::new(nvm, cores)));
    w.canal = canal.map(Box::new);
    w.vsock = vsock.map(Box::new);
    if virtualized {
        for (c, first) in topo.first_on_core.iter().enumerate() {
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
    w.canal_start();
    w.vsock_start();
    if virtualized {
        let tick = w.hv.host.tick_period;
        let vcpus = topo.vcpu_threads();
        let io_cores: Vec<usize> =
            w.pv.as_ref()
                .map(|pv| pv.workers.iter().map(|k| k.core).collect())
                .unwrap_or_default();
        // vCanal's polling thread and network pool: pinned to the service
        // core, or ("w/o Affinity") free to run on every core.
        let canal = w.canal.as_ref().map(|c| c.sched_threads());
        let kvmtool_cores = w.kvmtool.as_ref().map(|k| k.cores()).unwrap_or_default();
        // A peer process on this host (behind the bridge, or through the
        // embedded switch) with `host.peer_cores`: its CPUs are host
        // threads.
        let mut peer_threads = Vec::new();
        if !s.host.peer_cores.is_empty() {
            let allowed = crate::engine::CpuMask::of(s.host.peer_cores.iter().copied());
            for (p, l) in w.peers.iter().enumerate() {
                if !matches!(
                    l.attach,
                    net::Attach::Bridge { .. } | net::Attach::Veb { .. }
                ) {
                    continue;
                }
                for c in 0..l.peer.cpus() {
                    let k = peer_threads.len();
                    let core = s.host.peer_cores[k % s.host.peer_cores.len()];
                    peer_threads.push(sched::PeerThreadSpec {
                        link: p,
                        cpu: c,
                        core,
                        allowed,
                    });
                }
            }
        }
        w.sched = sched::SchedState::build(
            s,
            &vcpus,
            &io_cores,
            canal,
            &kvmtool_cores,
            &peer_threads,
            tick,
        )
        .map(Box::new);
        w.sched_io_threads();
        w.peer_threads_attach();
        w.sched_start();
        w.kvmtool_start();
    }
    for (c, first) in topo.first_on_core.iter().enumerate() {
        if first.is_some() {
            w.guest_run(c);
        }
    }
    w
}

/// What every architecture's builder hands over to make its `World`; the
/// fields a world of one architecture (or one device) has beyond these
/// start empty and are set by that builder.
pub(in crate::world) struct Assembly<'s> {
    pub s: &'s Scenario,
    pub cal: &'s Calibration,
    pub q: EventQueue<Ev>,
    pub m: Machine,
    pub hv: HvState,
    pub scheme: Box<dyn Scheme>,
    pub guests: Vec<Kernel>,
    pub checker: Checker,
    pub costs: HvCosts,
    pub outside: Outside,
    pub tsc_hz: u64,
    pub net_dev: Vec<Option<usize>>,
    pub blk_dev: Vec<Option<usize>>,
    /// The end of the warm-up.
    pub warm: Time,
    pub arch: crate::world::arch::Arch,
}

impl World {
    /// A world from its builder's parts: the one place every field gets
    /// its starting value.
    pub(in crate::world) fn assemble(a: Assembly) -> World {
        let Assembly {
            s,
            cal,
            q,
            m,
            hv,
            scheme,
            guests,
            checker,
            costs,
            outside,
            tsc_hz,
            net_dev,
            blk_dev,
            warm,
            arch,
        } = a;
        let (cores, nvcpu, nvm) = (m.cores.len(), hv.vcpus.len(), hv.vms.len());
        World {
            q,
            m,
            hv,
            scheme,
            guests,
            checker,
            exits: vec![None; cores],
            bg_pending: vec![0; nvcpu],
            bg_rate: [0.0, 0.0],
            rng_bg: Vec::new(),
            rng_exit: RngStream::new(s.seed, "exit-service"),
            clients: outside.clients,
            msi_latency: t_us(&cal.nic.msi_latency_us),
            vf_owner: (0..nvm).map(|vm| (vm, s.guest.vf_vector)).collect(),
            timer_due: vec![None; nvcpu],
            guest_deadline_watch: vec![0; nvcpu],
            timer_exits: Default::default(),
            msi_faults: 0,
            measure_start: warm,
            end: warm + from_s(s.duration_s),
            lost_grace: from_us(s.check.lost_grace_ms * 1000.0),
            costs,
            scenario: s.clone(),
            // Set by the builder from the calibration before clock scaling.
            calibration_changes: Default::default(),
            ends_run: outside.ends_run,
            arch,
            deschedule_pending: vec![false; nvcpu],
            ptimer_gen: vec![0; cores],
            tsc_hz,
            rng_host: RngStream::new(s.seed, "host-ipi"),
            nic_base: vec![Default::default(); nvm],
            nic_queue_base: vec![[0; crate::hw::x86::nic::MAX_QUEUES as usize]; nvm],
            pv: None,
            kvmtool: None,
            net_dev_of_vm: net_dev,
            port_rx_free: 0,
            peers: outside.peers,
            trace: None,
            blk: Vec::new(),
            blk_dev_of_vm: blk_dev,
            tx_fetch: t_us(&cal.nic.tx_fetch_us),
            event_log: None,
            sched: None,
            polling: vec![None; nvcpu],
            poll_gen: 0,
            halt_start: vec![0; nvcpu],
            el2: None,
            hs: None,
            event_exits: None,
            canal: None,
            vsock: None,
            segments_in_place: 0,
            smt_speed: cal.cpu.smt_shared_speed.value,
            smt_work: [0; 2],
        }
    }
}
