//! The SIP B2BUA between a SIPp-like client and server: every call of a
//! light load is set up and torn down in every DID configuration, DID
//! removes the interrupt exits, and overload shows up as dropped
//! datagrams, INVITE retransmissions and slow set-ups.

use crate::common;
use common::*;

const CONFIGS: [(&str, &str); 5] = [
    ("bare-metal", "vf"),
    ("kvm", "vf"),
    ("did", "vf"),
    ("kvm", "virtio"),
    ("did", "virtio"),
];

#[test]
fn every_call_completes_in_every_configuration() {
    for (scheme, device) in CONFIGS {
        let r = run_file(
            "sip.toml",
            &[
                &format!("scheme={scheme}"),
                &format!("net.device={device}"),
                "workload.sip.calls=300",
                "workload.sip.call_duration_s=0.5",
                "duration_s=4",
            ],
        );
        let what = format!("{scheme}/{device}");
        assert_eq!(r.violations(), 0, "{what}: {:?}", r.invariants.violations);
        assert_eq!(metric(&r, "sip.calls_completed"), 300.0, "{what}");
        // 8 messages reach the B2BUA per call (INVITE, ACK, INVITE+auth,
        // 180, 200, ACK, BYE, 200) and the UAS answers each INVITE once.
        assert_eq!(metric(&r, "sip.b2bua_messages"), 2400.0, "{what}");
        assert_eq!(metric(&r, "sip.uas_invites"), 300.0, "{what}");
        assert_eq!(metric(&r, "sip.b2bua_unexpected"), 0.0, "{what}");
        // One RADIUS authentication per call, answered by the server on
        // the load generator.
        assert_eq!(metric(&r, "sip.radius_requests"), 300.0, "{what}");
        assert_eq!(metric(&r, "sip.radius_server_requests"), 300.0, "{what}");
        assert_eq!(metric(&r, "sip.invite_retrans"), 0.0, "{what}");
        assert_eq!(metric(&r, "sip.setup_lt_10ms"), 100.0, "{what}");
        // SIPp paces calls: 100/s.
        let cps = metric(&r, "sip.call_rate");
        assert!((cps - 100.0).abs() < 1.0, "{what}: {cps}");
        if scheme == "did" {
            // No interrupt exits: the VF's (or vhost's) interrupts and the
            // timer arrive directly, EOIs do not trap.
            assert_eq!(rate(&r, "EXTERNAL_INTERRUPT"), 0.0, "{what}");
            // Only the boot-time LVT writes trap (DID §4: LVT writes exit).
            assert!(rate(&r, "MSR_WRITE") * r.duration_s <= 2.0, "{what}");
        }
        if scheme == "kvm" {
            assert!(rate(&r, "EXTERNAL_INTERRUPT") > 500.0, "{what}");
        }
    }
}

#[test]
fn the_radius_round_trip_lengthens_every_setup() {
    let run = |radius: &str| {
        let r = run_file(
            "sip.toml",
            &[
                "scheme=kvm",
                &format!("workload.sip.radius={radius}"),
                "workload.sip.calls=200",
                "workload.sip.call_duration_s=0.5",
                "duration_s=3",
            ],
        );
        assert_eq!(r.violations(), 0);
        assert_eq!(metric(&r, "sip.calls_completed"), 200.0, "{radius}");
        r
    };
    let (on, off) = (run("load-generator"), run("off"));
    assert_eq!(metric(&off, "sip.radius_requests"), 0.0);
    // At least the server's own work (50 us) and two crossings of the
    // link and the VF, on every call's set-up.
    let added = metric(&on, "sip.setup_mean_us") - metric(&off, "sip.setup_mean_us");
    assert!((60.0..500.0).contains(&added), "{added} us");
    // Two more datagrams per call through the VF: more interrupt exits.
    assert!(rate(&on, "EXTERNAL_INTERRUPT") > rate(&off, "EXTERNAL_INTERRUPT"));
}

#[test]
fn overload_drops_datagrams_and_retransmits_invites() {
    // Far more calls per second than one vCPU's B2BUA serves (~25 us per
    // message, 8 messages a call).
    let r = run_file(
        "sip.toml",
        &[
            "scheme=kvm",
            "workload.sip.rate_cps=8000",
            "workload.sip.calls=16000",
            "workload.sip.call_duration_s=1",
            "duration_s=20",
        ],
    );
    assert_eq!(r.violations(), 0);
    assert!(metric(&r, "guest.socket_drops") > 0.0);
    assert!(metric(&r, "sip.invite_retrans") > 0.0);
    assert!(metric(&r, "sip.setup_gt_200ms") > 10.0);
    assert!(metric(&r, "sip.call_rate") < 8000.0 * 0.8);
    // Retransmitted INVITEs are answered as duplicates, not new calls.
    assert!(metric(&r, "sip.uas_invites") <= metric(&r, "sip.calls_placed"));
}

#[test]
fn a_rate_beyond_the_uac_places_no_more_calls_than_offered() {
    // 50,000 calls/s for 0.5 s: the UAC's CPU (20 us a message) opens at
    // most a few thousand a second.
    let r = run_file(
        "sip.toml",
        &[
            "scheme=kvm",
            "workload.sip.rate_cps=50000",
            "workload.sip.calls=1000000",
            "workload.sip.call_duration_s=0.1",
            "duration_s=0.5",
        ],
    );
    assert_eq!(r.violations(), 0);
    let offered = metric(&r, "sip.calls_offered");
    let placed = metric(&r, "sip.calls_placed");
    // Calls at 0, 20 us, ... up to the UAC's last run before 0.5 s. That
    // last run comes earlier the more responses the UAC has to process, so
    // allow a few percent below rate x duration.
    assert!((0.97 * 25_000.0..=25_001.0).contains(&offered), "{offered}");
    assert!(placed <= offered, "{placed} placed of {offered}");
    // The B2BUA (Sippy, ~500 us a message) answers at most ~1,000 messages
    // in 0.5 s, so the UAC gets few responses to process and its own CPU
    // (20 us a message) is what bounds how many of the offered calls it
    // opens; the B2BUA's socket overflows.
    let b2bua = metric(&r, "sip.b2bua_messages");
    assert!(b2bua <= 0.5 / 500e-6 + 2.0, "{b2bua} messages served");
    assert!(metric(&r, "guest.socket_drops") > 0.0);
    assert_eq!(placed + metric(&r, "sip.calls_not_placed"), offered);
    assert!(metric(&r, "sip.open_calls_peak") <= placed);
}
