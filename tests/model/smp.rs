//! SMP guests: per-vCPU kernels, reschedule IPIs through the ICR (exits or
//! not as the VMCS says), device-interrupt affinity, and every scheme
//! staying correct with 4 VMs × 4 vCPUs multiplexed on 4 cores.

use crate::common;
use common::*;
use std::path::PathBuf;

fn smp_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios/smp")
        .join(name)
}

fn run_smp(name: &str, sets: &[&str]) -> exitless::report::RunReport {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let s = exitless::scenario::Scenario::load(&smp_path(name), &sets).expect("scenario loads");
    let mut w =
        exitless::world::World::build(&s, &exitless::calibration::Calibration::default_host())
            .expect("world builds");
    w.run(|_| {});
    w.report()
}

/// A 2-vCPU VM: receiver on vCPU `app`, VF interrupt on vCPU `irq`.
fn two_vcpus(scheme: &str, app: u32, irq: u32, burn: bool, extra: &str) -> String {
    format!(
        "name = \"t\"\nscheme = \"{scheme}\"\nseed = 2\nduration_s = 0.1\nwarmup_s = 0.01\n\
         {extra}\n[machine]\ncores = 3\n[[vm]]\nvcpus = 2\ncores = [1, 2]\napp_vcpu = {app}\n\
         irq_affinity = [{irq}]\nburn = {burn}\n[vm.workload.udp]\nrate_pps = 20000\n"
    )
}

#[test]
fn a_wake_up_on_another_vcpu_is_a_reschedule_ipi_and_a_local_one_is_not() {
    for scheme in ["kvm", "apicv", "kvm-2026", "eli", "did"] {
        let split = run_text(&two_vcpus(scheme, 0, 1, true, ""), &[]);
        let local = run_text(&two_vcpus(scheme, 0, 0, true, ""), &[]);
        assert_eq!(
            split.violations(),
            0,
            "{scheme}: {:?}",
            split.invariants.violations.first()
        );
        assert_eq!(local.violations(), 0, "{scheme}");
        let ipis = metric(&split, "guest.ipis_sent_per_s");
        let rx = metric(&split, "udp.received") / 0.1;
        // The receiver blocks between datagrams: about one IPI each.
        assert!(
            ipis > 0.5 * rx,
            "{scheme}: {ipis} IPIs/s for {rx} datagrams/s"
        );
        assert_eq!(metric(&split, "guest.resched_irqs_per_s"), ipis, "{scheme}");
        assert_eq!(metric(&local, "guest.ipis_sent_per_s"), 0.0, "{scheme}");
        assert!(metric(&split, "udp.received") > 1900.0, "{scheme}");
    }
}

#[test]
fn icr_writes_exit_unless_ipi_virtualization_is_on() {
    let msr = |r: &exitless::report::RunReport| rate(r, "MSR_WRITE");
    let kvm = run_text(&two_vcpus("kvm", 0, 1, true, ""), &[]);
    let ipiv = run_text(&two_vcpus("kvm-2026", 0, 1, true, ""), &[]);
    let no_ipiv = run_text(
        &two_vcpus("kvm-2026", 0, 1, true, "[hv]\nipiv = false"),
        &[],
    );
    let did = run_text(&two_vcpus("did", 0, 1, true, ""), &[]);
    let ipis = metric(&ipiv, "guest.ipis_sent_per_s");
    assert!(ipis > 10_000.0, "{ipis}");
    // IPIv: the ICR write is posted by the processor; without it every
    // IPI is an MSR_WRITE exit on top of the timer writes.
    assert!(
        msr(&no_ipiv) - msr(&ipiv) > 0.95 * ipis,
        "{} vs {}",
        msr(&no_ipiv),
        msr(&ipiv)
    );
    assert!(msr(&ipiv) < 0.2 * ipis);
    // DID traps ICR writes too (did.md open point 9), but nothing else.
    assert!(
        (msr(&did) - ipis).abs() < 0.05 * ipis,
        "{} vs {ipis}",
        msr(&did)
    );
    // KVM: the ICR exit, then the target's kick (EXTERNAL_INTERRUPT) and
    // the trapped EOI of the injected reschedule vector.
    assert!(msr(&kvm) > 2.0 * ipis);
    assert!(rate(&kvm, "EXTERNAL_INTERRUPT") > ipis);
    // The sender's exits are gone: more of its time is the guest's. (The
    // target's wake-up is as quick either way: KVM posts the vector at the
    // start of the exit, the processor at the write.)
    let (with, without) = (ipiv.vms[0].eht_pct, no_ipiv.vms[0].eht_pct);
    assert!(
        without > 2.0 * with,
        "exit handling {without}% without IPIv, {with}% with"
    );
}

