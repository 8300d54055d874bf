//! `exitless sensitivity`: which calibration entries an output rests on.
//!
//! Each selected entry of the calibration (both files, x86 and ARM) is
//! varied on its own by each factor (×0.5 and ×2 by default), everything
//! else held, and the scenario (or a paper's experiments, the rows
//! `reproduce` prints) is run again. For every output the entries are
//! ranked by how far they move it: the largest relative change over the
//! factors, then the key.
//!
//! What moves together. A cycle-bound cost is given at the clock it was
//! measured at (`at_ghz`); the model scales it to the experiment's
//! `cpu.ghz` ([`Calibration::at_cpu_clock`]). Varying such an entry keeps
//! its tag, so the cost at the experiment's clock moves by the same
//! factor; varying `cpu.ghz` moves every cycle-bound cost at once (by the
//! inverse factor) and no wall-time one. Entries one of which bounds the
//! other ([`TIED`]: an IPI's mean latency and its latest delivery) are
//! varied together, under the first one's name, so the pair stays
//! consistent ([`Calibration::check`]).
//!
//! What is never run. The model reads the calibration only while it
//! builds a world: `World::build` turns entries into picosecond costs and
//! the running world holds no calibration. An x86 world never reads the
//! ARM file ([`Calibration::arm`]), and an ARM world reads the x86 file
//! only for the guest kernel's path lengths: ARM entries are skipped
//! without a run for targets that build only x86 worlds (the scenario's
//! `arch`, or every experiment's scenarios). An entry a run reads but
//! whose variation leaves every output bit for bit the same is listed as
//! unmoved.
//!
//! Runs go through the sweep machinery ([`crate::sweep::execute_batch`]):
//! threads, a resumable results file in the sweep's long form (with
//! `entry` and `factor` columns), bytes independent of the thread count.

use crate::calibration::{range_of, Calibration};
use crate::calibration_overlay::{apply_to, OverlayEntry};
use crate::scenario::Scenario;
use crate::sweep::{self, Batch, BatchRun, Event, Metrics};
use crate::validation::headline::{HeadlineRow, Verdict};
use crate::validation::{self, Row, Seeds};
use crate::world::World;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The factors each entry is varied by unless `--factors` says others.
pub const DEFAULT_FACTORS: [f64; 2] = [0.5, 2.0];

/// Entries varied together, named by the first: one bounds the other.
pub const TIED: &[&[&str]] = &[&["host.ipi_latency_us", "host.ipi_latency_max_us"]];

/// The kind of a source: `public`, `paper`, `estimate`, `overlay` (an
/// entry the user's overlay set) or `other`.
pub fn source_kind(source: &str) -> &'static str {
    let s = source.trim_start();
    if s.starts_with("[public]") {
        "public"
    } else if s.starts_with("[paper]") {
        "paper"
    } else if s.starts_with("[estimate]") {
        "estimate"
    } else if s.starts_with("[overlay]") || s.starts_with("[measured]") {
        "overlay"
    } else {
        "other"
    }
}

/// The source kinds in the order tables list them.
pub const KINDS: [&str; 5] = ["public", "paper", "estimate", "overlay", "other"];

/// One calibration entry, as listed and varied.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CalEntry {
    /// Dotted key (`exit.msr_write_eoi_us`, `kvm.halt_poll_us`).
    pub key: String,
    /// `x86` (calibration/x86-did-host.toml) or `arm`
    /// (calibration/arm-kvm-host.toml).
    pub file: &'static str,
    /// Its value.
    pub value: f64,
    /// Its source text.
    pub source: String,
    /// [`source_kind`] of the source.
    pub kind: &'static str,
    /// The clock a cycle-bound cost is given at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at_ghz: Option<f64>,
    /// A wall-time-bound cost.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub wall: bool,
}

/// The files' names, by [`CalEntry::file`].
pub fn file_name(file: &str) -> &'static str {
    match file {
        "arm" => "calibration/arm-kvm-host.toml",
        "riscv" => "calibration/riscv-kvm-host.toml",
        "x86-spr" => "calibration/x86-spr-host.toml",
        "x86-zen4" => "calibration/x86-zen4-host.toml",
        _ => "calibration/x86-did-host.toml",
    }
}

/// Every entry of `cal`: the x86 file's, then the ARM file's, each by
/// section and key.
pub fn calibration_entries(cal: &Calibration) -> Vec<CalEntry> {
    let mut out = Vec::new();
    let files = [
        ("x86", toml::Value::try_from(cal).ok()),
        ("arm", toml::Value::try_from(&cal.arm).ok()),
        ("riscv", toml::Value::try_from(&cal.riscv).ok()),
    ];
    entries_of(&files, &mut out);
    out
}

/// The entries of the preset overlays shipped beside the two files
/// (`calibration/x86-spr-host.toml`, `calibration/x86-zen4-host.toml`), as
/// the files have them: listed by
/// `exitless calibration`, never varied (an overlay is applied with
/// `--calibration`, and its entries are then the calibration's).
pub fn preset_entries() -> Vec<CalEntry> {
    let mut out = Vec::new();
    let files = [
        (
            "x86-spr",
            toml::from_str::<toml::Value>(crate::calibration::SPR_OVERLAY_TOML).ok(),
        ),
        (
            "x86-zen4",
            toml::from_str::<toml::Value>(crate::calibration::ZEN4_OVERLAY_TOML).ok(),
        ),
    ];
    entries_of(&files, &mut out);
    out
}

