//! DID Figure 4's sender: the user-level PacketGen sleeps and sends a burst
//! (`workload.udp.burst`), and the VF's coalescing follows the bursts.

use crate::common;
use common::*;

fn fig4(burst: u32, rate: u32) -> exitless::report::RunReport {
    let b = format!("workload.udp.burst={burst}");
    let r = format!("rate_pps={rate}");
    run_file("fig4.toml", &["scheme=kvm", "duration_s=0.2", &b, &r])
}

#[test]
fn packets_per_interrupt_follow_the_burst_size() {
    // 100 Kpps: a periodic sender (burst 1) is 10 us apart, one ITR
    // interval (~10 us), so nearly every datagram has its own interrupt;
    // in bursts of 16 the VF raises one for the burst's first datagram and
    // one when the ITR interval ends, with the rest of the burst.
    let one = fig4(1, 100_000);
    let sixteen = fig4(16, 100_000);
    let p1 = metric(&one, "nic.rx_packets_per_interrupt");
    let p16 = metric(&sixteen, "nic.rx_packets_per_interrupt");
    assert!(p1 < 1.2, "periodic: {p1} packets per interrupt");
    assert!((7.0..=9.0).contains(&p16), "bursts of 16: {p16}");
    // The same datagrams arrive either way (but for the bursts the
    // measured interval's edges cut).
    let (n1, n16) = (
        metric(&one, "udp.received"),
        metric(&sixteen, "udp.received"),
    );
    assert!((n1 - n16).abs() <= 16.0, "{n1} vs {n16}");
    let i1 = metric(&one, "nic.interrupts_per_s");
    let i16 = metric(&sixteen, "nic.interrupts_per_s");
    assert!(
        i16 < i1 / 5.0,
        "interrupts/s: {i1} periodic, {i16} in bursts"
    );
    // Fewer interrupts, fewer delivery exits.
    assert!(rate(&sixteen, "EXTERNAL_INTERRUPT") < rate(&one, "EXTERNAL_INTERRUPT") / 5.0);
}

#[test]
fn a_burst_size_out_of_range_is_refused_by_key() {
    let sets = vec!["workload.udp.burst=0".to_string()];
    let e = exitless::scenario::Scenario::load(&scenario_path("fig4.toml"), &sets)
        .expect_err("burst 0 must be refused")
        .to_string();
    assert!(e.contains("workload.udp.burst"), "{e}");
}
