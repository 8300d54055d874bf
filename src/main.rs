//! The `exitless` command line.

use clap::{Parser, Subcommand};
use exitless::calibration::Calibration;
use exitless::scenario::Scenario;
use exitless::validation;
use exitless::world::World;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "exitless",
    version,
    about = "Discrete-event virtual platform for exitless VM interrupt delivery"
)]
struct Cli {
    /// Calibration overlay file, layered over the shipped
    /// calibration/x86-did-host.toml: entries it leaves out keep the
    /// shipped values (a whole calibration file is an overlay too).
    #[arg(long, global = true)]
    calibration: Option<PathBuf>,
    /// Set one calibration entry, after --calibration (repeatable), e.g.
    /// exit.msr_write_eoi_us=1.2.
    #[arg(
        long = "calibration-set",
        global = true,
        value_name = "SECTION.NAME=VALUE"
    )]
    calibration_sets: Vec<String>,
    /// No progress on stderr.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one scenario and print a perf-kvm-stat-style report.
    Run {
        /// Scenario TOML file.
        scenario: PathBuf,
        /// Override a scenario key (dotted path, or rate_pps / iterations / interval_us).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// Print JSON instead of text.
        #[arg(long, conflicts_with = "csv")]
        json: bool,
        /// Print the metrics as CSV rows (scheme,seed,metric,value; the
        /// names a sweep writes) instead of text.
        #[arg(long)]
        csv: bool,
        /// Exit with status 3 if the invariant checker found violations.
        #[arg(long)]
        fail_on_violation: bool,
        /// Text report: each VM's exit table for its vCPU N (index in the
        /// VM), as `perf kvm stat report --vcpu N` shows. JSON lists every
        /// vCPU of an SMP guest under `per_vcpu`.
        #[arg(long, value_name = "N")]
        vcpu: Option<usize>,
        /// Write a Chrome trace-event / Perfetto JSON timeline to this
        /// file: a track per core (guest, exits and schedule-ins named by
        /// VM and vCPU, with the exit qualification; deliveries, EOIs, a
        /// run-queue counter), per host thread (vCPU threads, burners,
        /// vhost workers) and per VM's device interrupts (raises, a pending
        /// counter), with flow arrows raise -> delivery -> EOI.
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        /// Trace window START_MS:LENGTH_MS, from the end of the warm-up.
        #[arg(long, value_name = "START_MS:LENGTH_MS", default_value = "0:10")]
        trace_window: String,
        /// Most trace events kept (later ones are counted as dropped), at
        /// most 10,000,000 (about 1 GB of JSON).
        #[arg(long, value_name = "N", default_value_t = 1_000_000,
              value_parser = clap::value_parser!(u64).range(1..=MAX_TRACE_EVENTS))]
        trace_limit: u64,
    },
    /// Run a paper's experiments from validation/<paper>/ and compare with the published values.
    Reproduce {
        /// Paper (its experiments are validation/<paper>/experiments.toml).
        #[arg(value_parser = PaperName)]
        paper: String,
        /// Print JSON rows instead of a table.
        #[arg(long, conflicts_with = "csv")]
        json: bool,
        /// Print the rows as CSV instead of a table.
        #[arg(long)]
        csv: bool,
        /// Print the published comparisons as a Markdown table (the rows
        /// with a paper value, their notes and the count within tolerance),
        /// as docs/results.md holds them.
        #[arg(long, conflicts_with_all = ["json", "csv"])]
        markdown: bool,
        /// Only experiments whose id contains this.
        #[arg(long)]
        only: Option<String>,
        /// Override applied to every run (e.g. duration_s=0.2 for a quick look).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// Simulations in parallel, 1 to 1024 (default: available cores).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
        threads: Option<u64>,
        /// Run every job with N seeds (BASE..BASE+N-1) and report each
        /// row's mean, judged against its tolerance, with its spread (std,
        /// 95% CI, min, max, seeds within tolerance). Default: each
        /// experiment's `seeds` (1 unless its file says more).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
        seeds: Option<u64>,
        /// First seed for every job (default: each scenario's `seed`).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// List the delivery schemes.
    Schemes,
    /// List every calibration entry of both files (x86 and ARM) with its
    /// value and source, each file headed by its counts by source kind.
    Calibration(cli::CalibrationArgs),
    /// Race explorer: run a small scenario under many perturbed event
    /// orders (tie-breaks, in-flight jitter) and print a minimal
    /// counterexample trace for the first interleaving the invariant
    /// checker rejects. Exit status 3 if one is found.
    Explore(ExploreArgs),
    /// Run a scenario over grids of key values × schemes × seeds on local
    /// threads; long-form rows (point, grid keys, scheme, seed, metric,
    /// value) to a .csv or .jsonl file, resumable; with several seeds,
    /// mean and 95% Student-t CI to <out>.summary.<ext>.
    Sweep(cli::SweepArgs),
    /// Make a calibration overlay from a `perf kvm stat report` text: the
    /// exit service time (Avg time) of each VM-EXIT reason.
    Calibrate(cli::CalibrateArgs),
    /// List every scenario key with its type, default and documentation.
    Keys(cli::KeysArgs),
    /// Compare two `run --json` reports or two `reproduce --json` outputs
    /// metric by metric; exit status 1 when they differ (as diff(1)).
    Diff(cli::DiffArgs),
    /// Vary each calibration entry by ×0.5 and ×2 (one at a time), rerun a
    /// scenario or a paper's experiments, and rank per output the entries
    /// that move it most (text, --json, --csv, --html tornado charts).
    Sensitivity(cli::SensitivityArgs),
}

