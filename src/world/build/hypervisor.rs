//! Stage 3, the hypervisor: its costs, its per-VM and per-vCPU state (the
//! VMs' vCPUs, MSI affinity, VF assignment, emulated LAPICs, ES2's
//! redirection), the ioeventfds it registers for the VMs' virtio queues,
//! and the host-side back ends of those devices (vhost workers, each VM's
//! QEMU block path). The scheme's own setup runs at power-on (`boot`),
//! when the guests it serves exist.

use super::devices::DeviceMap;
use super::topology::Topology;
use super::{blk_kick_fd, net_kick_fds};
use super::{VIRTIO_BLK_NOTIFY_PORT, VIRTIO_BLK_VECTOR, VIRTIO_NET_VECTORS, VIRTIO_NOTIFY_PORT};
use crate::calibration::Calibration;
use crate::engine::{from_us, Time, SEC};
use crate::hv::host::HostKernel;
use crate::hv::kvmtool_net::{KvmtoolCosts, KvmtoolNet};
use crate::hv::vhost::{VhostCosts, VhostNet, VhostWorker};
use crate::hv::{HvCosts, HvState, VcpuState, VmState};
use crate::scenario::{MsiMode, Scenario};
use crate::world::{blk, net, t_ns, t_us};

/// The calibrated costs of the hypervisor's paths.
pub(in crate::world) fn costs(cal: &Calibration, apic_timer_period: Time) -> HvCosts {
    HvCosts {
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
        ipi_latency_max: t_us(&cal.host.ipi_latency_max_us),
        self_ipi: t_us(&cal.host.self_ipi_us),
        irt_update: t_us(&cal.host.irt_update_us),
        call_function: t_us(&cal.host.call_function_us),
        hlt: t_us(&cal.exit.hlt_us),
        vcpu_wakeup: t_us(&cal.host.vcpu_wakeup_us),
        apic_access_decode: t_us(&cal.exit.apic_access_decode_us),
        apic_timer_period,
        svm: crate::hv::SvmCosts {
            roundtrip: t_us(&cal.svm.vmrun_vmexit_roundtrip_us),
            intr: t_us(&cal.svm.intr_us),
            vintr: t_us(&cal.svm.vintr_us),
            avic_incomplete_ipi: t_us(&cal.svm.avic_incomplete_ipi_us),
            avic_trap: t_us(&cal.svm.avic_trap_us),
            avic_load_put: t_us(&cal.svm.avic_load_put_us),
            doorbell_latency: t_us(&cal.svm.doorbell_latency_us),
            ga_log: t_us(&cal.svm.ga_log_us),
            erratum_1235_window: t_us(&cal.svm.erratum_1235_window_us),
        },
    }
}

