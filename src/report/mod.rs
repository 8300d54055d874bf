//! Run reports: a `perf kvm stat report`-style table per VM, workload
//! metrics, invariant results; the same as JSON (stable field names).

use crate::check::{Checker, Violation, ViolationKind};
use crate::engine::{as_s, as_us, Summary, Time};
use crate::guest::app::Metrics;
use crate::hv::exits::ExitReason;
use crate::hv::exits::ExitStats;
use crate::hv::VmState;
use crate::scenario::{Assumption, Scenario};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;

pub mod aggregate;
pub mod diff;
pub mod output;
pub mod trace;

pub use output::{refuse_overwriting_input, remove_temporaries, write_file_atomically};

/// The version of the JSON outputs' schema (`run --json`, `reproduce
/// --json`): raised when a field is renamed, removed or changes meaning, so
/// a script can refuse an output it was not written for. Version 1: the
/// first versioned form (a `reproduce` output is an object holding `rows`).
pub const SCHEMA_VERSION: u32 = 1;

/// `reproduce --json`: its rows with the schema version and what made them.
#[derive(Clone, Debug, Serialize)]
pub struct ReproduceOutput<'a, R: Serialize> {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The tool and its version (`exitless 0.1.0`).
    pub tool: String,
    /// The paper reproduced.
    pub paper: &'a str,
    /// The paper's headline claims as effects, model against paper.
    pub headlines: &'a [crate::validation::headline::HeadlineRow],
    /// One row per (experiment, config, parameter, metric).
    pub rows: &'a [R],
}

/// VM `vm`'s prefix for its metric names: VM 0's metrics keep their plain
/// names, VM *i*'s are `vm<i>.<name>`.
pub fn vm_prefix(vm: usize) -> String {
    if vm == 0 {
        String::new()
    } else {
        format!("vm{vm}.")
    }
}

/// What the world hands to the report.
pub struct Snapshot<'a> {
    /// The scenario run.
    pub scenario: &'a Scenario,
    /// Calibration entries changed from the shipped file.
    pub calibration_changes: &'a BTreeMap<String, crate::calibration::Entry>,
    /// Scheme name.
    pub scheme: &'static str,
    /// Measured interval.
    pub duration: Time,
    /// VMs with exit statistics.
    pub vms: &'a [VmState],
    /// Workload and device metrics.
    pub metrics: Metrics,
    /// Invariant checker.
    pub checker: &'a Checker,
    /// Exits guest timer expiries landed in.
    pub timer_exits: &'a [Summary; crate::hv::exits::ExitReason::COUNT],
    /// Each VM's exits by its architecture's own reasons: what the exit
    /// tables are built from.
    pub exits: ExitTables,
    /// MSIs the IOMMU blocked.
    pub msi_faults: u64,
}

/// Exits by an architecture's own reason set, for the exit tables: the
/// reason names (x86's VT-x basic exit reasons as `perf kvm stat` names
/// them, or arm64's exception classes) and, per VM and per vCPU, a
/// service-time summary for each. The platform fills it; the report only
/// reads names and summaries, so a new architecture brings its reasons
/// without a branch here.
#[derive(Clone, Debug, Default)]
pub struct ExitTables {
    /// The reason names, in the architecture's order.
    pub names: Vec<&'static str>,
    /// Per VM: one summary per reason, indexed as `names`.
    pub vms: Vec<Vec<Summary>>,
    /// Per VM, per vCPU (its index in the VM): the same.
    pub vcpus: Vec<Vec<Vec<Summary>>>,
}

impl ExitTables {
    /// x86's tables: each VM's [`ExitStats`] by [`ExitReason`].
    pub fn vmx(vms: &[VmState]) -> Self {
        let of = |st: &ExitStats| st.by_reason.to_vec();
        ExitTables {
            names: ExitReason::ALL.iter().map(|r| r.name()).collect(),
            vms: vms.iter().map(|vm| of(&vm.stats)).collect(),
            vcpus: vms
                .iter()
                .map(|vm| vm.vcpu_stats.iter().map(of).collect())
                .collect(),
        }
    }
}

