//! `exitless._exitless`: the native half of the `exitless` Python package.
//!
//! Thin PyO3 bindings over the library: a scenario is parsed by
//! [`Scenario::load`] / [`Scenario::parse`] with the same `KEY=VALUE`
//! overrides the CLI's `--set` takes, built into a [`World`] and run with the
//! GIL released, and the [`RunReport`](exitless::report::RunReport) comes
//! back as the CLI's `--json` text (its stable schema), which the Python side
//! decodes. Everything a user can get wrong raises `ScenarioError` (a
//! `ValueError`) carrying the library's message, which names the key.

use exitless::calibration::{Calibration, DEFAULT_TOML};
use exitless::scenario::{Scenario, ScenarioError as LibScenarioError};
use exitless::world::World;
use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyValueError};
use pyo3::prelude::*;
use std::path::PathBuf;

pyo3::create_exception!(
    exitless,
    ScenarioError,
    PyValueError,
    "A scenario, override or calibration the library rejected; the message names the key or file."
);

/// Where a scenario or calibration comes from: a file, or its TOML text.
enum Source {
    Path(PathBuf),
    Text(String),
}

impl Source {
    fn of(what: &str, path: Option<PathBuf>, text: Option<String>) -> PyResult<Source> {
        match (path, text) {
            (Some(p), None) => Ok(Source::Path(p)),
            (None, Some(t)) => Ok(Source::Text(t)),
            (None, None) => Err(PyValueError::new_err(format!(
                "give the {what} as `path` or as `text`"
            ))),
            (Some(_), Some(_)) => Err(PyValueError::new_err(format!(
                "give the {what} as `path` or as `text`, not both"
            ))),
        }
    }
}

/// A failure on the way to a report, kept apart from Python types so the
/// simulation can run without the GIL.
enum Failure {
    Io(std::io::ErrorKind, String),
    Invalid(String),
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        match f {
            Failure::Io(std::io::ErrorKind::NotFound, m) => PyFileNotFoundError::new_err(m),
            Failure::Io(_, m) => PyOSError::new_err(m),
            // The library's TOML messages end in a newline.
            Failure::Invalid(m) => ScenarioError::new_err(m.trim_end().to_string()),
        }
    }
}

fn scenario(src: &Source, sets: &[String]) -> Result<Scenario, Failure> {
    let r = match src {
        Source::Path(p) => Scenario::load(p, sets),
        Source::Text(t) => Scenario::parse(t, sets),
    };
    r.map_err(|e| match e {
        LibScenarioError::Io { ref err, .. } => Failure::Io(err.kind(), e.to_string()),
        e => Failure::Invalid(e.to_string()),
    })
}

/// The calibration, with the CLI's messages (`--calibration FILE`).
fn calibration(src: Option<&Source>) -> Result<Calibration, Failure> {
    match src {
        None => Ok(Calibration::default_host()),
        Some(Source::Path(p)) => {
            let t = std::fs::read_to_string(p).map_err(|e| {
                Failure::Io(
                    e.kind(),
                    format!("cannot read calibration {}: {e}", p.display()),
                )
            })?;
            // Layered over the shipped calibration, as the CLI's
            // --calibration: a file may give only some entries.
            let origin = p.display().to_string();
            exitless::calibration_overlay::layered(Some((&origin, &t)), &[])
                .map_err(Failure::Invalid)
        }
        Some(Source::Text(t)) => {
            exitless::calibration_overlay::layered(Some(("calibration", t)), &[])
                .map_err(Failure::Invalid)
        }
    }
}

/// Runs one scenario and returns its report as JSON (the CLI's `--json`
/// schema). The simulation runs with the GIL released, so several Python
/// threads can run scenarios on several cores at once.
#[pyfunction]
#[pyo3(signature = (*, path=None, text=None, sets=Vec::new(), calibration_path=None, calibration_text=None))]
fn run(
    py: Python<'_>,
    path: Option<PathBuf>,
    text: Option<String>,
    sets: Vec<String>,
    calibration_path: Option<PathBuf>,
    calibration_text: Option<String>,
) -> PyResult<String> {
    let src = Source::of("scenario", path, text)?;
    let cal = match (calibration_path, calibration_text) {
        (None, None) => None,
        (p, t) => Some(Source::of("calibration", p, t)?),
    };
    let json = py.detach(move || -> Result<String, Failure> {
        let s = scenario(&src, &sets)?;
        let cal = calibration(cal.as_ref())?;
        let mut w = World::build(&s, &cal).map_err(|e| Failure::Invalid(e.to_string()))?;
        w.run(|_| {});
        serde_json::to_string(&w.report()).map_err(|e| Failure::Invalid(e.to_string()))
    })?;
    Ok(json)
}

