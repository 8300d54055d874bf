//! Seeded per-operation cost variance (`guest.cost_cv`): at 0 every cost is
//! the calibration's, and a run repeats whatever its seed; above 0 each
//! charge varies around the same mean, from the seed's own stream.

use crate::common;
use common::*;
use exitless::calibration::Calibration;
use exitless::report::RunReport;
use exitless::scenario::Scenario;
use exitless::world::World;
use std::path::PathBuf;

fn run_with(cal: &Calibration, path: &str, sets: &[&str]) -> RunReport {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let s = Scenario::load(&root.join(path), &sets).expect("scenario loads");
    let mut w = World::build(&s, cal).expect("world builds");
    w.run(|_| {});
    w.report()
}

fn with_cv(mut cal: Calibration, cv: f64) -> Calibration {
    cal.guest.cost_cv.value = cv;
    cal
}

/// Bare metal with a periodic sender has no other randomness: with fixed
/// costs two seeds give the same datagram latency; with CV 0.1 they differ,
/// and the mean stays within a few percent of the fixed-cost one.
#[test]
fn fixed_costs_ignore_the_seed_varied_ones_follow_it() {
    let latency = |cv: f64, seed: u32| {
        let cal = with_cv(Calibration::default_host(), cv);
        let seed = format!("seed={seed}");
        let r = run_with(
            &cal,
            "validation/did/fig4.toml",
            &[
                "scheme=bare-metal",
                "workload.udp.burst=1",
                "duration_s=0.1",
                &seed,
            ],
        );
        assert_eq!(r.violations(), 0);
        metric(&r, "udp.latency_mean_us")
    };
    let (f1, f2) = (latency(0.0, 1), latency(0.0, 2));
    assert_eq!(f1, f2, "fixed costs: the seed must not matter");
    let (v1, v2) = (latency(0.1, 1), latency(0.1, 2));
    assert_ne!(v1, v2, "varied costs: two seeds must differ");
    assert_eq!(v1, latency(0.1, 1), "the same seed repeats");
    for v in [v1, v2] {
        assert!((v / f1 - 1.0).abs() < 0.03, "mean {v} vs fixed {f1}");
    }
}

/// ES2's UDP send over virtio with the guest's udp_sendmsg path 150 ns
/// longer, which puts the guest's time per datagram at vhost's per frame:
/// with fixed costs the two stay phase-locked and the guest rarely kicks;
/// variance lets vhost drain the ring more often, so kicks rise with CV.
#[test]
fn variance_smooths_the_kick_cliff_where_guest_and_vhost_tie() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let overlay = std::fs::read_to_string(root.join("validation/es2/testbed.toml")).unwrap();
    let base = exitless::calibration_overlay::layered(
        Some(("testbed.toml", &overlay)),
        &["guest.udp_tx_datagram_ns=950".to_string()],
    )
    .expect("overlay layers");
    let kicks = |cv: f64| {
        let r = run_with(
            &with_cv(base.clone(), cv),
            "validation/es2/single-netperf.toml",
            &[
                "scheme=kvm",
                "workload.netperf.test=\"udp-stream\"",
                "hv.es2_quota=16",
                "duration_s=0.1",
            ],
        );
        assert_eq!(r.violations(), 0);
        rate(&r, "IO_INSTRUCTION")
    };
    let (k0, k1, k2) = (kicks(0.0), kicks(0.1), kicks(0.2));
    assert!(
        k0 < k1 && k1 < k2,
        "kicks/s at CV 0, 0.1, 0.2: {k0} {k1} {k2}"
    );
}
