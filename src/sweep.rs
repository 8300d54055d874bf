//! Parameter sweeps (`exitless sweep`): one scenario over the cartesian
//! product of grids of `--set` values and a list of schemes (the
//! *points*), each run with several seeds, on local threads, written as
//! long-form rows in the Python front end's schema (`exitless.sweep`):
//! `point`, one column per grid key, `scheme`, `seed`, `metric`, `value`.
//!
//! The results file is also the sweep's journal: each finished run's rows
//! are appended to it as the run ends, and a sweep started again with the
//! same file runs only the runs it does not hold yet (an interrupted or an
//! extended sweep resumes). When every run is done, the file is rewritten
//! in the plan's order, so its bytes depend neither on the number of
//! threads nor on how often the sweep was resumed.

use crate::calibration::Calibration;
use crate::report::RunReport;
use crate::scenario::Scenario;
use crate::world::World;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A run's metrics by name; `None`: a value the run could not compute
/// (a mean over no samples), written as an empty cell / JSON null.
pub type Metrics = BTreeMap<String, Option<f64>>;

/// Column names every sweep file has besides one per grid key.
pub const RESERVED: [&str; 5] = ["point", "scheme", "seed", "metric", "value"];

/// Most runs (points × seeds) in one sweep.
pub const MAX_RUNS: usize = 1_000_000;

/// A run report's numbers under the names sweeps use, as the Python
/// front end's `exitless.flatten`: VM 0's `exits_per_s`, `tig_pct`,
/// `eht_pct` and `exits_per_s.<REASON>` (VM *i*'s under `vm<i>.`), every
/// entry of the report's `metrics`, and `violations` (the checker's
/// total). A non-finite value is `None`.
pub fn flatten(r: &RunReport) -> Result<Metrics, String> {
    let mut out = Metrics::new();
    let mut put = |k: String, v: f64| {
        let v = v.is_finite().then_some(v);
        match out.insert(k.clone(), v) {
            None => Ok(()),
            Some(_) => Err(format!("metric `{k}` appears twice in the report")),
        }
    };
    for vm in &r.vms {
        let p = crate::report::vm_prefix(vm.vm);
        put(format!("{p}exits_per_s"), vm.exits_per_s)?;
        put(format!("{p}tig_pct"), vm.tig_pct)?;
        put(format!("{p}eht_pct"), vm.eht_pct)?;
        for (reason, v) in &vm.exits_per_s_by_reason {
            put(format!("{p}exits_per_s.{reason}"), *v)?;
        }
    }
    for (k, v) in &r.metrics {
        put(k.clone(), *v)?;
    }
    put("violations".into(), r.violations() as f64)?;
    Ok(out)
}

/// Whether an absent metric means 0 (a count or rate of events the run
/// had none of) rather than "no value" (a mean over nothing).
pub fn zero_when_absent(name: &str) -> bool {
    let base = match name.split_once('.') {
        Some((vm, rest))
            if vm.len() > 2
                && vm.starts_with("vm")
                && vm[2..].bytes().all(|b| b.is_ascii_digit()) =>
        {
            rest
        }
        _ => name,
    };
    base.starts_with("exits_per_s.") || base.starts_with("timer_exits.")
}

/// One `--grid key=v1,v2,...`.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    /// The scenario key (a dotted path or a short key, as for `--set`).
    pub key: String,
    /// Its values, as text (`--set key=value`'s value).
    pub values: Vec<String>,
}

impl Axis {
    /// Parses `key=v1,v2,...`.
    pub fn parse(arg: &str) -> Result<Axis, String> {
        let (k, v) = arg
            .split_once('=')
            .ok_or_else(|| format!("--grid `{arg}`: expected key=v1,v2,..."))?;
        let key = k.trim().to_string();
        if key.is_empty() {
            return Err(format!("--grid `{arg}`: empty key"));
        }
        match key.as_str() {
            "scheme" => return Err("--grid scheme: use --schemes a,b".into()),
            "seed" => return Err("--grid seed: use --seeds N (and --seed BASE)".into()),
            k if RESERVED.contains(&k) => {
                return Err(format!(
                    "--grid {k}: `{k}` is a column of the results; not a grid key"
                ))
            }
            _ => {}
        }
        let mut values: Vec<String> = Vec::new();
        for x in v.split(',') {
            let x = x.trim();
            if x.is_empty() {
                return Err(format!("--grid `{arg}`: empty value"));
            }
            if values.iter().any(|y| y == x) {
                return Err(format!("--grid `{arg}`: value `{x}` given twice"));
            }
            values.push(x.to_string());
        }
        Ok(Axis { key, values })
    }
}

/// A point: grid values and a scheme, resolved.
#[derive(Clone, Debug)]
pub struct Point {
    /// One value per grid key.
    pub values: Vec<String>,
    /// The scheme it runs (after `config`, `--set` and `--schemes`).
    pub scheme: String,
    /// The checked scenario (its seed is replaced per run).
    pub scenario: Scenario,
}

