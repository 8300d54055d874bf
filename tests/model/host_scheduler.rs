//! The host scheduler (CFS) multiplexing the vCPU thread with host
//! threads: shares follow weights, every scheme stays correct across real
//! schedule-out/in, and interrupts raised while the vCPU waits in the run
//! queue are delivered at its next schedule-in.

use crate::common;
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

/// vCPU threads that may run on any of cores 1-4 (`allowed_cores`): woken
/// vCPUs take idle cores and the run queues are balanced, so they migrate;
/// every scheme stays correct while its vCPUs move (posted-interrupt
/// descriptors, DID's IRT entries and parked timers, ELI's shadow IDT all
/// follow the core).
#[test]
fn floating_vcpus_migrate_and_every_scheme_stays_correct() {
    // kvm-2026's halt polling keeps a vCPU's core busy while it idles, so
    // its vCPUs rarely have to move; without polling they do.
    for (scheme, opt) in [
        ("kvm", ""),
        ("apicv", ""),
        ("kvm-2026", ""),
        ("kvm-2026", "hv.halt_poll=false"),
        ("did", ""),
        ("eli", ""),
        ("elvis", ""),
    ] {
        for seed in ["seed=1", "seed=2"] {
            let mut sets = vec![
                format!("scheme={scheme}"),
                seed.into(),
                "duration_s=0.15".into(),
            ];
            if !opt.is_empty() {
                sets.push(opt.into());
            }
            let sets: Vec<&str> = sets.iter().map(|s| s.as_str()).collect();
            let r = run_file("../../scenarios/smp/floating.toml", &sets);
            let what = format!(
                "{scheme} {opt} {seed}: {:?}",
                r.invariants.violations.first()
            );
            assert_eq!(r.violations(), 0, "{what}");
            assert!(metric(&r, "udp.received") > 2000.0, "{what}");
            let moved = metric(&r, "host.vcpu_migrations_per_s");
            if (scheme, opt) != ("kvm-2026", "") {
                assert!(moved > 10.0, "{what}: no vCPU moved");
            }
        }
    }
}

fn two_siblings(cores: &str) -> String {
    format!(
        "name = \"stack\"\nscheme = \"kvm\"\nseed = 1\nduration_s = 0.2\nwarmup_s = 0.02\n\
         [machine]\ncores = 4\n[[vm]]\nvcpus = 2\nburn = true\n{cores}\n"
    )
}

/// vCPU stacking: two always-runnable siblings pinned to one core are
/// stacked all the time; pinned apart, never; free to use two cores, the
/// balancer spreads them and they are stacked only briefly.
#[test]
fn siblings_stack_only_where_their_pinning_puts_them_together() {
    let together = run_text(&two_siblings("cores = [1, 1]"), &[]);
    let apart = run_text(&two_siblings("cores = [1, 2]"), &[]);
    let free = run_text(&two_siblings("allowed_cores = [1, 2]\ncores = [1, 1]"), &[]);
    // Pinned apart, nothing shares a core: no scheduler, nothing to stack.
    let s = |r: &exitless::report::RunReport| {
        r.metrics
            .get("host.vcpu_stacking_pct")
            .copied()
            .unwrap_or(0.0)
    };
    assert!(s(&together) > 95.0, "{}", s(&together));
    assert_eq!(s(&apart), 0.0);
    assert!(s(&free) < 5.0, "{}", s(&free));
    for r in [&together, &apart, &free] {
        assert_eq!(r.violations(), 0);
    }
}

/// Regression: a vCPU switched away from while it finished an HLT exit
/// used to block the thread the core had switched to instead of its own,
/// leaving that thread asleep for good (half the VMs starved, the checker
/// silent). Eight 2-vCPU VMs idling with HLT, four vCPUs per core: every
/// VM gets every datagram, and the checker's scheduler check stays clean.
#[test]
fn no_vcpu_thread_is_left_asleep_when_vms_share_cores_and_halt() {
    for scheme in ["kvm", "apicv", "kvm-2026", "did"] {
        let sets = [
            &format!("scheme={scheme}")[..],
            "vm.0.copies=8",
            "duration_s=0.2",
        ];
        let r = run_file("../consolidation/pinning.toml", &sets);
        assert_eq!(
            r.violations(),
            0,
            "{scheme}: {:?}",
            r.invariants.violations.first()
        );
        for vm in 0..8 {
            let key = if vm == 0 {
                "udp.received".to_string()
            } else {
                format!("vm{vm}.udp.received")
            };
            assert!(metric(&r, &key) > 3900.0, "{scheme}: VM {vm} starved");
        }
    }
}

/// The trace shows who runs (docs: src/report/trace.rs): a burner sharing
/// the vCPU's core gets its own host-thread track, its slices and the vCPU
/// thread's alternate on core 1 and never overlap, and the core's run
/// queue is a counter track that reads 2 while both are runnable.
#[test]
fn the_trace_has_a_track_per_host_thread_and_a_run_queue_counter() {
    let text = scenario("kvm", "[[host.burners]]\ncores = [1]\n");
    let s = exitless::scenario::Scenario::parse(&text, &[]).expect("parses");
    let mut w =
        exitless::world::World::build(&s, &exitless::calibration::Calibration::default_host())
            .expect("builds");
    let from = w.measure_start();
    w.enable_trace(from, from + 100 * exitless::engine::MS, 1_000_000);
    w.run(|_| {});
    let names = w.trace_names();
    assert_eq!(names.host_threads[0], "vCPU thread vm0 vcpu0");
    assert_eq!(names.host_threads[1], "host thread 1");
    let json = w.trace().expect("traced").to_chrome_json("t", &names);
    let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let ev = v["traceEvents"].as_array().unwrap();
    let mut runs: Vec<(f64, f64, u64)> = ev
        .iter()
        .filter(|e| e["cat"] == "host thread")
        .map(|e| {
            let ts = e["ts"].as_f64().unwrap();
            (
                ts,
                ts + e["dur"].as_f64().unwrap(),
                e["tid"].as_u64().unwrap(),
            )
        })
        .collect();
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let burner = runs.iter().filter(|r| r.2 == 1).count();
    let vcpu = runs.iter().filter(|r| r.2 == 0).count();
    assert!(
        burner >= 3 && vcpu >= 3,
        "{burner} burner and {vcpu} vCPU slices"
    );
    for pair in runs.windows(2) {
        assert!(pair[0].1 <= pair[1].0 + 1e-6, "overlap: {pair:?}");
        assert_ne!(pair[0].2, pair[1].2, "the core alternates: {pair:?}");
    }
    let queue: Vec<u64> = ev
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "run queue")
        .filter_map(|e| e["args"]["core 1"].as_u64())
        .collect();
    assert!(queue.contains(&2), "{queue:?}");
}
