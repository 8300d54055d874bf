//! Stage 2, devices: the platform's hardware (cores, LAPICs, the NIC with
//! one VF per VM, the link, the IOMMU) and each VM's devices: its VF,
//! virtio-net and virtio-blk, their guest vectors (checked for collisions)
//! and the VF's MSI-X entry.

use super::topology::Topology;
use super::{vectors, BuildError, VIRTIO_BLK_NOTIFY_PORT, VIRTIO_BLK_VECTOR, VIRTIO_NOTIFY_PORT};
use super::{VIRTIO_BLK_QUEUE_SIZE, VIRTIO_NET_VECTORS};
use crate::calibration::Calibration;
use crate::engine::{from_us, Time};
use crate::guest::itr::{ItrDriver, ItrParams};
use crate::hv::host::host_device_vector;
use crate::hv::VfAssignment;
use crate::hw::virtio_blk::VirtioBlkDev;
use crate::hw::virtio_net::VirtioNetDev;
use crate::hw::x86::lapic::ApicClocks;
use crate::hw::x86::nic::{Link, Nic, NicConfig};
use crate::hw::x86::Machine;
use crate::scenario::{ItrMode, NetDevice, Scenario, WorkloadSpec};

/// Which devices each VM has, and the platform clocks the guests see.
pub(in crate::world) struct DeviceMap {
    /// The LAPIC's bus and TSC clocks.
    pub clocks: ApicClocks,
    /// One tick of the LAPIC timer at the divider the guests program.
    pub apic_timer_period: Time,
    /// The VF driver's interrupt-throttling parameters.
    pub itr: ItrParams,
    /// Per VM: its VF, if it has one (VF i, IRT entry i).
    pub vf: Vec<Option<VfAssignment>>,
    /// Per VM: its virtio-net device, numbered in VM order.
    pub net_dev: Vec<Option<usize>>,
    /// Per VM: its virtio-blk device, numbered in VM order.
    pub blk_dev: Vec<Option<usize>>,
}

impl DeviceMap {
    /// Whether some VM has a virtio-net device (vhost back ends run).
    pub fn has_virtio_net(&self) -> bool {
        self.net_dev.iter().any(|d| d.is_some())
    }

    /// Each VM that has a virtio-net device, with the device's index: what
    /// a back end (vhost's workers, kvm-tools' threads) serves.
    pub fn virtio_net_devs(&self) -> Vec<(usize, usize)> {
        self.net_dev
            .iter()
            .enumerate()
            .filter_map(|(vm, d)| d.map(|d| (vm, d)))
            .collect()
    }
}

/// A VM's peers reach it through `net.device`; UDP PacketGen always comes
/// through the VF.
fn has_vf(s: &Scenario, w: &WorkloadSpec) -> bool {
    w.udp.is_some() || (w.peers() && s.net.device.nic_rings())
}

/// The VF driver's interrupt-throttling parameters (the driver's, from
/// calibration; the mode from `nic.itr`).
fn itr_params(s: &Scenario, cal: &Calibration) -> ItrParams {
    ItrParams {
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
    }
}

/// The EITR value every VF vector starts with.
fn initial_eitr(s: &Scenario, cal: &Calibration, itr: &ItrParams) -> Result<u32, BuildError> {
    Ok(match s.nic.itr {
        ItrMode::Ixgbevf36 | ItrMode::Dynamic => itr.low_reg,
        ItrMode::Off => 0,
        ItrMode::Fixed => {
            // The EITR interval field is 9 bits (bits 11:3) of
            // itr_unit_us each.
            let unit_ps = from_us(cal.nic.itr_unit_us.value);
            let units = (s.nic.itr_interval_us * 1e6 / unit_ps as f64).round();
            if units > 511.0 {
                return Err(BuildError::Scenario(format!(
                    "nic.itr_interval_us = {} exceeds the EITR field: at most {} us with this calibration's nic.itr_unit_us",
                    s.nic.itr_interval_us,
                    511.0 * cal.nic.itr_unit_us.value
                )));
            }
            (units as u32).max(1) << 3
        }
    })
}