#[test]
fn a_polling_idle_sibling_is_woken_without_an_ipi_and_a_halted_one_with_one() {
    // No burner: vCPU 0 idles while the receiver is blocked.
    let poll = run_text(&two_vcpus("kvm", 0, 1, false, ""), &[]);
    assert_eq!(metric(&poll, "guest.ipis_sent_per_s"), 0.0);
    assert!(metric(&poll, "udp.received") > 1900.0);
    let halt = run_text(&two_vcpus("kvm", 0, 1, false, ""), &["guest.idle=halt"]);
    assert!(metric(&halt, "guest.ipis_sent_per_s") > 10_000.0);
    assert!(metric(&halt, "udp.received") > 1900.0);
    assert_eq!(
        halt.violations(),
        0,
        "{:?}",
        halt.invariants.violations.first()
    );
    assert!(rate(&halt, "HLT") > 10_000.0);
}

#[test]
fn lowest_priority_msis_spread_over_the_affinity_set_under_software_delivery() {
    let text = |mode: &str, set: &str| {
        format!(
            "name = \"t\"\nscheme = \"kvm\"\nseed = 2\nduration_s = 0.1\nwarmup_s = 0.01\n\
             [machine]\ncores = 3\n[[vm]]\nvcpus = 2\ncores = [1, 2]\nirq_affinity = [{set}]\n\
             msi_mode = \"{mode}\"\nburn = true\n[vm.workload.udp]\nrate_pps = 20000\n"
        )
    };
    // Fixed to vCPU 0, where the receiver runs: no IPIs. Lowest priority
    // over both: KVM's arbitration alternates, so about half the
    // interrupts land on vCPU 1 and wake the receiver with an IPI.
    let fixed = run_text(&text("fixed", "0"), &[]);
    let lowest = run_text(&text("lowest-priority", "0, 1"), &[]);
    assert_eq!(metric(&fixed, "guest.ipis_sent_per_s"), 0.0);
    let irqs = metric(&lowest, "nic.interrupts_per_s");
    let ipis = metric(&lowest, "guest.ipis_sent_per_s");
    assert!(
        ipis > 0.3 * irqs && ipis < 0.7 * irqs,
        "{ipis} IPIs/s, {irqs} interrupts/s"
    );
    assert_eq!(lowest.violations(), 0);
}

#[test]
fn four_vms_of_four_vcpus_on_four_cores_stay_correct_under_every_scheme() {
    for scheme in ["kvm", "apicv", "kvm-2026", "eli", "elvis", "did"] {
        for seed in 1..=3 {
            let seed = format!("seed={seed}");
            let r = run_smp(
                "four-by-four.toml",
                &[&format!("scheme={scheme}"), &seed, "duration_s=0.1"],
            );
            assert_eq!(
                r.violations(),
                0,
                "{scheme} {seed}: {:?}",
                r.invariants.violations.first()
            );
            // Four vCPU threads per core: each waits about 3/4 of the time.
            let wait = metric(&r, "host.vcpu_runqueue_wait_pct");
            assert!((65.0..85.0).contains(&wait), "{scheme}: {wait}");
            // Every VM got its datagrams, late (its receiver's vCPU waits).
            for vm in 0..4 {
                let p = vm_prefix(vm);
                assert!(
                    metric(&r, &format!("{p}udp.received")) > 1000.0,
                    "{scheme} vm{vm}"
                );
            }
            assert!(metric(&r, "irq.descheduled") > 0.0);
        }
    }
}