/// The summary of every reason together.
fn total_of(by_reason: &[Summary]) -> Summary {
    let mut s = Summary::default();
    for r in by_reason {
        s.merge(r);
    }
    s
}

/// One row of the exit table.
#[derive(Clone, Debug, Serialize)]
pub struct ExitRow {
    /// The architecture's reason name (KVM's for x86, the exception
    /// class for arm64).
    pub reason: &'static str,
    /// Count.
    pub samples: u64,
    /// Share of all exits, %.
    pub samples_pct: f64,
    /// Share of all exit-handling time, %.
    pub time_pct: f64,
    /// Minimum service time, µs.
    pub min_us: f64,
    /// Maximum, µs.
    pub max_us: f64,
    /// Mean, µs.
    pub avg_us: f64,
    /// Standard deviation as % of the mean.
    pub stddev_pct: f64,
    /// Exits per second.
    pub per_s: f64,
}

/// Per-VM results.
#[derive(Clone, Debug, Serialize)]
pub struct VmReport {
    /// VM index.
    pub vm: usize,
    /// All exits per second.
    pub exits_per_s: f64,
    /// Per-reason exits per second (non-zero reasons).
    pub exits_per_s_by_reason: BTreeMap<&'static str, f64>,
    /// Its vCPUs.
    pub vcpus: usize,
    /// Time in guest, % of the measured interval × its vCPUs.
    pub tig_pct: f64,
    /// Exit-handling time, % of the measured interval × its vCPUs (ES2's
    /// EHT denominator).
    pub eht_pct: f64,
    /// Exits per second by the causes ES2 counts (interrupt_delivery,
    /// eoi_write, io_instruction; docs/papers.md ES2).
    pub exits_per_s_by_cause: BTreeMap<&'static str, f64>,
    /// ES2's EHT: the time handling those exits, % of the measured
    /// interval × its vCPUs.
    pub eht_counted_pct: f64,
    /// The table rows, most frequent first.
    pub exits: Vec<ExitRow>,
    /// Total exits.
    pub total_samples: u64,
    /// Total handling time, µs.
    pub total_time_us: f64,
    /// The exit table of each vCPU of an SMP guest (`perf kvm stat
    /// --vcpu`); empty for a single-vCPU VM, whose table is the VM's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub per_vcpu: Vec<VcpuExits>,
}

/// One vCPU's exits (`perf kvm stat report --vcpu N`).
#[derive(Clone, Debug, Serialize)]
pub struct VcpuExits {
    /// Its index in the VM.
    pub vcpu: usize,
    /// All its exits per second.
    pub exits_per_s: f64,
    /// Its time in guest mode, % of the measured interval.
    pub tig_pct: f64,
    /// Its exit-handling time, % of the measured interval.
    pub eht_pct: f64,
    /// Its table rows, most frequent first.
    pub exits: Vec<ExitRow>,
    /// Its total exits.
    pub total_samples: u64,
    /// Its total handling time, µs.
    pub total_time_us: f64,
}

/// Invariant results.
#[derive(Clone, Debug, Serialize)]
pub struct Invariants {
    /// The first violations (empty when none).
    pub violations: Vec<Violation>,
    /// Count per kind.
    pub counts: BTreeMap<ViolationKind, u64>,
    /// Interrupts delivered to their owner.
    pub delivered: u64,
    /// Raises merged into one already pending (edge semantics).
    pub merged: u64,
}

/// A whole run.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// [`SCHEMA_VERSION`] of this output.
    pub schema_version: u32,
    /// Scenario name.
    pub scenario: String,
    /// Scheme.
    pub scheme: String,
    /// Seed.
    pub seed: u64,
    /// Measured seconds.
    pub duration_s: f64,
    /// Per VM.
    pub vms: Vec<VmReport>,
    /// Workload metrics.
    pub metrics: BTreeMap<String, f64>,
    /// Invariants.
    pub invariants: Invariants,
    /// Assumptions the scenario makes.
    pub assumptions: Vec<Assumption>,
    /// Options the scenario gives that have no effect (validation's
    /// warnings), and metrics without a value (null: a latency over no
    /// samples, a loop that did not finish); absent when there are none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// What produced this report, enough to run it again.
    pub provenance: Provenance,
}

