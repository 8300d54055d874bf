//! Building an ARM world (`arch = "arm64"`): the same topology, devices
//! (the VF and its link), guest kernels and workloads as on x86, then the
//! ARM machine (GIC, ITS, generic timers, EL2 controls, a virtual CPU
//! interface per vCPU) and the ARM scheme instead of the x86 boot.

use super::topology::Topology;
use super::{devices, guests, hypervisor, workloads};
use crate::calibration::{ArmCalibration, Calibration};
use crate::check::Checker;
use crate::engine::{from_ns, from_s, from_us, EventQueue};
use crate::hv::arm::intids::PRIORITY;
use crate::hv::arm::intids::{nic_spi, NIC_SPI_BASE};
use crate::hv::arm::{ArmCosts, ArmCx, ArmVcpu, EventClass};
use crate::hv::scheme::Scheme;
use crate::hv::HvCx;
use crate::hw::arm::distributor::Route;
use crate::hw::arm::el2::HypMode;
use crate::hw::arm::intid::SPI_LIMIT;
use crate::hw::arm::intid::{MAINTENANCE_PPI, VTIMER_PPI};
use crate::hw::arm::machine::ArmMachine;
use crate::hw::arm::params::GicParams;
use crate::hw::arm::priority::Group;
use crate::hw::x86::core::CoreMode;
use crate::scenario::{GicVersionSpec, HypModeSpec, NetDevice, Scenario, SpiAffinitySpec};
use crate::world::el2::{arch_timer_clockevent, El2World};
use crate::world::event::Ev;
use crate::world::{sched, BuildError, World};

/// The x86 scheme slot of an ARM world. The generic world keeps one; on
/// ARM its x86-only paths (LAPIC and VMX events, the x86 exit path) never
/// run, and the topology stage only asks whether guests are virtualized.
/// `native`: the ARM scheme is `bare-metal` (no hypervisor: one kernel,
/// a core per CPU, as the topology stage checks for x86's).
struct ArmHost {
    native: bool,
}

impl Scheme for ArmHost {
    fn name(&self) -> &'static str {
        if self.native {
            crate::hv::arm::ARM_BARE_METAL
        } else {
            "arm64"
        }
    }
    fn virtualized(&self) -> bool {
        !self.native
    }
    fn setup_vm(&mut self, _cx: &mut HvCx, _vm: usize) {}
}

fn arm_costs(a: &ArmCalibration) -> ArmCosts {
    let ns = |e: &crate::calibration::Entry| from_ns(e.value);
    let us = |e: &crate::calibration::Entry| from_us(e.value);
    ArmCosts {
        world_switch: ns(&a.el2.world_switch_ns),
        sysreg_decode: ns(&a.el2.sysreg_decode_ns),
        vgic_emulate: ns(&a.kvm.vgic_emulate_ns),
        host_irq: ns(&a.kvm.host_irq_ns),
        vgic_flush_sync: ns(&a.kvm.vgic_flush_sync_ns),
        wfi_emulate: ns(&a.kvm.wfi_emulate_ns),
        timer_load_put: ns(&a.kvm.timer_load_put_ns),
        vgic_load_put: ns(&a.kvm.vgic_load_put_ns),
        its_vmovp: ns(&a.gic.its_vmovp_ns),
        vsgi_send: ns(&a.kvm.vsgi_send_ns),
        vpe_residency: ns(&a.kvm.vpe_residency_ns),
        doorbell_handler: ns(&a.kvm.doorbell_handler_ns),
        vcpu_wakeup: us(&a.kvm.vcpu_wakeup_us),
        halt_poll: us(&a.kvm.halt_poll_us),
        its_translate: ns(&a.gic.its_translate_ns),
        sgi_latency: ns(&a.gic.sgi_latency_ns),
        spi_line: ns(&a.gic.spi_line_ns),
        halt_poll_dynamic: false,
        halt_poll_max: us(&a.jetson.halt_poll_max_us),
        halt_poll_grow_start: us(&a.jetson.halt_poll_grow_start_us),
        mmio_decode: ns(&a.jetson.mmio_decode_ns),
    }
}

