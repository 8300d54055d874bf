//! ELI's mechanisms from the outside: assigned interrupts reach the guest
//! and are completed without exits, host vectors bounce through #NP, virtual
//! interrupts switch the vCPU to injection mode, and the shadow IDT is what
//! keeps host vectors out of the guest.

use crate::common;
use common::*;
use exitless::calibration::Calibration;
use exitless::check::ViolationKind;
use exitless::hv::eli::Eli;
use exitless::hv::exits::ExitInfo;
use exitless::hv::scheme::{ExitOutcome, Scheme};
use exitless::hv::HvCx;
use exitless::hw::x86::idt::ShadowIdt;
use exitless::scenario::Scenario;
use exitless::world::World;

#[test]
fn assigned_interrupts_are_direct_host_vectors_bounce() {
    // A periodic sender: VF interrupts far outnumber the timer's.
    let periodic = "workload.udp.burst=1";
    let kvm = run_file("fig4.toml", &["scheme=kvm", "duration_s=0.2", periodic]);
    let eli = run_file("fig4.toml", &["scheme=eli", "duration_s=0.2", periodic]);
    let nic = metric(&eli, "nic.interrupts_per_s");
    assert!(nic > 5000.0, "{nic}");
    // The VF's interrupts no longer exit, nor do their EOIs, but for the
    // few that arrive while an injected timer interrupt holds the vCPU in
    // injection mode (external-interrupt exiting back on; ELI Fig. 1's
    // t6-t7), which the guest's varying costs let happen now and then.
    let extint = rate(&eli, "EXTERNAL_INTERRUPT");
    assert!(extint < 0.001 * nic, "{extint} of {nic}");
    assert!(
        rate(&eli, "MSR_WRITE") < 0.2 * nic,
        "{}",
        rate(&eli, "MSR_WRITE")
    );
    assert!(rate(&kvm, "MSR_WRITE") >= nic);
    // The host's own interrupts on the VM's core (its tick and the hrtimer
    // that emulates the guest's timer) bounce as #NP exits: about two per ms.
    let np = rate(&eli, "EXCEPTION_NMI");
    assert!((1500.0..=2500.0).contains(&np), "{np}");
    // The timer stays emulated: TMICT writes and the injected timer's EOIs
    // still exit, once each per guest tick.
    assert!(
        rate(&eli, "MSR_WRITE") >= 1900.0,
        "{}",
        rate(&eli, "MSR_WRITE")
    );
    assert_eq!(eli.violations(), 0, "{:?}", eli.invariants.violations);
    assert!(eli.vms[0].tig_pct > kvm.vms[0].tig_pct);
}

#[test]
fn injection_mode_mixes_assigned_and_virtual_interrupts_cleanly() {
    // VF interrupts plus a 1 kHz guest timer: every timer expiry is a
    // virtual interrupt, so ELI keeps entering injection mode, and VF
    // interrupts that arrive meanwhile exit and are injected.
    for nesting in ["false", "true"] {
        let r = run_file(
            "figure3.toml",
            &["scheme=eli", &format!("guest.irq_nesting={nesting}")],
        );
        assert_eq!(
            r.violations(),
            0,
            "{nesting}: {:?}",
            r.invariants.violations
        );
        assert!(r.invariants.delivered > 5_000);
        let kvm = run_file("figure3.toml", &["scheme=kvm"]);
        let ext = rate(&r, "EXTERNAL_INTERRUPT");
        assert!(ext < 0.1 * rate(&kvm, "EXTERNAL_INTERRUPT"), "{ext}");
        assert!(metric(&r, "cyclictest.latency_mean_us") > 0.0);
    }
}

/// ELI with a broken shadow IDT: the guest's gates copied verbatim, so host
/// vectors run guest handlers instead of exiting.
struct EliWithoutShadowProtection(Eli);

