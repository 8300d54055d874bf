//! The machine and what runs on it besides the VMs: cores, the guest
//! kernel's configuration, background exits, host activity, scripted
//! preemptions and invariant checking. Each section's keys, defaults and
//! checks.

use super::{bad, require, within, ScenarioError};
use crate::guest::TickMode;
use serde::{Deserialize, Serialize};

/// The machine.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MachineSpec {
    /// Physical cores. Core 0 is host-only (DID's designated timer core);
    /// the VM's vCPU is pinned to core 1.
    pub cores: usize,
    /// A named board whose parameters come from its public sources
    /// (`jetson-xavier-nx`, arch = "arm64"; calibration `[jetson]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub board: Option<super::board::BoardSpec>,
    /// Hyper-Threading: the cores are logical CPUs, two per physical
    /// core, CPU i and i + cores/2 siblings (Linux's enumeration on Intel
    /// parts). A guest's work on a CPU whose sibling is busy runs at
    /// calibration `cpu.smt_shared_speed` (docs/calibration-sources.md
    /// §25). Off: every core is a physical core of its own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub smt: bool,
    /// `arch = "riscv64"`: guest interrupt files per hart's IMSIC (the H
    /// extension's GEILEN; default 5, as QEMU `virt`'s `aia-guests` and a
    /// 4 KiB-aligned 8-page IMSIC region per hart hold with the S file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub riscv_guest_files: Option<usize>,
}

impl Default for MachineSpec {
    fn default() -> Self {
        MachineSpec {
            cores: 2,
            board: None,
            smt: false,
            riscv_guest_files: None,
        }
    }
}

impl MachineSpec {
    /// Most cores a machine may have (the host's core masks are this
    /// wide).
    pub const MAX_CORES: usize = crate::engine::CPUMASK_BITS;

    /// Checks `machine.cores`.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let c = self.cores;
        let range = "2..=512 (core 0 is the host's)";
        require(
            (2..=Self::MAX_CORES).contains(&c),
            "machine",
            "cores",
            c,
            range,
        )?;
        if self.smt {
            require(
                c.is_multiple_of(2),
                "machine",
                "cores",
                c,
                "even with machine.smt (two threads per physical core)",
            )?;
        }
        Ok(())
    }

    /// With [`Self::smt`], the Hyper-Threading sibling of logical CPU
    /// `core`; without, none.
    pub fn smt_sibling(&self, core: usize) -> Option<usize> {
        self.smt.then(|| (core + self.cores / 2) % self.cores)
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
    /// TCP receive buffers of the guest and its peer hosts:
    /// `autotune-3.6` (the default: Linux 3.6's `tcp_rcv_space_adjust`
    /// from `tcp_rmem` = 4096 87380 6 MiB), `autotune-4.4` (Linux 4.4's),
    /// or `fixed-512k` (a fixed 512 KiB window, the model's earlier
    /// assumption, for sensitivity runs).
    pub tcp_rcvbuf: TcpRcvbuf,
    /// x86: how the guest drives its LAPIC timer clockevent: `oneshot`
    /// (TMICT, Linux booted with lapic=notscdeadline: the default, as in
    /// the 2012–2015 papers' guests) or `tsc-deadline` (IA32_TSC_DEADLINE,
    /// what Linux uses when the CPU model advertises it, as KVM's does
    /// today; what APIC-timer virtualization virtualizes). Ignored on arm64.
    pub lapic_timer: LapicTimer,
}

/// `guest.lapic_timer`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, Serialize, schemars::JsonSchema,
)]
pub enum LapicTimer {
    /// One-shot mode: TMICT at divide-by-16.
    #[default]
    #[serde(rename = "oneshot")]
    Oneshot,
    /// TSC-deadline mode: IA32_TSC_DEADLINE.
    #[serde(rename = "tsc-deadline")]
    TscDeadline,
}

/// How TCP sockets size their receive buffer (`guest.tcp_rcvbuf`).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize, Serialize, schemars::JsonSchema,
)]
pub enum TcpRcvbuf {
    /// Linux 3.6 autotuning.
    #[default]
    #[serde(rename = "autotune-3.6")]
    Autotune36,
    /// Linux 4.4 autotuning.
    #[serde(rename = "autotune-4.4")]
    Autotune44,
    /// A fixed 512 KiB window.
    #[serde(rename = "fixed-512k")]
    Fixed512k,
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
            tcp_rcvbuf: TcpRcvbuf::Autotune36,
            lapic_timer: LapicTimer::Oneshot,
        }
    }
}

