//! The invariant checker on whole runs: the naive design of DID Fig. 3 is
//! caught; every other scheme is clean on every validation scenario, with
//! either network device.

use crate::common;
use common::*;
use exitless::check::ViolationKind;

#[test]
fn naive_design_is_caught_on_the_figure3_scenario() {
    let r = run_file("figure3.toml", &[]);
    assert_eq!(r.scheme, "naive");
    let c = &r.invariants.counts;
    assert!(c[&ViolationKind::EoiWithoutInService] > 0, "{c:?}");
    assert!(c[&ViolationKind::IsrInconsistent] > 0, "{c:?}");
    assert!(c[&ViolationKind::Lost] > 0, "{c:?}");
    assert!(!r.invariants.violations.is_empty());
}

#[test]
fn kvm_did_and_bare_metal_are_clean_on_figure3() {
    for scheme in ["kvm", "apicv", "eli", "did", "bare-metal"] {
        let r = run_file("figure3.toml", &[&format!("scheme={scheme}")]);
        assert_eq!(r.violations(), 0, "{scheme}: {:?}", r.invariants.violations);
        // and they actually delivered both kinds of interrupt
        assert!(
            r.invariants.delivered > 5_000,
            "{scheme}: {}",
            r.invariants.delivered
        );
        assert!(
            metric(&r, "cyclictest.latency_mean_us") > 0.0,
            "{scheme}: timer never woke cyclictest"
        );
    }
}

#[test]
fn nesting_guest_with_late_eoi_is_clean_under_kvm_and_did() {
    // Handlers that re-enable interrupts and EOI at their end let a higher
    // vector nest: the LAPIC (physical for DID, emulated for KVM) must keep
    // the priority order and match every EOI to its vector.
    for scheme in ["kvm", "did", "bare-metal"] {
        let r = run_file(
            "figure3.toml",
            &[&format!("scheme={scheme}"), "guest.irq_nesting=true"],
        );
        assert_eq!(r.violations(), 0, "{scheme}: {:?}", r.invariants.violations);
        assert!(r.invariants.delivered > 5_000);
    }
}

#[test]
fn every_validation_scenario_is_clean_under_kvm_and_did() {
    for file in ["fig4.toml", "cyclictest.toml", "whileloop.toml"] {
        for scheme in ["kvm", "apicv", "eli", "did", "bare-metal"] {
            let mut sets = vec![format!("scheme={scheme}"), "duration_s=0.1".to_string()];
            if file == "whileloop.toml" {
                sets.push("iterations=1e8".into());
                sets.push("rate_pps=400000".into());
            }
            let sets: Vec<&str> = sets.iter().map(|s| s.as_str()).collect();
            let r = run_file(file, &sets);
            assert_eq!(
                r.violations(),
                0,
                "{file} {scheme}: {:?}",
                r.invariants.violations
            );
        }
    }
}

const STRESS: &str = r#"
scheme = "did"
duration_s = 0.2
warmup_s = 0.01
[host]
ipi_per_s = 2000
[workload.udp]
rate_pps = 100000
[workload.cyclictest]
interval_us = 1000
[[preemptions]]
at_ms = 50
for_ms = 3
[[preemptions]]
at_ms = 120.3
for_ms = 0.7
"#;

#[test]
fn did_survives_deschedules_and_host_ipis() {
    let r = run_text(STRESS, &[]);
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
    // Host IPIs reach the VM core as NMIs (DID §4.5), nothing else exits for them.
    assert!(
        rate(&r, "EXCEPTION_NMI") > 1000.0,
        "{:?}",
        r.vms[0].exits_per_s_by_reason
    );
    assert_eq!(rate(&r, "EXTERNAL_INTERRUPT"), 0.0);
    // The 3 ms preemption shows up as one late cyclictest wakeup, not a loss.
    let max = metric(&r, "cyclictest.latency_max_us");
    assert!(max > 1000.0 && max < 4000.0, "{max}");
}

#[test]
fn kvm_and_apicv_survive_deschedules_and_host_ipis() {
    // apicv with VT-d posted interrupts: posts to a preempted vCPU (SN set)
    // wait in PIR until it is loaded again.
    for sets in [
        vec!["scheme=kvm"],
        vec!["scheme=apicv"],
        vec!["scheme=apicv", "hv.vtd_posted_interrupts=true"],
    ] {
        let scheme = sets.join(" ");
        let r = run_text(STRESS, &sets);
        assert_eq!(r.violations(), 0, "{scheme}: {:?}", r.invariants.violations);
        assert_eq!(rate(&r, "EXCEPTION_NMI"), 0.0);
    }
}

#[test]
fn every_scheme_is_clean_on_every_validation_scenario() {
    use exitless::calibration::Calibration;
    use exitless::scenario::Scenario;
    use exitless::world::World;
    let cal = Calibration::default_host();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("validation");
    let mut files: Vec<_> = ["did", "eli"]
        .iter()
        .flat_map(|p| std::fs::read_dir(root.join(p)).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .filter(|p| !p.ends_with("experiments.toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "{files:?}");
    let mut runs = 0;
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        for scheme in ["bare-metal", "kvm", "apicv", "eli", "elvis", "did"] {
            for device in ["vf", "virtio"] {
                let mut sets = vec![
                    format!("scheme={scheme}"),
                    format!("net.device={device}"),
                    "duration_s=0.05".to_string(),
                    "warmup_s=0.01".to_string(),
                ];
                if name == "sip.toml" {
                    sets.push("workload.sip.calls=20".into());
                }
                let s = match Scenario::load(f, &sets) {
                    Ok(s) => s,
                    // Only combinations that need a hypervisor on bare
                    // metal are refused, and with a reason.
                    Err(e) => {
                        assert_eq!(scheme, "bare-metal", "{name} {device}: {e}");
                        assert!(e.to_string().contains("hypervisor"), "{e}");
                        continue;
                    }
                };
                let mut w = World::build(&s, &cal).expect("builds");
                w.run(|_| {});
                let r = w.report();
                assert_eq!(
                    r.violations(),
                    0,
                    "{name} {scheme} {device}: {:?}",
                    r.invariants.violations
                );
                runs += 1;
            }
        }
    }
    assert!(runs >= 100, "{runs}");
}
