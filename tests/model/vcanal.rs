//! vCanal scenarios (vcanal.md): the HTTP server over libCanal against
//! ApacheBench, through the channel, the service's network pool and the
//! host stack.

use crate::common;
use common::*;

/// A 1-vCPU VM running a 2-thread HTTP server, ab with keep-alive;
/// `extra`: more keys.
fn http(extra: &str) -> String {
    http_ka(true, extra)
}

/// The same, with ab's keep-alive as given.
fn http_ka(keep_alive: bool, extra: &str) -> String {
    format!(
        "scheme = \"kvm\"\nseed = 2\nduration_s = 0.03\nwarmup_s = 0.0\n\
         [machine]\ncores = 4\n[guest]\ntick = \"periodic\"\n[net]\ndevice = \"vf\"\n\
         [workload.nginx]\nworkers = 2\nab_processes = 2\nconcurrency = 4\npage_bytes = 4096\n\
         keep_alive = {keep_alive}\n[workload.vcanal]\n{extra}"
    )
}

/// Without keep-alive (ab's default) every request is a connection of its
/// own: the host stack answers each SYN, the server accepts each
/// connection once, serves its one request and closes it (the close an
/// INR too), and every call succeeds; the guest's own stack still moves
/// nothing.
#[test]
fn ab_without_keep_alive_over_vcanal_accepts_a_connection_per_request() {
    let r = run_text(&http_ka(false, ""), &[]);
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
    assert_eq!(metric(&r, "vcanal.call_errors"), 0.0);
    let done = metric(&r, "nginx.completed");
    assert!(done > 100.0, "{done}");
    let served = metric(&r, "nginx.served.worker0") + metric(&r, "nginx.served.worker1");
    let accepts = metric(&r, "vcanal.accepts");
    // One accept per request served, give or take the 8 in flight.
    assert!((accepts - served).abs() <= 8.0, "{accepts} vs {served}");
    assert!((served - done).abs() <= 8.0, "{served} vs {done}");
    assert_eq!(metric(&r, "guest.tx_frames"), 0.0);
    // More calls per request than over kept-alive connections.
    let ka = run_text(&http(""), &[]);
    let per =
        |r: &exitless::report::RunReport| metric(r, "vcanal.calls") / metric(r, "nginx.completed");
    assert!(per(&r) > per(&ka) + 2.0, "{} vs {}", per(&r), per(&ka));
}

/// Every ab connection is accepted once (by the thread whose port it
/// targets), each server thread serves its own, the requests cross the
/// host's stack, not the guest's, and every call succeeds.
#[test]
fn ab_against_a_vcanal_http_server() {
    let r = run_text(&http(""), &[]);
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
    assert_eq!(metric(&r, "vcanal.accepts"), 8.0);
    assert_eq!(metric(&r, "vcanal.call_errors"), 0.0);
    let done = metric(&r, "nginx.completed");
    assert!(done > 500.0, "{done}");
    let (w0, w1) = (
        metric(&r, "nginx.served.worker0"),
        metric(&r, "nginx.served.worker1"),
    );
    assert!(w0 > 0.3 * done && w1 > 0.3 * done, "{w0} / {w1}");
    // Responses served = requests ab completed, give or take the ones in
    // flight at the end.
    assert!((w0 + w1 - done).abs() <= 8.0, "{w0}+{w1} vs {done}");
    assert!(metric(&r, "vcanal.epoll_waits") > 0.0);
    // The guest's own TCP/IP stack moved nothing (vcanal.md §1).
    assert_eq!(metric(&r, "guest.tx_frames"), 0.0);
    assert!(metric(&r, "vcanal.host_tx_frames_per_s") > 0.0);
}

/// Interrupt-only notification: every wait sleeps and is woken by the
/// completion interrupt, and the server still serves (slower).
#[test]
fn ab_over_vcanal_with_interrupt_only_notification() {
    let sw = run_text(&http(""), &[]);
    let irq = run_text(&http("notification = \"interrupt\"\n"), &[]);
    assert_eq!(irq.violations(), 0);
    assert!(metric(&irq, "vcanal.sleeps") > metric(&sw, "vcanal.sleeps"));
    assert!(metric(&irq, "nginx.completed") > 100.0);
    assert!(metric(&irq, "vcanal.completion_irqs") >= metric(&irq, "vcanal.sleeps") * 0.9);
}

