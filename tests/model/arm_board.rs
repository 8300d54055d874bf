//! ARM as did-arm.md §5 measured it: bare metal beside the VM, the Jetson
//! Xavier NX board preset, and the VM's paravirtual NIC (virtio-net over
//! vhost-net) under each ARM scheme.

use crate::common;
use common::*;

const HRTIMER: &str = "arch = \"arm64\"\nseed = 1\nduration_s = 0.2\nwarmup_s = 0.02\n\
    [guest]\nhz = 1000\ntick = \"periodic\"\nidle = \"halt\"\n\
    [workload.hrtimer_latency]\ninterval_us = 200\n";

const UDP: &str = "arch = \"arm64\"\nseed = 1\nduration_s = 0.1\nwarmup_s = 0.02\n\
    [guest]\nhz = 1000\ntick = \"periodic\"\nidle = \"halt\"\n\
    [workload.udp]\nrate_pps = 20000\n";

const PING: &str = "arch = \"arm64\"\nseed = 1\nduration_s = 0.3\nwarmup_s = 0.02\n\
    [guest]\nhz = 1000\ntick = \"periodic\"\nidle = \"halt\"\n\
    [workload.ping]\ninterval_s = 0.0103\n";

const IPERF: &str = "arch = \"arm64\"\nseed = 1\nduration_s = 0.05\nwarmup_s = 0.02\n\
    [guest]\nhz = 1000\ntick = \"periodic\"\nidle = \"halt\"\n\
    [workload.iperf]\ndirection = \"from-vm\"\n";

/// Every ARM workload runs natively under `bare-metal` and takes no exit,
/// on the VF and on a NIC wired to an SPI; the same run under kvm-arm does
/// exit (so the count can fail).
#[test]
fn bare_metal_on_arm_takes_no_exit_in_any_workload() {
    for (what, text, sets) in [
        ("hrtimer", HRTIMER, &[][..]),
        ("udp", UDP, &[][..]),
        ("udp spi-nic", UDP, &["net.device=spi-nic"][..]),
        ("ping", PING, &[][..]),
        ("iperf", IPERF, &[][..]),
    ] {
        let mut bm = vec!["scheme=bare-metal"];
        bm.extend_from_slice(sets);
        let r = run_text(text, &bm);
        assert_eq!(r.violations(), 0, "{what}: {:?}", r.invariants.violations);
        assert_eq!(metric(&r, "arm.exits_per_s"), 0.0, "{what}");
        let mut kvm = vec!["scheme=kvm-arm"];
        kvm.extend_from_slice(sets);
        let k = run_text(text, &kvm);
        assert!(
            metric(&k, "arm.exits_per_s") > 100.0,
            "{what} under kvm-arm"
        );
    }
    let r = run_text(UDP, &["scheme=bare-metal"]);
    assert!(metric(&r, "udp.received") > 1000.0);
    let r = run_text(HRTIMER, &["scheme=bare-metal"]);
    assert!(metric(&r, "hrtimer.samples") > 800.0);
}

/// Bare metal has one kernel and no host: several VMs, host burners and
/// vCPUs sharing a core are refused.
#[test]
fn bare_metal_on_arm_refuses_what_needs_a_hypervisor() {
    use exitless::scenario::Scenario;
    let build = |text: &str| {
        let s = Scenario::parse(text, &[]).expect("parses");
        exitless::world::World::build(&s, &exitless::calibration::Calibration::default_host())
            .err()
            .map(|e| e.to_string())
    };
    let two =
        "arch = \"arm64\"\nscheme = \"bare-metal\"\nduration_s = 0.01\n[machine]\ncores = 3\n\
        [[vm]]\ncore = 1\ncopies = 2\ncopies_cores = [1, 2]\n";
    assert!(build(two).is_some_and(|e| e.contains("hypervisor")));
    let burner = "arch = \"arm64\"\nscheme = \"bare-metal\"\nduration_s = 0.01\n\
        [[host.burners]]\ncores = [1]\n";
    assert!(build(burner).is_some_and(|e| e.contains("host.burners")));
}

const VIRTIO_PING: &str = "arch = \"arm64\"\nseed = 1\nduration_s = 0.1\nwarmup_s = 0.02\n\
    [machine]\ncores = 3\n[guest]\nhz = 1000\ntick = \"periodic\"\nidle = \"halt\"\n\
    [net]\ndevice = \"virtio\"\npeer = \"remote\"\n\
    [workload.ping]\ninterval_s = 0.0005\n";

