//! RISC-V with the AIA on the timed platform (docs/riscv.md): each scheme
//! delivers every interrupt; the exits each guest event takes follow the
//! controls (a guest file, the software file, Sstc or the SBI timer, the
//! PLIC, DID's dedicated harts); the race explorer finds nothing under
//! preemption and shared harts; a migration that drops the old file's
//! pending bits is caught as a lost interrupt; and the arch key refuses
//! what does not belong together.

use crate::common;
use common::{explore_opts as opts, load_scenario as scenario, *};
use exitless::calibration::Calibration;
use exitless::check::ViolationKind;
use exitless::explore::explore;

const EVENTS: &str = "validation/riscv/events.toml";

/// Exits per event class of `events.toml` under `sets`.
fn events(sets: &[&str]) -> exitless::report::RunReport {
    let r = run_path(EVENTS, &[&["duration_s=0.05"], sets].concat());
    assert_eq!(
        r.violations(),
        0,
        "{sets:?}: {:?}",
        r.invariants.violations.first()
    );
    assert!(metric(&r, "udp.received") > 400.0, "{sets:?}");
    assert!(metric(&r, "ipi.samples") > 200.0, "{sets:?}");
    r
}

#[test]
fn a_guest_file_leaves_only_the_device_interrupts_host_exit() {
    let r = events(&["scheme=kvm-riscv"]);
    for class in ["timer_program", "timer_expiry", "eoi", "vcpu_ipi"] {
        assert_eq!(
            metric(&r, &format!("exits_per_event.{class}")),
            0.0,
            "{class}"
        );
    }
    // The VF's MSI is the host's (no irqbypass upstream): one SEI exit.
    let d = metric(&r, "exits_per_event.device");
    assert!((0.9..=1.01).contains(&d), "{d}");
}

#[test]
fn the_software_file_traps_the_claim_and_the_ipi_store() {
    let r = events(&["scheme=kvm-riscv", "machine.riscv_guest_files=0"]);
    // Device: the host's SEI, then the vstopei claim (VGEIN = 0).
    let d = metric(&r, "exits_per_event.device");
    assert!((1.9..=2.01).contains(&d), "{d}");
    // IPI: the sender's store guest-page fault, the kick's SEI on the
    // target, the target's claim.
    assert_eq!(metric(&r, "exits_per_event.vcpu_ipi"), 3.0);
    assert!(rate(&r, "GUEST_PAGE_FAULT") > 0.0);
}

#[test]
fn without_sstc_each_timer_programming_and_expiry_exits() {
    let r = events(&["scheme=kvm-riscv", "hv.riscv_sstc=false"]);
    // (An event of the warm-up whose exit falls in the measured interval
    // counts its exit only.)
    for class in ["timer_program", "timer_expiry"] {
        let x = metric(&r, &format!("exits_per_event.{class}"));
        assert!((0.98..=1.02).contains(&x), "{class}: {x}");
    }
    assert!(rate(&r, "SBI_ECALL") > 0.0);
}

#[test]
fn the_emulated_plic_traps_claims_completions_and_sbi_ipis() {
    let r = events(&["scheme=kvm-riscv-sw"]);
    let d = metric(&r, "exits_per_event.device");
    assert!((1.9..=2.01).contains(&d), "{d}");
    assert!(metric(&r, "exits_per_event.eoi") > 0.0);
    assert_eq!(metric(&r, "exits_per_event.vcpu_ipi"), 2.0);
}

#[test]
fn did_riscv_takes_no_exit_for_any_guest_event() {
    let r = events(&["scheme=did-riscv"]);
    assert_eq!(r.vms[0].exits_per_s, 0.0);
    for class in ["timer_program", "timer_expiry", "eoi", "device", "vcpu_ipi"] {
        assert_eq!(
            metric(&r, &format!("exits_per_event.{class}")),
            0.0,
            "{class}"
        );
    }
}

#[test]
fn a_wfi_exit_blocks_the_vcpu_and_the_sgei_or_timer_wakes_it() {
    for s in ["kvm-riscv", "kvm-riscv-sw"] {
        let r = run_path(
            "validation/riscv/ipi.toml",
            &[&format!("scheme={s}"), "duration_s=0.05"],
        );
        assert_eq!(r.violations(), 0, "{s}");
        assert!(metric(&r, "ipi.samples") > 400.0, "{s}");
        assert!(rate(&r, "VIRTUAL_INST") > 0.0, "{s}: WFI traps");
        // The receiver's thread sleeps and wakes (the wake-up latency).
        assert!(metric(&r, "ipi.latency_p50_us") > 3.0, "{s}");
        let r = run_path(
            "validation/riscv/idle.toml",
            &[&format!("scheme={s}"), "duration_s=0.05"],
        );
        assert_eq!(r.violations(), 0, "{s}");
        assert!(metric(&r, "hrtimer.samples") > 90.0, "{s}");
    }
    // WFI untrapped: the hart waits in VS mode.
    let r = run_path(
        "validation/riscv/ipi.toml",
        &["scheme=did-riscv", "duration_s=0.05"],
    );
    assert_eq!(r.vms[0].exits_per_s, 0.0);
    assert!(metric(&r, "ipi.latency_p50_us") < 1.0);
}

