//! Several VMs on one machine (`[[vm]]`): each VM gets its own VF, IRT
//! entry, vCPU and guest kernel; VMs pinned to one core are multiplexed by
//! the host scheduler, with every scheme's schedule-out/in hooks.

use crate::common;
use common::*;

const THREE_VMS: &str = "name = \"three\"\nseed = 2\nduration_s = 0.2\nwarmup_s = 0.05\n\
    [machine]\ncores = 4\n\
    [[vm]]\ncore = 1\n[vm.workload.udp]\nrate_pps = 50000\n\
    [[vm]]\ncore = 1\n[vm.workload.cyclictest]\ninterval_us = 1000\n\
    [[vm]]\ncore = 2\n[vm.workload.udp]\nrate_pps = 50000\n";

#[test]
fn vms_sharing_a_core_split_it_and_a_vm_alone_keeps_its_own() {
    for scheme in ["kvm", "apicv", "kvm-2026", "eli", "elvis", "did"] {
        let r = run_text(THREE_VMS, &[&format!("scheme={scheme}")]);
        let first: Vec<_> = r.invariants.violations.iter().take(3).collect();
        assert_eq!(r.violations(), 0, "{scheme}: {first:?}");
        assert_eq!(r.vms.len(), 3);
        for v in [
            "host.vcpu_runqueue_wait_pct",
            "host.vcpu1_runqueue_wait_pct",
        ] {
            let w = metric(&r, v);
            assert!((40.0..60.0).contains(&w), "{scheme} {v}: {w}");
        }
        assert_eq!(metric(&r, "host.vcpu2_runqueue_wait_pct"), 0.0);
        // VM 2 has its core to itself: every datagram arrives, fast.
        assert_eq!(metric(&r, "vm2.udp.received"), 10_000.0, "{scheme}");
        assert!(metric(&r, "vm2.udp.latency_mean_us") < 20.0, "{scheme}");
        // VM 0 waits for its core half the time: its VF's interrupts wait
        // for its schedule-in (about one scheduling slice).
        assert!(metric(&r, "irq.descheduled") > 0.0);
        assert!(metric(&r, "irq.descheduled_delay_mean_us") > 1000.0);
        assert!(metric(&r, "udp.latency_mean_us") > 100.0);
        // The cyclictest VM got its timer interrupts on its own vector.
        assert!(metric(&r, "vm1.cyclictest.latency_mean_us") > 0.0);
        assert!(metric(&r, "vm1.guest.timer_irqs_per_s") > 0.0);
    }
}

#[test]
fn each_vm_owns_its_vf_irte_and_interrupts() {
    let r = run_text(THREE_VMS, &["scheme=did"]);
    // DID: both UDP VMs' interrupts are delivered (no exits for them on
    // the core-2 VM, which is never descheduled).
    assert!(r.vms[2].exits_per_s < 200.0, "{}", r.vms[2].exits_per_s);
    assert!(metric(&r, "vm2.nic.interrupts_per_s") > 1000.0);
    assert!(metric(&r, "nic.interrupts_per_s") > 100.0);
    assert_eq!(metric(&r, "vm1.nic.interrupts_per_s"), 0.0);
}

#[test]
fn several_vm_scenarios_repeat_byte_for_byte() {
    let a = serde_json::to_string(&run_text(THREE_VMS, &["scheme=apicv"])).unwrap();
    let b = serde_json::to_string(&run_text(THREE_VMS, &["scheme=apicv"])).unwrap();
    assert_eq!(a, b);
}

#[test]
fn unsupported_or_inconsistent_vm_tables_are_rejected_by_key() {
    let parse = |t: &str| {
        exitless::scenario::Scenario::parse(t, &[])
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let base = "scheme = \"did\"\nduration_s = 0.1\n[machine]\ncores = 3\n";
    let e = parse(&format!(
        "{base}[workload.udp]\nrate_pps = 1000\n[[vm]]\ncore = 1\n"
    ));
    assert!(e.contains("workload"), "{e}");
    let e = parse(&format!("{base}[[vm]]\ncore = 0\n"));
    assert!(e.contains("vm[0].core"), "{e}");
    let e = parse(&format!("{base}[[vm]]\ncore = 3\n"));
    assert!(e.contains("vm[0].core"), "{e}");
    // Two vCPUs from core 2: the second would be on core 3, past the machine.
    let e = parse(&format!("{base}[[vm]]\ncore = 2\nvcpus = 2\n"));
    assert!(e.contains("vm[0].core"), "{e}");
    let e = parse(&format!("{base}[[vm]]\ncore = 1\nvcpus = 0\n"));
    assert!(e.contains("vm[0].vcpus"), "{e}");
    let e = parse(&format!(
        "{base}[[vm]]\ncore = 1\n[[vm]]\ncore = 2\n[vm.workload.sip]\nrate_cps = 10\n"
    ));
    assert!(e.contains("vm[1].workload"), "{e}");
    // Bare metal has no hypervisor to host two VMs.
    let s = exitless::scenario::Scenario::parse(
        &format!("{base}[[vm]]\ncore = 1\n[[vm]]\ncore = 2\n"),
        &["scheme=bare-metal".to_string()],
    )
    .unwrap();
    let e = exitless::world::World::build(&s, &exitless::calibration::Calibration::default_host())
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("several VMs"), "{e}");
}