impl GuestSpec {
    /// Checks the `guest` keys but `apic` (see [`Self::validate_apic`]).
    pub fn validate(&self) -> Result<(), ScenarioError> {
        within("guest", "hz", self.hz, 1, 10_000)?;
        for (k, v) in [
            ("timer_vector", self.timer_vector),
            ("vf_vector", self.vf_vector),
        ] {
            if v < 0x20 {
                return bad(
                    "guest",
                    k,
                    format!("{v:#x} is a reserved exception vector; use 0x20..=0xfe"),
                );
            }
        }
        if self.timer_vector == self.vf_vector {
            return bad("guest", "vf_vector", "must differ from guest.timer_vector");
        }
        let rcvbuf = self.rcvbuf_packets;
        within("guest", "rcvbuf_packets", rcvbuf, 1, MAX_RCVBUF_PACKETS)?;
        if let Some(n) = self.napi_weight {
            within("guest", "napi_weight", n, 1, MAX_NAPI_WEIGHT)?;
        }
        Ok(())
    }

    /// Checks `guest.apic` against the scheme and the VMs (`smp`: some VM
    /// has several vCPUs).
    pub fn validate_apic(&self, scheme: &str, smp: bool) -> Result<(), ScenarioError> {
        if self.apic != crate::guest::ApicMode::Xapic {
            return Ok(());
        }
        if !matches!(scheme, "kvm" | "apicv" | "kvm-2026" | "bare-metal") {
            return bad(
                "guest",
                "apic",
                format!(
                    "xapic: scheme `{scheme}` passes x2APIC MSRs through to the guest (its EOI is a WRMSR); xAPIC guests run under kvm, apicv, kvm-2026 and bare-metal"
                ),
            );
        }
        if smp {
            return bad(
                "guest",
                "apic",
                "xapic: SMP xAPIC guests (their ICR is two stores) are not modelled; use one vCPU per VM or x2apic",
            );
        }
        Ok(())
    }
}

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
    /// The vhost worker threads are not pinned: each starts on its
    /// `io_cores` entry and the host scheduler may run it on every core (a
    /// host that pins only the vCPU, as DID's §5.1 states). Default false:
    /// pinned.
    pub vhost_unpinned: bool,
    /// The cores the threads of a peer process on this host may run on
    /// (a client behind the bridge, or reached through the NIC's embedded
    /// switch: `net.vf_peer = "host"`): each of the peer's CPUs (memcached's
    /// `client_threads`) becomes a host thread, free to run on these cores
    /// under the host scheduler beside the vCPU and vhost threads, and
    /// thread k starts on `peer_cores[k % len]`. Empty (default): the peer
    /// has CPUs of its own.
    pub peer_cores: Vec<usize>,
    /// Each vCPU thread starts with a virtual runtime drawn uniformly from
    /// [0, this) ms (seeded): VMs booted at different times, so the host
    /// scheduler's rotation on each core is out of phase with the others'.
    /// 0 (default): every thread starts level, and cores that hold the
    /// same threads rotate in step.
    pub vcpu_start_skew_ms: f64,
    /// QEMU's display: with one open (SDL, QEMU 1.0's default when neither
    /// `-nographic` nor `-vnc` is given) its refresh timer runs on the
    /// main loop every 30 ms. Only the modelled main loop (the virtio-blk
    /// back end's) sees it.
    pub qemu_display: QemuDisplay,
}

/// QEMU's display front end, as far as the main loop sees it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum QemuDisplay {
    /// An SDL window: `gui_update` refreshes it every
    /// `GUI_REFRESH_INTERVAL` (30 ms).
    #[default]
    Sdl,
    /// `-display none`: no refresh timer.
    None,
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

    /// Checks the `host` keys on a machine of `machine_cores` cores.
    pub fn validate(&self, machine_cores: usize) -> Result<(), ScenarioError> {
        let ipi = self.ipi_per_s;
        require(
            (0.0..=1e6).contains(&ipi),
            "host",
            "ipi_per_s",
            ipi,
            "in [0, 1e6]",
        )?;
        if self.burners.len() > Self::MAX_BURNERS {
            return bad(
                "host",
                "burners",
                format!(
                    "{} burners: at most {}",
                    self.burners.len(),
                    Self::MAX_BURNERS
                ),
            );
        }
        nice("host", "vcpu_nice", self.vcpu_nice)?;
        for (i, b) in self.burners.iter().enumerate() {
            b.validate(&format!("host.burners[{i}]"), machine_cores)?;
        }
        let skew = self.vcpu_start_skew_ms;
        let ok = skew.is_finite() && (0.0..=10_000.0).contains(&skew);
        require(ok, "host", "vcpu_start_skew_ms", skew, "in [0, 10000]")?;
        for (i, &c) in self.io_cores.iter().enumerate() {
            core_exists("host", &format!("io_cores[{i}]"), c, machine_cores)?;
        }
        for (i, &c) in self.peer_cores.iter().enumerate() {
            core_exists("host", &format!("peer_cores[{i}]"), c, machine_cores)?;
        }
        Ok(())
    }
}

