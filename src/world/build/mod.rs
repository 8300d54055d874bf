//! Building a world from a scenario, in stages that each own one concern
//! and read their part of the (canonical, `[[vm]]`-only) scenario:
//!
//! 1. [`topology`]: cores, VMs, vCPUs and where each may run;
//! 2. [`devices`]: the machine, each VM's VF / virtio-net / virtio-blk,
//!    their vectors and MSI-X entries;
//! 3. [`hypervisor`]: hypervisor state, ioeventfds, the device back ends;
//! 4. [`guests`]: each VM's kernel and its drivers' probes;
//! 5. [`workloads`]: programs in the guests, peer hosts and load
//!    generators;
//! 6. [`boot`]: host boot, the scheme's setup, the first vCPUs and events.
//!
//! No stage treats one VM differently from another: a VM, a device or a
//! host thread is data in the scenario.

mod arm;
mod boot;
mod devices;
mod es2;
mod guests;
mod hypervisor;
mod riscv;
mod tcp;
mod topology;
mod vectors;
mod workloads;

use super::{BuildError, World};
use crate::calibration::Calibration;
use crate::hv::scheme::{self, Scheme};
use crate::scenario::Scenario;

pub(in crate::world) use tcp::rcvbuf_config;
pub(in crate::world) use workloads::peer_costs;

/// The guest's MSI-X vectors for its virtio-net RX and TX queues.
pub const VIRTIO_NET_VECTORS: [u8; 2] = [0x51, 0x52];

/// The virtio-net device's notify port (queue q at port + q).
pub const VIRTIO_NOTIFY_PORT: u16 = 0xC050;

/// The guest's MSI-X vector for its virtio-blk request queue.
pub const VIRTIO_BLK_VECTOR: u8 = 0x53;

/// The virtio-blk device's notify port.
pub const VIRTIO_BLK_NOTIFY_PORT: u16 = 0xC090;

/// Descriptors in the virtio-blk request queue.
const VIRTIO_BLK_QUEUE_SIZE: u16 = 128;

/// The ioeventfd of virtio-blk device `d`'s request queue (virtio-net
/// device d's are 2d and 2d + 1, far below).
pub(super) fn blk_kick_fd(d: usize) -> u16 {
    0x8000 + d as u16
}

/// The ioeventfds of virtio-net device `d`'s RX and TX queues.
fn net_kick_fds(d: usize) -> [u16; 2] {
    [2 * d as u16, 2 * d as u16 + 1]
}

/// The name of VM `vm`'s random stream `base`: VM 0's keeps the plain
/// name a single-VM scenario has always used (as its metrics do), so a
/// seed gives the same run whether the VM is one of many or alone.
fn rng_stream(base: &str, vm: usize) -> String {
    match vm {
        0 => base.to_string(),
        vm => format!("{base}.vm{vm}"),
    }
}

impl World {
    /// Builds the world a scenario describes.
    pub fn build(s: &Scenario, cal: &Calibration) -> Result<World, BuildError> {
        if s.arch == crate::scenario::ArchSpec::Arm64 {
            let scheme = crate::hv::arm::by_name(&s.scheme, arm::hyp_mode(s))
                .ok_or_else(|| BuildError::Scenario(format!("unknown ARM scheme {}", s.scheme)))?;
            return arm::build(s, cal, scheme);
        }
        if s.arch == crate::scenario::ArchSpec::Riscv64 {
            return riscv::build(s, cal);
        }
        let scheme = scheme::by_name_with(&s.scheme, &s.hv)
            .ok_or_else(|| BuildError::Scenario(format!("unknown scheme {}", s.scheme)))?;
        Self::build_with(s, cal, scheme)
    }

    /// Builds the ARM world (`arch = "arm64"`) a scenario describes with an
    /// ARM scheme of the caller's (a design under study); the scenario's
    /// `scheme` key only has to name a known ARM scheme.
    pub fn build_arm_with(
        s: &Scenario,
        cal: &Calibration,
        scheme: Box<dyn crate::hv::arm::ArmScheme>,
    ) -> Result<World, BuildError> {
        if s.arch != crate::scenario::ArchSpec::Arm64 {
            return Err(BuildError::Scenario(
                "an ARM scheme needs arch = \"arm64\"".into(),
            ));
        }
        arm::build(s, cal, scheme)
    }