#[test]
fn one_vm_table_is_the_same_as_the_top_level_form() {
    let top = "scheme = \"did\"\nseed = 4\nduration_s = 0.05\n[workload.udp]\nrate_pps = 80000\n";
    let table = "scheme = \"did\"\nseed = 4\nduration_s = 0.05\n[[vm]]\ncore = 1\n[vm.workload.udp]\nrate_pps = 80000\n";
    let a = run_text(top, &[]);
    let b = run_text(table, &[]);
    assert_eq!(
        serde_json::to_string(&a.metrics).unwrap(),
        serde_json::to_string(&b.metrics).unwrap()
    );
    assert_eq!(a.vms[0].exits_per_s, b.vms[0].exits_per_s);
}

/// Each VM's TCP workload runs over its own VF to its own load generator:
/// two memcached VMs share core 1, a NetPIPE VM has core 2; every VM gets
/// its answers (frames are routed by VF and flow, and every VM numbers its
/// connections from 1), and sharing a core shows in the tail.
#[test]
fn tcp_workloads_of_several_vms_each_talk_to_their_own_peer() {
    let text = "name = \"mc\"\nscheme = \"did\"\nseed = 1\nduration_s = 0.1\nwarmup_s = 0.02\n\
                [machine]\ncores = 4\n\
                [[vm]]\ncore = 1\n[vm.workload.memcached]\nrate_rps = 50000\n\
                [[vm]]\ncore = 1\n[vm.workload.memcached]\nrate_rps = 50000\n\
                [[vm]]\ncore = 2\n[vm.workload.netpipe]\nmsg_bytes = 64\n\
                [[vm]]\ncore = 3\n[vm.workload.memcached]\nrate_rps = 50000\n";
    for scheme in ["kvm", "apicv", "did"] {
        let r = run_text(text, &[&format!("scheme={scheme}")]);
        assert_eq!(
            r.violations(),
            0,
            "{scheme}: {:?}",
            r.invariants.violations.first()
        );
        for p in ["", "vm1.", "vm3."] {
            let done = metric(&r, &format!("{p}memcached.completed"));
            assert!(done > 3000.0, "{scheme} {p}: {done}");
        }
        assert!(metric(&r, "vm2.netpipe.round_trips") > 1000.0, "{scheme}");
        // VM 0 waits for VM 1's slices; VM 3 has its core to itself.
        let shared = metric(&r, "memcached.p99_ms");
        let alone = metric(&r, "vm3.memcached.p99_ms");
        assert!(shared > 10.0 * alone, "{scheme}: {shared} ms vs {alone} ms");
    }
}

/// The VMs' VFs and the load generators share the host's one 10 GbE port:
/// four iperf streams together stay under its line rate, each way (each
/// alone would reach about 4 Gb/s, 16 in all, when every VF had a wire of
/// its own).
#[test]
fn vms_share_the_one_port_of_the_nic() {
    for direction in ["to-vm", "from-vm"] {
        let text = format!(
            "name = \"port\"\nscheme = \"did\"\nseed = 1\nduration_s = 0.1\nwarmup_s = 0.02\n\
             [machine]\ncores = 6\n\
             [[vm]]\ncopies = 4\ncore = 1\ncopies_cores = [1, 2, 3, 4]\n\
             [vm.workload.iperf]\ndirection = \"{direction}\"\n"
        );
        let r = run_text(&text, &[]);
        assert_eq!(r.violations(), 0);
        let each: Vec<f64> = ["", "vm1.", "vm2.", "vm3."]
            .iter()
            .map(|p| metric(&r, &format!("{p}iperf.throughput_gbps")))
            .collect();
        let total: f64 = each.iter().sum();
        assert!(
            total <= 10.0,
            "{direction}: {each:?} = {total} Gb/s over a 10 GbE port"
        );
        assert!(total > 8.0, "{direction}: the port is used: {total}");
        for g in &each {
            assert!(*g > 1.5, "{direction}: every VM gets its share: {each:?}");
        }
    }
}

