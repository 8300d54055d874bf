//! iperf TCP streams to the VM: the stream flows without loss, and §5.9's
//! exit structure emerges (APICv removes the EOI exits, not the VF's
//! interrupt exits; DID removes both).

mod common;
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
    let kvm = iperf("kvm", "virtio");
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
