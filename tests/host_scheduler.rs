//! The host scheduler (CFS) multiplexing the vCPU thread with host
//! threads: shares follow weights, every scheme stays correct across real
//! schedule-out/in, and interrupts raised while the vCPU waits in the run
//! queue are delivered at its next schedule-in.

mod common;
use common::*;

fn scenario(scheme: &str, burners: &str) -> String {
    format!(
        "name = \"sched\"\nscheme = \"{scheme}\"\nseed = 3\nduration_s = 0.2\nwarmup_s = 0.05\n\
         [workload.udp]\nrate_pps = 50000\n{burners}"
    )
}

#[test]
fn a_burner_on_the_vcpu_core_takes_half_of_it_under_every_scheme() {
    for scheme in ["kvm", "apicv", "eli", "elvis", "did"] {
        let r = run_text(&scenario(scheme, "[[host.burners]]\ncores = [1]\n"), &[]);
        let what = format!("{scheme}: {:?}", r.invariants.violations.first());
        assert_eq!(r.violations(), 0, "{what}");
        let wait = metric(&r, "host.vcpu_runqueue_wait_pct");
        assert!((40.0..60.0).contains(&wait), "{scheme}: waited {wait}%");
        let tig = r.vms[0].tig_pct;
        assert!(
            (35.0..60.0).contains(&tig),
            "{scheme}: time in guest {tig}%"
        );
        // Interrupts that arrived while the vCPU waited were delivered when
        // it came back: within one period (2 threads × 6 ms slices plus a
        // tick), not lost.
        assert!(metric(&r, "irq.descheduled") > 0.0, "{scheme}");
        let max = metric(&r, "irq.descheduled_delay_max_us");
        assert!(max < 14_000.0, "{scheme}: {max} us");
        assert!(metric(&r, "host.vcpu_switches_in_per_s") > 50.0);
    }
}

#[test]
fn nice_levels_set_the_shares() {
    let even = run_text(&scenario("did", "[[host.burners]]\ncores = [1]\n"), &[]);
    let nice = run_text(
        &scenario("did", "[[host.burners]]\ncores = [1]\nnice = 5\n"),
        &[],
    );
    let w_even = metric(&even, "host.vcpu_runqueue_wait_pct");
    let w_nice = metric(&nice, "host.vcpu_runqueue_wait_pct");
    // Weights 1024 : 335: the burner gets about a quarter of the core.
    assert!((15.0..35.0).contains(&w_nice), "{w_nice}");
    assert!(w_nice < w_even - 10.0);
}

#[test]
fn a_burner_pinned_elsewhere_leaves_the_vcpu_alone() {
    let r = run_text(&scenario("did", "[[host.burners]]\ncores = [0]\n"), &[]);
    assert_eq!(metric(&r, "host.vcpu_runqueue_wait_pct"), 0.0);
    assert_eq!(metric(&r, "irq.descheduled"), 0.0);
    assert_eq!(r.violations(), 0);
}

#[test]
fn scheduled_runs_repeat_byte_for_byte() {
    let t = scenario(
        "apicv",
        "[[host.burners]]\ncores = [1]\n[[host.burners]]\ncores = [1]\nnice = -2\n",
    );
    let a = serde_json::to_string(&run_text(&t, &[])).unwrap();
    let b = serde_json::to_string(&run_text(&t, &[])).unwrap();
    assert_eq!(a, b);
}

#[test]
fn burners_and_scripted_preemptions_cannot_be_combined() {
    let t = scenario(
        "did",
        "[[host.burners]]\ncores = [1]\n[[preemptions]]\nat_ms = 1\nfor_ms = 1\n",
    );
    let e = exitless::scenario::Scenario::parse(&t, &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("preemptions"), "{e}");
    let t = scenario("did", "[[host.burners]]\ncores = [7]\n");
    let e = exitless::scenario::Scenario::parse(&t, &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("host.burners[0].cores"), "{e}");
}

#[test]
fn a_halting_guest_sleeps_between_interrupts_and_wakes_for_each_under_every_scheme() {
    let t = "name = \"halt\"\nseed = 5\nduration_s = 0.1\nwarmup_s = 0.02\n\
             [guest]\nidle = \"halt\"\ntick = \"nohz-idle\"\n[workload.udp]\nrate_pps = 20000\n";
    for scheme in ["kvm", "apicv", "eli", "elvis", "did", "kvm-2026"] {
        let r = run_text(t, &[&format!("scheme={scheme}")]);
        assert_eq!(
            r.violations(),
            0,
            "{scheme}: {:?}",
            r.invariants.violations.first()
        );
        assert_eq!(metric(&r, "udp.received"), 2000.0, "{scheme}");
        // It halts about once per datagram and runs a small part of the time.
        // It halts about once per datagram (kvm-2026 polls instead of
        // sleeping) and runs a small part of the time.
        let halts =
            metric(&r, "host.vcpu_halts_per_s") + metric(&r, "host.halt_poll_successes_per_s");
        assert!(halts > 5_000.0, "{scheme}: {halts} halts/s");
        assert!(r.vms[0].tig_pct < 50.0, "{scheme}: {}", r.vms[0].tig_pct);
        assert!(
            rate(&r, "HLT") > 5_000.0,
            "{scheme}: {} HLT exits/s",
            rate(&r, "HLT")
        );
    }
}

#[test]
fn a_halting_vm_leaves_its_core_to_a_burner() {
    let poll = run_text(&scenario("apicv", "[[host.burners]]\ncores = [1]\n"), &[]);
    let halt = run_text(
        &scenario("apicv", "[[host.burners]]\ncores = [1]\n"),
        &["guest.idle=halt"],
    );
    assert_eq!(halt.violations(), 0);
    // Polling, the vCPU holds the core for whole slices and its interrupts
    // wait for it; halting, it sleeps, wakes as a favoured sleeper and
    // preempts the burner: its interrupts no longer wait a slice.
    let (p, h) = (
        metric(&poll, "udp.latency_mean_us"),
        metric(&halt, "udp.latency_mean_us"),
    );
    assert!(h < p / 10.0, "poll {p} us, halt {h} us");
    assert!(halt.vms[0].tig_pct < poll.vms[0].tig_pct);
}
