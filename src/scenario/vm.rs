//! The VMs (`[[vm]]`): each one's vCPUs, their cores, its interrupt
//! routing and its workload; the view of them the world builder reads.
//! A scenario without `[[vm]]` tables stands for one VM (see
//! [`VmSpec::top_level`]).

use super::{bad, Scenario, ScenarioError, WorkloadSpec};
use crate::engine::{CpuMask, CPUMASK_BITS};
use serde::{Deserialize, Serialize};

/// One VM: a `[[vm]]` table, or the VM a scenario without them stands
/// for ([`VmSpec::top_level`]).
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    /// Its name in reports (default `vm<i>`).
    #[serde(default)]
    pub name: String,
    /// vCPUs (1 to [`Self::MAX_VCPUS`]).
    #[serde(default = "one_u32")]
    pub vcpus: u32,
    /// The core its vCPU thread is pinned to (1..cores; core 0 is the
    /// host's). VMs may share a core: the host scheduler multiplexes them.
    /// With several vCPUs, give `cores` instead (or vCPU i goes to
    /// `core + i`).
    #[serde(default)]
    pub core: Option<usize>,
    /// The core each vCPU thread is pinned to, one per vCPU.
    #[serde(default)]
    pub cores: Option<Vec<usize>>,
    /// The cores the vCPU threads may run on (a cpuset, `virsh vcpupin`):
    /// the host scheduler places and migrates them within it. `"any"`
    /// (every core but the host's core 0), one list for every vCPU, or one
    /// list per vCPU. `core`/`cores` then give where each starts (default:
    /// spread over the set). Default: pinned to `core`/`cores`.
    #[serde(default)]
    pub allowed_cores: Option<AllowedCores>,
    /// The vCPU the workload's tasks are bound to.
    #[serde(default)]
    pub app_vcpu: u32,
    /// The vCPUs the VF's MSI targets (the guest's `smp_affinity` for its
    /// IRQ; the VM's virtio devices' MSIs follow it too). Default: vCPU 0.
    #[serde(default)]
    pub irq_affinity: Option<Vec<u32>>,
    /// The MSI's delivery mode: `fixed` (one vCPU) or `lowest-priority`
    /// (any vCPU of `irq_affinity`; Linux's flat-mode default up to 8 CPUs).
    #[serde(default)]
    pub msi_mode: MsiMode,
    /// Receive packet steering: the guest's `rps_cpus` for its receive
    /// queue (`/sys/class/net/eth0/queues/rx-0/rps_cpus`), a set of its
    /// vCPUs. The NAPI poll on the vCPU that took the device interrupt
    /// queues each received packet, by its flow's hash, on the backlog of
    /// one of them and wakes that vCPU with a CALL_FUNCTION_SINGLE IPI
    /// (vector 0xfb) at the end of its NET_RX run; the packet's protocol
    /// processing runs there. Default: off.
    #[serde(default)]
    pub rps_cpus: Option<Vec<u32>>,
    /// A lowest-priority CPU-bound task on every vCPU (ES2's burn
    /// scripts: the vCPUs never idle, so the host keeps switching them).
    #[serde(default)]
    pub burn: bool,
    /// This many identical VMs (consolidation sweeps: `--set vm.0.copies=4`).
    #[serde(default = "one_u32")]
    pub copies: u32,
    /// Only the first this many copies run `workload`; the others keep
    /// their vCPUs, pinning and burners but run nothing else (ES2 §6.3:
    /// "1–4 VMs tested at once; the rest are background"). Default: all.
    #[serde(default)]
    pub active_copies: Option<u32>,
    /// The cores copies are spread over: vCPU j of copy k runs on
    /// `copies_cores[(k * vcpus + j) % len]`. Default: every copy on
    /// `cores`.
    #[serde(default)]
    pub copies_cores: Option<Vec<usize>>,
    /// Its workload. With several VMs: `udp`, `cyclictest`, `whileloop`
    /// (a CPU-bound guest that does not end the run).
    #[serde(default)]
    pub workload: WorkloadSpec,
    /// Whether this is the VM of the single-VM form (a top-level
    /// `workload`, no `[[vm]]`): its workload's keys are named as the
    /// user wrote them (`workload.udp.rate_pps`), and a serialized
    /// scenario writes it back in that form. Not a key.
    #[serde(skip)]
    pub(crate) top_level: bool,
}

