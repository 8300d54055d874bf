//! ARM (arch = "arm64"): the scenario key, and each ARM scheme's exits per
//! guest event (did-arm.md §3) as the mechanisms produce them, with the
//! invariant checker clean.

use crate::common;
use common::*;
use exitless::scenario::Scenario;

const HRTIMER: &str = "arch = \"arm64\"\nseed = 1\nduration_s = 0.2\nwarmup_s = 0.02\n\
    [guest]\nhz = 1000\ntick = \"periodic\"\nidle = \"halt\"\n\
    [workload.hrtimer_latency]\ninterval_us = 200\n";

const IPI: &str = "arch = \"arm64\"\nseed = 1\nduration_s = 0.2\nwarmup_s = 0.02\n\
    [machine]\ncores = 4\n[guest]\nhz = 1000\ntick = \"periodic\"\nidle = \"poll\"\n\
    [[vm]]\nvcpus = 2\ncore = 1\n[vm.workload.ipi_latency]\ninterval_us = 200\n";

const UDP: &str = "arch = \"arm64\"\nseed = 1\nduration_s = 0.2\nwarmup_s = 0.02\n\
    [guest]\nhz = 1000\ntick = \"periodic\"\nidle = \"poll\"\n\
    [workload.udp]\nrate_pps = 20000\n";

fn xpe(r: &exitless::report::RunReport, event: &str) -> f64 {
    metric(r, &format!("exits_per_event.{event}"))
}

#[test]
fn the_arch_key_refuses_schemes_of_the_other_architecture() {
    let e = Scenario::parse("scheme = \"kvm-arm\"\nduration_s = 0.1\n", &[])
        .expect_err("an ARM scheme on x86");
    assert!(e.to_string().contains("`arch`"), "{e}");
    assert!(e.to_string().contains("arm64"), "{e}");
    let e = Scenario::parse(
        "arch = \"arm64\"\nscheme = \"did\"\nduration_s = 0.1\n",
        &[],
    )
    .expect_err("an x86 scheme on ARM");
    assert!(e.to_string().contains("`arch`"), "{e}");
    assert!(e.to_string().contains("kvm-arm"), "{e}");
    let e = Scenario::parse(
        "arch = \"arm64\"\nscheme = \"kvm-arm\"\nduration_s = 0.1\n[arm]\nlist_registers = 1\n",
        &[],
    )
    .expect_err("no list registers");
    assert!(e.to_string().contains("arm.list_registers"), "{e}");
}

#[test]
fn kvm_arm_timer_programming_and_eoi_never_exit_but_wfi_does() {
    let r = run_text(HRTIMER, &["scheme=kvm-arm"]);
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
    assert!(metric(&r, "hrtimer.samples") > 800.0);
    assert_eq!(xpe(&r, "timer_program"), 0.0);
    assert_eq!(xpe(&r, "eoi"), 0.0);
    assert_eq!(xpe(&r, "idle"), 1.0);
}

#[test]
fn kvm_arm_exits_once_per_timer_expiry_and_device_interrupt_of_a_running_guest() {
    let r = run_text(UDP, &["scheme=kvm-arm"]);
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
    assert!(metric(&r, "guest.rx_packets") > 3000.0);
    assert_eq!(xpe(&r, "device"), 1.0);
    // One expiry straddles the end of the warm-up.
    assert!((xpe(&r, "timer_expiry") - 1.0).abs() < 0.02);
    assert_eq!(xpe(&r, "eoi"), 0.0);
}

#[test]
fn kvm_arm_v4_takes_the_vfs_msis_as_vlpis_without_exits() {
    let r = run_text(UDP, &["scheme=kvm-arm-v4"]);
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
    assert!(metric(&r, "guest.rx_packets") > 3000.0);
    assert_eq!(xpe(&r, "device"), 0.0);
    assert!((xpe(&r, "timer_expiry") - 1.0).abs() < 0.02);
}

#[test]
fn kvm_arm_v4_doorbell_wakes_a_vcpu_blocked_in_wfi() {
    let r = run_text(UDP, &["scheme=kvm-arm-v4", "guest.idle=halt"]);
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
    assert!(metric(&r, "guest.rx_packets") > 3000.0);
    assert!(metric(&r, "arm.exits.WFx") > 100.0);
}

#[test]
fn kvm_arm_ipis_trap_at_the_sender_and_kick_a_running_receiver() {
    let r = run_text(IPI, &["scheme=kvm-arm"]);
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
    assert!(metric(&r, "ipi.samples") > 500.0);
    // Sender SYS64 trap, then the kick SGI makes the running target exit.
    assert_eq!(xpe(&r, "vcpu_ipi"), 2.0);
}

#[test]
fn did_arm_runs_timer_ipi_device_and_idle_without_exits() {
    for (text, what) in [(HRTIMER, "hrtimer"), (IPI, "ipi"), (UDP, "udp")] {
        let r = run_text(text, &["scheme=did-arm"]);
        assert_eq!(r.violations(), 0, "{what}: {:?}", r.invariants.violations);
        assert_eq!(metric(&r, "arm.exits_per_s"), 0.0, "{what}");
    }
    let r = run_text(IPI, &["scheme=did-arm"]);
    assert!(metric(&r, "ipi.samples") > 500.0);
    let r = run_text(UDP, &["scheme=did-arm"]);
    assert!(metric(&r, "guest.rx_packets") > 3000.0);
}

