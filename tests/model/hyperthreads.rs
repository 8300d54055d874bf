//! Hyper-Threading siblings (`machine.smt`, calibration
//! `cpu.smt_shared_speed`; docs/calibration-sources.md §25): a guest's work
//! on a logical CPU whose sibling is busy runs slower; an idle sibling
//! leaves it the core.

use crate::common;
use common::*;

/// A WhileLoop of 1e8 additions (about 29 ms of CPU at 3.4 GHz) in a
/// one-vCPU VM on CPU 1 of a 2-CPU host, with `extra` appended.
fn whileloop(scheme: &str, extra: &str) -> String {
    format!(
        "name = \"ht\"\nscheme = \"{scheme}\"\nseed = 2\nduration_s = 1\nwarmup_s = 0.01\n\
         [workload.whileloop]\niterations = 100000000\n{extra}"
    )
}

fn elapsed(scheme: &str, extra: &str) -> (f64, f64) {
    let r = run_text(&whileloop(scheme, extra), &[]);
    assert_eq!(r.violations(), 0, "{scheme} {extra}");
    (metric(&r, "elapsed_s"), metric(&r, "whileloop.ideal_s"))
}

#[test]
fn a_busy_sibling_slows_the_loop_by_the_shared_speed_and_an_idle_one_does_not() {
    // Host threads exist under a hypervisor (bare metal has no host).
    for scheme in ["kvm", "did"] {
        let (alone, ideal) = elapsed(scheme, "");
        // With two logical CPUs of one core and nothing on CPU 0, the loop
        // has the core: as without Hyper-Threading.
        let (idle_sibling, _) = elapsed(scheme, "[machine]\ncores = 2\nsmt = true\n");
        assert!(
            (idle_sibling - alone).abs() < 1e-4,
            "{scheme}: idle sibling {idle_sibling} s against {alone} s"
        );
        // A CPU-bound host thread on the sibling (CPU 0): every segment of
        // the loop runs at cpu.smt_shared_speed = 0.65.
        let busy = "[machine]\ncores = 2\nsmt = true\n[[host.burners]]\ncores = [0]\n";
        let (shared, _) = elapsed(scheme, busy);
        let r = run_text(&whileloop(scheme, busy), &[]);
        assert!(metric(&r, "host.smt_shared_pct") > 99.0, "{scheme}");
        assert!(
            (shared / ideal - 1.0 / 0.65).abs() < 0.03,
            "{scheme}: {shared} s for {ideal} s of work, at 0.65 expected {}",
            ideal / 0.65
        );
        // Without Hyper-Threading the same burner on CPU 0 changes nothing
        // for the loop on CPU 1.
        let (apart, _) = elapsed(scheme, "[[host.burners]]\ncores = [0]\n");
        assert!(
            (apart - alone).abs() < 1e-4,
            "{scheme}: {apart} against {alone}"
        );
    }
}

#[test]
fn smt_needs_an_even_number_of_cpus() {
    let s = exitless::scenario::Scenario::parse(
        &whileloop("kvm", "[machine]\ncores = 3\nsmt = true\n"),
        &[],
    );
    let e = s.expect_err("3 logical CPUs cannot pair").to_string();
    assert!(e.contains("machine.cores"), "{e}");
}