/// Walks each file's `[section] key = { value, source, ... }` entries.
fn entries_of(files: &[(&'static str, Option<toml::Value>)], out: &mut Vec<CalEntry>) {
    for (file, v) in files {
        let file = *file;
        let Some(t) = v.as_ref().and_then(|v| v.as_table()) else {
            continue;
        };
        for (sec, entries) in t {
            let Some(e) = entries.as_table() else {
                continue;
            };
            for (k, x) in e {
                let value = x
                    .get("value")
                    .and_then(|v| v.as_float().or(v.as_integer().map(|i| i as f64)))
                    .unwrap_or(f64::NAN);
                let source = x
                    .get("source")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string();
                out.push(CalEntry {
                    key: format!("{sec}.{k}"),
                    file,
                    value,
                    kind: source_kind(&source),
                    source,
                    at_ghz: x.get("at_ghz").and_then(|v| v.as_float()),
                    wall: x.get("wall").and_then(|v| v.as_bool()).unwrap_or(false),
                });
            }
        }
    }
}

/// Counts of `entries` by source kind, in [`KINDS`] order (kinds with
/// none left out).
pub fn counts_by_kind(entries: &[&CalEntry]) -> Vec<(&'static str, usize)> {
    KINDS
        .iter()
        .map(|k| (*k, entries.iter().filter(|e| e.kind == *k).count()))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Whether `s` matches the glob `pat` (`*`: any run of characters, `?`:
/// one character).
pub fn glob_match(pat: &str, s: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (pat.chars().collect(), s.chars().collect());
    let (mut i, mut j) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while j < s.len() {
        if i < p.len() && (p[i] == '?' || p[i] == s[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(st) = star {
            i = st + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// The keys of `entries` that `patterns` (globs or keys) select, in
/// `entries`' order; every entry when `patterns` is empty. A pattern that
/// selects nothing is an error naming it.
pub fn select(entries: &[CalEntry], patterns: &[String]) -> Result<Vec<String>, String> {
    if patterns.is_empty() {
        return Ok(entries.iter().map(|e| e.key.clone()).collect());
    }
    for p in patterns {
        if !entries.iter().any(|e| glob_match(p, &e.key)) {
            return Err(format!(
                "--entries `{p}` matches no calibration entry (keys are section.name, e.g. exit.msr_write_eoi_us; globs: exit.*, *_ipi_*)"
            ));
        }
    }
    Ok(entries
        .iter()
        .filter(|e| patterns.iter().any(|p| glob_match(p, &e.key)))
        .map(|e| e.key.clone())
        .collect())
}

/// Parses `--factors`: positive, finite, not 1, each once.
pub fn parse_factors(list: &[f64]) -> Result<Vec<f64>, String> {
    if list.is_empty() {
        return Ok(DEFAULT_FACTORS.to_vec());
    }
    let mut out: Vec<f64> = Vec::new();
    for &f in list {
        if !(f.is_finite() && f > 0.0 && f <= 1e3) || f == 1.0 {
            return Err(format!(
                "--factors {f}: a factor is a positive number other than 1 (at most 1000)"
            ));
        }
        if out.contains(&f) {
            return Err(format!("--factors {f}: given twice"));
        }
        out.push(f);
    }
    Ok(out)
}

/// One variation: an entry (with the entries tied to it) times a factor.
#[derive(Clone, Debug, PartialEq)]
pub struct Variation {
    /// The entry it is named by.
    pub entry: String,
    /// Every entry it changes (`entry` first).
    pub members: Vec<String>,
    /// The factor.
    pub factor: f64,
}

/// The variations of the `selected` keys under each factor: an entry tied
/// to another ([`TIED`]) goes with it, under the group's first name.
pub fn variations(selected: &[String], factors: &[f64]) -> Vec<Variation> {
    let mut groups: Vec<Vec<String>> = Vec::new();
    for k in selected {
        let members: Vec<String> = match TIED.iter().find(|g| g.contains(&k.as_str())) {
            Some(g) => g.iter().map(|s| s.to_string()).collect(),
            None => vec![k.clone()],
        };
        if !groups.iter().any(|g| g[0] == members[0]) {
            groups.push(members);
        }
    }
    let mut out = Vec::new();
    for g in groups {
        for &f in factors {
            out.push(Variation {
                entry: g[0].clone(),
                members: g.clone(),
                factor: f,
            });
        }
    }
    out
}

/// `value × factor` kept inside `key`'s range: a count rounded to a whole
/// number, a value past a bound set to the bound.
pub fn scaled(key: &str, value: f64, factor: f64) -> f64 {
    let mut x = value * factor;
    if let Some(r) = range_of(key) {
        if r.integer {
            x = x.round();
        }
        if r.min_exclusive && x <= r.min {
            x = value;
        }
        x = x.clamp(r.min, r.max);
    }
    x
}

/// `cal` with each of `members` scaled by `factor` ([`scaled`]), the
/// source and clock tag kept.
pub fn perturb(cal: &Calibration, members: &[String], factor: f64) -> Result<Calibration, String> {
    let entries = calibration_entries(cal);
    let mut over = Vec::new();
    for m in members {
        let e = entries
            .iter()
            .find(|e| &e.key == m)
            .ok_or_else(|| format!("no calibration entry `{m}`"))?;
        over.push(OverlayEntry {
            key: m.clone(),
            value: scaled(m, e.value, factor),
            source: e.source.clone(),
            clock: None,
        });
    }
    apply_to(cal, &over)
}

/// `cal` (both files) as one overlay text that, layered over the shipped
/// calibration, gives `cal` back: how the Python front end ships a
/// variation's calibration to its workers.
pub fn overlay_text(cal: &Calibration) -> Result<String, String> {
    let mut t = toml::Table::try_from(cal).map_err(|e| e.to_string())?;
    let mut arm = toml::Table::try_from(&cal.arm).map_err(|e| e.to_string())?;
    arm.extend(toml::Table::try_from(&cal.riscv).map_err(|e| e.to_string())?);
    for (sec, entries) in arm {
        match (t.get_mut(&sec).and_then(|x| x.as_table_mut()), entries) {
            (Some(x), toml::Value::Table(a)) => x.extend(a),
            (_, v) => {
                t.insert(sec, v);
            }
        }
    }
    toml::to_string(&t).map_err(|e| e.to_string())
}

/// What a sensitivity analysis runs.
#[derive(Clone, Debug)]
pub enum Target {
    /// One scenario file with `--set` overrides.
    Scenario {
        /// The file.
        path: PathBuf,
        /// Its parsed scenario (overrides applied).
        scenario: Box<Scenario>,
        /// The file's text (recorded beside the results).
        text: String,
    },
    /// A paper's experiments (`reproduce P [--only ID]`): one output per row.
    Paper {
        /// The paper (a directory under validation/).
        paper: String,
        /// `--only`.
        only: Option<String>,
    },
}

impl Target {
    /// Loads a scenario target.
    pub fn scenario(path: &Path, sets: &[String]) -> Result<Target, String> {
        let text = crate::scenario::read_input(path)
            .map_err(|e| format!("cannot read scenario {}: {e}", path.display()))?;
        let s = Scenario::load(path, sets).map_err(|e| e.to_string())?;
        Ok(Target::Scenario {
            path: path.to_path_buf(),
            scenario: Box::new(s),
            text,
        })
    }

    /// A scenario target from its text (`origin` names it), as the Python
    /// front end sends it.
    pub fn scenario_text(origin: &str, text: &str, sets: &[String]) -> Result<Target, String> {
        let s = Scenario::parse(text, sets).map_err(|e| format!("{origin}: {e}"))?;
        Ok(Target::Scenario {
            path: PathBuf::from(origin),
            scenario: Box::new(s),
            text: text.to_string(),
        })
    }

    /// Whether every world the target builds is an x86 one (so the ARM
    /// file's entries are never read). For a paper, from each selected
    /// experiment's scenario files; `false` when one cannot be read.
    pub fn x86_only(&self, sets: &[String]) -> bool {
        match self {
            Target::Scenario { scenario, .. } => scenario.arch != crate::scenario::ArchSpec::Arm64,
            Target::Paper { paper, only } => paper_scenarios(paper, only.as_deref())
                .map(|files| {
                    files.iter().all(|f| {
                        Scenario::load(f, sets)
                            .is_ok_and(|s| s.arch != crate::scenario::ArchSpec::Arm64)
                    })
                })
                .unwrap_or(false),
        }
    }

    /// Whether some world the target builds is a RISC-V one (the only
    /// readers of the RISC-V file).
    pub fn builds_riscv(&self, sets: &[String]) -> bool {
        let riscv = crate::scenario::ArchSpec::Riscv64;
        match self {
            Target::Scenario { scenario, .. } => scenario.arch == riscv,
            Target::Paper { paper, only } => paper_scenarios(paper, only.as_deref())
                .map(|files| {
                    files
                        .iter()
                        .any(|f| Scenario::load(f, sets).is_ok_and(|s| s.arch == riscv))
                })
                .unwrap_or(true),
        }
    }

    /// What the results file records as the runs' input.
    fn describe(&self) -> String {
        match self {
            Target::Scenario { text, .. } => text.clone(),
            Target::Paper { paper, only } => {
                let file = validation::validation_root()
                    .join(paper)
                    .join("experiments.toml");
                let text = crate::scenario::read_input(&file).unwrap_or_default();
                format!(
                    "# reproduce {paper}{}\n{text}",
                    only.as_ref()
                        .map(|o| format!(" --only {o}"))
                        .unwrap_or_default()
                )
            }
        }
    }

    fn scheme(&self) -> String {
        match self {
            Target::Scenario { scenario, .. } => scenario.scheme.clone(),
            Target::Paper { paper, .. } => format!("reproduce:{paper}"),
        }
    }

    fn seed(&self) -> u64 {
        match self {
            Target::Scenario { scenario, .. } => scenario.seed,
            Target::Paper { .. } => 0,
        }
    }
}

/// The scenario files of `paper`'s experiments (those whose id contains
/// `only`).
fn paper_scenarios(paper: &str, only: Option<&str>) -> Option<Vec<PathBuf>> {
    let dir = validation::validation_root().join(paper);
    let text = crate::scenario::read_input(&dir.join("experiments.toml")).ok()?;
    let v: toml::Table = toml::from_str(&text).ok()?;
    let mut out = Vec::new();
    for e in v.get("experiment")?.as_array()? {
        let id = e.get("id")?.as_str()?;
        if only.is_some_and(|o| !id.contains(o)) {
            continue;
        }
        if let Some(s) = e.get("scenario").and_then(|s| s.as_str()) {
            out.push(dir.join(s));
        }
        for w in e
            .get("workloads")
            .and_then(|w| w.as_array())
            .into_iter()
            .flatten()
        {
            out.push(dir.join(w.get("scenario")?.as_str()?));
        }
    }
    Some(out)
}

/// A reproduce row's name as an output: `experiment/config[/k=v,...]/metric`.
pub fn row_name(r: &Row) -> String {
    let p = if r.params.is_empty() {
        String::new()
    } else {
        format!("/{}", crate::validation::params_text(r, ","))
    };
    format!("{}/{}{p}/{}", r.experiment, r.config, r.metric)
}

/// A paper's rows as outputs, with `violations` (their total).
pub fn rows_metrics(rows: &[Row]) -> Metrics {
    let mut m = Metrics::new();
    for r in rows {
        let mut name = row_name(r);
        let mut k = 2;
        while m.contains_key(&name) {
            name = format!("{}#{k}", row_name(r));
            k += 1;
        }
        m.insert(name, r.model.is_finite().then_some(r.model));
    }
    let v: u64 = rows.iter().map(|r| r.violations).sum();
    m.insert("violations".into(), Some(v as f64));
    m
}

/// Every verdict, in the order of their codes in a results file.
pub const VERDICTS: [Verdict; 8] = Verdict::ALL;

/// The output a headline's model effect is recorded under.
pub fn headline_effect(id: &str) -> String {
    format!("headline:{id}/effect")
}

/// The output a headline's verdict is recorded under (its code: the
/// index in [`VERDICTS`]).
pub fn headline_verdict(id: &str) -> String {
    format!("headline:{id}/verdict")
}

/// A paper's headline table as outputs: each headline's model effect and
/// verdict code.
pub fn headline_metrics(hs: &[HeadlineRow], m: &mut Metrics) {
    for h in hs {
        m.insert(
            headline_effect(&h.id),
            h.model_effect.filter(|x| x.is_finite()),
        );
        let code = VERDICTS.iter().position(|v| *v == h.verdict);
        m.insert(headline_verdict(&h.id), code.map(|c| c as f64));
    }
}

fn verdict_name(code: Option<f64>) -> String {
    code.and_then(|c| VERDICTS.get(c as usize))
        .map_or("-", |v| v.name())
        .to_string()
}

/// One run of the target under `cal` changed by `v` (none: the base run).
pub fn run_once(
    target: &Target,
    sets: &[String],
    seeds: Seeds,
    cal: &Calibration,
    v: Option<&Variation>,
) -> Result<Metrics, String> {
    match target {
        Target::Scenario { scenario, .. } => {
            let varied;
            let cal = match v {
                None => cal,
                Some(v) => {
                    varied = perturb(cal, &v.members, v.factor)?;
                    &varied
                }
            };
            let mut w = World::build(scenario, cal).map_err(|e| e.to_string())?;
            w.run(|_| {});
            sweep::flatten(&w.report())
        }
        Target::Paper { paper, only } => {
            let adjust = |c: &Calibration| match v {
                None => Ok(c.clone()),
                Some(v) => perturb(c, &v.members, v.factor),
            };
            let rows = validation::reproduce_adjusted(
                paper,
                only.as_deref(),
                sets,
                seeds,
                cal,
                1,
                &|_| {},
                Some(&adjust),
            )
            .map_err(|e| e.to_string())?;
            let mut m = rows_metrics(&rows);
            let hs = validation::headlines(paper, &rows).map_err(|e| e.to_string())?;
            headline_metrics(&hs, &mut m);
            Ok(m)
        }
    }
}

/// A factor as the results file writes it (`0.5`, `2`).
pub fn factor_text(f: f64) -> String {
    format!("{f}")
}

/// An entry skipped without a run, and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Skipped {
    /// The entry.
    pub entry: String,
    /// Why.
    pub reason: String,
}

/// What an analysis runs, checked before anything runs.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The target.
    pub target: Target,
    /// Overrides of every run.
    pub sets: Vec<String>,
    /// Seeds (paper targets).
    pub seeds: Seeds,
    /// The calibration the target runs on (a paper's testbed overlay
    /// applied): the base values the table shows.
    pub shown: Vec<CalEntry>,
    /// The factors.
    pub factors: Vec<f64>,
    /// The variations, in output order.
    pub variations: Vec<Variation>,
    /// Entries left out without a run.
    pub skipped: Vec<Skipped>,
}

/// Plans an analysis: the entries `patterns` select (all when empty),
/// those the target never reads skipped, each under every factor.
pub fn plan(
    target: Target,
    sets: &[String],
    seeds: Seeds,
    cal: &Calibration,
    patterns: &[String],
    factors: &[f64],
) -> Result<Plan, String> {
    let factors = parse_factors(factors)?;
    let shown_cal = match &target {
        Target::Scenario { .. } => cal.clone(),
        Target::Paper { paper, .. } => {
            validation::paper_calibration(paper, cal).map_err(|e| e.to_string())?
        }
    };
    let shown = calibration_entries(&shown_cal);
    let selected = select(&shown, patterns)?;
    let x86_only = target.x86_only(sets);
    let riscv = target.builds_riscv(sets);
    let mut skipped = Vec::new();
    let mut kept = Vec::new();
    for k in selected {
        let file = shown.iter().find(|e| e.key == k).map(|e| e.file);
        if file == Some("riscv") && !riscv {
            skipped.push(Skipped {
                entry: k,
                reason: "a RISC-V entry; the target builds no RISC-V world, which alone reads the RISC-V file"
                    .into(),
            });
        } else if x86_only && file == Some("arm") {
            skipped.push(Skipped {
                entry: k,
                reason:
                    "an ARM entry; the target builds only x86 worlds, which never read the ARM file"
                        .into(),
            });
        } else {
            kept.push(k);
        }
    }
    let variations = variations(&kept, &factors);
    // A variation the calibration refuses (out of range) fails here.
    for v in &variations {
        perturb(&shown_cal, &v.members, v.factor)
            .map_err(|e| format!("{} ×{}: {e}", v.entry, v.factor))?;
    }
    Ok(Plan {
        target,
        sets: sets.to_vec(),
        seeds,
        shown,
        factors,
        variations,
        skipped,
    })
}

/// The batch's columns between `point` and `scheme`.
pub const KEYS: [&str; 2] = ["entry", "factor"];

/// Runs a plan on `jobs` threads, journaled to `out` (a sweep results
/// file: `.csv` or `.jsonl`, resumable), and analyses it.
pub fn execute(
    plan: &Plan,
    cal: &Calibration,
    out: &Path,
    jobs: usize,
    progress: &mut dyn FnMut(Event),
) -> Result<(Analysis, sweep::BatchDone), String> {
    let keys: Vec<String> = KEYS.map(String::from).to_vec();
    let (scheme, seed) = (plan.target.scheme(), plan.target.seed());
    let mut runs = vec![BatchRun {
        point: 0,
        values: vec!["base".into(), "1".into()],
        scheme: scheme.clone(),
        seed,
    }];
    for (i, v) in plan.variations.iter().enumerate() {
        runs.push(BatchRun {
            point: i + 1,
            values: vec![v.entry.clone(), factor_text(v.factor)],
            scheme: scheme.clone(),
            seed,
        });
    }
    let mut sets = plan.sets.clone();
    if let Some(n) = plan.seeds.n {
        sets.push(format!("--seeds {n}"));
    }
    if let Some(b) = plan.seeds.base {
        sets.push(format!("--seed {b}"));
    }
    let batch = Batch {
        keys: &keys,
        runs: &runs,
        scenario: plan.target.describe(),
        sets,
    };
    let run = |i: usize| {
        let v = i.checked_sub(1).map(|k| &plan.variations[k]);
        run_once(&plan.target, &plan.sets, plan.seeds, cal, v)
    };
    let describe = |i: usize| match i {
        0 => "the base run".to_string(),
        i => {
            let v = &plan.variations[i - 1];
            format!("{} ×{}", v.entry, v.factor)
        }
    };
    let done = sweep::execute_batch(&batch, cal, out, jobs, &run, &describe, progress)?;
    let a = analyze(plan, cal, &done.results[0], &done.results[1..]);
    Ok((a, done))
}

/// One factor's side of an entry's effect on an output.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Side {
    /// The factor.
    pub factor: f64,
    /// The entry's value under it.
    pub value: f64,
    /// The output under it (null: not computable).
    pub output: Option<f64>,
    /// (output − base) / |base| × 100 (null when either is null or the
    /// base is 0).
    pub change_pct: Option<f64>,
}

/// An entry's effect on one output.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Effect {
    /// The entry (a group's first).
    pub entry: String,
    /// The entries varied with it, when it is a group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<String>,
    /// Its source kind.
    pub kind: String,
    /// `x86` or `arm`.
    pub file: String,
    /// Its value in the base run.
    pub base_value: f64,
    /// One per factor.
    pub sides: Vec<Side>,
    /// The largest |change_pct| over the factors (null when no side has
    /// one: the output appeared or vanished, or its base is 0).
    pub swing_pct: Option<f64>,
}

/// One output's ranking.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct OutputSensitivity {
    /// The output (a metric, or a reproduce row's name, [`row_name`]).
    pub output: String,
    /// Its value in the base run.
    pub base: Option<f64>,
    /// The entries that move it, the most first.
    pub ranked: Vec<Effect>,
}

/// A whole analysis (`sensitivity --json`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Analysis {
    /// [`crate::report::SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The tool and version.
    pub tool: String,
    /// `scenario <path>` or `reproduce <paper> [--only ID]`.
    pub target: String,
    /// The overrides of every run.
    pub sets: Vec<String>,
    /// [`fingerprint`] of the calibration the analysis started from.
    pub calibration: String,
    /// The factors.
    pub factors: Vec<f64>,
    /// Entries varied.
    pub varied: usize,
    /// Entries left out without a run.
    pub skipped: Vec<Skipped>,
    /// Entries varied that moved no output at all.
    pub unmoved: Vec<String>,
    /// Per output (by name), the entries that move it.
    pub outputs: Vec<OutputSensitivity>,
    /// A paper's headlines: per headline, the entries that flip its
    /// verdict or move its model effect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headlines: Vec<HeadlineSensitivity>,
}

/// One headline under the variations.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HeadlineSensitivity {
    /// The headline's id.
    pub id: String,
    /// Its verdict in the base run.
    pub verdict: String,
    /// Its model effect in the base run.
    pub effect: Option<f64>,
    /// The entries that flip its verdict or move its effect: those that
    /// flip first, then by the largest change of the effect.
    pub entries: Vec<HeadlineEntry>,
}

/// An entry's effect on a headline.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HeadlineEntry {
    /// The entry.
    pub entry: String,
    /// Its source kind.
    pub kind: String,
    /// Whether some factor flips the verdict.
    pub flips: bool,
    /// The largest |change| of the model effect over the factors, %.
    pub swing_pct: Option<f64>,
    /// One per factor.
    pub sides: Vec<HeadlineSide>,
}

/// A headline under one factor of an entry.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HeadlineSide {
    /// The factor.
    pub factor: f64,
    /// The model effect.
    pub effect: Option<f64>,
    /// Its change from the base run's, %.
    pub change_pct: Option<f64>,
    /// The verdict.
    pub verdict: String,
}