#[derive(clap::Args)]
struct ExploreArgs {
    /// Scenario TOML file (keep it small: a few ms simulated).
    scenario: PathBuf,
    /// Override a scenario key, as for `run`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Explore each of these schemes in turn (comma-separated; default:
    /// the scenario's).
    #[arg(long, value_delimiter = ',')]
    schemes: Vec<String>,
    /// Interleavings (perturbed runs) per scheme, 1 to 10,000,000.
    #[arg(long, default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(1..=MAX_EXPLORE_RUNS))]
    runs: u64,
    /// Largest extra latency of a message in flight (MSI, IPI, the host's
    /// schedule-out/in), ns.
    #[arg(long, default_value_t = 3000.0)]
    jitter_ns: f64,
    /// Keep same-time ties in scheduling order (perturb only latencies).
    #[arg(long)]
    fifo_ties: bool,
    /// Replay one perturbation seed and print its trace instead of exploring.
    #[arg(long, value_name = "SEED")]
    replay: Option<u64>,
    /// Simulations in parallel, 1 to 1024 (default: available cores).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1024))]
    threads: Option<u64>,
}

/// `reproduce`'s paper: a name of the registry (`validation::PAPERS`,
/// which `--help` lists), or of the user's own validation root
/// (`$EXITLESS_VALIDATION`); never a path.
#[derive(Clone)]
struct PaperName;

impl clap::builder::TypedValueParser for PaperName {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let v = value.to_string_lossy();
        if validation::known_paper(&v) {
            return Ok(v.into_owned());
        }
        let names: Vec<&str> = validation::paper_names().collect();
        Err(clap::Error::raw(
            clap::error::ErrorKind::InvalidValue,
            format!(
                "unknown paper `{}`: the papers are {}\n",
                exitless::scenario::overrides::shown(&v),
                names.join(", ")
            ),
        )
        .with_cmd(cmd))
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(
            validation::paper_names().map(clap::builder::PossibleValue::new),
        ))
    }
}

/// Most interleavings `explore --runs` takes per scheme: at a few ms of
/// wall each, about a day on one core; more is a typo, not a plan.
const MAX_EXPLORE_RUNS: u64 = 10_000_000;

/// Largest `--trace-limit`: the events are kept in memory and then
/// written as ~100 bytes of JSON each.
const MAX_TRACE_EVENTS: u64 = 10_000_000;