/// virtio-net-pci over vhost-net on ARM: every echo request and reply
/// crosses the paravirtual path (guest TX kick as a stage-2 data abort
/// into the ioeventfd, vhost's TX and RX, the irqfd as a virtual SPI)
/// under every ARM scheme, with no frame lost and no violation; each TX
/// kick is one DABT_LOW exit.
#[test]
fn every_frame_crosses_the_virtio_path_under_each_arm_scheme() {
    for sets in [
        &["scheme=kvm-arm"][..],
        &["scheme=kvm-arm", "arm.hyp_mode=split"][..],
        &["scheme=kvm-arm-v4"][..],
        &["scheme=kvm-arm-v4", "arm.gic=v4.1"][..],
        &["scheme=did-arm"][..],
        &["scheme=kvm-arm", "guest.idle=poll"][..],
    ] {
        let r = run_text(VIRTIO_PING, sets);
        let what = format!("{sets:?}");
        assert_eq!(r.violations(), 0, "{what}: {:?}", r.invariants.violations);
        let sent = metric(&r, "ping.sent");
        assert!(sent > 150.0, "{what}");
        assert_eq!(metric(&r, "ping.received"), sent, "{what}");
        assert_eq!(metric(&r, "vhost.tx_frames"), sent, "{what}");
        assert_eq!(metric(&r, "vhost.rx_frames"), sent, "{what}");
        assert_eq!(metric(&r, "guest.virtio_rx_frames"), sent, "{what}");
        assert_eq!(metric(&r, "nic.rx_packets"), 0.0, "{what}: not the VF");
        assert_eq!(
            metric(&r, "arm.exits.DABT_LOW"),
            metric(&r, "guest.virtio_kicks_tx"),
            "{what}"
        );
    }
    // The scenario refuses virtio without a hypervisor.
    let s = exitless::scenario::Scenario::parse(VIRTIO_PING, &["scheme=bare-metal".into()]);
    let refused = match s {
        Err(e) => e.to_string(),
        Ok(s) => {
            exitless::world::World::build(&s, &exitless::calibration::Calibration::default_host())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        }
    };
    assert!(refused.contains("virtio"), "{refused}");
}

/// iperf from the VM over virtio-net on a 1 GbE uplink: line rate under
/// KVM/ARM and did-arm, the tap dropping nothing.
#[test]
fn iperf_over_virtio_on_arm_reaches_the_link() {
    let text = format!(
        "{}[machine]\ncores = 3\n[net]\ndevice = \"virtio\"\npeer = \"remote\"\n",
        IPERF
    );
    for scheme in ["kvm-arm", "did-arm"] {
        let mut cal = exitless::calibration::Calibration::default_host();
        cal.nic.link_gbps.value = 1.0;
        let s = exitless::scenario::Scenario::parse(&text, &[format!("scheme={scheme}")])
            .expect("parses");
        let mut w = exitless::world::World::build(&s, &cal).expect("builds");
        w.run(|_| {});
        let r = w.report();
        assert_eq!(r.violations(), 0, "{scheme}");
        let g = metric(&r, "iperf.throughput_gbps");
        assert!((0.9..=1.0).contains(&g), "{scheme}: {g}");
        assert_eq!(metric(&r, "vhost.tap_drops"), 0.0, "{scheme}");
    }
}

/// The race explorer on the board preset (virtio-net, the hrtimer module,
/// WFI with dynamic halt polling and cpuidle exits) finds no failing
/// interleaving under kvm-arm or did-arm.
#[test]
fn the_race_explorer_is_clean_on_the_board_under_kvm_arm_and_did_arm() {
    let cal = exitless::calibration::Calibration::default_host();
    for scheme in ["kvm-arm", "did-arm"] {
        let set = format!("scheme={scheme}");
        let s = load_scenario("scenarios/explore/arm-board.toml", &[set.as_str()]);
        let x = exitless::explore::explore(&s, &cal, explore_opts(12), |_, _| {}).unwrap();
        assert_eq!(x.runs, 12);
        assert_eq!(
            x.failing_runs,
            0,
            "{scheme}: {:?}",
            x.counterexample.map(|c| c.violations)
        );
    }
}

const BOARD_HRTIMER: &str = "arch = \"arm64\"\nseed = 1\nduration_s = 0.2\nwarmup_s = 0.02\n\
    [machine]\ncores = 6\nboard = \"jetson-xavier-nx\"\n\
    [guest]\nhz = 250\ntick = \"periodic\"\nidle = \"halt\"\n\
    [workload.hrtimer_latency]\ninterval_us = 200\n";

