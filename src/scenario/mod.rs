//! Scenario files: what to build and run. TOML, strictly checked: an unknown
//! key, a wrong type or a value out of range is an error that names the key.
//! `--set key=value` overrides edit the TOML tree before it is checked.

use crate::guest::TickMode;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A scenario.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name.
    #[serde(default)]
    pub name: String,
    /// What it is for.
    #[serde(default)]
    pub description: String,
    /// Delivery scheme (see `exitless schemes`). May be left out when
    /// `config` names one of DID's evaluation configurations.
    #[serde(default)]
    pub scheme: String,
    /// One of DID's evaluation configurations (§5.1): `bare-metal` /
    /// `sriov-bm`, `sriov`, `sriov-did`, `pv`, `pv-did`. It sets `scheme`
    /// and `net.device`.
    #[serde(default)]
    pub config: Option<String>,
    /// RNG seed.
    #[serde(default = "one")]
    pub seed: u64,
    /// Measured interval, seconds of simulated time.
    pub duration_s: f64,
    /// Warm-up before measuring, seconds.
    #[serde(default = "warmup")]
    pub warmup_s: f64,
    /// The machine.
    #[serde(default)]
    pub machine: MachineSpec,
    /// The guest kernel.
    #[serde(default)]
    pub guest: GuestSpec,
    /// NIC settings.
    #[serde(default)]
    pub nic: NicSpec,
    /// The VM's network device.
    #[serde(default)]
    pub net: NetSpec,
    /// The VM's background exits.
    #[serde(default)]
    pub background: BackgroundSpec,
    /// Workloads.
    #[serde(default)]
    pub workload: WorkloadSpec,
    /// Invariant checking.
    #[serde(default)]
    pub check: CheckSpec,
    /// Host activity aimed at the VM's core.
    #[serde(default)]
    pub host: HostSpec,
    /// Scheme options.
    #[serde(default)]
    pub hv: crate::hv::scheme::SchemeOptions,
    /// Windows in which the host deschedules the VM's vCPU.
    #[serde(default)]
    pub preemptions: Vec<Preemption>,
    /// Several VMs (`[[vm]]`), each with its own vCPU core and workload;
    /// they share the top-level guest, NIC and background settings. Left
    /// out: one VM on core 1 running the top-level `workload`.
    #[serde(default, rename = "vm", skip_serializing_if = "Vec::is_empty")]
    pub vms: Vec<VmSpec>,
    /// Named configuration assumptions (DESIGN.md: a configuration the paper
    /// does not state, chosen with its reason), shown in reports.
    #[serde(default)]
    pub assumptions: Vec<Assumption>,
    /// What validation found legal but pointless (an option the chosen
    /// scheme ignores): for the caller to show, never fatal. Not a key.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// The largest scenario, calibration or experiment file read (1 MiB; the
/// shipped ones are a few KiB). Anything bigger is not one: a path such
/// as /dev/zero must not be read into memory without end.
pub const MAX_INPUT_BYTES: u64 = 1 << 20;

/// Reads a text input file of at most [`MAX_INPUT_BYTES`].
pub fn read_input(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_INPUT_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_INPUT_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_INPUT_BYTES} bytes"),
        ));
    }
    Ok(text)
}

fn one() -> u64 {
    1
}
fn warmup() -> f64 {
    0.05
}

/// One VM of a several-VM scenario.
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
    /// Most vCPUs a VM may have (the guest's reschedule IPIs are a 64-bit
    /// mask).
    pub const MAX_VCPUS: u32 = 64;

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
    pub fn copy_allowed(&self, k: usize, machine_cores: usize) -> Vec<u64> {
        let start = self.copy_cores(k, machine_cores);
        (0..self.vcpus as usize)
            .map(|j| match &self.allowed_cores {
                Some(a) => a
                    .set(j, machine_cores)
                    .iter()
                    .fold(0u64, |m, &c| m | (1u64 << (c & 63))),
                None => 1u64 << (start[j] & 63),
            })
            .collect()
    }

    /// The core of each vCPU.
    pub fn vcpu_cores(&self) -> Vec<usize> {
        match (&self.cores, self.core) {
            (Some(c), _) => c.clone(),
            (None, Some(c)) => (0..self.vcpus as usize).map(|i| c + i).collect(),
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
    pub allowed: Vec<u64>,
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
}

impl Scenario {
    /// The VMs to build, in order (VM 0 first).
    pub fn vm_views(&self) -> Vec<VmView<'_>> {
        if self.vms.is_empty() {
            return vec![VmView {
                name: "vm0".into(),
                core: 1,
                cores: vec![1],
                allowed: vec![1 << 1],
                app_vcpu: 0,
                irq_affinity: vec![0],
                msi_mode: MsiMode::Fixed,
                rps_cpus: Vec::new(),
                burn: false,
                workload: &self.workload,
            }];
        }
        static IDLE: std::sync::LazyLock<WorkloadSpec> =
            std::sync::LazyLock::new(WorkloadSpec::default);
        self.vms
            .iter()
            .flat_map(|v| (0..v.copies as usize).map(move |k| (v, k)))
            .enumerate()
            .map(|(i, (v, k))| VmView {
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
            })
            .collect()
    }

    /// Most VMs a scenario may have.
    pub const MAX_VMS: usize = 64;

    /// `vm[i].allowed_cores`: real cores other than the host's, one set per
    /// vCPU if per vCPU, and every copy's start cores inside their sets.
    fn validate_allowed_cores(&self, i: usize, v: &VmSpec) -> Result<(), ScenarioError> {
        let Some(a) = &v.allowed_cores else {
            return Ok(());
        };
        let key = format!("vm[{i}].allowed_cores");
        let bad = |problem: String| {
            Err(ScenarioError::Invalid {
                key: key.clone(),
                problem,
            })
        };
        let n = v.vcpus as usize;
        let cores = self.machine.cores;
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
        for k in 0..v.copies.min(1024) as usize {
            let start = v.copy_cores(k, cores);
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

    fn validate_vms(&self) -> Result<(), ScenarioError> {
        let bad = |key: String, problem: String| Err(ScenarioError::Invalid { key, problem });
        if self.vms.is_empty() {
            return Ok(());
        }
        if let Some(i) = self.vms.iter().position(|v| v.copies == 0) {
            return bad(format!("vm[{i}].copies"), "0: at least 1".into());
        }
        let total: usize = self.vms.iter().map(|v| v.copies as usize).sum();
        if total > Self::MAX_VMS {
            return bad(
                "vm".into(),
                format!("{total} VMs: at most {}", Self::MAX_VMS),
            );
        }
        let w = &self.workload;
        if w.udp.is_some()
            || w.whileloop.is_some()
            || w.cyclictest.is_some()
            || w.peers()
            || w.fio.is_some()
        {
            return bad(
                "workload".into(),
                "with [[vm]] tables each VM has its own `workload`; the top-level one must be empty".into(),
            );
        }
        let several = total > 1;
        for (i, v) in self.vms.iter().enumerate() {
            if v.vcpus == 0 || v.vcpus > VmSpec::MAX_VCPUS {
                return bad(
                    format!("vm[{i}].vcpus"),
                    format!("{}: must be in 1..={}", v.vcpus, VmSpec::MAX_VCPUS),
                );
            }
            if v.core.is_some() && v.cores.is_some() {
                return bad(
                    format!("vm[{i}].cores"),
                    "give `core` or `cores`, not both".into(),
                );
            }
            if v.core.is_none() && v.cores.is_none() && v.allowed_cores.is_none() {
                return bad(
                    format!("vm[{i}].core"),
                    "missing: the core its vCPU runs on (or `cores`, one per vCPU, or `allowed_cores`)".into(),
                );
            }
            self.validate_allowed_cores(i, v)?;
            let cores = v.copy_cores(0, self.machine.cores);
            let key = if v.cores.is_some() { "cores" } else { "core" };
            if cores.len() != v.vcpus as usize {
                return bad(
                    format!("vm[{i}].cores"),
                    format!(
                        "{} cores for {} vCPUs: give one per vCPU",
                        cores.len(),
                        v.vcpus
                    ),
                );
            }
            if let Some(c) = cores.iter().find(|&&c| c == 0 || c >= self.machine.cores) {
                return bad(
                    format!("vm[{i}].{key}"),
                    format!(
                        "core {c} (of vCPU {}) must be in 1..{} (core 0 is the host's)",
                        cores.iter().position(|x| x == c).unwrap_or(0),
                        self.machine.cores
                    ),
                );
            }
            if let Some(pool) = &v.copies_cores {
                if let Some(c) = pool.iter().find(|&&c| c == 0 || c >= self.machine.cores) {
                    return bad(
                        format!("vm[{i}].copies_cores"),
                        format!("core {c} must be in 1..{}", self.machine.cores),
                    );
                }
                if pool.is_empty() || pool.len() > 1024 {
                    return bad(format!("vm[{i}].copies_cores"), "1 to 1024 cores".into());
                }
            }
            if v.active_copies.is_some_and(|a| a > v.copies) {
                return bad(
                    format!("vm[{i}].active_copies"),
                    format!(
                        "{}: at most `copies` ({})",
                        v.active_copies.unwrap_or(0),
                        v.copies
                    ),
                );
            }
            if v.app_vcpu >= v.vcpus {
                return bad(
                    format!("vm[{i}].app_vcpu"),
                    format!("{}: the VM has vCPUs 0..{}", v.app_vcpu, v.vcpus),
                );
            }
            if let Some(a) = &v.irq_affinity {
                if a.is_empty() || a.iter().any(|&x| x >= v.vcpus) || a.len() > 64 {
                    return bad(
                        format!("vm[{i}].irq_affinity"),
                        format!("{a:?}: a non-empty list of vCPUs in 0..{}", v.vcpus),
                    );
                }
                if v.msi_mode == MsiMode::Fixed && a.len() > 1 {
                    return bad(
                        format!("vm[{i}].irq_affinity"),
                        format!(
                            "{a:?}: fixed delivery names one vCPU; set msi_mode = \"lowest-priority\" for a set"
                        ),
                    );
                }
            }
            if let Some(r) = &v.rps_cpus {
                let mut seen = 0u64;
                for &c in r {
                    if c >= v.vcpus || seen & (1 << c) != 0 {
                        return bad(
                            format!("vm[{i}].rps_cpus"),
                            format!("{r:?}: a non-empty set of distinct vCPUs in 0..{}", v.vcpus),
                        );
                    }
                    seen |= 1 << c;
                }
                if r.is_empty() {
                    return bad(
                        format!("vm[{i}].rps_cpus"),
                        "[]: a non-empty set of vCPUs (leave the key out for no RPS)".into(),
                    );
                }
            }
            if v.vcpus > 1 && v.workload.sip.is_some() {
                return bad(
                    format!("vm[{i}].workload"),
                    "SMP guests run udp, cyclictest, whileloop, fio and TCP workloads (SIP needs a 1-vCPU VM)".into(),
                );
            }
            if several && v.workload.sip.is_some() {
                return bad(
                    format!("vm[{i}].workload"),
                    "with several VMs, SIP is not modelled yet (udp, cyclictest, whileloop, fio, netpipe, iperf, memcached, netperf, nginx, apache, ping are)".into(),
                );
            }
            if let Some(f) = &v.workload.fio {
                validate_fio(f, &format!("vm[{i}].workload.fio"), &self.scheme)?;
            }
            validate_network_workload(&v.workload, &format!("vm[{i}].workload"))?;
            if v.name.len() > 64 {
                return bad(format!("vm[{i}].name"), "longer than 64 bytes".into());
            }
        }
        if several && (!self.preemptions.is_empty() || self.host.ipi_per_s > 0.0) {
            return bad(
                "preemptions / host.ipi_per_s".into(),
                "scripted preemptions and host IPIs target one VM: use them with a single VM"
                    .into(),
            );
        }
        Ok(())
    }
}

/// A configuration assumption and why it was made.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Assumption {
    /// What was assumed.
    pub key: String,
    /// Its value.
    pub value: String,
    /// The reasoning.
    pub reason: String,
}

/// The machine.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MachineSpec {
    /// Physical cores. Core 0 is host-only (DID's designated timer core);
    /// the VM's vCPU is pinned to core 1.
    pub cores: usize,
}

