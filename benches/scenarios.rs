//! The issue 25 scenarios, each run in its own process so that its peak
//! memory is its own: events, events/s, CPU and wall seconds per simulated
//! second of the run itself (building the world and the report left out)
//! and peak resident memory (getrusage `ru_maxrss`). CPU seconds per
//! simulated second is the figure to compare across versions: the number
//! of events a mechanism takes is not a model output and may change. Run with
//! `cargo bench --bench scenarios` (docs/performance.md, "The benchmark");
//! `cargo bench --bench scenarios -- NAME` runs the rows whose name
//! contains NAME.

use exitless::calibration::Calibration;
use exitless::scenario::Scenario;
use exitless::world::World;
use std::process::Command;
use std::time::Instant;

/// (name, scenario file from the workspace root, overrides).
const RUNS: &[(&str, &str, &[&str])] = &[
    (
        "fig4 DID 600 kpps",
        "validation/did/fig4.toml",
        &["rate_pps=600000", "duration_s=0.5"],
    ),
    (
        "4x4 apicv",
        "scenarios/smp/four-by-four.toml",
        &["duration_s=1"],
    ),
    (
        "4x4 eli",
        "scenarios/smp/four-by-four.toml",
        &["duration_s=1", "scheme=eli"],
    ),
    (
        "ES2 four-memcached",
        "validation/es2/four-memcached.toml",
        &["duration_s=0.3"],
    ),
    (
        "consolidation, 8 memcached VMs",
        "validation/consolidation/memcached.toml",
        &["vm.0.copies=8", "duration_s=0.2"],
    ),
    (
        "consolidation, 256 memcached VMs",
        "scenarios/scale/consolidation-256.toml",
        &[],
    ),
    (
        "1,000 VMs on 384 cores",
        "scenarios/scale/host-1000.toml",
        &[],
    ),
];

/// CPU time this thread has used, in seconds: on a machine shared with
/// other jobs it moves less than wall time does.
fn thread_cpu_s() -> f64 {
    // SAFETY: clock_gettime only writes the struct it is given.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn peak_rss_mb() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_maxrss as f64 / 1024.0
}

/// Runs row `i` in this process and prints its line.
fn run_one(i: usize) {
    let (name, file, sets) = RUNS[i];
    let root = env!("CARGO_MANIFEST_DIR");
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let path = std::path::Path::new(root).join(file);
    let s = Scenario::load(&path, &sets).expect("scenario loads");
    let cal = Calibration::default_host();
    let mut w = World::build(&s, &cal).expect("builds");
    let t0 = Instant::now();
    let c0 = thread_cpu_s();
    w.run(|_| {});
    let cpu = thread_cpu_s() - c0;
    let dt = t0.elapsed().as_secs_f64();
    let sim = s.duration_s + s.warmup_s;
    let ev = w.events() as f64;
    println!(
        "| {name} | {:.0} | {:.2} | {:.3} | {:.3} | {:.0} |",
        ev,
        ev / dt / 1e6,
        cpu / sim,
        dt / sim,
        peak_rss_mb()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--row") {
        let row = args.get(i + 1).and_then(|r| r.parse().ok()).expect("row");
        return run_one(row);
    }
    // `cargo bench` passes `--bench`; any other word filters rows.
    let filter: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    println!(
        "| scenario | events | M events/s | CPU s per simulated s | wall s per simulated s | peak MB |"
    );
    println!("|---|---|---|---|---|---|");
    let me = std::env::current_exe().expect("own path");
    for (i, (name, _, _)) in RUNS.iter().enumerate() {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        let st = Command::new(&me)
            .args(["--row", &i.to_string()])
            .status()
            .expect("runs");
        assert!(st.success(), "{name} failed");
    }
}