/// A short stable fingerprint of a calibration (FNV-1a of its TOML, both
/// files): a cached analysis applies to runs on the same calibration only.
pub fn fingerprint(cal: &Calibration) -> String {
    let text = format!(
        "{}\n{}",
        toml::to_string(cal).unwrap_or_default(),
        toml::to_string(&cal.arm).unwrap_or_default()
    );
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("fnv1a64:{h:016x}")
}

/// How far `out` is from `base`, for ranking: relative change, infinite
/// when the base is 0 (or null) and the output is not.
fn score(base: Option<f64>, out: Option<f64>) -> f64 {
    match (base, out) {
        (Some(b), Some(o)) if b == o => 0.0,
        (Some(b), Some(o)) if b != 0.0 => (o - b).abs() / b.abs(),
        (None, None) => 0.0,
        _ => f64::INFINITY,
    }
}

/// Ranks every output's entries from the base run's metrics and each
/// variation's (`results[i]` is `plan.variations[i]`'s).
pub fn analyze(plan: &Plan, cal: &Calibration, base: &Metrics, results: &[Metrics]) -> Analysis {
    // Per entry group, its variations' indices (in factor order).
    let mut groups: Vec<(&Variation, Vec<usize>)> = Vec::new();
    for (i, v) in plan.variations.iter().enumerate() {
        match groups.iter_mut().find(|(g, _)| g.entry == v.entry) {
            Some((_, ix)) => ix.push(i),
            None => groups.push((v, vec![i])),
        }
    }
    let info = |k: &str| plan.shown.iter().find(|e| e.key == k);
    let mut names: Vec<&String> = base.keys().collect();
    for m in results {
        names.extend(m.keys());
    }
    names.sort();
    names.dedup();
    // A verdict's code is not a quantity: the headlines below judge it.
    names.retain(|n| !(n.starts_with("headline:") && n.ends_with("/verdict")));
    let mut moved: Vec<bool> = vec![false; groups.len()];
    let mut outputs = Vec::new();
    for name in names {
        let b = base.get(name).copied().flatten();
        let mut ranked: Vec<(f64, Effect)> = Vec::new();
        for (gi, (v, ix)) in groups.iter().enumerate() {
            let e = info(&v.entry);
            let base_value = e.map_or(f64::NAN, |e| e.value);
            let mut best = 0.0f64;
            let mut sides = Vec::new();
            for &i in ix {
                let o = results[i].get(name).copied().flatten();
                let s = score(b, o);
                best = best.max(s);
                let f = plan.variations[i].factor;
                sides.push(Side {
                    factor: f,
                    value: scaled(&v.entry, base_value, f),
                    output: o,
                    change_pct: b
                        .zip(o)
                        .filter(|(b, _)| *b != 0.0)
                        .map(|(b, o)| (o - b) / b.abs() * 100.0),
                });
            }
            if best > 0.0 {
                moved[gi] = true;
                let swing = sides
                    .iter()
                    .filter_map(|s| s.change_pct.map(f64::abs))
                    .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
                ranked.push((
                    best,
                    Effect {
                        entry: v.entry.clone(),
                        with: v.members[1..].to_vec(),
                        kind: e.map_or("other", |e| e.kind).to_string(),
                        file: e.map_or("x86", |e| e.file).to_string(),
                        base_value,
                        sides,
                        swing_pct: swing,
                    },
                ));
            }
        }
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.entry.cmp(&b.1.entry)));
        outputs.push(OutputSensitivity {
            output: name.clone(),
            base: b,
            ranked: ranked.into_iter().map(|(_, e)| e).collect(),
        });
    }
    let mut headlines = Vec::new();
    for out in &outputs {
        let Some(id) = out
            .output
            .strip_prefix("headline:")
            .and_then(|x| x.strip_suffix("/effect"))
        else {
            continue;
        };
        let vname = headline_verdict(id);
        let base_verdict = base.get(&vname).copied().flatten();
        let mut entries = Vec::new();
        for (v, ix) in &groups {
            let mut flips = false;
            let sides: Vec<HeadlineSide> = ix
                .iter()
                .map(|&i| {
                    let code = results[i].get(&vname).copied().flatten();
                    flips |= code != base_verdict;
                    let effect = results[i].get(&out.output).copied().flatten();
                    HeadlineSide {
                        factor: plan.variations[i].factor,
                        effect,
                        change_pct: out
                            .base
                            .zip(effect)
                            .filter(|(b, _)| *b != 0.0)
                            .map(|(b, e)| (e - b) / b.abs() * 100.0),
                        verdict: verdict_name(code),
                    }
                })
                .collect();
            let moved = out.ranked.iter().find(|e| e.entry == v.entry);
            if !flips && moved.is_none() {
                continue;
            }
            entries.push(HeadlineEntry {
                entry: v.entry.clone(),
                kind: info(&v.entry).map_or("other", |e| e.kind).to_string(),
                flips,
                swing_pct: moved.and_then(|e| e.swing_pct),
                sides,
            });
        }
        entries.sort_by(|a, b| {
            b.flips
                .cmp(&a.flips)
                .then_with(|| {
                    let s = |e: &HeadlineEntry| e.swing_pct.unwrap_or(f64::INFINITY);
                    s(b).total_cmp(&s(a))
                })
                .then_with(|| a.entry.cmp(&b.entry))
        });
        headlines.push(HeadlineSensitivity {
            id: id.to_string(),
            verdict: verdict_name(base_verdict),
            effect: out.base,
            entries,
        });
    }
    let target = match &plan.target {
        Target::Scenario { path, .. } => format!("scenario {}", path.display()),
        Target::Paper { paper, only } => format!(
            "reproduce {paper}{}",
            only.as_ref()
                .map(|o| format!(" --only {o}"))
                .unwrap_or_default()
        ),
    };
    Analysis {
        schema_version: crate::report::SCHEMA_VERSION,
        tool: crate::report::tool_version(),
        target,
        sets: plan.sets.clone(),
        calibration: fingerprint(cal),
        factors: plan.factors.clone(),
        varied: groups.len(),
        skipped: plan.skipped.clone(),
        unmoved: groups
            .iter()
            .zip(&moved)
            .filter(|(_, m)| !**m)
            .map(|((v, _), _)| v.entry.clone())
            .collect(),
        outputs,
        headlines,
    }
}

