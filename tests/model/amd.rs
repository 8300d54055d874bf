//! AMD hosts (docs/amd.md): `kvm-svm` and `kvm-avic` deliver every
//! interrupt on the SMP and consolidation scenarios, also under the race
//! explorer; AVIC's exits are the ones its rules give; the inhibits turn it
//! off; and erratum 1235 (a sender that misses IsRunning cleared) is
//! caught as a lost interrupt.

use crate::common;
use common::{explore_opts as opts, load_scenario as scenario, *};
use exitless::calibration::Calibration;
use exitless::explore::explore;

/// Both AMD schemes, with the AVIC in each mode.
const AMD: [(&str, &str); 3] = [
    ("kvm-svm", "hv.avic_mode=x2avic"),
    ("kvm-avic", "hv.avic_mode=x2avic"),
    ("kvm-avic", "hv.avic_mode=xavic"),
];

#[test]
fn amd_schemes_deliver_every_interrupt_on_smp_and_consolidation_scenarios() {
    for file in [
        "scenarios/smp/four-by-four.toml",
        "scenarios/explore/smp-halt.toml",
    ] {
        for (scheme, mode) in AMD {
            let s = scenario(
                file,
                &[&format!("scheme={scheme}"), mode, "duration_s=0.05"],
            );
            let mut w = exitless::world::World::build(&s, &Calibration::default_host()).unwrap();
            w.run(|_| {});
            let r = w.report();
            assert_eq!(
                r.violations(),
                0,
                "{file} {scheme} {mode}: {:?}",
                r.invariants.violations.first()
            );
            assert!(metric(&r, "all.udp.received") > 1000.0, "{file} {scheme}");
        }
    }
}

#[test]
fn amd_schemes_have_no_failing_interleaving() {
    let cal = Calibration::default_host();
    for file in ["smp-halt", "vf-udp", "timer", "halt-cfs"] {
        for (scheme, mode) in AMD {
            let s = scenario(
                &format!("scenarios/explore/{file}.toml"),
                &[&format!("scheme={scheme}"), mode],
            );
            let x = explore(&s, &cal, opts(12), |_, _| {}).unwrap();
            assert_eq!(x.runs, 12);
            assert_eq!(
                x.failing_runs,
                0,
                "{file} {scheme} {mode}: {:?}",
                x.counterexample.map(|c| c.violations)
            );
        }
    }
}

/// Two vCPUs: the receiver on vCPU 0, the VF's interrupt on vCPU 1, so
/// vCPU 0 idles in HLT and wakes only for the reschedule IPI vCPU 1
/// sends it per datagram (NO_HZ idle: no tick wakes it).
fn ipi_to_a_halting_vcpu(extra: &str) -> String {
    ipi_to_a_halting_vcpu_ticking(extra, "nohz-idle")
}

/// The same, with the guest's tick mode `tick`.
fn ipi_to_a_halting_vcpu_ticking(extra: &str, tick: &str) -> String {
    format!(
        "name = \"t\"\nscheme = \"kvm-avic\"\nseed = 2\nduration_s = 0.05\nwarmup_s = 0.005\n{extra}\n\
         [guest]\nidle = \"halt\"\ntick = \"{tick}\"\n[machine]\ncores = 3\n[[vm]]\nvcpus = 2\n\
         cores = [1, 2]\napp_vcpu = 0\nirq_affinity = [1]\n[vm.workload.udp]\nrate_pps = 20000\n"
    )
}

#[test]
fn an_ipi_to_a_halted_vcpu_is_an_incomplete_ipi_and_the_vf_interrupt_goes_through_the_ga_log() {
    let r = run_text(&ipi_to_a_halting_vcpu(""), &[]);
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations.first());
    let ipis = metric(&r, "guest.ipis_sent_per_s") * 0.045;
    let incomplete = metric(&r, "kvm-avic.incomplete_ipis");
    // Most IPIs find vCPU 0 halted (IsRunning clear): each exits and
    // KVM wakes the target.
    assert!(incomplete > 0.5 * ipis, "{incomplete} of {ipis}");
    assert!(rate(&r, "avic_incomplete_ipi") > 0.0);
    // vCPU 1 halts between datagrams too: its VF interrupts find IsRun
    // clear in the GuestMode IRTE and wake it through the GA log.
    assert!(metric(&r, "kvm-avic.ga_log_wakeups") > 100.0);
    // No EOI or ICR write exits with x2AVIC.
    assert_eq!(rate(&r, "msr"), 0.0);
}

