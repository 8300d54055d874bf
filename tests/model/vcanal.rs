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