/// A number as tables print it: 4 significant digits.
fn num(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let mag = x.abs().log10().floor() as i32;
    if !(-3..6).contains(&mag) {
        return format!("{x:.3e}");
    }
    let dec = (3 - mag).max(0) as usize;
    format!("{x:.dec$}")
}

fn opt(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), num)
}

fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |p| format!("{p:+.1}%"))
}

/// Whether the output `name` is shown under `patterns` (all when empty).
pub fn shown_output(name: &str, patterns: &[String]) -> bool {
    patterns.is_empty() || patterns.iter().any(|p| glob_match(p, name))
}

/// The ranked tables as text: per output its `top` entries.
pub fn to_text(a: &Analysis, top: usize, patterns: &[String]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "sensitivity of {} to {} calibration entries, each ×{} on its own ({} skipped without a run, {} moved nothing)",
        a.target,
        a.varied,
        a.factors
            .iter()
            .map(|f| factor_text(*f))
            .collect::<Vec<_>>()
            .join(" and ×"),
        a.skipped.len(),
        a.unmoved.len()
    );
    for h in &a.headlines {
        let shown = |e: &&HeadlineEntry| e.flips || e.swing_pct.is_none_or(|s| s > 10.0);
        let flips = h.entries.iter().filter(|e| e.flips).count();
        let big = h.entries.iter().filter(shown).count() - flips;
        let _ = writeln!(
            o,
            "\nheadline {}: {} (model effect {}); {flips} entries flip the verdict, {big} more move the effect by over 10% (or away from 0)",
            h.id,
            h.verdict,
            opt(h.effect),
        );
        for e in h.entries.iter().filter(shown).take(top.max(flips)) {
            let sides: Vec<String> = e
                .sides
                .iter()
                .map(|s| {
                    format!(
                        "×{}: {} {} ({})",
                        factor_text(s.factor),
                        s.verdict,
                        opt(s.effect),
                        pct(s.change_pct)
                    )
                })
                .collect();
            let _ = writeln!(
                o,
                "  {} {:<34} {:<9} {}",
                if e.flips { "FLIP" } else { "    " },
                e.entry,
                e.kind,
                sides.join("   ")
            );
        }
    }
    for out in a
        .outputs
        .iter()
        .filter(|x| shown_output(&x.output, patterns))
    {
        let _ = writeln!(o, "\n{}  (base {})", out.output, opt(out.base));
        if out.ranked.is_empty() {
            let _ = writeln!(o, "  no entry moves it");
            continue;
        }
        let w = out
            .ranked
            .iter()
            .take(top)
            .map(|e| e.entry.len())
            .max()
            .unwrap_or(5)
            .max(5);
        let _ = write!(o, "  {:>3} {:<w$} {:<9}", "#", "entry", "kind");
        for f in &a.factors {
            let h = format!("×{}: value -> output (change)", factor_text(*f));
            let _ = write!(o, "  {h:<36}");
        }
        let _ = writeln!(o);
        for (i, e) in out.ranked.iter().take(top).enumerate() {
            let _ = write!(o, "  {:>3} {:<w$} {:<9}", i + 1, e.entry, e.kind);
            for s in &e.sides {
                let cell = format!(
                    "{} -> {} ({})",
                    num(s.value),
                    opt(s.output),
                    pct(s.change_pct)
                );
                let _ = write!(o, "  {cell:<36}");
            }
            let _ = writeln!(o);
        }
        if out.ranked.len() > top {
            let _ = writeln!(o, "  ... {} more entries move it", out.ranked.len() - top);
        }
    }
    o
}