#[test]
fn the_race_explorer_finds_nothing_on_the_riscv_schemes() {
    let cal = Calibration::default_host();
    let cases = [
        ("riscv-preempt", "kvm-riscv"),
        ("riscv-preempt", "kvm-riscv-sw"),
        ("riscv-preempt", "did-riscv"),
        ("riscv-shared-harts", "kvm-riscv"),
        ("riscv-shared-harts", "kvm-riscv-sw"),
    ];
    for (file, s) in cases {
        let sc = scenario(
            &format!("scenarios/explore/{file}.toml"),
            &[&format!("scheme={s}")],
        );
        let x = explore(&sc, &cal, opts(6), |_, _| {}).unwrap();
        assert_eq!(x.runs, 6);
        assert_eq!(
            x.failing_runs,
            0,
            "{file} {s}: {:?}",
            x.counterexample.map(|c| c.violations)
        );
    }
}

#[test]
fn a_migration_that_drops_the_old_files_pending_bits_is_caught_as_lost() {
    let file = "scenarios/explore/riscv-shared-harts.toml";
    let sets = ["hv.riscv_migrate_drop_pending=true"];
    let r = run_path(file, &sets);
    assert!(
        r.invariants
            .counts
            .get(&ViolationKind::Lost)
            .is_some_and(|&n| n > 0),
        "{:?}",
        r.invariants
    );
    let x = explore(
        &scenario(file, &sets),
        &Calibration::default_host(),
        opts(4),
        |_, _| {},
    )
    .unwrap();
    assert!(x.failing_runs > 0);
    assert!(x.counterexample.is_some_and(|c| !c.violations.is_empty()));
}

#[test]
fn the_arch_key_and_the_scheme_must_belong_together() {
    let base = "name = \"t\"\nseed = 1\nduration_s = 0.01\n";
    let e = exitless::scenario::Scenario::parse(
        &format!("{base}arch = \"riscv64\"\nscheme = \"kvm\"\n"),
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("riscv64") && e.contains("kvm-riscv"), "{e}");
    let e = exitless::scenario::Scenario::parse(&format!("{base}scheme = \"did-riscv\"\n"), &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("arch = \"riscv64\""), "{e}");
    let e = exitless::scenario::Scenario::parse(
        &format!("{base}arch = \"riscv\"\nscheme = \"kvm-riscv\"\n"),
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("riscv64"), "{e}");
}

#[test]
fn did_riscv_refuses_shared_harts() {
    let s = scenario(
        "scenarios/explore/riscv-shared-harts.toml",
        &["scheme=did-riscv"],
    );
    let e = exitless::world::World::build(&s, &Calibration::default_host())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("did-riscv") && e.contains("dedicated hart"),
        "{e}"
    );
}

#[test]
fn a_riscv_run_is_deterministic() {
    let a = run_path(EVENTS, &["duration_s=0.02", "scheme=kvm-riscv-sw"]);
    let b = run_path(EVENTS, &["duration_s=0.02", "scheme=kvm-riscv-sw"]);
    assert_eq!(
        serde_json::to_string(&a.metrics).unwrap(),
        serde_json::to_string(&b.metrics).unwrap()
    );
}

#[test]
fn the_riscv_calibration_reaches_the_world() {
    // The vCPU thread's wake-up is on the IPI path to a blocked receiver:
    // doubling it moves the latency by the difference.
    let base = run_path("validation/riscv/ipi.toml", &["duration_s=0.02"]);
    let cal = exitless::calibration_overlay::layered(None, &["kvm_riscv.vcpu_wakeup_us=6".into()])
        .unwrap();
    let s = scenario("validation/riscv/ipi.toml", &["duration_s=0.02"]);
    let mut w = exitless::world::World::build(&s, &cal).unwrap();
    w.run(|_| {});
    let slow = w.report();
    let d = metric(&slow, "ipi.latency_p50_us") - metric(&base, "ipi.latency_p50_us");
    assert!((2.9..=3.1).contains(&d), "{d}");
}