/// One simulation: a point and a seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    /// Index into [`Plan::points`].
    pub point: usize,
    /// Seed.
    pub seed: u64,
}

/// What a sweep runs, checked before anything runs.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Grid keys, in `--grid` order (the files' grid columns).
    pub keys: Vec<String>,
    /// Points: the grids' cartesian product (first key slowest) × schemes.
    pub points: Vec<Point>,
    /// Runs in output order: by point, then seed.
    pub tasks: Vec<Task>,
    /// Seeds per point.
    pub seeds: u64,
    /// Validation warnings (options without effect), each once.
    pub warnings: Vec<String>,
    /// The scenario file's text and the `--set` overrides of every point:
    /// what the results depend on besides the grid, the schemes, the
    /// seeds and the calibration (see [`inputs_path`]).
    pub inputs: (String, Vec<String>),
}

impl Plan {
    /// `key=value, ..., scheme=s` for messages.
    pub fn describe(&self, point: usize) -> String {
        let p = &self.points[point];
        let mut parts: Vec<String> = self
            .keys
            .iter()
            .zip(&p.values)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        parts.push(format!("scheme={}", p.scheme));
        parts.join(", ")
    }

    fn run_key(&self, t: &Task) -> RunKey {
        let p = &self.points[t.point];
        (p.values.clone(), p.scheme.clone(), t.seed)
    }
}

/// Builds and checks a sweep: every point's scenario is parsed with its
/// overrides (`base_sets`, then the grid's, then `scheme=`), so a bad key
/// or value fails, naming the point, before anything runs. `schemes`
/// empty: the scenario's. Seeds `base..base+seeds`, `base` = `seed` or
/// each point's scenario seed.
pub fn plan(
    scenario: &Path,
    base_sets: &[String],
    axes: &[Axis],
    schemes: &[String],
    seeds: u64,
    seed: Option<u64>,
) -> Result<Plan, String> {
    let text = crate::scenario::read_input(scenario)
        .map_err(|e| format!("cannot read scenario {}: {e}", scenario.display()))?;
    if seeds == 0 {
        return Err("--seeds must be at least 1".into());
    }
    for (i, a) in axes.iter().enumerate() {
        if axes[..i].iter().any(|b| b.key == a.key) {
            return Err(format!("--grid {}: key given twice", a.key));
        }
    }
    let schemes: Vec<Option<&String>> = if schemes.is_empty() {
        vec![None]
    } else {
        schemes.iter().map(Some).collect()
    };
    let combos: usize = axes
        .iter()
        .map(|a| a.values.len())
        .try_fold(schemes.len(), |n, k| n.checked_mul(k))
        .unwrap_or(usize::MAX);
    if combos.saturating_mul(seeds.min(usize::MAX as u64) as usize) > MAX_RUNS {
        return Err(format!(
            "{combos} points × {seeds} seeds: more than {MAX_RUNS} runs in one sweep"
        ));
    }
    let mut points = Vec::new();
    let mut tasks = Vec::new();
    let mut warnings: Vec<String> = Vec::new();
    for c in 0..combos / schemes.len() {
        // Mixed radix, the last key fastest (itertools.product's order).
        let mut idx = vec![0; axes.len()];
        let mut rest = c;
        for (i, a) in axes.iter().enumerate().rev() {
            idx[i] = rest % a.values.len();
            rest /= a.values.len();
        }
        let values: Vec<String> = axes
            .iter()
            .zip(&idx)
            .map(|(a, &j)| a.values[j].clone())
            .collect();
        for sch in &schemes {
            let mut sets = base_sets.to_vec();
            sets.extend(
                axes.iter()
                    .zip(&values)
                    .map(|(a, v)| format!("{}={v}", a.key)),
            );
            if let Some(s) = sch {
                sets.push(format!("scheme={s}"));
            }
            let s = Scenario::parse(&text, &sets).map_err(|e| {
                let mut what: Vec<String> = axes
                    .iter()
                    .zip(&values)
                    .map(|(a, v)| format!("{}={v}", a.key))
                    .collect();
                if let Some(s) = sch {
                    what.push(format!("scheme={s}"));
                }
                let what = if what.is_empty() {
                    "the scenario".to_string()
                } else {
                    what.join(", ")
                };
                format!("{}: point ({what}): {e}", scenario.display())
            })?;
            for w in &s.warnings {
                if !warnings.contains(w) {
                    warnings.push(w.clone());
                }
            }
            let base = seed.unwrap_or(s.seed);
            if base.checked_add(seeds - 1).is_none() {
                return Err(format!("seed {base} + {seeds} runs: past the largest seed"));
            }
            let pi = points.len();
            tasks.extend((0..seeds).map(|i| Task {
                point: pi,
                seed: base + i,
            }));
            points.push(Point {
                values: values.clone(),
                scheme: s.scheme.clone(),
                scenario: s,
            });
        }
    }
    let plan = Plan {
        keys: axes.iter().map(|a| a.key.clone()).collect(),
        points,
        tasks,
        seeds,
        warnings,
        inputs: (text, base_sets.to_vec()),
    };
    // Two points that resolve to the same values and scheme (`--schemes
    // kvm,kvm`) would be one run twice.
    let mut seen = BTreeSet::new();
    for t in &plan.tasks {
        if !seen.insert(plan.run_key(t)) {
            return Err(format!(
                "point ({}) appears twice in the sweep",
                plan.describe(t.point)
            ));
        }
    }
    Ok(plan)
}