/// Most metric names one "no value" warning lists.
const MAX_NAMED: usize = 8;

/// The scenario's warnings, then one for each kind of metric the run could
/// not compute (NaN, null in JSON): a latency or mean over no samples, an
/// elapsed time of a loop that did not end within `duration_s`.
fn with_result_warnings(scenario: &[String], metrics: &BTreeMap<String, f64>) -> Vec<String> {
    let mut w = scenario.to_vec();
    let (unfinished, empty): (Vec<&String>, Vec<&String>) = metrics
        .iter()
        .filter(|(_, v)| v.is_nan())
        .map(|(k, _)| k)
        .partition(|k| k.ends_with("elapsed_s"));
    let list = |names: &[&String]| {
        let mut l = names
            .iter()
            .take(MAX_NAMED)
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        if names.len() > MAX_NAMED {
            l += &format!(" and {} more", names.len() - MAX_NAMED);
        }
        l
    };
    if !unfinished.is_empty() {
        w.push(format!(
            "{}: null, the loop did not finish within duration_s (raise duration_s or lower iterations)",
            list(&unfinished)
        ));
    }
    if !empty.is_empty() {
        w.push(format!(
            "{}: null, no samples in the measured interval (a longer duration_s or a higher rate gives some)",
            list(&empty)
        ));
    }
    w
}

/// What produced a run report: the tool, the scenario as resolved (every
/// default filled in, overrides applied) and the calibration entries that
/// differ from the shipped file the tool version names.
#[derive(Clone, Debug, Serialize)]
pub struct Provenance {
    /// `exitless <version>`.
    pub tool: String,
    /// The resolved scenario (`exitless.resolve` gives the same).
    pub scenario: serde_json::Value,
    /// Calibration entries changed from the shipped file, by dotted key.
    pub calibration_changes: BTreeMap<String, crate::calibration::Entry>,
}

/// `exitless <version>`, as every JSON output names the tool.
pub fn tool_version() -> String {
    format!("exitless {}", env!("CARGO_PKG_VERSION"))
}

/// The `perf kvm stat report` rows of `by_reason` (named by `names`) over
/// `duration`, most frequent first.
fn exit_rows(names: &[&'static str], by_reason: &[Summary], duration: Time) -> Vec<ExitRow> {
    let total = total_of(by_reason);
    let secs = as_s(duration).max(1e-12);
    let mut rows: Vec<ExitRow> = names
        .iter()
        .zip(by_reason)
        .filter(|(_, s)| s.count > 0)
        .map(|(&name, s)| ExitRow {
            reason: name,
            samples: s.count,
            samples_pct: 100.0 * s.count as f64 / total.count as f64,
            time_pct: 100.0 * s.total as f64 / total.total.max(1) as f64,
            min_us: as_us(s.min),
            max_us: as_us(s.max),
            avg_us: as_us(s.mean()),
            stddev_pct: if s.mean() > 0 {
                100.0 * s.stddev_ns() / (s.mean() as f64 / 1000.0)
            } else {
                0.0
            },
            per_s: s.count as f64 / secs,
        })
        .collect();
    rows.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.reason.cmp(b.reason)));
    rows
}