/// The cores a VM's vCPU threads may run on.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(
    untagged,
    expecting = "\"any\", a list of cores, or one list of cores per vCPU"
)]
pub enum AllowedCores {
    /// `"any"`: every core but the host's core 0.
    Named(String),
    /// One set for every vCPU.
    Shared(Vec<usize>),
    /// One set per vCPU.
    PerVcpu(Vec<Vec<usize>>),
}

impl AllowedCores {
    /// The set of vCPU `j` on a machine of `machine_cores` cores.
    fn set(&self, j: usize, machine_cores: usize) -> Vec<usize> {
        match self {
            AllowedCores::Named(_) => (1..machine_cores).collect(),
            AllowedCores::Shared(v) => v.clone(),
            AllowedCores::PerVcpu(v) => v.get(j).cloned().unwrap_or_default(),
        }
    }
}

/// How a device MSI picks its vCPU among the affinity set.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum MsiMode {
    /// The one vCPU named.
    #[default]
    Fixed,
    /// The lowest-priority vCPU of the set (KVM arbitrates in software;
    /// a remapping IRTE names the set's first vCPU).
    LowestPriority,
}

impl VmSpec {
    /// Most vCPUs a VM may have (the guest's CPU masks are this wide).
    pub const MAX_VCPUS: u32 = crate::engine::VCPUMASK_BITS as u32;

    /// The VM the single-VM form stands for: one vCPU pinned to core 1
    /// (core 0 is the host's), MSI fixed to vCPU 0, no RPS, no burners,
    /// one copy, running `workload` (the top-level one).
    pub fn top_level(workload: WorkloadSpec) -> VmSpec {
        VmSpec {
            name: String::new(),
            vcpus: 1,
            core: Some(1),
            cores: None,
            allowed_cores: None,
            app_vcpu: 0,
            irq_affinity: None,
            msi_mode: MsiMode::Fixed,
            rps_cpus: None,
            burn: false,
            copies: 1,
            active_copies: None,
            copies_cores: None,
            workload,
            top_level: true,
        }
    }

    /// The key of its workload table as the user wrote it: `workload`
    /// (the single-VM form) or `vm[i].workload`.
    pub fn workload_key(&self, i: usize) -> String {
        if self.top_level {
            "workload".into()
        } else {
            format!("vm[{i}].workload")
        }
    }

    /// The core each vCPU of copy `k` starts on (and stays on, unless
    /// `allowed_cores` lets it move).
    pub fn copy_cores(&self, k: usize, machine_cores: usize) -> Vec<usize> {
        let n = self.vcpus as usize;
        match (&self.copies_cores, &self.allowed_cores) {
            (Some(pool), _) if !pool.is_empty() => {
                (0..n).map(|j| pool[(k * n + j) % pool.len()]).collect()
            }
            (_, Some(a)) if self.core.is_none() && self.cores.is_none() => {
                // Spread over the set: vCPU j of copy k takes its
                // (k * vcpus + j)th core, round the set.
                (0..n)
                    .map(|j| {
                        let set = a.set(j, machine_cores);
                        set.get((k * n + j) % set.len().max(1))
                            .copied()
                            .unwrap_or(1)
                    })
                    .collect()
            }
            _ => self.vcpu_cores(),
        }
    }

    /// The cores each vCPU may run on, as masks (bit i = core i): its
    /// `allowed_cores` set, or its start core of copy `k`.
    pub fn copy_allowed(&self, k: usize, machine_cores: usize) -> Vec<CpuMask> {
        let start = self.copy_cores(k, machine_cores);
        // Validation keeps every core below machine.cores, itself within
        // the masks' width; `% CPUMASK_BITS` only keeps an unchecked
        // scenario from panicking here.
        (0..self.vcpus as usize)
            .map(|j| match &self.allowed_cores {
                Some(a) => CpuMask::of(a.set(j, machine_cores).iter().map(|&c| c % CPUMASK_BITS)),
                None => CpuMask::single(start[j] % CPUMASK_BITS),
            })
            .collect()
    }