/// The hypervisor's state for the planned VMs and their devices, with an
/// ioeventfd (`KVM_IOEVENTFD`) for each virtio queue's notify port.
pub(in crate::world) fn state(
    s: &Scenario,
    cal: &Calibration,
    topo: &Topology,
    devs: &DeviceMap,
) -> HvState {
    let hz = cal.host.hz.value.max(1.0);
    let vms = topo
        .views
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let vcpus = &topo.vm_vcpus[i];
            let mut pv_vectors = Vec::new();
            if devs.net_dev[i].is_some() {
                pv_vectors.extend(VIRTIO_NET_VECTORS);
            }
            if devs.blk_dev[i].is_some() {
                pv_vectors.push(VIRTIO_BLK_VECTOR);
            }
            VmState {
                vcpus: vcpus.clone(),
                irq_affinity: v.irq_affinity.iter().map(|&j| vcpus[j]).collect(),
                msi_lowest_priority: v.msi_mode == MsiMode::LowestPriority,
                vf: devs.vf[i],
                pv_vectors,
                stats: Default::default(),
                vcpu_stats: vec![Default::default(); vcpus.len()],
                // Index 0: the VM; 1 + i: its vCPU i.
                svm_stats: vec![Default::default(); vcpus.len() + 1],
                xapic: s.guest.apic == crate::guest::ApicMode::Xapic,
            }
        })
        .collect();
    let vcpus = topo
        .vcpus
        .iter()
        .zip(&topo.allowed)
        .map(|(p, &allowed)| VcpuState {
            vm: p.vm,
            index: p.index,
            core: p.core,
            allowed,
            vmcs_core: None,
            vlapic: crate::hv::vlapic::new(devs.clocks),
            loaded: false,
            halted: false,
            arb_prio: 0,
        })
        .collect();
    let mut ioeventfds = Vec::new();
    for vm in 0..topo.vms() {
        if let Some(d) = devs.blk_dev[vm] {
            ioeventfds.push((vm, VIRTIO_BLK_NOTIFY_PORT, blk_kick_fd(d)));
        }
        if let Some(d) = devs.net_dev[vm] {
            let fds = net_kick_fds(d);
            ioeventfds.push((vm, VIRTIO_NOTIFY_PORT, fds[0]));
            ioeventfds.push((vm, VIRTIO_NOTIFY_PORT + 1, fds[1]));
        }
    }
    // vCanal's doorbell, for VMs that notify instead of being polled.
    for (vm, v) in topo.views.iter().enumerate() {
        if v.workload.vcanal.as_ref().is_some_and(|c| c.kick) {
            use crate::world::vcanal::{doorbell_fd, DOORBELL_PORT};
            ioeventfds.push((vm, DOORBELL_PORT, doorbell_fd(vm)));
        }
    }
    // virtio-vsock's RX and TX queue notifies.
    for (vm, v) in topo.views.iter().enumerate() {
        if crate::world::vsock::runs_over_vsock(s, v.workload) {
            use crate::world::vsock::{kick_fds, VSOCK_NOTIFY_PORT};
            let fds = kick_fds(vm);
            ioeventfds.push((vm, VSOCK_NOTIFY_PORT, fds[0]));
            ioeventfds.push((vm, VSOCK_NOTIFY_PORT + 1, fds[1]));
        }
    }
    let mut hv = HvState {
        vms,
        vcpus,
        last_vcpu: vec![None; topo.cores],
        redirect: topo
            .vm_vcpus
            .iter()
            .map(|vcpus| {
                (topo.virtualized && s.hv.es2_redirect)
                    .then(|| crate::hv::es2::Redirect::new(vcpus))
            })
            .collect(),
        host: HostKernel::new(topo.cores, (SEC as f64 / hz) as Time).with_vcpus(topo.vcpus.len()),
        designated_core: 0,
        ioeventfds,
        on_core: Vec::new(),
        vf_by_vector: Vec::new(),
        ioeventfds_by_vm: Vec::new(),
    };
    hv.index(topo.cores);
    hv
}