impl Default for MachineSpec {
    fn default() -> Self {
        MachineSpec { cores: 2 }
    }
}

/// The guest kernel's configuration.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GuestSpec {
    /// CONFIG_HZ.
    pub hz: u32,
    /// Tick mode: periodic, nohz-idle or off.
    pub tick: TickMode,
    /// Handlers run with IF=1 and EOI at the end (nesting kernel).
    pub irq_nesting: bool,
    /// Idle loop: `poll` (spin, the default) or `halt` (HLT: the vCPU
    /// exits and sleeps, giving its core to other threads).
    pub idle: crate::guest::IdleMode,
    /// UDP socket buffer, datagrams (1 to [`MAX_RCVBUF_PACKETS`]).
    pub rcvbuf_packets: usize,
    /// Guest LOCAL_TIMER_VECTOR.
    pub timer_vector: u8,
    /// Vector the guest programs into its VF's MSI-X entry.
    pub vf_vector: u8,
    /// NAPI weight (budget per poll), 1 to [`MAX_NAPI_WEIGHT`]; default:
    /// the calibration's `nic.napi_weight`.
    pub napi_weight: Option<u32>,
    /// LAPIC mode: `x2apic` (MSRs, the default) or `xapic` (MMIO stores to
    /// the APIC page: exits as APIC_ACCESS or APIC_WRITE where x2APIC
    /// writes exit as MSR_WRITE). xAPIC guests run under `kvm`, `apicv`,
    /// `kvm-2026` and `bare-metal`, one vCPU per VM.
    pub apic: crate::guest::ApicMode,
    /// TSO/GSO on the guest's TCP output (Linux's default with ixgbevf,
    /// which advertises TSO, and virtio-net with HOST_TSO4): a segment may
    /// carry up to 64 KiB, cut into MSS frames by the VF (TSO) or the
    /// host (vhost passes the GSO packet to the bridge). `false`: one MSS
    /// per segment.
    pub gso: bool,
    /// GRO on the guest's receive path (`napi_gro_receive`, on by
    /// default): consecutive TCP frames of a flow taken in one NAPI poll
    /// go up the stack as one packet.
    pub gro: bool,
}

/// Largest `guest.rcvbuf_packets`: 64K datagrams, far above what Linux's
/// `net.core.rmem_max` admits for small datagrams (each is charged its
/// skb truesize, ~1 KiB); the queue is allocated up front.
pub const MAX_RCVBUF_PACKETS: usize = 65_536;

/// Largest NAPI weight (`guest.napi_weight`, calibration
/// `nic.napi_weight`). Linux warns above 64 (NAPI_POLL_WEIGHT); a weight
/// above the ring size (ixgbevf: at most 4096) changes nothing.
pub const MAX_NAPI_WEIGHT: u32 = 4096;

impl Default for GuestSpec {
    fn default() -> Self {
        GuestSpec {
            hz: 1000,
            tick: TickMode::Periodic,
            irq_nesting: false,
            idle: crate::guest::IdleMode::Poll,
            rcvbuf_packets: 256,
            timer_vector: 0xEF,
            vf_vector: 0x41,
            napi_weight: None,
            apic: crate::guest::ApicMode::X2apic,
            gso: true,
            gro: true,
        }
    }
}

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
}

impl Default for NicSpec {
    fn default() -> Self {
        NicSpec {
            itr: ItrMode::Ixgbevf36,
            itr_interval_us: 50.0,
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
    /// TSO/GSO on the peer host's TCP output (its Linux default): it
    /// sends packets of up to 64 KiB that its NIC (or, on the VM's host,
    /// the bridge) carries as MSS frames. A Linux receiver outside the
    /// guest (the peer, the VM's host) takes such a train back to back as
    /// one GRO packet.
    pub peer_gso: bool,
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
            peer_gso: true,
        }
    }
}

/// Largest `workload.fio.disk_bytes`: 1 TiB (the RAM disk is not
/// allocated, but offsets stay far from overflow).
pub const MAX_DISK_BYTES: u64 = 1 << 40;

/// Largest `workload.memcached.client_threads` (the paper: 8).
pub const MAX_CLIENT_THREADS: u16 = 1024;

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

/// Background exits of the VM.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BackgroundSpec {
    /// Whether the calibrated background source runs.
    pub enabled: bool,
}

impl Default for BackgroundSpec {
    fn default() -> Self {
        BackgroundSpec { enabled: true }
    }
}

/// Workloads.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    /// External UDP sender and in-guest receiver.
    pub udp: Option<UdpSpec>,
    /// WhileLoop.
    pub whileloop: Option<WhileLoopSpec>,
    /// cyclictest.
    pub cyclictest: Option<CyclictestSpec>,
    /// NetPIPE TCP ping-pong with the peer host.
    pub netpipe: Option<NetpipeSpec>,
    /// iperf TCP stream with the peer host.
    pub iperf: Option<IperfSpec>,
    /// Fio on a virtio-blk disk over a host RAM disk.
    pub fio: Option<FioSpec>,
    /// Memcached server in the VM, load generator at the peer.
    pub memcached: Option<MemcachedSpec>,
    /// SIP B2BUA in the VM between a SIPp-like client and server.
    pub sip: Option<SipSpec>,
    /// netperf TCP_STREAM or UDP_STREAM between the VM and the client host
    /// (ES2 §6).
    pub netperf: Option<NetperfSpec>,
    /// nginx in the VM, ApacheBench processes on the client host (ES2 §6.3).
    pub nginx: Option<NginxSpec>,
    /// Apache (one thread per connection) in the VM, ApacheBench on the
    /// client host: the served-time distribution (ES2 §6.4).
    pub apache: Option<ApacheSpec>,
    /// ping from the client host; the guest kernel answers in its softirq
    /// (ES2 §6.4).
    pub ping: Option<PingSpec>,
}

/// Which netperf test runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum NetperfTest {
    /// TCP_STREAM: a TCP bulk transfer, `msg_bytes` per send().
    TcpStream,
    /// UDP_STREAM: `msg_bytes` datagrams, one per sendto(); throughput is
    /// what the receiving application got.
    UdpStream,
}

