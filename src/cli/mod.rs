//! Subcommands of the `exitless` binary beyond run / reproduce / explore:
//! `sweep`, `calibrate`, `keys`, `diff`, and the `--csv` output of `run` and
//! `reproduce`. `main.rs` only wires them in.

use crate::{emit, Failure};
use exitless::calibration::Calibration;
use exitless::report::RunReport;
use exitless::sweep::{self, Axis, Event};
use std::path::PathBuf;

/// `exitless sweep`.
#[derive(clap::Args)]
pub struct SweepArgs {
    /// Scenario TOML file.
    pub scenario: PathBuf,
    /// A grid axis: a scenario key (as for --set) and its values,
    /// comma-separated (repeatable; the points are the product of the
    /// grids and the schemes).
    #[arg(long = "grid", value_name = "KEY=V1,V2,...")]
    pub grids: Vec<String>,
    /// Schemes to run every grid point with (default: the scenario's).
    #[arg(long, value_delimiter = ',')]
    pub schemes: Vec<String>,
    /// Runs per point, with seeds BASE..BASE+N-1 (the same at every point).
    #[arg(long, default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub seeds: u64,
    /// Base seed (default: the scenario's `seed`).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Override applied to every point before the grid's (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Simulations in parallel, 1 to 1024 (default: available cores).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub jobs: Option<u64>,
    /// Results file, .csv or .jsonl (long form: point, grid keys, scheme,
    /// seed, metric, value). Runs it already holds are not run again.
    #[arg(long)]
    pub out: PathBuf,
}

