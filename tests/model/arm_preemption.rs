//! Randomized schedule-out/in on ARM (issue 20 item 2): every ARM scheme
//! must pass the invariant checker (lost, misdelivered, the GIC rules:
//! no list register left active at a blocking schedule-out, no vPE or
//! virtual timer left behind on a core, no doorbell that never wakes)
//! when the host takes a vCPU's core away often and briefly, at random
//! points of the timer, SGI, device and WFI paths.

use crate::common;
use common::*;
use proptest::prelude::*;

/// Every ARM scheme, KVM/ARM in split mode, and kvm-arm-v4 on a GICv4.1
/// (its doorbells and direct vSGIs): (scheme, hyp mode, `[arm] gic`).
const SCHEMES: [(&str, &str, &str); 5] = [
    ("kvm-arm", "vhe", ""),
    ("kvm-arm", "split", ""),
    ("kvm-arm-v4", "vhe", ""),
    ("kvm-arm-v4", "vhe", "v4.1"),
    ("did-arm", "vhe", ""),
];

/// A 2-vCPU guest on dedicated cores for 20 ms after a 5 ms warm-up: SGIs
/// between its vCPUs, a UDP stream through the VF and the ITS, the hrtimer
/// test, host virtual IPIs at `ipi_per_s`; vCPU 0 preempted for `len_us`
/// every `every_us`, each shifted by one of `offsets`.
fn scenario(
    (scheme, hyp, gic): (&str, &str, &str),
    seed: u64,
    every_us: f64,
    len_us: f64,
    offsets: &[f64],
    ipi_per_s: f64,
    halt: bool,
) -> String {
    let idle = if halt { "halt" } else { "poll" };
    let gic = if gic.is_empty() {
        String::new()
    } else {
        format!("gic = \"{gic}\"\n")
    };
    let mut t = format!(
        "name = \"arm-preemption\"\narch = \"arm64\"\nscheme = \"{scheme}\"\nseed = {seed}\n\
         duration_s = 0.02\nwarmup_s = 0.005\n[arm]\nhyp_mode = \"{hyp}\"\n{gic}[machine]\ncores = 4\n\
         [guest]\nhz = 1000\ntick = \"periodic\"\nidle = \"{idle}\"\n[host]\nipi_per_s = {ipi_per_s}\n\
         [[vm]]\nvcpus = 2\ncore = 1\n[vm.workload.ipi_latency]\ninterval_us = 60\n\
         [vm.workload.udp]\nrate_pps = 50000\n"
    );
    t += &preemptions_toml(every_us, len_us, offsets);
    t
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PREEMPTION_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(16),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Short preemptions every few tens of µs with random phase, for every
    /// ARM scheme.
    #[test]
    fn every_arm_scheme_survives_random_short_preemptions(
        seed in 1u64..10_000,
        every_us in 30.0f64..120.0,
        len_frac in 0.1f64..0.8,
        offsets in proptest::collection::vec(0.0f64..10.0, 200),
        ipi_per_s in prop_oneof![Just(0.0), 1_000.0f64..50_000.0],
        halt in any::<bool>(),
    ) {
        let len_us = every_us * len_frac;
        for (scheme, hyp, gic) in SCHEMES {
            let text = scenario((scheme, hyp, gic), seed, every_us, len_us, &offsets, ipi_per_s, halt);
            let r = run_text(&text, &[]);
            check_preempted_run(&r, &format!("{scheme} ({hyp}, gic {gic:?}) seed {seed} every {every_us:.1} us for {len_us:.1} us, {ipi_per_s:.0} host IPIs/s, halt {halt}"));
        }
    }
}