/// Which way a netperf stream flows, seen from the VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum NetperfDirection {
    /// The VM sends to the client host (netperf in the VM).
    Send,
    /// The client host sends to the VM (netserver in the VM).
    Recv,
}

/// netperf (ES2 §6.2, §6.3: 512-byte TCP and UDP streams, 4 instances
/// per VM in the multi-VM runs).
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetperfSpec {
    /// `tcp-stream` or `udp-stream`.
    #[serde(default = "netperf_test")]
    pub test: NetperfTest,
    /// `send` (the VM sends) or `recv` (the client host sends).
    #[serde(default = "netperf_direction")]
    pub direction: NetperfDirection,
    /// Bytes per send() / sendto() (netperf's `-m`; ES2: 512). UDP: at
    /// most 1472, one frame (IP fragmentation is not modelled).
    #[serde(default = "netperf_msg")]
    pub msg_bytes: u32,
    /// netperf instances, each its own process and connection (or UDP
    /// flow) on both hosts (ES2's multi-VM runs: 4 per VM).
    #[serde(default = "one_u16")]
    pub threads: u16,
}

fn netperf_test() -> NetperfTest {
    NetperfTest::TcpStream
}
fn netperf_direction() -> NetperfDirection {
    NetperfDirection::Send
}
fn netperf_msg() -> u32 {
    512
}
fn one_u16() -> u16 {
    1
}

/// nginx serving a static page to ApacheBench (ES2 §6.3). ab runs with
/// keep-alive (`ab -k`): the TCP model has no connection set-up, so each
/// of ab's connections stays open and carries one request at a time.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NginxSpec {
    /// nginx worker processes, each an epoll loop over its own port's
    /// connections (ES2: 4, one per vCPU). On an SMP guest worker j runs
    /// on vCPU j mod vCPUs; on a 1-vCPU guest all share CPU 0.
    #[serde(default = "four_u16")]
    pub workers: u16,
    /// ApacheBench processes on the client host, each on its own CPU;
    /// process p talks to worker p mod workers (ES2: 4 per tested VM).
    #[serde(default = "four_u16")]
    pub ab_processes: u16,
    /// Requests each ab process keeps in flight, one per connection
    /// (ab's `-c`; default 1).
    #[serde(default = "one_u16")]
    pub concurrency: u16,
    /// Body bytes of the page: nginx's default `index.html` ("Welcome to
    /// nginx!") is 612 bytes (the file in nginx's source distribution,
    /// `html/index.html`; ab reports it as "Document Length: 612 bytes").
    #[serde(default = "nginx_page")]
    pub page_bytes: u32,
    /// Response header bytes in front of the body. Default 238, counted
    /// from the header nginx 1.x sends for a static file over keep-alive
    /// (status line 17, Server 22, Date 37, Content-Type 25,
    /// Content-Length 21, Last-Modified 46, Connection 24, ETag 22,
    /// Accept-Ranges 22, blank line 2) [estimate].
    #[serde(default = "nginx_header")]
    pub header_bytes: u32,
    /// Request bytes ab sends. Default 100: `GET / HTTP/1.0` (16),
    /// `Connection: Keep-Alive` (24), `Host: 10.0.0.2` (16),
    /// `User-Agent: ApacheBench/2.3` (29), `Accept: */*` (13), blank
    /// line (2), each with its CRLF (ab 2.3's request with `-k`).
    #[serde(default = "http_request")]
    pub request_bytes: u32,
}

fn four_u16() -> u16 {
    4
}
fn nginx_page() -> u32 {
    612
}
fn nginx_header() -> u32 {
    238
}
fn http_request() -> u32 {
    100
}

/// Apache httpd (worker/prefork MPM: one thread per connection) serving a
/// small static page to ApacheBench; ES2 §6.4's served-time experiment:
/// one ab process, concurrency 16. Keep-alive, as for `nginx`.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApacheSpec {
    /// ApacheBench processes on the client host (ES2 §6.4: 1).
    #[serde(default = "one_u16")]
    pub ab_processes: u16,
    /// Requests each ab process keeps in flight, one per connection; the
    /// server runs one thread per connection (ES2 §6.4: 16).
    #[serde(default = "sixteen_u16")]
    pub concurrency: u16,
    /// Body bytes: Apache 2.4's stock `htdocs/index.html`
    /// (`<html><body><h1>It works!</h1></body></html>` and a newline) is
    /// 45 bytes; ES2 says only "a small static page".
    #[serde(default = "apache_page")]
    pub page_bytes: u32,
    /// Response header bytes. Default 284, counted from Apache 2.4's
    /// header for a static file over keep-alive (status 17, Date 37,
    /// Server 32, Last-Modified 46, ETag 27, Accept-Ranges 22,
    /// Content-Length 20, Keep-Alive 32, Connection 24, Content-Type 25,
    /// blank line 2) [estimate].
    #[serde(default = "apache_header")]
    pub header_bytes: u32,
    /// Request bytes ab sends (as for `nginx`: 100).
    #[serde(default = "http_request")]
    pub request_bytes: u32,
}

fn sixteen_u16() -> u16 {
    16
}
fn apache_page() -> u32 {
    45
}
fn apache_header() -> u32 {
    284
}

/// ping (ES2 §6.4: one echo request every second, RTT distribution).
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PingSpec {
    /// Seconds between echo requests (ping's `-i`; default 1, as ES2).
    #[serde(default = "ping_interval")]
    pub interval_s: f64,
    /// ICMP payload bytes (ping's `-s`; default 56).
    #[serde(default = "ping_payload")]
    pub payload_bytes: u32,
}

fn ping_interval() -> f64 {
    1.0
}
fn ping_payload() -> u32 {
    56
}

/// SIP (DID §5.8): SIPp's `-r rate_cps -d call_duration_s -m calls`.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SipSpec {
    /// New calls per second (the paper: 100).
    #[serde(default = "sip_rate")]
    pub rate_cps: f64,
    /// Seconds an answered call lasts (the paper: 10).
    #[serde(default = "sip_duration")]
    pub call_duration_s: f64,
    /// Calls to place (the paper: 10,000).
    #[serde(default = "sip_calls")]
    pub calls: u32,
}

fn sip_rate() -> f64 {
    100.0
}
fn sip_duration() -> f64 {
    10.0
}
fn sip_calls() -> u32 {
    10_000
}

/// The memcached load generator's shape.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum MemcachedClientKind {
    /// Open loop (mutilate-style, DID §5.7): Poisson arrivals at
    /// `rate_rps` round robin over the connections.
    #[default]
    OpenLoop,
    /// Closed loop (memaslap, ES2 §6.3): `concurrency` requests in flight,
    /// each re-issued as soon as its reply arrives.
    Memaslap,
}

/// Memcached.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemcachedSpec {
    /// Offered load, requests/s (the open-loop client; required for it,
    /// not allowed with `memaslap`).
    #[serde(default)]
    pub rate_rps: Option<f64>,
    /// `open-loop` (default) or `memaslap` (closed loop).
    #[serde(default)]
    pub client: MemcachedClientKind,
    /// memaslap's concurrency: requests in flight, spread round robin
    /// over the connections (ES2: 256, with 256 connections).
    #[serde(default = "mc_concurrency")]
    pub concurrency: u32,
    /// Share of gets, percent. Default: 80 for the open-loop client
    /// (4 gets per set, DID's mix), 90 for memaslap (its default 9:1,
    /// ES2's mix).
    #[serde(default)]
    pub get_pct: Option<f64>,
    /// TCP connections (the paper: 200).
    #[serde(default = "mc_conns")]
    pub connections: u16,
    /// Server worker threads (the paper: 2).
    #[serde(default = "mc_threads")]
    pub threads: u16,
    /// Load-generator threads, each on its own CPU (the paper: 8).
    #[serde(default = "mc_client_threads")]
    pub client_threads: u16,
    /// Key bytes.
    #[serde(default = "mc_key")]
    pub key_bytes: u32,
    /// Value bytes.
    #[serde(default = "mc_value")]
    pub value_bytes: u32,
}

fn mc_conns() -> u16 {
    200
}
fn mc_concurrency() -> u32 {
    256
}
fn mc_threads() -> u16 {
    2
}
fn mc_client_threads() -> u16 {
    8
}
fn mc_key() -> u32 {
    30
}
fn mc_value() -> u32 {
    400
}

/// Fio.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FioSpec {
    /// Request size, bytes (the paper: 4 KB).
    #[serde(default = "fio_block")]
    pub block_bytes: u32,
    /// Share of reads, percent (the paper: random reads and writes).
    #[serde(default = "fio_reads")]
    pub read_pct: f64,
    /// RAM-disk size, bytes (the paper: 1 GB).
    #[serde(default = "fio_disk")]
    pub disk_bytes: u64,
    /// The guard timer Fio arms per request, ms (0: none).
    #[serde(default = "fio_guard")]
    pub guard_ms: f64,
}

fn fio_block() -> u32 {
    4096
}
fn fio_reads() -> f64 {
    50.0
}
fn fio_disk() -> u64 {
    1 << 30
}
fn fio_guard() -> f64 {
    10.0
}

/// Which way an iperf stream flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum IperfDirection {
    /// The peer host sends, the VM receives.
    ToVm,
    /// The VM sends, the peer host receives.
    FromVm,
}