#[test]
fn split_mode_pays_four_world_switches_per_exit() {
    let vhe = run_text(UDP, &["scheme=kvm-arm"]);
    let split = run_text(UDP, &["scheme=kvm-arm", "arm.hyp_mode=split"]);
    let (a, b) = (
        metric(&vhe, "arm.exit_us.IRQ"),
        metric(&split, "arm.exit_us.IRQ"),
    );
    // 2 more switches of 153 ns each.
    assert!((b - a - 0.306).abs() < 0.005, "vhe {a} split {b}");
}

#[test]
fn same_arm_scenario_and_seed_give_byte_identical_reports() {
    for s in ["kvm-arm", "kvm-arm-v4", "did-arm"] {
        let set = format!("scheme={s}");
        let a = serde_json::to_string(&run_text(UDP, &[&set])).unwrap();
        let b = serde_json::to_string(&run_text(UDP, &[&set])).unwrap();
        assert_eq!(a, b, "{s}");
    }
}

#[test]
fn arm_refuses_what_it_does_not_model_naming_the_key() {
    let build = |text: &str| {
        let s = Scenario::parse(text, &[]).expect("parses");
        exitless::world::World::build(&s, &exitless::calibration::Calibration::default_host())
            .err()
            .map(|e| e.to_string())
    };
    // KVM/ARM shares cores under the host scheduler.
    let burner = format!("scheme = \"kvm-arm\"\n{HRTIMER}[[host.burners]]\ncores = [1]\n");
    assert_eq!(build(&burner), None);
    // did-arm's vCPUs own their cores: host threads may share them, but
    // another vCPU or a move is refused, naming the key.
    assert_eq!(build(&burner.replace("kvm-arm", "did-arm")), None);
    let preempted =
        format!("scheme = \"did-arm\"\n{HRTIMER}[[preemptions]]\nat_ms = 1.0\nfor_ms = 0.1\n");
    assert_eq!(build(&preempted), None);
    let e = build(
        "arch = \"arm64\"\nscheme = \"did-arm\"\nduration_s = 0.1\n[machine]\ncores = 3\n\
         [[vm]]\ncore = 1\nallowed_cores = [1, 2]\n",
    )
    .expect("refused");
    assert!(
        e.contains("`vm.allowed_cores`") && e.contains("did-arm"),
        "{e}"
    );
    let e = build(
        "arch = \"arm64\"\nscheme = \"did-arm\"\nduration_s = 0.1\n[machine]\ncores = 3\n\
         [[vm]]\ncore = 1\ncopies = 2\ncopies_cores = [1, 1]\n",
    )
    .expect("refused");
    assert!(e.contains("`vm.core`"), "{e}");
    // virtio-net runs on ARM with vhost-net only.
    let e = build(&format!(
        "scheme = \"kvm-arm\"\n{HRTIMER}[net]\ndevice = \"virtio\"\nbackend = \"kvmtool-tap\"\n"
    ))
    .expect("refused");
    assert!(e.contains("`net.backend`"), "{e}");
}