/// Output formats, by the file's suffix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `.csv`: a header line, then one line per row; empty cell = null.
    Csv,
    /// `.jsonl` / `.ndjson`: one JSON object per row.
    Jsonl,
}

impl Format {
    /// The format `path`'s suffix names.
    pub fn of(path: &Path) -> Result<Format, String> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(|e| e.to_ascii_lowercase());
        match ext.as_deref() {
            Some("csv") => Ok(Format::Csv),
            Some("jsonl") | Some("ndjson") => Ok(Format::Jsonl),
            Some("parquet") => Err(format!(
                "{}: this build writes .csv or .jsonl; for Parquet write CSV and convert it with polars \
                 (python -c \"import polars as pl; pl.read_csv('r.csv').write_parquet('r.parquet')\") \
                 or run the sweep from Python (exitless.sweep(..., out='r.parquet'))",
                path.display()
            )),
            _ => Err(format!(
                "{}: the results file must end in .csv or .jsonl",
                path.display()
            )),
        }
    }

    fn ext(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Jsonl => "jsonl",
        }
    }
}

/// The summary file beside `out`: `results.csv` → `results.summary.csv`.
pub fn summary_path(out: &Path, format: Format) -> PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    out.with_file_name(format!("{stem}.summary.{}", format.ext()))
}

/// The record beside `out` of what its runs were made from (scenario
/// text, `--set` overrides, calibration): `results.csv` →
/// `results.sweep.json`. A sweep resumed from `out` with other inputs
/// would mix results of different models in one file, so it is refused.
pub fn inputs_path(out: &Path) -> PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    out.with_file_name(format!("{stem}.sweep.json"))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Inputs {
    scenario: String,
    sets: Vec<String>,
    calibration: String,
    /// The tool that made the runs (`exitless x.y.z`), for a report's
    /// provenance; a record written before it existed has none. Not part of
    /// the inputs' identity: a newer build resumes an older one's sweep.
    #[serde(default)]
    tool: String,
}

impl PartialEq for Inputs {
    fn eq(&self, o: &Self) -> bool {
        (&self.scenario, &self.sets, &self.calibration) == (&o.scenario, &o.sets, &o.calibration)
    }
}

/// A run's identity in a results file: grid values, scheme, seed.
type RunKey = (Vec<String>, String, u64);

fn fmt_value(v: Option<f64>) -> String {
    // Display of an f64 is the shortest text that reads back as the same
    // number, so a file read and written again keeps its bytes.
    v.map(|x| format!("{x}")).unwrap_or_default()
}

/// The metric every run has ([`flatten`]): a run in a results file
/// without it was cut short.
const SENTINEL: &str = "violations";

/// Writes and reads rows of one sweep's shape.
struct Table<'a> {
    keys: &'a [String],
    format: Format,
}