/// `exitless calibrate`.
#[derive(clap::Args)]
pub struct CalibrateArgs {
    /// A `perf kvm stat report` text (or `exitless run` output).
    #[arg(long)]
    pub from: PathBuf,
    /// Write the overlay here (default: stdout).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `exitless keys`.
#[derive(clap::Args)]
pub struct KeysArgs {
    /// JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

fn threads(n: Option<u64>) -> usize {
    n.map(|t| t as usize).unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

/// Runs a sweep; `show`: a progress bar on stderr.
/// `calibration`: the `--calibration` file, an input `--out` must not be.
pub fn sweep_cmd(
    a: SweepArgs,
    cal: &Calibration,
    calibration: Option<&std::path::Path>,
    quiet: bool,
    show: bool,
) -> Result<(), Failure> {
    let axes = a
        .grids
        .iter()
        .map(|g| Axis::parse(g))
        .collect::<Result<Vec<_>, _>>()?;
    let mut inputs = vec![("the scenario file", a.scenario.as_path())];
    if let Some(c) = calibration {
        inputs.push(("the calibration file", c));
    }
    exitless::report::refuse_overwriting_input("--out", &a.out, &inputs)?;
    let plan = sweep::plan(&a.scenario, &a.sets, &axes, &a.schemes, a.seeds, a.seed)?;
    for w in &plan.warnings {
        crate::note!("exitless: warning: {w}\n");
    }
    let bar = if show {
        indicatif::ProgressBar::new(0)
    } else {
        indicatif::ProgressBar::hidden()
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "  sweep [{bar:30}] {pos}/{len} runs, {elapsed} elapsed, ~{eta} left",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    let t0 = std::time::Instant::now();
    let outcome = sweep::execute(&plan, cal, &a.out, threads(a.jobs), &mut |e| match e {
        Event::Start { to_run, skipped } => {
            if skipped > 0 && !quiet {
                bar.suspend(|| {
                    crate::note!(
                        "sweep: {skipped} of {} runs already in {}; running the other {to_run}\n",
                        plan.tasks.len(),
                        a.out.display()
                    )
                });
            }
            bar.set_length(to_run as u64);
        }
        Event::Done => bar.inc(1),
        Event::Note(n) => bar.suspend(|| crate::note!("exitless: warning: {n}\n")),
    });
    bar.finish_and_clear();
    let o = outcome?;
    if !quiet {
        crate::note!(
            "sweep: {} points × {} seeds: {} runs in {:.2} s wall ({} taken from the file); results in {}{}\n",
            plan.points.len(),
            plan.seeds,
            o.ran,
            t0.elapsed().as_secs_f64(),
            o.skipped,
            a.out.display(),
            o.summary
                .as_ref()
                .map(|p| format!(", mean and 95% CI across seeds in {}", p.display()))
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// One CSV line (quoted as needed).
fn csv_record(w: &mut csv::Writer<Vec<u8>>, cells: &[String]) -> Result<(), Failure> {
    w.write_record(cells)
        .map_err(|e| Failure::Input(e.to_string()))
}

fn csv_text(w: csv::Writer<Vec<u8>>) -> Result<String, Failure> {
    let b = w.into_inner().map_err(|e| Failure::Input(e.to_string()))?;
    String::from_utf8(b).map_err(|e| Failure::Input(e.to_string()))
}

fn csv_writer() -> csv::Writer<Vec<u8>> {
    csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new())
}

/// `run --csv`: `scheme,seed,metric,value`, one row per metric, the
/// names and values a sweep writes (empty value: not computable).
pub fn run_csv(rep: &RunReport) -> Result<String, Failure> {
    let m = sweep::flatten(rep)?;
    let mut w = csv_writer();
    csv_record(
        &mut w,
        &["scheme", "seed", "metric", "value"].map(String::from),
    )?;
    for (k, v) in m {
        csv_record(
            &mut w,
            &[
                rep.scheme.clone(),
                rep.seed.to_string(),
                k,
                v.map(|x| x.to_string()).unwrap_or_default(),
            ],
        )?;
    }
    csv_text(w)
}

/// `reproduce --csv`: the `--json` rows' fields as columns; `params` as
/// `key=value` pairs joined by `;`, the tolerance as two plain columns
/// (`tolerance_kind`: rel, abs, max or min; `tolerance_value`: the
/// relative fraction or absolute amount, empty for max/min), empty cells
/// for absent values; `kind` (value, effect, bound, structural) and
/// `calibrated_to` after them. The headline table comes first, one record
/// per claim with experiment `headline`, config `<system> vs <baseline>`,
/// the two effects as model and paper (unit `% change` or `points`),
/// tolerance kind `rule`, `within` true when the verdict is "reproduced",
/// the verdict and the claim as its note, and kind `headline`.
pub fn reproduce_csv(
    rows: &[exitless::validation::Row],
    headlines: &[exitless::validation::headline::HeadlineRow],
) -> Result<String, Failure> {
    // With `--seeds N`, the spread's columns after the others.
    const SPREAD_COLUMNS: [&str; 6] = ["seeds", "std", "ci_half", "min", "max", "within_seeds"];
    let seeded = rows.iter().any(|r| r.spread.is_some());
    let mut w = csv_writer();
    csv_record(
        &mut w,
        &[
            "experiment",
            "config",
            "params",
            "metric",
            "unit",
            "model",
            "paper",
            "tolerance_kind",
            "tolerance_value",
            "within",
            "violations",
            "note",
            "kind",
            "calibrated_to",
        ]
        .map(String::from)
        .into_iter()
        .chain(
            SPREAD_COLUMNS
                .iter()
                .filter(|_| seeded)
                .map(|c| c.to_string()),
        )
        .collect::<Vec<_>>(),
    )?;
    let params_cell = |p: &std::collections::BTreeMap<String, serde_json::Value>| {
        p.iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => format!("{k}={s}"),
                v => format!("{k}={v}"),
            })
            .collect::<Vec<_>>()
            .join(";")
    };
    for h in headlines {
        use exitless::validation::headline::{EffectUnit, Verdict};
        let opt = |x: Option<f64>| x.map(|x| x.to_string()).unwrap_or_default();
        csv_record(
            &mut w,
            &[
                "headline".to_string(),
                format!("{} vs {}", h.system, h.baseline),
                params_cell(&h.params),
                h.metric.clone(),
                match h.effect_unit {
                    EffectUnit::PercentChange => "% change",
                    EffectUnit::Points => "points",
                }
                .to_string(),
                opt(h.model_effect),
                opt(h.paper_effect),
                "rule".to_string(),
                String::new(),
                match h.verdict {
                    Verdict::NoNumber | Verdict::NotRun => String::new(),
                    v => (v == Verdict::Reproduced).to_string(),
                },
                String::new(),
                format!("{}: {} [{}]", h.verdict.name(), h.claim, h.id),
                "headline".to_string(),
                String::new(),
            ]
            .into_iter()
            .chain(std::iter::repeat_n(
                String::new(),
                if seeded { SPREAD_COLUMNS.len() } else { 0 },
            ))
            .collect::<Vec<_>>(),
        )?;
    }
    for r in rows {
        let params: Vec<String> = r
            .params
            .iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => format!("{k}={s}"),
                v => format!("{k}={v}"),
            })
            .collect();
        use exitless::validation::Tolerance;
        let (tol_kind, tol_value) = match r.tolerance {
            Some(Tolerance::Rel(x)) => ("rel", x.to_string()),
            Some(Tolerance::Abs(x)) => ("abs", x.to_string()),
            Some(Tolerance::Max) => ("max", String::new()),
            Some(Tolerance::Min) => ("min", String::new()),
            None => ("", String::new()),
        };
        let spread: Vec<String> = match (&r.spread, seeded) {
            (Some(sp), _) => vec![
                sp.seeds.to_string(),
                sp.std.to_string(),
                sp.ci_half.to_string(),
                sp.min.to_string(),
                sp.max.to_string(),
                sp.within_seeds.map(|k| k.to_string()).unwrap_or_default(),
            ],
            (None, true) => vec![String::new(); SPREAD_COLUMNS.len()],
            (None, false) => Vec::new(),
        };
        csv_record(
            &mut w,
            &[
                r.experiment.clone(),
                r.config.clone(),
                params.join(";"),
                r.metric.clone(),
                r.unit.clone(),
                r.model.to_string(),
                r.paper.map(|x| x.to_string()).unwrap_or_default(),
                tol_kind.to_string(),
                tol_value,
                r.within.map(|b| b.to_string()).unwrap_or_default(),
                r.violations.to_string(),
                r.note.clone().unwrap_or_default(),
                r.kind
                    .map(|k| {
                        serde_json::to_value(k)
                            .ok()
                            .and_then(|v| v.as_str().map(String::from))
                            .unwrap_or_default()
                    })
                    .unwrap_or_default(),
                r.calibrated_to.clone().unwrap_or_default(),
            ]
            .into_iter()
            .chain(spread)
            .collect::<Vec<_>>(),
        )?;
    }
    csv_text(w)
}

/// `exitless calibrate --from FILE [--out OVERLAY]`.
pub fn calibrate_cmd(a: CalibrateArgs, quiet: bool) -> Result<(), Failure> {
    use exitless::perf_kvm_stat as pks;
    let input = a.from.display().to_string();
    let text =
        exitless::scenario::read_input(&a.from).map_err(|e| format!("cannot read {input}: {e}"))?;
    let rows = pks::parse(&text).map_err(|e| format!("{input}: {e}"))?;
    let c = pks::calibrate(&rows, &input);
    for r in &c.unmapped {
        crate::note!(
            "exitless: calibrate: {input}: {} ({} samples, avg {} us) has no calibration key; not in the overlay\n",
            r.reason,
            r.samples,
            r.avg_us
        );
    }
    for r in &c.blocking {
        crate::note!(
            "exitless: calibrate: {input}: {} (avg {} us over {} samples) is not a service time: perf times it up to the next entry, so it includes the halted period; not in the overlay (the handler's own cost stays the calibration's)\n",
            r.reason,
            r.avg_us,
            r.samples
        );
    }
    for r in &c.empty {
        crate::note!("exitless: calibrate: {input}: {r} has no samples; not in the overlay\n");
    }
    if c.entries.is_empty() {
        return Err(Failure::Input(format!(
            "{input}: no exit reason with a calibration key (known: EXTERNAL_INTERRUPT, MSR_WRITE, IO_INSTRUCTION, EPT_VIOLATION, PENDING_INTERRUPT, EXCEPTION_NMI; HLT's perf time includes the halted period and is never taken)"
        )));
    }
    for r in &rows {
        let keys = pks::calibration_keys(&r.reason);
        if keys.len() > 1 && r.samples > 0 && !quiet {
            crate::note!(
                "exitless: calibrate: {}: perf does not split it; its mean sets {}\n",
                r.reason,
                keys.join(", ")
            );
        }
    }
    // The overlay must layer over the shipped calibration (ranges).
    exitless::calibration_overlay::apply(&c.entries).map_err(|e| format!("{input}: {e}"))?;
    let toml = pks::to_toml(&c.entries, &input);
    match &a.out {
        Some(p) => {
            exitless::report::refuse_overwriting_input(
                "--out",
                p,
                &[("the --from file", a.from.as_path())],
            )?;
            exitless::report::write_file_atomically(p, |w| w.write_all(toml.as_bytes())).map_err(
                |e| {
                    let shown = p.display().to_string();
                    format!(
                        "cannot write {}: {e}",
                        exitless::scenario::overrides::shown(&shown)
                    )
                },
            )?;
            if !quiet {
                crate::note!(
                    "calibrate: {} entries to {} (use it with --calibration {})\n",
                    c.entries.len(),
                    p.display(),
                    p.display()
                );
            }
        }
        None => emit(&toml)?,
    }
    Ok(())
}

/// `exitless keys [--json]`.
pub fn keys_cmd(a: KeysArgs) -> Result<(), Failure> {
    let ks = exitless::keys::keys();
    if a.json {
        let j = serde_json::to_string_pretty(&ks).map_err(|e| Failure::Input(e.to_string()))?;
        emit(&format!("{j}\n"))
    } else {
        emit(&exitless::keys::to_text(&ks))
    }
}

/// `exitless diff`.
#[derive(clap::Args)]
pub struct DiffArgs {
    /// The first output (`run --json` or `reproduce --json`).
    pub a: PathBuf,
    /// The second output, of the same kind.
    pub b: PathBuf,
    /// Values within this relative difference count as equal (0.01: 1%).
    #[arg(long, default_value_t = 0.0)]
    pub tolerance: f64,
}

/// Widest `diff` name column, in characters.
const MAX_NAME_COLUMN: usize = 120;

/// `exitless diff A B`: the names whose values differ, with both values and
/// the change; exit status 0 if none, 1 if some (as diff(1)), 2 on bad
/// input.
pub fn diff_cmd(a: DiffArgs) -> Result<std::process::ExitCode, Failure> {
    use exitless::report::diff;
    if !(a.tolerance.is_finite() && a.tolerance >= 0.0) {
        return Err(Failure::Input(format!(
            "--tolerance {}: a relative difference, 0 or more",
            a.tolerance
        )));
    }
    let load = |p: &PathBuf| -> Result<_, Failure> {
        let text = exitless::scenario::read_input(p)
            .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: not JSON ({e})", p.display()))?;
        Ok(diff::flatten(&v).map_err(|e| format!("{}: {e}", p.display()))?)
    };
    let (x, y) = (load(&a.a)?, load(&a.b)?);
    let rows = diff::compare(&x, &y, a.tolerance);
    let show = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v}"));
    // A column no wider than a screen: a longer name (a hostile JSON's
    // 65,536-character key panicked the formatter's width) overflows its
    // column instead.
    let width = rows
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, MAX_NAME_COLUMN);
    let mut o = String::new();
    if !rows.is_empty() {
        o += &format!(
            "{:<width$}  {:>16}  {:>16}  {:>9}\n",
            "name", "A", "B", "change"
        );
    }
    for r in &rows {
        let change = r
            .change_pct()
            .map_or_else(|| "-".to_string(), |c| format!("{c:+.2}%"));
        o += &format!(
            "{:<width$}  {:>16}  {:>16}  {:>9}\n",
            r.name,
            show(r.a),
            show(r.b),
            change
        );
    }
    o += &format!(
        "{} of {} values differ{}\n",
        rows.len(),
        x.len().max(y.len()),
        if a.tolerance > 0.0 {
            format!(" by more than {}%", a.tolerance * 100.0)
        } else {
            String::new()
        }
    );
    emit(&o)?;
    Ok(if rows.is_empty() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(1)
    })
}