/// The ranked tables as CSV: one line per output, rank and factor.
pub fn to_csv(a: &Analysis, patterns: &[String]) -> String {
    let mut w = csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    let o = |x: Option<f64>| x.map(|v| format!("{v}")).unwrap_or_default();
    let _ = w.write_record([
        "output",
        "base",
        "rank",
        "entry",
        "kind",
        "file",
        "base_value",
        "factor",
        "value",
        "output_value",
        "change_pct",
    ]);
    for out in a
        .outputs
        .iter()
        .filter(|x| shown_output(&x.output, patterns))
    {
        for (i, e) in out.ranked.iter().enumerate() {
            for s in &e.sides {
                let _ = w.write_record([
                    out.output.clone(),
                    o(out.base),
                    (i + 1).to_string(),
                    e.entry.clone(),
                    e.kind.clone(),
                    e.file.clone(),
                    format!("{}", e.base_value),
                    factor_text(s.factor),
                    format!("{}", s.value),
                    o(s.output),
                    o(s.change_pct),
                ]);
            }
        }
    }
    String::from_utf8(w.into_inner().unwrap_or_default()).unwrap_or_default()
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One output's tornado chart as SVG: a bar per entry (its `top` most
/// moving), from the lowest to the highest change over the factors, the
/// widest on top; a bar's colour says its source kind.
pub fn tornado_svg(out: &OutputSensitivity, top: usize) -> String {
    use std::fmt::Write;
    let rows: Vec<(&Effect, f64, f64)> = out
        .ranked
        .iter()
        .filter_map(|e| {
            let cs: Vec<f64> = e.sides.iter().filter_map(|s| s.change_pct).collect();
            let lo = cs.iter().copied().fold(0.0f64, f64::min);
            let hi = cs.iter().copied().fold(0.0f64, f64::max);
            (!cs.is_empty()).then_some((e, lo, hi))
        })
        .take(top)
        .collect();
    let span = rows
        .iter()
        .map(|(_, lo, hi)| lo.abs().max(hi.abs()))
        .fold(1e-9f64, f64::max);
    let (label_w, bar_w, row_h) = (300.0, 400.0, 22.0);
    let height = row_h * rows.len().max(1) as f64 + 40.0;
    let width = label_w + bar_w + 80.0;
    let x0 = label_w + bar_w / 2.0;
    let sx = |p: f64| x0 + p / span * (bar_w / 2.0);
    let mut o = String::new();
    let _ = write!(
        o,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    for (i, (e, lo, hi)) in rows.iter().enumerate() {
        let y = 10.0 + row_h * i as f64;
        let colour = match e.kind.as_str() {
            "estimate" => "#d62728",
            "public" => "#2ca02c",
            "paper" => "#1f77b4",
            _ => "#7f7f7f",
        };
        let _ = write!(
            o,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{} [{}]</text>",
            label_w - 6.0,
            y + 14.0,
            esc(&e.entry),
            esc(&e.kind)
        );
        let (a, b) = (sx(*lo), sx(*hi));
        let _ = write!(
            o,
            "<rect x=\"{a:.1}\" y=\"{}\" width=\"{:.1}\" height=\"{}\" fill=\"{colour}\"><title>{}: {:+.2}% .. {:+.2}%</title></rect>",
            y + 3.0,
            (b - a).max(1.0),
            row_h - 6.0,
            esc(&e.entry),
            lo,
            hi
        );
        let _ = write!(
            o,
            "<text x=\"{:.1}\" y=\"{}\">{:+.1}% / {:+.1}%</text>",
            sx(span) + 6.0,
            y + 14.0,
            lo,
            hi
        );
    }
    let yb = 10.0 + row_h * rows.len().max(1) as f64;
    let _ = write!(
        o,
        "<line x1=\"{x0}\" y1=\"5\" x2=\"{x0}\" y2=\"{yb}\" stroke=\"black\"/><text x=\"{x0}\" y=\"{}\" text-anchor=\"middle\">change of the output, % (axis ±{:.1}%)</text></svg>",
        yb + 20.0,
        span
    );
    o
}

/// The analysis as a standalone HTML page: per output its tornado chart
/// and ranked table.
pub fn to_html(a: &Analysis, top: usize, patterns: &[String]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>exitless sensitivity: {t}</title>\
         <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 6px}}td.num{{text-align:right}}</style></head><body>\
         <h1>Sensitivity of {t}</h1><p>{n} calibration entries varied one at a time by ×{f}; {s} skipped without a run; {u} moved no output. \
         Bars: the output's change at the lowest and highest factor; red: an estimate, green: a public source, blue: the paper's.</p>",
        t = esc(&a.target),
        n = a.varied,
        f = a
            .factors
            .iter()
            .map(|f| factor_text(*f))
            .collect::<Vec<_>>()
            .join(" and ×"),
        s = a.skipped.len(),
        u = a.unmoved.len()
    );
    for out in a
        .outputs
        .iter()
        .filter(|x| shown_output(&x.output, patterns))
    {
        if out.ranked.is_empty() {
            continue;
        }
        let _ = write!(
            o,
            "<h2>{}</h2><p>base {}</p>{}<table><tr><th>#</th><th>entry</th><th>kind</th>",
            esc(&out.output),
            opt(out.base),
            tornado_svg(out, top)
        );
        for f in &a.factors {
            let _ = write!(
                o,
                "<th>×{} value</th><th>output</th><th>change</th>",
                factor_text(*f)
            );
        }
        o.push_str("</tr>");
        for (i, e) in out.ranked.iter().take(top).enumerate() {
            let _ = write!(
                o,
                "<tr><td>{}</td><td>{}</td><td>{}</td>",
                i + 1,
                esc(&e.entry),
                esc(&e.kind)
            );
            for s in &e.sides {
                let _ = write!(
                    o,
                    "<td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>",
                    num(s.value),
                    opt(s.output),
                    pct(s.change_pct)
                );
            }
            o.push_str("</tr>");
        }
        o.push_str("</table>");
    }
    o.push_str("</body></html>\n");
    o
}

