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
/// for absent values.
pub fn reproduce_csv(rows: &[exitless::validation::Row]) -> Result<String, Failure> {
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
