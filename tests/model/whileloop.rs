//! WhileLoop: the run ends when the loop does, so the measured interval
//! (the end of the warm-up to the loop's end) must not be empty.

use crate::common;
use common::*;
use exitless::calibration::Calibration;
use exitless::scenario::Scenario;
use exitless::world::World;

fn build(sets: &[&str]) -> Result<World, String> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let s = Scenario::load(&scenario_path("whileloop.toml"), &sets).expect("scenario loads");
    World::build(&s, &Calibration::default_host()).map_err(|e| e.to_string())
}

#[test]
fn a_loop_shorter_than_the_warm_up_is_rejected_naming_both_keys() {
    // 1e6 additions take about 0.3 ms of CPU: over before a 50 ms warm-up.
    let e = build(&[
        "workload.whileloop.iterations=1000000",
        "warmup_s=0.05",
        "duration_s=1",
    ])
    .err()
    .expect("a loop that ends in the warm-up must not build");
    assert!(e.contains("workload.whileloop.iterations"), "{e}");
    assert!(e.contains("warmup_s"), "{e}");
}

#[test]
fn the_measured_interval_runs_from_the_warm_up_to_the_loop_end() {
    // 1e8 additions (about 29 ms of CPU) after a 10 ms warm-up.
    let r = run_file(
        "whileloop.toml",
        &[
            "workload.whileloop.iterations=100000000",
            "warmup_s=0.01",
            "duration_s=1",
        ],
    );
    let elapsed = metric(&r, "elapsed_s");
    let ideal = metric(&r, "whileloop.ideal_s");
    assert!(elapsed >= ideal, "{elapsed} < {ideal}");
    // The loop started within the warm-up; the measurement at 10 ms.
    assert!(
        r.duration_s >= elapsed - 0.01 - 1e-9 && r.duration_s < elapsed,
        "measured {} s, loop {elapsed} s",
        r.duration_s
    );
}

#[test]
fn in_vm_form_the_short_loop_error_names_the_vm_key() {
    let text = "scheme = \"did\"\nduration_s = 1\nwarmup_s = 0.05\n\
                [[vm]]\ncore = 1\n[vm.workload.whileloop]\niterations = 1000000\n";
    let s = Scenario::parse(text, &[]).expect("scenario parses");
    let e = World::build(&s, &Calibration::default_host())
        .err()
        .expect("a loop that ends in the warm-up must not build")
        .to_string();
    assert!(e.contains("vm[0].workload.whileloop.iterations"), "{e}");
}