fn vm_report(i: usize, vm: &VmState, tables: &ExitTables, duration: Time) -> VmReport {
    let none: &[Summary] = &[];
    let mine = tables.vms.get(i).map_or(none, |v| v.as_slice());
    let total = total_of(mine);
    let secs = as_s(duration).max(1e-12);
    let cpu_time = duration.saturating_mul(vm.vcpus.len().max(1) as Time);
    let rows = exit_rows(&tables.names, mine, duration);
    // One vCPU's table is the VM's: listed only for SMP guests.
    let per_vcpu = if vm.vcpu_stats.len() > 1 {
        vm.vcpu_stats
            .iter()
            .enumerate()
            .map(|(v, st)| {
                let by_reason = tables
                    .vcpus
                    .get(i)
                    .and_then(|c| c.get(v))
                    .map_or(none, |c| c.as_slice());
                let t = total_of(by_reason);
                VcpuExits {
                    vcpu: v,
                    exits_per_s: t.count as f64 / secs,
                    tig_pct: 100.0 * st.guest_time as f64 / duration.max(1) as f64,
                    eht_pct: 100.0 * t.total as f64 / duration.max(1) as f64,
                    exits: exit_rows(&tables.names, by_reason, duration),
                    total_samples: t.count,
                    total_time_us: as_us(t.total),
                }
            })
            .collect()
    } else {
        Vec::new()
    };
    VmReport {
        vm: i,
        exits_per_s: total.count as f64 / secs,
        exits_per_s_by_reason: rows.iter().map(|r| (r.reason, r.per_s)).collect(),
        vcpus: vm.vcpus.len(),
        tig_pct: 100.0 * vm.stats.guest_time as f64 / cpu_time.max(1) as f64,
        eht_pct: 100.0 * total.total as f64 / cpu_time.max(1) as f64,
        exits_per_s_by_cause: crate::hv::es2::Cause::ALL
            .iter()
            .map(|&c| (c.name(), vm.stats.by_cause[c as usize].count as f64 / secs))
            .collect(),
        eht_counted_pct: 100.0 * vm.stats.by_cause.iter().map(|s| s.total).sum::<Time>() as f64
            / cpu_time.max(1) as f64,
        exits: rows,
        total_samples: total.count,
        total_time_us: as_us(total.total),
        per_vcpu,
    }
}

/// One `perf kvm stat report` table: header, rows, totals.
fn write_exit_table(
    o: &mut String,
    title: &str,
    rows: &[ExitRow],
    (samples, time_us): (u64, f64),
    (exits_per_s, tig, eht): (f64, f64, f64),
) {
    let _ = writeln!(o, "\nAnalyze events for {title}:\n");
    let _ = writeln!(
        o,
        "{:>20} {:>10} {:>9} {:>8} {:>10} {:>10} {:>16}",
        "VM-EXIT", "Samples", "Samples%", "Time%", "Min Time", "Max Time", "Avg time"
    );
    let _ = writeln!(o);
    for r in rows {
        let _ = writeln!(
            o,
            "{:>20} {:>10} {:>8.2}% {:>7.2}% {:>8.2}us {:>8.2}us {:>8.2}us ( +- {:>6.2}% )",
            r.reason,
            r.samples,
            r.samples_pct,
            r.time_pct,
            r.min_us,
            r.max_us,
            r.avg_us,
            r.stddev_pct
        );
    }
    let _ = writeln!(
        o,
        "\nTotal Samples:{samples}, Total events handled time:{time_us:.2}us."
    );
    let _ = writeln!(
        o,
        "exits/s {exits_per_s:.1} | time in guest {tig:.2}% | exit handling {eht:.2}%"
    );
}