    /// Builds the world a scenario describes with a scheme of the caller's
    /// (a design under study, written outside this crate); the scenario's
    /// `scheme` key only has to name a known scheme.
    pub fn build_with(
        s: &Scenario,
        cal: &Calibration,
        scheme: Box<dyn Scheme>,
    ) -> Result<World, BuildError> {
        // A calibration built in code has not been through from_toml.
        cal.check()?;
        // What the user changed, before the clock scaling derives the rest.
        let changes = cal.changes_from_shipped();
        // Cycle-bound costs at the experiment's core clock (`cpu.ghz`).
        let cal = &cal.at_cpu_clock();
        let topo = topology::Topology::plan(s, scheme.as_ref())?;
        let (mut m, devs) = devices::build(s, cal, &topo)?;
        let hv = hypervisor::state(s, cal, &topo, &devs);
        let costs = hypervisor::costs(cal, devs.apic_timer_period);
        let pv = hypervisor::vhost(s, cal, &topo, &devs);
        let kvmtool = hypervisor::kvmtool(s, cal, &topo, &devs);
        if kvmtool.is_some()
            && (scheme.backend_polls()
                || s.hv.es2().vhost_policy() != crate::hv::vhost::Hybrid::Off)
        {
            // ELVIS's side core and ES2's hybrid handlers poll vhost's
            // rings from its worker: kvmtool's threads do not.
            return Err(BuildError::Scenario(format!(
                "net.backend: \"kvmtool-tap\" has no polling worker, which scheme {} (es2_hybrid {:?}) needs; use net.backend = \"vhost\"",
                s.scheme, s.hv.es2_hybrid
            )));
        }
        if let Some(c) = s.net.host_nic_irq_core.filter(|&c| c >= topo.cores) {
            return Err(BuildError::Scenario(format!(
                "net.host_nic_irq_core: {c} must be a core of the machine (0..{})",
                topo.cores
            )));
        }
        let blk = hypervisor::blk_paths(s, cal, &topo, &devs);
        let clockevent = match s.guest.lapic_timer {
            crate::scenario::LapicTimer::Oneshot => {
                crate::world::vmx::lapic_clockevent(devs.apic_timer_period)
            }
            crate::scenario::LapicTimer::TscDeadline => {
                crate::world::vmx::tsc_deadline_clockevent(devs.clocks.tsc_hz)
            }
        };
        let mut guests = guests::kernels(s, cal, &topo, &devs, &mut m, scheme.as_ref(), clockevent);
        let outside = workloads::spawn(s, cal, &topo, &devs, m.link, &mut guests)?;
        let canal =
            super::vcanal::build(s, cal, m.link, &mut guests).map_err(BuildError::Scenario)?;
        if let Some(c) = canal
            .as_ref()
            .filter(|c| topo.vcpus.iter().any(|p| p.core == c.core))
        {
            // The service core polls without pause (vcanal.md §2.4): a vCPU
            // there would never run, and §3 gives it a core of its own.
            return Err(BuildError::Scenario(format!(
                "workload.vcanal.service_core: core {} also runs a vCPU; the service needs a core of its own",
                c.core
            )));
        }
        let vsock =
            super::vsock::build(s, cal, m.link, &mut guests).map_err(BuildError::Scenario)?;
        if let Some(v) = vsock
            .as_ref()
            .filter(|v| topo.vcpus.iter().any(|p| p.core == v.core))
        {
            // A vCPU sharing the worker's core would need the host
            // scheduler between them, which the path does not model.
            return Err(BuildError::Scenario(format!(
                "host.io_cores: core {} also runs a vCPU; the vhost-vsock worker and the relay need a core of their own",
                v.core
            )));
        }
        let parts = boot::Parts {
            topo,
            m,
            devs,
            hv,
            costs,
            guests,
            outside,
            pv,
            kvmtool,
            blk,
            canal,
            vsock,
        };
        let mut w = boot::power_on(s, cal, scheme, parts);
        w.calibration_changes = changes;
        Ok(w)
    }
}