#[test]
fn reproduce_did_arm_tables_the_exits_per_event_of_each_scheme() {
    let out = exitless(&["-q", "reproduce", "did-arm"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("did-arm.events\nmetric"), "{text}");
    assert!(
        text.contains("max invariant violations in any run: 0"),
        "{text}"
    );
    let out = exitless(&["-q", "reproduce", "did-arm", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let rows = json["rows"].as_array().expect("json rows").clone();
    let cell = |exp: &str, config: &str, metric: &str| {
        rows.iter()
            .find(|r| r["experiment"] == exp && r["config"] == config && r["metric"] == metric)
            .and_then(|r| r["model"].as_f64())
            .unwrap_or_else(|| panic!("{exp} {config} {metric}"))
    };
    for m in [
        "timer_program",
        "timer_expiry",
        "eoi",
        "device",
        "vcpu_ipi",
        "host_ipi",
    ] {
        let m = format!("exits_per_event.{m}");
        assert_eq!(cell("did-arm.events", "did-arm", &m), 0.0, "{m}");
    }
    assert_eq!(
        cell("did-arm.events", "x86-kvm", "exits_per_event.eoi"),
        1.0
    );
    assert_eq!(
        cell("did-arm.events", "kvm-arm", "exits_per_event.eoi"),
        0.0
    );
    assert_eq!(cell("did-arm.idle", "did-arm", "exits_per_event.idle"), 0.0);
    // Four VMs (issue 20 item 3): each on its own core, did-arm's direct
    // timer and untrapped WFI leave no exits and the shortest timer
    // latency; stacked two per core, KVM/ARM's vCPUs go through the host
    // scheduler.
    let four = |config: &str, metric: &str| cell("did-arm.four-vms", config, metric);
    assert_eq!(four("did-arm", "all.arm.exits_per_s"), 0.0);
    for kvm in ["kvm-arm", "kvm-arm-v4"] {
        assert!(four(kvm, "all.arm.exits_per_s") > 10_000.0, "{kvm}");
        assert!(
            four("did-arm", "all.hrtimer.latency_p99_us") < four(kvm, "all.hrtimer.latency_p99_us"),
            "{kvm}"
        );
        assert!(cell("did-arm.four-vms-shared", kvm, "host.vcpu_halts_per_s") > 1000.0);
    }
    // Split mode's two extra world switches lengthen the wake-up path.
    assert!(
        cell("did-arm.idle", "kvm-arm-split", "hrtimer.latency_p50_us")
            > cell("did-arm.idle", "kvm-arm", "hrtimer.latency_p50_us")
    );
    // GICv4.1 vSGIs: the sender still traps, the receiver no longer exits,
    // and a host's virtual SGI needs no exit either.
    let ev = |config: &str, metric: &str| cell("did-arm.events", config, metric);
    assert_eq!(ev("kvm-arm-v4", "exits_per_event.vcpu_ipi"), 2.0);
    assert_eq!(ev("kvm-arm-v4.1", "exits_per_event.vcpu_ipi"), 1.0);
    assert_eq!(ev("kvm-arm-v4.1", "exits_per_event.host_ipi"), 0.0);
    assert!(ev("kvm-arm-v4.1", "ipi.latency_p50_us") < ev("kvm-arm-v4", "ipi.latency_p50_us"));
    // ping (§4, paper withheld): KVM/ARM wakes the vCPU blocked in WFI
    // for each echo request; did-arm's guest waits in WFI itself.
    let ping = |config: &str| cell("did-arm.ping", config, "ping.rtt_mean_us");
    assert!(ping("did-arm") + 2.0 < ping("kvm-arm"));
    assert_eq!(
        cell("did-arm.ping", "did-arm", "ping.received"),
        cell("did-arm.ping", "kvm-arm", "ping.received")
    );
}

#[test]
fn kvm_arm_v4_on_a_gicv41_sends_sgis_as_vsgis_and_only_the_sender_traps() {
    let v40 = run_text(IPI, &["scheme=kvm-arm-v4"]);
    let v41 = run_text(IPI, &["scheme=kvm-arm-v4", "arm.gic=v4.1"]);
    for r in [&v40, &v41] {
        assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
        assert!(metric(r, "ipi.samples") > 500.0);
    }
    assert_eq!(xpe(&v40, "vcpu_ipi"), 2.0);
    // The ICC_SGI1R_EL1 write still traps (SYS64): one exit per IPI; the
    // vSGI reaches the running receiver's vPE with none.
    assert_eq!(xpe(&v41, "vcpu_ipi"), 1.0);
    assert_eq!(metric(&v41, "arm.exits.SYS64"), metric(&v41, "ipi.samples"));
    // A receiver blocked in WFI: the GICv4.1 doorbell wakes it.
    let halt = run_text(
        IPI,
        &["scheme=kvm-arm-v4", "arm.gic=v4.1", "guest.idle=halt"],
    );
    assert_eq!(halt.violations(), 0, "{:?}", halt.invariants.violations);
    assert!(metric(&halt, "ipi.samples") > 500.0);
    assert!(metric(&halt, "arm.exits.WFx") > 500.0);
}

#[test]
fn the_run_exit_table_lists_arm64_exception_classes() {
    let r = run_text(IPI, &["scheme=kvm-arm"]);
    let vm = &r.vms[0];
    let reasons: Vec<&str> = vm.exits.iter().map(|e| e.reason).collect();
    // The guest's IPIs trap (SYS64) and their kicks and timer ticks are
    // IRQ exits; no x86 reason appears.
    assert!(
        reasons.contains(&"SYS64") && reasons.contains(&"IRQ"),
        "{reasons:?}"
    );
    assert!(reasons
        .iter()
        .all(|r| ["IRQ", "FIQ", "WFx", "SYS64"].contains(r)));
    let sys64 = vm.exits.iter().find(|e| e.reason == "SYS64").unwrap();
    assert_eq!(sys64.samples as f64, metric(&r, "ipi.samples"));
    assert_eq!(
        vm.total_samples,
        vm.exits.iter().map(|e| e.samples).sum::<u64>()
    );
    assert!((vm.exits_per_s - metric(&r, "arm.exits_per_s")).abs() / vm.exits_per_s < 0.01);
    assert!(vm.eht_pct > 0.0 && vm.tig_pct > 90.0);
    // Per vCPU (perf kvm stat --vcpu): the sender's SYS64 traps are vCPU 0's.
    assert_eq!(vm.per_vcpu.len(), 2);
    let per: u64 = vm.per_vcpu.iter().map(|v| v.total_samples).sum();
    assert_eq!(per, vm.total_samples);
    let text = r.to_text();
    assert!(text.contains("SYS64"), "{text}");
    // did-arm's table is empty: nothing exits.
    let d = run_text(IPI, &["scheme=did-arm"]);
    assert_eq!(d.vms[0].total_samples, 0);
}

#[test]
fn a_gic_older_than_the_scheme_needs_is_refused_naming_arm_gic() {
    let s =
        Scenario::parse(IPI, &["scheme=kvm-arm-v4".into(), "arm.gic=v3".into()]).expect("parses");
    let cal = exitless::calibration::Calibration::default_host();
    let e = exitless::world::World::build(&s, &cal)
        .err()
        .expect("a GICv3 has no vPEs");
    assert!(e.to_string().contains("arm.gic"), "{e}");
    assert!(e.to_string().contains("GICv4"), "{e}");
    let e = Scenario::parse(IPI, &["arm.gic=v5".into()]).expect_err("no such GIC");
    assert!(e.to_string().contains("arm.gic"), "{e}");
    // kvm-arm and did-arm run on a newer GIC, using what they use.
    for scheme in ["scheme=kvm-arm", "scheme=did-arm"] {
        let r = run_text(IPI, &[scheme, "arm.gic=v4.1"]);
        assert_eq!(r.violations(), 0, "{scheme}");
    }
}

/// A design under study that breaks a rule, built on kvm-arm(-v4): it
/// forgets the GICv4 doorbell (never kicks the vCPU it belongs to), or it
/// blocks a vCPU at every IRQ exit as if it had nothing to do.
struct Broken {
    inner: exitless::hv::arm::kvm_arm::KvmArm,
    ignore_doorbell: bool,
    halt_on_irq: bool,
    /// A preempted (not blocking) vCPU leaves its core without
    /// kvm_arch_vcpu_put: vPE resident, virtual timer armed.
    skip_preempt_put: bool,
    /// The wired NIC's SPI is injected with HW = 0 but left active as a
    /// forwarded interrupt: nothing ever deactivates the physical SPI.
    spi_without_hw: bool,
}

mod broken {
    use super::Broken;
    use exitless::engine::Time;
    use exitless::hv::arm::intids::{nic_spi, DOORBELL_LPI_BASE};
    use exitless::hv::arm::{ArmCx, ArmExit, ArmScheme, ExitAction};
    use exitless::hw::arm::el2::El2Controls;
    use exitless::hw::arm::params::GicParams;

    impl ArmScheme for Broken {
        fn name(&self) -> &'static str {
            "broken"
        }
        fn gic(&self, cores: usize, vcpus: usize) -> GicParams {
            self.inner.gic(cores, vcpus)
        }
        fn el2(&self) -> El2Controls {
            self.inner.el2()
        }
        fn setup_vm(&mut self, cx: &mut ArmCx, vm: usize) {
            self.inner.setup_vm(cx, vm)
        }
        fn vcpu_load(&mut self, cx: &mut ArmCx, vcpu: usize) {
            self.inner.vcpu_load(cx, vcpu)
        }
        fn vcpu_put(&mut self, cx: &mut ArmCx, vcpu: usize, blocking: bool) {
            if self.skip_preempt_put && !blocking {
                cx.hv.vcpus[vcpu].loaded = false;
                return;
            }
            self.inner.vcpu_put(cx, vcpu, blocking)
        }
        fn handle_exit(&mut self, cx: &mut ArmCx, vcpu: usize, exit: ArmExit) -> ExitAction {
            let a = self.inner.handle_exit(cx, vcpu, exit);
            if self.halt_on_irq && exit == ArmExit::Irq {
                return ExitAction::Halt;
            }
            a
        }
        fn host_irq(&mut self, cx: &mut ArmCx, core: usize, intid: u32) -> bool {
            if self.ignore_doorbell && intid >= DOORBELL_LPI_BASE {
                return false;
            }
            let forwarded = self.inner.host_irq(cx, core, intid);
            if self.spi_without_hw && intid == nic_spi(0) {
                for v in cx.vcpus.iter_mut() {
                    for a in v.ap_list.iter_mut().filter(|a| a.vintid == intid) {
                        a.hw = None;
                    }
                }
            }
            forwarded
        }
        fn flush(&mut self, cx: &mut ArmCx, vcpu: usize) {
            self.inner.flush(cx, vcpu)
        }
        fn has_pending(&self, cx: &ArmCx, vcpu: usize) -> bool {
            // Blocking on an IRQ exit believes the vCPU has nothing to do.
            !self.halt_on_irq && self.inner.has_pending(cx, vcpu)
        }
        fn halt_poll(&self, cx: &ArmCx, vcpu: usize) -> Time {
            self.inner.halt_poll(cx, vcpu)
        }
        fn halt_ended(&mut self, cx: &mut ArmCx, vcpu: usize, block: Time) {
            self.inner.halt_ended(cx, vcpu, block)
        }
        fn irqfd(&mut self, cx: &mut ArmCx, vcpu: usize, intid: u32) {
            self.inner.irqfd(cx, vcpu, intid)
        }
        fn host_vipi(&mut self, cx: &mut ArmCx, vcpu: usize, vintid: u32) {
            self.inner.host_vipi(cx, vcpu, vintid)
        }
        fn bg_timer(&mut self, cx: &mut ArmCx, vcpu: usize) {
            self.inner.bg_timer(cx, vcpu)
        }
    }
}

fn run_broken(text: &str, sets: &[&str], b: Broken) -> exitless::report::RunReport {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    let s = Scenario::parse(text, &sets).expect("parses");
    let cal = exitless::calibration::Calibration::default_host();
    let mut w = exitless::world::World::build_arm_with(&s, &cal, Box::new(b)).expect("builds");
    w.run(|_| {});
    w.report()
}

/// `text` under kvm-arm-v4 as shipped (which must run clean) and then
/// under a kvm-arm-v4 that ignores its doorbells: the second run's report.
fn run_ignoring_doorbells(text: &str, sets: &[&str]) -> exitless::report::RunReport {
    use exitless::hw::arm::el2::HypMode;
    let good = run_text(text, sets);
    assert_eq!(good.violations(), 0, "{:?}", good.invariants.violations);
    let b = Broken {
        inner: exitless::hv::arm::kvm_arm_v4::kvm_arm_v4(HypMode::Vhe),
        ignore_doorbell: true,
        halt_on_irq: false,
        skip_preempt_put: false,
        spi_without_hw: false,
    };
    run_broken(text, sets, b)
}

#[test]
fn the_checker_catches_a_doorbell_that_never_wakes_its_vcpu() {
    use exitless::check::ViolationKind;
    let sets = ["scheme=kvm-arm-v4", "guest.idle=halt", "guest.tick=off"];
    let r = run_ignoring_doorbells(UDP, &sets);
    assert!(
        r.invariants.counts[&ViolationKind::GicState] > 0,
        "{:?}",
        r.invariants
    );
    assert!(
        r.invariants.counts[&ViolationKind::Lost] > 0,
        "{:?}",
        r.invariants
    );
}

#[test]
fn the_checker_catches_a_vsgi_doorbell_that_never_wakes_its_vcpu() {
    use exitless::check::ViolationKind;
    let sets = [
        "scheme=kvm-arm-v4",
        "arm.gic=v4.1",
        "guest.idle=halt",
        "guest.tick=off",
    ];
    let r = run_ignoring_doorbells(IPI, &sets);
    assert!(
        r.invariants.counts[&ViolationKind::Lost] > 0,
        "{:?}",
        r.invariants
    );
}

#[test]
fn the_checker_catches_a_vcpu_blocked_on_irq_exits_with_work_pending() {
    use exitless::check::ViolationKind;
    use exitless::hw::arm::el2::HypMode;
    let b = Broken {
        inner: exitless::hv::arm::kvm_arm::KvmArm::new(HypMode::Vhe),
        ignore_doorbell: false,
        halt_on_irq: true,
        skip_preempt_put: false,
        spi_without_hw: false,
    };
    let r = run_broken(UDP, &["scheme=kvm-arm", "host.ipi_per_s=50000"], b);
    assert!(
        r.invariants.counts[&ViolationKind::Lost] > 0,
        "{:?}",
        r.invariants
    );
}

#[test]
fn two_list_registers_overflow_into_the_ap_list_and_maintenance_exits() {
    // Timer and both IPIs competing for two LRs: the rest wait in the
    // ap_list with UIE set until the guest's EOIs leave at most one LR
    // valid; nothing is lost.
    let r = run_text(
        IPI,
        &[
            "scheme=kvm-arm",
            "arm.list_registers=2",
            "host.ipi_per_s=20000",
        ],
    );
    assert_eq!(r.violations(), 0, "{:?}", r.invariants.violations);
    assert!(metric(&r, "ipi.samples") > 500.0);
}

#[test]
fn several_smp_vms_on_dedicated_cores() {
    let text = "arch = \"arm64\"\nseed = 3\nduration_s = 0.1\nwarmup_s = 0.02\n\
        [machine]\ncores = 5\n[guest]\nhz = 1000\ntick = \"periodic\"\nidle = \"halt\"\n\
        [[vm]]\nvcpus = 2\ncore = 1\ncopies = 2\ncopies_cores = [1, 2, 3, 4]\n\
        [vm.workload.ipi_latency]\ninterval_us = 200\n[vm.workload.udp]\nrate_pps = 5000\n";
    for s in ["kvm-arm", "kvm-arm-v4", "did-arm"] {
        let r = run_text(text, &[&format!("scheme={s}")]);
        assert_eq!(r.violations(), 0, "{s}: {:?}", r.invariants.violations);
        for p in ["", "vm1."] {
            assert!(metric(&r, &format!("{p}ipi.samples")) > 200.0, "{s} {p}");
            assert!(
                metric(&r, &format!("{p}guest.rx_packets")) > 200.0,
                "{s} {p}"
            );
        }
    }
}

#[test]
fn the_race_explorer_finds_nothing_on_the_arm_schemes() {
    let cal = exitless::calibration::Calibration::default_host();
    for s in ["kvm-arm", "kvm-arm-v4", "did-arm"] {
        let sc = load_scenario("scenarios/explore/arm-smp.toml", &[&format!("scheme={s}")]);
        let x = exitless::explore::explore(&sc, &cal, explore_opts(20), |_, _| {}).unwrap();
        assert_eq!(x.runs, 20);
        assert_eq!(
            x.failing_runs,
            0,
            "{s}: {:?}",
            x.counterexample.map(|c| c.violations)
        );
    }
}

/// Four single-vCPU VMs stacked two per core with a host burner floating
/// over both cores: the host scheduler preempts, blocks, wakes and moves
/// the vCPU threads; every interrupt still reaches its VM.
const SHARED: &str = "arch = \"arm64\"\nseed = 2\nduration_s = 0.1\nwarmup_s = 0.01\n\
    [machine]\ncores = 3\n[guest]\nhz = 1000\ntick = \"periodic\"\nidle = \"halt\"\n\
    [[host.burners]]\ncores = [1, 2]\nnice = 5\n\
    [[vm]]\nvcpus = 1\ncore = 1\ncopies = 4\ncopies_cores = [1, 1, 2, 2]\nallowed_cores = [1, 2]\n\
    [vm.workload.hrtimer_latency]\ninterval_us = 200\n[vm.workload.udp]\nrate_pps = 5000\n";

#[test]
fn kvm_arm_vcpus_share_cores_under_the_host_scheduler() {
    for s in ["kvm-arm", "kvm-arm-v4"] {
        let r = run_text(SHARED, &[&format!("scheme={s}")]);
        assert_eq!(r.violations(), 0, "{s}: {:?}", r.invariants.violations);
        for p in ["", "vm1.", "vm2.", "vm3."] {
            assert!(
                metric(&r, &format!("{p}hrtimer.samples")) > 300.0,
                "{s} {p}"
            );
            assert!(
                metric(&r, &format!("{p}guest.rx_packets")) > 300.0,
                "{s} {p}"
            );
        }
        assert!(metric(&r, "host.vcpu_switches_in_per_s") > 1000.0, "{s}");
    }
    let e = exitless::world::World::build(
        &Scenario::parse(SHARED, &["scheme=did-arm".to_string()]).unwrap(),
        &exitless::calibration::Calibration::default_host(),
    )
    .err()
    .expect("did-arm refuses shared cores");
    assert!(e.to_string().contains("`vm.core`"), "{e}");
}

/// A vCPU preempted with the virtual timer's vINTID 27 still in a list
/// register: kvm_timer_vcpu_load finds the level high again at the
/// schedule-in and must not queue a second copy (the guest would run its
/// timer handler twice: misdelivered 0xef).
#[test]
fn a_preempted_vcpus_timer_is_injected_once() {
    let text = "arch = \"arm64\"\nseed = 1\nduration_s = 0.1\nwarmup_s = 0.005\n\
        [guest]\nhz = 1000\ntick = \"periodic\"\nidle = \"halt\"\n[host]\nipi_per_s = 5000\n\
        [workload.udp]\nrate_pps = 50000\n\
        [[preemptions]]\nat_ms = 10.0\nfor_ms = 0.03\nevery_ms = 0.1\ncount = 800\n";
    for s in ["kvm-arm", "kvm-arm-v4", "did-arm"] {
        let r = run_text(text, &[&format!("scheme={s}")]);
        assert_eq!(r.violations(), 0, "{s}: {:?}", r.invariants.violations);
        assert!(metric(&r, "guest.rx_packets") > 4000.0, "{s}");
    }
}

/// did-arm with a host thread on its vCPU's core: WFI does not trap, so
/// the vCPU never blocks and the burner gets the core only by preemption;
/// the guest's interrupts wait in the redistributor meanwhile (its
/// ICC_IGRPEN1_EL1 cleared) and none is lost, but they wait for the vCPU's
/// next slice: what sharing a dedicated core costs.
#[test]
fn did_arm_holds_its_interrupts_while_a_host_thread_has_its_core() {
    let text =
        "arch = \"arm64\"\nscheme = \"did-arm\"\nseed = 1\nduration_s = 0.2\nwarmup_s = 0.02\n\
        [machine]\ncores = 4\n[guest]\nhz = 1000\ntick = \"periodic\"\nidle = \"halt\"\n\
        [[host.burners]]\ncores = [1]\n[[vm]]\nvcpus = 2\ncore = 1\n\
        [vm.workload.udp]\nrate_pps = 20000\n";
    let shared = run_text(text, &[]);
    assert_eq!(shared.violations(), 0, "{:?}", shared.invariants.violations);
    assert_eq!(metric(&shared, "arm.exits_per_s"), 0.0);
    assert!(metric(&shared, "guest.rx_packets") > 3000.0);
    // The same burner on a core of its own.
    let alone = run_text(&text.replace("cores = [1]", "cores = [3]"), &[]);
    let (a, b) = (
        metric(&alone, "udp.latency_p50_us"),
        metric(&shared, "udp.latency_p50_us"),
    );
    eprintln!("did-arm UDP p50: alone {a} us, sharing with a burner {b} us");
    assert!(b > 10.0 * a, "alone {a} us, sharing with a burner {b} us");
}

#[test]
fn the_checker_catches_a_vpe_and_timer_left_behind_at_schedule_out() {
    use exitless::check::ViolationKind;
    use exitless::hw::arm::el2::HypMode;
    let b = Broken {
        inner: exitless::hv::arm::kvm_arm_v4::kvm_arm_v4(HypMode::Vhe),
        ignore_doorbell: false,
        halt_on_irq: false,
        skip_preempt_put: true,
        spi_without_hw: false,
    };
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("scenarios/explore/arm-shared-cores.toml"),
    )
    .unwrap();
    // Polling idle: the vCPUs never block, so the scheduler preempts them
    // at the ends of their slices, in guest mode.
    let sets = ["scheme=kvm-arm-v4", "duration_s=0.1", "guest.idle=poll"];
    let good = run_text(&text, &sets);
    assert_eq!(good.violations(), 0, "{:?}", good.invariants.violations);
    let r = run_broken(&text, &sets, b);
    assert!(
        r.invariants.counts[&ViolationKind::GicState] > 0,
        "{:?}",
        r.invariants
    );
    let details: Vec<&str> = r
        .invariants
        .violations
        .iter()
        .map(|v| v.detail.as_str())
        .collect();
    assert!(
        details.iter().any(|d| d.contains("still resident")),
        "{details:?}"
    );
}

#[test]
fn the_race_explorer_finds_nothing_under_arm_preemption_and_shared_cores() {
    let cal = exitless::calibration::Calibration::default_host();
    let cases = [
        ("scenarios/explore/arm-preempt.toml", "kvm-arm", ""),
        ("scenarios/explore/arm-preempt.toml", "kvm-arm-v4", ""),
        ("scenarios/explore/arm-preempt.toml", "kvm-arm-v4", "v4.1"),
        ("scenarios/explore/arm-preempt.toml", "did-arm", ""),
        ("scenarios/explore/arm-shared-cores.toml", "kvm-arm", ""),
        ("scenarios/explore/arm-shared-cores.toml", "kvm-arm-v4", ""),
        ("scenarios/explore/arm-vsgi.toml", "kvm-arm-v4", "v4.1"),
    ];
    for (file, s, gic) in cases {
        let scheme = format!("scheme={s}");
        let gic_set = format!("arm.gic={gic}");
        let mut sets = vec![scheme.as_str()];
        if !gic.is_empty() {
            sets.push(&gic_set);
        }
        let sc = load_scenario(file, &sets);
        let x = exitless::explore::explore(&sc, &cal, explore_opts(12), |_, _| {}).unwrap();
        assert_eq!(x.runs, 12);
        assert_eq!(
            x.failing_runs,
            0,
            "{file} {s} {gic}: {:?}",
            x.counterexample.map(|c| c.violations)
        );
    }
}

/// The `cpu.*` split (mpstat's view) follows from where each scheme
/// spends the vCPU's core: kvm-arm traps WFI, so an idle guest's core is
/// host time (the exit, halt polling) then idle; did-arm's untrapped WFI
/// stays guest mode, which the host counts as %guest and the guest as
/// idle. The host's three shares cover the whole core.
#[test]
fn the_cpu_split_is_guest_host_and_idle_as_mpstat_counts_them() {
    let shares = |r: &exitless::report::RunReport| {
        let g = metric(r, "cpu.guest_pct");
        let h = metric(r, "cpu.host_pct");
        let i = metric(r, "cpu.idle_pct");
        let b = metric(r, "cpu.guest_busy_pct");
        assert!((g + h + i - 100.0).abs() < 0.5, "{g} + {h} + {i}");
        assert!(b <= g + 1e-9, "busy {b} > guest {g}");
        (g, h, i, b)
    };
    let kvm = run_text(HRTIMER, &["scheme=kvm-arm"]);
    assert_eq!(kvm.violations(), 0);
    let (g, h, i, b) = shares(&kvm);
    // Trapped WFI: the guest's time in guest mode is only its work.
    assert!((g - b).abs() < 1e-9, "{g} {b}");
    assert!(h > 1.0 && i > 1.0 && g < 10.0, "{g} {h} {i}");
    let did = run_text(HRTIMER, &["scheme=did-arm"]);
    assert_eq!(did.violations(), 0);
    let (g, h, _, b) = shares(&did);
    assert!(g > 99.0 && h < 1.0, "{g} {h}");
    // The guest's own busy share is about the same work as under kvm-arm.
    assert!(
        b < 10.0 && (b - metric(&kvm, "cpu.guest_busy_pct")).abs() < 1.0,
        "{b}"
    );
    // idle = "poll": the idle loop is guest mode too, and guest idle.
    let poll = run_text(UDP, &["scheme=kvm-arm"]);
    let (g, _, _, b) = shares(&poll);
    assert!(g > 90.0 && b < g - 10.0, "{g} {b}");
}

/// A NIC whose interrupt is a wired, level-sensitive SPI (did-arm.md §2.6
/// "today, as an SPI", §4.C Fig. 6), beside the VF's LPI path: every
/// datagram reaches the guest with the checker clean, at the exits each
/// scheme's path has. KVM/ARM: the SPI's IRQ exit, and none for the EOI
/// (the HW = 1 list register deactivates the physical SPI); the same with
/// GICv4 (an SPI is never a vLPI); did-arm: none (the guest takes the SPI
/// on its dedicated core). With the SPI routed to a host core (Linux's
/// default affinity), KVM/ARM's vCPU exits once, on the host's kick.
#[test]
fn a_nic_on_a_wired_spi_runs_under_every_arm_scheme() {
    let spi = ["net.device=spi-nic", "guest.tick=off"];
    for (scheme, route, exits) in [
        ("kvm-arm", "vcpu-core", 1.0),
        ("kvm-arm-v4", "vcpu-core", 1.0),
        ("did-arm", "vcpu-core", 0.0),
        ("kvm-arm", "cpu0", 1.0),
    ] {
        let sets = [
            format!("scheme={scheme}"),
            format!("arm.nic_spi_affinity={route}"),
        ];
        let sets: Vec<&str> = spi
            .iter()
            .copied()
            .chain(sets.iter().map(|s| s.as_str()))
            .collect();
        let r = run_text(UDP, &sets);
        let what = format!("{scheme} {route}");
        assert_eq!(r.violations(), 0, "{what}: {:?}", r.invariants.violations);
        // 20,000/s for 0.2 s, each datagram a frame, all delivered.
        assert_eq!(metric(&r, "udp.received"), 4000.0, "{what}");
        assert_eq!(metric(&r, "guest.rx_packets"), 4000.0, "{what}");
        assert_eq!(xpe(&r, "device"), exits, "{what}");
        assert_eq!(xpe(&r, "eoi"), 0.0, "{what}");
    }
    // The same NIC on the VF's path: the wire is faster (no ITS walk)
    // and did-arm's is faster still (no exit).
    let lat = |sets: &[&str]| metric(&run_text(UDP, sets), "udp.latency_p50_us");
    let kvm = lat(&["scheme=kvm-arm", spi[0], spi[1]]);
    assert!(lat(&["scheme=did-arm", spi[0], spi[1]]) + 0.5 < kvm);
    assert!(kvm < lat(&["scheme=kvm-arm", spi[1]]));
}

#[test]
fn the_wired_nic_is_arm_only_and_its_affinity_is_kvms_setting() {
    let e = Scenario::parse(
        "scheme = \"kvm\"\nduration_s = 0.1\n[net]\ndevice = \"spi-nic\"\n",
        &[],
    )
    .expect_err("x86 has no SPIs");
    assert!(
        e.to_string().contains("net.device") && e.to_string().contains("arm64"),
        "{e}"
    );
    let build = |sets: &[&str]| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let s = Scenario::parse(UDP, &sets).expect("parses");
        exitless::world::World::build(&s, &exitless::calibration::Calibration::default_host())
            .err()
            .map(|e| e.to_string())
    };
    let e = build(&[
        "scheme=did-arm",
        "net.device=spi-nic",
        "arm.nic_spi_affinity=cpu0",
    ])
    .expect("refused");
    assert!(
        e.contains("arm.nic_spi_affinity") && e.contains("did-arm"),
        "{e}"
    );
    let e = build(&["scheme=kvm-arm", "arm.nic_spi_affinity=cpu0"]).expect("refused");
    assert!(
        e.contains("arm.nic_spi_affinity") && e.contains("spi-nic"),
        "{e}"
    );
    assert_eq!(build(&["scheme=did-arm", "net.device=spi-nic"]), None);
}

