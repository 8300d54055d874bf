//! Helpers shared by the scenario tests (each test crate uses a subset).
#![allow(dead_code)]

use exitless::calibration::Calibration;
use exitless::report::RunReport;
use exitless::scenario::Scenario;
use exitless::world::World;
use std::path::PathBuf;

/// Runs the `exitless` binary from the repository root.
pub fn exitless(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_exitless"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .expect("binary runs")
}

/// A scenario file (`rel`: from the repository root) with overrides.
/// `exitless ARGS`, which must succeed (its stderr in the failure).
pub fn ok(args: &[&str]) -> std::process::Output {
    let o = exitless(args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// A fresh, empty scratch directory for one test (`tag` unique per test).
pub fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("exitless-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A path as the `&str` an argument list takes.
pub fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

pub fn load_scenario(rel: &str, sets: &[&str]) -> Scenario {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    Scenario::load(&p, &sets).expect("scenario loads")
}

/// Loads the scenario at `rel` (from the repository root) with `sets`
/// and runs it on the shipped calibration.
pub fn run_path(rel: &str, sets: &[&str]) -> RunReport {
    run(&load_scenario(rel, sets))
}

/// The race explorer's options in the tests: `runs` perturbed runs, up to
/// 3 µs of jitter, ties shuffled, two threads (the machine's cores).
pub fn explore_opts(runs: u64) -> exitless::explore::ExploreOptions {
    exitless::explore::ExploreOptions {
        runs,
        max_jitter: 3_000_000,
        shuffle_ties: true,
        threads: 2,
    }
}

/// Path of a validation scenario.
pub fn scenario_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("validation/did")
        .join(name)
}

/// Runs a validation scenario with overrides.
pub fn run_file(name: &str, sets: &[&str]) -> RunReport {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let s = Scenario::load(&scenario_path(name), &sets).expect("scenario loads");
    run(&s)
}

/// Runs scenario text with overrides.
pub fn run_text(text: &str, sets: &[&str]) -> RunReport {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let s = Scenario::parse(text, &sets).expect("scenario parses");
    run(&s)
}

fn run(s: &Scenario) -> RunReport {
    let mut w = World::build(s, &Calibration::default_host()).expect("world builds");
    w.run(|_| {});
    w.report()
}

/// Exits per second of one reason in VM 0.
pub fn rate(r: &RunReport, reason: &str) -> f64 {
    r.vms[0]
        .exits_per_s_by_reason
        .get(reason)
        .copied()
        .unwrap_or(0.0)
}

#[allow(unused_imports)]
pub use exitless::report::vm_prefix;

/// A workload metric.
pub fn metric(r: &RunReport, name: &str) -> f64 {
    *r.metrics
        .get(name)
        .unwrap_or_else(|| panic!("metric {name} missing"))
}

/// `[[preemptions]]` tables for a randomized-preemption scenario: one of
/// `len_us` every `every_us` from 1 ms on, each shifted by its entry of
/// `offsets` (µs, the case's own randomness).
pub fn preemptions_toml(every_us: f64, len_us: f64, offsets: &[f64]) -> String {
    let mut t = String::new();
    let mut at = 1000.0;
    for o in offsets {
        t += &format!(
            "[[preemptions]]\nat_ms = {:.6}\nfor_ms = {:.6}\n",
            (at + o) / 1000.0,
            len_us / 1000.0
        );
        at += every_us;
    }
    t
}

/// A preempted run is clean: no invariant violation (the first three
/// shown) and more than 50 interrupts delivered, so the run exercised
/// the paths at all.
pub fn check_preempted_run(r: &RunReport, what: &str) {
    let first: Vec<_> = r.invariants.violations.iter().take(3).collect();
    assert_eq!(r.violations(), 0, "{what}: {first:?}");
    assert!(
        r.invariants.delivered > 50,
        "{what}: only {} interrupts",
        r.invariants.delivered
    );
}