/// The board's KVM/ARM: its cycle-bound costs (measured on Ampere Altra)
/// at the Carmel clock, and JetPack 4.9's dynamic halt polling.
fn board_costs(c: &mut ArmCosts, j: &crate::calibration::ArmJetson) {
    let f = j.altra_ghz.value / j.carmel_ghz.value;
    let scale = |t: &mut crate::engine::Time| *t = (*t as f64 * f).round() as crate::engine::Time;
    for t in [
        &mut c.world_switch,
        &mut c.sysreg_decode,
        &mut c.vgic_emulate,
        &mut c.host_irq,
        &mut c.vgic_flush_sync,
        &mut c.wfi_emulate,
        &mut c.timer_load_put,
        &mut c.vgic_load_put,
        &mut c.vsgi_send,
        &mut c.vpe_residency,
        &mut c.doorbell_handler,
        &mut c.vcpu_wakeup,
        &mut c.mmio_decode,
    ] {
        scale(t);
    }
    c.halt_poll_dynamic = true;
}

/// What the ARM platform does not model yet, refused with the key that
/// asks for it. `scheme` is the ARM scheme's name: did-arm's vCPUs own
/// their cores (docs/did-arm.md "Dedicated cores under a host
/// scheduler"), so it refuses another vCPU on one of them or a vCPU that
/// may move.
fn refuse_unsupported(s: &Scenario, topo: &Topology, scheme: &str) -> Result<(), BuildError> {
    let no = |key: &str, why: &str| {
        Err(BuildError::Scenario(format!(
            "arch = \"arm64\": `{key}` is not supported on ARM yet ({why})"
        )))
    };
    if scheme == "did-arm" {
        let refuse = |key: &str, why: &str| {
            Err(BuildError::Scenario(format!(
                "scheme did-arm: `{key}` {why}: each vCPU owns its core's physical CPU \
                 interface (HCR_EL2.IMO = 0) and the guest's VMPIDR names that core \
                 (docs/did-arm.md, \"Dedicated cores under a host scheduler\")"
            )))
        };
        for (c, first) in topo.first_on_core.iter().enumerate() {
            let n = topo.vcpus.iter().filter(|p| p.core == c).count();
            if n > 1 || (n == 1 && first.is_none()) {
                return refuse("vm.core", "puts two vCPUs on one core");
            }
        }
        if topo.allowed.iter().any(|a| a.count() > 1) {
            return refuse("vm.allowed_cores", "lets a vCPU move to another core");
        }
        // Host threads (burners, scripted preemptions) may share a
        // vCPU's core: the guest's interrupts wait in the redistributor
        // while it is off (did_arm.rs, vcpu_put).
    }
    if scheme == crate::hv::arm::ARM_BARE_METAL && !s.host.burners.is_empty() {
        return Err(BuildError::Scenario(
            "scheme bare-metal: `host.burners` are host threads beside a hypervisor's vCPUs; \
             a native kernel has none"
                .into(),
        ));
    }
    let virtio = s.net.device == NetDevice::Virtio;
    if !s.net.device.nic_rings() && !virtio {
        return no(
            "net.device",
            "the VF (an MSI device through the ITS), spi-nic (a NIC on a wired SPI) and virtio \
             (virtio-net-pci over vhost-net) are",
        );
    }
    if virtio && s.net.backend != crate::scenario::NetBackend::Vhost {
        return no(
            "net.backend",
            "virtio-net on ARM runs with the vhost-net back end (QEMU's vhost=on)",
        );
    }
    if virtio && scheme == crate::hv::arm::ARM_BARE_METAL {
        return Err(BuildError::Scenario(
            "scheme bare-metal: `net.device = \"virtio\"` is a VM's paravirtual NIC; \
             bare metal drives the board's own NIC (vf or spi-nic)"
                .into(),
        ));
    }
    if s.net.device == NetDevice::SpiNic {
        let spis = (SPI_LIMIT - NIC_SPI_BASE) as usize;
        if topo.vms() > spis {
            return Err(BuildError::Scenario(format!(
                "`net.device = \"spi-nic\"`: {} VMs, but the GIC has SPIs for {spis} NICs",
                topo.vms()
            )));
        }
        if scheme == "did-arm" && s.arm.nic_spi_affinity == Some(SpiAffinitySpec::Cpu0) {
            return Err(BuildError::Scenario(
                "scheme did-arm: `arm.nic_spi_affinity = \"cpu0\"` is KVM's host setting; \
                 did-arm routes the NIC's SPI to its vCPU's dedicated core (docs/did-arm.md)"
                    .into(),
            ));
        }
    } else if s.arm.nic_spi_affinity.is_some() {
        return Err(BuildError::Scenario(
            "`arm.nic_spi_affinity` routes the SPI of `net.device = \"spi-nic\"`; \
             this scenario's NIC is not one"
                .into(),
        ));
    }
    if s.vms.iter().any(|v| v.workload.fio.is_some()) {
        return no("workload.fio", "virtio-blk is not modelled on ARM");
    }
    if s.vms.iter().any(|v| v.workload.vcanal.is_some()) {
        return no(
            "workload.vcanal",
            "vCanal's service and helper driver are built on the x86 platform",
        );
    }
    Ok(())
}