/// Parses a scenario with its overrides and returns it, resolved and
/// checked (`config` expanded, defaults filled in), as JSON. Nothing runs.
#[pyfunction]
#[pyo3(signature = (*, path=None, text=None, sets=Vec::new()))]
fn resolve(path: Option<PathBuf>, text: Option<String>, sets: Vec<String>) -> PyResult<String> {
    let s = scenario(&Source::of("scenario", path, text)?, &sets)?;
    serde_json::to_string(&s).map_err(|e| Failure::Invalid(e.to_string()).into())
}

/// Checks a calibration (a file or TOML text); raises if it is rejected.
#[pyfunction]
#[pyo3(signature = (*, path=None, text=None))]
fn check_calibration(path: Option<PathBuf>, text: Option<String>) -> PyResult<()> {
    calibration(Some(&Source::of("calibration", path, text)?))?;
    Ok(())
}

/// JSON → TOML value; `at` is the dotted key, for messages.
fn toml_value(v: &serde_json::Value, at: &str) -> Result<toml::Value, String> {
    use serde_json::Value as J;
    let here = |k: &str| {
        if at.is_empty() {
            k.to_string()
        } else {
            format!("{at}.{k}")
        }
    };
    Ok(match v {
        J::Null => {
            return Err(format!(
                "key `{at}`: None has no TOML form; leave the key out"
            ))
        }
        J::Bool(b) => toml::Value::Boolean(*b),
        J::Number(n) => {
            if let Some(i) = n.as_i64() {
                toml::Value::Integer(i)
            } else if n.is_u64() {
                return Err(format!(
                    "key `{at}`: {n} does not fit a TOML integer (64-bit signed)"
                ));
            } else {
                toml::Value::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        J::String(s) => toml::Value::String(s.clone()),
        J::Array(a) => toml::Value::Array(
            a.iter()
                .enumerate()
                .map(|(i, x)| toml_value(x, &format!("{at}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        J::Object(o) => toml::Value::Table(
            o.iter()
                .map(|(k, x)| Ok((k.clone(), toml_value(x, &here(k))?)))
                .collect::<Result<_, String>>()?,
        ),
    })
}

/// Turns a JSON object (a scenario or calibration given as a Python dict)
/// into TOML text.
#[pyfunction]
fn toml_from_json(json: &str) -> PyResult<String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| ScenarioError::new_err(e.to_string()))?;
    let t = match toml_value(&v, "").map_err(ScenarioError::new_err)? {
        toml::Value::Table(t) => t,
        _ => {
            return Err(ScenarioError::new_err(
                "expected a table (a dict) at the top",
            ))
        }
    };
    toml::to_string(&t).map_err(|e| ScenarioError::new_err(e.to_string()))
}

/// One override as the CLI's `--set` takes it: `KEY=VALUE`, the value
/// (given as JSON) written as a TOML literal, so a Python string stays a
/// string and a number a number.
#[pyfunction]
fn set_string(key: &str, value_json: &str) -> PyResult<String> {
    let key = key.trim();
    if key.is_empty() || key.contains('=') {
        return Err(ScenarioError::new_err(format!(
            "override key `{key}`: expected a dotted scenario key such as `guest.tick`"
        )));
    }
    let v: serde_json::Value = serde_json::from_str(value_json)
        .map_err(|e| ScenarioError::new_err(format!("override `{key}`: {e}")))?;
    let v = toml_value(&v, key).map_err(ScenarioError::new_err)?;
    Ok(format!("{key}={v}"))
}

/// The delivery schemes: (name, one-line summary), the x86 ones and then
/// the arm64 ones (`arch = "arm64"`), as `exitless schemes` lists them.
#[pyfunction]
fn schemes() -> Vec<(&'static str, String)> {
    use exitless::hv::arm::{ARM_SCHEMES, ARM_SCHEME_SUMMARIES};
    use exitless::hv::scheme::{SCHEMES, SCHEME_SUMMARIES};
    let x86 = SCHEMES
        .iter()
        .copied()
        .zip(SCHEME_SUMMARIES.iter().map(|s| s.to_string()));
    let arm = ARM_SCHEMES.iter().copied().zip(
        ARM_SCHEME_SUMMARIES
            .iter()
            .map(|s| format!("(arch = \"arm64\") {s}")),
    );
    let riscv = exitless::hv::riscv::RISCV_SCHEMES.iter().copied().zip(
        exitless::hv::riscv::RISCV_SCHEME_SUMMARIES
            .iter()
            .map(|s| format!("(arch = \"riscv64\") {s}")),
    );
    x86.chain(arm).chain(riscv).collect()
}

/// The shipped calibration's TOML text.
#[pyfunction]
fn default_calibration() -> &'static str {
    DEFAULT_TOML
}

/// The plan of a sensitivity analysis of a scenario (its text and
/// overrides) on a calibration: JSON `{"variations": [{"entry", "factor",
/// "calibration_text"}], "skipped": [...]}`, each variation's calibration
/// as one overlay text (both files) for the workers.
#[pyfunction]
#[pyo3(signature = (*, text, sets=Vec::new(), calibration_text=None, entries=Vec::new(), factors=Vec::new()))]
fn sensitivity_plan(
    text: String,
    sets: Vec<String>,
    calibration_text: Option<String>,
    entries: Vec<String>,
    factors: Vec<f64>,
) -> PyResult<String> {
    use exitless::sensitivity as sens;
    let cal = calibration(calibration_text.map(Source::Text).as_ref())?;
    let target = sens::Target::scenario_text("scenario", &text, &sets).map_err(Failure::Invalid)?;
    let plan = sens::plan(target, &sets, Default::default(), &cal, &entries, &factors)
        .map_err(Failure::Invalid)?;
    let mut vars = Vec::new();
    for v in &plan.variations {
        let c = sens::perturb(&cal, &v.members, v.factor).map_err(Failure::Invalid)?;
        vars.push(serde_json::json!({
            "entry": v.entry,
            "factor": v.factor,
            "calibration_text": sens::overlay_text(&c).map_err(Failure::Invalid)?,
        }));
    }
    let out = serde_json::json!({
        "variations": vars,
        "skipped": plan.skipped,
        "base_calibration_text": sens::overlay_text(&cal).map_err(Failure::Invalid)?,
    });
    Ok(out.to_string())
}

/// The analysis (`exitless sensitivity --json`'s schema) of a plan made by
/// `sensitivity_plan` with the same arguments, from the base run's flat
/// metrics and each variation's (JSON objects, in the plan's order).
#[pyfunction]
#[pyo3(signature = (*, text, base, results, sets=Vec::new(), calibration_text=None, entries=Vec::new(), factors=Vec::new(), origin="scenario".to_string()))]
#[allow(clippy::too_many_arguments)]
fn sensitivity_analyze(
    text: String,
    base: String,
    results: String,
    sets: Vec<String>,
    calibration_text: Option<String>,
    entries: Vec<String>,
    factors: Vec<f64>,
    origin: String,
) -> PyResult<String> {
    use exitless::sensitivity as sens;
    use exitless::sweep::Metrics;
    let cal = calibration(calibration_text.map(Source::Text).as_ref())?;
    let target = sens::Target::scenario_text(&origin, &text, &sets).map_err(Failure::Invalid)?;
    let plan = sens::plan(target, &sets, Default::default(), &cal, &entries, &factors)
        .map_err(Failure::Invalid)?;
    let base: Metrics =
        serde_json::from_str(&base).map_err(|e| Failure::Invalid(format!("base: {e}")))?;
    let results: Vec<Metrics> =
        serde_json::from_str(&results).map_err(|e| Failure::Invalid(format!("results: {e}")))?;
    if results.len() != plan.variations.len() {
        return Err(Failure::Invalid(format!(
            "{} results for {} variations",
            results.len(),
            plan.variations.len()
        ))
        .into());
    }
    let a = sens::analyze(&plan, &cal, &base, &results);
    serde_json::to_string(&a).map_err(|e| Failure::Invalid(e.to_string()).into())
}

#[pymodule]
fn _exitless(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("ScenarioError", m.py().get_type::<ScenarioError>())?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(resolve, m)?)?;
    m.add_function(wrap_pyfunction!(check_calibration, m)?)?;
    m.add_function(wrap_pyfunction!(toml_from_json, m)?)?;
    m.add_function(wrap_pyfunction!(set_string, m)?)?;
    m.add_function(wrap_pyfunction!(schemes, m)?)?;
    m.add_function(wrap_pyfunction!(default_calibration, m)?)?;
    m.add_function(wrap_pyfunction!(sensitivity_plan, m)?)?;
    m.add_function(wrap_pyfunction!(sensitivity_analyze, m)?)?;
    Ok(())
}