/// Where a scenario's cached analysis lives: `s.toml` →
/// `s.sensitivity.json` beside it.
pub fn scenario_cache(path: &Path) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("{stem}.sensitivity.json"))
}

/// Where a paper's cached analyses live: `validation/<paper>/sensitivity/`,
/// one file per `--only` (`all.json` without).
pub fn paper_cache_dir(paper: &str) -> PathBuf {
    validation::validation_root()
        .join(paper)
        .join("sensitivity")
}

/// The cache file of `paper` for `--only`.
pub fn paper_cache(paper: &str, only: Option<&str>) -> PathBuf {
    let name: String = only
        .unwrap_or("all")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    paper_cache_dir(paper).join(format!("{name}.json"))
}

/// Per output, the entries it is most sensitive to, as `run --json` and
/// `reproduce --json` carry them.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Provenance {
    /// The analysis it comes from.
    pub analysis: String,
    /// The three entries that move it most (any source kind).
    pub most_sensitive_to: Vec<Brief>,
    /// The three estimates that move it most.
    pub estimates: Vec<Brief>,
}

/// An entry's effect in brief.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Brief {
    /// The entry.
    pub entry: String,
    /// Its source kind.
    pub kind: String,
    /// Its largest change of the output over the factors, %.
    pub swing_pct: Option<f64>,
}