/// `perf kvm stat --vcpu`: each vCPU of an SMP guest has its own exit
/// table; they add up to the VM's, and the vCPUs differ (vCPU 0 takes the
/// VF's interrupts in four-by-four).
#[test]
fn per_vcpu_exit_tables_add_up_to_the_vms() {
    let r = run_smp("four-by-four.toml", &["scheme=kvm", "duration_s=0.05"]);
    for vm in &r.vms {
        assert_eq!(vm.per_vcpu.len(), vm.vcpus);
        let samples: u64 = vm.per_vcpu.iter().map(|v| v.total_samples).sum();
        assert_eq!(samples, vm.total_samples, "vm{}", vm.vm);
        for row in &vm.exits {
            let by_vcpu: u64 = vm
                .per_vcpu
                .iter()
                .flat_map(|v| v.exits.iter().filter(|x| x.reason == row.reason))
                .map(|x| x.samples)
                .sum();
            assert_eq!(by_vcpu, row.samples, "vm{} {}", vm.vm, row.reason);
        }
        let tig: f64 = vm.per_vcpu.iter().map(|v| v.tig_pct).sum::<f64>() / vm.vcpus as f64;
        assert!((tig - vm.tig_pct).abs() < 1e-6, "{tig} vs {}", vm.tig_pct);
        let counts: Vec<u64> = vm.per_vcpu.iter().map(|v| v.total_samples).collect();
        assert!(counts.iter().any(|&c| c != counts[0]), "{counts:?}");
    }
    let text = r.to_text_for(Some(3));
    assert!(text.contains("Analyze events for VM 0 vCPU 3:"), "{text}");
    assert!(r
        .to_text_for(Some(4))
        .contains("VM 0 has 4 vCPU(s): no vCPU 4"));
}

#[test]
fn the_checker_catches_the_naive_scheme_on_smp_guests() {
    let r = run_smp("four-by-four.toml", &["scheme=naive", "duration_s=0.1"]);
    assert!(r.violations() > 0);
}