    /// The core of each vCPU.
    pub fn vcpu_cores(&self) -> Vec<usize> {
        match (&self.cores, self.core) {
            (Some(c), _) => c.clone(),
            (None, Some(c)) => (0..self.vcpus as usize)
                .map(|i| c.saturating_add(i))
                .collect(),
            (None, None) => (0..self.vcpus as usize).map(|i| 1 + i).collect(),
        }
    }
}

fn one_u32() -> u32 {
    1
}

/// A VM as the builder sees it, from `[[vm]]` or the top level.
#[derive(Clone, Debug)]
pub struct VmView<'a> {
    /// Name.
    pub name: String,
    /// Core of its first vCPU.
    pub core: usize,
    /// Core of each vCPU (where it starts).
    pub cores: Vec<usize>,
    /// The cores each vCPU may run on (bit i = core i).
    pub allowed: Vec<CpuMask>,
    /// The vCPU its workload's tasks run on.
    pub app_vcpu: usize,
    /// The vCPUs its VF's MSI may target.
    pub irq_affinity: Vec<usize>,
    /// The MSI's delivery mode.
    pub msi_mode: MsiMode,
    /// The vCPUs RPS steers received packets to (empty: off).
    pub rps_cpus: Vec<usize>,
    /// Lowest-priority burners on every vCPU.
    pub burn: bool,
    /// Its workload.
    pub workload: &'a WorkloadSpec,
    /// Its workload table's key as the user wrote it (`workload` or
    /// `vm[i].workload`), for errors found while building.
    pub workload_key: String,
}

