//! `exitless reproduce <paper>`: runs the experiments described under
//! `validation/<paper>/experiments.toml` and sets the model's numbers beside
//! the published ones. Published values are only ever compared against.

pub mod headline;

use crate::calibration::Calibration;
use crate::report::RunReport;
use crate::scenario::Scenario;
use crate::world::World;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

mod papers;
pub use papers::{known_paper, paper, paper_names, Paper, PAPERS};

/// The experiment file of one paper.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentFile {
    /// A calibration overlay for the paper's testbed (relative to the
    /// experiment file), layered over the calibration in use: the
    /// primitives the paper states about its hardware (e.g. ES2's 40 GbE
    /// link).
    #[serde(default)]
    pub calibration: Option<String>,
    /// Experiments.
    pub experiment: Vec<Experiment>,
    /// The claims of the paper's abstract and conclusion, as effects
    /// ([`headline`]).
    #[serde(default)]
    pub headline: Vec<headline::Headline>,
}

/// One experiment: a scenario run under each config and each parameter
/// value, reporting some metrics.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    /// Id, e.g. `did.fig4`.
    pub id: String,
    /// Scenario file, relative to the experiment file (unless
    /// `workloads` gives one per workload).
    #[serde(default)]
    pub scenario: String,
    /// Config name → `--set` overrides.
    pub configs: BTreeMap<String, Vec<String>>,
    /// Order of configs in the report.
    pub config_order: Vec<String>,
    /// Parameter (a `--set` key) → values swept. At most one parameter.
    #[serde(default)]
    pub params: BTreeMap<String, Vec<toml::Value>>,
    /// Instead of `params`: the experiment's `workload` parameter, each
    /// value its own scenario file and overrides (DID §5.9 runs the same
    /// configs on cyclictest, iperf-PV and iperf-SRIOV).
    #[serde(default)]
    pub workloads: Vec<WorkloadVariant>,
    /// Metrics reported: name → unit.
    pub metrics: Vec<MetricSpec>,
    /// Published values.
    #[serde(default)]
    pub expected: Vec<Expected>,
    /// Published differences between two configs.
    #[serde(default)]
    pub differences: Vec<Difference>,
    /// Instead of one run per config: search for the highest value of a
    /// parameter at which a metric still meets its bound. The peak is
    /// reported as metric `search.peak` (or the search's `name`); the other
    /// metrics come from the
    /// run at the peak.
    #[serde(default)]
    pub search: Option<Search>,
    /// Also print the experiment as a table in the text report: one row per
    /// metric, one column per config (did-arm.md §3's exits per event).
    #[serde(default)]
    pub table: bool,
    /// Run every job under this many seeds (from each scenario's own) and
    /// report each row's mean with its spread, unless `reproduce --seeds`
    /// says otherwise: for experiments whose outcome has regimes that the
    /// seed picks (several VMs' vCPU threads in a CFS rotation whose phase
    /// the start skew sets), where one seed is a sample, not a result.
    #[serde(default)]
    pub seeds: Option<u64>,
}

/// One value of an experiment's `workload` parameter.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadVariant {
    /// The parameter's value, e.g. `iperf-pv`.
    pub name: String,
    /// Scenario file, relative to the experiment file.
    pub scenario: String,
    /// `--set` overrides applied before the config's.
    #[serde(default)]
    pub set: Vec<String>,
}

/// A bisection over one `--set` parameter (DID §5.7's "peak request rate
/// at which 95% of requests finish within 10 ms").
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Search {
    /// The `--set` key searched.
    pub param: String,
    /// A value expected to meet the bound.
    pub lo: f64,
    /// A value expected to miss it.
    pub hi: f64,
    /// The metric judged.
    pub metric: String,
    /// It must be at most this...
    #[serde(default)]
    pub max: Option<f64>,
    /// ...or at least this.
    #[serde(default)]
    pub min: Option<f64>,
    /// Bisection steps (the answer is within (hi − lo) / 2^steps).
    pub steps: u32,
    /// The metric name the peak is reported as.
    #[serde(default = "search_peak")]
    pub name: String,
}

fn search_peak() -> String {
    "search.peak".into()
}

impl Search {
    fn ok(&self, v: f64) -> bool {
        self.max.is_none_or(|m| v <= m) && self.min.is_none_or(|m| v >= m)
    }
}

/// A published comparison of two configs on one metric, for every
/// parameter value unless `params` narrows it: a difference (`minus`:
/// "SRIOV is 2.44 µs above SRIOV-BM") or a percentage (`percent_of`: "97%
/// of bare metal"). Exactly one of the two is given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Difference {
    /// The config whose value comes first.
    pub config: String,
    /// The config subtracted.
    #[serde(default)]
    pub minus: Option<String>,
    /// The config `config` is a percentage of.
    #[serde(default)]
    pub percent_of: Option<String>,
    /// Parameter values this applies to (empty = every value).
    #[serde(default)]
    pub params: BTreeMap<String, toml::Value>,
    /// Metric.
    pub metric: String,
    /// The row's metric name; with it the row keeps `config` as its
    /// config (`pct_of_bare_metal` for config `eli`). Without it the row is
    /// config `<config>-minus-<other>` / `<config>-pct-of-<other>` with
    /// metric `metric`.
    #[serde(default)]
    pub name: Option<String>,
    /// The paper's value of the difference.
    pub paper: f64,
    /// Tolerance.
    pub tolerance: Tolerance,
    /// Where in the paper.
    pub source: String,
    /// Why the model cannot match this value, when the cause is known (a
    /// mechanism or the paper's own arithmetic); shown beside the row.
    #[serde(default)]
    pub note: Option<String>,
    /// What the row is ([`RowKind`]).
    pub kind: RowKind,
    /// For a `bound`: the configuration (same experiment, parameters and
    /// metric) that a scheme doing nothing would look like; the report
    /// says whether the bound rejects it.
    #[serde(default)]
    pub against: Option<String>,
    /// The paper's reference measurement this row's value was used to set
    /// a testbed parameter from (what, the value, and why): the row is
    /// listed and never counted as reproduced (issue 34 item 4).
    #[serde(default)]
    pub calibrated_to: Option<String>,
}

/// A metric and its unit.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricSpec {
    /// Name (see [`metric_value`]).
    pub name: String,
    /// Unit.
    pub unit: String,
    /// Only for these configs (all when empty).
    #[serde(default)]
    pub configs: Vec<String>,
    /// Only for these values of the `workload` parameter (all when empty).
    #[serde(default)]
    pub workloads: Vec<String>,
}

/// How close the model must be.
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Tolerance {
    /// |model − paper| ≤ rel × paper.
    Rel(f64),
    /// |model − paper| ≤ abs.
    Abs(f64),
    /// model ≤ paper (the paper gives an upper bound).
    Max,
    /// model ≥ paper (the paper gives a lower bound: "more than 40K").
    Min,
}

/// What a compared row is, and so how it counts (issue 34): only `value`
/// and `effect` rows are counted as "within tolerance"; bounds and
/// structural rows are reported beside them as "holds".
#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RowKind {
    /// A published number the model's value is compared with.
    Value,
    /// A published difference or ratio between two configurations.
    Effect,
    /// A one-sided limit ("under 1K exits/s"). It must name the
    /// configuration (`against`) whose value it would reject, so that a
    /// scheme that did nothing is seen to fail it.
    Bound,
    /// A count the mechanism fixes (0 exits per EOI): it restates the
    /// design rather than measuring it.
    Structural,
}

impl RowKind {
    /// Counted as "within tolerance" (value, effect) or as "holds".
    pub fn counted(self) -> bool {
        matches!(self, RowKind::Value | RowKind::Effect)
    }

    fn name(self) -> &'static str {
        match self {
            RowKind::Value => "value",
            RowKind::Effect => "effect",
            RowKind::Bound => "bound",
            RowKind::Structural => "structural",
        }
    }
}

/// A published value.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expected {
    /// Config.
    pub config: String,
    /// Parameter values this applies to (empty = the experiment has none).
    #[serde(default)]
    pub params: BTreeMap<String, toml::Value>,
    /// Metric.
    pub metric: String,
    /// The paper's value.
    pub paper: f64,
    /// Tolerance.
    pub tolerance: Tolerance,
    /// Where in the paper.
    pub source: String,
    /// Why the model cannot match this value, when the cause is known (a
    /// mechanism or the paper's own arithmetic); shown beside the row.
    #[serde(default)]
    pub note: Option<String>,
    /// What the row is ([`RowKind`]).
    pub kind: RowKind,
    /// For a `bound`: the configuration (same experiment, parameters and
    /// metric) that a scheme doing nothing would look like; the report
    /// says whether the bound rejects it.
    #[serde(default)]
    pub against: Option<String>,
    /// The paper's reference measurement this row's value was used to set
    /// a testbed parameter from (what, the value, and why): the row is
    /// listed and never counted as reproduced (issue 34 item 4).
    #[serde(default)]
    pub calibrated_to: Option<String>,
}