impl Table<'_> {
    fn columns(&self) -> Vec<String> {
        let mut c = vec!["point".to_string()];
        c.extend(self.keys.iter().cloned());
        c.extend(["scheme", "seed", "metric", "value"].map(String::from));
        c
    }

    fn header(&self) -> String {
        match self.format {
            Format::Csv => csv_line(&self.columns()),
            Format::Jsonl => String::new(),
        }
    }

    /// A run's rows, by metric name; `journal`: `violations` (which every
    /// run has) last, so that a run whose rows were cut short lacks it.
    fn rows(
        &self,
        point: usize,
        values: &[String],
        scheme: &str,
        seed: u64,
        m: &Metrics,
        journal: bool,
    ) -> String {
        let mut o = String::new();
        let order = m
            .iter()
            .filter(|(k, _)| !journal || k.as_str() != SENTINEL)
            .chain(m.get_key_value(SENTINEL).filter(|_| journal));
        for (name, v) in order {
            match self.format {
                Format::Csv => {
                    let mut cells = vec![point.to_string()];
                    cells.extend(values.iter().cloned());
                    cells.extend([
                        scheme.to_string(),
                        seed.to_string(),
                        name.clone(),
                        fmt_value(*v),
                    ]);
                    o.push_str(&csv_line(&cells));
                }
                Format::Jsonl => {
                    let s = |x: &str| serde_json::Value::String(x.into()).to_string();
                    o.push_str(&format!("{{\"point\":{point}"));
                    for (k, x) in self.keys.iter().zip(values) {
                        o.push_str(&format!(",{}:{}", s(k), s(x)));
                    }
                    o.push_str(&format!(
                        ",\"scheme\":{},\"seed\":{seed},\"metric\":{},\"value\":{}}}\n",
                        s(scheme),
                        s(name),
                        v.map(|x| format!("{x:?}")).unwrap_or_else(|| "null".into())
                    ));
                }
            }
        }
        o
    }

    /// Runs held in a results file's text, in file order. A run cut short
    /// (its last line without a newline, or without its `violations`
    /// row, which is appended last) is dropped, to be run again.
    fn read(&self, text: &str, origin: &str) -> Result<Vec<(RunKey, Metrics)>, String> {
        let (whole, cut) = match text.rfind('\n') {
            _ if text.is_empty() => ("", false),
            Some(i) if i + 1 == text.len() => (text, false),
            Some(i) => (&text[..=i], true),
            None => ("", true),
        };
        let mut runs: Vec<(RunKey, Metrics)> = Vec::new();
        let mut push = |key: RunKey, metric: String, v: Option<f64>, line: usize| {
            if runs.last().is_none_or(|(k, _)| *k != key) {
                if runs.iter().any(|(k, _)| *k == key) {
                    return Err(format!("{origin}:{line}: a run split in two places"));
                }
                runs.push((key, Metrics::new()));
            }
            let m = &mut runs.last_mut().expect("pushed").1;
            if m.insert(metric.clone(), v).is_some() {
                return Err(format!(
                    "{origin}:{line}: metric `{metric}` twice in one run"
                ));
            }
            Ok(())
        };
        let value = |s: &str, line: usize| -> Result<Option<f64>, String> {
            if s.is_empty() {
                return Ok(None);
            }
            s.parse()
                .map(Some)
                .map_err(|_| format!("{origin}:{line}: value `{s}` is not a number"))
        };
        let seed = |s: &str, line: usize| -> Result<u64, String> {
            s.parse()
                .map_err(|_| format!("{origin}:{line}: seed `{s}` is not a seed"))
        };
        let n = self.keys.len();
        match self.format {
            Format::Csv => {
                let mut r = csv::ReaderBuilder::new()
                    .has_headers(true)
                    .from_reader(whole.as_bytes());
                let h: Vec<String> = r
                    .headers()
                    .map_err(|e| format!("{origin}: {e}"))?
                    .iter()
                    .map(String::from)
                    .collect();
                if !h.is_empty() && h != self.columns() {
                    return Err(format!(
                        "{origin} holds another sweep (columns {}; this one writes {}): give another --out",
                        h.join(","),
                        self.columns().join(",")
                    ));
                }
                for (i, rec) in r.records().enumerate() {
                    let line = i + 2;
                    let rec = rec.map_err(|e| format!("{origin}:{line}: {e}"))?;
                    let cell = |j: usize| rec.get(j).unwrap_or("");
                    let key = (
                        (1..=n).map(|j| cell(j).to_string()).collect(),
                        cell(n + 1).to_string(),
                        seed(cell(n + 2), line)?,
                    );
                    push(
                        key,
                        cell(n + 3).to_string(),
                        value(cell(n + 4), line)?,
                        line,
                    )?;
                }
            }
            Format::Jsonl => {
                for (i, l) in whole.lines().enumerate() {
                    let line = i + 1;
                    if l.trim().is_empty() {
                        continue;
                    }
                    let o: serde_json::Map<String, serde_json::Value> =
                        serde_json::from_str(l).map_err(|e| format!("{origin}:{line}: {e}"))?;
                    let mut cols: Vec<&String> = o.keys().collect();
                    let mut want: Vec<String> = self.columns();
                    cols.sort();
                    want.sort();
                    if cols
                        .iter()
                        .map(|s| s.as_str())
                        .ne(want.iter().map(|s| s.as_str()))
                    {
                        return Err(format!(
                            "{origin}:{line} holds another sweep (fields {}; this one writes {}): give another --out",
                            o.keys().cloned().collect::<Vec<_>>().join(","),
                            self.columns().join(",")
                        ));
                    }
                    let text = |k: &str| o[k].as_str().map(String::from);
                    let bad = |k: &str| format!("{origin}:{line}: bad `{k}`");
                    let mut values = Vec::new();
                    for k in self.keys {
                        values.push(text(k).ok_or_else(|| bad(k))?);
                    }
                    let v = match &o["value"] {
                        serde_json::Value::Null => None,
                        x => Some(x.as_f64().ok_or_else(|| bad("value"))?),
                    };
                    let key = (
                        values,
                        text("scheme").ok_or_else(|| bad("scheme"))?,
                        o["seed"].as_u64().ok_or_else(|| bad("seed"))?,
                    );
                    push(key, text("metric").ok_or_else(|| bad("metric"))?, v, line)?;
                }
            }
        }
        if cut {
            runs.pop();
        }
        runs.retain(|(_, m)| m.contains_key(SENTINEL));
        Ok(runs)
    }
}

