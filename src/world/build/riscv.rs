//! Building a RISC-V world (`arch = "riscv64"`): the same topology,
//! devices (the VF and its link), guest kernels and workloads as on x86
//! and ARM, then the RISC-V machine (harts with the H extension, an IMSIC
//! per hart with its S file and GEILEN guest files, the IOMMU's MSI
//! translation, the G-stage of the guests' IMSIC windows) and the RISC-V
//! scheme (docs/riscv.md).

use super::topology::Topology;
use super::{devices, guests, hypervisor, workloads};
use crate::calibration::{Calibration, RiscvCalibration};
use crate::check::Checker;
use crate::engine::{from_ns, from_s, from_us, EventQueue, SEC};
use crate::guest::Clockevent;
use crate::hv::riscv::{ids, RiscvCosts, RiscvCx, RiscvScheme, RiscvVcpu};
use crate::hv::scheme::Scheme;
use crate::hv::HvCx;
use crate::hw::riscv::hart::VS_BITS;
use crate::hw::riscv::imsic::ISELECT_EIDELIVERY;
use crate::hw::riscv::machine::RiscvMachine;
use crate::hw::riscv::params::AiaParams;
use crate::hw::x86::core::CoreMode;
use crate::scenario::{NetDevice, Scenario};
use crate::world::event::Ev;
use crate::world::hs::HsWorld;
use crate::world::{sched, BuildError, World};

/// Guest interrupt files per hart unless `machine.riscv_guest_files` says:
/// QEMU `virt`'s `aia-guests` maximum is 7; 5 leaves a layout of more
/// vCPUs than files to a scenario that asks for it.
pub const DEFAULT_GUEST_FILES: usize = 5;

/// The x86 scheme slot of a RISC-V world (as `ArmHost` is ARM's): its
/// x86-only paths never run; it names the RISC-V scheme in reports.
struct RiscvHost {
    name: &'static str,
}

impl Scheme for RiscvHost {
    fn name(&self) -> &'static str {
        self.name
    }
    fn setup_vm(&mut self, _cx: &mut HvCx, _vm: usize) {}
}

/// The RISC-V costs of the calibration.
pub(in crate::world) fn riscv_costs(r: &RiscvCalibration) -> RiscvCosts {
    let ns = |e: &crate::calibration::Entry| from_ns(e.value);
    RiscvCosts {
        world_switch: ns(&r.hs.world_switch_ns),
        insn_decode: ns(&r.hs.insn_decode_ns),
        swfile_emulate: ns(&r.kvm_riscv.swfile_emulate_ns),
        sbi_call: ns(&r.kvm_riscv.sbi_call_ns),
        mmio_emulate: ns(&r.kvm_riscv.mmio_emulate_ns),
        plic_emulate: ns(&r.kvm_riscv.plic_emulate_ns),
        vsfile_move: ns(&r.kvm_riscv.vsfile_move_ns),
        host_irq: ns(&r.kvm_riscv.host_irq_ns),
        vcpu_wakeup: from_us(r.kvm_riscv.vcpu_wakeup_us.value),
        msi_latency: ns(&r.aia.msi_latency_ns),
    }
}

/// The guest's clockevent on RISC-V: `stimecmp` (or the SBI timer)
/// against `time` at the timebase; Linux's timer-riscv registers it with a
/// minimum delta of 100 ticks and has no boot-time setup writes.
fn riscv_clockevent(timebase_hz: u64) -> Clockevent {
    Clockevent {
        tick: SEC / timebase_hz.max(1),
        min_delta_ticks: 100,
        init_steps: 0,
    }
}