/// Same scenario and seed: the same report.
#[test]
fn ab_over_vcanal_is_deterministic() {
    let a = run_text(&http(""), &[]);
    let b = run_text(&http(""), &[]);
    assert_eq!(a.metrics, b.metrics);
}

/// Beyond the paper: under APICv the completion interrupt of a sleeping
/// libCanal waiter is posted, so it costs no external-interrupt exit and
/// no EOI exit, where stock KVM injects it with both.
#[test]
fn completion_interrupts_are_posted_under_apicv() {
    let rr = "scheme = \"kvm\"\nseed = 2\nduration_s = 0.03\nwarmup_s = 0.005\n\
              [machine]\ncores = 4\n[guest]\ntick = \"periodic\"\n[net]\ndevice = \"vf\"\n\
              [workload.netperf]\ntest = \"udp-rr\"\nmsg_bytes = 1\n[workload.vcanal]\n";
    let kvm = run_text(rr, &[]);
    let apicv = run_text(rr, &["scheme=apicv"]);
    for r in [&kvm, &apicv] {
        assert_eq!(r.violations(), 0);
        assert!(metric(r, "vcanal.completion_irqs") > 300.0);
    }
    let irqs = metric(&kvm, "vcanal.completion_irqs") / 0.03;
    // Injected: most completions take an external-interrupt exit (the
    // rest find the vCPU halted or in an exit already) and an EOI exit.
    assert!(rate(&kvm, "EXTERNAL_INTERRUPT") > 0.5 * irqs);
    assert!(rate(&kvm, "MSR_WRITE") > 0.5 * irqs);
    // Posted: what remains is the periodic tick's (1000/s at most).
    assert!(
        rate(&apicv, "EXTERNAL_INTERRUPT") < 0.1 * irqs,
        "{}",
        rate(&apicv, "EXTERNAL_INTERRUPT")
    );
    assert!(rate(&apicv, "MSR_WRITE") < 0.1 * irqs);
    assert!(metric(&apicv, "udp_rr.latency_us") < metric(&kvm, "udp_rr.latency_us"));
}

/// The service host NIC's interrupt moderation (its interrupt goes to the
/// service core): with a fixed 50 µs interval the NIC interrupts the
/// service core at most 20K times a second, and a UDP_RR request that
/// arrives within an interval of the last interrupt waits for it; without
/// moderation each request interrupts at once.
#[test]
fn the_host_nic_interrupt_is_moderated() {
    let rr = |itr: &str| {
        format!(
            "scheme = \"kvm\"\nseed = 2\nduration_s = 0.03\nwarmup_s = 0.005\n\
             [machine]\ncores = 4\n[guest]\ntick = \"periodic\"\n[net]\ndevice = \"vf\"\n\
             [workload.netperf]\ntest = \"udp-rr\"\nmsg_bytes = 1\ndirection = \"recv\"\n\
             [workload.vcanal]\nhost_nic_itr = \"{itr}\"\n"
        )
    };
    let off = run_text(&rr("off"), &[]);
    let fixed = run_text(&rr("fixed"), &[]);
    let adaptive = run_text(&rr("adaptive"), &[]);
    for r in [&off, &fixed, &adaptive] {
        assert_eq!(r.violations(), 0);
    }
    let irqs = |r| metric(r, "vcanal.host_nic_irqs_per_s");
    assert!(irqs(&fixed) <= 20_100.0, "{}", irqs(&fixed));
    assert!(
        irqs(&off) > 1.5 * irqs(&fixed),
        "{} vs {}",
        irqs(&off),
        irqs(&fixed)
    );
    let served = |r| metric(r, "udp_rr.served");
    assert!(served(&fixed) < 0.8 * served(&off));
    // Adaptive: a 1-byte ping-pong is the lowest-latency class, whose
    // interval (about 10 µs) is shorter than a round trip: as off.
    assert!(served(&adaptive) > 0.95 * served(&off));
}

