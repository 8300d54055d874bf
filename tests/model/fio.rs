//! Fio on virtio-blk: every request is kicked, served by the RAM-disk back
//! end and completed through the scheme; the per-request guard timer is
//! what puts TMICT writes among KVM's MSR-write exits (DID §5.6).

use crate::common;
use common::*;

fn fio(scheme: &str, extra: &[&str]) -> exitless::report::RunReport {
    let mut sets = vec![format!("scheme={scheme}"), "duration_s=0.05".to_string()];
    sets.extend(extra.iter().map(|s| s.to_string()));
    let sets: Vec<&str> = sets.iter().map(|s| s.as_str()).collect();
    run_file("fio.toml", &sets)
}

#[test]
fn fio_requests_complete_through_each_scheme() {
    let kvm = fio("kvm", &[]);
    let did = fio("did", &[]);
    for (n, r) in [("kvm", &kvm), ("did", &did)] {
        assert_eq!(r.violations(), 0, "{n}: {:?}", r.invariants.violations);
        let reqs = metric(r, "blk.requests");
        assert!(reqs > 1000.0, "{n}: {reqs}");
        // Queue depth 1: one kick and one completion interrupt per request.
        assert!((metric(r, "blk.kicks") - reqs).abs() <= 2.0, "{n}");
        assert!((metric(r, "blk.signals") - reqs).abs() <= 2.0, "{n}");
        assert_eq!(metric(r, "blk.out_of_range"), 0.0);
        // qemu-kvm 1.0, aio=threads: the kick and the completion pipe each
        // wake the sleeping main loop, the submission wakes the sleeping
        // pool thread; except while a display refresh keeps the loop
        // awake (50 us: the kicks and pipes of two or three requests find
        // it busy).
        let wakeups = metric(r, "blk.main_wakeups");
        let refreshes = metric(r, "blk.display_refreshes");
        assert!((1.0..=3.0).contains(&refreshes), "{n}: {refreshes}");
        let missing = 2.0 * reqs - wakeups;
        assert!(
            (-4.0..=4.0 + 6.0 * refreshes).contains(&missing),
            "{n}: {wakeups} wake-ups for {reqs} requests"
        );
        assert!((metric(r, "blk.worker_wakeups") - reqs).abs() <= 2.0, "{n}");
    }
    let per_req = |r: &exitless::report::RunReport, reason: &str| {
        rate(r, reason) * 0.05 / metric(r, "blk.requests")
    };
    // KVM: EOI plus the guard timer's TMICT writes; the completion kicks
    // the vCPU out.
    assert!(
        per_req(&kvm, "MSR_WRITE") >= 2.0,
        "{}",
        per_req(&kvm, "MSR_WRITE")
    );
    assert!(per_req(&kvm, "EXTERNAL_INTERRUPT") >= 0.9);
    assert_eq!(rate(&did, "MSR_WRITE"), 0.0);
    assert_eq!(rate(&did, "EXTERNAL_INTERRUPT"), 0.0);
    assert!(metric(&did, "fio.iops") > metric(&kvm, "fio.iops"));
    assert!(metric(&did, "fio.completion_us") < metric(&kvm, "fio.completion_us"));
}

#[test]
fn guard_timer_drives_the_timer_writes() {
    let with = fio("kvm", &[]);
    let without = fio("kvm", &["workload.fio.guard_ms=0"]);
    let per_req =
        |r: &exitless::report::RunReport| rate(r, "MSR_WRITE") * 0.05 / metric(r, "blk.requests");
    assert!(
        per_req(&with) > per_req(&without) + 0.5,
        "{} vs {}",
        per_req(&with),
        per_req(&without)
    );
}

/// `copies` VMs of one vCPU each running Fio, spread over `cores`.
fn fio_vms(scheme: &str, copies: u32, cores: &str, idle: &str) -> String {
    format!(
        "name = \"t\"\nscheme = \"{scheme}\"\nduration_s = 0.05\nwarmup_s = 0.01\n\
         [machine]\ncores = 6\n[guest]\ntick = \"nohz-idle\"\nidle = \"{idle}\"\n\
         [[vm]]\ncore = 1\ncopies = {copies}\ncopies_cores = [{cores}]\n[vm.workload.fio]\n"
    )
}