#[test]
fn erratum_1235_loses_an_ipi_and_the_checker_and_explorer_catch_it() {
    let r = run_text(&ipi_to_a_halting_vcpu(""), &["hv.avic_erratum_1235=true"]);
    assert!(
        r.invariants
            .counts
            .get(&exitless::check::ViolationKind::Lost)
            .is_some_and(|&n| n > 0),
        "the stale IsRunning leaves vCPU 0 asleep with the IPI in its page"
    );
    let s = exitless::scenario::Scenario::parse(
        &ipi_to_a_halting_vcpu(""),
        &["hv.avic_erratum_1235=true".to_string()],
    )
    .unwrap();
    let x = explore(&s, &Calibration::default_host(), opts(6), |_, _| {}).unwrap();
    assert!(x.failing_runs > 0);
    assert!(x.counterexample.is_some_and(|c| !c.violations.is_empty()));
}

/// With a periodic tick the vCPU the stale IsRunning left asleep is woken
/// by its next tick and takes the IPI then: nothing is pending at the end
/// of the run, but the checker's stranded rule sees it slept with the IPI
/// pending for longer than any wake-up path takes. The same scenario
/// without the erratum has no violation.
#[test]
fn erratum_1235_is_caught_when_a_tick_later_wakes_the_target() {
    let text = ipi_to_a_halting_vcpu_ticking("[check]\nstranded_us = 200", "periodic");
    let r = run_text(&text, &["hv.avic_erratum_1235=true"]);
    let lost = r
        .invariants
        .counts
        .get(&exitless::check::ViolationKind::Lost)
        .copied()
        .unwrap_or(0);
    assert!(lost > 0, "{:?}", r.invariants.violations.first());
    assert!(r
        .invariants
        .violations
        .iter()
        .any(|v| v.detail.contains("stranded")));
    let r = run_text(&text, &[]);
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations.first());
}

#[test]
fn inhibits_switch_avic_off_for_the_vm() {
    // An x2APIC guest on an xAVIC host: APICV_INHIBIT_REASON_X2APIC, the
    // VM runs as kvm-svm does (its ICR and EOI writes exit).
    let r = run_text(&ipi_to_a_halting_vcpu(""), &["hv.avic_mode=xavic"]);
    assert_eq!(r.violations(), 0);
    assert_eq!(metric(&r, "kvm-avic.inhibit.x2apic"), 1.0);
    assert!(rate(&r, "msr") > 0.0);
    assert_eq!(rate(&r, "avic_incomplete_ipi"), 0.0);
    // More vCPUs than xAVIC's physical table holds (APIC IDs 0..=254):
    // PHYSICAL_ID_TOO_BIG; x2AVIC's 512 entries hold them.
    let cores: Vec<String> = (0..256).map(|i| (1 + i % 2).to_string()).collect();
    let big = format!(
        "name = \"t\"\nscheme = \"kvm-avic\"\nduration_s = 0.002\nwarmup_s = 0.001\n\
         [hv]\navic_mode = \"xavic\"\n[machine]\ncores = 3\n[[vm]]\nvcpus = 256\ncores = [{}]\n\
         [vm.workload.udp]\nrate_pps = 1000\n",
        cores.join(", ")
    );
    let big = big.as_str();
    let r = run_text(big, &[]);
    assert_eq!(metric(&r, "kvm-avic.inhibit.physical_id_too_big"), 1.0);
    let r = run_text(big, &["hv.avic_mode=x2avic"]);
    assert_eq!(metric(&r, "kvm-avic.inhibited_vms"), 0.0);
}

/// kvm-unit-tests' vmexit tests on AMD: the x2APIC SELF IPI faults under
/// AVIC and KVM's emulation puts the vector in the backing page's IRR, so
/// every self-IPI is delivered (it was lost when the emulated LAPIC's IRR
/// took it) and costs an exit that xAPIC's accelerated ICR shorthand does
/// not.
#[test]
fn vmexit_self_ipis_are_delivered_under_kvm_svm_and_kvm_avic() {
    let mut cycles = Vec::new();
    for scheme in ["kvm-svm", "kvm-avic"] {
        let set = format!("scheme={scheme}");
        let r = run_path("validation/x86-today/vmexit.toml", &[set.as_str()]);
        assert_eq!(
            r.violations(),
            0,
            "{scheme}: {:?}",
            r.invariants.violations.first()
        );
        let x2 = metric(&r, "vmexit.x2apic_self_ipi_sti_nop_cycles");
        let xapic = metric(&r, "vmexit.self_ipi_sti_nop_cycles");
        assert!(x2 > 0.0 && xapic > 0.0, "{scheme}: {x2} {xapic}");
        cycles.push((x2, xapic));
    }
    let (avic_x2, avic_xapic) = cycles[1];
    assert!(avic_x2 > 2.0 * avic_xapic, "{avic_x2} vs {avic_xapic}");
    assert!(cycles[0].1 > 2.0 * avic_xapic, "kvm-svm's ICR write exits");
}