/// The GIC the platform has: `[arm] gic` if set, else what the scheme
/// needs (`needed`). A GIC older than the scheme needs is refused, naming
/// the key.
fn gic_params(
    s: &Scenario,
    scheme: &str,
    needed: GicParams,
    cores: usize,
    vcpus: usize,
) -> Result<GicParams, BuildError> {
    let Some(v) = s.arm.gic else {
        return Ok(needed);
    };
    let least = if needed.gicv4_1 {
        GicVersionSpec::V41
    } else if needed.gicv4 {
        GicVersionSpec::V4
    } else {
        GicVersionSpec::V3
    };
    if v < least {
        return Err(BuildError::Scenario(format!(
            "`arm.gic = \"{}\"`: scheme {scheme} needs a GIC{} or newer (its vPEs and \
             direct vLPI injection are GICv4 features)",
            v.name(),
            least.name()
        )));
    }
    let vpes = vcpus.max(1) as u16;
    Ok(match v {
        GicVersionSpec::V3 => GicParams::gicv3(cores),
        GicVersionSpec::V4 => GicParams::gicv4(cores, vpes),
        GicVersionSpec::V41 => GicParams::gicv4_1(cores, vpes),
    })
}

/// The host's KVM mode the scenario asks for.
pub(super) fn hyp_mode(s: &Scenario) -> HypMode {
    match s.arm.hyp_mode {
        HypModeSpec::Vhe => HypMode::Vhe,
        HypModeSpec::Split => HypMode::Split,
    }
}