/// Numbers the VMs that `has` a device in VM order.
fn number_devices(
    views: &[crate::scenario::VmView],
    has: impl Fn(&WorkloadSpec) -> bool,
) -> Vec<Option<usize>> {
    let mut next = 0;
    views
        .iter()
        .map(|v| {
            has(v.workload).then(|| {
                next += 1;
                next - 1
            })
        })
        .collect()
}

/// Builds the machine and each VM's devices.
pub(in crate::world) fn build(
    s: &Scenario,
    cal: &Calibration,
    topo: &Topology,
) -> Result<(Machine, DeviceMap), BuildError> {
    let nvm = topo.vms();
    let bus_period_ps = (1e6 / cal.apic.bus_mhz.value).round() as u64;
    let clocks = ApicClocks {
        bus_period_ps,
        tsc_hz: (cal.cpu.ghz.value * 1e9) as u64,
    };
    let itr = itr_params(s, cal);
    // One VF per VM, each its own PCIe function.
    let requester_ids: Vec<u16> = (0..nvm as u16).map(|i| 0x0110 + i).collect();
    let queues = s.net.queues;
    let nic = Nic::new(
        NicConfig {
            vfs: nvm as u16,
            rx_ring_size: cal.nic.rx_ring_size.value as u16,
            // One vector per queue pair and the "other" vector.
            vectors_per_vf: if queues > 1 { queues + 1 } else { 2 },
            queues,
            client_port_base: s.net.client_port_base,
            itr_unit_ps: from_us(cal.nic.itr_unit_us.value),
            initial_eitr: initial_eitr(s, cal, &itr)?,
            tx_wthresh: s.nic.tx_wthresh,
        },
        &requester_ids,
    )
    .map_err(|e| BuildError::Scenario(e.to_string()))?;
    let link = Link {
        bits_per_sec: (cal.nic.link_gbps.value * 1e9) as u64,
        propagation_ps: 500_000,
    };
    udp_within_link(topo, &link)?;
    let mut m = Machine::new(topo.cores, topo.vcpus.len(), clocks, nic, link);
    for (i, c) in m.cores.iter_mut().enumerate() {
        c.smt_sibling = s.machine.smt_sibling(i);
    }
    let virtualized = topo.virtualized;
    let blk_dev = number_devices(&topo.views, |w| virtualized && w.fio.is_some());
    let net_dev = number_devices(&topo.views, |w| {
        virtualized && s.net.device == NetDevice::Virtio && w.peers()
    });
    let mut vf = Vec::with_capacity(nvm);
    for (i, v) in topo.views.iter().enumerate() {
        // The guest's vectors must be distinct: fixed ones first, so a
        // collision names the key that moved.
        let mut guest_vectors = Vec::with_capacity(7);
        if net_dev[i].is_some() {
            guest_vectors.push(("the virtio-net RX queue", VIRTIO_NET_VECTORS[0]));
            guest_vectors.push(("the virtio-net TX queue", VIRTIO_NET_VECTORS[1]));
        }
        if blk_dev[i].is_some() {
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
        let with_vf = has_vf(s, v.workload);
        if with_vf {
            guest_vectors.push(("guest.vf_vector", s.guest.vf_vector));
            if queues > 1 && usize::from(queues) > v.cores.len() {
                return Err(BuildError::Scenario(format!(
                    "net.queues = {queues}: VM {i} has {} CPUs, and ixgbe takes at most one queue pair per online CPU",
                    v.cores.len()
                )));
            }
            for q in 1..queues {
                let Some(vector) = s.guest.vf_vector.checked_add(q) else {
                    return Err(BuildError::Scenario(format!(
                        "net.queues = {queues}: guest.vf_vector + {q} passes vector 255"
                    )));
                };
                guest_vectors.push(("guest.vf_vector + a queue (net.queues)", vector));
            }
        }
        vectors::check_guest_vectors(&guest_vectors)?;
        let a = with_vf.then_some(VfAssignment {
            vf: i as u16,
            irte: i as u16,
            guest_vector: s.guest.vf_vector,
            host_vector: host_device_vector(i),
            requester_id: requester_ids[i],
            queues,
            irte_stride: nvm as u16,
        });
        if let Some(a) = a {
            let entries = m.irt.len();
            for q in 0..queues {
                let handle = a.queue_irte(q);
                if usize::from(handle) >= entries {
                    return Err(BuildError::Scenario(format!(
                        "net.queues = {queues}: {nvm} VMs' queue vectors need more than the IOMMU's {entries} IRT entries"
                    )));
                }
                m.nic
                    .program_msix(i as u16, q, handle)
                    .map_err(|e| BuildError::Scenario(e.to_string()))?;
            }
            if queues > 1 {
                // ixgbe_setup_mrqc: the driver's key and table.
                m.nic
                    .configure_rss(
                        i as u16,
                        &crate::guest::net::IXGBE_RSS_KEY,
                        &crate::guest::net::ixgbe_reta(queues),
                    )
                    .map_err(|e| BuildError::Scenario(e.to_string()))?;
            }
        }
        vf.push(a);
        if blk_dev[i].is_some() {
            let dev = VirtioBlkDev::new(
                VIRTIO_BLK_QUEUE_SIZE,
                s.net.event_idx,
                VIRTIO_BLK_NOTIFY_PORT,
            )
            .map_err(|e| BuildError::Scenario(e.to_string()))?;
            m.virtio_blk.push(dev);
        }
        if net_dev[i].is_some() {
            let dev = VirtioNetDev::new(s.net.queue_size, s.net.event_idx, VIRTIO_NOTIFY_PORT)
                .map_err(|e| BuildError::Scenario(e.to_string()))?;
            m.virtio_net.push(dev);
        }
    }
    Ok((
        m,
        DeviceMap {
            clocks,
            apic_timer_period: bus_period_ps * 16,
            itr,
            vf,
            net_dev,
            blk_dev,
        },
    ))
}

/// Ethernet (14), IPv4 (20) and UDP (8) headers: a UDP datagram's frame as
/// the driver sees it is its payload plus these.
const UDP_FRAME_HEADERS: u32 = 14 + 20 + 8;

/// The UDP senders of every VM share the NIC's one port (each VM's VF is a
/// function of it): their offered packets, at the frame size each sends,
/// must fit the link, or the generator would "deliver" more than the wire
/// carries (14.88 Mpps of 1472-byte payloads is 183 Gb/s on 10 GbE).
fn udp_within_link(topo: &Topology, link: &crate::hw::x86::nic::Link) -> Result<(), BuildError> {
    let mut load = 0.0;
    let mut first = None;
    for v in &topo.views {
        if let Some(u) = &v.workload.udp {
            let wire_s = link.wire_time(u.payload_bytes + UDP_FRAME_HEADERS) as f64 / 1e12;
            load += u.rate_pps * wire_s;
            first.get_or_insert((v.workload_key.clone(), u.payload_bytes, wire_s));
        }
    }
    match first {
        Some((key, payload, wire_s)) if load > 1.0 + 1e-9 => Err(BuildError::Scenario(format!(
            "{key}.udp.rate_pps: the UDP senders offer {:.1}% of the {} Gb/s link (at {payload}-byte payloads one frame holds the wire {:.1} ns: at most {:.0} packets/s in all)",
            load * 100.0,
            link.bits_per_sec as f64 / 1e9,
            wire_s * 1e9,
            1.0 / wire_s
        ))),
        _ => Ok(()),
    }
}
