//! The network: the VF's interrupt throttling (`nic`), the VM's network
//! device (`net`), and DID's evaluation configurations (`config`).

use super::{bad, require, within, ScenarioError};
use serde::{Deserialize, Serialize};

/// Interrupt throttling of the VF.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ItrMode {
    /// The Linux 3.6 ixgbevf driver as it ran (the default; the only mode
    /// of that driver): its adaptive update never sees the cleaned packets
    /// (they are counted in the rings, the update reads the q_vector's
    /// containers), so the interval converges on IXGBE_100K_ITR, ≈10 µs,
    /// whatever the traffic (docs/calibration-sources.md §1).
    #[serde(rename = "ixgbevf-3.6")]
    Ixgbevf36,
    /// The same adaptive algorithm as intended (counts reach the update, as
    /// in the pre-3.5 and 4.x drivers): 100K / 20K / 8K classes by byte rate.
    Dynamic,
    /// A fixed interval (`itr_interval_us`).
    Fixed,
    /// No throttling.
    Off,
}

/// NIC settings.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NicSpec {
    /// Throttling mode.
    pub itr: ItrMode,
    /// Interval for `fixed`, µs, in (0, 1022]. Checked whatever `itr`
    /// says (a bad value is an error even where it is unused); given
    /// with another mode it draws a warning, since it has no effect.
    pub itr_interval_us: f64,
    /// TXDCTL.WTHRESH the VF driver programs (0 to 64): TX descriptors are
    /// written back, and the TX cause raised, once this many have completed
    /// or at the ITR timer. Linux 3.6's ixgbevf sets 8
    /// (`ixgbevf_up_complete`, "to encourage burst writeback"); 1 writes
    /// each back as it completes.
    pub tx_wthresh: u16,
}

impl Default for NicSpec {
    fn default() -> Self {
        NicSpec {
            itr: ItrMode::Ixgbevf36,
            itr_interval_us: 50.0,
            tx_wthresh: 8,
        }
    }
}

impl NicSpec {
    /// Checks the `nic` keys.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        within("nic", "tx_wthresh", self.tx_wthresh, 0, 64)?;
        // Checked in every mode: see `itr_interval_us`.
        let i = self.itr_interval_us;
        require(
            i > 0.0 && i <= 1022.0,
            "nic",
            "itr_interval_us",
            i,
            "in (0, 1022]",
        )
    }
}

impl ItrMode {
    /// Its name in a scenario.
    pub fn name(self) -> &'static str {
        match self {
            ItrMode::Ixgbevf36 => "ixgbevf-3.6",
            ItrMode::Dynamic => "dynamic",
            ItrMode::Off => "off",
            ItrMode::Fixed => "fixed",
        }
    }
}

/// Which network device carries the VM's TCP traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum NetDevice {
    /// The SR-IOV VF, to and from the external load generator.
    Vf,
    /// virtio-net with vhost, through a bridge to a process on the host.
    Virtio,
    /// virtio-vsock with vhost-vsock: the VM's stream sockets are
    /// `AF_VSOCK`, a host relay copies them to the host's TCP stack
    /// (docs/vcanal.md, "virtio-vsock"). The world runs netperf
    /// TCP_STREAM with the VM as the sender over it (`world::vsock`);
    /// datagram workloads are refused (the transport has none).
    VirtioVsock,
    /// ARM only: a 1 GbE NIC whose interrupt is a wire to a GIC SPI
    /// (level-sensitive) instead of an MSI through the ITS. The same
    /// descriptor rings and moderation as the VF; its driver masks the
    /// interrupt at the device in its handler and unmasks it when NAPI
    /// completes (docs/did-arm.md, "A NIC on a wired SPI").
    SpiNic,
}

