//! The paravirtual path (virtio-net, ioeventfd, vhost, irqfd) under each
//! scheme: which exits remain on a NetPIPE ping-pong, and that every
//! virtual interrupt is delivered.

use crate::common;
use common::*;
use exitless::scenario::Scenario;

fn netpipe(scheme: &str) -> exitless::report::RunReport {
    run_file(
        "netpipe.toml",
        &[
            &format!("scheme={scheme}"),
            "duration_s=0.1",
            "msg_bytes=64",
        ],
    )
}

#[test]
fn pv_round_trip_exits_per_scheme() {
    let kvm = netpipe("kvm");
    let apicv = netpipe("apicv");
    let did = netpipe("did");
    for (name, r) in [("kvm", &kvm), ("apicv", &apicv), ("did", &did)] {
        assert_eq!(r.violations(), 0, "{name}: {:?}", r.invariants.violations);
        let rt = metric(r, "netpipe.round_trips");
        assert!(rt > 500.0, "{name}: {rt} round trips");
        // Every echo leaves with one kick (the ring is idle in between),
        // an ioeventfd IO_INSTRUCTION exit in every scheme.
        let kicks = rate(r, "IO_INSTRUCTION") * 0.1;
        assert!(
            kicks >= 0.95 * rt,
            "{name}: {kicks} kicks for {rt} round trips"
        );
        // The back end's signal reaches the guest once per message.
        let irqs = metric(r, "guest.virtio_irqs");
        assert!((irqs - rt).abs() <= 2.0, "{name}: {irqs} irqs for {rt}");
    }
    let per_rt = |r: &exitless::report::RunReport, reason: &str| {
        rate(r, reason) * 0.1 / metric(r, "netpipe.round_trips")
    };
    // KVM: the irqfd kicks the vCPU out (EXTINT) and the EOI traps.
    assert!(per_rt(&kvm, "EXTERNAL_INTERRUPT") >= 0.95);
    assert!(per_rt(&kvm, "MSR_WRITE") >= 1.0);
    // APICv posts the interrupt and virtualizes the EOI; the NO_HZ
    // guest's TMICT writes still trap.
    assert!(per_rt(&apicv, "EXTERNAL_INTERRUPT") < 0.1);
    assert!(per_rt(&apicv, "MSR_WRITE") < per_rt(&kvm, "MSR_WRITE"));
    // DID: the back end's IPI lands in the guest; EOI and TMICT pass through.
    assert_eq!(rate(&did, "EXTERNAL_INTERRUPT"), 0.0);
    assert_eq!(rate(&did, "MSR_WRITE"), 0.0);
    let lat = |r: &exitless::report::RunReport| metric(r, "netpipe.half_rtt_us");
    assert!(lat(&did) < lat(&apicv) && lat(&apicv) < lat(&kvm));
}

#[test]
fn pv_is_clean_under_preemption_and_eli() {
    // Back-end signals while the vCPU is descheduled must wait and arrive.
    let text = std::fs::read_to_string(scenario_path("netpipe.toml")).unwrap();
    let text = format!("{text}\n[[preemptions]]\nat_ms = 30\nfor_ms = 2\n[[preemptions]]\nat_ms = 60\nfor_ms = 5\n");
    for scheme in ["kvm", "apicv", "eli", "elvis", "did"] {
        let r = run_text(&text, &[&format!("scheme={scheme}"), "duration_s=0.1"]);
        assert_eq!(r.violations(), 0, "{scheme}: {:?}", r.invariants.violations);
        assert!(metric(&r, "netpipe.round_trips") > 500.0, "{scheme}");
    }
}