/// The vhost back ends of the virtio-net devices and their worker
/// threads: one per device (stock), or ES2's joint threads of
/// `combining_level` devices; worker w pinned to `io_cores[w % len]`.
/// None without virtio-net devices.
pub(in crate::world) fn vhost(
    s: &Scenario,
    cal: &Calibration,
    topo: &Topology,
    devs: &DeviceMap,
) -> Option<net::PvPath> {
    if !devs.has_virtio_net() || s.net.backend != crate::scenario::NetBackend::Vhost {
        return None;
    }
    let v = &cal.vhost;
    let es2 = s.hv.es2();
    let per = es2.devices_per_worker();
    let on = devs.virtio_net_devs();
    let nworkers = on.len().div_ceil(per);
    let io_cores = io_cores(s, topo);
    let tap = v.tap_queue_frames.value as usize;
    Some(net::PvPath {
        devs: on
            .iter()
            .map(|&(vm, d)| VhostNet::new(vm, d, d / per, net_kick_fds(d), tap))
            .collect(),
        vectors: vec![VIRTIO_NET_VECTORS; on.len()],
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

/// The cores the virtio-net back ends' threads run on: `host.io_cores`,
/// or a host core of its own: the first from 2 up that no vCPU may run on
/// (core 0 is the host's, core 1 the usual VM core).
fn io_cores(s: &Scenario, topo: &Topology) -> Vec<usize> {
    if s.host.io_cores.is_empty() {
        vec![(2..topo.cores)
            .find(|&c| !topo.vcpu_cores_mask.contains(c))
            .unwrap_or(0)]
    } else {
        s.host.io_cores.clone()
    }
}

/// kvm-tools' userspace back ends of the virtio-net devices
/// (`net.backend = "kvmtool-tap"`): three threads per device, those of
/// device d on `io_cores[d % len]`. None with vhost or without virtio-net
/// devices.
pub(in crate::world) fn kvmtool(
    s: &Scenario,
    cal: &Calibration,
    topo: &Topology,
    devs: &DeviceMap,
) -> Option<crate::world::kvmtool_net::KvmtoolPath> {
    if !devs.has_virtio_net() || s.net.backend != crate::scenario::NetBackend::KvmtoolTap {
        return None;
    }
    let k = &cal.kvmtool;
    let on = devs.virtio_net_devs();
    let tap = cal.vhost.tap_queue_frames.value as usize;
    let io = io_cores(s, topo);
    // The host's own NIC, when the peer is across the link: its interrupt
    // on the first I/O core (with the back end's threads: the I/O core
    // under Baseline + Affinity, the vCPU's core under Baseline).
    let host_nic = (s.net.peer == crate::scenario::VirtioPeer::Remote).then(|| {
        let g = &cal.guest;
        let costs = crate::world::kvmtool_net::HostNicCosts {
            irq: from_us(cal.host.irq_handler_us.value),
            napi_poll: t_ns(&g.napi_poll_base_ns),
            rx_frame: t_ns(&g.rx_per_packet_ns).saturating_sub(t_ns(&g.rx_protocol_ns))
                + t_ns(&cal.peer.bridge_ns)
                + t_ns(&k.tun_xmit_ns),
            tx_frame: t_ns(&cal.peer.bridge_ns) + t_ns(&g.vf_xmit_ns),
        };
        let itr = crate::world::vcanal::NicItr::new(
            crate::scenario::PeerItr::Adaptive,
            &super::peer_costs(s, cal),
        );
        let irq_core = s.net.host_nic_irq_core.unwrap_or(io[0]);
        crate::world::kvmtool_net::HostNic::new(irq_core, itr, costs, t_us(&cal.vhost.wakeup_us))
    });
    let mut path = crate::world::kvmtool_net::KvmtoolPath::new(
        on.iter()
            .map(|&(vm, d)| KvmtoolNet::new(vm, d, net_kick_fds(d), tap))
            .collect(),
        vec![VIRTIO_NET_VECTORS; on.len()],
        &io,
        KvmtoolCosts {
            wakeup: t_us(&k.wakeup_us),
            syscall: t_ns(&k.syscall_ns),
            ioeventfd_event: t_ns(&k.ioeventfd_event_ns),
            tap_write: t_ns(&k.tap_write_per_frame_ns),
            tap_read: t_ns(&k.tap_read_per_frame_ns),
            copy_per_kib: t_ns(&k.copy_per_kib_ns),
            irq_line: t_ns(&k.irq_line_ns),
        },
    );
    path.host_nic = host_nic;
    Some(path)
}

/// Each VM's QEMU block path (its own main loop and thread pool), for
/// each virtio-blk device in device order.
pub(in crate::world) fn blk_paths(
    s: &Scenario,
    cal: &Calibration,
    topo: &Topology,
    devs: &DeviceMap,
) -> Vec<blk::BlkPath> {
    let display = s.host.qemu_display == crate::scenario::QemuDisplay::Sdl;
    let mut paths = Vec::new();
    for (vm, v) in topo.views.iter().enumerate() {
        if let (Some(f), Some(d)) = (&v.workload.fio, devs.blk_dev[vm]) {
            debug_assert_eq!(paths.len(), d, "devices numbered in VM order");
            paths.push(blk::BlkPath::new(
                cal,
                vm,
                blk_kick_fd(d),
                VIRTIO_BLK_VECTOR,
                f.disk_bytes,
                display,
            ));
        }
    }
    paths
}