impl Scenario {
    /// The VMs to build, in order (VM 0 first).
    pub fn vm_views(&self) -> Vec<VmView<'_>> {
        static IDLE: std::sync::LazyLock<WorkloadSpec> =
            std::sync::LazyLock::new(WorkloadSpec::default);
        self.vms
            .iter()
            .enumerate()
            .flat_map(|(j, v)| (0..v.copies as usize).map(move |k| (j, v, k)))
            .enumerate()
            .map(|(i, (j, v, k))| VmView {
                name: if v.name.is_empty() {
                    format!("vm{i}")
                } else {
                    v.name.clone()
                },
                core: v.copy_cores(k, self.machine.cores)[0],
                cores: v.copy_cores(k, self.machine.cores),
                allowed: v.copy_allowed(k, self.machine.cores),
                app_vcpu: v.app_vcpu as usize,
                irq_affinity: v
                    .irq_affinity
                    .as_ref()
                    .map_or(vec![0], |a| a.iter().map(|&x| x as usize).collect()),
                msi_mode: v.msi_mode,
                rps_cpus: v
                    .rps_cpus
                    .as_ref()
                    .map_or_else(Vec::new, |a| a.iter().map(|&x| x as usize).collect()),
                burn: v.burn,
                workload: if v.active_copies.is_some_and(|a| k as u32 >= a) {
                    &IDLE
                } else {
                    &v.workload
                },
                workload_key: v.workload_key(j),
            })
            .collect()
    }

    /// Most VMs a scenario may have.
    pub const MAX_VMS: usize = 1024;

    /// Most vCPUs of all VMs together: events name a vCPU in 16 bits.
    pub const MAX_TOTAL_VCPUS: usize = u16::MAX as usize;

    /// Checks the VMs (each one's keys and workload) and what the
    /// scenario's other sections allow with several of them.
    /// `net.device = "virtio-vsock"`: the combinations that cannot exist
    /// are named first, then the path's missing wiring.
    pub(super) fn validate_vsock(&self) -> Result<(), ScenarioError> {
        use super::workloads::NetperfTest;
        if self.net.device != super::NetDevice::VirtioVsock {
            return Ok(());
        }
        for (i, v) in self.vms.iter().enumerate() {
            let w = &v.workload;
            let udp = if w.udp.is_some() {
                Some("udp")
            } else if w.sip.is_some() {
                Some("sip")
            } else if w.ping.is_some() {
                Some("ping")
            } else {
                w.netperf
                    .as_ref()
                    .filter(|n| n.test != NetperfTest::TcpStream)
                    .map(|_| "netperf.test")
            };
            if let Some(t) = udp {
                return bad(
                    "net",
                    "device",
                    format!(
                        "virtio-vsock carries stream sockets only: Linux 5.x's virtio \
                         transport has no datagrams (virtio_transport_dgram_enqueue \
                         returns EOPNOTSUPP) and no ICMP, but vm[{i}].workload.{t} needs them"
                    ),
                );
            }
            if w.vcanal.is_some() {
                return bad(
                    "net",
                    "device",
                    format!(
                        "virtio-vsock and vm[{i}].workload.vcanal are two socket paths; \
                         a VM's sockets take one"
                    ),
                );
            }
        }
        // What the world runs over it: netperf TCP_STREAM with the VM as
        // the sender, or nginx against ApacheBench with a connection per
        // request, on a virtualized scheme, with the worker's core.
        for (i, v) in self.vms.iter().enumerate() {
            let w = &v.workload;
            let key = if self.vms.len() == 1 && i == 0 {
                "workload".to_string()
            } else {
                format!("vm[{i}].workload")
            };
            if let Some(n) = &w.nginx {
                if n.keep_alive {
                    return bad(
                        &format!("{key}.nginx"),
                        "keep_alive",
                        "over virtio-vsock the model runs ab's default, a connection per \
                         request (keep_alive = false), each with its own relay process",
                    );
                }
                continue;
            }
            match &w.netperf {
                Some(n) if n.direction == super::workloads::NetperfDirection::Send => {}
                Some(_) => {
                    return bad(
                        &format!("{key}.netperf"),
                        "direction",
                        "over virtio-vsock the model runs the VM as the sender only (\"send\")",
                    )
                }
                None if w.peers() => {
                    return bad(
                        "net",
                        "device",
                        format!(
                            "over virtio-vsock the model runs netperf TCP_STREAM and nginx only; {key} has another network workload"
                        ),
                    )
                }
                None => {}
            }
        }
        if self.scheme == "bare-metal" {
            return bad(
                "net",
                "device",
                "virtio-vsock needs a hypervisor: bare metal has no vhost-vsock",
            );
        }
        if self.host.io_cores.is_empty() {
            return bad(
                "host",
                "io_cores",
                "virtio-vsock needs a core for the vhost-vsock worker and the relay (host.io_cores = [c])",
            );
        }
        Ok(())
    }

    pub(super) fn validate_vms(&self) -> Result<(), ScenarioError> {
        if let Some(i) = self.vms.iter().position(|v| v.copies == 0) {
            return bad(&format!("vm[{i}]"), "copies", "0: at least 1");
        }
        let total: usize = self.vms.iter().map(|v| v.copies as usize).sum();
        if total > Self::MAX_VMS {
            return bad("", "vm", format!("{total} VMs: at most {}", Self::MAX_VMS));
        }
        let vcpus: usize = self
            .vms
            .iter()
            .map(|v| v.copies as usize * v.vcpus as usize)
            .sum();
        if vcpus > Self::MAX_TOTAL_VCPUS {
            return bad(
                "",
                "vm",
                format!("{vcpus} vCPUs in all: at most {}", Self::MAX_TOTAL_VCPUS),
            );
        }
        if let Some(&i) = self.hv.directvisor_plain_vms.iter().find(|&&i| i >= total) {
            return bad(
                "hv",
                "directvisor_plain_vms",
                format!("VM {i}: the scenario has VMs 0..{total} (copies included)"),
            );
        }
        // The single-VM form moved the top-level workload into its VM:
        // one left here was written beside `[[vm]]` tables.
        if !self.workload.is_empty() {
            return bad(
                "",
                "workload",
                "with [[vm]] tables each VM has its own `workload`; the top-level one must be empty",
            );
        }
        let several = total > 1;
        for (i, v) in self.vms.iter().enumerate() {
            v.validate(i, self.machine.cores, &self.scheme, several)?;
        }
        // After each VM's own bounds, which name the key a value breaks.
        self.validate_totals()?;
        if several && (!self.preemptions.is_empty() || self.host.ipi_per_s > 0.0) {
            return bad(
                "",
                "preemptions / host.ipi_per_s",
                "scripted preemptions and host IPIs target one VM: use them with a single VM",
            );
        }
        Ok(())
    }
}