/// One output row.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Experiment id.
    pub experiment: String,
    /// Config.
    pub config: String,
    /// Parameters.
    pub params: BTreeMap<String, serde_json::Value>,
    /// Metric.
    pub metric: String,
    /// Unit.
    pub unit: String,
    /// Model value.
    pub model: f64,
    /// Paper value, if published.
    pub paper: Option<f64>,
    /// Tolerance, if a paper value exists.
    pub tolerance: Option<Tolerance>,
    /// Whether the model is within tolerance (for a multi-seed row: the
    /// mean is, and so is at least half of the seeds' own values).
    pub within: Option<bool>,
    /// What a compared row is (absent without a published value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<RowKind>,
    /// For a bound: the configuration it is paired with and whether the
    /// bound rejects that configuration's value (if not, a scheme that did
    /// nothing would pass it too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub against: Option<Against>,
    /// The testbed parameter this row's published value set (the row is
    /// not counted as reproduced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibrated_to: Option<String>,
    /// Invariant violations in the run that produced the value.
    pub violations: u64,
    /// The known cause of a gap to the paper (`note` of the published
    /// value), absent when none is stated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Shown again in the experiment's table (text report only).
    #[serde(skip)]
    pub table: bool,
    /// With `--seeds N` (N ≥ 2): `model` is the mean over the seeds and
    /// this is its spread. Absent for one seed, so a one-seed output is
    /// what it always was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spread: Option<Spread>,
}

/// A bound's pairing: the configuration a scheme doing nothing would look
/// like, its value, and whether the bound rejects it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Against {
    /// The configuration.
    pub config: String,
    /// Its value of the row's metric (or difference), when it ran.
    pub model: Option<f64>,
    /// The bound fails for it: the bound can tell the scheme from no
    /// scheme.
    pub rejects: bool,
}

/// A row's value over several seeds: a row whose value sits near a
/// threshold (a queue that overflows or not, a bimodal latency) can cross
/// its tolerance with the draws alone, and only several seeds say so.
/// A difference row's model is taken between the two configurations'
/// means; its spread is that of the seeds' own differences.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Spread {
    /// Seeds run.
    pub seeds: usize,
    /// Sample standard deviation.
    pub std: f64,
    /// Half-width of the mean's 95% Student-t interval.
    pub ci_half: f64,
    /// Smallest value of one seed.
    pub min: f64,
    /// Largest value of one seed.
    pub max: f64,
    /// Seeds whose own value is within tolerance (absent without a
    /// published value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub within_seeds: Option<usize>,
    /// Each seed's own value, in seed order (the headline table judges
    /// each seed's effect).
    #[serde(skip)]
    pub values: Vec<f64>,
}

/// Which seeds `reproduce` runs each job with: `n` seeds from `base`, or
/// from each scenario's own seed when `base` is `None` (so one seed
/// without a base is the scenarios as written). `n` = `None`: each
/// experiment's own `seeds` (1 when it has none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seeds {
    /// Seeds per job, at least 1, for every experiment.
    pub n: Option<u64>,
    /// The first seed, for every job.
    pub base: Option<u64>,
}

/// Errors of `reproduce`.
#[derive(Debug, thiserror::Error)]
pub enum ReproduceError {
    /// No such paper directory.
    #[error("no experiments for `{0}` ({1})")]
    UnknownPaper(String, String),
    /// Unreadable or malformed experiment file.
    #[error("{0}")]
    Bad(String),
}

/// Reads a metric from a run report: `exits_per_s`, `exits_per_s.<REASON>`,
/// `exits_per_s.<cause>` (ES2's lower-case causes), `tig_pct`, `eht_pct`,
/// `eht_counted_pct`, or any workload metric by name, full
/// (`sip.call_rate`) or bare (`call_rate`) when exactly one workload
/// metric has that last component (0 when the run produced none of it,
/// e.g. a reason with no exits).
pub fn metric_value(r: &RunReport, name: &str) -> f64 {
    let vm = &r.vms[0];
    match name {
        "exits_per_s" => vm.exits_per_s,
        "tig_pct" => vm.tig_pct,
        "eht_pct" => vm.eht_pct,
        "eht_counted_pct" => vm.eht_counted_pct,
        n => {
            if let Some(reason) = n.strip_prefix("exits_per_s.") {
                if let Some(v) = vm.exits_per_s_by_cause.get(reason) {
                    return *v;
                }
                return vm.exits_per_s_by_reason.get(reason).copied().unwrap_or(0.0);
            }
            workload_metric(&r.metrics, n).unwrap_or(0.0)
        }
    }
}

/// A workload metric by full name, or by bare last component when exactly
/// one metric ends with it.
fn workload_metric(metrics: &std::collections::BTreeMap<String, f64>, name: &str) -> Option<f64> {
    if let Some(v) = metrics.get(name) {
        return Some(*v);
    }
    let mut suffixed = metrics
        .iter()
        .filter(|(k, _)| k.rsplit_once('.').is_some_and(|(_, last)| last == name));
    match (suffixed.next(), suffixed.next()) {
        (Some((_, v)), None) => Some(*v),
        _ => None,
    }
}

fn within(model: f64, paper: f64, t: Tolerance) -> bool {
    match t {
        Tolerance::Rel(x) => (model - paper).abs() <= x * paper.abs(),
        Tolerance::Abs(x) => (model - paper).abs() <= x,
        Tolerance::Max => model <= paper,
        Tolerance::Min => model >= paper,
    }
}

fn to_json(v: &toml::Value) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