/// `START_MS:LENGTH_MS` → (start, length) in ps.
fn parse_window(w: &str) -> Result<(exitless::engine::Time, exitless::engine::Time), String> {
    let bad = || format!("--trace-window `{w}`: expected START_MS:LENGTH_MS, e.g. 0:10");
    let (a, b) = w.split_once(':').ok_or_else(bad)?;
    let a: f64 = a.trim().parse().map_err(|_| bad())?;
    let b: f64 = b.trim().parse().map_err(|_| bad())?;
    if !(a >= 0.0 && b > 0.0 && a.is_finite() && b.is_finite() && a + b <= 1e7) {
        return Err(format!(
            "--trace-window `{w}`: start must be ≥ 0 and length > 0 ms"
        ));
    }
    let ps = |ms: f64| (ms * 1e9).round() as exitless::engine::Time;
    Ok((ps(a), ps(b)))
}

/// The shipped calibration, the `--calibration` overlay over it, then
/// the `--calibration-set` entries.
fn load_cal(p: &Option<PathBuf>, sets: &[String]) -> Result<Calibration, String> {
    let file = match p {
        None => None,
        Some(p) => Some((
            p.display().to_string(),
            exitless::scenario::read_input(p)
                .map_err(|e| format!("cannot read calibration {}: {e}", p.display()))?,
        )),
    };
    exitless::calibration_overlay::layered(
        file.as_ref().map(|(o, t)| (o.as_str(), t.as_str())),
        sets,
    )
}

/// Progress and diagnostics on stderr. Never the print macros, which
/// panic when stderr is a closed pipe (`exitless ... 2>&1 | head -1`):
/// a failing stderr must not stop a run or lose its results, so its write
/// errors are ignored.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}
pub(crate) use note;

mod cli;

/// Why the command failed.
pub(crate) enum Failure {
    /// Bad input (scenario, calibration, arguments): exit status 2.
    Input(String),
    /// The results could not be written to stdout: exit status 1.
    Output(std::io::Error),
}

impl From<String> for Failure {
    fn from(e: String) -> Self {
        Failure::Input(e)
    }
}

/// Writes the results to stdout. A failure (a closed pipe, a full disk)
/// means the results are lost, so it fails the command.
pub(crate) fn emit(text: &str) -> Result<(), Failure> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .map_err(Failure::Output)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // SIGINT / SIGTERM while an output is being written: remove its
    // temporary file (the target keeps its old contents), then end as a
    // shell expects of an interrupted command (128 + SIGINT).
    if let Err(e) = ctrlc::set_handler(|| {
        exitless::report::remove_temporaries();
        std::process::exit(130);
    }) {
        note!("exitless: warning: no SIGINT/SIGTERM handler ({e}); an interrupted write may leave a temporary file\n");
    }
    match real_main(cli) {
        Ok(c) => c,
        Err(Failure::Input(e)) => {
            note!("exitless: error: {e}\n");
            ExitCode::from(2)
        }
        Err(Failure::Output(e)) => {
            note!("exitless: error: writing the results to stdout: {e}\n");
            ExitCode::from(1)
        }
    }
}