#[test]
fn smp_scenario_errors_name_the_key() {
    let bad = |extra: &str| {
        let t = format!(
            "name = \"t\"\nscheme = \"kvm\"\nduration_s = 0.1\n[machine]\ncores = 3\n[[vm]]\nvcpus = 2\n{extra}\n\
             [vm.workload.udp]\nrate_pps = 1000\n"
        );
        exitless::scenario::Scenario::parse(&t, &[])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert!(bad("cores = [1]").contains("vm[0].cores"));
    assert!(bad("cores = [1, 3]").contains("vm[0].cores"));
    assert!(bad("cores = [1, 2]\napp_vcpu = 2").contains("vm[0].app_vcpu"));
    assert!(bad("cores = [1, 2]\nirq_affinity = [0, 1]").contains("lowest-priority"));
    assert!(bad("cores = [1, 2]\nirq_affinity = [5]").contains("vm[0].irq_affinity"));
    assert!(bad("core = 1\ncores = [1, 2]").contains("not both"));
    assert!(bad("").contains("vm[0].core"));
    assert!(bad("cores = [1, 2]").is_empty(), "a valid one parses");
}

/// One random VM of a random SMP layout.
#[derive(Debug, Clone)]
struct VmDraw {
    vcpus: usize,
    first_core: usize,
    app: usize,
    affinity: Vec<bool>,
    lowest: bool,
    burn: bool,
    cyclictest: bool,
}

fn vm_draw() -> impl Strategy<Value = VmDraw> {
    (
        1usize..=4,
        1usize..=4,
        0usize..4,
        proptest::collection::vec(any::<bool>(), 4),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(vcpus, first_core, app, affinity, lowest, burn, cyclictest)| VmDraw {
                vcpus,
                first_core,
                app: app % vcpus,
                affinity,
                lowest,
                burn,
                cyclictest,
            },
        )
}

fn layout_text(scheme: &str, seed: u64, halt: bool, vms: &[VmDraw]) -> String {
    let idle = if halt { "halt" } else { "poll" };
    let mut t = format!(
        "name = \"smp-prop\"\nscheme = \"{scheme}\"\nseed = {seed}\nduration_s = 0.02\nwarmup_s = 0.002\n\
         [guest]\nidle = \"{idle}\"\n[machine]\ncores = 6\n"
    );
    for v in vms {
        // Siblings on consecutive cores of 1..=4, wrapping: never two on
        // one core (at most 4 vCPUs); VMs overlap freely.
        let cores: Vec<String> = (0..v.vcpus)
            .map(|i| (1 + (v.first_core - 1 + i) % 4).to_string())
            .collect();
        // Lowest priority: the drawn set; fixed: its first vCPU. An empty
        // draw means the receiver's vCPU.
        let mut set: Vec<String> = (0..v.vcpus)
            .filter(|&i| v.affinity[i])
            .map(|i| i.to_string())
            .collect();
        if set.is_empty() {
            set.push(v.app.to_string());
        }
        if !v.lowest {
            set.truncate(1);
        }
        let mode = if v.lowest { "lowest-priority" } else { "fixed" };
        t += &format!(
            "[[vm]]\nvcpus = {}\ncores = [{}]\napp_vcpu = {}\nirq_affinity = [{}]\nmsi_mode = \"{mode}\"\nburn = {}\n\
             [vm.workload.udp]\nrate_pps = 20000\n",
            v.vcpus,
            cores.join(", "),
            v.app,
            set.join(", "),
            v.burn
        );
        if v.cyclictest {
            t += "[vm.workload.cyclictest]\ninterval_us = 200\n";
        }
    }
    t
}

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("SMP_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(8),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random SMP layouts (1-3 VMs of 1-4 vCPUs on 4 shared cores, any
    /// IRQ affinity, fixed or lowest-priority, burners or not, halting or
    /// polling idle): every scheme delivers every interrupt to its owner.
    #[test]
    fn every_scheme_is_correct_on_random_smp_layouts(
        seed in 1u64..10_000,
        halt in any::<bool>(),
        vms in proptest::collection::vec(vm_draw(), 1..=3),
    ) {
        for scheme in ["kvm", "apicv", "kvm-2026", "eli", "elvis", "did"] {
            let text = layout_text(scheme, seed, halt, &vms);
            let r = run_text(&text, &[]);
            prop_assert_eq!(r.violations(), 0, "{}\n{}\n{:?}", scheme, text, r.invariants.violations.first());
        }
    }
}

/// The same four VMs with floating vCPUs (every vCPU may use cores 1-4):
/// with the burners on (heavy multiplexing, balancing) and off with
/// halting guests (vCPUs placed at every wake-up), every scheme stays
/// correct and every VM gets its datagrams.
#[test]
fn four_vms_with_floating_vcpus_stay_correct_under_every_scheme() {
    let floating: Vec<String> = (0..4)
        .map(|k| format!("vm.{k}.allowed_cores=\"any\""))
        .collect();
    let idle: Vec<String> = (0..4)
        .map(|k| format!("vm.{k}.burn=false"))
        .chain(["guest.idle=\"halt\"".to_string()])
        .collect();
    for scheme in ["kvm", "apicv", "kvm-2026", "eli", "elvis", "did"] {
        for (seed, halting) in [(1, false), (2, false), (1, true), (2, true)] {
            let mut sets = vec![
                format!("scheme={scheme}"),
                format!("seed={seed}"),
                "duration_s=0.1".to_string(),
            ];
            sets.extend(floating.iter().cloned());
            if halting {
                sets.extend(idle.iter().cloned());
            }
            let sets: Vec<&str> = sets.iter().map(|s| s.as_str()).collect();
            let r = run_smp("four-by-four.toml", &sets);
            let what = format!("{scheme} seed {seed} halting {halting}");
            assert_eq!(
                r.violations(),
                0,
                "{what}: {:?}",
                r.invariants.violations.first()
            );
            for vm in 0..4 {
                let p = vm_prefix(vm);
                assert!(
                    metric(&r, &format!("{p}udp.received")) > 1000.0,
                    "{what}: vm{vm}"
                );
            }
        }
    }
}