fn set_value(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// Where `validation/` is: `$EXITLESS_VALIDATION`, else next to the
/// current directory or the executable's workspace.
pub fn validation_root() -> PathBuf {
    if let Ok(p) = std::env::var("EXITLESS_VALIDATION") {
        return PathBuf::from(p);
    }
    let cwd = PathBuf::from("validation");
    if cwd.is_dir() {
        return cwd;
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("validation")
}

/// Bisection for `se`: returns the report at the highest passing value and
/// that value (0 with the report at `lo` if even `lo` fails).
fn search(
    se: &Search,
    path: &Path,
    sets: &[String],
    run: &dyn Fn(&Scenario) -> Option<RunReport>,
) -> Option<Outcome> {
    let probe = |v: f64| -> Option<RunReport> {
        let mut s = sets.to_vec();
        s.push(format!("{}={v}", se.param));
        let sc = Scenario::load(path, &s).ok()?;
        run(&sc)
    };
    let first = probe(se.lo)?;
    if !se.ok(metric_value(&first, &se.metric)) {
        return Some((first, Some(0.0)));
    }
    let (mut lo, mut hi, mut best) = (se.lo, se.hi, first);
    for _ in 0..se.steps {
        let mid = ((lo + hi) / 2.0).round();
        let r = probe(mid)?;
        if se.ok(metric_value(&r, &se.metric)) {
            lo = mid;
            best = r;
        } else {
            hi = mid;
        }
    }
    Some((best, Some(lo)))
}

/// Parameters and their values at one point of an experiment.
type ParamPoint = Vec<(String, toml::Value)>;

/// One point of an experiment's parameters: (each parameter and its value,
/// scenario file, overrides before the config's, overrides after them).
type Variant = (ParamPoint, PathBuf, Vec<String>, Vec<String>);

/// A job's report, and the peak a search found.
type Outcome = (RunReport, Option<f64>);

#[derive(Clone)]
struct Job {
    exp: usize,
    /// The seed set on the run (`--seeds`/`--seed`); `None`: the
    /// scenario's own.
    seed: Option<u64>,
    config: String,
    param: ParamPoint,
    scenario: PathBuf,
    sets: Vec<String>,
    /// The calibration of this job when a config or parameter sets
    /// calibration entries (`calibration.<section>.<name>=VALUE`, as
    /// `--calibration-set`), layered over the experiment file's.
    cal: Option<Calibration>,
}

/// Splits a job's overrides into scenario sets and calibration entries
/// (`calibration.guest.cost_cv=0.2`), and layers the entries over `cal`.
fn split_calibration_sets(
    sets: Vec<String>,
    cal: &Calibration,
) -> Result<(Vec<String>, Option<Calibration>), ReproduceError> {
    let (c, sets): (Vec<String>, Vec<String>) = sets
        .into_iter()
        .partition(|s| s.starts_with("calibration."));
    if c.is_empty() {
        return Ok((sets, None));
    }
    let entries = c
        .iter()
        .map(|kv| crate::calibration_overlay::parse_set(&kv["calibration.".len()..]))
        .collect::<Result<Vec<_>, _>>()
        .map_err(ReproduceError::Bad)?;
    let cal = crate::calibration_overlay::apply_to(cal, &entries).map_err(ReproduceError::Bad)?;
    Ok((sets, Some(cal)))
}

/// The jobs' indices, the costliest first by [`cost_estimate`] (ties keep
/// the jobs' order).
fn longest_first(
    jobs: &[Job],
    scenarios: &[Scenario],
    exps: &[&Experiment],
    cal: &Calibration,
) -> Vec<usize> {
    let cost: Vec<f64> = jobs
        .iter()
        .zip(scenarios)
        .map(|(j, s)| cost_estimate(s, exps[j.exp].search.as_ref(), cal))
        .collect();
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by(|&a, &b| cost[b].total_cmp(&cost[a]));
    order
}

/// A job's cost before running it, in events (roughly): simulated seconds
/// times the events a second its VMs' timers and workloads make, times the
/// runs a search makes. Only the ranking matters. A WhileLoop run ends when
/// its loop does, at about its iterations at one a cycle.
fn cost_estimate(s: &Scenario, search: Option<&Search>, cal: &Calibration) -> f64 {
    // A workload without a rate (a stream, a ping-pong): ~1e5 events/s.
    const STREAM: f64 = 1e5;
    let hz = cal.cpu.ghz.value * 1e9;
    let mut sim_s = s.duration_s;
    let mut per_s = 0.0;
    for vm in &s.vms {
        let w = &vm.workload;
        if let Some(l) = &w.whileloop {
            sim_s = sim_s.min(l.iterations / hz);
        }
        let mut load = f64::from(vm.vcpus) * f64::from(s.guest.hz);
        load += w.udp.as_ref().map_or(0.0, |u| u.rate_pps);
        load += w
            .memcached
            .as_ref()
            .map_or(0.0, |m| m.rate_rps.unwrap_or(STREAM));
        let streams = [
            w.netpipe.is_some(),
            w.iperf.is_some(),
            w.fio.is_some(),
            w.netperf.is_some(),
            w.nginx.is_some(),
            w.apache.is_some(),
        ];
        // A call is a dozen messages, each a few events on either side.
        load += w.sip.as_ref().map_or(0.0, |c| c.rate_cps * 100.0);
        load += STREAM * streams.iter().filter(|&&b| b).count() as f64;
        per_s += f64::from(vm.copies.max(1)) * load;
    }
    let runs = search.map_or(1.0, |se| 1.0 + f64::from(se.steps));
    (s.warmup_s + sim_s) * per_s * runs
}

/// Reads and checks `validation/<paper>/experiments.toml`.
fn load(paper: &str) -> Result<(PathBuf, ExperimentFile), ReproduceError> {
    // Only a registered name: a path (`../../etc`) is never a paper.
    if !known_paper(paper) {
        return Err(ReproduceError::UnknownPaper(
            crate::scenario::overrides::shown(paper).into_owned(),
            format!("known: {}", paper_names().collect::<Vec<_>>().join(", ")),
        ));
    }
    let dir = validation_root().join(paper);
    let file = dir.join("experiments.toml");
    let text = crate::scenario::read_input(&file).map_err(|_| {
        ReproduceError::UnknownPaper(paper.into(), format!("looked for {}", file.display()))
    })?;
    let ef: ExperimentFile = toml::from_str(&text)
        .map_err(|e| ReproduceError::Bad(format!("{}: {e}", file.display())))?;
    check_declarations(&ef).map_err(|e| ReproduceError::Bad(format!("{}: {e}", file.display())))?;
    Ok((dir, ef))
}

/// Every compared row's kind agrees with its tolerance, and every bound
/// names the configuration it is paired with (issue 34 item 2); every
/// headline names an experiment of the file and gives the paper's effect
/// or says why not.
fn check_declarations(ef: &ExperimentFile) -> Result<(), String> {
    let rows = ef.experiment.iter().flat_map(|e| {
        let exp = e
            .expected
            .iter()
            .map(move |x| (e, &x.config, &x.metric, x.tolerance, x.kind, &x.against));
        let diff = e
            .differences
            .iter()
            .map(move |d| (e, &d.config, &d.metric, d.tolerance, d.kind, &d.against));
        exp.chain(diff)
    });
    for (e, config, metric, tol, kind, against) in rows {
        let one_sided = matches!(tol, Tolerance::Max | Tolerance::Min);
        let what = format!("{} {config} {metric}", e.id);
        match kind {
            RowKind::Bound if !one_sided => {
                return Err(format!("{what}: a `bound` needs tolerance \"max\" or \"min\""))
            }
            RowKind::Bound => match against {
                None => {
                    return Err(format!(
                        "{what}: a `bound` must name the configuration it is paired with \
                         (`against`), so that it can fail; a count the mechanism fixes is `structural`"
                    ))
                }
                Some(a) if !e.configs.contains_key(a) => {
                    return Err(format!("{what}: `against = \"{a}\"` is not a config of {}", e.id))
                }
                Some(_) => {}
            },
            RowKind::Value | RowKind::Effect if one_sided => {
                return Err(format!(
                    "{what}: a one-sided tolerance is a `bound` (or `structural`), not a `{}`",
                    kind.name()
                ))
            }
            _ if against.is_some() => {
                return Err(format!("{what}: only a `bound` is paired (`against`)"))
            }
            _ => {}
        }
    }
    for h in &ef.headline {
        let Some(e) = ef.experiment.iter().find(|e| e.id == h.experiment) else {
            if h.not_run.is_some() {
                continue;
            }
            return Err(format!("headline {}: no experiment {}", h.id, h.experiment));
        };
        for c in [&h.system, &h.baseline] {
            if !e.configs.contains_key(c) && h.not_run.is_none() {
                return Err(format!(
                    "headline {}: {c} is not a config of {}",
                    h.id, e.id
                ));
            }
        }
        let numbers =
            h.paper_effect.is_some() || (h.paper_system.is_some() && h.paper_baseline.is_some());
        if numbers == h.withheld.is_some() {
            return Err(format!(
                "headline {}: give the paper's effect (`paper_effect`, or `paper_baseline` and \
                 `paper_system`) or say why it has none (`withheld`), not both",
                h.id
            ));
        }
    }
    Ok(())
}

/// The headline table of `paper` from the rows of its `reproduce`.
pub fn headlines(paper: &str, rows: &[Row]) -> Result<Vec<headline::HeadlineRow>, ReproduceError> {
    let (_, ef) = load(paper)?;
    headline::table(&ef.headline, rows)
}

/// Runs every experiment of `paper` (optionally only those whose id
/// contains `filter`) with `threads` simulations in parallel, plus extra
/// `--set` overrides on every run (e.g. a shorter duration).
pub fn reproduce(
    paper: &str,
    filter: Option<&str>,
    extra_sets: &[String],
    seeds: Seeds,
    cal: &Calibration,
    threads: usize,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Vec<Row>, ReproduceError> {
    reproduce_adjusted(
        paper, filter, extra_sets, seeds, cal, threads, progress, None,
    )
}

/// A change made to every job's calibration after all of its layers (the
/// testbed overlay, a config's `calibration.` entries): what
/// `exitless sensitivity` varies. It is given the calibration before any
/// change, so it never applies twice.
pub type Adjust<'a> = dyn Fn(&Calibration) -> Result<Calibration, String> + Sync + 'a;

/// The calibration `paper`'s experiments run on: `cal` with the paper's
/// testbed overlay (its experiment file's `calibration`), if any.
pub fn paper_calibration(paper: &str, cal: &Calibration) -> Result<Calibration, ReproduceError> {
    let (dir, ef) = load(paper)?;
    testbed_calibration(&dir, &ef, cal)
}

fn testbed_calibration(
    dir: &Path,
    ef: &ExperimentFile,
    cal: &Calibration,
) -> Result<Calibration, ReproduceError> {
    match &ef.calibration {
        None => Ok(cal.clone()),
        Some(name) => {
            let p = dir.join(name);
            let text = crate::scenario::read_input(&p)
                .map_err(|e| ReproduceError::Bad(format!("{}: {e}", p.display())))?;
            let origin = p.display().to_string();
            let entries = crate::calibration_overlay::parse_overlay(&text, &origin)
                .map_err(|e| ReproduceError::Bad(format!("{origin}: {e}")))?;
            crate::calibration_overlay::apply_to(cal, &entries)
                .map_err(|e| ReproduceError::Bad(format!("{origin}: {e}")))
        }
    }
}

/// [`reproduce`], with `adjust` applied to every job's calibration last.
#[allow(clippy::too_many_arguments)]
pub fn reproduce_adjusted(
    paper: &str,
    filter: Option<&str>,
    extra_sets: &[String],
    seeds: Seeds,
    cal: &Calibration,
    threads: usize,
    progress: &(dyn Fn(&str) + Sync),
    adjust: Option<&Adjust<'_>>,
) -> Result<Vec<Row>, ReproduceError> {
    let (dir, ef) = load(paper)?;
    let testbed = match &ef.calibration {
        None => None,
        Some(_) => Some(testbed_calibration(&dir, &ef, cal)?),
    };
    let unadjusted = testbed.as_ref().unwrap_or(cal);
    let adjusted = match adjust {
        None => None,
        Some(f) => Some(f(unadjusted).map_err(ReproduceError::Bad)?),
    };
    let cal = adjusted.as_ref().unwrap_or(unadjusted);
    let exps: Vec<&Experiment> = ef
        .experiment
        .iter()
        .filter(|e| filter.is_none_or(|f| e.id.contains(f)))
        .collect();
    if let (Some(f), true) = (filter, exps.is_empty()) {
        // An empty table would read as "nothing to compare", not a typo.
        let ids: Vec<&str> = ef.experiment.iter().map(|e| e.id.as_str()).collect();
        return Err(ReproduceError::Bad(format!(
            "--only `{}` matches no experiment of `{paper}` (ids: {})",
            crate::scenario::overrides::shown(f),
            ids.join(", ")
        )));
    }
    let mut jobs = Vec::new();
    for (ei, e) in exps.iter().enumerate() {
        // The experiment's variants, each with its scenario and the
        // overrides that go before and after the config's: its workloads
        // (or its one scenario), each under every value of its parameter.
        let bases: Vec<(ParamPoint, PathBuf, Vec<String>)> = if e.workloads.is_empty() {
            if e.scenario.is_empty() {
                return Err(ReproduceError::Bad(format!(
                    "{}: needs a `scenario` (or `workloads`)",
                    e.id
                )));
            }
            vec![(vec![], dir.join(&e.scenario), vec![])]
        } else {
            if e.search.is_some() {
                return Err(ReproduceError::Bad(format!(
                    "{}: `workloads` cannot be combined with `search`",
                    e.id
                )));
            }
            e.workloads
                .iter()
                .map(|w| {
                    let param = ("workload".to_string(), toml::Value::String(w.name.clone()));
                    (vec![param], dir.join(&w.scenario), w.set.clone())
                })
                .collect()
        };
        if e.params.len() > 1 {
            return Err(ReproduceError::Bad(format!(
                "{}: at most one parameter in `params`",
                e.id
            )));
        }
        let mut variants: Vec<Variant> = Vec::new();
        for (p, scenario, before) in bases {
            match e.params.iter().next() {
                None => variants.push((p, scenario, before, vec![])),
                Some((k, vals)) => {
                    for v in vals {
                        let mut p = p.clone();
                        p.push((k.clone(), v.clone()));
                        let set = format!("{k}={}", set_value(v));
                        variants.push((p, scenario.clone(), before.clone(), vec![set]));
                    }
                }
            }
        }
        for c in &e.config_order {
            let Some(base) = e.configs.get(c) else {
                return Err(ReproduceError::Bad(format!(
                    "{}: config `{c}` has no overrides",
                    e.id
                )));
            };
            for (param, scenario, before, after) in &variants {
                let sets = [before, base, after, extra_sets].concat();
                let (sets, job_cal) = split_calibration_sets(sets, unadjusted)?;
                let job_cal = match (job_cal, adjust) {
                    (Some(c), Some(f)) => Some(f(&c).map_err(ReproduceError::Bad)?),
                    (c, _) => c,
                };
                jobs.push(Job {
                    exp: ei,
                    seed: None,
                    config: c.clone(),
                    param: param.clone(),
                    scenario: scenario.clone(),
                    sets,
                    cal: job_cal,
                });
            }
        }
    }
    // Seeds per experiment: `--seeds`, else the experiment's own.
    let mut n_seeds: Vec<u64> = Vec::new();
    for e in &exps {
        let n = seeds.n.or(e.seeds).unwrap_or(1);
        if n == 0 {
            return Err(ReproduceError::Bad(match seeds.n {
                Some(_) => "--seeds must be at least 1".into(),
                None => format!("{}: `seeds` must be at least 1", e.id),
            }));
        }
        n_seeds.push(n);
    }
    // Parse all scenarios up front so a bad file fails before any run.
    let mut warned = std::collections::BTreeSet::new();
    let mut firsts: Vec<Scenario> = Vec::new();
    for j in &jobs {
        let s =
            Scenario::load(&j.scenario, &j.sets).map_err(|e| ReproduceError::Bad(e.to_string()))?;
        for w in &s.warnings {
            if warned.insert(w.clone()) {
                progress(&format!("warning: {}: {w}", j.scenario.display()));
            }
        }
        firsts.push(s);
    }
    // Each job once per seed of its experiment; `run_of[j][k]` is job `j`
    // under its `k`-th seed.
    let mut runs: Vec<Job> = Vec::new();
    let mut scenarios: Vec<Scenario> = Vec::new();
    let mut run_of: Vec<Vec<usize>> = Vec::new();
    for (j, first) in jobs.iter().zip(&firsts) {
        let mut of_job = Vec::new();
        for k in 0..n_seeds[j.exp] {
            let mut run = j.clone();
            if k == 0 && seeds.base.is_none() {
                scenarios.push(first.clone());
            } else {
                let seed = seeds
                    .base
                    .unwrap_or(first.seed)
                    .checked_add(k)
                    .ok_or_else(|| {
                        ReproduceError::Bad("--seed + --seeds overflows a u64".into())
                    })?;
                run.sets.push(format!("seed={seed}"));
                run.seed = Some(seed);
                scenarios.push(
                    Scenario::load(&run.scenario, &run.sets)
                        .map_err(|e| ReproduceError::Bad(e.to_string()))?,
                );
            }
            of_job.push(runs.len());
            runs.push(run);
        }
        run_of.push(of_job);
    }
    let results: Vec<Mutex<Option<Outcome>>> = runs.iter().map(|_| Mutex::new(None)).collect();
    // Longest first, so the last job to finish is a short one instead of a
    // WhileLoop run started when the others are done. Rows keep the jobs'
    // order: only the order the threads take them in changes.
    let order = longest_first(&runs, &scenarios, &exps, cal);
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        // No more threads than jobs, however many were asked for.
        for _ in 0..threads.clamp(1, runs.len().max(1)) {
            sc.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::SeqCst);
                let Some(&i) = order.get(k) else {
                    break;
                };
                let cal = runs[i].cal.as_ref().unwrap_or(cal);
                let run = |s: &Scenario| match World::build(s, cal) {
                    Ok(mut w) => {
                        w.run(|_| {});
                        Some(w.report())
                    }
                    Err(_) => None,
                };
                let rep = match &exps[runs[i].exp].search {
                    None => run(&scenarios[i]).map(|r| (r, None)),
                    Some(se) => search(se, &runs[i].scenario, &runs[i].sets, &run),
                };
                if let Ok(mut slot) = results[i].lock() {
                    *slot = rep;
                }
                let d = done.fetch_add(1, Ordering::SeqCst) + 1;
                let j = &runs[i];
                progress(&format!(
                    "[{d}/{}] {} {} {}{}",
                    runs.len(),
                    exps[j.exp].id,
                    j.config,
                    j.param
                        .iter()
                        .map(|(k, v)| format!("{k}={}", set_value(v)))
                        .collect::<Vec<_>>()
                        .join(" "),
                    j.seed.map(|s| format!(" seed={s}")).unwrap_or_default()
                ));
            });
        }
    });
    let mut outcomes: Vec<Option<Outcome>> = results
        .into_iter()
        .map(|m| m.into_inner().ok().flatten())
        .collect();
    // Per experiment (its jobs are contiguous), the rows of each seed, then
    // the seeds' rows as one; every metric row first, then every
    // difference, in the experiments' order.
    let (mut all_metric_rows, mut difference_rows) = (Vec::new(), Vec::new());
    let mut start = 0;
    while start < jobs.len() {
        let ei = jobs[start].exp;
        let end = start + jobs[start..].iter().take_while(|j| j.exp == ei).count();
        let own = &exps[ei..=ei];
        let mut m = Vec::new();
        for k in 0..n_seeds[ei] as usize {
            let o: Vec<Option<Outcome>> = (start..end)
                .map(|j| outcomes[run_of[j][k]].take())
                .collect();
            m.push(metric_rows(&exps, &jobs[start..end], &o)?);
        }
        // A difference of means is the mean of the differences, but a
        // percentage of means is not the mean of the percentages (one
        // seed whose denominator collapses would dominate it): the
        // differences are taken between the means, and carry the spread
        // of the seeds' own differences.
        let mut seed_diffs = Vec::new();
        if m.len() > 1 {
            for rows in &mut m {
                let n = rows.len();
                add_differences(own, rows)?;
                seed_diffs.push(rows.split_off(n));
            }
        }
        let mut means = combine_seeds(m);
        let n = means.len();
        add_differences(own, &mut means)?;
        let mut diffs = means.split_off(n);
        for (x, s) in diffs.iter_mut().zip(combine_seeds(seed_diffs)) {
            if let (Some(w), Some(sp)) = (x.within, &s.spread) {
                x.within = Some(w && sp.within_seeds.is_none_or(|k| 2 * k >= sp.seeds));
            }
            x.spread = s.spread;
            x.violations = s.violations;
        }
        pair_bounds(own, &mut means);
        all_metric_rows.extend(means);
        difference_rows.extend(diffs);
        start = end;
    }
    all_metric_rows.extend(difference_rows);
    Ok(all_metric_rows)
}