impl Provenance {
    fn of(out: &OutputSensitivity, origin: &str) -> Provenance {
        let brief = |e: &Effect| Brief {
            entry: e.entry.clone(),
            kind: e.kind.clone(),
            swing_pct: e.swing_pct,
        };
        Provenance {
            analysis: origin.to_string(),
            most_sensitive_to: out.ranked.iter().take(3).map(brief).collect(),
            estimates: out
                .ranked
                .iter()
                .filter(|e| e.kind == "estimate")
                .take(3)
                .map(brief)
                .collect(),
        }
    }
}

/// Cached analyses that apply to runs on `cal` with `sets`, as
/// provenance per output name: the files are read in name order and the
/// first one that has an output wins. Files that do not parse, or were
/// made on another calibration or with other overrides, are ignored.
pub fn cached_provenance(
    files: &[PathBuf],
    cal: &Calibration,
    sets: &[String],
) -> BTreeMap<String, Provenance> {
    let fp = fingerprint(cal);
    let mut out = BTreeMap::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        let Ok(a) = serde_json::from_str::<Analysis>(&text) else {
            continue;
        };
        if a.calibration != fp || a.sets != sets {
            continue;
        }
        let origin = f.display().to_string();
        for o in &a.outputs {
            if !o.ranked.is_empty() && !out.contains_key(&o.output) {
                out.insert(o.output.clone(), Provenance::of(o, &origin));
            }
        }
    }
    out
}