/// A KVM/ARM that forwards the NIC's SPI (the host leaves it active)
/// but writes its list register with HW = 0: the guest's EOI deactivates
/// the virtual interrupt only, the physical SPI stays active, and the
/// NIC's next interrupts never signal. The checker reports them lost.
#[test]
fn the_checker_catches_a_wired_spi_that_is_never_deactivated() {
    use exitless::check::ViolationKind;
    use exitless::hw::arm::el2::HypMode;
    let b = Broken {
        inner: exitless::hv::arm::kvm_arm::KvmArm::new(HypMode::Vhe),
        ignore_doorbell: false,
        halt_on_irq: false,
        skip_preempt_put: false,
        spi_without_hw: true,
    };
    let r = run_broken(UDP, &["scheme=kvm-arm", "net.device=spi-nic"], b);
    assert!(
        r.invariants.counts[&ViolationKind::Lost] > 0,
        "{:?}",
        r.invariants
    );
    // Only the first interrupt got through.
    assert!(
        metric(&r, "udp.received") < 10.0,
        "{}",
        metric(&r, "udp.received")
    );
}

/// The NIC on a wired SPI under perturbed event orders: scripted
/// preemptions (the HW list register saved with a preempted vCPU,
/// did-arm's Group-1 hold while a host thread has the core) and vCPUs
/// sharing and changing cores under the host scheduler (the SPI then
/// lands on a core whose vCPU is another, or none), with the SPI routed
/// to the vCPU's core or to core 0.
#[test]
fn the_race_explorer_finds_nothing_with_the_nic_on_a_wired_spi() {
    let cal = exitless::calibration::Calibration::default_host();
    let cases = [
        ("scenarios/explore/arm-preempt.toml", "kvm-arm", "vcpu-core"),
        (
            "scenarios/explore/arm-preempt.toml",
            "kvm-arm-v4",
            "vcpu-core",
        ),
        ("scenarios/explore/arm-preempt.toml", "did-arm", "vcpu-core"),
        ("scenarios/explore/arm-preempt.toml", "kvm-arm", "cpu0"),
        (
            "scenarios/explore/arm-shared-cores.toml",
            "kvm-arm",
            "vcpu-core",
        ),
        (
            "scenarios/explore/arm-shared-cores.toml",
            "kvm-arm-v4",
            "cpu0",
        ),
    ];
    for (file, s, route) in cases {
        let scheme = format!("scheme={s}");
        let route_set = format!("arm.nic_spi_affinity={route}");
        let sets = [scheme.as_str(), "net.device=spi-nic", route_set.as_str()];
        let sc = load_scenario(file, &sets);
        let x = exitless::explore::explore(&sc, &cal, explore_opts(12), |_, _| {}).unwrap();
        assert_eq!(x.runs, 12);
        assert_eq!(
            x.failing_runs,
            0,
            "{file} {s} {route}: {:?}",
            x.counterexample.map(|c| c.violations)
        );
    }
}