#[test]
fn config_names_select_scheme_and_device() {
    let base = "duration_s = 0.01\n[workload.netpipe]\nmsg_bytes = 64\n";
    let s = Scenario::parse(&format!("config = \"pv-did\"\n{base}"), &[]).unwrap();
    assert_eq!(s.scheme, "did");
    assert_eq!(s.net.device, exitless::scenario::NetDevice::Virtio);
    let e = Scenario::parse(&format!("config = \"pv\"\nscheme = \"did\"\n{base}"), &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("config"), "{e}");
    let e = Scenario::parse(&format!("config = \"pv-turbo\"\n{base}"), &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("pv-turbo") && e.contains("sriov-did"), "{e}");
    let e = Scenario::parse(base, &[]).unwrap_err().to_string();
    assert!(e.contains("scheme"), "{e}");
    // A `--set config` overrides the file's scheme and device...
    let file = format!("scheme = \"kvm\"\n{base}");
    let s = Scenario::parse(&file, &["config=sriov-did".into()]).unwrap();
    assert_eq!(s.scheme, "did");
    assert_eq!(s.net.device, exitless::scenario::NetDevice::Vf);
    // ...but clashes with a `--set scheme` beside it.
    let e = Scenario::parse(&file, &["config=pv".into(), "scheme=did".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("config"), "{e}");
}

#[test]
fn event_idx_off_uses_ring_flags_and_still_delivers() {
    let flags = run_file(
        "netpipe.toml",
        &["scheme=kvm", "duration_s=0.05", "net.event_idx=false"],
    );
    assert_eq!(flags.violations(), 0);
    assert!(metric(&flags, "netpipe.round_trips") > 300.0);
    assert!(metric(&flags, "vhost.signals") > 300.0);
}

#[test]
fn sriov_netpipe_round_trips_through_the_vf() {
    let run = |scheme: &str| {
        run_file(
            "netpipe.toml",
            &[
                &format!("scheme={scheme}"),
                "net.device=vf",
                "duration_s=0.05",
            ],
        )
    };
    let bm = run("bare-metal");
    let kvm = run("kvm");
    let did = run("did");
    for (name, r) in [("bm", &bm), ("kvm", &kvm), ("did", &did)] {
        assert_eq!(r.violations(), 0, "{name}: {:?}", r.invariants.violations);
        let rt = metric(r, "netpipe.round_trips");
        assert!(rt > 300.0, "{name}: {rt}");
        // Request in, echo out: the VF moved both.
        assert!(metric(r, "guest.rx_packets") >= rt - 2.0, "{name}");
        assert!(metric(r, "guest.tx_frames") >= rt - 2.0, "{name}");
    }
    // KVM takes the VF's interrupts (RX and TX completion share a vector)
    // as exits and traps their EOIs; DID takes neither.
    let nic = metric(&kvm, "nic.interrupts_per_s");
    assert!(rate(&kvm, "EXTERNAL_INTERRUPT") >= 0.9 * nic);
    assert_eq!(rate(&did, "EXTERNAL_INTERRUPT"), 0.0);
    assert_eq!(rate(&did, "MSR_WRITE"), 0.0);
    let lat = |r: &exitless::report::RunReport| metric(r, "netpipe.half_rtt_us");
    assert!(
        (lat(&did) - lat(&bm)).abs() < 0.3,
        "{} {}",
        lat(&did),
        lat(&bm)
    );
}

#[test]
fn elvis_polls_instead_of_kicks_and_delivers_pv_interrupts_directly() {
    let eli = netpipe("eli");
    let elvis = netpipe("elvis");
    for (n, r) in [("eli", &eli), ("elvis", &elvis)] {
        assert_eq!(r.violations(), 0, "{n}: {:?}", r.invariants.violations);
    }
    let rt = metric(&elvis, "netpipe.round_trips");
    assert!(rt > 500.0);
    // The side core polls: the guest never kicks, so no kick exits.
    assert_eq!(metric(&elvis, "guest.virtio_kicks_tx"), 0.0);
    assert!(rate(&elvis, "IO_INSTRUCTION") * 0.1 < 0.05 * rt);
    assert!(rate(&eli, "IO_INSTRUCTION") * 0.1 >= 0.95 * metric(&eli, "netpipe.round_trips"));
    // Completions arrive as IPIs the shadow IDT gives to the guest: no
    // per-message bounce or EOI exit as under plain ELI.
    let per_rt = |r: &exitless::report::RunReport, reason: &str| {
        rate(r, reason) * 0.1 / metric(r, "netpipe.round_trips")
    };
    assert!(per_rt(&eli, "EXCEPTION_NMI") > 0.9);
    assert!(per_rt(&elvis, "EXCEPTION_NMI") < 0.1);
    assert!(per_rt(&elvis, "MSR_WRITE") < 0.1);
    assert!(metric(&elvis, "netpipe.half_rtt_us") < metric(&eli, "netpipe.half_rtt_us"));
}

/// ELVIS sends a PV interrupt as a physical IPI to the core its vCPU runs
/// on; every VM's devices use the same vectors. Four NetPIPE VMs over
/// virtio-net on two cores: an IPI still in flight when its vCPU is
/// switched out lands in host mode before the next VM enters and is
/// injected into its own VM, and a vCPU with a directly delivered vector
/// in service on the physical LAPIC is not switched out (before: lost and
/// misdelivered 0x51, the next VM entering with it in service).
#[test]
fn elvis_pv_interrupts_stay_with_their_vm_when_vms_share_a_core() {
    let text = "name = \"t\"\nscheme = \"elvis\"\nduration_s = 0.3\nwarmup_s = 0.02\n\
                [machine]\ncores = 4\n[net]\ndevice = \"virtio\"\n\
                [[vm]]\ncore = 1\ncopies = 4\ncopies_cores = [1, 2]\n\
                [vm.workload.netpipe]\nmsg_bytes = 64\n";
    for seed in 1..=3 {
        let r = run_text(text, &[&format!("seed={seed}")]);
        assert_eq!(
            r.violations(),
            0,
            "seed {seed}: {:?}",
            r.invariants.violations.first()
        );
        for vm in 0..4 {
            let p = vm_prefix(vm);
            assert!(metric(&r, &format!("{p}netpipe.round_trips")) > 100.0);
        }
    }
}

/// The bridge and the receive path of a process on the VM's own host run
/// in the vhost worker that hands each frame to the tap (`netif_rx_ni`
/// runs the softirq in the caller): making that receive path dearer makes
/// the worker busier by as much per frame, the peer's CPUs none the
/// busier; a peer across the link (the host's NIC sends the frame on)
/// adds nothing to the worker.
#[test]
fn a_local_peers_receive_path_runs_in_the_vhost_worker() {
    use exitless::calibration::Calibration;
    use exitless::world::World;
    let busy = |peer: &str, extra_ns: f64| -> (f64, f64) {
        let s = common::load_scenario(
            "validation/did/netpipe.toml",
            &[
                "scheme=kvm",
                "duration_s=0.1",
                &format!("net.peer=\"{peer}\""),
            ],
        );
        let mut cal = Calibration::default_host();
        cal.peer.rx_segment_ns.value += extra_ns;
        let mut w = World::build(&s, &cal).expect("world builds");
        w.run(|_| {});
        let r = w.report();
        assert_eq!(r.violations(), 0);
        // The measured window (the warm-up comes before it).
        let secs = s.duration_s;
        let frames_per_s = metric(&r, "vhost.tx_frames") / secs;
        (metric(&r, "vhost.io_cpu_pct"), frames_per_s)
    };
    // The worker's time per frame the guest sent (one a round trip, and
    // the frame the worker takes to the guest) grows by the 3 us.
    let per_frame = |(pct, frames): (f64, f64)| pct / 100.0 / frames * 1e6;
    let base = per_frame(busy("host", 0.0));
    let dear = per_frame(busy("host", 3000.0));
    assert!(
        (dear - base - 3.0).abs() < 0.3,
        "vhost busy per frame {base:.2} us -> {dear:.2} us"
    );
    let remote = per_frame(busy("remote", 0.0));
    let remote_dear = per_frame(busy("remote", 3000.0));
    assert!(
        (remote_dear - remote).abs() < 0.1,
        "remote peer: vhost busy per frame {remote:.2} us -> {remote_dear:.2} us"
    );
}

/// Linux 3.6's vhost-net with EVENT_IDX kicks once per drain of the TX
/// ring (docs/papers.md, "TX notification as Linux 3.6 and 4.4 do it").
/// memcached's responses leave one per request: a worker with a core of
/// its own wakes and drains each before the next, so nearly every
/// response kicks; a worker that shares its core with CPU-bound host
/// threads cannot run the moment it is kicked, the responses added
/// meanwhile publish past `avail_event` without a kick, and the guest
/// spends more of its time in guest mode.
#[test]
fn memcached_kicks_fall_when_the_vhost_worker_cannot_run_at_once() {
    let run = |burners: &str| {
        let mut sets = vec![
            "scheme=did",
            "net.device=virtio",
            "workload.memcached.rate_rps=50000",
            "duration_s=0.1",
            "host.io_cores=[0]",
        ];
        let b = format!("host.burners={burners}");
        if !burners.is_empty() {
            sets.push(&b);
        }
        let r = run_file("memcached.toml", &sets);
        assert_eq!(
            r.violations(),
            0,
            "{burners}: {:?}",
            r.invariants.violations
        );
        assert!(metric(&r, "memcached.completed") > 4000.0, "{burners}");
        (metric(&r, "vhost.tx_kicks_per_frame"), r.vms[0].tig_pct)
    };
    let (alone, tig_alone) = run("");
    let (shared, tig_shared) = run("[{cores=[0]}, {cores=[0]}, {cores=[0]}]");
    assert!(
        alone > 0.7,
        "a worker of its own drains each response: {alone}"
    );
    assert!(
        shared < 0.6 * alone,
        "a contended worker batches: {shared} against {alone}"
    );
    assert!(tig_shared > tig_alone, "{tig_shared} vs {tig_alone}");
}