fn real_main(cli: Cli) -> Result<ExitCode, Failure> {
    let cal = load_cal(&cli.calibration, &cli.calibration_sets)?;
    let show = !cli.quiet && std::io::stderr().is_terminal();
    match cli.cmd {
        Cmd::Run {
            scenario,
            sets,
            json,
            csv,
            fail_on_violation,
            vcpu,
            trace,
            trace_window,
            trace_limit,
        } => {
            if let Some(t) = &trace {
                let mut inputs = vec![("the scenario file", scenario.as_path())];
                if let Some(c) = &cli.calibration {
                    inputs.push(("the calibration file", c.as_path()));
                }
                exitless::report::refuse_overwriting_input("--trace", t, &inputs)?;
            }
            let s = Scenario::load(&scenario, &sets).map_err(|e| e.to_string())?;
            for w in &s.warnings {
                note!("exitless: warning: {w}\n");
            }
            let mut w = World::build(&s, &cal).map_err(|e| e.to_string())?;
            if trace.is_some() {
                let (from, len) = parse_window(&trace_window)?;
                let start = w.measure_start() + from;
                w.enable_trace(start, start.saturating_add(len), trace_limit as usize);
            }
            let t0 = Instant::now();
            w.run(|f| {
                if show {
                    note!("\r  simulating {:5.1}%", f * 100.0);
                }
            });
            let wall = t0.elapsed().as_secs_f64();
            if show {
                note!("\r  simulating 100.0%\n");
            }
            let rep = w.report();
            // What the run could not compute (the scenario's own warnings
            // were printed before it).
            for warning in rep.warnings.iter().skip(s.warnings.len()) {
                note!("exitless: warning: {warning}\n");
            }
            if let (Some(path), Some(t)) = (&trace, w.trace()) {
                let title = format!("exitless {} ({})", s.name, rep.scheme);
                let names = w.trace_names();
                // Through a temporary file and a rename: an interrupted
                // write never leaves a truncated JSON at `path`.
                exitless::report::write_file_atomically(path, |out| {
                    t.write_chrome_json(out, &title, &names)
                })
                .map_err(|e| {
                    let p = path.display().to_string();
                    format!(
                        "cannot write trace {}: {e}",
                        exitless::scenario::overrides::shown(&p)
                    )
                })?;
                if !cli.quiet {
                    note!(
                        "trace: {} events to {}{}\n",
                        t.events().len(),
                        path.display(),
                        if t.dropped > 0 {
                            format!(
                                " ({} more dropped: raise --trace-limit or narrow --trace-window)",
                                t.dropped
                            )
                        } else {
                            String::new()
                        }
                    );
                }
            }
            if !cli.quiet {
                let ev = w.events() as f64;
                let sim = s.duration_s + s.warmup_s;
                note!(
                    "engine: {:.0} events in {:.3} s wall ({:.2} M events/s); {:.3} s simulated, {:.2} s wall per simulated s\n",
                    ev,
                    wall,
                    ev / wall.max(1e-9) / 1e6,
                    sim,
                    wall / sim
                );
            }
            if json {
                emit(&cli::run_json(&rep, &scenario, &sets, &cal)?)?;
            } else if csv {
                emit(&cli::run_csv(&rep)?)?;
            } else {
                emit(&rep.to_text_for(vcpu))?;
            }
            if fail_on_violation && rep.violations() > 0 {
                return Ok(ExitCode::from(3));
            }
        }
        Cmd::Reproduce {
            paper,
            json,
            csv,
            markdown,
            only,
            sets,
            threads,
            seeds,
            seed,
        } => {
            let threads = threads.map(|t| t as usize).unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            });
            let quiet = cli.quiet;
            let rows = validation::reproduce(
                &paper,
                only.as_deref(),
                &sets,
                validation::Seeds {
                    n: seeds,
                    base: seed,
                },
                &cal,
                threads,
                &|m| {
                    if !quiet {
                        note!("  {m}\n");
                    }
                },
            )
            .map_err(|e| e.to_string())?;
            let headlines = validation::headlines(&paper, &rows).map_err(|e| e.to_string())?;
            if json {
                emit(&cli::reproduce_json(
                    &paper, &rows, &headlines, &sets, &cal,
                )?)?;
            } else if csv {
                emit(&cli::reproduce_csv(&rows, &headlines)?)?;
            } else if markdown {
                emit(&validation::to_markdown(&paper, &rows, &headlines))?;
            } else {
                emit(&validation::to_text(&rows, &headlines))?;
            }
        }
        Cmd::Schemes => {
            use exitless::hv::scheme::{SCHEMES, SCHEME_SUMMARIES};
            let mut text = String::new();
            for (name, what) in SCHEMES.iter().zip(SCHEME_SUMMARIES) {
                text.push_str(&format!("{name:<11} {what}\n"));
            }
            text.push_str("\nwith arch = \"arm64\":\n");
            let arm = exitless::hv::arm::ARM_SCHEMES
                .iter()
                .zip(exitless::hv::arm::ARM_SCHEME_SUMMARIES);
            for (name, what) in arm {
                text.push_str(&format!("{name:<11} {what}\n"));
            }
            text.push_str("\nwith arch = \"riscv64\":\n");
            let riscv = exitless::hv::riscv::RISCV_SCHEMES
                .iter()
                .zip(exitless::hv::riscv::RISCV_SCHEME_SUMMARIES);
            for (name, what) in riscv {
                text.push_str(&format!("{name:<11} {what}\n"));
            }
            emit(&text)?;
        }
        Cmd::Calibration(a) => cli::calibration_cmd(a, &cal)?,
        Cmd::Explore(a) => {
            // The global options the replay line must repeat.
            let mut global = Vec::new();
            if let Some(c) = &cli.calibration {
                global.push("--calibration".to_string());
                global.push(c.display().to_string());
            }
            for kv in &cli.calibration_sets {
                global.push("--calibration-set".to_string());
                global.push(kv.clone());
            }
            return explore_cmd(a, &cal, cli.quiet, &global);
        }
        Cmd::Sweep(a) => cli::sweep_cmd(a, &cal, cli.calibration.as_deref(), cli.quiet, show)?,
        Cmd::Calibrate(a) => cli::calibrate_cmd(a, cli.quiet)?,
        Cmd::Keys(a) => cli::keys_cmd(a)?,
        Cmd::Diff(a) => return cli::diff_cmd(a),
        Cmd::Sensitivity(a) => cli::sensitivity_cmd(a, &cal, cli.quiet, show)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `exitless explore`: the race explorer over one or more schemes.