/// What the RISC-V platform does not model, refused with the key that
/// asks for it; `did-riscv`'s vCPUs own their harts (docs/riscv.md,
/// condition 1).
fn refuse_unsupported(s: &Scenario, topo: &Topology, scheme: &str) -> Result<(), BuildError> {
    let no = |key: &str, why: &str| {
        Err(BuildError::Scenario(format!(
            "arch = \"riscv64\": `{key}` is not supported on RISC-V yet ({why})"
        )))
    };
    if scheme == "did-riscv" {
        let refuse = |key: &str, why: &str| {
            Err(BuildError::Scenario(format!(
                "scheme did-riscv: `{key}` {why}: each vCPU needs a dedicated hart whose \
                 guest interrupt file stays its own (docs/riscv.md, condition 1)"
            )))
        };
        for (c, first) in topo.first_on_core.iter().enumerate() {
            let n = topo.vcpus.iter().filter(|p| p.core == c).count();
            if n > 1 || (n == 1 && first.is_none()) {
                return refuse("vm.core", "puts two vCPUs on one hart");
            }
        }
        if topo.allowed.iter().any(|a| a.count() > 1) {
            return refuse("vm.allowed_cores", "lets a vCPU move to another hart");
        }
    }
    if !s.net.device.nic_rings() || s.net.device == NetDevice::SpiNic {
        return no(
            "net.device",
            "the VF (MSIs through the IOMMU's MSI translation) is; virtio and wired NICs are not",
        );
    }
    if s.vms.iter().any(|v| v.workload.fio.is_some()) {
        return no("workload.fio", "virtio-blk is not modelled on RISC-V");
    }
    if s.vms.iter().any(|v| v.workload.vcanal.is_some()) {
        return no(
            "workload.vcanal",
            "vCanal's service is built on the x86 platform",
        );
    }
    if topo.vcpus.len() > 64 {
        return no("vm.vcpus", "at most 64 vCPUs (KVM's kick mask)");
    }
    Ok(())
}