// ---- calibration listing, sensitivity analyses and their provenance
// (issue 37) ----

/// `exitless calibration`.
#[derive(clap::Args)]
pub struct CalibrationArgs {
    /// JSON: every entry with its file, value, source and kind, and the
    /// counts by kind per file.
    #[arg(long, conflicts_with = "markdown")]
    pub json: bool,
    /// Markdown: one table per file (docs/calibration-sources.md's).
    #[arg(long)]
    pub markdown: bool,
}

/// `exitless calibration [--json | --markdown]`: every entry of both
/// calibration files (x86 and ARM), each file headed by its counts by
/// source kind.
pub fn calibration_cmd(a: CalibrationArgs, cal: &Calibration) -> Result<(), Failure> {
    use exitless::sensitivity::{self as sens, CalEntry};
    let mut all = sens::calibration_entries(cal);
    all.extend(sens::preset_entries());
    let files = ["x86", "arm", "riscv", "x86-spr", "x86-zen4"];
    let of = |f: &str| -> Vec<&CalEntry> { all.iter().filter(|e| e.file == f).collect() };
    let counts = |es: &[&CalEntry]| {
        sens::counts_by_kind(es)
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if a.json {
        let v = serde_json::json!({
            "files": files.iter().map(|f| {
                let es = of(f);
                serde_json::json!({
                    "file": sens::file_name(f),
                    "entries": es.len(),
                    "by_kind": sens::counts_by_kind(&es).into_iter().collect::<std::collections::BTreeMap<_, _>>(),
                })
            }).collect::<Vec<_>>(),
            "entries": all,
        });
        let j = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
        return emit(&format!("{j}\n"));
    }
    let mut text = String::new();
    for f in files {
        let es = of(f);
        if a.markdown {
            text.push_str(&format!(
                "### `{}`\n\n{} entries: {}.\n\n| entry | value | clock | kind | source |\n|---|---:|---|---|---|\n",
                sens::file_name(f),
                es.len(),
                counts(&es)
            ));
            for e in &es {
                let clock = match (e.at_ghz, e.wall) {
                    (Some(g), _) => format!("at {g} GHz"),
                    (None, true) => "wall".into(),
                    _ => String::new(),
                };
                text.push_str(&format!(
                    "| `{}` | {} | {clock} | {} | {} |\n",
                    e.key,
                    e.value,
                    e.kind,
                    e.source.replace('|', "\\|").replace('\n', " ")
                ));
            }
            text.push('\n');
        } else {
            text.push_str(&format!(
                "{} ({} entries: {})\n",
                sens::file_name(f),
                es.len(),
                counts(&es)
            ));
            for e in &es {
                text.push_str(&format!("{:<42} {:>10}  {}\n", e.key, e.value, e.source));
            }
            text.push('\n');
        }
    }
    text.pop();
    emit(&text)
}

/// `exitless sensitivity`.
#[derive(clap::Args)]
pub struct SensitivityArgs {
    /// Scenario TOML file (or --paper).
    #[arg(required_unless_present = "paper", conflicts_with = "paper")]
    pub scenario: Option<PathBuf>,
    /// A paper's experiments instead (validation/<paper>/): one output per
    /// `reproduce` row.
    #[arg(long)]
    pub paper: Option<String>,
    /// With --paper: only experiments whose id contains this.
    #[arg(long, requires = "paper")]
    pub only: Option<String>,
    /// Override applied to every run (e.g. duration_s=0.2).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Entries to vary: keys or globs, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub entries: Vec<String>,
    /// Factors each entry is varied by (default 0.5,2).
    #[arg(long, value_delimiter = ',')]
    pub factors: Vec<f64>,
    /// Simulations in parallel, 1 to 1024 (default: available cores).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub jobs: Option<u64>,
    /// Results file of the runs, .csv or .jsonl (a sweep's long form with
    /// `entry` and `factor` columns); resumable. Default: beside the
    /// cached analysis (`<scenario>.sensitivity.runs.jsonl`, or
    /// `validation/<paper>/sensitivity/<only>.runs.jsonl`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print JSON (the whole analysis) instead of text.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print CSV (output, rank, entry, kind, factor, value, output, change).
    #[arg(long)]
    pub csv: bool,
    /// Also write an HTML report with a tornado chart per output.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Entries shown per output in text and HTML.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// Only outputs matching these globs in text, CSV and HTML.
    #[arg(long, value_delimiter = ',')]
    pub outputs: Vec<String>,
    /// Do not write the cached analysis that `run --json` and
    /// `reproduce --json` read.
    #[arg(long)]
    pub no_cache: bool,
}

/// `exitless sensitivity`: runs the plan on the sweep machinery, prints
/// the ranked tables, writes the cache.
pub fn sensitivity_cmd(
    a: SensitivityArgs,
    cal: &Calibration,
    quiet: bool,
    show: bool,
) -> Result<(), Failure> {
    use exitless::sensitivity as sens;
    let (target, cache) = match (&a.scenario, &a.paper) {
        (Some(p), _) => (sens::Target::scenario(p, &a.sets)?, sens::scenario_cache(p)),
        (None, Some(paper)) => (
            sens::Target::Paper {
                paper: paper.clone(),
                only: a.only.clone(),
            },
            sens::paper_cache(paper, a.only.as_deref()),
        ),
        (None, None) => return Err(Failure::Input("give a scenario or --paper".into())),
    };
    let plan = sens::plan(
        target,
        &a.sets,
        exitless::validation::Seeds::default(),
        cal,
        &a.entries,
        &a.factors,
    )?;
    let out = a.out.clone().unwrap_or_else(|| {
        let stem = cache
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        cache.with_file_name(format!("{stem}.runs.jsonl"))
    });
    if let Some(d) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    let bar = if show {
        indicatif::ProgressBar::new(0)
    } else {
        indicatif::ProgressBar::hidden()
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "  sensitivity [{bar:30}] {pos}/{len} runs, {elapsed} elapsed, ~{eta} left",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    let t0 = std::time::Instant::now();
    let r = sens::execute(&plan, cal, &out, threads(a.jobs), &mut |e| match e {
        Event::Start { to_run, .. } => bar.set_length(to_run as u64),
        Event::Done => bar.inc(1),
        Event::Note(n) => bar.suspend(|| crate::note!("exitless: warning: {n}\n")),
    });
    bar.finish_and_clear();
    let (analysis, done) = r?;
    if !a.no_cache {
        if let Some(d) = cache.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(d)
                .map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        }
        let j = serde_json::to_string_pretty(&analysis).map_err(|e| e.to_string())?;
        exitless::report::write_file_atomically(&cache, |w| {
            w.write_all(format!("{j}\n").as_bytes())
        })
        .map_err(|e| format!("cannot write {}: {e}", cache.display()))?;
    }
    if let Some(h) = &a.html {
        let page = sens::to_html(&analysis, a.top, &a.outputs);
        exitless::report::write_file_atomically(h, |w| w.write_all(page.as_bytes()))
            .map_err(|e| format!("cannot write {}: {e}", h.display()))?;
    }
    if !quiet {
        crate::note!(
            "sensitivity: {} entries × {} factors ({} skipped without a run): {} runs in {:.1} s wall ({} taken from {}){}\n",
            analysis.varied,
            analysis.factors.len(),
            analysis.skipped.len(),
            done.ran,
            t0.elapsed().as_secs_f64(),
            done.skipped,
            out.display(),
            if a.no_cache {
                String::new()
            } else {
                format!("; cached for run/reproduce --json in {}", cache.display())
            }
        );
    }
    if a.json {
        let j = serde_json::to_string_pretty(&analysis).map_err(|e| e.to_string())?;
        emit(&format!("{j}\n"))
    } else if a.csv {
        emit(&sens::to_csv(&analysis, &a.outputs))
    } else {
        emit(&sens::to_text(&analysis, a.top, &a.outputs))
    }
}

/// `run --json`: the report, and, when a cached analysis of this scenario
/// on this calibration and overrides exists
/// (`<scenario>.sensitivity.json`), per metric the entries it is most
/// sensitive to (`sensitivity`). Without one, the report as it always was.
pub fn run_json(
    rep: &RunReport,
    scenario: &std::path::Path,
    sets: &[String],
    cal: &Calibration,
) -> Result<String, Failure> {
    use exitless::sensitivity as sens;
    let prov = sens::cached_provenance(&[sens::scenario_cache(scenario)], cal, sets);
    let j = if prov.is_empty() {
        serde_json::to_string_pretty(rep)
    } else {
        #[derive(serde::Serialize)]
        struct WithProvenance<'a> {
            #[serde(flatten)]
            report: &'a RunReport,
            sensitivity: &'a std::collections::BTreeMap<String, sens::Provenance>,
        }
        serde_json::to_string_pretty(&WithProvenance {
            report: rep,
            sensitivity: &prov,
        })
    }
    .map_err(|e| e.to_string())?;
    Ok(format!("{j}\n"))
}