/// The VM's network device.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NetSpec {
    /// The device.
    pub device: NetDevice,
    /// VIRTIO_RING_F_EVENT_IDX negotiated (Linux 3.6 guests and vhost do).
    pub event_idx: bool,
    /// Virtqueue size.
    pub queue_size: u16,
    /// Where a virtio-net VM's peer runs: `host` (a process on the VM's
    /// host, behind the bridge; DID's PV experiments) or `remote` (the
    /// load generator across the link, through the bridge and the host's
    /// NIC; ES2's testbed).
    pub peer: VirtioPeer,
    /// Where a VF guest's TCP peer runs: `remote` (the default: the load
    /// generator across the link) or `host` (a process on the VM's own
    /// host, reached through the NIC's embedded switch and the PF, as
    /// DID's SIPp UAS is).
    pub vf_peer: VirtioPeer,
    /// TSO/GSO on the peer host's TCP output (its Linux default): it
    /// sends packets of up to 64 KiB that its NIC (or, on the VM's host,
    /// the bridge) carries as MSS frames. A Linux receiver outside the
    /// guest (the peer, the VM's host) takes such a train back to back as
    /// one GRO packet.
    pub peer_gso: bool,
    /// GRO on the peer host's receive path (its Linux default): its NIC
    /// poll merges a connection's in-order frames into one packet, which
    /// TCP acknowledges once. `false` (`ethtool -K gro off`): every frame
    /// goes up alone and is acknowledged as a segment of its own.
    pub peer_gro: bool,
    /// The receive interrupt moderation of a peer host's NIC (the load
    /// generator, the VM's host through the embedded switch): `adaptive`
    /// (the default: the ixgbe-family update of `nic.itr = "dynamic"`,
    /// starting at 20K/s), `fixed` (`peer.rx_itr_us` of the calibration)
    /// or `off` (an interrupt per frame). Each interrupt's poll GRO-merges
    /// what it takes.
    pub peer_itr: PeerItr,
    /// The virtio-net device's back end in the host: `vhost` (vhost-net's
    /// in-kernel worker, the default) or `kvmtool-tap` (kvm-tools' 2012
    /// userspace back end: an ioeventfd thread, a TX and an RX thread,
    /// one readv/writev on the tap per frame, interrupts by
    /// `KVM_IRQ_LINE`; `hv::kvmtool_net`). Both run on `host.io_cores`.
    pub backend: NetBackend,
    /// With `backend = "kvmtool-tap"`: its threads are pinned to their
    /// `host.io_cores` entry (true, the default), or free to run on every
    /// core under the host scheduler, starting there (false: a process's
    /// threads under default scheduling, which wakes a thread onto an
    /// idle core).
    pub kvmtool_affinity: bool,
    /// With `backend = "kvmtool-tap"` and `peer = "remote"`: the core the
    /// host NIC's interrupt (and its receive path) goes to. Unset: the
    /// first of `host.io_cores`, where the back end's threads run (the I/O
    /// core under the paper's affinity; the vCPU's core when they share
    /// it).
    pub host_nic_irq_core: Option<usize>,
    /// `device = "virtio-vsock"`: the host relay's buffer, the most one
    /// read and one write move (socat's `-b`, 8192 by default), in bytes.
    pub vsock_relay_buf_bytes: u32,
    /// Queue pairs of the NIC function a native kernel drives (1 to 16,
    /// and at most its CPUs: ixgbe takes min(online CPUs, 16) for RSS).
    /// With more than one, the NIC spreads received flows over them by
    /// RSS, queue q interrupts CPU q and a CPU sends on its own queue
    /// (docs/vcanal.md, "VM size"). Bare metal only: the papers' guests
    /// ran Linux 3.5, whose ixgbevf drives one queue pair. Default 1.
    pub queues: u8,
    /// The client port of flow f is `client_port_base + f` in the 4-tuple
    /// RSS hashes (a flow is one connection slot whose tuple the model
    /// keeps fixed; docs/vcanal.md, "VM size"). 1024 to 60000; default
    /// 32768, the bottom of Linux's ephemeral range.
    pub client_port_base: u16,
}

/// The back end of a virtio-net device (`net.backend`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum NetBackend {
    /// vhost-net: one in-kernel worker thread per device.
    #[default]
    Vhost,
    /// kvm-tools' userspace back end over a tap (`vhost=0`, its default
    /// in 2012).
    KvmtoolTap,
}

impl NetBackend {
    /// Its name in a scenario.
    pub fn name(self) -> &'static str {
        match self {
            NetBackend::Vhost => "vhost",
            NetBackend::KvmtoolTap => "kvmtool-tap",
        }
    }
}