/// The rows of one seed's runs of some experiments' jobs (`outcomes[j]`
/// is job `j`'s): each metric of each run.
fn metric_rows(
    exps: &[&Experiment],
    jobs: &[Job],
    outcomes: &[Option<Outcome>],
) -> Result<Vec<Row>, ReproduceError> {
    let mut rows = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        let e = exps[j.exp];
        let Some((rep, peak)) = &outcomes[i] else {
            return Err(ReproduceError::Bad(format!(
                "{} {}: run failed to build",
                e.id, j.config
            )));
        };
        let params: BTreeMap<String, serde_json::Value> = j
            .param
            .iter()
            .map(|(k, v)| (k.clone(), to_json(v)))
            .collect();
        for m in &e.metrics {
            if !m.configs.is_empty() && !m.configs.contains(&j.config) {
                continue;
            }
            let workload = j
                .param
                .iter()
                .find(|(k, _)| k == "workload" && !e.workloads.is_empty())
                .and_then(|(_, v)| v.as_str());
            if !m.workloads.is_empty()
                && workload.is_none_or(|w| !m.workloads.iter().any(|x| x == w))
            {
                continue;
            }
            let search_name = e.search.as_ref().map(|s| s.name.as_str());
            let model = match peak {
                Some(p) if search_name == Some(m.name.as_str()) => *p,
                _ => metric_value(rep, &m.name),
            };
            let exp = e.expected.iter().find(|x| {
                x.config == j.config
                    && x.metric == m.name
                    && x.params
                        .iter()
                        .all(|(k, v)| j.param.iter().any(|(pk, pv)| pk == k && pv == v))
            });
            rows.push(Row {
                experiment: e.id.clone(),
                config: j.config.clone(),
                params: params.clone(),
                metric: m.name.clone(),
                unit: m.unit.clone(),
                model,
                paper: exp.map(|x| x.paper),
                tolerance: exp.map(|x| x.tolerance),
                within: exp.map(|x| within(model, x.paper, x.tolerance)),
                kind: exp.map(|x| x.kind),
                against: None,
                calibrated_to: exp.and_then(|x| x.calibrated_to.clone()),
                violations: rep.violations(),
                note: exp.and_then(|x| x.note.clone()),
                table: e.table,
                spread: None,
            });
        }
    }
    Ok(rows)
}

