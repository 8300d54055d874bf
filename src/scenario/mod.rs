//! Scenario files: what to build and run. TOML, strictly checked: an unknown
//! key, a wrong type or a value out of range is an error that names the key.
//! `--set key=value` overrides edit the TOML tree before it is checked.
//!
//! One file per section, each with its keys, their defaults and their
//! checks: [`machine`] (cores, guest, background, host, preemptions,
//! check), [`net`] (nic, net, config), [`vm`] (`[[vm]]`), [`workloads`]
//! and [`hv`]'s checks; [`overrides`] handles the TOML text. A scenario
//! without `[[vm]]` tables is sugar for one VM (see [`Scenario::parse`]).

mod arm;
mod board;
pub mod hv;
pub mod machine;
pub mod net;
pub mod overrides;
pub mod vm;
pub mod workloads;

pub use arm::{ArchSpec, ArmSpec, GicVersionSpec, HypModeSpec, ReportSpec, SpiAffinitySpec};
pub use board::BoardSpec;
pub use machine::*;
pub use net::*;
pub use overrides::apply_set;
pub use vm::*;
pub use workloads::*;

use serde::{Deserialize, Serialize};
use std::path::Path;

/// A scenario.
#[derive(Clone, Debug, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, remote = "Self")]
#[schemars(rename = "Scenario")]
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
    /// The architecture the guests run on: `x86_64` (VT-x, the default)
    /// or `arm64` (EL2 with a GICv3/v4: the schemes kvm-arm, kvm-arm-v4,
    /// did-arm).
    #[serde(default)]
    pub arch: ArchSpec,
    /// ARM platform settings (with `arch = "arm64"`).
    #[serde(default)]
    pub arm: ArmSpec,
    /// Optional report contents.
    #[serde(default)]
    pub report: ReportSpec,
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
    /// The single VM's workloads, when there are no `[[vm]]` tables.
    /// Parsing moves them into that VM (`vms[0]`): afterwards this is
    /// empty.
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
    /// out: one VM on core 1 running the top-level `workload`. After
    /// parsing never empty: that VM is listed here.
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
    use std::io::{ErrorKind, Read};
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    // Opened non-blocking: open(2) of a FIFO nobody writes to would wait
    // forever. Reads then wait for a writer that is there but slow.
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let kind = f.metadata()?.file_type();
    if kind.is_dir() {
        return Err(std::io::Error::new(
            ErrorKind::InvalidInput,
            "a directory, not a file",
        ));
    }
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    // A FIFO reads as empty until its writer has opened it: give a writer
    // that is about to (a process substitution, a script) a moment.
    let mut writer_grace = 40;
    loop {
        match f.read(&mut chunk) {
            Ok(0) if kind.is_fifo() && bytes.is_empty() && writer_grace > 0 => {
                writer_grace -= 1;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Ok(0) => break,
            Ok(n) => {
                bytes.extend_from_slice(&chunk[..n]);
                if bytes.len() as u64 > MAX_INPUT_BYTES {
                    return Err(std::io::Error::new(
                        ErrorKind::InvalidData,
                        format!("larger than {MAX_INPUT_BYTES} bytes"),
                    ));
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if bytes.is_empty() && kind.is_fifo() {
        return Err(std::io::Error::new(
            ErrorKind::InvalidInput,
            "a FIFO with no writer: nothing to read",
        ));
    }
    String::from_utf8(bytes)
        .map_err(|_| std::io::Error::new(ErrorKind::InvalidData, "not UTF-8 text"))
}

fn one() -> u64 {
    1
}
fn warmup() -> f64 {
    0.05
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
    #[error("scenario {}", overrides::elide_quoted(.0))]
    Parse(String),
    /// Bad `--set`.
    #[error("--set {}", overrides::elide_quoted(.0))]
    Set(String),
    /// A value out of range.
    #[error(
        "scenario key `{}`: {}",
        overrides::shown(key),
        overrides::elide_quoted(problem)
    )]
    Invalid {
        /// Dotted key.
        key: String,
        /// What is wrong.
        problem: String,
    },
}

/// `at.leaf`, the dotted key of `leaf` in the table at `at`; `at` alone
/// for the table itself (`leaf` empty), `leaf` alone at the top level
/// (`at` empty).
pub(crate) fn key(at: &str, leaf: &str) -> String {
    match (at, leaf) {
        ("", leaf) => leaf.to_string(),
        (at, "") => at.to_string(),
        (at, leaf) => format!("{at}.{leaf}"),
    }
}

/// The error for a bad value of [`key`]`(at, leaf)`.
pub(crate) fn bad<T>(at: &str, leaf: &str, problem: impl Into<String>) -> Result<T, ScenarioError> {
    Err(ScenarioError::Invalid {
        key: key(at, leaf),
        problem: problem.into(),
    })
}

/// Checks `lo <= v <= hi` (false for NaN); the error names `at.leaf`:
/// "v must be lo..=hi".
pub(crate) fn within<T: PartialOrd + std::fmt::Display>(
    at: &str,
    leaf: &str,
    v: T,
    lo: T,
    hi: T,
) -> Result<(), ScenarioError> {
    if lo <= v && v <= hi {
        return Ok(());
    }
    bad(at, leaf, format!("{v} must be {lo}..={hi}"))
}

/// Checks `ok`, a condition on the value `v` of `at.leaf`; the error
/// names the key: "v must be {range}", `range` saying what `ok` tests
/// (`in (0, 1022]`).
pub(crate) fn require(
    ok: bool,
    at: &str,
    leaf: &str,
    v: impl std::fmt::Display,
    range: &str,
) -> Result<(), ScenarioError> {
    if ok {
        return Ok(());
    }
    bad(at, leaf, format!("{v} must be {range}"))
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

    /// Parses scenario text and applies overrides. A scenario without
    /// `[[vm]]` tables comes back with its one VM in `vms`
    /// ([`VmSpec::top_level`], running the top-level `workload`).
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
            Ok(t) => toml::from_str(&t).map_err(|e| overrides::typed_error(&t, &e))?,
            Err(_) => toml::Value::Table(tree)
                .try_into()
                .map_err(|e: toml::de::Error| ScenarioError::Parse(e.to_string()))?,
        };
        s.resolve_config(device_given)?;
        s.desugar();
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
            "hv.apic_timer_virt",
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
        if given.contains(&"hv.apic_timer_virt")
            && scheme == "kvm-2026"
            && self.hv.apic_timer_virt == Some(true)
            && self.guest.lapic_timer != LapicTimer::TscDeadline
        {
            w.push("hv.apic_timer_virt has no effect with guest.lapic_timer = \"oneshot\" (the hardware virtualizes only TSC-deadline mode; KVM keeps its software timer)".into());
        }
        if given.contains(&"nic.itr_interval_us") && self.nic.itr != ItrMode::Fixed {
            w.push(format!(
                "nic.itr_interval_us has no effect with nic.itr = {} (only with `fixed`)",
                self.nic.itr.name()
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
        // A halting guest under a scheme whose KVM has no halt polling
        // (Linux 4.0's halt_poll_ns came after these designs): every idle
        // period is a HLT exit, a sleep of the vCPU thread and a wake-up,
        // which a reader sees as HLT exits in the hundreds of thousands per
        // second and a timer latency above kvm-2026's (which polls first).
        if self.guest.idle == crate::guest::IdleMode::Halt
            && self.arch != ArchSpec::Arm64
            && matches!(scheme, "kvm" | "apicv" | "eli" | "elvis" | "did" | "naive")
        {
            w.push(format!(
                "guest.idle = \"halt\" under `{scheme}`: each idle period is a HLT exit and a wake-up of the sleeping vCPU thread; this scheme's KVM has no halt polling (halt_poll_ns came in Linux 4.0; DID's testbed ran 3.6), so HLT exits follow every idle period and a wake-up's latency adds to the guest's (kvm-2026 polls before it sleeps: hv.halt_poll)"
            ));
        }
        // The DID authors' public code pins one vCPU per dedicated core
        // (did-implementation.md): its pass-through of the physical LAPIC
        // timer and x2APIC ID assumes the vCPU never moves or shares.
        if scheme == "directvisor" {
            let views = self.vm_views();
            let mut cores: Vec<usize> = views.iter().flat_map(|v| v.cores.clone()).collect();
            let floating = self.vms.iter().any(|v| v.allowed_cores.is_some());
            cores.sort_unstable();
            let shared = cores.windows(2).any(|p| p[0] == p[1]);
            let burner = self
                .host
                .burners
                .iter()
                .any(|b| b.cores.iter().any(|c| cores.binary_search(c).is_ok()));
            for (cond, what) in [
                (shared, "vCPUs share a core"),
                (floating, "vCPUs float (allowed_cores)"),
                (burner, "a host burner shares a vCPU's core"),
            ] {
                if cond {
                    w.push(format!(
                        "scheme `directvisor` with {what}: its public code assumes each vCPU pinned alone on a dedicated core (the physical LAPIC timer and x2APIC ID are passed through); the model runs it, but the code was never meant for it"
                    ));
                }
            }
        }
        // Consolidation with polling guests: a vCPU in `idle=poll` never
        // gives its core away, so a VM sharing the core waits for the host
        // scheduler's slice (8 memcached VMs on 4 cores: p99 10.5 ms with
        // poll, 0.05 ms with halt).
        if scheme != "bare-metal" && self.guest.idle == crate::guest::IdleMode::Poll {
            let views = self.vm_views();
            let vcpus: usize = views.iter().map(|v| v.allowed.len()).sum();
            let cores = views
                .iter()
                .flat_map(|v| v.allowed.iter())
                .fold(crate::engine::CpuMask::EMPTY, |m, &a| m.union(a))
                .count();
            // Guests with burners on every vCPU never idle: nothing polls.
            let some_idle = views.iter().any(|v| !v.burn);
            if vcpus > cores && some_idle {
                w.push(format!(
                    "guest.idle = \"poll\" with {vcpus} vCPUs on {cores} cores: a polling vCPU never gives its core away, so the VMs sharing a core wait for the host scheduler's slices; set guest.idle = \"halt\" (docs/multiplexing.md)"
                ));
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
            return Err(ScenarioError::Invalid {
                key: "config".into(),
                problem: format!(
                    "`{c}` uses net.device = `{}` but the scenario also says net.device = `{}`; give one",
                    device.name(),
                    self.net.device.name()
                ),
            });
        }
        self.scheme = scheme.into();
        self.net.device = device;
        Ok(())
    }

    /// The single-VM form (a top-level `workload`, no `[[vm]]`) is sugar
    /// for one `[[vm]]` ([`VmSpec::top_level`]): after this every
    /// scenario lists its VMs in `vms`, and one set of checks serves
    /// both forms.
    fn desugar(&mut self) {
        if self.vms.is_empty() {
            let workload = std::mem::take(&mut self.workload);
            self.vms.push(VmSpec::top_level(workload));
        }
    }

    /// Checks every key's range and the combinations, section by section.
    fn validate(&self) -> Result<(), ScenarioError> {
        let arm_scheme = crate::hv::arm::ARM_SCHEMES.contains(&self.scheme.as_str());
        let riscv_scheme = crate::hv::riscv::RISCV_SCHEMES.contains(&self.scheme.as_str());
        if self.workload.vmexit.is_some() || self.vms.iter().any(|v| v.workload.vmexit.is_some()) {
            if self.guest.tick != crate::guest::TickMode::Off {
                return bad(
                    "guest",
                    "tick",
                    "the vmexit tests own the LAPIC timer (kvm-unit-tests has no tick): set guest.tick = \"off\"",
                );
            }
            if self.arch != ArchSpec::X86_64 {
                return bad(
                    "workload",
                    "vmexit",
                    "kvm-unit-tests' vmexit tests are x86's",
                );
            }
        }
        match self.arch {
            ArchSpec::Arm64 if !crate::hv::arm::runs_on_arm(&self.scheme) => {
                return bad(
                    "",
                    "arch",
                    format!(
                        "`arm64` runs the ARM schemes ({}) and bare-metal; scheme `{}` is not one",
                        crate::hv::arm::ARM_SCHEMES.join(", "),
                        self.scheme
                    ),
                );
            }
            ArchSpec::Arm64 => self.arm.validate()?,
            ArchSpec::Riscv64 if !riscv_scheme => {
                return bad(
                    "",
                    "arch",
                    format!(
                        "`riscv64` runs the RISC-V schemes ({}); scheme `{}` is not one",
                        crate::hv::riscv::RISCV_SCHEMES.join(", "),
                        self.scheme
                    ),
                );
            }
            ArchSpec::Riscv64 => {}
            ArchSpec::X86_64 if riscv_scheme => {
                return bad(
                    "",
                    "arch",
                    format!(
                        "scheme `{}` runs on RISC-V: it needs arch = \"riscv64\"",
                        self.scheme
                    ),
                );
            }
            ArchSpec::X86_64 if arm_scheme => {
                return bad(
                    "",
                    "arch",
                    format!(
                        "scheme `{}` runs on ARM: it needs arch = \"arm64\"",
                        self.scheme
                    ),
                );
            }
            ArchSpec::X86_64 if self.net.device == NetDevice::SpiNic => {
                return bad(
                    "net",
                    "device",
                    "`spi-nic` is a NIC wired to a GIC SPI: it needs arch = \"arm64\" (x86 has the VF and virtio)",
                );
            }
            ArchSpec::X86_64 if self.arm.nic_spi_affinity.is_some() => {
                return bad(
                    "arm",
                    "nic_spi_affinity",
                    "routes the SPI of an ARM NIC: it needs arch = \"arm64\"",
                );
            }
            ArchSpec::X86_64 => {}
        }
        if !arm_scheme && !riscv_scheme && crate::hv::scheme::by_name(&self.scheme).is_none() {
            return bad(
                "",
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
        let d = self.duration_s;
        require(
            (1e-6..=3600.0).contains(&d),
            "",
            "duration_s",
            d,
            "in [1e-6, 3600]",
        )?;
        let w = self.warmup_s;
        require((0.0..=60.0).contains(&w), "", "warmup_s", w, "in [0, 60]")?;
        self.machine.validate()?;
        if let Some(b) = self.machine.board {
            b.validate(self)?;
        }
        self.guest.validate()?;
        self.nic.validate()?;
        let peers = self.vms.iter().any(|v| v.workload.peers());
        self.net.validate(&self.scheme, peers)?;
        self.validate_vsock()?;
        self.host.validate(self.machine.cores)?;
        self.validate_vms()?;
        let smp = self.vms.iter().any(|v| v.vcpus > 1);
        self.guest.validate_apic(&self.scheme, smp)?;
        self.hv.validate()?;
        if !self.host.burners.is_empty() && !self.preemptions.is_empty() {
            return bad(
                "",
                "preemptions",
                "scripted preemptions and [[host.burners]] (the host scheduler) cannot be combined",
            );
        }
        for (i, p) in self.preemptions.iter().enumerate() {
            p.validate(&format!("preemptions[{i}]"))?;
        }
        self.check.validate()
    }
}

// The derive (`remote = "Self"`) makes `Scenario::serialize` and
// `Scenario::deserialize` plain functions; these impls wrap them so that
// serializing writes the single-VM form back as the user wrote it (a
// top-level `workload`, no `[[vm]]`): what `resolve` hands out reads as
// before and parses back to the same scenario.
impl Serialize for Scenario {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.vms.as_slice() {
            [v] if v.top_level => {
                let mut written = self.clone();
                written.workload = v.workload.clone();
                written.vms.clear();
                Scenario::serialize(&written, s)
            }
            _ => Scenario::serialize(self, s),
        }
    }
}

impl<'de> Deserialize<'de> for Scenario {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Scenario::deserialize(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A single-VM scenario.
    pub(super) const BASE: &str = r#"
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
        assert_eq!(s.vms[0].workload.udp.clone().unwrap().rate_pps, 250000.0);
        assert_eq!(s.scheme, "kvm");
        assert_eq!(s.guest.hz, 250);
        assert_eq!(s.machine.cores, 2);
    }

    /// The error `text` with `sets` gives, as shown.
    pub(super) fn err(text: &str, sets: &[&str]) -> String {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Scenario::parse(text, &sets).unwrap_err().to_string()
    }

    /// `text` with `sets`, parsed.
    pub(super) fn ok(text: &str, sets: &[&str]) -> Scenario {
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
    fn polling_guests_that_share_cores_are_warned_about() {
        let t = |idle: &str, copies: u32, burn: bool| {
            let text = format!(
                "name = \"c\"\nscheme = \"kvm\"\nduration_s = 0.01\nseed = 1\n[guest]\nidle = \"{idle}\"\n[machine]\ncores = 5\n\
                 [[vm]]\ncore = 1\ncopies = {copies}\ncopies_cores = [1, 2, 3, 4]\nburn = {burn}\n\
                 [vm.workload.udp]\nrate_pps = 1000\n"
            );
            Scenario::parse(&text, &[]).unwrap().warnings
        };
        let shared = t("poll", 8, false);
        assert!(
            shared.iter().any(|w| w.contains("8 vCPUs on 4 cores")),
            "{shared:?}"
        );
        // One VM per core, halting guests, or guests that never idle: no
        // warning.
        for w in [t("poll", 4, false), t("halt", 8, false), t("poll", 8, true)] {
            assert!(
                w.iter().all(|w| !w.contains("guest.idle = \"poll\"")),
                "{w:?}"
            );
        }
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
        assert_eq!(s.vms[0].workload.sip.clone().unwrap().calls, 5);
    }

    /// Serializing writes the single-VM form back as written (a
    /// top-level `workload`, no `vm`: what Python's `resolve` shows), and
    /// either form parses back to the same VMs.
    #[test]
    fn serialized_scenarios_keep_their_form_and_parse_back() {
        let s = ok(BASE, &[]);
        let j = serde_json::to_value(&s).unwrap();
        assert_eq!(j["workload"]["udp"]["rate_pps"], 100000.0);
        assert!(j.get("vm").is_none(), "{j}");
        let vms = "scheme = \"kvm\"\nduration_s = 0.1\n[machine]\ncores = 3\n[[vm]]\ncore = 2\n\
                   [vm.workload.cyclictest]\n";
        for s in [s, ok(vms, &[])] {
            let again = ok(&toml::to_string(&s).unwrap(), &[]);
            assert_eq!(
                format!("{:?}", again.vm_views()),
                format!("{:?}", s.vm_views())
            );
        }
        assert!(serde_json::to_value(ok(vms, &[])).unwrap()["vm"].is_array());
        assert_eq!(crate::keys::schema()["title"], "Scenario");
    }

    /// `--set vm.0.copies=4` needs `[[vm]]` tables: a single-VM scenario
    /// has none, and says so.
    #[test]
    fn indexing_vm_tables_a_scenario_lacks_is_a_clear_error() {
        let e = err(BASE, &["vm.0.copies=4"]);
        assert!(e.contains("no `[[vm]]` tables"), "{e}");
        let e = err(BASE, &["preemptions.0.at_ms=4"]);
        assert!(e.contains("no `[[preemptions]]` tables"), "{e}");
    }
}
