//! Stage 4, guest kernels: each VM's kernel with its configuration (its
//! devices' drivers, vectors, timer, NAPI and costs), and the drivers'
//! probes (virtio-net fills its RX ring). Every VM gets the same kernel;
//! only its devices and CPUs differ.

use super::devices::DeviceMap;
use super::topology::Topology;
use super::{VIRTIO_BLK_NOTIFY_PORT, VIRTIO_BLK_VECTOR, VIRTIO_NET_VECTORS, VIRTIO_NOTIFY_PORT};
use crate::calibration::Calibration;
use crate::engine::from_us;
use crate::engine::rng::CostVariance;
use crate::guest::blk::VirtioBlkGuest;
use crate::guest::net::VirtioNetGuest;
use crate::guest::{Clockevent, GuestConfig, GuestCosts, Kernel};
use crate::hv::scheme::Scheme;
use crate::hw::x86::Machine;
use crate::scenario::{Scenario, VmView};
use crate::world::t_ns;

/// The guest's calibrated costs.
fn guest_costs(cal: &Calibration) -> GuestCosts {
    let g = &cal.guest;
    GuestCosts {
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
        blk_elv_insert: t_ns(&g.blk_elv_insert_ns),
        blk_dispatch: t_ns(&g.blk_dispatch_ns),
        blk_complete: t_ns(&g.blk_complete_ns),
        icmp_echo: t_ns(&g.icmp_echo_ns),
        rx_protocol: t_ns(&g.rx_protocol_ns),
        rps_enqueue: t_ns(&g.rps_enqueue_ns),
        call_function_ipi: t_ns(&g.call_function_ipi_ns),
        tcp_conn_request: t_ns(&g.tcp_conn_request_ns),
        tcp_syn_recv_sock: t_ns(&g.tcp_syn_recv_sock_ns),
    }
}

/// VM `vm`'s kernel configuration.
fn config(
    s: &Scenario,
    cal: &Calibration,
    devs: &DeviceMap,
    vm: usize,
    v: &VmView,
    did_module: bool,
    clockevent: Clockevent,
) -> GuestConfig {
    GuestConfig {
        timer_vector: s.guest.timer_vector,
        did_module,
        vf_vector: s.guest.vf_vector,
        vf: devs.vf[vm].map(|a| a.vf),
        vf_queues: devs.vf[vm].map_or(1, |a| a.queues),
        vf_wired_irq: s.net.device == crate::scenario::NetDevice::SpiNic,
        hz: s.guest.hz,
        tick: s.guest.tick,
        irq_nesting: s.guest.irq_nesting,
        idle: s.guest.idle,
        clockevent,
        rcvbuf_packets: s.guest.rcvbuf_packets,
        napi_weight: s
            .guest
            .napi_weight
            .unwrap_or(cal.nic.napi_weight.value as u32),
        refill_batch: cal.nic.rx_refill_batch.value as u16,
        netdev_budget: cal.nic.netdev_budget.value as u32,
        gro: s.guest.gro,
        itr: devs.itr,
        costs: guest_costs(cal),
        virtio_blk: match (&v.workload.fio, devs.blk_dev[vm]) {
            (Some(f), Some(_)) => Some(VirtioBlkGuest {
                vector: VIRTIO_BLK_VECTOR,
                notify_port: VIRTIO_BLK_NOTIFY_PORT,
                guard: from_us(f.guard_ms * 1000.0),
            }),
            _ => None,
        },
        rps_cpus: v.rps_cpus.clone(),
        // vCanal's helper driver (vcanal.md §2.1, §2.5).
        wait_driver: v
            .workload
            .vcanal
            .as_ref()
            .map(|c| crate::guest::WaitQueueDriver {
                vector: crate::world::vcanal::COMPLETION_VECTOR,
                handler: crate::world::t_ns(&cal.vcanal.helper_irq_handler_ns),
                announce: Some((
                    crate::world::vcanal::ANNOUNCE_HYPERCALL,
                    crate::world::vcanal::CHANNEL_BASE,
                )),
                doorbell: c.kick.then_some(crate::world::vcanal::DOORBELL_PORT),
            })
            // The guest's virtio-vsock driver: its interrupt wakes the
            // sender sleeping on its socket.
            .or_else(|| crate::world::vsock::wait_driver(s, v.workload, cal)),
        virtio_net: devs.net_dev[vm].map(|_| VirtioNetGuest {
            rx_vector: VIRTIO_NET_VECTORS[0],
            tx_vector: VIRTIO_NET_VECTORS[1],
            notify_port: VIRTIO_NOTIFY_PORT,
        }),
    }
}

/// Boots each VM's kernel and probes its drivers; `clockevent` is the
/// timer the architecture gives the guest.
pub(in crate::world) fn kernels(
    s: &Scenario,
    cal: &Calibration,
    topo: &Topology,
    devs: &DeviceMap,
    m: &mut Machine,
    scheme: &dyn Scheme,
    clockevent: Clockevent,
) -> Vec<Kernel> {
    // One factor table for every VM (each draws from its own stream).
    let cost_factors = CostVariance::table(cal.guest.cost_cv.value);
    topo.views
        .iter()
        .enumerate()
        .map(|(vm, v)| {
            let mut k = Kernel::smp(
                config(
                    s,
                    cal,
                    devs,
                    vm,
                    v,
                    scheme.guest_loads_did_module(vm),
                    clockevent,
                ),
                v.cores.len(),
            );
            // Per-operation costs vary per charge, from the VM's own
            // stream (guest.cost_cv; 0 = the calibration exactly).
            k.set_cost_variance(CostVariance::with_table(
                cost_factors.clone(),
                s.seed,
                &super::rng_stream("guest.costs", vm),
            ));
            if let Some(d) = devs.net_dev[vm] {
                // virtnet_probe: fill the RX ring, TX interrupts off.
                k.virtio_net_probe(&mut m.virtio_net[d]);
            }
            k
        })
        .collect()
}
