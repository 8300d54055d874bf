//! Directvisor, the DID authors' public KVM code (issue 22,
//! did-implementation.md §2–§4): the guest module's hypercalls must take
//! the timer and IPIs off the exit path, the single-VM branch's global MSR
//! bitmap must make an ordinary second VM lose its timer (and the per-vCPU
//! bitmap must not), and the race explorer must find nothing on small
//! directvisor scenarios.

mod common;
use common::*;
use exitless::calibration::Calibration;
use exitless::check::ViolationKind;
use exitless::explore::{explore, ExploreOptions};
use exitless::report::RunReport;
use exitless::scenario::Scenario;
use exitless::world::World;
use std::path::PathBuf;

fn load(rel: &str, sets: &[&str]) -> Scenario {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    Scenario::load(&p, &sets).expect("scenario loads")
}

fn run(rel: &str, sets: &[&str]) -> RunReport {
    let mut w = World::build(&load(rel, sets), &Calibration::default_host()).expect("builds");
    w.run(|_| {});
    w.report()
}

fn vm_rate(r: &RunReport, vm: usize, reason: &str) -> f64 {
    r.vms[vm]
        .exits_per_s_by_reason
        .get(reason)
        .copied()
        .unwrap_or(0.0)
}

const CYCLICTEST: &str = "validation/directvisor/cyclictest.toml";

#[test]
fn cyclictest_programs_and_takes_its_timer_without_exits() {
    let short = ["duration_s=0.2", "warmup_s=0.01"];
    let dv = run(CYCLICTEST, &[&short[..], &["scheme=directvisor"]].concat());
    assert_eq!(dv.violations(), 0, "{:?}", dv.invariants.violations);
    assert!(metric(&dv, "cyclictest.samples") > 150.0);
    // TMICT writes pass through, the expiry is a posted notification.
    assert_eq!(rate(&dv, "MSR_WRITE"), 0.0);
    assert_eq!(rate(&dv, "EXTERNAL_INTERRUPT"), 0.0);
    assert_eq!(rate(&dv, "HLT"), 0.0);
    // The same guest without the module (an ordinary VM under the same
    // host) traps every TMICT write and takes the expiry as an exit.
    let plain = run(
        CYCLICTEST,
        &[
            &short[..],
            &["scheme=directvisor", "hv.directvisor_plain_vms=[0]"],
        ]
        .concat(),
    );
    assert!(rate(&plain, "MSR_WRITE") >= 900.0, "{:?}", plain.vms[0]);
    assert!(rate(&plain, "EXTERNAL_INTERRUPT") >= 400.0);
    assert!(metric(&dv, "latency_p99_us") < metric(&plain, "latency_p99_us"));
}

#[test]
fn guest_ipis_are_posted_physical_ipis_without_icr_exits() {
    let sets = ["duration_s=0.05", "warmup_s=0.01", "scheme=directvisor"];
    let r = run("scenarios/smp/two-vcpus.toml", &sets);
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
    assert!(metric(&r, "guest.ipis_sent_per_s") > 10_000.0);
    assert_eq!(rate(&r, "MSR_WRITE"), 0.0, "no ICR-write exit");
    assert_eq!(rate(&r, "EXTERNAL_INTERRUPT"), 0.0);
    let plain = run(
        "scenarios/smp/two-vcpus.toml",
        &[&sets[..], &["hv.directvisor_plain_vms=[0]"]].concat(),
    );
    assert!(rate(&plain, "MSR_WRITE") > 10_000.0, "ICR writes trap");
}

#[test]
fn the_global_msr_bitmap_makes_an_ordinary_second_vm_lose_its_timer() {
    let rel = "scenarios/explore/directvisor-two-vms.toml";
    let per_vcpu = run(rel, &[]);
    assert_eq!(
        per_vcpu.violations(),
        0,
        "{:?}",
        per_vcpu.invariants.violations
    );
    assert!(
        vm_rate(&per_vcpu, 1, "MSR_WRITE") > 0.0,
        "VM 1's TMICT traps"
    );
    let global = run(rel, &["hv.directvisor_global_msr_bitmap=true"]);
    assert!(
        global
            .invariants
            .counts
            .get(&ViolationKind::Lost)
            .copied()
            .unwrap_or(0)
            >= 1
    );
    assert!(
        global
            .invariants
            .violations
            .iter()
            .any(|v| v.vm == 1 && v.detail.contains("timer")),
        "{:?}",
        global.invariants.violations
    );
    assert_eq!(
        vm_rate(&global, 1, "MSR_WRITE"),
        0.0,
        "VM 1's TMICT reached the real LAPIC"
    );
}

fn opts(runs: u64) -> ExploreOptions {
    ExploreOptions {
        runs,
        max_jitter: 3_000_000,
        shuffle_ties: true,
        threads: 2,
    }
}

#[test]
fn the_explorer_finds_no_violation_on_small_directvisor_scenarios() {
    let cal = Calibration::default_host();
    for file in ["directvisor-smp", "directvisor-two-vms", "timer"] {
        let s = load(
            &format!("scenarios/explore/{file}.toml"),
            &["scheme=directvisor"],
        );
        let x = explore(&s, &cal, opts(30), |_, _| {}).unwrap();
        assert_eq!(x.runs, 30);
        assert_eq!(
            x.failing_runs,
            0,
            "{file}: {:?}",
            x.counterexample.map(|c| c.violations)
        );
    }
    let s = load(
        "scenarios/explore/directvisor-two-vms.toml",
        &["hv.directvisor_global_msr_bitmap=true"],
    );
    let x = explore(&s, &cal, opts(4), |_, _| {}).unwrap();
    assert_eq!(x.failing_runs, 4, "the single-VM rule fails in every run");
}