/// iperf.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IperfSpec {
    /// Direction of the stream.
    #[serde(default = "to_vm")]
    pub direction: IperfDirection,
    /// Bytes per read()/write() call (iperf's default buffer: 128 KiB).
    #[serde(default = "iperf_len")]
    pub len_bytes: u32,
}

fn to_vm() -> IperfDirection {
    IperfDirection::ToVm
}
fn iperf_len() -> u32 {
    128 * 1024
}

impl WorkloadSpec {
    /// Whether a TCP workload (talking to the peer host) is configured.
    pub fn tcp(&self) -> bool {
        self.netpipe.is_some() || self.iperf.is_some() || self.memcached.is_some()
    }

    /// Whether a workload talks to peer hosts (TCP workloads, SIP, the
    /// ES2 workloads).
    pub fn peers(&self) -> bool {
        self.tcp() || self.sip.is_some() || self.es2()
    }

    /// Whether one of ES2's workloads (netperf, nginx, apache, ping) is
    /// configured.
    pub fn es2(&self) -> bool {
        self.netperf.is_some()
            || self.nginx.is_some()
            || self.apache.is_some()
            || self.ping.is_some()
    }

    /// The network workloads configured, by table name (at most one may
    /// run in a VM).
    pub fn network_workloads(&self) -> Vec<&'static str> {
        [
            ("netpipe", self.netpipe.is_some()),
            ("iperf", self.iperf.is_some()),
            ("memcached", self.memcached.is_some()),
            ("sip", self.sip.is_some()),
            ("netperf", self.netperf.is_some()),
            ("nginx", self.nginx.is_some()),
            ("apache", self.apache.is_some()),
            ("ping", self.ping.is_some()),
        ]
        .into_iter()
        .filter(|x| x.1)
        .map(|x| x.0)
        .collect()
    }
}

/// NetPIPE.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetpipeSpec {
    /// Message size, bytes (the paper: 32 to 1024).
    pub msg_bytes: u32,
}

/// UDP PacketGen.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UdpSpec {
    /// Packets per second.
    pub rate_pps: f64,
    /// UDP payload bytes.
    #[serde(default = "payload")]
    pub payload_bytes: u32,
}

fn payload() -> u32 {
    128
}

/// WhileLoop.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WhileLoopSpec {
    /// Loop iterations (the paper: 2^34).
    pub iterations: f64,
}

/// cyclictest.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CyclictestSpec {
    /// Timer interval, µs.
    #[serde(default = "interval")]
    pub interval_us: f64,
}

fn interval() -> f64 {
    1000.0
}

/// Host activity aimed at the VM's core.
#[derive(Clone, Debug, Default, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HostSpec {
    /// Host IPIs (reschedule, TLB shootdown) sent to the VM's core per
    /// second, from the host core (Poisson).
    pub ipi_per_s: f64,
    /// CPU-bound host threads (`[[host.burners]]`). Any burner puts the
    /// VM's vCPU thread under the host scheduler (CFS), which then
    /// multiplexes them on the cores their pinning allows.
    pub burners: Vec<BurnerSpec>,
    /// Nice level of the vCPU thread (weight under the host scheduler).
    pub vcpu_nice: i32,
    /// The cores the vhost worker threads are pinned to: worker w on
    /// `io_cores[w % len]`. Workers sharing a core (with each other, a
    /// vCPU or a burner) are multiplexed by the host scheduler. Default:
    /// the first core from 2 up that runs no vCPU (core 0 on a 2-core
    /// machine).
    pub io_cores: Vec<usize>,
    /// Each vCPU thread starts with a virtual runtime drawn uniformly from
    /// [0, this) ms (seeded): VMs booted at different times, so the host
    /// scheduler's rotation on each core is out of phase with the others'.
    /// 0 (default): every thread starts level, and cores that hold the
    /// same threads rotate in step.
    pub vcpu_start_skew_ms: f64,
}

/// A CPU-bound host thread (a background burner).
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BurnerSpec {
    /// Cores it may run on.
    pub cores: Vec<usize>,
    /// Nice level, -20..=19.
    #[serde(default)]
    pub nice: i32,
}

impl HostSpec {
    /// Largest number of burners (one per core is the usual use).
    pub const MAX_BURNERS: usize = 64;
}

/// The host takes the VM's core away for a while (vCPU schedule-out/in).
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Preemption {
    /// When, in ms from the start of the run.
    pub at_ms: f64,
    /// How long the vCPU stays descheduled, ms.
    pub for_ms: f64,
    /// Repeat every this many ms (with `count`): a periodic preemption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<f64>,
    /// How many times in all (default 1; needs `every_ms` when above 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
}

impl Preemption {
    /// Largest `count`: a bound on the events a scenario can schedule.
    pub const MAX_COUNT: u32 = 100_000;

    /// The (start, length) of each occurrence, ms.
    pub fn occurrences(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        let every = self.every_ms.unwrap_or(0.0);
        (0..self.count.unwrap_or(1)).map(move |i| (self.at_ms + i as f64 * every, self.for_ms))
    }
}

/// Invariant checking.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CheckSpec {
    /// An interrupt still undelivered this long after it was raised, at the
    /// end of the run, is lost.
    pub lost_grace_ms: f64,
}

impl Default for CheckSpec {
    fn default() -> Self {
        CheckSpec {
            lost_grace_ms: 10.0,
        }
    }
}

/// Scenario errors: each names the key or file concerned.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// File unreadable.
    #[error("cannot read scenario {path}: {err}")]
    Io {
        /// Path.
        path: String,
        /// Cause.
        err: std::io::Error,
    },
    /// Bad TOML or a key that does not belong.
    #[error("scenario {0}")]
    Parse(String),
    /// Bad `--set`.
    #[error("--set {0}")]
    Set(String),
    /// A value out of range.
    #[error("scenario key `{key}`: {problem}")]
    Invalid {
        /// Dotted key.
        key: String,
        /// What is wrong.
        problem: String,
    },
}

/// Most netperf instances, nginx workers or ab processes per VM.
pub const MAX_INSTANCES: u16 = 64;

/// Most HTTP connections (ab processes × concurrency) per VM.
pub const MAX_HTTP_CONNECTIONS: u32 = 4000;

/// Checks the keys of the ES2 workloads (netperf, nginx, apache, ping)
/// and of the memaslap client in `w`, the workload table at `at`
/// (`workload` or `vm[i].workload`), and that it holds at most one
/// network workload.
/// A Fio job's keys (`at`: where it is, `workload.fio` or
/// `vm[i].workload.fio`).
fn validate_fio(f: &FioSpec, at: &str, scheme: &str) -> Result<(), ScenarioError> {
    let bad = |key: &str, problem: String| {
        Err(ScenarioError::Invalid {
            key: if key.is_empty() {
                at.to_string()
            } else {
                format!("{at}.{key}")
            },
            problem,
        })
    };
    if !(512..=(1 << 20)).contains(&f.block_bytes) || !f.block_bytes.is_multiple_of(512) {
        return bad(
            "block_bytes",
            format!(
                "{} must be a multiple of 512 in 512..=1048576",
                f.block_bytes
            ),
        );
    }
    if !(0.0..=100.0).contains(&f.read_pct) {
        return bad("read_pct", format!("{} must be 0..=100", f.read_pct));
    }
    if f.disk_bytes < f.block_bytes as u64 || f.disk_bytes > MAX_DISK_BYTES {
        return bad(
            "disk_bytes",
            format!(
                "{} must hold at least one block and be at most {MAX_DISK_BYTES} (1 TiB)",
                f.disk_bytes
            ),
        );
    }
    if !(0.0..=10_000.0).contains(&f.guard_ms) {
        return bad("guard_ms", format!("{} must be 0..=10000", f.guard_ms));
    }
    if scheme == "bare-metal" {
        return bad(
            "",
            "virtio-blk needs a hypervisor: bare metal has no QEMU back end".into(),
        );
    }
    Ok(())
}