fn csv_line(cells: &[String]) -> String {
    let mut w = csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    // Writing to memory cannot fail.
    let _ = w.write_record(cells);
    let bytes = w.into_inner().unwrap_or_default();
    String::from_utf8(bytes).unwrap_or_default()
}

/// What a sweep reports while it runs (on the calling thread).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Before the first run: runs to do, runs found in the results file.
    Start {
        /// Runs to do.
        to_run: usize,
        /// Runs already in the file (skipped).
        skipped: usize,
    },
    /// A run finished and its rows are in the file.
    Done,
    /// Something for the user to know (printed as a warning).
    Note(String),
}

/// What a finished sweep did.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Runs simulated now.
    pub ran: usize,
    /// Runs taken from the results file.
    pub skipped: usize,
    /// The summary file, when there were several seeds.
    pub summary: Option<PathBuf>,
}

/// Runs `plan` with `jobs` simulations at a time, appending each run's
/// rows to `out` as it finishes and skipping runs `out` already holds;
/// then rewrites `out` in the plan's order, every run with every metric
/// any run reported (absent counts and rates 0, other absent values
/// null), and, with more than one seed, writes the summary beside it
/// ([`summary_path`]).
pub fn execute(
    plan: &Plan,
    cal: &Calibration,
    out: &Path,
    jobs: usize,
    progress: &mut dyn FnMut(Event),
) -> Result<Outcome, String> {
    let format = Format::of(out)?;
    let runs: Vec<BatchRun> = plan
        .tasks
        .iter()
        .map(|t| {
            let p = &plan.points[t.point];
            BatchRun {
                point: t.point,
                values: p.values.clone(),
                scheme: p.scheme.clone(),
                seed: t.seed,
            }
        })
        .collect();
    let batch = Batch {
        keys: &plan.keys,
        runs: &runs,
        scenario: plan.inputs.0.clone(),
        sets: plan.inputs.1.clone(),
    };
    let run = |i: usize| -> Result<Metrics, String> {
        let t = plan.tasks[i];
        let mut s = plan.points[t.point].scenario.clone();
        s.seed = t.seed;
        World::build(&s, cal)
            .map_err(|e| e.to_string())
            .and_then(|mut w| {
                w.run(|_| {});
                flatten(&w.report())
            })
    };
    let describe = |i: usize| {
        let t = plan.tasks[i];
        format!("point ({}), seed {}", plan.describe(t.point), t.seed)
    };
    let done = execute_batch(&batch, cal, out, jobs, &run, &describe, progress)?;
    let summary = if plan.seeds > 1 {
        let path = summary_path(out, format);
        let results: Vec<Option<Metrics>> = done.results.into_iter().map(Some).collect();
        let text = summarize(plan, &results, format);
        crate::report::write_file_atomically(&path, |w| w.write_all(text.as_bytes()))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Some(path)
    } else {
        None
    };
    Ok(Outcome {
        ran: done.ran,
        skipped: done.skipped,
        summary,
    })
}

/// One run of a [`Batch`]: its identity in the results file.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchRun {
    /// The `point` column.
    pub point: usize,
    /// One value per key of the batch (the grid columns).
    pub values: Vec<String>,
    /// The `scheme` column.
    pub scheme: String,
    /// The `seed` column.
    pub seed: u64,
}

/// Runs journaled in one results file: a sweep's grid points, or a
/// sensitivity analysis's calibration variations (`crate::sensitivity`).
/// `scenario` and `sets` are what every run is made from besides the
/// calibration (recorded beside the file, [`inputs_path`]).
pub struct Batch<'a> {
    /// The file's columns between `point` and `scheme`.
    pub keys: &'a [String],
    /// Every run, in output order.
    pub runs: &'a [BatchRun],
    /// The input text the runs are made from (a scenario file's, or a
    /// description of a paper's experiments).
    pub scenario: String,
    /// The overrides of every run.
    pub sets: Vec<String>,
}

/// What [`execute_batch`] did.
pub struct BatchDone {
    /// Each run's metrics, in the batch's order, every run with every
    /// metric any run reported.
    pub results: Vec<Metrics>,
    /// Runs simulated now.
    pub ran: usize,
    /// Runs taken from the results file.
    pub skipped: usize,
}