/// Resolves each published bound's `against`: the paired configuration's
/// value of the same metric at the same parameters, and whether the bound
/// rejects it.
fn pair_bounds(exps: &[&Experiment], rows: &mut [Row]) {
    for e in exps {
        for x in e.expected.iter().filter(|x| x.kind == RowKind::Bound) {
            let Some(other) = &x.against else { continue };
            let theirs: Vec<(BTreeMap<String, serde_json::Value>, f64)> = rows
                .iter()
                .filter(|r| r.experiment == e.id && &r.config == other && r.metric == x.metric)
                .map(|r| (r.params.clone(), r.model))
                .collect();
            for r in rows.iter_mut().filter(|r| {
                r.experiment == e.id
                    && r.config == x.config
                    && r.metric == x.metric
                    && x.params
                        .iter()
                        .all(|(k, v)| r.params.get(k) == Some(&to_json(v)))
            }) {
                let model = theirs.iter().find(|(p, _)| *p == r.params).map(|(_, v)| *v);
                r.against = Some(Against {
                    config: other.clone(),
                    model,
                    rejects: model.is_some_and(|v| !within(v, x.paper, x.tolerance)),
                });
            }
        }
    }
}

/// Appends to `rows` the published differences between configs that
/// their metric rows allow (a percentage is of the two rows' values, so
/// of their means when the rows are means).
fn add_differences(exps: &[&Experiment], rows: &mut Vec<Row>) -> Result<(), ReproduceError> {
    for e in exps {
        for d in &e.differences {
            let (other, percent) = match (&d.minus, &d.percent_of) {
                (Some(m), None) => (m, false),
                (None, Some(p)) => (p, true),
                _ => {
                    return Err(ReproduceError::Bad(format!(
                        "{}: a difference needs exactly one of `minus` and `percent_of`",
                        e.id
                    )))
                }
            };
            let mut extra = Vec::new();
            for a in rows.iter().filter(|r| {
                r.experiment == e.id
                    && r.config == d.config
                    && r.metric == d.metric
                    && d.params
                        .iter()
                        .all(|(k, v)| r.params.get(k) == Some(&to_json(v)))
            }) {
                let Some(b) = rows.iter().find(|r| {
                    r.experiment == e.id
                        && &r.config == other
                        && r.metric == d.metric
                        && r.params == a.params
                }) else {
                    continue;
                };
                let model = compare(a.model, b.model, percent);
                let (config, unit) = if percent {
                    (format!("{}-pct-of-{other}", d.config), "%".to_string())
                } else {
                    (format!("{}-minus-{other}", d.config), a.unit.clone())
                };
                let (config, metric) = match &d.name {
                    Some(n) => (d.config.clone(), n.clone()),
                    None => (config, d.metric.clone()),
                };
                // A bound's pairing: the same comparison with `against`
                // in place of `config`.
                let against = d
                    .against
                    .as_ref()
                    .filter(|_| d.kind == RowKind::Bound)
                    .map(|c| {
                        let v = rows
                            .iter()
                            .find(|r| {
                                r.experiment == e.id
                                    && &r.config == c
                                    && r.metric == d.metric
                                    && r.params == a.params
                            })
                            .map(|x| compare(x.model, b.model, percent));
                        Against {
                            config: c.clone(),
                            model: v,
                            rejects: v.is_some_and(|v| !within(v, d.paper, d.tolerance)),
                        }
                    });
                extra.push(Row {
                    experiment: e.id.clone(),
                    config,
                    params: a.params.clone(),
                    metric,
                    unit,
                    model,
                    paper: Some(d.paper),
                    tolerance: Some(d.tolerance),
                    within: Some(within(model, d.paper, d.tolerance)),
                    kind: Some(d.kind),
                    against,
                    calibrated_to: d.calibrated_to.clone(),
                    violations: a.violations.max(b.violations),
                    note: d.note.clone(),
                    table: false,
                    spread: None,
                });
            }
            rows.extend(extra);
        }
    }
    Ok(())
}

/// `a` as a percentage of `b` (0 when `b` is 0), or `a − b`.
fn compare(a: f64, b: f64, percent: bool) -> f64 {
    match (percent, b != 0.0) {
        (true, true) => 100.0 * a / b,
        (true, false) => 0.0,
        (false, _) => a - b,
    }
}

/// One seed's rows as they are, or several seeds' rows (the same rows in
/// the same order) as one: the mean as `model`, judged against the
/// tolerance, with its spread.
fn combine_seeds(mut per_seed: Vec<Vec<Row>>) -> Vec<Row> {
    if per_seed.len() < 2 {
        return per_seed.pop().unwrap_or_default();
    }
    let mut rows = per_seed[0].clone();
    for (i, r) in rows.iter_mut().enumerate() {
        let xs: Vec<f64> = per_seed.iter().map(|rs| rs[i].model).collect();
        let (n, mean, std, half) = crate::sweep::student_t(&xs, 0.95);
        r.model = mean.unwrap_or(r.model);
        r.violations = per_seed
            .iter()
            .map(|rs| rs[i].violations)
            .max()
            .unwrap_or(0);
        let within_seeds = r
            .paper
            .zip(r.tolerance)
            .map(|(p, t)| xs.iter().filter(|&&x| within(x, p, t)).count());
        if let (Some(p), Some(t), Some(k)) = (r.paper, r.tolerance, within_seeds) {
            // Spread decides (issue 34 item 3): the mean within and at
            // least half of the seeds, so a mean that lands inside a wide
            // interval by averaging seeds that mostly miss is not within.
            r.within = Some(within(r.model, p, t) && 2 * k >= n);
        }
        r.spread = Some(Spread {
            seeds: n,
            std: std.unwrap_or(0.0),
            ci_half: half.unwrap_or(0.0),
            min: xs.iter().copied().fold(f64::INFINITY, f64::min),
            max: xs.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            within_seeds,
            values: xs,
        });
    }
    rows
}

/// A row's parameters as `key=value` joined by `sep` (strings unquoted).
pub(crate) fn params_text(r: &Row, sep: &str) -> String {
    let params: Vec<String> = r
        .params
        .iter()
        .map(|(k, v)| match v.as_str() {
            Some(s) => format!("{k}={s}"),
            None => format!("{k}={v}"),
        })
        .collect();
    params.join(sep)
}

/// A tolerance as the tables print it; `paper` names the bound of the
/// one-sided ones.
fn tolerance_text(t: Option<Tolerance>, paper: &str) -> String {
    match t {
        Some(Tolerance::Rel(x)) => format!("±{:.0}%", x * 100.0),
        Some(Tolerance::Abs(x)) => format!("±{x}"),
        Some(Tolerance::Max) => format!("≤{paper}"),
        Some(Tolerance::Min) => format!("≥{paper}"),
        None => String::new(),
    }
}

/// The 1-based number of `note` in `notes` (each distinct note once, in
/// order of first use), adding it if new.
fn note_number<'a>(notes: &mut Vec<&'a str>, note: Option<&'a str>) -> Option<usize> {
    let n = note?;
    let i = match notes.iter().position(|x| *x == n) {
        Some(i) => i,
        None => {
            notes.push(n);
            notes.len() - 1
        }
    };
    Some(i + 1)
}

/// How the compared rows of some experiment(s) stand: value and effect
/// rows within tolerance (testbed-calibrated ones apart), bounds and
/// structural rows that hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Score {
    /// Value and effect rows, not calibrated.
    pub counted: usize,
    /// Of those, within tolerance.
    pub within: usize,
    /// Rows whose published value set a testbed parameter.
    pub calibrated: usize,
    /// Bounds.
    pub bounds: usize,
    /// Bounds that hold.
    pub bounds_hold: usize,
    /// Bounds that hold and reject the configuration they are paired with.
    pub bounds_discriminate: usize,
    /// Structural rows.
    pub structural: usize,
    /// Structural rows that hold.
    pub structural_hold: usize,
}