fn explore_cmd(
    a: ExploreArgs,
    cal: &Calibration,
    quiet: bool,
    global: &[String],
) -> Result<ExitCode, Failure> {
    use exitless::explore::{self, ExploreOptions, Perturbation};
    if !(a.jitter_ns >= 0.0 && a.jitter_ns <= 1e9) {
        return Err(Failure::Input(format!(
            "--jitter-ns {}: must be between 0 and 1e9 ns",
            a.jitter_ns
        )));
    }
    if a.runs == 0 {
        return Err(Failure::Input("--runs must be at least 1".into()));
    }
    let opts = ExploreOptions {
        runs: a.runs,
        max_jitter: (a.jitter_ns * 1000.0).round() as exitless::engine::Time,
        shuffle_ties: !a.fifo_ties,
        threads: a.threads.map(|t| t as usize).unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        }),
    };
    let schemes: Vec<Option<String>> = if a.schemes.is_empty() {
        vec![None]
    } else {
        a.schemes.iter().map(|s| Some(s.clone())).collect()
    };
    let path = a.scenario.display().to_string();
    // A counterexample's replay line repeats every option that shaped the
    // run (the scheme is added per scheme).
    let replay = explore::replay_command(global, &path, &a.sets);
    let mut found = false;
    for scheme in schemes {
        let mut sets = a.sets.clone();
        if let Some(sc) = &scheme {
            sets.push(format!("scheme={sc}"));
        }
        let s = Scenario::load(&a.scenario, &sets).map_err(|e| e.to_string())?;
        if let Some(seed) = a.replay {
            let p = Perturbation {
                seed,
                max_jitter: opts.max_jitter,
                shuffle_ties: opts.shuffle_ties,
            };
            let c = explore::counterexample(&s, cal, Some(p)).map_err(|e| e.to_string())?;
            found |= !c.violations.is_empty();
            // With no violation there is no counterexample to show.
            let detail = if c.violations.is_empty() {
                String::new()
            } else {
                explore::render_counterexample(&c, &s.scheme, &replay)
            };
            emit(&format!(
                "replay {path}: scheme {}: {} violation(s)\n{detail}",
                s.scheme,
                c.violations.len(),
            ))?;
            continue;
        }
        let show = !quiet && std::io::stderr().is_terminal();
        let runs = opts.runs;
        let x = explore::explore(&s, cal, opts, |done, failing| {
            if show {
                note!(
                    "\r  {}: {done}/{runs} interleavings, {failing} failing",
                    s.scheme
                );
            }
        })
        .map_err(|e| e.to_string())?;
        if show {
            note!("\n");
        }
        found |= x.failing_runs > 0;
        emit(&explore::render(&x, &opts, &path, &replay))?;
    }
    Ok(if found {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}