impl Scenario {
    /// Most TCP connections the client hosts open to all VMs together
    /// (memcached's, ApacheBench's). Each is a socket pair with its
    /// state in the model, about 2.3 KB (16 memcached VMs of 4,000
    /// connections: 157 MB of RSS); 1,024 such VMs passed every per-VM
    /// bound and grew past 4 GB before the run began. This bound keeps a
    /// build under ~160 MB of connections.
    pub const MAX_TOTAL_CONNECTIONS: u64 = 65_536;

    /// Most requests per second the open-loop memcached clients offer all
    /// VMs together: one VM's own bound, since they share the load
    /// generator and its link.
    pub const MAX_TOTAL_RPS: f64 = 1e7;

    /// Bounds on the sums over VMs (copies included) that no VM's own
    /// bounds catch.
    fn validate_totals(&self) -> Result<(), ScenarioError> {
        let mut connections = 0u64;
        let mut rps = 0.0;
        for v in &self.vms {
            let active = u64::from(v.active_copies.unwrap_or(v.copies));
            let w = &v.workload;
            let mut per_vm = 0u64;
            if let Some(m) = &w.memcached {
                per_vm += u64::from(m.connections);
                rps += m.rate_rps.unwrap_or(0.0) * active as f64;
            }
            for (ab, c) in [
                w.nginx.as_ref().map(|n| (n.ab_processes, n.concurrency)),
                w.apache.as_ref().map(|n| (n.ab_processes, n.concurrency)),
            ]
            .into_iter()
            .flatten()
            {
                per_vm += u64::from(ab) * u64::from(c);
            }
            connections += per_vm * active;
        }
        if connections > Self::MAX_TOTAL_CONNECTIONS {
            return bad(
                "",
                "vm",
                format!(
                    "{connections} TCP connections to the VMs in all (connections / ab_processes × concurrency, times copies): at most {}",
                    Self::MAX_TOTAL_CONNECTIONS
                ),
            );
        }
        if rps > Self::MAX_TOTAL_RPS {
            return bad(
                "",
                "vm",
                format!(
                    "memcached rate_rps {rps} requests/s to the VMs in all (times copies): at most {} from the one load generator",
                    Self::MAX_TOTAL_RPS
                ),
            );
        }
        Ok(())
    }
}

impl VmSpec {
    /// Checks `vm[i]`'s keys and its workload on a machine of
    /// `machine_cores` cores under `scheme`; `several`: the scenario has
    /// more than one VM (copies included).
    fn validate(
        &self,
        i: usize,
        machine_cores: usize,
        scheme: &str,
        several: bool,
    ) -> Result<(), ScenarioError> {
        let at = &format!("vm[{i}]");
        self.validate_placement(at, machine_cores)?;
        self.validate_interrupts(at)?;
        let workload = &self.workload_key(i);
        if self.vcpus > 1 && self.workload.sip.is_some() {
            return bad(
                workload,
                "",
                "SMP guests run udp, cyclictest, whileloop, fio and TCP workloads (SIP needs a 1-vCPU VM)",
            );
        }
        if several && self.workload.sip.is_some() {
            return bad(
                workload,
                "",
                "with several VMs, SIP is not modelled yet (udp, cyclictest, whileloop, fio, netpipe, iperf, memcached, netperf, nginx, apache, ping are)",
            );
        }
        self.workload.validate(workload, scheme)?;
        if self.vcpus < 2 && self.workload.ipi_latency.is_some() {
            return bad(
                workload,
                "ipi_latency",
                "CPU 0 sends to CPU 1: the VM needs vcpus = 2 or more",
            );
        }
        if self.name.len() > 64 {
            return bad(at, "name", "longer than 64 bytes");
        }
        Ok(())
    }