/// `reproduce --json`: the rows, each with the entries it is most
/// sensitive to when a cached analysis of the paper on this calibration
/// and overrides has it (`validation/<paper>/sensitivity/*.json`).
/// Without one, the rows as they always were.
pub fn reproduce_json(
    paper: &str,
    rows: &[exitless::validation::Row],
    headlines: &[exitless::validation::headline::HeadlineRow],
    sets: &[String],
    cal: &Calibration,
) -> Result<String, Failure> {
    use exitless::sensitivity as sens;
    let prov = sens::cached_provenance(&sens::paper_cache_files(paper), cal, sets);
    let j = if prov.is_empty() {
        serde_json::to_string_pretty(&exitless::report::ReproduceOutput {
            schema_version: exitless::report::SCHEMA_VERSION,
            tool: exitless::report::tool_version(),
            paper,
            headlines,
            rows,
        })
    } else {
        #[derive(serde::Serialize)]
        struct RowOut<'a> {
            #[serde(flatten)]
            row: &'a exitless::validation::Row,
            #[serde(skip_serializing_if = "Option::is_none")]
            sensitivity: Option<&'a sens::Provenance>,
        }
        let out: Vec<RowOut> = rows
            .iter()
            .map(|r| RowOut {
                row: r,
                sensitivity: prov.get(&sens::row_name(r)),
            })
            .collect();
        // The headlines carry theirs beside the table, by id.
        let by_headline: std::collections::BTreeMap<&str, &sens::Provenance> = headlines
            .iter()
            .filter_map(|h| {
                prov.get(&sens::headline_effect(&h.id))
                    .map(|p| (h.id.as_str(), p))
            })
            .collect();
        #[derive(serde::Serialize)]
        struct WithHeadlines<'a, R: serde::Serialize> {
            #[serde(flatten)]
            out: exitless::report::ReproduceOutput<'a, R>,
            #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
            headline_sensitivity: std::collections::BTreeMap<&'a str, &'a sens::Provenance>,
        }
        serde_json::to_string_pretty(&WithHeadlines {
            out: exitless::report::ReproduceOutput {
                schema_version: exitless::report::SCHEMA_VERSION,
                tool: exitless::report::tool_version(),
                paper,
                headlines,
                rows: &out,
            },
            headline_sensitivity: by_headline,
        })
    }
    .map_err(|e| e.to_string())?;
    Ok(format!("{j}\n"))
}