/// A 1-vCPU VM (core 1) streaming TCP over vCanal with the service on
/// core 3; `extra`: more `[workload.vcanal]` keys, `host`: host tables.
fn stream(extra: &str, host: &str) -> String {
    format!(
        "scheme = \"kvm\"\nseed = 3\nduration_s = 0.02\nwarmup_s = 0.005\n\
         [machine]\ncores = 4\n[guest]\ntick = \"periodic\"\ngso = false\ngro = false\n\
         [net]\ndevice = \"vf\"\npeer_gso = false\n\
         [workload.netperf]\ntest = \"tcp-stream\"\ndirection = \"send\"\nmsg_bytes = 16384\n\
         {host}\n[workload.vcanal]\nservice_core = 3\n{extra}"
    )
}

/// "vCanal w/o Affinity" (vcanal.md §3, §6): the host NIC's interrupt on
/// the vCPU's core costs that vCPU external-interrupt exits (the paper:
/// "without affinity external-interrupt exits remain"); steered to an
/// idle core instead, it costs the vCPU nothing.
#[test]
fn without_affinity_the_nic_interrupt_exits_on_the_vcpu_core() {
    let pinned = run_text(&stream("", ""), &[]);
    let floating = run_text(&stream("affinity = false\n", ""), &[]);
    let idle_irq = run_text(&stream("affinity = false\nnic_irq_core = 2\n", ""), &[]);
    for r in [&pinned, &floating, &idle_irq] {
        assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
        assert!(metric(r, "netperf.throughput_gbps") > 1.0);
        assert!(metric(r, "vcanal.host_nic_irqs_per_s") > 100.0);
    }
    // External-interrupt exits beyond the completion interrupts' (whose
    // rate moves with where the floating pool threads run).
    let ext = |r| rate(r, "EXTERNAL_INTERRUPT") - metric(r, "vcanal.irqs_per_s");
    let nic = metric(&floating, "vcanal.host_nic_irqs_per_s");
    // Some NIC interrupts find the vCPU halted (no exit), most do not.
    assert!(
        ext(&floating) > ext(&pinned) + 0.3 * nic,
        "{} vs {} (+{nic} NIC irqs)",
        ext(&floating),
        ext(&pinned)
    );
    assert!(floating.vms[0].tig_pct < pinned.vms[0].tig_pct);
    assert!(
        ext(&idle_irq) < ext(&pinned) + 0.1 * nic,
        "{} vs {}",
        ext(&idle_irq),
        ext(&pinned)
    );
    // Alone on its idle core, the floating thread is never moved.
    assert_eq!(metric(&floating, "vcanal.service_migrations_per_s"), 0.0);
}

/// libCanal's two readings of a wait-loop iteration (vcanal.md §2.5,
/// docs/vcanal.md "libCanal's wait: two readings"): with a poll and a
/// PAUSE (the default) 100 iterations end before a 16 KiB send completes,
/// so the waits sleep and each completion is an interrupt (an
/// external-interrupt and an EOI exit under kvm); with a sched_yield()
/// each iteration, 100 of them outlast the send, no wait sleeps and the
/// completion interrupts are gone.
#[test]
fn a_yield_in_each_wait_iteration_keeps_the_waits_polling() {
    let pause = run_text(&stream("", ""), &[]);
    let yielding = run_text(&stream("spin = \"yield\"\n", ""), &[]);
    for r in [&pause, &yielding] {
        assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
        assert!(metric(r, "vcanal.calls") > 50.0);
    }
    // Nearly every paused wait sleeps; no yielding one does.
    assert!(metric(&pause, "vcanal.sleeps") > 0.9 * metric(&pause, "vcanal.calls"));
    assert_eq!(metric(&yielding, "vcanal.sleeps"), 0.0);
    assert!(rate(&yielding, "EXTERNAL_INTERRUPT") < 0.5 * rate(&pause, "EXTERNAL_INTERRUPT"));
    // Fewer polls, each far longer: the yielding loop spent its time in
    // the system call.
    let per_call = |r| metric(r, "vcanal.polls") / metric(r, "vcanal.calls");
    assert!(per_call(&yielding) < per_call(&pause));
    assert!(
        metric(&yielding, "netperf.throughput_gbps") > metric(&pause, "netperf.throughput_gbps")
    );
}

