//! iperf TCP streams to the VM: the stream flows without loss, and §5.9's
//! exit structure emerges (APICv removes the EOI exits, not the VF's
//! interrupt exits; DID removes both).

use crate::common;
use common::*;

fn iperf(scheme: &str, device: &str) -> exitless::report::RunReport {
    run_file(
        "iperf.toml",
        &[
            &format!("scheme={scheme}"),
            &format!("net.device={device}"),
            "duration_s=0.05",
        ],
    )
}

/// The same stream with TSO/GSO and GRO off at both ends: MSS frames.
fn iperf_without_offloads(scheme: &str, device: &str) -> exitless::report::RunReport {
    run_file(
        "iperf.toml",
        &[
            &format!("scheme={scheme}"),
            &format!("net.device={device}"),
            "duration_s=0.05",
            "guest.gso=false",
            "guest.gro=false",
            "net.peer_gso=false",
        ],
    )
}

#[test]
fn sriov_stream_exit_structure() {
    let kvm = iperf("kvm", "vf");
    let apicv = iperf("apicv", "vf");
    let did = iperf("did", "vf");
    for (n, r) in [("kvm", &kvm), ("apicv", &apicv), ("did", &did)] {
        assert_eq!(r.violations(), 0, "{n}: {:?}", r.invariants.violations);
        assert!(
            metric(r, "iperf.throughput_gbps") > 1.0,
            "{n}: {}",
            metric(r, "iperf.throughput_gbps")
        );
        assert_eq!(metric(r, "guest.tcp_retransmits"), 0.0, "{n}");
    }
    let nic = metric(&kvm, "nic.interrupts_per_s");
    assert!(nic > 1000.0);
    // APICv: the VF's interrupts still exit, their EOIs no longer do.
    assert!(rate(&apicv, "EXTERNAL_INTERRUPT") >= 0.9 * metric(&apicv, "nic.interrupts_per_s"));
    assert!(rate(&kvm, "MSR_WRITE") >= nic);
    let eoi_gone = rate(&kvm, "MSR_WRITE") - rate(&apicv, "MSR_WRITE");
    assert!(eoi_gone >= 0.9 * nic, "{eoi_gone} vs {nic}");
    // DID: neither.
    assert_eq!(rate(&did, "EXTERNAL_INTERRUPT"), 0.0);
    assert_eq!(rate(&did, "MSR_WRITE"), 0.0);
    assert!(did.vms[0].tig_pct > apicv.vms[0].tig_pct);
}

#[test]
fn pv_stream_kicks_are_suppressed_while_vhost_works() {
    // MSS frames (offloads off) keep the guest's NAPI busy on a full ring;
    // with GSO a few large packets arrive and each may be signalled.
    let kvm = iperf_without_offloads("kvm", "virtio");
    assert_eq!(kvm.violations(), 0);
    assert!(metric(&kvm, "iperf.throughput_gbps") > 1.0);
    // vhost signals far fewer interrupts than it fills buffers: EVENT_IDX
    // suppression while the guest polls (NAPI) and batches the ring.
    let filled = metric(&kvm, "vhost.rx_frames");
    let signals = metric(&kvm, "vhost.signals");
    assert!(filled > 1000.0);
    assert!(
        signals < 0.5 * filled,
        "{signals} signals for {filled} frames"
    );
    // RX buffers are refilled in half-ring batches: few refill kicks.
    let refills = metric(&kvm, "guest.virtio_kicks_rx");
    assert!(
        refills < 0.1 * filled,
        "{refills} refill kicks for {filled} frames"
    );
    // Each ACK the guest sends kicks at most once.
    let kicks = metric(&kvm, "guest.virtio_kicks_tx");
    let sent = metric(&kvm, "guest.tx_frames");
    assert!(kicks <= sent, "{kicks} kicks for {sent} frames");
}

/// Segmentation offloads (Linux's defaults): the load generator's TSO
/// packets cross the wire as MSS frames, the guest's GRO merges what one
/// NAPI poll takes and ACKs each merged packet. The stream reaches line
/// rate over the VF, where per-frame TCP processing held it near 4 Gb/s,
/// and the guest sends far fewer ACKs. Every scheme stays correct.
#[test]
fn offloads_bring_the_vf_stream_to_line_rate_with_fewer_acks() {
    for scheme in ["kvm", "did", "bare-metal"] {
        let on = iperf(scheme, "vf");
        let plain = iperf_without_offloads(scheme, "vf");
        for r in [&on, &plain] {
            assert_eq!(r.violations(), 0, "{scheme}: {:?}", r.invariants.violations);
            assert_eq!(metric(r, "guest.tcp_retransmits"), 0.0);
        }
        let (g_on, g_off) = (
            metric(&on, "iperf.throughput_gbps"),
            metric(&plain, "iperf.throughput_gbps"),
        );
        assert!(g_on > 9.0 && g_on < 9.5, "{scheme}: {g_on}");
        assert!(g_off < 6.0, "{scheme}: {g_off}");
        // Every frame still reaches the guest through the ring ...
        let frames = metric(&on, "guest.rx_packets");
        assert!(metric(&on, "guest.gro_merged") > 0.5 * frames);
        // ... but ACKs go per merged packet, not per second frame.
        let acks_per_frame = metric(&on, "guest.tx_frames") / frames;
        let plain_acks = metric(&plain, "guest.tx_frames") / metric(&plain, "guest.rx_packets");
        assert!(
            acks_per_frame < 0.5 * plain_acks,
            "{acks_per_frame} vs {plain_acks}"
        );
    }
}

/// Over virtio-net the host-side peer's GSO packets reach the guest whole
/// (GUEST_TSO4, big-packet buffers): one vhost copy and one used buffer
/// per packet, far fewer than frames without offloads.
#[test]
fn gso_packets_cross_vhost_whole() {
    let on = iperf("kvm", "virtio");
    let plain = iperf_without_offloads("kvm", "virtio");
    assert_eq!(on.violations(), 0);
    let bytes_per_frame =
        |r: &exitless::report::RunReport| metric(r, "iperf.bytes") / metric(r, "vhost.rx_frames");
    assert!(bytes_per_frame(&on) > 10_000.0, "{}", bytes_per_frame(&on));
    assert!(
        bytes_per_frame(&plain) < 1_500.0,
        "{}",
        bytes_per_frame(&plain)
    );
    assert!(metric(&on, "iperf.throughput_gbps") > 2.0 * metric(&plain, "iperf.throughput_gbps"));
}