impl Score {
    /// The score of `rows` (those with a published value).
    pub fn of<'a>(rows: impl IntoIterator<Item = &'a Row>) -> Score {
        let mut s = Score::default();
        for r in rows {
            let (Some(kind), Some(w)) = (r.kind, r.within) else {
                continue;
            };
            match kind {
                _ if r.calibrated_to.is_some() => s.calibrated += 1,
                RowKind::Value | RowKind::Effect => {
                    s.counted += 1;
                    s.within += usize::from(w);
                }
                RowKind::Bound => {
                    s.bounds += 1;
                    s.bounds_hold += usize::from(w);
                    s.bounds_discriminate +=
                        usize::from(w && r.against.as_ref().is_some_and(|a| a.rejects));
                }
                RowKind::Structural => {
                    s.structural += 1;
                    s.structural_hold += usize::from(w);
                }
            }
        }
        s
    }

    /// One line: "12 of 30 values and effects within tolerance; bounds:
    /// 4 of 4 hold (3 reject the configuration they pair with); ...".
    pub fn line(&self) -> String {
        if self.counted + self.calibrated + self.bounds + self.structural == 0 {
            return "no published values to compare: every row is the model alone".into();
        }
        let mut o = format!(
            "{} of {} values and effects within tolerance",
            self.within, self.counted
        );
        if self.calibrated > 0 {
            o += &format!(
                " ({} more set the testbed from the paper's reference measurement, not counted)",
                self.calibrated
            );
        }
        if self.bounds > 0 {
            o += &format!(
                "; bounds: {} of {} hold, {} of them reject the configuration they pair with",
                self.bounds_hold, self.bounds, self.bounds_discriminate
            );
        }
        if self.structural > 0 {
            o += &format!(
                "; structural: {} of {} hold",
                self.structural_hold, self.structural
            );
        }
        o
    }
}

/// The verdict cell of a compared row.
fn within_text(r: &Row) -> String {
    let base = match (r.within, r.kind) {
        (None, _) => return String::new(),
        (Some(_), _) if r.calibrated_to.is_some() => "calibrated".to_string(),
        (Some(true), Some(RowKind::Bound | RowKind::Structural)) => "holds".to_string(),
        (Some(false), Some(RowKind::Bound | RowKind::Structural)) => "FAILS".to_string(),
        (Some(true), _) => "yes".to_string(),
        (Some(false), _) => "NO".to_string(),
    };
    match r.against.as_ref() {
        Some(a) if r.within == Some(true) && !a.rejects => format!("{base} (so does {})", a.config),
        _ => base,
    }
}

/// Text report: the headline table, a scorecard per experiment, then the
/// compared rows, the other rows, notes, tables and the counts.
pub fn to_text(rows: &[Row], headlines: &[headline::HeadlineRow]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    if !headlines.is_empty() {
        headline_text(headlines, &mut o);
        o.push('\n');
    }
    scorecard_text(rows, &mut o);
    // With several seeds: the mean's 95% interval and how many seeds'
    // own values are within tolerance, after `within`.
    let seeded = rows.iter().any(|r| r.spread.is_some());
    let compared: Vec<&Row> = rows.iter().filter(|r| r.paper.is_some()).collect();
    let others: Vec<&Row> = rows.iter().filter(|r| r.paper.is_none()).collect();
    // Column widths from the rows themselves, so a long config name does
    // not shift the columns after it.
    let width =
        |f: &dyn Fn(&Row) -> usize, min: usize| rows.iter().map(f).max().unwrap_or(0).max(min);
    let we = width(&|r| r.experiment.chars().count(), 10);
    let wc = width(&|r| r.config.chars().count(), 6);
    let wp = width(&|r| params_text(r, ",").chars().count(), 6);
    let wm = width(&|r| r.metric.chars().count(), 6);
    let wu = width(&|r| r.unit.chars().count(), 4);
    let header = |o: &mut String, title: &str| {
        let _ = writeln!(
            o,
            "\n{title}\n{:<we$} {:<wc$} {:<wp$} {:<wm$} {:<wu$} {:>12} {:>12} {:>10} {:<10} {:>7}{} note",
            "experiment",
            "config",
            "params",
            "metric",
            "unit",
            if seeded { "mean" } else { "model" },
            "paper",
            "tolerance",
            "kind",
            "within",
            if seeded {
                format!(" {:>12} {:>8}", "±ci95", "in/seeds")
            } else {
                String::new()
            }
        );
    };
    // Each distinct note once, numbered in order of first use.
    let mut notes: Vec<&str> = Vec::new();
    for (title, set) in [
        ("rows with a published value", &compared),
        (
            "rows without a published value (withheld, sensitivities, beyond the paper)",
            &others,
        ),
    ] {
        if set.is_empty() {
            continue;
        }
        header(&mut o, title);
        for r in set.iter() {
            let params = params_text(r, ",");
            let tol = tolerance_text(r.tolerance, "paper");
            let mark = note_number(&mut notes, r.note.as_deref())
                .map(|i| format!(" [{i}]"))
                .unwrap_or_default();
            let spread = match (&r.spread, seeded) {
                (Some(sp), _) => format!(
                    " {:>12.3} {:>8}",
                    sp.ci_half,
                    sp.within_seeds
                        .map(|k| format!("{k}/{}", sp.seeds))
                        .unwrap_or_default()
                ),
                (None, true) => format!(" {:>12} {:>8}", "", ""),
                (None, false) => String::new(),
            };
            let _ = writeln!(
                o,
                "{:<we$} {:<wc$} {:<wp$} {:<wm$} {:<wu$} {:>12.3} {:>12} {:>10} {:<10} {:>7}{spread}{mark}",
                r.experiment,
                r.config,
                params,
                r.metric,
                r.unit,
                r.model,
                r.paper
                    .map(|p| format!("{p:.3}"))
                    .unwrap_or_else(|| "-".into()),
                tol,
                r.kind.map(RowKind::name).unwrap_or(""),
                within_text(r),
            );
        }
    }
    if !notes.is_empty() {
        let _ = writeln!(o, "\nnotes (known causes of gaps to the paper):");
        for (i, n) in notes.iter().enumerate() {
            let _ = writeln!(o, "[{}] {n}", i + 1);
        }
    }
    calibrated_text(rows, &mut o);
    tables(rows, &mut o);
    let viol: u64 = rows.iter().map(|r| r.violations).max().unwrap_or(0);
    if !headlines.is_empty() {
        let _ = write!(o, "\n{}.", headline::summary(headlines));
    }
    let _ = writeln!(
        o,
        "\n{}; max invariant violations in any run: {viol}",
        Score::of(rows).line()
    );
    o
}

/// The rows whose published value set a testbed parameter, listed.
fn calibrated_text(rows: &[Row], o: &mut String) {
    use std::fmt::Write;
    let cal: Vec<&Row> = rows.iter().filter(|r| r.calibrated_to.is_some()).collect();
    if cal.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "\ntestbed calibration (a paper's own reference measurement set an unstated parameter; not counted as reproduced):"
    );
    for r in cal {
        let _ = writeln!(
            o,
            "- {} {} {}: {}",
            r.experiment,
            r.config,
            r.metric,
            r.calibrated_to.as_deref().unwrap_or_default()
        );
    }
}

/// One line per experiment with compared rows: its score.
fn scorecard_text(rows: &[Row], o: &mut String) {
    use std::fmt::Write;
    let mut ids: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| r.paper.is_some()) {
        if !ids.contains(&r.experiment.as_str()) {
            ids.push(&r.experiment);
        }
    }
    if ids.is_empty() {
        return;
    }
    let w = ids
        .iter()
        .map(|i| i.chars().count())
        .max()
        .unwrap_or(0)
        .max(10);
    let _ = writeln!(o, "scorecard (compared rows per experiment)");
    for id in ids {
        let s = Score::of(rows.iter().filter(|r| r.experiment == id));
        let _ = writeln!(o, "{id:<w$} {}", s.line());
    }
}

/// The headline table as text.
fn headline_text(hs: &[headline::HeadlineRow], o: &mut String) {
    use std::fmt::Write;
    let _ = writeln!(
        o,
        "headline claims: the paper's effect (system against the configuration it is compared with) \
         and the model's\n{:<26} {:<24} {:>14} {:>14} {:>11} {:>11} {:>7}  {:<10} claim",
        "id", "system vs baseline", "paper", "model", "paper eff.", "model eff.", "ratio", "verdict"
    );
    let pair = |b: Option<f64>, s: Option<f64>| match (b, s) {
        (Some(b), Some(s)) => format!("{} -> {}", significant(b), significant(s)),
        _ => "-".into(),
    };
    for h in hs {
        let seeds = h
            .seeds_reproduced
            .map(|(k, n)| format!(" ({k}/{n} seeds)"))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "{:<26} {:<24} {:>14} {:>14} {:>11} {:>11} {:>7}  {:<10} {}{}",
            h.id,
            format!("{} vs {}", h.system, h.baseline),
            pair(h.paper_baseline, h.paper_system),
            pair(h.model_baseline, h.model_system),
            headline::effect_text(h.paper_effect, h.effect_unit),
            headline::effect_text(h.model_effect, h.effect_unit),
            headline::ratio_text(h.ratio),
            h.verdict.name(),
            h.claim,
            seeds,
        );
        if let Some(n) = &h.note {
            let _ = writeln!(o, "{:<26} note: {n}", "");
        }
    }
    let _ = writeln!(
        o,
        "rule: an effect is the percent change from baseline to system (points for a share of time in %); \
         reproduced = within {} of the paper's, or same sign and ratio in [{}, {}] \
         (else smaller, larger, opposite, or no effect under {}); with seeds, at least half of them too",
        headline::RESOLUTION,
        headline::RATIO_LO,
        headline::RATIO_HI,
        headline::NO_EFFECT
    );
}