    /// Its vCPUs and the cores they and its copies run on (`at`: `vm[i]`).
    fn validate_placement(&self, at: &str, machine_cores: usize) -> Result<(), ScenarioError> {
        if self.vcpus == 0 || self.vcpus > Self::MAX_VCPUS {
            return bad(
                at,
                "vcpus",
                format!("{}: must be in 1..={}", self.vcpus, Self::MAX_VCPUS),
            );
        }
        if self.core.is_some() && self.cores.is_some() {
            return bad(at, "cores", "give `core` or `cores`, not both");
        }
        if self.core.is_none()
            && self.cores.is_none()
            && self.allowed_cores.is_none()
            && self.copies_cores.is_none()
        {
            return bad(
                at,
                "core",
                "missing: the core its vCPU runs on (or `cores`, one per vCPU, `allowed_cores` or `copies_cores`)",
            );
        }
        // `copies_cores` decides where copies run, but a `core` / `cores`
        // written beside it is still a core of this machine (it used to go
        // unchecked: 0 and 2^63 ran).
        if self.copies_cores.is_some() && (self.core.is_some() || self.cores.is_some()) {
            let given = self.vcpu_cores();
            if let Some(c) = given.iter().find(|&&c| c == 0 || c >= machine_cores) {
                return bad(
                    at,
                    if self.cores.is_some() {
                        "cores"
                    } else {
                        "core"
                    },
                    format!("core {c} must be in 1..{machine_cores} (core 0 is the host's)"),
                );
            }
        }
        self.validate_allowed_cores(at, machine_cores)?;
        let cores = self.copy_cores(0, machine_cores);
        if cores.len() != self.vcpus as usize {
            return bad(
                at,
                "cores",
                format!(
                    "{} cores for {} vCPUs: give one per vCPU",
                    cores.len(),
                    self.vcpus
                ),
            );
        }
        if let Some(c) = cores.iter().find(|&&c| c == 0 || c >= machine_cores) {
            return bad(
                at,
                if self.cores.is_some() {
                    "cores"
                } else {
                    "core"
                },
                format!(
                    "core {c} (of vCPU {}) must be in 1..{machine_cores} (core 0 is the host's)",
                    cores.iter().position(|x| x == c).unwrap_or(0),
                ),
            );
        }
        if let Some(pool) = &self.copies_cores {
            if let Some(c) = pool.iter().find(|&&c| c == 0 || c >= machine_cores) {
                return bad(
                    at,
                    "copies_cores",
                    format!("core {c} must be in 1..{machine_cores}"),
                );
            }
            if pool.is_empty() || pool.len() > 1024 {
                return bad(at, "copies_cores", "1 to 1024 cores");
            }
        }
        if let Some(a) = self.active_copies.filter(|&a| a > self.copies) {
            return bad(
                at,
                "active_copies",
                format!("{a}: at most `copies` ({})", self.copies),
            );
        }
        Ok(())
    }

    /// Where its tasks and its device interrupts go (`at`: `vm[i]`): the
    /// application vCPU, the MSI's affinity, RPS.
    fn validate_interrupts(&self, at: &str) -> Result<(), ScenarioError> {
        if self.app_vcpu >= self.vcpus {
            return bad(
                at,
                "app_vcpu",
                format!("{}: the VM has vCPUs 0..{}", self.app_vcpu, self.vcpus),
            );
        }
        if let Some(a) = &self.irq_affinity {
            // A set, as /proc/irq/N/smp_affinity is: a vCPU named twice is
            // a typo, refused as rps_cpus refuses one.
            if a.is_empty() || a.iter().any(|&x| x >= self.vcpus) || !distinct(a) {
                return bad(
                    at,
                    "irq_affinity",
                    format!(
                        "{a:?}: a non-empty set of distinct vCPUs in 0..{}",
                        self.vcpus
                    ),
                );
            }
            if self.msi_mode == MsiMode::Fixed && a.len() > 1 {
                return bad(
                    at,
                    "irq_affinity",
                    format!(
                        "{a:?}: fixed delivery names one vCPU; set msi_mode = \"lowest-priority\" for a set"
                    ),
                );
            }
        }
        if let Some(r) = &self.rps_cpus {
            if r.iter().any(|&c| c >= self.vcpus) || !distinct(r) {
                return bad(
                    at,
                    "rps_cpus",
                    format!(
                        "{r:?}: a non-empty set of distinct vCPUs in 0..{}",
                        self.vcpus
                    ),
                );
            }
            if r.is_empty() {
                return bad(
                    at,
                    "rps_cpus",
                    "[]: a non-empty set of vCPUs (leave the key out for no RPS)",
                );
            }
        }
        Ok(())
    }

