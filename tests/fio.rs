//! Fio on virtio-blk: every request is kicked, served by the RAM-disk back
//! end and completed through the scheme; the per-request guard timer is
//! what puts TMICT writes among KVM's MSR-write exits (DID §5.6).

mod common;
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
        // pool thread.
        assert!(
            (metric(r, "blk.main_wakeups") - 2.0 * reqs).abs() <= 4.0,
            "{n}"
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
