//! `kvm-2026`: today's KVM mechanisms, each visible in what it removes or
//! costs, and each switchable.

use crate::common;
use common::*;

#[test]
fn posted_timers_take_timer_expiries_off_the_vcpu_core() {
    let sets = ["duration_s=0.5", "scheme=apicv"];
    let apicv = run_file("cyclictest.toml", &sets);
    let now = run_file("cyclictest.toml", &["duration_s=0.5", "scheme=kvm-2026"]);
    let off = run_file(
        "cyclictest.toml",
        &[
            "duration_s=0.5",
            "scheme=kvm-2026",
            "hv.posted_timers=false",
        ],
    );
    for r in [&apicv, &now, &off] {
        assert_eq!(r.violations(), 0);
    }
    // APICv: every expiry is a host hrtimer interrupt on the vCPU's core
    // (an external-interrupt exit) on top of the host tick; posted timers
    // leave only the tick.
    let (a, n, o) = (
        rate(&apicv, "EXTERNAL_INTERRUPT"),
        rate(&now, "EXTERNAL_INTERRUPT"),
        rate(&off, "EXTERNAL_INTERRUPT"),
    );
    assert!(n < 1_100.0, "{n}");
    assert!(a > n + 1_500.0, "apicv {a} vs kvm-2026 {n}");
    assert!((o - a).abs() < 50.0, "posted timers off: {o} vs apicv {a}");
    // Programming the timer still exits.
    assert!(rate(&now, "MSR_WRITE") > 1_500.0);
    assert!(
        metric(&now, "cyclictest.latency_mean_us") < metric(&apicv, "cyclictest.latency_mean_us")
    );
}

#[test]
fn halt_polling_trades_host_cpu_for_wakeup_latency() {
    let t = "name = \"halt\"\nseed = 5\nduration_s = 0.1\nwarmup_s = 0.02\n\
             [guest]\nidle = \"halt\"\ntick = \"nohz-idle\"\n[workload.udp]\nrate_pps = 20000\n";
    let poll = run_text(t, &["scheme=kvm-2026"]);
    let nopoll = run_text(t, &["scheme=kvm-2026", "hv.halt_poll=false"]);
    assert_eq!(poll.violations() + nopoll.violations(), 0);
    // Datagrams 50 us apart: the window grows past the gap, so nearly
    // every halt ends in the poll and the thread never sleeps.
    assert!(metric(&poll, "host.halt_poll_successes_per_s") > 15_000.0);
    assert_eq!(metric(&nopoll, "host.halt_poll_pct"), 0.0);
    assert!(metric(&poll, "host.halt_poll_pct") > 50.0);
    let (p, n) = (
        metric(&poll, "udp.latency_mean_us"),
        metric(&nopoll, "udp.latency_mean_us"),
    );
    // What polling saves is the trip through the scheduler.
    assert!(n - p > 2.0, "poll {p} us, no poll {n} us");
    // A cap below the 50 us gaps: halts are longer than the cap, so the
    // window never grows and the vCPU sleeps every time.
    let short = run_text(t, &["scheme=kvm-2026", "hv.halt_poll_max_us=20"]);
    assert!(metric(&short, "host.halt_poll_successes_per_s") < 1_000.0);
    assert_eq!(metric(&short, "kvm2026.halt_poll_grows"), 0.0);
    assert!(metric(&short, "host.vcpu_halts_per_s") > 15_000.0);
}

#[test]
fn a_polling_vcpu_yields_to_a_runnable_thread() {
    // Two halting VMs share core 1: a poll must stop when the other VM's
    // vCPU wakes, or it would starve (its timers would be lost).
    let t = "name = \"two\"\nseed = 1\nduration_s = 0.05\nwarmup_s = 0.005\n[machine]\ncores = 3\n\
             [guest]\nidle = \"halt\"\ntick = \"nohz-idle\"\n\
             [[vm]]\ncore = 1\n[vm.workload.udp]\nrate_pps = 50000\n\
             [[vm]]\ncore = 1\n[vm.workload.cyclictest]\ninterval_us = 200\n";
    let r = run_text(t, &["scheme=kvm-2026"]);
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations.first());
    assert!(metric(&r, "vm1.guest.timer_irqs_per_s") > 4_000.0);
}

#[test]
fn bad_halt_poll_cap_is_rejected() {
    let e = exitless::scenario::Scenario::parse(
        "scheme = \"kvm-2026\"\nduration_s = 0.1\n[hv]\nhalt_poll_max_us = -1\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("hv.halt_poll_max_us"), "{e}");
}

/// kvm-unit-tests' vmexit micro-benchmarks (validation/x86-today/
/// vmexit.toml): each test's cycles move the way the mechanisms say, from
/// the runs themselves.
#[test]
fn vmexit_micro_benchmarks_move_as_the_mechanisms_say() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/validation/x86-today/vmexit.toml"
    ))
    .expect("scenario file");
    let load = |sets: &[&str]| run_text(&text, sets);
    let kvm = load(&["scheme=kvm"]);
    let apicv = load(&["scheme=apicv"]);
    let now = load(&["scheme=kvm-2026"]);
    let atv = load(&["scheme=kvm-2026", "hv.apic_timer_virt=true"]);
    for r in [&kvm, &apicv, &now, &atv] {
        assert_eq!(r.violations(), 0);
    }
    let c = |r: &exitless::report::RunReport, t: &str| metric(r, &format!("vmexit.{t}_cycles"));
    // EOI: an MSR-write exit under stock KVM, virtualized under APICv.
    assert!(c(&kvm, "self_ipi_sti_nop_eoi") > 1000.0);
    assert_eq!(c(&apicv, "self_ipi_sti_nop_eoi"), 0.0);
    // SELF IPI: an exit and an injection under KVM, self-IPI
    // virtualization under APICv (no exit at all for sti; nop).
    assert!(c(&apicv, "x2apic_self_ipi_sti_nop") < c(&kvm, "x2apic_self_ipi_sti_nop") / 4.0);
    // A VMCALL exits under every scheme alike.
    assert_eq!(c(&kvm, "vmcall"), c(&now, "vmcall"));
    // ICR to self: an exit under APICv, IPI virtualization under kvm-2026.
    assert!(c(&now, "self_ipi_sti_nop") < c(&apicv, "self_ipi_sti_nop"));
    // The IPI to a halted CPU: kvm-2026's halt polling keeps CPU 1 from
    // sleeping between IPIs.
    assert!(c(&now, "ipi_halt") < c(&apicv, "ipi_halt"));
    // TSC deadline: exits under KVM and APICv (fewer under kvm-2026's
    // posted timers), none with APIC-timer virtualization.
    for t in ["tscdeadline", "tscdeadline_immed"] {
        assert!(c(&apicv, t) < c(&kvm, t), "{t}");
        assert!(c(&now, t) < c(&apicv, t), "{t}");
        assert!(c(&atv, t) < c(&now, t), "{t}");
    }
    assert!(rate(&atv, "MSR_WRITE") < rate(&now, "MSR_WRITE"));
}