    /// `allowed_cores` (`at`: `vm[i]`): real cores other than the host's,
    /// one set per vCPU if per vCPU, and every copy's start cores inside
    /// their sets.
    fn validate_allowed_cores(&self, at: &str, cores: usize) -> Result<(), ScenarioError> {
        let Some(a) = &self.allowed_cores else {
            return Ok(());
        };
        let bad = |problem: String| bad(at, "allowed_cores", problem);
        let n = self.vcpus as usize;
        match a {
            AllowedCores::Named(name) if name != "any" => {
                return bad(format!(
                    "\"{name}\": give \"any\", a list of cores, or one list per vCPU"
                ));
            }
            AllowedCores::PerVcpu(sets) if sets.len() != n => {
                return bad(format!(
                    "{} lists for {n} vCPUs: give one per vCPU (or one list for all)",
                    sets.len()
                ));
            }
            _ => {}
        }
        for j in 0..n {
            let set = a.set(j, cores);
            if set.is_empty() {
                return bad(format!("vCPU {j} may run nowhere: give at least one core"));
            }
            if let Some(c) = set.iter().find(|&&c| c == 0 || c >= cores) {
                return bad(format!(
                    "core {c} (for vCPU {j}) must be in 1..{cores} (core 0 is the host's)"
                ));
            }
        }
        for k in 0..self.copies.min(1024) as usize {
            let start = self.copy_cores(k, cores);
            for (j, &c) in start.iter().enumerate() {
                if !a.set(j, cores).contains(&c) {
                    return bad(format!(
                        "vCPU {j} of copy {k} starts on core {c}, outside its allowed cores {:?}",
                        a.set(j, cores)
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether `list` names no element twice.
fn distinct(list: &[u32]) -> bool {
    let mut sorted = list.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).all(|w| w[0] != w[1])
}

#[cfg(test)]
mod tests {
    use super::super::tests::{err, ok, BASE};

    /// `copies_cores` places the copies on its own (no `core` needed),
    /// and a `core` / `cores` written beside it is still checked.
    #[test]
    fn copies_cores_needs_no_core_and_a_core_beside_it_is_checked() {
        let vm = |extra: &str| {
            format!(
                "scheme = \"kvm\"\nduration_s = 0.1\n[machine]\ncores = 4\n[[vm]]\ncopies = 2\n\
                 copies_cores = [1, 2]\n{extra}\n"
            )
        };
        let s = ok(&vm(""), &[]);
        let v = s.vm_views();
        assert_eq!((v[0].cores.clone(), v[1].cores.clone()), (vec![1], vec![2]));
        for (extra, key) in [
            ("core = 0", "vm[0].core"),
            ("core = 9223372036854775807", "vm[0].core"),
            ("cores = [7]", "vm[0].cores"),
        ] {
            let e = err(&vm(extra), &[]);
            assert!(
                e.contains(key) && e.contains("must be in 1..4"),
                "{extra}: {e}"
            );
        }
    }

    /// `allowed_cores`: "any", one set, one set per vCPU; start cores
    /// spread over the set unless given; bad sets are errors naming the key.
    #[test]
    fn allowed_cores_give_each_vcpu_its_set() {
        let vm = |allowed: &str, extra: &str| {
            format!(
                "scheme = \"kvm\"\nduration_s = 0.1\n[machine]\ncores = 5\n[[vm]]\nvcpus = 2\ncopies = 2\n\
                 allowed_cores = {allowed}\n{extra}\n"
            )
        };
        let s = ok(&vm("\"any\"", ""), &[]);
        let v = s.vm_views();
        let m = crate::engine::CpuMask::from_bits;
        assert_eq!(v[0].allowed, vec![m(0b11110), m(0b11110)]);
        // Spread: copy k's vCPU j starts on the (2k + j)th core of the set.
        assert_eq!(
            (v[0].cores.clone(), v[1].cores.clone()),
            (vec![1, 2], vec![3, 4])
        );
        let s = ok(&vm("[[1, 2], [3]]", ""), &[]);
        assert_eq!(s.vm_views()[1].allowed, vec![m(0b110), m(0b1000)]);
        let s = ok(&vm("[2, 3]", "cores = [3, 3]"), &[]);
        assert_eq!(s.vm_views()[0].cores, vec![3, 3]);
        // Without allowed_cores each vCPU is pinned to its core.
        let s = ok(
            "scheme = \"kvm\"\nduration_s = 0.1\n[machine]\ncores = 4\n[[vm]]\nvcpus = 2\ncores = [1, 3]\n",
            &[],
        );
        assert_eq!(s.vm_views()[0].allowed, vec![m(0b10), m(0b1000)]);
        for (allowed, extra, want) in [
            ("\"all\"", "", "give \"any\""),
            ("[0, 1]", "", "core 0"),
            ("[1, 5]", "", "core 5"),
            ("[[1], [2], [3]]", "", "3 lists for 2 vCPUs"),
            ("[[1], []]", "", "may run nowhere"),
            ("[1, 2]", "cores = [1, 3]", "starts on core 3"),
        ] {
            let e = err(&vm(allowed, extra), &[]);
            assert!(
                e.contains("vm[0].allowed_cores") && e.contains(want),
                "{allowed}: {e}"
            );
        }
    }

    /// A scenario without `[[vm]]` is one VM: the same as a `[[vm]]` on
    /// core 1 with one vCPU running its workload, named vm0.
    #[test]
    fn the_single_vm_form_is_one_vm_on_core_1() {
        let s = ok(BASE, &[]);
        assert_eq!(s.vms.len(), 1);
        assert!(s.workload.is_empty());
        let table = "scheme = \"did\"\nduration_s = 0.1\n[[vm]]\ncore = 1\n\
                     [vm.workload.udp]\nrate_pps = 100000\n";
        let t = ok(table, &[]);
        // The same VM; only the key its errors name differs, as written.
        let (mut sv, tv) = (s.vm_views(), t.vm_views());
        assert_eq!(sv[0].workload_key, "workload");
        assert_eq!(tv[0].workload_key, "vm[0].workload");
        sv[0].workload_key = tv[0].workload_key.clone();
        assert_eq!(format!("{sv:?}"), format!("{tv:?}"));
        assert_eq!(sv[0].name, "vm0");
        // Written both ways: the top-level workload must stay empty.
        let e = err(&format!("{table}[workload.cyclictest]\n"), &[]);
        assert!(
            e.contains("`workload`") && e.contains("must be empty"),
            "{e}"
        );
    }

    /// The rules on one VM's workloads hold in every `[[vm]]`, named by
    /// its key; the single-VM form keeps its keys.
    #[test]
    fn workload_rules_apply_to_each_vm() {
        let vm = |w: &str| {
            format!(
                "scheme = \"kvm\"\nduration_s = 0.1\n[machine]\ncores = 3\n[[vm]]\ncore = 1\n\
                 [vm.workload.udp]\nrate_pps = 1000\n[[vm]]\ncore = 2\n{w}"
            )
        };
        for (w, key) in [
            (
                "[vm.workload.udp]\nrate_pps = -1\n",
                "`vm[1].workload.udp.rate_pps`",
            ),
            (
                "[vm.workload.cyclictest]\ninterval_us = 0\n",
                "`vm[1].workload.cyclictest.interval_us`",
            ),
            (
                "[vm.workload.memcached]\nrate_rps = 1000\nconnections = 0\n",
                "`vm[1].workload.memcached.connections`",
            ),
            (
                "[vm.workload.netpipe]\nmsg_bytes = 0\n",
                "`vm[1].workload.netpipe.msg_bytes`",
            ),
            (
                "[vm.workload.netpipe]\nmsg_bytes = 64\n[vm.workload.iperf]\n",
                "`vm[1].workload.iperf`",
            ),
            (
                "[vm.workload.netpipe]\nmsg_bytes = 64\n[vm.workload.udp]\nrate_pps = 1\n",
                "`vm[1].workload.udp`",
            ),
        ] {
            let e = err(&vm(w), &[]);
            assert!(e.contains(key), "{w}: {e}");
        }
        let bm = vm("[vm.workload.iperf]\n").replace("\"kvm\"", "\"bare-metal\"");
        let e = err(&bm, &["net.device=virtio"]);
        assert!(e.contains("`net.device`"), "{e}");
        let e = err(BASE, &["rate_pps=1e9"]);
        assert!(e.contains("`workload.udp.rate_pps`"), "{e}");
    }
}