/// The headline table as Markdown.
pub fn headline_markdown(paper: &str, hs: &[headline::HeadlineRow]) -> String {
    use std::fmt::Write;
    let cell = |s: &str| s.replace('|', "\\|");
    let mut o = String::new();
    let _ = writeln!(
        o,
        "| {paper} | claim | system vs baseline | paper | model | paper effect | model effect | ratio | verdict |\n\
         |---|---|---|---|---|---|---|---|---|"
    );
    let pair = |b: Option<f64>, s: Option<f64>, unit: &str| match (b, s) {
        (Some(b), Some(s)) => format!("{} → {} {}", significant(b), significant(s), unit),
        _ => "-".into(),
    };
    for h in hs {
        let seeds = h
            .seeds_reproduced
            .map(|(k, n)| format!(" ({k}/{n} seeds)"))
            .unwrap_or_default();
        let note = h
            .note
            .as_deref()
            .map(|n| format!(" *{}*", cell(n)))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "| {} | {}{note} | {} vs {} | {} | {} | {} | {} | {} | {}{seeds} |",
            cell(&h.id),
            cell(&h.claim),
            cell(&h.system),
            cell(&h.baseline),
            pair(h.paper_baseline, h.paper_system, &h.unit),
            pair(h.model_baseline, h.model_system, &h.unit),
            headline::effect_text(h.paper_effect, h.effect_unit),
            headline::effect_text(h.model_effect, h.effect_unit),
            headline::ratio_text(h.ratio),
            match h.verdict {
                headline::Verdict::Reproduced => "reproduced".to_string(),
                v => format!("**{}**", v.name()),
            },
        );
    }
    o
}

/// The published comparisons of `paper` as Markdown: the headline table,
/// then one table of the rows with a paper value (notes as numbered
/// footnotes), and the counts. Rows with paper = null (withheld values,
/// sensitivities) are left to the full outputs.
pub fn to_markdown(paper: &str, rows: &[Row], headlines: &[headline::HeadlineRow]) -> String {
    use std::fmt::Write;
    let scored: Vec<&Row> = rows.iter().filter(|r| r.paper.is_some()).collect();
    let viol: u64 = rows.iter().map(|r| r.violations).max().unwrap_or(0);
    let mut o = String::new();
    let _ = writeln!(o, "## `exitless reproduce {paper}`\n");
    if !headlines.is_empty() {
        let _ = writeln!(o, "{}.\n", headline::summary(headlines));
        o += &headline_markdown(paper, headlines);
        o.push('\n');
    }
    let _ = writeln!(
        o,
        "{}; max invariant violations in any run: {viol}. \
         Rows without a published value (withheld by the paper, or beyond it): {}; \
         `exitless reproduce {paper}` prints them all.\n",
        Score::of(rows.iter()).line(),
        rows.len() - scored.len()
    );
    let cell = |s: &str| s.replace('|', "\\|");
    let seeded = rows.iter().any(|r| r.spread.is_some());
    if let Some(sp) = rows.iter().find_map(|r| r.spread.as_ref()) {
        let all = rows.iter().all(|r| r.spread.is_some());
        let _ = writeln!(
            o,
            "{} the mean of {} seeds ± the half-width of its 95% interval; \
             `within` judges the mean and needs at least half of the seeds within too \
             (the seeds whose own value is within in brackets).\n",
            if all {
                "Each model value is"
            } else {
                "A model value with ± is"
            },
            sp.seeds
        );
    }
    let _ = writeln!(
        o,
        "| experiment | config | params | metric | {} | paper | tolerance | kind | within | note |\n\
         |---|---|---|---|---|---|---|---|---|---|",
        if seeded {
            "model (mean ± ci95)"
        } else {
            "model"
        }
    );
    let mut notes: Vec<&str> = Vec::new();
    for r in &scored {
        let params = params_text(r, ", ");
        let tol = tolerance_text(r.tolerance, " paper");
        let mark = note_number(&mut notes, r.note.as_deref())
            .map(|i| format!("[{i}]"))
            .unwrap_or_default();
        let verdict = within_text(r);
        let verdict = match r.within {
            Some(false) if r.calibrated_to.is_none() => format!("**{}**", verdict.to_lowercase()),
            _ => verdict,
        };
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} {} | {} | {} | {} | {} | {mark} |",
            cell(&r.experiment),
            cell(&r.config),
            cell(&params),
            cell(&r.metric),
            match &r.spread {
                Some(sp) => format!("{} ± {}", significant(r.model), significant(sp.ci_half)),
                None => significant(r.model),
            },
            cell(&r.unit),
            r.paper.map(significant).unwrap_or_default(),
            tol,
            r.kind.map(RowKind::name).unwrap_or(""),
            match r
                .spread
                .as_ref()
                .and_then(|sp| sp.within_seeds.zip(Some(sp.seeds)))
            {
                None => verdict,
                Some((k, n)) => format!("{verdict} ({k}/{n})"),
            }
        );
    }
    if !notes.is_empty() {
        let _ = writeln!(o, "\nNotes (known causes of gaps to the paper):\n");
        for (i, n) in notes.iter().enumerate() {
            let _ = writeln!(o, "{}. {}", i + 1, cell(n));
        }
    }
    let mut cal = String::new();
    calibrated_text(rows, &mut cal);
    o += &cal;
    o
}