/// The cache files of `paper`, in name order.
pub fn paper_cache_files(paper: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(paper_cache_dir(paper))
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_select_keys_and_a_pattern_matching_nothing_is_an_error() {
        assert!(glob_match("exit.*", "exit.hlt_us"));
        assert!(glob_match("*ipi*", "host.ipi_latency_us"));
        assert!(glob_match("exit.hlt_u?", "exit.hlt_us"));
        assert!(!glob_match("exit.*", "host.hz"));
        assert!(glob_match("exit.hlt_us", "exit.hlt_us"));
        let es = calibration_entries(&Calibration::default_host());
        let s = select(&es, &["exit.*".into()]).unwrap();
        assert!(s.len() > 5 && s.iter().all(|k| k.starts_with("exit.")));
        assert!(select(&es, &["nope.*".into()])
            .unwrap_err()
            .contains("nope.*"));
        // Both files are listed, each entry with its kind.
        assert!(es
            .iter()
            .any(|e| e.key == "kvm.halt_poll_us" && e.file == "arm"));
        assert!(es.iter().all(|e| KINDS.contains(&e.kind)));
    }

    #[test]
    fn tied_entries_vary_together_and_stay_consistent() {
        let v = variations(
            &["host.ipi_latency_max_us".into(), "exit.hlt_us".into()],
            &[2.0],
        );
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].entry, "host.ipi_latency_us");
        assert_eq!(v[0].members.len(), 2);
        let cal = Calibration::default_host();
        // Alone, doubling the mean latency would pass the bound.
        let c = perturb(&cal, &v[0].members, 4.0).unwrap();
        assert_eq!(
            c.host.ipi_latency_us.value,
            4.0 * cal.host.ipi_latency_us.value
        );
        // A count stays a whole number inside its range; the clock tag is kept.
        assert_eq!(scaled("nic.rx_ring_size", 512.0, 100.0), 4096.0);
        assert_eq!(scaled("nic.napi_weight", 3.0, 0.5), 2.0);
        let c = perturb(&cal, &["exit.hlt_us".into()], 0.5).unwrap();
        assert_eq!(c.exit.hlt_us.at_ghz, cal.exit.hlt_us.at_ghz);
        assert_eq!(c.exit.hlt_us.source, cal.exit.hlt_us.source);
    }

    /// A headline whose verdict an entry changes is flagged as flipping,
    /// and listed before entries that only move its effect.
    #[test]
    fn a_changed_verdict_is_a_flip() {
        let cal = Calibration::default_host();
        let keys = ["a.flip", "b.small"];
        let factors = [0.5, 2.0];
        let plan = Plan {
            target: Target::Paper {
                paper: "synthetic".into(),
                only: None,
            },
            sets: vec![],
            seeds: Seeds::default(),
            shown: keys.iter().map(|k| entry(k, "estimate")).collect(),
            factors: factors.to_vec(),
            variations: variations(&keys.map(String::from), &factors),
            skipped: vec![],
        };
        let m = |effect: f64, verdict: Verdict| -> Metrics {
            let code = VERDICTS.iter().position(|v| *v == verdict).unwrap() as f64;
            [
                (headline_effect("h"), Some(effect)),
                (headline_verdict("h"), Some(code)),
            ]
            .into_iter()
            .collect()
        };
        let base = m(50.0, Verdict::Reproduced);
        let results = vec![
            m(60.0, Verdict::Reproduced),
            m(10.0, Verdict::Smaller),
            m(49.0, Verdict::Reproduced),
            m(51.0, Verdict::Reproduced),
        ];
        let a = analyze(&plan, &cal, &base, &results);
        assert!(a.outputs.iter().all(|o| !o.output.ends_with("/verdict")));
        let h = &a.headlines[0];
        assert_eq!((h.id.as_str(), h.verdict.as_str()), ("h", "reproduced"));
        assert_eq!(h.entries[0].entry, "a.flip");
        assert!(h.entries[0].flips);
        assert_eq!(h.entries[0].sides[1].verdict, "smaller");
        assert_eq!(h.entries[0].swing_pct, Some(80.0));
        assert_eq!(h.entries[1].entry, "b.small");
        assert!(!h.entries[1].flips);
        let t = to_text(&a, 5, &[]);
        assert!(
            t.contains("headline h: reproduced") && t.contains("FLIP a.flip"),
            "{t}"
        );
    }

    #[test]
    fn a_variation_travels_as_an_overlay_that_gives_it_back() {
        let cal = Calibration::default_host();
        let v = perturb(
            &cal,
            &["kvm.halt_poll_us".into(), "exit.hlt_us".into()],
            2.0,
        )
        .unwrap();
        let text = overlay_text(&v).unwrap();
        let back = crate::calibration_overlay::layered(Some(("v", &text)), &[]).unwrap();
        assert_eq!(fingerprint(&back), fingerprint(&v));
        assert_ne!(fingerprint(&back), fingerprint(&cal));
        assert_eq!(
            back.arm.kvm.halt_poll_us.value,
            2.0 * cal.arm.kvm.halt_poll_us.value
        );
    }

    fn entry(key: &str, kind: &'static str) -> CalEntry {
        CalEntry {
            key: key.into(),
            file: "x86",
            value: 1.0,
            source: String::new(),
            kind,
            at_ghz: None,
            wall: false,
        }
    }

    /// A synthetic entry that dominates an output is ranked first; one
    /// that moves nothing is listed as unmoved.
    #[test]
    fn the_dominant_entry_is_ranked_first() {
        let cal = Calibration::default_host();
        let keys = ["a.small", "b.dominant", "c.none", "d.middle"];
        let factors = [0.5, 2.0];
        let plan = Plan {
            target: Target::Paper {
                paper: "synthetic".into(),
                only: None,
            },
            sets: vec![],
            seeds: Seeds::default(),
            shown: keys.iter().map(|k| entry(k, "estimate")).collect(),
            factors: factors.to_vec(),
            variations: variations(&keys.map(String::from), &factors),
            skipped: vec![],
        };
        // y = 10 + 0.1 a + 100 b + 5 d (each entry 1 in the base run).
        let y = |a: f64, b: f64, d: f64| 10.0 + 0.1 * a + 100.0 * b + 5.0 * d;
        let m = |v: f64| -> Metrics { [("y".to_string(), Some(v))].into_iter().collect() };
        let base = m(y(1.0, 1.0, 1.0));
        let results: Vec<Metrics> = plan
            .variations
            .iter()
            .map(|v| {
                let f = |k: &str| if v.entry == k { v.factor } else { 1.0 };
                m(y(f("a.small"), f("b.dominant"), f("d.middle")))
            })
            .collect();
        let a = analyze(&plan, &cal, &base, &results);
        let ranked: Vec<&str> = a.outputs[0]
            .ranked
            .iter()
            .map(|e| e.entry.as_str())
            .collect();
        assert_eq!(ranked, ["b.dominant", "d.middle", "a.small"]);
        assert_eq!(a.unmoved, ["c.none"]);
        let top = &a.outputs[0].ranked[0];
        // ×2: 10 + 0.1 + 200 + 5 = 215.1 against 115.1.
        let c = top.sides[1].change_pct.unwrap();
        assert!((c - 100.0 * 100.0 / 115.1).abs() < 1e-9, "{c}");
        assert_eq!(top.swing_pct, Some(c));
        // The text and HTML name it first.
        let t = to_text(&a, 2, &[]);
        assert!(
            t.find("b.dominant").unwrap() < t.find("d.middle").unwrap(),
            "{t}"
        );
        assert!(!t.contains("a.small"), "top 2 only: {t}");
        assert!(to_html(&a, 5, &[]).contains("<svg"));
    }
}