/// A peer host NIC's receive interrupt moderation (`net.peer_itr`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum PeerItr {
    /// The driver's adaptive interval.
    #[default]
    Adaptive,
    /// A fixed interval, `peer.rx_itr_us`.
    Fixed,
    /// No moderation.
    Off,
}

/// Where the peer of a virtio-net VM runs.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum VirtioPeer {
    /// A process on the VM's host, behind the bridge and the tap device.
    #[default]
    Host,
    /// The load generator at the other end of the link.
    Remote,
}

impl Default for NetSpec {
    fn default() -> Self {
        NetSpec {
            device: NetDevice::Vf,
            event_idx: true,
            queue_size: 256,
            peer: VirtioPeer::Host,
            vf_peer: VirtioPeer::Remote,
            peer_gso: true,
            peer_gro: true,
            peer_itr: PeerItr::Adaptive,
            backend: NetBackend::Vhost,
            kvmtool_affinity: true,
            host_nic_irq_core: None,
            vsock_relay_buf_bytes: 8192,
            queues: 1,
            client_port_base: crate::hw::wire::EPHEMERAL_LOW,
        }
    }
}

impl NetDevice {
    /// Its name in a scenario.
    pub fn name(self) -> &'static str {
        match self {
            NetDevice::Vf => "vf",
            NetDevice::Virtio => "virtio",
            NetDevice::VirtioVsock => "virtio-vsock",
            NetDevice::SpiNic => "spi-nic",
        }
    }

    /// The VM's frames go through the NIC model's descriptor rings (the
    /// VF, or the NIC on a wired SPI).
    pub fn nic_rings(self) -> bool {
        matches!(self, NetDevice::Vf | NetDevice::SpiNic)
    }
}

impl NetSpec {
    /// Checks the `net` keys under `scheme`; `peers`: some VM runs a
    /// workload that talks to peer hosts (only then is the device used).
    pub fn validate(&self, scheme: &str, peers: bool) -> Result<(), ScenarioError> {
        within(
            "net",
            "vsock_relay_buf_bytes",
            self.vsock_relay_buf_bytes,
            1,
            1 << 24,
        )?;
        within(
            "net",
            "queues",
            self.queues,
            1,
            crate::hw::x86::nic::MAX_QUEUES,
        )?;
        within(
            "net",
            "client_port_base",
            self.client_port_base,
            1024,
            60000,
        )?;
        if self.queues > 1 && scheme != "bare-metal" {
            return bad(
                "net",
                "queues",
                "more than one queue pair is a native kernel's ixgbe (scheme = \"bare-metal\"): the papers' guests ran Linux 3.5, whose ixgbevf drives one queue pair",
            );
        }
        if self.queues > 1 && self.device != NetDevice::Vf {
            return bad(
                "net",
                "queues",
                "more than one queue pair needs net.device = \"vf\" (the NIC's rings)",
            );
        }
        if peers && scheme == "bare-metal" && self.device == NetDevice::Virtio {
            return bad(
                "net",
                "device",
                "virtio needs a hypervisor: bare metal has no vhost",
            );
        }
        if !self.kvmtool_affinity && self.backend != NetBackend::KvmtoolTap {
            return bad(
                "net",
                "kvmtool_affinity",
                "false places kvm-tools' threads; it needs net.backend = \"kvmtool-tap\"",
            );
        }
        if self.host_nic_irq_core.is_some() && self.backend != NetBackend::KvmtoolTap {
            return bad(
                "net",
                "host_nic_irq_core",
                "places the bridged host NIC's interrupt; it needs net.backend = \"kvmtool-tap\"",
            );
        }
        let q = self.queue_size;
        let ok = q.is_power_of_two() && (16..=4096).contains(&q);
        require(ok, "net", "queue_size", q, "a power of two in 16..=4096")
    }
}

/// A configuration of DID's evaluation: its scheme and network device.
pub fn config_of(name: &str) -> Option<(&'static str, NetDevice)> {
    Some(match name {
        "bare-metal" | "sriov-bm" => ("bare-metal", NetDevice::Vf),
        "sriov" => ("kvm", NetDevice::Vf),
        "sriov-did" => ("did", NetDevice::Vf),
        "pv" => ("kvm", NetDevice::Virtio),
        "pv-did" => ("did", NetDevice::Virtio),
        _ => return None,
    })
}