/// `x` to four significant digits, without a trailing fraction of zeros.
fn significant(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let digits = (3 - x.abs().log10().floor() as i32).max(0) as usize;
    let s = format!("{x:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// The experiments marked `table`, each as a matrix: its metrics down,
/// its configs across (in run order), `model (paper)` in each cell.
fn tables(rows: &[Row], o: &mut String) {
    use std::fmt::Write;
    let mut ids: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| r.table) {
        if !ids.contains(&r.experiment.as_str()) {
            ids.push(&r.experiment);
        }
    }
    for id in ids {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.experiment == id).collect();
        let mut configs: Vec<&str> = Vec::new();
        let mut metrics: Vec<&str> = Vec::new();
        for r in &mine {
            if !configs.contains(&r.config.as_str()) {
                configs.push(&r.config);
            }
            if !metrics.contains(&r.metric.as_str()) {
                metrics.push(&r.metric);
            }
        }
        let _ = write!(o, "\n{id}\n{:<32}", "metric");
        for c in &configs {
            let _ = write!(o, " {c:>16}");
        }
        let _ = writeln!(o);
        for m in &metrics {
            let _ = write!(o, "{m:<32}");
            for c in &configs {
                let cell = mine
                    .iter()
                    .find(|r| r.config == *c && r.metric == *m)
                    .map(|r| match r.paper {
                        Some(p) => format!("{:.3} ({p})", r.model),
                        None => format!("{:.3}", r.model),
                    })
                    .unwrap_or_else(|| "-".into());
                let _ = write!(o, " {cell:>16}");
            }
            let _ = writeln!(o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(metric: &str, model: f64, paper: Option<f64>, note: Option<&str>) -> Row {
        Row {
            experiment: "x.exp".into(),
            config: "kvm".into(),
            params: BTreeMap::new(),
            metric: metric.into(),
            unit: "1/s".into(),
            model,
            paper,
            tolerance: paper.map(|_| Tolerance::Rel(0.25)),
            within: paper.map(|p| within(model, p, Tolerance::Rel(0.25))),
            kind: paper.map(|_| RowKind::Value),
            against: None,
            calibrated_to: None,
            violations: 0,
            note: note.map(String::from),
            table: false,
            spread: None,
        }
    }

    #[test]
    fn several_seeds_give_the_mean_judged_against_the_tolerance_and_its_spread() {
        // Paper 100 ± 25%: seeds at 70, 80 and 130 are in for one seed of
        // three, but their mean (93.3) is within.
        let seeds: Vec<Vec<Row>> = [70.0, 80.0, 130.0]
            .iter()
            .map(|&m| {
                vec![
                    row("a", m, Some(100.0), None),
                    row("b", m * 2.0, None, None),
                ]
            })
            .collect();
        let rows = combine_seeds(seeds);
        assert_eq!(rows.len(), 2);
        let a = &rows[0];
        assert!((a.model - 280.0 / 3.0).abs() < 1e-9, "{}", a.model);
        // The mean is within, but two of the three seeds are not: spread
        // decides, so the row is not within (issue 34 item 3).
        assert_eq!(a.within, Some(false));
        let sp = a.spread.as_ref().unwrap();
        assert_eq!((sp.seeds, sp.min, sp.max), (3, 70.0, 130.0));
        assert_eq!(sp.within_seeds, Some(1));
        // Sample std of 70, 80, 130 is sqrt(1033.3); t(0.975, 2) = 4.303.
        assert!((sp.std - 1033.333_f64.sqrt()).abs() < 1e-3, "{}", sp.std);
        assert!((sp.ci_half - 4.303 * sp.std / 3f64.sqrt()).abs() < 0.01);
        // Two of three seeds within (80, 110, 130 -> mean 106.7): within.
        let seeds: Vec<Vec<Row>> = [80.0, 110.0, 130.0]
            .iter()
            .map(|&m| vec![row("a", m, Some(100.0), None)])
            .collect();
        let two = combine_seeds(seeds);
        assert_eq!(two[0].spread.as_ref().unwrap().within_seeds, Some(2));
        assert_eq!(two[0].within, Some(true));
        // Without a published value there is nothing to count.
        assert_eq!(rows[1].spread.as_ref().unwrap().within_seeds, None);
        assert_eq!(rows[1].within, None);
        // One seed: the rows as they were, without a spread.
        let one = combine_seeds(vec![vec![row("a", 70.0, Some(100.0), None)]]);
        assert_eq!((one[0].model, one[0].within), (70.0, Some(false)));
        assert!(one[0].spread.is_none());
    }

    #[test]
    fn markdown_lists_the_published_comparisons_and_counts_them() {
        let rows = vec![
            row("a", 100.0, Some(110.0), None),
            row("b|c", 50.0, Some(200.0), Some("a known gap | with a pipe")),
            row("unpublished_metric", 7.0, None, None),
            row("d", 10.0, Some(100.0), Some("a known gap | with a pipe")),
        ];
        let md = to_markdown("did", &rows, &[]);
        assert!(
            md.contains("1 of 3 values and effects within tolerance"),
            "{md}"
        );
        assert!(
            md.contains("without a published value (withheld by the paper, or beyond it): 1;"),
            "{md}"
        );
        assert!(
            !md.contains("unpublished_metric"),
            "a row without a paper value is listed: {md}"
        );
        // One line per compared row, pipes in cells escaped.
        let body: Vec<&str> = md.lines().filter(|l| l.starts_with("| x.exp")).collect();
        assert_eq!(body.len(), 3, "{md}");
        assert!(body[1].contains("b\\|c"), "{md}");
        assert!(body[0].contains("| yes |") && body[1].contains("| **no** |"));
        // The shared note is listed once and both rows point at it.
        assert!(
            body[1].ends_with("| [1] |") && body[2].ends_with("| [1] |"),
            "{md}"
        );
        assert_eq!(
            md.matches("1. a known gap \\| with a pipe").count(),
            1,
            "{md}"
        );
    }

    #[test]
    fn bounds_and_structural_rows_hold_apart_and_a_bound_is_paired() {
        let e: Experiment = toml::from_str(
            r#"
id = "x.exp"
configs = { kvm = [], did = [] }
config_order = ["kvm", "did"]
metrics = []
expected = [
  { config = "did", metric = "exits", paper = 1000, tolerance = "max", kind = "bound", against = "kvm", source = "s" },
  { config = "did", metric = "eoi", paper = 0, tolerance = { abs = 0.05 }, kind = "structural", source = "s" },
  { config = "kvm", metric = "lat", paper = 14, tolerance = { rel = 0.25 }, kind = "value", source = "s" },
]
"#,
        )
        .expect("experiment");
        let mut rows = vec![
            Row {
                config: "kvm".into(),
                ..row("exits", 80_000.0, None, None)
            },
            Row {
                config: "did".into(),
                kind: Some(RowKind::Bound),
                tolerance: Some(Tolerance::Max),
                ..row("exits", 95.0, Some(1000.0), None)
            },
            Row {
                config: "did".into(),
                kind: Some(RowKind::Structural),
                ..row("eoi", 0.0, Some(0.0), None)
            },
            row("lat", 6.4, Some(14.0), None),
        ];
        rows[1].within = Some(true);
        rows[2].within = Some(true);
        pair_bounds(&[&e], &mut rows);
        let a = rows[1].against.as_ref().expect("paired");
        assert_eq!(
            (a.config.as_str(), a.model, a.rejects),
            ("kvm", Some(80_000.0), true)
        );
        let s = Score::of(&rows);
        assert_eq!((s.counted, s.within), (1, 0));
        assert_eq!((s.bounds, s.bounds_hold, s.bounds_discriminate), (1, 1, 1));
        assert_eq!((s.structural, s.structural_hold), (1, 1));
        assert!(
            s.line()
                .starts_with("0 of 1 values and effects within tolerance"),
            "{}",
            s.line()
        );
        // A bound that a do-nothing scheme also meets is said to be one.
        rows[0].model = 500.0;
        pair_bounds(&[&e], &mut rows);
        assert!(!rows[1].against.as_ref().unwrap().rejects);
        assert_eq!(within_text(&rows[1]), "holds (so does kvm)");
        // A calibrated row is listed, not counted.
        rows[3].calibrated_to = Some("native sets the host stack".into());
        let s = Score::of(&rows);
        assert_eq!((s.counted, s.calibrated), (0, 1));
    }

    #[test]
    fn a_bound_without_a_pairing_or_a_one_sided_value_is_refused() {
        let file = |row: &str| {
            format!(
                "[[experiment]]\nid = \"x\"\nscenario = \"s.toml\"\nconfigs = {{ a = [], b = [] }}\n\
                 config_order = [\"a\", \"b\"]\nmetrics = []\nexpected = [{row}]\n"
            )
        };
        let check = |row: &str| {
            let ef: ExperimentFile = toml::from_str(&file(row)).expect("parses");
            check_declarations(&ef)
        };
        let base = "config = \"a\", metric = \"m\", paper = 1, source = \"s\"";
        assert!(check(&format!(
            "{{ {base}, tolerance = \"max\", kind = \"bound\", against = \"b\" }}"
        ))
        .is_ok());
        let e = check(&format!(
            "{{ {base}, tolerance = \"max\", kind = \"bound\" }}"
        ))
        .unwrap_err();
        assert!(e.contains("against"), "{e}");
        let e = check(&format!(
            "{{ {base}, tolerance = \"max\", kind = \"value\" }}"
        ))
        .unwrap_err();
        assert!(e.contains("one-sided"), "{e}");
        let e = check(&format!(
            "{{ {base}, tolerance = \"max\", kind = \"bound\", against = \"zz\" }}"
        ))
        .unwrap_err();
        assert!(e.contains("zz"), "{e}");
        // `kind` is required.
        assert!(toml::from_str::<ExperimentFile>(&file(&format!(
            "{{ {base}, tolerance = {{ rel = 0.1 }} }}"
        )))
        .is_err());
    }

    #[test]
    fn significant_keeps_four_digits_and_drops_trailing_zeros() {
        assert_eq!(significant(199380.0), "199380");
        assert_eq!(significant(71.8823853092), "71.88");
        assert_eq!(significant(0.016199), "0.0162");
        assert_eq!(significant(2.5), "2.5");
        assert_eq!(significant(-1.43), "-1.43");
        assert_eq!(significant(0.0), "0");
    }

    #[test]
    fn longest_jobs_go_first_and_ties_keep_their_order() {
        let cal = Calibration::default_host();
        let sc = |text: &str| Scenario::parse(text, &[]).expect("scenario");
        let udp = |rate: u32, dur: f64| {
            format!("scheme = \"kvm\"\nduration_s = {dur}\n[workload.udp]\nrate_pps = {rate}\n")
        };
        // 2^34 iterations end the run after ~5 s, not its 30.
        let wl = format!(
            "{}[workload.whileloop]\niterations = 17179869184\n",
            udp(600_000, 30.0)
        );
        let scenarios = vec![
            sc(&udp(100_000, 1.0)),
            sc(&udp(600_000, 1.0)),
            sc(&wl),
            sc(&udp(100_000, 1.0)),
        ];
        let e: Experiment =
            toml::from_str("id = \"x\"\nconfigs = {}\nconfig_order = []\nmetrics = []\n")
                .expect("experiment");
        let exps = [&e];
        let jobs: Vec<Job> = (0..scenarios.len())
            .map(|_| Job {
                exp: 0,
                seed: None,
                config: String::new(),
                param: vec![],
                scenario: PathBuf::new(),
                sets: vec![],
                cal: None,
            })
            .collect();
        assert_eq!(longest_first(&jobs, &scenarios, &exps, &cal), [2, 1, 0, 3]);
        // A job's calibration entries leave its scenario sets, and layer
        // over the calibration in use; an unknown entry names itself.
        let (sets, job) = split_calibration_sets(
            vec!["scheme=kvm".into(), "calibration.guest.cost_cv=0.2".into()],
            &cal,
        )
        .expect("splits");
        assert_eq!(sets, ["scheme=kvm"]);
        assert_eq!(job.expect("a calibration").guest.cost_cv.value, 0.2);
        let e = split_calibration_sets(vec!["calibration.guest.nope_ns=1".into()], &cal)
            .expect_err("unknown entry refused");
        assert!(format!("{e:?}").contains("guest.nope_ns"), "{e:?}");
        let wl_cost = cost_estimate(&scenarios[2], None, &cal);
        let five_s = cost_estimate(&sc(&udp(600_000, 5.0)), None, &cal);
        assert!(
            wl_cost < five_s * 1.2 && wl_cost > five_s * 0.8,
            "{wl_cost} vs {five_s}"
        );
    }

    #[test]
    fn bare_metric_names_resolve_only_when_unique() {
        let m: std::collections::BTreeMap<String, f64> = [
            ("sip.call_rate", 99.0),
            ("sip.invite_retrans", 2.0),
            ("a.count", 1.0),
            ("b.count", 3.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(workload_metric(&m, "sip.call_rate"), Some(99.0));
        assert_eq!(workload_metric(&m, "call_rate"), Some(99.0));
        assert_eq!(workload_metric(&m, "retrans"), None);
        // Ambiguous: two workloads report a `count`.
        assert_eq!(workload_metric(&m, "count"), None);
        assert_eq!(workload_metric(&m, "a.count"), Some(1.0));
    }
}