/// The board's mechanisms show where they should: bare metal's core
/// idles in C1 between expiries and pays its 1 us exit latency (the same
/// kernel without the board does not); under KVM/ARM, JetPack 4.9's halt
/// polling grows its window past the idle gap, so KVM polls (nearly) the
/// whole gap at every WFI (did-arm.md §4.B's 164 us is this), while the
/// fixed-window default polls its configured 164 us.
#[test]
fn the_board_idles_in_c1_and_kvm_polls_the_idle_gap() {
    let bm = run_text(BOARD_HRTIMER, &["scheme=bare-metal"]);
    let plain = run_text(HRTIMER, &["scheme=bare-metal"]);
    let (b, p) = (
        metric(&bm, "hrtimer.latency_p50_us"),
        metric(&plain, "hrtimer.latency_p50_us"),
    );
    assert!(b > p + 1.0, "C1's exit latency: board {b} plain {p}");
    let k = run_text(BOARD_HRTIMER, &["scheme=kvm-arm"]);
    assert_eq!(k.violations(), 0);
    let poll = metric(&k, "arm.halt_poll_us_mean");
    assert!((150.0..200.0).contains(&poll), "{poll}");
    assert!(metric(&k, "arm.halt_polls_per_s") > 4000.0);
    // The idle guest's own CPUs (mpstat inside it) are nearly idle.
    assert!(metric(&k, "cpu.mpstat.busy_pct") < 5.0);
    // The board needs arm64 and its six cores.
    let e = exitless::scenario::Scenario::parse(
        "arch = \"arm64\"\nscheme = \"kvm-arm\"\nduration_s = 0.1\n[machine]\ncores = 4\nboard = \"jetson-xavier-nx\"\n",
        &[],
    )
    .expect_err("four cores");
    assert!(e.to_string().contains("machine.cores = 6"), "{e}");
}

/// JetPack 4.9's kvm_vcpu_block window: grows from 10 us by doubling
/// after short halts, keeps a halt that fit, resets after one longer than
/// the cap.
#[test]
fn the_4_9_halt_poll_window_grows_keeps_and_resets() {
    use exitless::engine::US;
    use exitless::hv::arm::halt_poll_update as up;
    let (max, start) = (500 * US, 10 * US);
    let mut w = 0;
    let mut seen = Vec::new();
    for _ in 0..7 {
        w = up(w, 190 * US, max, start);
        seen.push(w / US);
    }
    assert_eq!(seen, [10, 20, 40, 80, 160, 320, 320]);
    assert_eq!(up(320 * US, 900 * US, max, start), 0);
    assert_eq!(up(400 * US, 450 * US, max, start), 500 * US);
}

/// The board preset carries its own Ethernet: a board scenario run with the
/// shipped calibration alone (no testbed overlay) sends at the board's
/// 1 GbE, where the same scenario without `board` runs on the x86 file's
/// 10 GbE link.
#[test]
fn the_board_brings_its_own_gigabit_link() {
    let text = format!(
        "{}[machine]\ncores = 6\n[net]\ndevice = \"virtio\"\npeer = \"remote\"\n[host]\nio_cores = [2]\n",
        IPERF
    );
    let on_board = run_text(&text, &["machine.board=jetson-xavier-nx", "scheme=kvm-arm"]);
    let g = metric(&on_board, "iperf.throughput_gbps");
    assert!((0.9..=1.0).contains(&g), "board: {g} Gb/s");
    let plain = run_text(&text, &["scheme=kvm-arm"]);
    assert!(metric(&plain, "iperf.throughput_gbps") > 2.0);
}

/// The board's ping under the host scheduler (a burner on another core
/// starts it): the vCPU wakes for a timer at one scheduler tick and for a
/// frame just before the next, each schedule-in a few microseconds after
/// its tick. The checker's lost-schedule-in rule (idle under a runnable
/// vCPU for a whole tick) must not join the two wake-ups into one episode.
#[test]
fn wake_ups_at_consecutive_ticks_are_not_a_lost_schedule_in() {
    for scheme in ["kvm-arm", "kvm-arm-v4"] {
        let r = run_path(
            "validation/did-arm/board-ping.toml",
            &[
                &format!("scheme={scheme}"),
                "host.burners=[{cores=[3]}]",
                "duration_s=0.5",
            ],
        );
        assert_eq!(
            r.violations(),
            0,
            "{scheme}: {:?}",
            r.invariants.violations.first()
        );
        assert!(metric(&r, "ping.received") > 10.0, "{scheme}");
    }
}
