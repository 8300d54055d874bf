//! A guest's work segment that ends before every pending event would be
//! the next event to pop; it ends in place instead, without the queue
//! (docs/performance.md, session 32). A run must be the same either way:
//! the same report and the same number of events.

use crate::common::*;
use exitless::calibration::Calibration;
use exitless::world::World;

/// The report (JSON), events and segments that ended in place of a run of
/// `rel` with `sets`. `through_queue`: every segment goes through the
/// queue (a perturbation with no jitter and ties in order keeps the order
/// and turns the in-place ending off).
fn run(rel: &str, sets: &[&str], through_queue: bool) -> (String, u64, u64) {
    let s = load_scenario(rel, sets);
    let mut w = World::build(&s, &Calibration::default_host()).expect("world builds");
    if through_queue {
        w.perturb(0, 0, false);
    }
    w.run(|_| {});
    let report = serde_json::to_string(&w.report()).expect("report serialises");
    (report, w.events(), w.segments_in_place())
}

fn same_either_way(rel: &str, sets: &[&str]) {
    let (direct, events, in_place) = run(rel, sets, false);
    let (queued, queued_events, none) = run(rel, sets, true);
    assert!(in_place > 0, "{rel}: no segment ended in place");
    assert_eq!(none, 0, "{rel}: a perturbed queue ends no segment in place");
    assert_eq!(events, queued_events, "{rel}: events");
    assert!(direct == queued, "{rel}: the reports differ");
}

#[test]
fn segments_ending_in_place_leave_a_udp_run_unchanged() {
    same_either_way(
        "validation/did/fig4.toml",
        &["rate_pps=600000", "duration_s=0.02"],
    );
}

#[test]
fn segments_ending_in_place_leave_an_smp_memcached_run_unchanged() {
    same_either_way("validation/es2/four-memcached.toml", &["duration_s=0.02"]);
}

#[test]
fn segments_ending_in_place_stop_where_a_finite_loop_ends_the_run() {
    // The run ends at the loop's last segment: one ended in place must
    // not run past it.
    same_either_way(
        "validation/did/whileloop.toml",
        &[
            "workload.whileloop.iterations=100000000",
            "warmup_s=0.01",
            "duration_s=1",
        ],
    );
}