/// Results across VMs (docs/metrics.md, Several VMs): sums add up, a
/// percentile over every VM's samples lies within the VMs' own, and the
/// mean latency is over every sample (weighted by each VM's requests), not
/// the mean of the two means. Two VMs at very different loads.
#[test]
fn aggregates_over_vms_sum_counts_and_merge_latency_samples() {
    let r = run_text(
        "scheme = \"apicv\"\nduration_s = 0.1\nwarmup_s = 0.02\n[machine]\ncores = 4\n\
         [nic]\nitr = \"ixgbevf-3.6\"\n\
         [[vm]]\ncore = 1\n[vm.workload.memcached]\nrate_rps = 100000\n\
         [[vm]]\ncore = 2\n[vm.workload.memcached]\nrate_rps = 5000\n",
        &[],
    );
    let m = |k: &str| metric(&r, k);
    assert_eq!(
        m("all.memcached.completed"),
        m("memcached.completed") + m("vm1.memcached.completed")
    );
    assert_eq!(
        m("all.memcached.backlog_peak"),
        m("memcached.backlog_peak").max(m("vm1.memcached.backlog_peak"))
    );
    assert_eq!(
        m("all.exits_per_s"),
        r.vms[0].exits_per_s + r.vms[1].exits_per_s
    );
    for p in ["p50", "p99"] {
        let (a, b) = (
            m(&format!("memcached.{p}_ms")),
            m(&format!("vm1.memcached.{p}_ms")),
        );
        let all = m(&format!("all.memcached.{p}_ms"));
        assert!(all >= a.min(b) && all <= a.max(b), "{p}: {a} {b} -> {all}");
    }
    let (n0, n1) = (m("memcached.completed"), m("vm1.memcached.completed"));
    let (m0, m1) = (m("memcached.mean_ms"), m("vm1.memcached.mean_ms"));
    let weighted = (m0 * n0 + m1 * n1) / (n0 + n1);
    let all = m("all.memcached.mean_ms");
    assert!(
        (all - weighted).abs() <= 0.02 * weighted,
        "{all} vs {weighted}"
    );
    assert!(
        (all - (m0 + m1) / 2.0).abs() > 0.1 * all,
        "{all}: the plain mean of means"
    );
}

/// vCanal's scalability layout (§4.5): VMs sending netperf TCP_STREAM
/// through one shared I/O core. `netperf.aggregate_gbps` is the VMs'
/// receivers' bytes over the measured interval, so it is the sum of what
/// each VM's netserver counted, and it cannot exceed the 10 GbE link,
/// where the per-VM first-to-last-byte rates may add up past it.
#[test]
fn the_stream_aggregate_is_the_bytes_of_every_vm_over_the_interval() {
    for device in ["virtio", "vf"] {
        let mut sets = vec!["vm.0.copies=4".to_string(), format!("net.device={device}")];
        if device == "vf" {
            sets.push("vm.0.workload.vcanal={service_core=0}".into());
        }
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let s = load_scenario("validation/vcanal/scalability.toml", &sets);
        let mut w =
            exitless::world::World::build(&s, &exitless::calibration::Calibration::default_host())
                .expect("world builds");
        w.run(|_| {});
        let r = w.report();
        assert_eq!(r.violations(), 0, "{device}");
        let dur = r.duration_s;
        let bytes: f64 = (0..4)
            .map(|vm| metric(&r, &format!("{}netperf.bytes", vm_prefix(vm))))
            .sum();
        let agg = metric(&r, "netperf.aggregate_gbps");
        assert!(bytes > 0.0, "{device}");
        let want = bytes * 8.0 / dur / 1e9;
        assert!(
            (agg - want).abs() <= 1e-9 * want,
            "{device}: {agg} vs {want}"
        );
        assert!(agg <= 10.0, "{device}: {agg} Gb/s is past the link");
        let vm0 = metric(&r, "netperf.bytes") * 8.0 / dur / 1e9;
        assert!(agg > 3.0 * vm0, "{device}: four VMs' {agg} vs VM 0's {vm0}");
    }
}