impl BurnerSpec {
    /// Checks a burner's keys (`at`: `host.burners[i]`).
    pub fn validate(&self, at: &str, machine_cores: usize) -> Result<(), ScenarioError> {
        nice(at, "nice", self.nice)?;
        if self.cores.is_empty() {
            return bad(at, "cores", "must name at least one core");
        }
        for &c in &self.cores {
            core_exists(at, "cores", c, machine_cores)?;
        }
        Ok(())
    }
}

/// Checks a nice level (`at.leaf`).
fn nice(at: &str, leaf: &str, v: i32) -> Result<(), ScenarioError> {
    require((-20..=19).contains(&v), at, leaf, v, "in -20..=19")
}

/// Checks that core `c` (`at.leaf`) is one of the machine's.
fn core_exists(at: &str, leaf: &str, c: usize, machine_cores: usize) -> Result<(), ScenarioError> {
    if c < machine_cores {
        return Ok(());
    }
    bad(
        at,
        leaf,
        format!("core {c} does not exist (machine.cores = {machine_cores})"),
    )
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

/// The longest run, ms: 60 s of warm-up and 3600 s measured. A
/// preemption is at most that long and starts within it (later times
/// would overflow the picosecond clock).
const RUN_MS: f64 = 3_660_000.0;

impl Preemption {
    /// Largest `count`: a bound on the events a scenario can schedule.
    pub const MAX_COUNT: u32 = 100_000;

    /// The (start, length) of each occurrence, ms.
    pub fn occurrences(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        let every = self.every_ms.unwrap_or(0.0);
        (0..self.count.unwrap_or(1)).map(move |i| (self.at_ms + i as f64 * every, self.for_ms))
    }

    /// Checks its keys (`at`: `preemptions[i]`).
    pub fn validate(&self, at: &str) -> Result<(), ScenarioError> {
        let (start, length) = (self.at_ms, self.for_ms);
        let range = format!("in [0, {RUN_MS}]");
        require((0.0..=RUN_MS).contains(&start), at, "at_ms", start, &range)?;
        let range = format!("in [1e-6, {RUN_MS}] (1 ns at least)");
        require(
            (1e-6..=RUN_MS).contains(&length),
            at,
            "for_ms",
            length,
            &range,
        )?;
        let count = self.count.unwrap_or(1);
        let range = format!("in [1, {}]", Self::MAX_COUNT);
        require(
            (1..=Self::MAX_COUNT).contains(&count),
            at,
            "count",
            count,
            &range,
        )?;
        match self.every_ms {
            Some(e) if !(e.is_finite() && e > self.for_ms) => {
                return bad(
                    at,
                    "every_ms",
                    format!(
                        "{e} must be finite and longer than for_ms = {} (occurrences may not overlap)",
                        self.for_ms
                    ),
                );
            }
            None if count > 1 => {
                return bad(at, "count", format!("{count} occurrences need every_ms"));
            }
            _ => {}
        }
        let last = self.at_ms + (count - 1) as f64 * self.every_ms.unwrap_or(0.0);
        if last > RUN_MS {
            return bad(
                at,
                "",
                format!(
                    "the last occurrence starts at {last} ms, after the longest run ({RUN_MS} ms)"
                ),
            );
        }
        Ok(())
    }
}

/// Invariant checking.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CheckSpec {
    /// An interrupt still undelivered this long after it was raised, at the
    /// end of the run, is lost.
    pub lost_grace_ms: f64,
    /// The stranded rule (0: off; default 200 µs, `check::STRANDED_BOUND`):
    /// an interrupt raised for one vCPU that stays pending while that vCPU
    /// sleeps (halted, not in a run queue) longer than this in all is
    /// lost, even if something later wakes the vCPU and it takes it
    /// (docs/amd.md, erratum 1235).
    pub stranded_us: f64,
}

impl Default for CheckSpec {
    fn default() -> Self {
        CheckSpec {
            lost_grace_ms: 10.0,
            stranded_us: crate::check::STRANDED_BOUND as f64 / crate::engine::US as f64,
        }
    }
}

impl CheckSpec {
    /// Checks `check.lost_grace_ms` and `check.stranded_us`.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let s = self.stranded_us;
        require(
            s == 0.0 || (1e-3..=RUN_MS * 1000.0).contains(&s),
            "check",
            "stranded_us",
            s,
            "0 (off) or in [1e-3, the longest run in us]",
        )?;
        let grace = self.lost_grace_ms;
        let range = format!("in [1e-6, {RUN_MS}] (1 ns up to the longest run)");
        require(
            (1e-6..=RUN_MS).contains(&grace),
            "check",
            "lost_grace_ms",
            grace,
            &range,
        )
    }
}