/// Each VM with Fio has its own virtio-blk device: its own request queue,
/// ioeventfd and QEMU back end, and its completions come back to it. Two
/// VMs on their own cores get the IOPS one VM gets.
#[test]
fn two_vms_with_fio_each_drive_their_own_device() {
    for scheme in ["kvm", "did"] {
        let one = run_text(&fio_vms(scheme, 1, "1", "poll"), &[]);
        let two = run_text(&fio_vms(scheme, 2, "1, 2", "poll"), &[]);
        assert_eq!(two.violations(), 0, "{scheme}: {:?}", two.invariants);
        let solo = metric(&one, "fio.iops");
        for vm in 0..2 {
            let p = vm_prefix(vm);
            let reqs = metric(&two, &format!("{p}blk.requests"));
            assert!(reqs > 1000.0, "{scheme} VM {vm}: {reqs}");
            // Queue depth 1: its own kicks reached its own back end, and
            // every completion was signalled to it.
            assert!((metric(&two, &format!("{p}blk.kicks")) - reqs).abs() <= 2.0);
            assert!((metric(&two, &format!("{p}blk.signals")) - reqs).abs() <= 2.0);
            let iops = metric(&two, &format!("{p}fio.iops"));
            assert!(
                (iops - solo).abs() < 0.02 * solo,
                "{scheme} VM {vm}: {iops} IOPS, alone {solo}"
            );
            // Each VM's exits are its own kicks (an ioeventfd each).
            let io = two.vms[vm].exits_per_s_by_reason["IO_INSTRUCTION"];
            assert!(io * 0.05 >= reqs - 2.0, "{scheme} VM {vm}: {io}");
        }
    }
}

/// The completion interrupt goes where the VM's MSI affinity says, for
/// every VM (not its first vCPU): with it on the other vCPU of a halting
/// 2-vCPU guest, every completion wakes Fio there by a reschedule IPI.
#[test]
fn completions_follow_each_vms_msi_affinity() {
    let text = |irq: u32| {
        format!(
            "name = \"t\"\nscheme = \"kvm\"\nduration_s = 0.05\nwarmup_s = 0.01\n\
             [machine]\ncores = 6\n[guest]\nidle = \"halt\"\n\
             [[vm]]\nvcpus = 2\ncores = [1, 2]\ncopies = 2\ncopies_cores = [1, 2, 3, 4]\n\
             app_vcpu = 0\nirq_affinity = [{irq}]\n[vm.workload.fio]\n"
        )
    };
    let local = run_text(&text(0), &[]);
    let remote = run_text(&text(1), &[]);
    for vm in 0..2 {
        let p = vm_prefix(vm);
        for r in [&local, &remote] {
            assert_eq!(r.violations(), 0, "{:?}", r.invariants);
            assert!(metric(r, &format!("{p}blk.requests")) > 500.0);
        }
        let iops = metric(&remote, &format!("{p}fio.iops"));
        let ipis = metric(&remote, &format!("{p}guest.ipis_sent_per_s"));
        assert!(
            (ipis - iops).abs() < 0.05 * iops,
            "VM {vm}: {ipis} IPIs/s for {iops} IOPS"
        );
        assert_eq!(metric(&local, &format!("{p}guest.ipis_sent_per_s")), 0.0);
    }
}

/// `copies` of a Fio VM, four VMs on two cores under the host scheduler,
/// spinning or halting when idle: every scheme keeps every VM's disk going
/// and the checker clean (ELVIS's PV interrupts of a VM switched out
/// while they were in flight land in host mode and stay its own).
///
/// Not ELI or ELVIS with halting guests: there the checker can rightly
/// report a timer expiry as lost. A guest in direct mode runs with IF = 0
/// while the host's timer interrupt waits on the core; if it then rewrites
/// TMICT (a context switch stopping the NO_HZ tick), KVM's
/// `start_apic_timer` zeroes the expiry `apic_timer_fn` left pending, and
/// the interrupt the hardware would have raised never comes
/// (docs/multiplexing.md).
#[test]
fn copies_of_a_fio_vm_sharing_cores_stay_correct_under_every_scheme() {
    for scheme in ["kvm", "apicv", "kvm-2026", "did", "eli", "elvis"] {
        for idle in ["poll", "halt"] {
            if idle == "halt" && scheme.starts_with("el") {
                continue;
            }
            let r = run_text(&fio_vms(scheme, 4, "1, 2", idle), &[]);
            assert_eq!(
                r.violations(),
                0,
                "{scheme} {idle}: {:?}",
                r.invariants.violations.first()
            );
            let iops: Vec<f64> = (0..4)
                .map(|vm| metric(&r, &format!("{}fio.iops", vm_prefix(vm))))
                .collect();
            let (lo, hi) = iops
                .iter()
                .fold((f64::MAX, 0f64), |(l, h), &x| (l.min(x), h.max(x)));
            assert!(lo > 5000.0, "{scheme} {idle}: {iops:?}");
            // Equal shares, give or take a slice of a short run.
            assert!(hi < 1.3 * lo, "{scheme} {idle}: {iops:?}");
        }
    }
}