impl RunReport {
    /// Builds the report.
    pub fn from_world(s: Snapshot) -> Self {
        let mut metrics: BTreeMap<String, f64> = s.metrics.into_iter().collect();
        for r in ExitReason::ALL {
            let t = &s.timer_exits[r.index()];
            if t.count > 0 {
                metrics.insert(format!("timer_exits.{}", r.name()), t.count as f64);
                metrics.insert(format!("timer_exit_us.{}", r.name()), as_us(t.mean()));
            }
        }
        metrics.insert("iommu.msi_faults".into(), s.msi_faults as f64);
        let counts = [
            ViolationKind::Lost,
            ViolationKind::Misdelivered,
            ViolationKind::PriorityInversion,
            ViolationKind::IsrInconsistent,
            ViolationKind::EoiWithoutInService,
            ViolationKind::GicState,
        ]
        .into_iter()
        // The GIC rules only where they apply (an ARM run that broke one):
        // an x86 report keeps its keys.
        .filter(|&k| k != ViolationKind::GicState || s.checker.count(k) > 0)
        .map(|k| (k, s.checker.count(k)))
        .collect();
        let vms: Vec<VmReport> = s
            .vms
            .iter()
            .enumerate()
            .map(|(i, vm)| vm_report(i, vm, &s.exits, s.duration))
            .collect();
        aggregate::add_aggregates(&mut metrics, &vms);
        let warnings = with_result_warnings(&s.scenario.warnings, &metrics);
        RunReport {
            schema_version: SCHEMA_VERSION,
            scenario: s.scenario.name.clone(),
            scheme: s.scheme.to_string(),
            seed: s.scenario.seed,
            duration_s: as_s(s.duration),
            vms,
            metrics,
            invariants: Invariants {
                violations: s.checker.violations().to_vec(),
                counts,
                delivered: s.checker.delivered,
                merged: s.checker.merged,
            },
            assumptions: s.scenario.assumptions.clone(),
            warnings,
            provenance: Provenance {
                tool: tool_version(),
                scenario: serde_json::to_value(s.scenario).unwrap_or_default(),
                calibration_changes: s.calibration_changes.clone(),
            },
        }
    }

    /// Total violations.
    pub fn violations(&self) -> u64 {
        self.invariants.counts.values().sum()
    }

    /// The text report: `perf kvm stat report` layout per VM, then metrics.
    pub fn to_text(&self) -> String {
        self.to_text_for(None)
    }

    /// The text report with each VM's table for its vCPU `vcpu` (index in
    /// the VM) when given, as `perf kvm stat report --vcpu` shows.
    pub fn to_text_for(&self, vcpu: Option<usize>) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "scenario {} | scheme {} | seed {} | measured {:.3} s",
            if self.scenario.is_empty() {
                "-"
            } else {
                &self.scenario
            },
            self.scheme,
            self.seed,
            self.duration_s
        );
        for vm in &self.vms {
            match vcpu {
                None => write_exit_table(
                    &mut o,
                    &format!("VM {}", vm.vm),
                    &vm.exits,
                    (vm.total_samples, vm.total_time_us),
                    (vm.exits_per_s, vm.tig_pct, vm.eht_pct),
                ),
                Some(n) => match vm.per_vcpu.get(n) {
                    Some(v) => write_exit_table(
                        &mut o,
                        &format!("VM {} vCPU {n}", vm.vm),
                        &v.exits,
                        (v.total_samples, v.total_time_us),
                        (v.exits_per_s, v.tig_pct, v.eht_pct),
                    ),
                    // A single-vCPU VM's table is its vCPU 0's.
                    None if n == 0 && vm.vcpus == 1 => write_exit_table(
                        &mut o,
                        &format!("VM {} vCPU 0", vm.vm),
                        &vm.exits,
                        (vm.total_samples, vm.total_time_us),
                        (vm.exits_per_s, vm.tig_pct, vm.eht_pct),
                    ),
                    None => {
                        let _ = writeln!(o, "\nVM {} has {} vCPU(s): no vCPU {n}", vm.vm, vm.vcpus);
                    }
                },
            }
        }
        let _ = writeln!(o, "\nmetrics:");
        for (k, v) in &self.metrics {
            let _ = writeln!(o, "  {k:<34} {v:.4}");
        }
        let _ = writeln!(
            o,
            "\ninvariants: {} violations ({} interrupts delivered, {} merged)",
            self.violations(),
            self.invariants.delivered,
            self.invariants.merged
        );
        for (k, c) in &self.invariants.counts {
            if *c > 0 {
                let _ = writeln!(o, "  {k:?}: {c}");
            }
        }
        for v in self.invariants.violations.iter().take(10) {
            let _ = writeln!(
                o,
                "  t={:.3}us vm{} {:?}: {}",
                v.time_us, v.vm, v.kind, v.detail
            );
        }
        for a in &self.assumptions {
            let _ = writeln!(o, "\nassumption {} = {}: {}", a.key, a.value, a.reason);
        }
        o
    }
}