/// Every name `config` accepts.
pub const CONFIGS: [&str; 6] = [
    "bare-metal",
    "sriov-bm",
    "sriov",
    "sriov-did",
    "pv",
    "pv-did",
];

#[cfg(test)]
mod tests {
    use super::super::tests::{err, ok, BASE};

    /// virtio-vsock: UDP workloads and vCanal are refused by name; a TCP
    /// stream with the VM as the sender runs, given the worker's core.
    #[test]
    fn virtio_vsock_refuses_datagrams_and_runs_a_stream_sender() {
        let e = err(BASE, &["net.device=virtio-vsock"]);
        assert!(
            e.contains("net.device") && e.contains("no datagrams"),
            "{e}"
        );
        assert!(e.contains("vm[0].workload.udp"), "{e}");
        let tcp = r#"
scheme = "kvm"
duration_s = 0.1
[workload.netperf]
test = "tcp-stream"
direction = "send"
"#;
        let e = err(tcp, &["net.device=virtio-vsock"]);
        assert!(e.contains("host.io_cores"), "{e}");
        let vs = ["net.device=virtio-vsock", "host.io_cores=[1]"];
        ok(tcp, &vs);
        let e = err(tcp, &[vs[0], vs[1], "workload.netperf.direction=recv"]);
        assert!(e.contains("workload.netperf.direction"), "{e}");
        let e = err(tcp, &[vs[0], vs[1], "scheme=bare-metal"]);
        assert!(e.contains("net.device") && e.contains("bare metal"), "{e}");
        let e = err(tcp, &[vs[0], vs[1], "net.vsock_relay_buf_bytes=0"]);
        assert!(e.contains("net.vsock_relay_buf_bytes"), "{e}");
        let e = err(
            tcp,
            &["net.device=virtio-vsock", "workload.netperf.test=udp-rr"],
        );
        assert!(e.contains("vm[0].workload.netperf.test"), "{e}");
        let e = err(
            tcp,
            &[
                "net.device=virtio-vsock",
                "workload.vcanal={service_core=1}",
            ],
        );
        assert!(e.contains("two socket paths"), "{e}");
        // The other devices are untouched.
        ok(tcp, &["net.device=virtio"]);
    }

    /// nginx against ApacheBench runs over virtio-vsock with a connection
    /// per request (a relay process each); ab -k is refused by its key,
    /// and so is another network workload beside it.
    #[test]
    fn virtio_vsock_runs_nginx_without_keep_alive_only() {
        let web = r#"
scheme = "kvm"
duration_s = 0.1
[host]
io_cores = [1]
[net]
device = "virtio-vsock"
[workload.nginx]
workers = 2
"#;
        ok(web, &[]);
        let e = err(web, &["workload.nginx.keep_alive=true"]);
        assert!(e.contains("workload.nginx.keep_alive"), "{e}");
        let e = err(web, &["workload.apache={}"]);
        assert!(e.contains("nginx and apache cannot be combined"), "{e}");
        let e = err(web, &["scheme=bare-metal"]);
        assert!(e.contains("bare metal"), "{e}");
    }

    #[test]
    fn itr_interval_is_checked_in_every_mode_and_warned_about_where_unused() {
        for itr in ["ixgbevf-3.6", "dynamic", "off", "fixed"] {
            let e = err(BASE, &[&format!("nic.itr={itr}"), "nic.itr_interval_us=-5"]);
            assert!(e.contains("nic.itr_interval_us"), "{itr}: {e}");
        }
        let s = ok(BASE, &["nic.itr=dynamic", "nic.itr_interval_us=100"]);
        assert_eq!(s.warnings.len(), 1);
        assert!(
            s.warnings[0].contains("nic.itr_interval_us"),
            "{:?}",
            s.warnings
        );
        assert!(ok(BASE, &["nic.itr=fixed", "nic.itr_interval_us=100"])
            .warnings
            .is_empty());
        // The default is not a choice: no warning.
        assert!(ok(BASE, &["nic.itr=off"]).warnings.is_empty());
    }
}