/// Builds the RISC-V world `s` describes.
pub(in crate::world) fn build(s: &Scenario, cal: &Calibration) -> Result<World, BuildError> {
    let cfg = s.hv.riscv();
    let mut scheme: Box<dyn RiscvScheme> = crate::hv::riscv::by_name(&s.scheme, cfg)
        .ok_or_else(|| BuildError::Scenario(format!("unknown RISC-V scheme {}", s.scheme)))?;
    cal.check()?;
    let changes = cal.changes_from_shipped();
    let cal = &cal.at_cpu_clock();
    let rcal = cal.riscv.clone();
    let host = RiscvHost {
        name: scheme.name(),
    };
    let topo = Topology::plan(s, &host)?;
    refuse_unsupported(s, &topo, scheme.name())?;
    let (mut m, devs) = devices::build(s, cal, &topo)?;
    let mut hv = hypervisor::state(s, cal, &topo, &devs);
    let costs = hypervisor::costs(cal, devs.apic_timer_period);
    let nvcpu = topo.vcpus.len();
    let nvm = topo.vms();
    let cores = topo.cores;
    let timebase_hz = (rcal.aia.timebase_mhz.value * 1e6).round().max(1.0) as u64;
    let mut guests = guests::kernels(
        s,
        cal,
        &topo,
        &devs,
        &mut m,
        &host,
        riscv_clockevent(timebase_hz),
    );
    let outside = workloads::spawn(s, cal, &topo, &devs, m.link, &mut guests)?;
    let mut params = AiaParams::new(
        cores,
        s.machine.riscv_guest_files.unwrap_or(DEFAULT_GUEST_FILES),
    );
    params.timebase_hz = timebase_hz;
    params.sstc = scheme.sstc();
    let vm_vcpus: Vec<usize> = (0..nvm)
        .map(|vm| topo.vcpus.iter().filter(|p| p.vm == vm).count())
        .collect();
    let nvf = devs.vf.iter().flatten().map(|a| a.vf as usize + 1).max();
    let mut rm = RiscvMachine::new(params, nvf.unwrap_or(0).max(1), &vm_vcpus)
        .map_err(|e| BuildError::Scenario(format!("riscv: {e}")))?;
    // The host's boot: Linux's IMSIC driver turns on delivery in every
    // hart's S file and enables its IPI and each VF's host MSI identity.
    for i in &mut rm.imsics {
        i.s_file.write_ireg(ISELECT_EIDELIVERY, 1).ok();
        i.s_file.set_enabled(ids::HOST_IPI, true);
        for vf in 0..nvf.unwrap_or(0) {
            i.s_file.set_enabled(ids::HOST_VF_BASE + vf as u32, true);
        }
    }
    let nids = rm.params.ids;
    let mut vcpus: Vec<RiscvVcpu> = topo
        .vcpus
        .iter()
        .map(|p| RiscvVcpu::new(p.vm, p.index, nids))
        .collect();
    let rcosts = riscv_costs(&rcal);
    let mut kicks = 0u64;
    {
        let mut cx = RiscvCx {
            now: 0,
            m: &mut rm,
            vcpus: &mut vcpus,
            costs: &rcosts,
            kicks: &mut kicks,
            charged: 0,
        };
        for vm in 0..nvm {
            let vf = devs.vf.get(vm).copied().flatten().map(|a| a.vf as usize);
            scheme.setup_vm(&mut cx, vm, vf);
        }
        // The guest's boot: its IMSIC driver (or the PLIC's) turns on
        // delivery and enables every identity; `sie` enables the external,
        // software and timer interrupts.
        for v in 0..nvcpu {
            let f = cx.file(v);
            f.write_ireg(ISELECT_EIDELIVERY, 1).ok();
            for id in 1..=nids {
                f.set_enabled(id, true);
            }
            cx.vcpus[v].saved.vsie = VS_BITS;
        }
        for (c, first) in topo.first_on_core.iter().enumerate() {
            if let Some(v) = *first {
                scheme.vcpu_load(&mut cx, v, c);
            }
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
    for (k, p) in topo.vcpus.iter().enumerate() {
        if topo.first_on_core[p.core] != Some(k) {
            checker.set_running(k, false, 0);
        }
    }
    let mut q = EventQueue::with_capacity(4096);
    let warm = from_s(s.warmup_s);
    for (vm, c) in outside.clients.iter().enumerate() {
        if c.is_some() {
            q.schedule(0, Ev::ClientTx { vm: vm as u16 });
        }
    }
    q.schedule(warm, Ev::WarmupEnd);
    if s.host.ipi_per_s > 0.0 {
        let core = topo.vcpus[0].core as u16;
        q.schedule(0, Ev::HostIpi { core });
    }
    for (at_ms, for_ms) in s.preemptions.iter().flat_map(|p| p.occurrences()) {
        let at = from_us(at_ms * 1000.0);
        q.schedule_async(at, Ev::Deschedule { vcpu: 0 });
        q.schedule_async(at + from_us(for_ms * 1000.0), Ev::Reschedule { vcpu: 0 });
    }
    let queues = m.nic.config().queues;
    let vf_vectors = (
        s.guest.vf_vector,
        s.guest.vf_vector.saturating_add(queues.max(1)),
    );
    let hs = HsWorld::new(
        rm,
        scheme,
        vcpus,
        rcosts,
        timebase_hz,
        s.guest.timer_vector,
        vf_vectors,
        nvm,
        nvf.unwrap_or(0),
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
        arch: crate::world::arch::Arch::RiscvHs,
    });
    w.hs = Some(Box::new(hs));
    w.calibration_changes = changes;
    w.event_exits = Some(Box::new(crate::world::event_exits::EventExits::new(
        nvm, cores,
    )));
    for p in 0..w.peers.len() {
        w.peer_sent(p);
    }
    // The host scheduler when threads share harts or may move (as ARM's).
    let shared = topo.first_on_core.iter().enumerate().any(|(c, first)| {
        let n = topo.vcpus.iter().filter(|p| p.core == c).count();
        n > 1 || (n == 1 && first.is_none())
    });
    let floating = topo.allowed.iter().any(|a| a.count() > 1);
    if shared || floating || !s.host.burners.is_empty() {
        let vcpus = topo.vcpu_threads();
        let tick = w.hv.host.tick_period;
        w.sched = sched::SchedState::build(s, &vcpus, &[], None, &[], &[], tick).map(Box::new);
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