/// Runs a batch with `jobs` runs at a time (`run(i)` makes run `i`'s
/// metrics; `describe(i)` names it in a message), appending each run's
/// rows to `out` as it finishes and skipping runs `out` already holds;
/// then rewrites `out` in the batch's order, every run with every metric
/// any run reported (absent counts and rates 0, other absent values
/// null). Its bytes depend neither on `jobs` nor on resumptions.
pub fn execute_batch(
    batch: &Batch,
    cal: &Calibration,
    out: &Path,
    jobs: usize,
    run: &(dyn Fn(usize) -> Result<Metrics, String> + Sync),
    describe: &dyn Fn(usize) -> String,
    progress: &mut dyn FnMut(Event),
) -> Result<BatchDone, String> {
    let format = Format::of(out)?;
    let table = Table {
        keys: batch.keys,
        format,
    };
    let run_key = |r: &BatchRun| -> RunKey { (r.values.clone(), r.scheme.clone(), r.seed) };
    let origin = out.display().to_string();
    // The results file is read back to resume, appended to and rewritten
    // in plan order: only a regular file (or none yet) can be. A FIFO's
    // resume read waited forever for a writer.
    for p in [out.to_path_buf(), inputs_path(out)] {
        match std::fs::metadata(&p) {
            Ok(m) if !m.is_file() => {
                return Err(format!(
                    "{}: not a regular file (a sweep re-reads its results to resume and rewrites them in plan order): give a file path, then read it from there",
                    p.display()
                ))
            }
            _ => {}
        }
    }
    let existing = match std::fs::read(out) {
        Ok(b) => {
            let text = String::from_utf8(b)
                .map_err(|_| format!("{origin}: not UTF-8 text: not a results file"))?;
            table.read(&text, &origin)?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("cannot read {origin}: {e}")),
    };
    let index: HashMap<RunKey, usize> = batch
        .runs
        .iter()
        .enumerate()
        .map(|(i, r)| (run_key(r), i))
        .collect();
    let mut results: Vec<Option<Metrics>> = vec![None; batch.runs.len()];
    for (key, m) in existing {
        let Some(&i) = index.get(&key) else {
            let (values, scheme, seed) = &key;
            let mut what: Vec<String> = batch
                .keys
                .iter()
                .zip(values)
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            what.push(format!("scheme={scheme}"));
            return Err(format!(
                "{origin} holds a run this sweep does not include ({}, seed {seed}): \
                 give another --out, or a grid that includes it",
                what.join(", ")
            ));
        };
        results[i] = Some(m);
    }
    let skipped = results.iter().filter(|r| r.is_some()).count();
    // The inputs the file's runs were made from must be this sweep's.
    let inputs = Inputs {
        scenario: batch.scenario.clone(),
        sets: batch.sets.clone(),
        calibration: toml::to_string(cal).map_err(|e| e.to_string())?,
        tool: crate::report::tool_version(),
    };
    let ipath = inputs_path(out);
    let iorigin = ipath.display().to_string();
    match std::fs::read(&ipath) {
        Ok(b) => {
            let old: Inputs = serde_json::from_slice(&b)
                .map_err(|e| format!("{iorigin}: {e} (not a sweep's record of its inputs)"))?;
            if skipped > 0 && old != inputs {
                let what = [
                    (old.scenario != inputs.scenario, "the scenario file"),
                    (old.sets != inputs.sets, "the --set overrides"),
                    (old.calibration != inputs.calibration, "the calibration"),
                ]
                .into_iter()
                .filter(|(d, _)| *d)
                .map(|(_, w)| w)
                .collect::<Vec<_>>()
                .join(", ");
                return Err(format!(
                    "{origin} holds runs made with other inputs ({what} changed since, per {iorigin}): \
                     give another --out, or the same inputs to resume"
                ));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if skipped > 0 {
                progress(Event::Note(format!(
                    "{origin} has runs but no {iorigin}: assuming they were made from this sweep's scenario, --set overrides and calibration"
                )));
            }
        }
        Err(e) => return Err(format!("cannot read {iorigin}: {e}")),
    }
    let record = serde_json::to_string_pretty(&inputs).map_err(|e| e.to_string())?;
    crate::report::write_file_atomically(&ipath, |w| w.write_all(record.as_bytes()))
        .map_err(|e| format!("cannot write {iorigin}: {e}"))?;
    let write_all = |results: &[Option<Metrics>]| -> Result<(), String> {
        crate::report::write_file_atomically(out, |w| {
            w.write_all(table.header().as_bytes())?;
            for (r, m) in batch.runs.iter().zip(results) {
                if let Some(m) = m {
                    w.write_all(
                        table
                            .rows(r.point, &r.values, &r.scheme, r.seed, m, false)
                            .as_bytes(),
                    )?;
                }
            }
            Ok(())
        })
        .map_err(|e| format!("cannot write {origin}: {e}"))
    };
    // The file as it stands (a run cut short dropped), ready to append to.
    write_all(&results)?;
    let todo: Vec<usize> = (0..batch.runs.len())
        .filter(|&i| results[i].is_none())
        .collect();
    progress(Event::Start {
        to_run: todo.len(),
        skipped,
    });
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(out)
        .map_err(|e| format!("cannot append to {origin}: {e}"))?;
    let mut failure: Option<(usize, String)> = None;
    {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let (tx, rx) = std::sync::mpsc::channel::<(usize, Result<Metrics, String>)>();
        std::thread::scope(|sc| {
            for _ in 0..jobs.clamp(1, todo.len().max(1)) {
                let tx = tx.clone();
                let (next, stop, todo) = (&next, &stop, &todo);
                sc.spawn(move || loop {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let k = next.fetch_add(1, Ordering::SeqCst);
                    let Some(&ti) = todo.get(k) else { break };
                    let r = run(ti);
                    if tx.send((ti, r)).is_err() {
                        break;
                    }
                });
            }
            drop(tx);
            for (ti, r) in rx {
                match r {
                    Ok(m) => {
                        let b = &batch.runs[ti];
                        let rows = table.rows(b.point, &b.values, &b.scheme, b.seed, &m, true);
                        // One write per run: only the last run can be cut.
                        if let Err(e) = file.write_all(rows.as_bytes()) {
                            stop.store(true, Ordering::SeqCst);
                            failure.get_or_insert((ti, format!("cannot append to {origin}: {e}")));
                        }
                        results[ti] = Some(m);
                        progress(Event::Done);
                    }
                    Err(e) => {
                        stop.store(true, Ordering::SeqCst);
                        let msg = format!("{}: {e}", describe(ti));
                        if failure.as_ref().is_none_or(|(i, _)| ti < *i) {
                            failure = Some((ti, msg));
                        }
                    }
                }
            }
        });
    }
    if let Some((_, e)) = failure {
        return Err(format!(
            "{e} (the runs that finished are in {origin}; run the sweep again to resume)"
        ));
    }
    // Every run has every metric any run reported.
    let names: BTreeSet<String> = results
        .iter()
        .flatten()
        .flat_map(|m| m.keys().cloned())
        .collect();
    for m in results.iter_mut().flatten() {
        for n in &names {
            m.entry(n.clone())
                .or_insert(if zero_when_absent(n) { Some(0.0) } else { None });
        }
    }
    write_all(&results)?;
    Ok(BatchDone {
        results: results.into_iter().map(|m| m.unwrap_or_default()).collect(),
        ran: todo.len(),
        skipped,
    })
}

/// Mean and Student-t confidence interval of `xs` (nulls left out):
/// (n, mean, sample std, half-width at `confidence`); std and the
/// interval need n ≥ 2.
pub fn student_t(xs: &[f64], confidence: f64) -> (usize, Option<f64>, Option<f64>, Option<f64>) {
    use statrs::distribution::{ContinuousCDF, StudentsT};
    let n = xs.len();
    if n == 0 {
        return (0, None, None, None);
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (n, Some(mean), None, None);
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64;
    let std = var.sqrt();
    let t = StudentsT::new(0.0, 1.0, (n - 1) as f64)
        .map(|d| d.inverse_cdf(1.0 - (1.0 - confidence) / 2.0))
        .ok();
    (
        n,
        Some(mean),
        Some(std),
        t.map(|t| t * std / (n as f64).sqrt()),
    )
}

/// The summary file's columns besides `point` and the grid keys.
pub const SUMMARY_COLUMNS: [&str; 8] = [
    "scheme", "metric", "n", "mean", "std", "ci_half", "ci_low", "ci_high",
];

/// Per point and metric, across seeds: `n` (seeds with a value), `mean`,
/// `std` (sample), and the 95% Student-t interval (`ci_half`, `ci_low`,
/// `ci_high`); the columns of the Python front end's `summarize`.
fn summarize(plan: &Plan, results: &[Option<Metrics>], format: Format) -> String {
    let mut by_point: Vec<BTreeMap<&str, Vec<f64>>> = vec![BTreeMap::new(); plan.points.len()];
    for (t, m) in plan.tasks.iter().zip(results) {
        for (k, v) in m.iter().flatten() {
            let e = by_point[t.point].entry(k.as_str()).or_default();
            if let Some(v) = v {
                e.push(*v);
            }
        }
    }
    let mut cols = vec!["point".to_string()];
    cols.extend(plan.keys.iter().cloned());
    cols.extend(SUMMARY_COLUMNS.map(String::from));
    let mut o = match format {
        Format::Csv => csv_line(&cols),
        Format::Jsonl => String::new(),
    };
    for (pi, metrics) in by_point.iter().enumerate() {
        let p = &plan.points[pi];
        for (name, xs) in metrics {
            let (n, mean, std, half) = student_t(xs, 0.95);
            let low = mean.zip(half).map(|(m, h)| m - h);
            let high = mean.zip(half).map(|(m, h)| m + h);
            let mut cells: Vec<(String, String)> = vec![("point".into(), pi.to_string())];
            let js = |x: &str| serde_json::Value::String(x.into()).to_string();
            for (k, v) in plan.keys.iter().zip(&p.values) {
                cells.push((k.clone(), v.clone()));
            }
            match format {
                Format::Csv => {
                    let mut row: Vec<String> = cells.into_iter().map(|(_, v)| v).collect();
                    row.extend([p.scheme.clone(), name.to_string(), n.to_string()]);
                    row.extend([mean, std, half, low, high].map(fmt_value));
                    o.push_str(&csv_line(&row));
                }
                Format::Jsonl => {
                    let num = |v: Option<f64>| {
                        v.map(|x| format!("{x:?}")).unwrap_or_else(|| "null".into())
                    };
                    o.push_str(&format!("{{\"point\":{pi}"));
                    for (k, v) in &cells[1..] {
                        o.push_str(&format!(",{}:{}", js(k), js(v)));
                    }
                    o.push_str(&format!(
                        ",\"scheme\":{},\"metric\":{},\"n\":{n},\"mean\":{},\"std\":{},\"ci_half\":{},\"ci_low\":{},\"ci_high\":{}}}\n",
                        js(&p.scheme),
                        js(name),
                        num(mean),
                        num(std),
                        num(half),
                        num(low),
                        num(high)
                    ));
                }
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_arguments_are_checked() {
        let a = Axis::parse("rate_pps=1e5, 2e5").unwrap();
        assert_eq!(a.key, "rate_pps");
        assert_eq!(a.values, ["1e5", "2e5"]);
        for (arg, needle) in [
            ("rate_pps", "key=v1"),
            ("=1,2", "empty key"),
            ("rate_pps=1,,2", "empty value"),
            ("rate_pps=1,1", "twice"),
            ("scheme=kvm,did", "--schemes"),
            ("seed=1,2", "--seeds"),
            ("metric=a", "column"),
        ] {
            let e = Axis::parse(arg).unwrap_err();
            assert!(e.contains(needle), "{arg}: {e}");
        }
    }

    #[test]
    fn absent_counts_are_zero_and_absent_means_null() {
        assert!(zero_when_absent("exits_per_s.HLT"));
        assert!(zero_when_absent("vm2.exits_per_s.HLT"));
        assert!(zero_when_absent("timer_exits.MSR_WRITE"));
        assert!(!zero_when_absent("timer_exit_us.MSR_WRITE"));
        assert!(!zero_when_absent("vmx.exits_per_s.HLT"));
        assert!(!zero_when_absent("udp.received"));
    }

    #[test]
    fn student_t_interval_matches_the_t_table() {
        // t(0.975, 4) = 2.776; xs has mean 3, std sqrt(2.5).
        let (n, m, s, h) = student_t(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.95);
        assert_eq!(n, 5);
        assert_eq!(m, Some(3.0));
        assert!((s.unwrap() - 2.5f64.sqrt()).abs() < 1e-12);
        let want = 2.7764451 * 2.5f64.sqrt() / 5f64.sqrt();
        assert!((h.unwrap() - want).abs() < 1e-5, "{h:?} vs {want}");
        assert_eq!(student_t(&[7.0], 0.95), (1, Some(7.0), None, None));
    }

    #[test]
    fn rows_read_back_as_written_and_a_cut_run_is_dropped() {
        let keys = vec!["rate_pps".to_string(), "guest.tick".to_string()];
        for format in [Format::Csv, Format::Jsonl] {
            let t = Table {
                keys: &keys,
                format,
            };
            let m: Metrics = [
                ("a".to_string(), Some(0.1 + 0.2)),
                ("b, \"q\"".to_string(), None),
                ("c".to_string(), Some(-1e-300)),
                ("violations".to_string(), Some(0.0)),
                ("z".to_string(), Some(1e300)),
            ]
            .into_iter()
            .collect();
            let vals = vec!["1e5".to_string(), "nohz-idle".to_string()];
            let mut text = t.header();
            text.push_str(&t.rows(0, &vals, "kvm", 1, &m, false));
            text.push_str(&t.rows(0, &vals, "kvm", 2, &m, true));
            let runs = t.read(&text, "r").unwrap();
            assert_eq!(runs.len(), 2, "{format:?}");
            assert_eq!(runs[0].0, (vals.clone(), "kvm".to_string(), 1));
            assert_eq!(runs[1].1, m);
            // Cut inside the last line: the second run is dropped.
            let cut = &text[..text.len() - 3];
            assert_eq!(t.read(cut, "r").unwrap().len(), 1, "{format:?}");
            // Cut after a whole line of the last run (journal order:
            // `violations` comes last): dropped too.
            let lines: Vec<&str> = text.split_inclusive('\n').collect();
            let cut = lines[..lines.len() - 1].concat();
            assert_eq!(t.read(&cut, "r").unwrap().len(), 1, "{format:?}");
            // Another sweep's file is refused.
            let other = Table {
                keys: &keys[..1],
                format,
            };
            let e = other.read(&text, "r").unwrap_err();
            assert!(e.contains("another sweep"), "{e}");
        }
    }
}