/// Without affinity the service's thread is a thread of the host
/// scheduler: a CPU burner on its core makes CFS share that core or move
/// the thread, so it waits in run queues, where the pinned service core
/// never does.
#[test]
fn a_floating_service_thread_competes_under_cfs() {
    // Every core but the vCPU's has a burner: the thread must share one.
    let burn = "[[host.burners]]\ncores = [0]\n[[host.burners]]\ncores = [2]\n\
                [[host.burners]]\ncores = [3]\n";
    let r = run_text(&stream("affinity = false\n", burn), &[]);
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
    assert!(metric(&r, "netperf.throughput_gbps") > 0.5);
    let waited = metric(&r, "vcanal.service_runqueue_wait_pct");
    let moved = metric(&r, "vcanal.service_migrations_per_s");
    assert!(
        waited > 0.0 || moved > 0.0,
        "wait {waited}% moves {moved}/s"
    );
    assert!(metric(&r, "vcanal.service_switches_in_per_s") > 0.0);
}

/// Bad "w/o Affinity" input is refused with the key named.
#[test]
fn bad_affinity_keys_are_refused() {
    let s = exitless::scenario::Scenario::parse(
        &stream("affinity = false\nnic_irq_core = 9\n", ""),
        &[],
    )
    .expect("parses");
    let e = exitless::world::World::build(&s, &exitless::calibration::Calibration::default_host())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("nic_irq_core"), "{e}");
    let s =
        exitless::scenario::Scenario::parse(&stream("affinity = false\nkick = true\n", ""), &[])
            .expect("parses");
    let e = exitless::world::World::build(&s, &exitless::calibration::Calibration::default_host())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("affinity"), "{e}");
    // A NIC interrupt core with affinity on would be ignored: refused.
    let e = exitless::scenario::Scenario::parse(&stream("nic_irq_core = 1\n", ""), &[])
        .expect_err("refused")
        .to_string();
    assert!(e.contains("nic_irq_core"), "{e}");
}

/// The paper's native host ran its server on all its cores (vcanal.md
/// §3): on bare metal an SMP kernel runs one CPU per core, and its
/// reschedule IPIs (halting idle CPUs) reach the cores of the CPUs they
/// name, not the cores whose APIC IDs equal the CPU numbers. Two CPUs
/// serve more than one; the same core twice is refused.
#[test]
fn a_native_smp_kernel_runs_a_cpu_per_core() {
    let text = |cores: &str| {
        let vcpus = cores.matches(',').count() + 1;
        format!(
            "scheme = \"bare-metal\"\nseed = 1\nduration_s = 0.02\nwarmup_s = 0.005\n\
             [machine]\ncores = 4\n[guest]\ntick = \"periodic\"\nidle = \"halt\"\n\
             [net]\ndevice = \"vf\"\npeer = \"remote\"\n\
             [[vm]]\nvcpus = {vcpus}\ncores = {cores}\n[vm.workload.nginx]\nworkers = 2\nab_processes = 2\n\
             concurrency = 8\npage_bytes = 4096\n"
        )
    };
    let one = run_text(&text("[1]"), &[]);
    let two = run_text(&text("[2, 3]"), &[]);
    for r in [&one, &two] {
        assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
    }
    assert!(metric(&two, "guest.resched_irqs_per_s") > 1000.0);
    assert!(metric(&two, "nginx.rps") > 1.2 * metric(&one, "nginx.rps"));
    // Two CPUs on one core: refused, by the scenario or the builder.
    let e = match exitless::scenario::Scenario::parse(&text("[2, 2]"), &[]) {
        Ok(s) => {
            exitless::world::World::build(&s, &exitless::calibration::Calibration::default_host())
                .err()
                .expect("refused")
                .to_string()
        }
        Err(e) => e.to_string(),
    };
    assert!(e.contains("core"), "{e}");
}