fn validate_network_workload(w: &WorkloadSpec, at: &str) -> Result<(), ScenarioError> {
    let bad = |key: &str, problem: String| {
        Err(ScenarioError::Invalid {
            key: format!("{at}.{key}"),
            problem,
        })
    };
    let net = w.network_workloads();
    if net.len() > 1 && w.es2() {
        return bad(
            net[1],
            format!(
                "one network workload per VM: {} cannot be combined",
                net.join(" and ")
            ),
        );
    }
    if w.es2() && w.udp.is_some() {
        return bad(
            "udp",
            format!("cannot be combined with workload.{} yet", net[0]),
        );
    }
    if let Some(n) = &w.netperf {
        let max = match n.test {
            NetperfTest::TcpStream => 1 << 20,
            // One datagram per frame: 1500-byte MTU less IP and UDP headers.
            NetperfTest::UdpStream => 1472,
        };
        if !(1..=max).contains(&n.msg_bytes) {
            return bad(
                "netperf.msg_bytes",
                format!("{} must be 1..={max} for this test", n.msg_bytes),
            );
        }
        if !(1..=MAX_INSTANCES).contains(&n.threads) {
            return bad(
                "netperf.threads",
                format!("{} must be 1..={MAX_INSTANCES}", n.threads),
            );
        }
    }
    let http = |name: &str, ab: u16, c: u16, page: u32, header: u32, req: u32| {
        if !(1..=MAX_INSTANCES).contains(&ab) {
            return bad(
                &format!("{name}.ab_processes"),
                format!("{ab} must be 1..={MAX_INSTANCES}"),
            );
        }
        if c == 0 || u32::from(ab) * u32::from(c) > MAX_HTTP_CONNECTIONS {
            return bad(
                &format!("{name}.concurrency"),
                format!(
                    "{c} must be at least 1, and ab_processes × concurrency = {} at most {MAX_HTTP_CONNECTIONS}",
                    u32::from(ab) * u32::from(c)
                ),
            );
        }
        if !(1..=(1 << 20)).contains(&page) {
            return bad(
                &format!("{name}.page_bytes"),
                format!("{page} must be 1..=1048576"),
            );
        }
        if !(17..=65536).contains(&header) {
            return bad(
                &format!("{name}.header_bytes"),
                format!("{header} must be 17..=65536 (a status line at least)"),
            );
        }
        if !(16..=65536).contains(&req) {
            return bad(
                &format!("{name}.request_bytes"),
                format!("{req} must be 16..=65536 (a request line at least)"),
            );
        }
        Ok(())
    };
    if let Some(n) = &w.nginx {
        if !(1..=MAX_INSTANCES).contains(&n.workers) {
            return bad(
                "nginx.workers",
                format!("{} must be 1..={MAX_INSTANCES}", n.workers),
            );
        }
        http(
            "nginx",
            n.ab_processes,
            n.concurrency,
            n.page_bytes,
            n.header_bytes,
            n.request_bytes,
        )?;
    }
    if let Some(a) = &w.apache {
        http(
            "apache",
            a.ab_processes,
            a.concurrency,
            a.page_bytes,
            a.header_bytes,
            a.request_bytes,
        )?;
    }
    if let Some(p) = &w.ping {
        if !(p.interval_s >= 1e-5 && p.interval_s <= 10.0) {
            return bad(
                "ping.interval_s",
                format!("{} must be in [1e-5, 10]", p.interval_s),
            );
        }
        if p.payload_bytes > 1472 {
            return bad(
                "ping.payload_bytes",
                format!("{} must be 0..=1472 (one frame)", p.payload_bytes),
            );
        }
    }
    if let Some(m) = &w.memcached {
        if let Some(g) = m.get_pct {
            if !(0.0..=100.0).contains(&g) {
                return bad("memcached.get_pct", format!("{g} must be in [0, 100]"));
            }
        }
        if m.client == MemcachedClientKind::Memaslap {
            if m.rate_rps.is_some() {
                return bad(
                    "memcached.rate_rps",
                    "memaslap is a closed-loop client: its rate is what the server answers; remove rate_rps".into(),
                );
            }
            let most =
                u32::from(m.connections) * crate::workloads::memcached::PIPELINE_DEPTH as u32;
            if m.concurrency == 0 || m.concurrency > most {
                return bad(
                    "memcached.concurrency",
                    format!(
                        "{} must be at least 1 and at most connections × {} = {most}",
                        m.concurrency,
                        crate::workloads::memcached::PIPELINE_DEPTH
                    ),
                );
            }
        }
    }
    Ok(())
}

/// Short keys accepted by `--set` for the common knobs.
fn alias(key: &str) -> &str {
    match key {
        "rate_pps" => "workload.udp.rate_pps",
        "iterations" => "workload.whileloop.iterations",
        "interval_us" => "workload.cyclictest.interval_us",
        "itr" => "nic.itr",
        "msg_bytes" => "workload.netpipe.msg_bytes",
        "rate_rps" => "workload.memcached.rate_rps",
        k => k,
    }
}

/// Parses `text` as a TOML scalar (number, bool, string) or takes it as a
/// bare string.
fn scalar(text: &str) -> toml::Value {
    let doc = format!("v = {text}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => t.remove("v").unwrap_or(toml::Value::String(text.into())),
        Err(_) => toml::Value::String(text.into()),
    }
}

/// A typed-deserialization error of the scenario `text` (as written back
/// from its tree, overrides applied), named by the dotted key at its
/// position: `[section]` headers above the line give the table, the
/// line its key; an error on a header is the table's own.
fn typed_error(text: &str, e: &toml::de::Error) -> ScenarioError {
    let Some(span) = e.span().filter(|s| s.start <= text.len()) else {
        return ScenarioError::Parse(e.message().to_string());
    };
    let line_start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("");
    // `[a.b]` → a.b; `[[a]]` → a[i], its i-th element up to `upto`.
    let header = |l: &str, upto: usize| {
        let l = l.trim();
        if let Some(h) = l.strip_prefix("[[").and_then(|r| r.strip_suffix("]]")) {
            let h = h.trim();
            let marker = format!("[[{h}]]");
            let i = text[..upto].lines().filter(|x| x.trim() == marker).count();
            return Some(format!("{h}[{}]", i.saturating_sub(1)));
        }
        l.strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .map(|h| h.trim().to_string())
    };
    let here = header(line, line_start + line.len());
    // The last header above the line.
    let section = || {
        let mut sec = None;
        let mut end = 0;
        for l in text[..line_start].split_inclusive('\n') {
            end += l.len();
            if let Some(h) = header(l, end) {
                sec = Some(h);
            }
        }
        sec
    };
    let join = |sec: Option<String>, leaf: &str| match sec {
        Some(sec) => format!("{sec}.{leaf}"),
        None => leaf.to_string(),
    };
    let msg = e.message().trim();
    let key = if let Some(field) = msg
        .strip_prefix("missing field `")
        .and_then(|r| r.split('`').next())
    {
        // The span is the table that lacks the field.
        join(here, field)
    } else if let Some(h) = here {
        h
    } else {
        join(section(), line.split('=').next().unwrap_or("").trim())
    };
    if key.is_empty() {
        return ScenarioError::Parse(msg.to_string());
    }
    ScenarioError::Invalid {
        key,
        problem: msg.to_string(),
    }
}

/// Applies one `key=value` override to a TOML tree.
pub fn apply_set(tree: &mut toml::Table, kv: &str) -> Result<(), ScenarioError> {
    let (k, v) = kv
        .split_once('=')
        .ok_or_else(|| ScenarioError::Set(format!("`{kv}`: expected key=value")))?;
    let key = alias(k.trim());
    if key.is_empty() {
        return Err(ScenarioError::Set(format!("`{kv}`: empty key")));
    }
    let parts: Vec<&str> = key.split('.').collect();
    // A workload key needs the workload: `--set` tunes a workload the
    // scenario runs, it does not add one. A table given with all its
    // defaults (`[workload.sip]` alone) is a workload too.
    let workload_given = tree
        .get("workload")
        .and_then(|w| w.as_table())
        .is_some_and(|w| parts.get(1).is_some_and(|n| w.contains_key(*n)));
    let mut t = tree;
    let mut i = 0;
    while i + 1 < parts.len() {
        let p = parts[i];
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(Default::default()));
        // `vm.2.copies`: a number after an array of tables indexes it.
        let entry = if entry.is_array() && i + 2 < parts.len() {
            let toml::Value::Array(a) = entry else {
                unreachable!("checked just above")
            };
            {
                let n: usize = parts[i + 1].parse().map_err(|_| {
                    ScenarioError::Set(format!(
                        "`{kv}`: `{}` is an array: give an index after it",
                        parts[..=i].join(".")
                    ))
                })?;
                let len = a.len();
                i += 1;
                a.get_mut(n).ok_or_else(|| {
                    ScenarioError::Set(format!(
                        "`{kv}`: `{}` has {len} entries",
                        parts[..i].join(".")
                    ))
                })?
            }
        } else {
            entry
        };
        t = entry.as_table_mut().ok_or_else(|| {
            ScenarioError::Set(format!(
                "`{kv}`: `{}` is not a table",
                parts[..=i].join(".")
            ))
        })?;
        i += 1;
    }
    if key.starts_with("workload.") && parts.len() == 3 && !workload_given {
        return Err(ScenarioError::Set(format!(
            "`{k}`: this scenario has no `{}` workload",
            parts[1]
        )));
    }
    t.insert(parts[parts.len() - 1].to_string(), scalar(v.trim()));
    Ok(())
}