impl Scheme for EliWithoutShadowProtection {
    fn name(&self) -> &'static str {
        "eli-unprotected"
    }
    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        self.0.setup_vm(cx, vm);
        for &v in &cx.hv.vms[vm].vcpus.clone() {
            cx.m.shadow_idt[v] = ShadowIdt::copy_of_guest();
        }
    }
    fn handle_exit(&mut self, cx: &mut HvCx, vcpu: usize, info: ExitInfo) -> ExitOutcome {
        self.0.handle_exit(cx, vcpu, info)
    }
    fn prepare_entry(&mut self, cx: &mut HvCx, vcpu: usize) {
        self.0.prepare_entry(cx, vcpu)
    }
    fn guest_isr(&self, cx: &HvCx, vcpu: usize) -> exitless::hw::x86::lapic::ApicBitmap {
        self.0.guest_isr(cx, vcpu)
    }
}

#[test]
fn without_the_shadow_idt_host_vectors_leak_into_the_guest() {
    let s = Scenario::load(&scenario_path("fig4.toml"), &["duration_s=0.05".into()]).unwrap();
    let mut w = World::build_with(
        &s,
        &Calibration::default_host(),
        Box::new(EliWithoutShadowProtection(Eli::default())),
    )
    .unwrap();
    w.run(|_| {});
    let r = w.report();
    // The host tick's vector runs the guest's timer handler: an interrupt the
    // guest never raised, and the host's hrtimers starve.
    assert!(r.violations() > 0);
    assert!(
        r.invariants
            .counts
            .contains_key(&ViolationKind::Misdelivered)
            || r.invariants.counts.contains_key(&ViolationKind::Lost),
        "{:?}",
        r.invariants.counts
    );
}

#[test]
fn reproduce_eli_reports_percent_of_bare_metal() {
    let rows = exitless::validation::reproduce(
        "eli",
        None,
        &["duration_s=0.03".into()],
        exitless::validation::Seeds::default(),
        &Calibration::default_host(),
        2,
        &|_| {},
    )
    .unwrap();
    let row = |exp: &str, cfg: &str| {
        rows.iter()
            .find(|r| r.experiment == exp && r.config == cfg && r.metric == "pct_of_bare_metal")
            .unwrap_or_else(|| panic!("{exp} {cfg}"))
    };
    let sriov = row("eli.netperf", "sriov").model;
    let eli = row("eli.netperf", "eli").model;
    // Each workload has its row per config, against the paper's claim.
    for exp in ["eli.netperf", "eli.memcached"] {
        assert_eq!(row(exp, "sriov").paper, Some(60.0));
        assert_eq!(row(exp, "eli").paper, Some(97.0));
    }
    // Exits on every interrupt and EOI cost a CPU-bound sender throughput;
    // ELI's direct delivery and EOI win it back.
    assert!(sriov < 90.0, "{sriov}");
    assert!(eli > 95.0 && eli > sriov + 5.0, "{eli} vs {sriov}");
    assert!(rows.iter().all(|r| r.violations == 0));
}

#[test]
fn critical_host_ipis_can_travel_as_nmis() {
    // Protection 3 (docs/papers.md ELI §2.7): host IPIs to the ELI core either bounce
    // through the shadow IDT's #NP or arrive as NMIs, which exit whatever
    // the guest's IDT holds. The host's local timer always bounces.
    let run = |critical: &str| {
        run_file(
            "fig4.toml",
            &[
                "scheme=eli",
                "duration_s=0.2",
                "host.ipi_per_s=2000",
                &format!("hv.eli_critical={critical}"),
            ],
        )
    };
    let bounce = run("bounce");
    let nmi = run("nmi");
    for r in [&bounce, &nmi] {
        assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
    }
    assert_eq!(metric(&bounce, "eli.critical_nmis"), 0.0);
    let sent = metric(&nmi, "eli.critical_nmis");
    // ~2000/s for 0.2 s.
    assert!((300.0..=500.0).contains(&sent), "{sent}");
    // Each NMI replaces a bounce one for one.
    let fewer = metric(&bounce, "eli.bounces") - metric(&nmi, "eli.bounces");
    assert!((fewer - sent).abs() <= 0.05 * sent, "{fewer} vs {sent}");
    // Either way every host IPI exits: the exit count barely moves.
    let np = |r: &exitless::report::RunReport| rate(r, "EXCEPTION_NMI");
    assert!((np(&bounce) - np(&nmi)).abs() <= 0.05 * np(&bounce));
}