/// Builds the ARM world `s` describes with `scheme`.
pub(in crate::world) fn build(
    s: &Scenario,
    cal: &Calibration,
    mut scheme: Box<dyn crate::hv::arm::ArmScheme>,
) -> Result<World, BuildError> {
    cal.check()?;
    // What the user changed, before the clock scaling derives the rest.
    let changes = cal.changes_from_shipped();
    // A board (`[machine] board`): its cores' clock for the guest
    // kernel's cycle-bound costs, its peer's for the peer's, and its
    // Ethernet's link speed.
    let board = s.machine.board.map(|_| cal.arm.jetson.clone());
    let boarded;
    let cal = match &board {
        Some(j) => {
            let mut c = cal.clone();
            c.cpu.ghz = crate::calibration::Entry {
                value: j.carmel_ghz.value,
                source: format!("[machine] board: {}", j.carmel_ghz.source),
                at_ghz: None,
                wall: false,
            };
            // The board's own Ethernet: its link speed is the board's.
            c.nic.link_gbps = crate::calibration::Entry {
                value: j.link_gbps.value,
                source: format!("[machine] board: {}", j.link_gbps.source),
                at_ghz: None,
                wall: false,
            };
            boarded = c;
            &boarded
        }
        None => cal,
    };
    // Cycle-bound costs at the experiment's core clock (`cpu.ghz`), for
    // the built-in ARM schemes and a caller's alike.
    let cal = &match &board {
        Some(j) => cal.at_cpu_clock().peer_at_clock(j.rpi4_ghz.value),
        None => cal.at_cpu_clock(),
    };
    let acal = cal.arm.clone();
    let native = scheme.name() == crate::hv::arm::ARM_BARE_METAL;
    let host = ArmHost { native };
    let topo = Topology::plan(s, &host)?;
    refuse_unsupported(s, &topo, scheme.name())?;
    let (mut m, devs) = devices::build(s, cal, &topo)?;
    let mut hv = hypervisor::state(s, cal, &topo, &devs);
    let costs = hypervisor::costs(cal, devs.apic_timer_period);
    // virtio-net-pci over vhost-net (QEMU's virt machine, vhost=on): the
    // same back end as on x86; its kicks reach it through the ioeventfds
    // the hypervisor stage registered, its completions come back through
    // the irqfd as the ARM scheme's virtual SPIs.
    let pv = hypervisor::vhost(s, cal, &topo, &devs);
    let nvcpu = topo.vcpus.len();
    let nvm = topo.vms();
    let cores = topo.cores;
    let mut params = gic_params(s, scheme.name(), scheme.gic(cores, nvcpu), cores, nvcpu)?;
    params.vcpu_interface.list_registers = s.arm.list_registers;
    let clockevent = arch_timer_clockevent(params.timer.frequency_hz);
    let mut guests = guests::kernels(s, cal, &topo, &devs, &mut m, &host, clockevent);
    let outside = workloads::spawn(s, cal, &topo, &devs, m.link, &mut guests)?;
    let mut am = ArmMachine::new(params, nvcpu, scheme.el2())
        .map_err(|e| BuildError::Scenario(format!("arm: {e}")))?;
    // The host's boot: Linux's GICv3 driver configures the SGIs, the
    // timer's PPI and KVM the maintenance PPI on every core, Group 1 at the
    // default priority.
    for r in &mut am.redists {
        for intid in (0..16).chain([MAINTENANCE_PPI, VTIMER_PPI]) {
            let _ = r.configure(intid, PRIORITY, Group::G1);
        }
    }
    // A NIC on a wired SPI per VM: the host's driver (VFIO) requested it
    // level-sensitive (the device holds its line until its driver masks
    // it), Group 1 at the default priority, routed where
    // `arm.nic_spi_affinity` says (docs/did-arm.md, "A NIC on a wired
    // SPI"). The device does not mask itself on an interrupt (VTEIAM
    // clear): a wire has no message to auto-mask at.
    let wired = s.net.device == NetDevice::SpiNic;
    if wired {
        for vm in 0..nvm {
            let Some(vf) = devs.vf[vm] else { continue };
            let core = match s.arm.nic_spi_affinity {
                Some(SpiAffinitySpec::Cpu0) => 0,
                _ => hv.vcpus[hv.device_home(vm)].core,
            };
            let route = Route::Affinity(am.params.topology.affinity(core));
            am.dist
                .configure(nic_spi(vm), PRIORITY, Group::G1, false, route)
                .map_err(|e| BuildError::Scenario(format!("arm: the NIC's SPI: {e}")))?;
            m.nic
                .write_eiam(vf.vf, 0)
                .map_err(|e| BuildError::Scenario(format!("arm: the NIC: {e}")))?;
        }
    }
    let mut vcpus: Vec<ArmVcpu> = (0..nvcpu)
        .map(|v| ArmVcpu {
            ap_list: Vec::with_capacity(32),
            vpeid: v as u16,
            vmpidr_core: topo.vcpus[v].index,
            saved_timer: (0, 0),
            bg_gen: 0,
            in_wfi: false,
            pending_last: false,
            kick_class: EventClass::Other,
            poll_window: 0,
        })
        .collect();
    let mut acosts = arm_costs(&acal);
    let cpuidle = board.as_ref().map(|j| {
        board_costs(&mut acosts, j);
        crate::world::el2::CpuIdle {
            c1_exit: from_us(j.c1_exit_latency_us.value),
            c6_exit: from_us(j.c6_exit_latency_us.value),
            c6_residency: from_us(j.c6_min_residency_us.value),
        }
    });
    let mut q = EventQueue::with_capacity(4096);
    let mut kicks = 0u64;
    {
        let mut cx = ArmCx {
            now: 0,
            m: &mut am,
            hv: &mut hv,
            vcpus: &mut vcpus,
            q: &mut q,
            costs: &acosts,
            kicks: &mut kicks,
            charged: 0,
        };
        for vm in 0..nvm {
            scheme.setup_vm(&mut cx, vm);
        }
        for first in topo.first_on_core.iter().flatten() {
            scheme.vcpu_load(&mut cx, *first);
        }
    }
    for (c, first) in topo.first_on_core.iter().enumerate() {
        if let Some(v) = *first {
            m.cores[c].mode = CoreMode::Guest { vcpu: v };
            hv.vcpus[v].vmcs_core = Some(c);
            hv.last_vcpu[c] = Some(v);
        }
    }
    let mut checker = Checker::with_vcpus(topo.vcpus.iter().map(|p| p.vm).collect());
    checker.stranded_bound = super::boot::stranded_bound(s.check.stranded_us);
    for (k, p) in topo.vcpus.iter().enumerate() {
        if topo.first_on_core[p.core] != Some(k) {
            checker.set_running(k, false, 0);
        }
    }
    let warm = from_s(s.warmup_s);
    for (vm, c) in outside.clients.iter().enumerate() {
        if c.is_some() {
            q.schedule(0, Ev::ClientTx { vm: vm as u16 });
        }
    }
    q.schedule(warm, Ev::WarmupEnd);
    // (Bare metal has no host beside its kernel: the scenario warns that
    // host.ipi_per_s and preemptions have no effect, and none is sent.)
    if s.host.ipi_per_s > 0.0 && !native {
        let core = topo.vcpus[0].core as u16;
        q.schedule(0, Ev::HostIpi { core });
    }
    // Scripted preemptions of the first vCPU, as on x86 (the scenario
    // refuses them with several VMs).
    let preemptions = s.preemptions.iter().filter(|_| !native);
    for (at_ms, for_ms) in preemptions.flat_map(|p| p.occurrences()) {
        let at = from_us(at_ms * 1000.0);
        q.schedule_async(at, Ev::Deschedule { vcpu: 0 });
        q.schedule_async(at + from_us(for_ms * 1000.0), Ev::Reschedule { vcpu: 0 });
    }
    let el2 = El2World::new(
        am,
        scheme,
        vcpus,
        acosts,
        cores,
        nvm,
        s.guest.timer_vector,
        s.guest.vf_vector,
        wired,
    );
    let mut w = World::assemble(super::boot::Assembly {
        s,
        cal,
        q,
        m,
        hv,
        scheme: Box::new(host),
        guests,
        checker,
        costs,
        outside,
        tsc_hz: devs.clocks.tsc_hz,
        net_dev: devs.net_dev,
        blk_dev: devs.blk_dev,
        warm,
        arch: crate::world::arch::Arch::ArmEl2,
    });
    let mut el2 = el2;
    el2.cpuidle = cpuidle;
    w.el2 = Some(Box::new(el2));
    w.pv = pv.map(Box::new);
    w.calibration_changes = changes;
    w.event_exits = Some(Box::new(crate::world::event_exits::EventExits::new(
        nvm, cores,
    )));
    for p in 0..w.peers.len() {
        w.peer_sent(p);
    }
    // The host scheduler, when threads share cores or may move: several
    // vCPUs per core, floating vCPUs, host burners. Dedicated pinned
    // vCPUs need none (a blocked vCPU's wake-up is then the ArmWake path).
    let shared = topo.first_on_core.iter().enumerate().any(|(c, first)| {
        let n = topo.vcpus.iter().filter(|p| p.core == c).count();
        n > 1 || (n == 1 && first.is_none())
    });
    let floating = topo.allowed.iter().any(|a| a.count() > 1);
    // vhost's worker threads are host threads on the I/O cores: under the
    // host scheduler when it runs; otherwise each runs at once on its own
    // core (`vhost_run_after` with no thread id).
    let io_cores: Vec<usize> =
        w.pv.as_ref()
            .map(|pv| pv.workers.iter().map(|k| k.core).collect())
            .unwrap_or_default();
    // A worker on a vCPU's core or beside another worker shares it too.
    let io_shared = io_cores
        .iter()
        .enumerate()
        .any(|(i, &c)| topo.vcpus.iter().any(|p| p.core == c) || io_cores[..i].contains(&c));
    if shared || io_shared || floating || !s.host.burners.is_empty() {
        let vcpus = topo.vcpu_threads();
        let tick = w.hv.host.tick_period;
        w.sched =
            sched::SchedState::build(s, &vcpus, &io_cores, None, &[], &[], tick).map(Box::new);
        w.sched_io_threads();
        w.sched_start();
    }
    for (c, first) in topo.first_on_core.iter().enumerate() {
        if first.is_some() {
            w.guest_run(c);
        }
    }
    Ok(w)
}