impl Scenario {
    /// Reads a scenario file and applies overrides.
    pub fn load(path: &Path, sets: &[String]) -> Result<Self, ScenarioError> {
        let text = read_input(path).map_err(|err| ScenarioError::Io {
            path: path.display().to_string(),
            err,
        })?;
        Self::parse(&text, sets).map_err(|e| match e {
            ScenarioError::Parse(m) => ScenarioError::Parse(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// Parses scenario text and applies overrides.
    pub fn parse(text: &str, sets: &[String]) -> Result<Self, ScenarioError> {
        let mut tree: toml::Table =
            toml::from_str(text).map_err(|e| ScenarioError::Parse(e.to_string()))?;
        // `--set config=...` overrides the file's scheme as well (it sets
        // both scheme and device); only a `--set scheme` beside it clashes.
        let sets_key = |key: &str| {
            sets.iter()
                .any(|s| s.split_once('=').is_some_and(|(k, _)| k.trim() == key))
        };
        // The same for the file's net.device.
        if sets_key("config") && !sets_key("scheme") {
            tree.remove("scheme");
        }
        if sets_key("config") && !sets_key("net.device") {
            if let Some(toml::Value::Table(net)) = tree.get_mut("net") {
                net.remove("device");
            }
        }
        for s in sets {
            apply_set(&mut tree, s)?;
        }
        let given = |section: &str, key: &str| {
            tree.get(section)
                .and_then(|t| t.as_table())
                .is_some_and(|t| t.contains_key(key))
        };
        let device_given = given("net", "device");
        let given_keys: Vec<&'static str> = [
            ("hv", "vtd_posted_interrupts", "hv.vtd_posted_interrupts"),
            ("hv", "eli_critical", "hv.eli_critical"),
            ("nic", "itr_interval_us", "nic.itr_interval_us"),
        ]
        .into_iter()
        .filter(|(sec, k, _)| given(sec, k))
        .map(|(_, _, dotted)| dotted)
        .collect();
        // Deserialized from text, not from the tree: the text's errors
        // carry a position, which names the key (the tree's do not).
        let mut s: Scenario = match toml::to_string(&tree) {
            Ok(t) => toml::from_str(&t).map_err(|e| typed_error(&t, &e))?,
            Err(_) => toml::Value::Table(tree)
                .try_into()
                .map_err(|e: toml::de::Error| ScenarioError::Parse(e.to_string()))?,
        };
        s.resolve_config(device_given)?;
        s.validate()?;
        s.warnings = s.pointless_options(&given_keys);
        Ok(s)
    }

    /// Options that are legal but have no effect under this scenario's
    /// scheme and settings. `given` holds the dotted keys the scenario or
    /// a `--set` stated explicitly (a default is never worth a warning).
    fn pointless_options(&self, given: &[&str]) -> Vec<String> {
        let mut w = Vec::new();
        let scheme = self.scheme.as_str();
        if given.contains(&"hv.vtd_posted_interrupts") && scheme != "apicv" {
            w.push(format!(
                "hv.vtd_posted_interrupts has no effect under scheme `{scheme}` (only apicv uses VT-d posted interrupts)"
            ));
        }
        if given.contains(&"hv.eli_critical") && !matches!(scheme, "eli" | "elvis") {
            w.push(format!(
                "hv.eli_critical has no effect under scheme `{scheme}` (only eli and elvis use it)"
            ));
        }
        for key in [
            "hv.posted_timers",
            "hv.halt_poll",
            "hv.halt_poll_max_us",
            "hv.ipiv",
        ] {
            if given.contains(&key) && scheme != "kvm-2026" {
                w.push(format!(
                    "{key} has no effect under scheme `{scheme}` (only kvm-2026 uses it)"
                ));
            }
        }
        if given.contains(&"hv.ipiv") && scheme == "kvm-2026" {
            w.push("hv.ipiv has no effect with one-vCPU guests (they send no IPIs)".into());
        }
        if given.contains(&"nic.itr_interval_us") && self.nic.itr != ItrMode::Fixed {
            w.push(format!(
                "nic.itr_interval_us has no effect with nic.itr = {} (only with `fixed`)",
                match self.nic.itr {
                    ItrMode::Ixgbevf36 => "ixgbevf-3.6",
                    ItrMode::Dynamic => "dynamic",
                    ItrMode::Off => "off",
                    ItrMode::Fixed => "fixed",
                }
            ));
        }
        if scheme == "bare-metal" {
            // Without a hypervisor there is no vCPU to deschedule and no
            // host sharing the core.
            if !self.preemptions.is_empty() {
                w.push(
                    "preemptions have no effect under scheme `bare-metal` (no vCPU to deschedule)"
                        .into(),
                );
            }
            if self.host.ipi_per_s > 0.0 {
                w.push("host.ipi_per_s has no effect under scheme `bare-metal` (no host beside the guest)".into());
            }
        }
        w
    }

    /// Expands `config` into `scheme` and `net.device`; `device_given`:
    /// the scenario or a `--set` also states `net.device`.
    fn resolve_config(&mut self, device_given: bool) -> Result<(), ScenarioError> {
        let Some(c) = &self.config else {
            if self.scheme.is_empty() {
                return Err(ScenarioError::Invalid {
                    key: "scheme".into(),
                    problem: "missing: give `scheme` or `config`".into(),
                });
            }
            return Ok(());
        };
        let (scheme, device) = config_of(c).ok_or_else(|| ScenarioError::Invalid {
            key: "config".into(),
            problem: format!(
                "unknown configuration `{c}` (known: {})",
                CONFIGS.join(", ")
            ),
        })?;
        if !self.scheme.is_empty() && self.scheme != scheme {
            return Err(ScenarioError::Invalid {
                key: "config".into(),
                problem: format!(
                    "`{c}` runs scheme `{scheme}` but the scenario also says scheme = `{}`; give one",
                    self.scheme
                ),
            });
        }
        if device_given && self.net.device != device {
            let name = |d: NetDevice| match d {
                NetDevice::Vf => "vf",
                NetDevice::Virtio => "virtio",
            };
            return Err(ScenarioError::Invalid {
                key: "config".into(),
                problem: format!(
                    "`{c}` uses net.device = `{}` but the scenario also says net.device = `{}`; give one",
                    name(device),
                    name(self.net.device)
                ),
            });
        }
        self.scheme = scheme.into();
        self.net.device = device;
        Ok(())
    }

    fn validate(&self) -> Result<(), ScenarioError> {
        let bad = |key: &str, problem: String| {
            Err(ScenarioError::Invalid {
                key: key.into(),
                problem,
            })
        };
        if crate::hv::scheme::by_name(&self.scheme).is_none() {
            return bad(
                "scheme",
                format!(
                    "unknown scheme `{}` (known: {})",
                    self.scheme,
                    crate::hv::scheme::SCHEMES.join(", ")
                ),
            );
        }
        // At least a microsecond: shorter measures nothing (and below a
        // picosecond, the engine's tick, it would be zero).
        if !(self.duration_s >= 1e-6 && self.duration_s <= 3600.0) {
            return bad(
                "duration_s",
                format!("{} must be in [1e-6, 3600]", self.duration_s),
            );
        }
        if !(self.warmup_s >= 0.0 && self.warmup_s <= 60.0) {
            return bad("warmup_s", format!("{} must be in [0, 60]", self.warmup_s));
        }
        if self.machine.cores < 2 || self.machine.cores > 64 {
            return bad(
                "machine.cores",
                format!(
                    "{} must be 2..=64 (core 0 is the host's)",
                    self.machine.cores
                ),
            );
        }
        if self.guest.hz == 0 || self.guest.hz > 10_000 {
            return bad("guest.hz", format!("{} must be 1..=10000", self.guest.hz));
        }
        for (k, v) in [
            ("guest.timer_vector", self.guest.timer_vector),
            ("guest.vf_vector", self.guest.vf_vector),
        ] {
            if v < 0x20 {
                return bad(
                    k,
                    format!("{v:#x} is a reserved exception vector; use 0x20..=0xfe"),
                );
            }
        }
        if self.guest.timer_vector == self.guest.vf_vector {
            return bad(
                "guest.vf_vector",
                "must differ from guest.timer_vector".into(),
            );
        }
        if !(1..=MAX_RCVBUF_PACKETS).contains(&self.guest.rcvbuf_packets) {
            return bad(
                "guest.rcvbuf_packets",
                format!(
                    "{} must be 1..={MAX_RCVBUF_PACKETS}",
                    self.guest.rcvbuf_packets
                ),
            );
        }
        if let Some(n) = self.guest.napi_weight {
            if !(1..=MAX_NAPI_WEIGHT).contains(&n) {
                return bad(
                    "guest.napi_weight",
                    format!("{n} must be 1..={MAX_NAPI_WEIGHT}"),
                );
            }
        }
        // Checked in every mode: see NicSpec::itr_interval_us.
        if !(self.nic.itr_interval_us > 0.0 && self.nic.itr_interval_us <= 1022.0) {
            return bad(
                "nic.itr_interval_us",
                format!("{} must be in (0, 1022]", self.nic.itr_interval_us),
            );
        }
        if let Some(u) = &self.workload.udp {
            if !(u.rate_pps > 0.0 && u.rate_pps <= 14_880_952.0) {
                return bad(
                    "workload.udp.rate_pps",
                    format!(
                        "{} must be in (0, 14880952] (10 GbE line rate of minimum frames)",
                        u.rate_pps
                    ),
                );
            }
            if !(18..=1472).contains(&u.payload_bytes) {
                return bad(
                    "workload.udp.payload_bytes",
                    format!("{} must be 18..=1472", u.payload_bytes),
                );
            }
        }
        if let Some(f) = &self.workload.fio {
            validate_fio(f, "workload.fio", &self.scheme)?;
        }
        if let Some(m) = &self.workload.memcached {
            match (m.client, m.rate_rps) {
                (MemcachedClientKind::OpenLoop, None) => {
                    return bad(
                        "workload.memcached.rate_rps",
                        "missing: the open-loop client's offered rate, requests/s (or set client = \"memaslap\")".into(),
                    );
                }
                (MemcachedClientKind::OpenLoop, Some(r)) if !(r > 0.0 && r <= 1e7) => {
                    return bad(
                        "workload.memcached.rate_rps",
                        format!("{r} must be in (0, 1e7]"),
                    );
                }
                _ => {}
            }
            if !(1..=4000).contains(&m.connections) {
                return bad("workload.memcached.connections", "must be 1..=4000".into());
            }
            if m.threads == 0 || m.threads > m.connections {
                return bad(
                    "workload.memcached.threads",
                    "must be at least 1 and at most the connections".into(),
                );
            }
            if !(1..=MAX_CLIENT_THREADS).contains(&m.client_threads) {
                return bad(
                    "workload.memcached.client_threads",
                    format!("{} must be 1..={MAX_CLIENT_THREADS}", m.client_threads),
                );
            }
            if m.value_bytes == 0
                || m.value_bytes > 1 << 20
                || m.key_bytes == 0
                || m.key_bytes > 250
            {
                return bad(
                    "workload.memcached",
                    "key_bytes must be 1..=250 and value_bytes 1..=1048576".into(),
                );
            }
            if self.workload.netpipe.is_some() || self.workload.iperf.is_some() {
                return bad("workload.memcached", "one TCP workload per scenario".into());
            }
        }
        if let Some(i) = &self.workload.iperf {
            if !(1..=(1 << 24)).contains(&i.len_bytes) {
                return bad(
                    "workload.iperf.len_bytes",
                    format!("{} must be 1..=16777216", i.len_bytes),
                );
            }
            if self.workload.netpipe.is_some() {
                return bad(
                    "workload.iperf",
                    "one TCP workload per scenario: drop workload.netpipe".into(),
                );
            }
        }
        if let Some(n) = &self.workload.netpipe {
            if !(1..=65536).contains(&n.msg_bytes) {
                return bad(
                    "workload.netpipe.msg_bytes",
                    format!("{} must be 1..=65536", n.msg_bytes),
                );
            }
        }
        validate_network_workload(&self.workload, "workload")?;
        if let Some(p) = &self.workload.sip {
            if !(p.rate_cps > 0.0 && p.rate_cps <= 1e5) {
                return bad(
                    "workload.sip.rate_cps",
                    format!("{} must be in (0, 100000]", p.rate_cps),
                );
            }
            if !(p.call_duration_s >= 0.0 && p.call_duration_s <= 3600.0) {
                return bad(
                    "workload.sip.call_duration_s",
                    format!("{} must be in [0, 3600]", p.call_duration_s),
                );
            }
            if !(1..=1_000_000).contains(&p.calls) {
                return bad("workload.sip.calls", "must be 1..=1000000".into());
            }
            if self.workload.tcp() {
                return bad(
                    "workload.sip",
                    "cannot be combined with a TCP workload (netpipe, iperf, memcached)".into(),
                );
            }
        }
        if self.workload.peers() {
            if self.scheme == "bare-metal" && self.net.device == NetDevice::Virtio {
                return bad(
                    "net.device",
                    "virtio needs a hypervisor: bare metal has no vhost".into(),
                );
            }
            if self.workload.udp.is_some() {
                return bad(
                    "workload.udp",
                    "cannot be combined with a TCP or SIP workload yet".into(),
                );
            }
        }
        if !self.net.queue_size.is_power_of_two() || !(16..=4096).contains(&self.net.queue_size) {
            return bad(
                "net.queue_size",
                format!(
                    "{} must be a power of two in 16..=4096",
                    self.net.queue_size
                ),
            );
        }
        if let Some(w) = &self.workload.whileloop {
            if !(w.iterations >= 1.0 && w.iterations < 1e15) {
                return bad(
                    "workload.whileloop.iterations",
                    format!("{} must be in [1, 1e15)", w.iterations),
                );
            }
        }
        if let Some(c) = &self.workload.cyclictest {
            if !(c.interval_us >= 10.0 && c.interval_us <= 1e6) {
                return bad(
                    "workload.cyclictest.interval_us",
                    format!("{} must be in [10, 1e6]", c.interval_us),
                );
            }
        }
        if !(self.host.ipi_per_s >= 0.0 && self.host.ipi_per_s <= 1e6) {
            return bad(
                "host.ipi_per_s",
                format!("{} must be in [0, 1e6]", self.host.ipi_per_s),
            );
        }
        if self.host.burners.len() > HostSpec::MAX_BURNERS {
            return bad(
                "host.burners",
                format!(
                    "{} burners: at most {}",
                    self.host.burners.len(),
                    HostSpec::MAX_BURNERS
                ),
            );
        }
        if !(-20..=19).contains(&self.host.vcpu_nice) {
            return bad(
                "host.vcpu_nice",
                format!("{} must be in -20..=19", self.host.vcpu_nice),
            );
        }
        for (i, b) in self.host.burners.iter().enumerate() {
            if !(-20..=19).contains(&b.nice) {
                return bad(
                    &format!("host.burners[{i}].nice"),
                    format!("{} must be in -20..=19", b.nice),
                );
            }
            if b.cores.is_empty() {
                return bad(
                    &format!("host.burners[{i}].cores"),
                    "must name at least one core".into(),
                );
            }
            if let Some(c) = b.cores.iter().find(|&&c| c >= self.machine.cores) {
                return bad(
                    &format!("host.burners[{i}].cores"),
                    format!(
                        "core {c} does not exist (machine.cores = {})",
                        self.machine.cores
                    ),
                );
            }
        }
        self.validate_vms()?;
        if self.guest.apic == crate::guest::ApicMode::Xapic {
            if !matches!(
                self.scheme.as_str(),
                "kvm" | "apicv" | "kvm-2026" | "bare-metal"
            ) {
                return bad(
                    "guest.apic",
                    format!(
                        "xapic: scheme `{}` passes x2APIC MSRs through to the guest (its EOI is a WRMSR); xAPIC guests run under kvm, apicv, kvm-2026 and bare-metal",
                        self.scheme
                    ),
                );
            }
            if self.vms.iter().any(|v| v.vcpus > 1) {
                return bad(
                    "guest.apic",
                    "xapic: SMP xAPIC guests (their ICR is two stores) are not modelled; use one vCPU per VM or x2apic".into(),
                );
            }
        }
        if let Some(m) = self.hv.halt_poll_max_us {
            if !(m.is_finite() && (0.0..=100_000.0).contains(&m)) {
                return bad("hv.halt_poll_max_us", format!("{m} must be in [0, 100000]"));
            }
        }
        for (key, v, hi) in [
            ("hv.es2_quota", self.hv.es2_quota, 65_536),
            (
                "hv.es2_max_poll_count",
                self.hv.es2_max_poll_count,
                10_000_000,
            ),
            ("hv.es2_combining_level", self.hv.es2_combining_level, 64),
        ] {
            if let Some(v) = v {
                if !(1..=hi).contains(&v) {
                    return bad(key, format!("{v} must be in [1, {hi}]"));
                }
            }
        }
        if let Some(us) = self.hv.es2_sleep_us {
            if !(us.is_finite() && (0.1..=10_000.0).contains(&us)) {
                return bad("hv.es2_sleep_us", format!("{us} must be in [0.1, 10000]"));
            }
        }
        if !(self.host.vcpu_start_skew_ms.is_finite()
            && (0.0..=10_000.0).contains(&self.host.vcpu_start_skew_ms))
        {
            return bad(
                "host.vcpu_start_skew_ms",
                format!("{} must be in [0, 10000]", self.host.vcpu_start_skew_ms),
            );
        }
        for (i, &c) in self.host.io_cores.iter().enumerate() {
            if c >= self.machine.cores {
                return bad(
                    &format!("host.io_cores[{i}]"),
                    format!(
                        "core {c} does not exist (machine.cores = {})",
                        self.machine.cores
                    ),
                );
            }
        }
        if !self.host.burners.is_empty() && !self.preemptions.is_empty() {
            return bad(
                "preemptions",
                "scripted preemptions and [[host.burners]] (the host scheduler) cannot be combined"
                    .into(),
            );
        }
        // The longest run is 60 s of warm-up and 3600 s measured; a
        // preemption is at most that long and starts within it (later
        // times would overflow the picosecond clock).
        const RUN_MS: f64 = 3_660_000.0;
        for (i, p) in self.preemptions.iter().enumerate() {
            if !(p.at_ms >= 0.0 && p.at_ms <= RUN_MS) {
                return bad(
                    &format!("preemptions[{i}].at_ms"),
                    format!("{} must be in [0, {RUN_MS}]", p.at_ms),
                );
            }
            if !(p.for_ms >= 1e-6 && p.for_ms <= RUN_MS) {
                return bad(
                    &format!("preemptions[{i}].for_ms"),
                    format!("{} must be in [1e-6, {RUN_MS}] (1 ns at least)", p.for_ms),
                );
            }
            let count = p.count.unwrap_or(1);
            if count == 0 || count > Preemption::MAX_COUNT {
                return bad(
                    &format!("preemptions[{i}].count"),
                    format!("{count} must be in [1, {}]", Preemption::MAX_COUNT),
                );
            }
            match p.every_ms {
                Some(e) if !(e.is_finite() && e > p.for_ms) => {
                    return bad(
                        &format!("preemptions[{i}].every_ms"),
                        format!(
                            "{e} must be finite and longer than for_ms = {} (occurrences may not overlap)",
                            p.for_ms
                        ),
                    );
                }
                None if count > 1 => {
                    return bad(
                        &format!("preemptions[{i}].count"),
                        format!("{count} occurrences need every_ms"),
                    );
                }
                _ => {}
            }
            let last = p.at_ms + (count - 1) as f64 * p.every_ms.unwrap_or(0.0);
            if last > RUN_MS {
                return bad(
                    &format!("preemptions[{i}]"),
                    format!("the last occurrence starts at {last} ms, after the longest run ({RUN_MS} ms)"),
                );
            }
        }
        if !(self.check.lost_grace_ms >= 1e-6 && self.check.lost_grace_ms <= RUN_MS) {
            return bad(
                "check.lost_grace_ms",
                format!(
                    "{} must be in [1e-6, {RUN_MS}] (1 ns up to the longest run)",
                    self.check.lost_grace_ms
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
scheme = "did"
duration_s = 0.1
[workload.udp]
rate_pps = 100000
"#;

    #[test]
    fn parses_and_applies_sets_with_aliases() {
        let s = Scenario::parse(
            BASE,
            &[
                "rate_pps=250000".into(),
                "scheme=kvm".into(),
                "guest.hz=250".into(),
            ],
        )
        .unwrap();
        assert_eq!(s.workload.udp.unwrap().rate_pps, 250000.0);
        assert_eq!(s.scheme, "kvm");
        assert_eq!(s.guest.hz, 250);
        assert_eq!(s.machine.cores, 2);
    }

    fn err(text: &str, sets: &[&str]) -> String {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Scenario::parse(text, &sets).unwrap_err().to_string()
    }

    fn ok(text: &str, sets: &[&str]) -> Scenario {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Scenario::parse(text, &sets).unwrap()
    }

    #[test]
    fn sizes_durations_and_non_finite_values_are_bounded_by_key() {
        for (set, key) in [
            (
                "guest.rcvbuf_packets=1000000000000000",
                "guest.rcvbuf_packets",
            ),
            ("guest.napi_weight=100000", "guest.napi_weight"),
            ("duration_s=1e-13", "duration_s"),
            ("duration_s=nan", "duration_s"),
            ("warmup_s=nan", "warmup_s"),
            ("check.lost_grace_ms=inf", "check.lost_grace_ms"),
            ("check.lost_grace_ms=nan", "check.lost_grace_ms"),
            ("rate_pps=nan", "workload.udp.rate_pps"),
            ("host.ipi_per_s=inf", "host.ipi_per_s"),
        ] {
            let e = err(BASE, &[set]);
            assert!(e.contains(key), "{set}: {e}");
        }
        let e = err(
            &format!("{BASE}[[preemptions]]\nat_ms = 1e300\nfor_ms = 1\n"),
            &[],
        );
        assert!(e.contains("preemptions[0].at_ms"), "{e}");
        let e = err(
            &format!("{BASE}[[preemptions]]\nat_ms = 1\nfor_ms = 1e-12\n"),
            &[],
        );
        assert!(e.contains("preemptions[0].for_ms"), "{e}");
        let fio = "scheme = \"kvm\"\nduration_s = 0.1\n[workload.fio]\n";
        let e = err(fio, &["workload.fio.disk_bytes=9000000000000000000"]);
        assert!(e.contains("workload.fio.disk_bytes"), "{e}");
        let mc = "scheme = \"kvm\"\nduration_s = 0.1\n[workload.memcached]\nrate_rps = 1000\n";
        let e = err(mc, &["workload.memcached.client_threads=60000"]);
        assert!(e.contains("workload.memcached.client_threads"), "{e}");
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

    #[test]
    fn config_and_a_disagreeing_net_device_are_an_error() {
        let file = "config = \"pv\"\nduration_s = 0.1\n[net]\ndevice = \"vf\"\n[workload.netpipe]\nmsg_bytes = 64\n";
        let e = err(file, &[]);
        assert!(e.contains("config") && e.contains("net.device"), "{e}");
        let e = err(
            "duration_s = 0.1\n[workload.netpipe]\nmsg_bytes = 64\n",
            &["config=sriov", "net.device=virtio"],
        );
        assert!(e.contains("net.device"), "{e}");
        // Agreeing is fine.
        let agree = file.replace("\"vf\"", "\"virtio\"");
        assert_eq!(ok(&agree, &[]).net.device, NetDevice::Virtio);
        // `--set config` replaces the file's device as it replaces its scheme.
        let s = ok(
            &agree.replace("config = \"pv\"", "scheme = \"kvm\""),
            &["config=sriov-did"],
        );
        assert_eq!((s.scheme.as_str(), s.net.device), ("did", NetDevice::Vf));
    }

    #[test]
    fn options_the_scheme_ignores_are_warnings_not_errors() {
        for (scheme, set, warns) in [
            ("kvm", "hv.vtd_posted_interrupts=true", true),
            ("did", "hv.vtd_posted_interrupts=true", true),
            ("apicv", "hv.vtd_posted_interrupts=true", false),
            ("kvm", "hv.eli_critical=nmi", true),
            ("apicv", "hv.eli_critical=nmi", true),
            ("eli", "hv.eli_critical=nmi", false),
            ("elvis", "hv.eli_critical=bounce", false),
            ("bare-metal", "host.ipi_per_s=1000", true),
            ("kvm", "host.ipi_per_s=1000", false),
        ] {
            let s = ok(BASE, &[&format!("scheme={scheme}"), set]);
            assert_eq!(
                !s.warnings.is_empty(),
                warns,
                "{scheme} {set}: {:?}",
                s.warnings
            );
            let key = set.split_once('=').unwrap().0;
            assert!(
                s.warnings.iter().all(|w| w.contains(key)),
                "{:?}",
                s.warnings
            );
        }
    }

    #[test]
    fn input_files_are_read_up_to_a_cap() {
        let e = Scenario::load(Path::new("/dev/zero"), &[]);
        if let Err(ScenarioError::Io { err, .. }) = &e {
            assert!(err.to_string().contains("larger than"), "{err}");
        } else if Path::new("/dev/zero").exists() {
            panic!("/dev/zero read as a scenario: {e:?}");
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
        assert_eq!(v[0].allowed, vec![0b11110, 0b11110]);
        // Spread: copy k's vCPU j starts on the (2k + j)th core of the set.
        assert_eq!(
            (v[0].cores.clone(), v[1].cores.clone()),
            (vec![1, 2], vec![3, 4])
        );
        let s = ok(&vm("[[1, 2], [3]]", ""), &[]);
        assert_eq!(s.vm_views()[1].allowed, vec![0b110, 0b1000]);
        let s = ok(&vm("[2, 3]", "cores = [3, 3]"), &[]);
        assert_eq!(s.vm_views()[0].cores, vec![3, 3]);
        // Without allowed_cores each vCPU is pinned to its core.
        let s = ok(
            "scheme = \"kvm\"\nduration_s = 0.1\n[machine]\ncores = 4\n[[vm]]\nvcpus = 2\ncores = [1, 3]\n",
            &[],
        );
        assert_eq!(s.vm_views()[0].allowed, vec![0b10, 0b1000]);
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

    #[test]
    fn errors_name_the_key() {
        let e = Scenario::parse(BASE, &["scheme=posted".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`scheme`") && e.contains("posted"), "{e}");
        let e = Scenario::parse(BASE, &["rate_pps=-5".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("workload.udp.rate_pps"), "{e}");
        let e = Scenario::parse(BASE, &["guest.hzz=5".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("hzz"), "{e}");
        let e = Scenario::parse(BASE, &["duration_s=abc".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("duration_s"), "{e}");
        // A wrong type names its dotted key, in a table or not.
        for (set, key) in [
            ("rate_pps=\"fast\"", "`workload.udp.rate_pps`"),
            ("guest.irq_nesting=3", "`guest.irq_nesting`"),
            ("guest.tick={}", "`guest.tick`"),
            ("guest.vf_vector=1000", "`guest.vf_vector`"),
            ("seed=-1", "`seed`"),
            (
                "preemptions=[{at_ms=1,for_ms=1},{at_ms=\"x\",for_ms=1}]",
                "`preemptions[1].at_ms`",
            ),
        ] {
            let e = Scenario::parse(BASE, &[set.into()])
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{set}: {e}");
        }
        let e = Scenario::parse("scheme = \"kvm\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`duration_s`") && e.contains("missing"), "{e}");
        let e = Scenario::parse(&format!("{BASE}[workload.netpipe]\n"), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`workload.netpipe.msg_bytes`"), "{e}");
        let e = Scenario::parse(BASE, &["nokey".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("key=value"), "{e}");
        let e = Scenario::parse(BASE, &["iterations=5".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("no `whileloop` workload"), "{e}");
        // A workload given with all its defaults can be tuned.
        let sip = "scheme = \"kvm\"\nduration_s = 0.1\n[workload.sip]\n";
        let s = Scenario::parse(sip, &["workload.sip.calls=5".into()]).unwrap();
        assert_eq!(s.workload.sip.unwrap().calls, 5);
    }
}