/// What is still not modelled for Fio is refused with the key, never a
/// panic: a bare-metal VM (no QEMU back end) in `[[vm]]` form as well,
/// and a VM's Fio keys are checked like the top-level ones.
#[test]
fn fio_combinations_not_modelled_are_refused_by_key() {
    let parse = |text: &str| match exitless::scenario::Scenario::parse(text, &[]) {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e.to_string(),
    };
    let vm = "name = \"t\"\nscheme = \"SCHEME\"\nduration_s = 0.01\n[[vm]]\ncore = 1\n[vm.workload.fio]\n";
    let e = parse(&vm.replace("SCHEME", "bare-metal"));
    assert!(
        e.contains("vm[0].workload.fio") && e.contains("hypervisor"),
        "{e}"
    );
    let e = parse(&format!(
        "{}block_bytes = 1000\n",
        vm.replace("SCHEME", "kvm")
    ));
    assert!(e.contains("vm[0].workload.fio.block_bytes"), "{e}");
    let e = parse(&format!(
        "{}disk_bytes = 9000000000000000000\n",
        vm.replace("SCHEME", "kvm")
    ));
    assert!(e.contains("vm[0].workload.fio.disk_bytes"), "{e}");
    let e = parse("scheme = \"bare-metal\"\nduration_s = 0.01\n[workload.fio]\n");
    assert!(e.contains("workload.fio"), "{e}");
}

/// Fio under KVM with the shipped calibration changed by `edit`.
fn fio_with(
    sets: &[&str],
    edit: impl Fn(&mut exitless::calibration::Calibration),
) -> exitless::report::RunReport {
    let mut all = vec!["scheme=kvm", "duration_s=0.1"];
    all.extend_from_slice(sets);
    let s = load_scenario("validation/did/fio.toml", &all);
    let mut cal = exitless::calibration::Calibration::default_host();
    // Exact costs, so that one stage's change shows as itself.
    cal.guest.cost_cv.value = 0.0;
    edit(&mut cal);
    let mut w = exitless::world::World::build(&s, &cal).expect("world builds");
    w.run(|_| {});
    w.report()
}

/// The guest block layer's stages lie on every request's path between
/// fio's issue stamp and its return, once per request; fio's own work per
/// I/O lies outside the completion time but bounds the rate.
#[test]
fn the_block_layer_stages_and_fio_work_are_charged_where_they_run() {
    let base = fio_with(&[], |_| {});
    let slower_cfq = fio_with(&[], |c| c.guest.blk_elv_insert_ns.value += 5000.0);
    let slower_fio = fio_with(&[], |c| c.guest.fio_io_ns.value += 5000.0);
    for r in [&base, &slower_cfq, &slower_fio] {
        assert_eq!(r.violations(), 0);
    }
    let lat = |r: &exitless::report::RunReport| metric(r, "fio.completion_us");
    let added = lat(&slower_cfq) - lat(&base);
    assert!((4.5..5.5).contains(&added), "CFQ insert: {added} us");
    let added = lat(&slower_fio) - lat(&base);
    assert!(added.abs() < 0.5, "fio's own work: {added} us");
    // Fio's own work lengthens each turn of its loop.
    let turn = |r: &exitless::report::RunReport| 1e6 / metric(r, "fio.iops");
    let longer = turn(&slower_fio) - turn(&base);
    assert!((4.5..5.5).contains(&longer), "{longer} us a turn");
}

/// With an SDL display QEMU's main loop refreshes it every 30 ms; with
/// none it does not, and the requests that met a refresh are what the
/// tail loses.
#[test]
fn the_display_refresh_runs_on_the_main_loop_every_30_ms() {
    let sdl = fio_with(&[], |_| {});
    let none = fio_with(&["host.qemu_display=none"], |_| {});
    let refreshes = metric(&sdl, "blk.display_refreshes");
    // 0.1 s minus the 0.02 s warm-up: 2 or 3 refreshes.
    assert!((2.0..=3.0).contains(&refreshes), "{refreshes}");
    assert_eq!(metric(&none, "blk.display_refreshes"), 0.0);
    let max = |r: &exitless::report::RunReport| metric(r, "fio.completion_p999_us");
    assert!(max(&sdl) >= max(&none), "{} vs {}", max(&sdl), max(&none));
    assert!(metric(&sdl, "fio.iops") < metric(&none, "fio.iops"));
}
