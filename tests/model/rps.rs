//! Receive packet steering in SMP guests: the NAPI poll on the vCPU that
//! took the device interrupt queues each packet on the backlog of the vCPU
//! its flow hashes to and, at the end of its NET_RX run, sends that vCPU a
//! CALL_FUNCTION_SINGLE IPI (0xfb) through the x2APIC ICR, whose cost is
//! the scheme's; the protocol processing and the task's wake-up happen
//! there. The checker follows every 0xfb from the ICR write to its handler.

use crate::common;
use common::*;
use exitless::calibration::Calibration;
use exitless::check::ViolationKind;
use exitless::hv::kvm;
use exitless::hv::scheme::Scheme;
use exitless::hv::HvCx;
use exitless::report::RunReport;
use exitless::scenario::Scenario;
use exitless::world::World;

const CALL_FUNCTION: u8 = 0xfb;

/// A 4-vCPU VM: the UDP receiver on vCPU 2, the VF's interrupt on vCPU 0,
/// burners everywhere (a wake-up on another vCPU is an IPI), RPS as
/// `rps` (a TOML line, or nothing).
fn udp_vm(scheme: &str, rps: &str, extra: &str) -> String {
    format!(
        "name = \"t\"\nscheme = \"{scheme}\"\nseed = 2\nduration_s = 0.1\nwarmup_s = 0.01\n\
         {extra}\n[machine]\ncores = 6\n[[vm]]\nvcpus = 4\ncores = [1, 2, 3, 4]\napp_vcpu = 2\n\
         irq_affinity = [0]\nburn = true\n{rps}\n[vm.workload.udp]\nrate_pps = 50000\n"
    )
}

fn per_s(r: &RunReport, name: &str) -> f64 {
    metric(r, name)
}

/// With `rps_cpus = [2]` the receiver's vCPU does the datagrams' protocol
/// processing: the NAPI poll on vCPU 0 steers every one there, the socket
/// enqueue wakes the receiver locally (no reschedule IPI), and vCPU 2 is
/// told by one 0xfb IPI per batch; every IPI sent is taken, and every
/// batch on vCPU 2 was started by one.
#[test]
fn rps_moves_protocol_processing_to_the_steered_vcpu() {
    for scheme in ["kvm", "kvm-2026", "did"] {
        let off = run_text(&udp_vm(scheme, "", ""), &[]);
        let on = run_text(&udp_vm(scheme, "rps_cpus = [2]", ""), &[]);
        for r in [&off, &on] {
            assert_eq!(r.violations(), 0, "{scheme}: {:?}", r.invariants);
            assert!(metric(r, "udp.received") > 4900.0, "{scheme}");
        }
        let rx = metric(&on, "udp.received") / 0.1;
        // Without RPS the softirq on vCPU 0 wakes the receiver on vCPU 2.
        assert!(!off.metrics.contains_key("guest.rps_ipis_per_s"));
        assert!(per_s(&off, "guest.resched_irqs_per_s") > 0.9 * rx);
        // With it the wake-up is vCPU 2's own.
        assert!(
            per_s(&on, "guest.resched_irqs_per_s") < 0.01 * rx,
            "{scheme}: {}",
            per_s(&on, "guest.resched_irqs_per_s")
        );
        let steered = per_s(&on, "guest.rps_steered_remote_per_s");
        assert!(
            (steered - rx).abs() < 0.01 * rx,
            "{scheme}: {steered} of {rx}"
        );
        let ipis = per_s(&on, "guest.rps_ipis_per_s");
        let taken = per_s(&on, "guest.call_function_irqs_per_s");
        let batches = per_s(&on, "guest.rps_batches_per_s");
        assert!(ipis > 0.5 * rx, "{scheme}: {ipis} IPIs for {rx} packets/s");
        // One IPI per batch (the last may be in flight at the end).
        assert!((ipis - taken).abs() <= 10.0, "{scheme}: {ipis} vs {taken}");
        assert!(
            (batches - taken).abs() <= 10.0,
            "{scheme}: {batches} vs {taken}"
        );
        assert!(ipis <= per_s(&on, "guest.ipis_sent_per_s"));
        // Each packet counted once, by the poll that took it off the ring.
        let (a, b) = (
            metric(&on, "guest.rx_packets"),
            metric(&off, "guest.rx_packets"),
        );
        assert!((a - b).abs() <= 2.0, "{scheme}: {a} vs {b}");
    }
}

/// The 0xfb IPI's ICR write is the scheme's business, as the reschedule
/// IPI's: under KVM an MSR_WRITE exit (and the target's EOI exit), under
/// kvm-2026's IPI virtualization no exit.
#[test]
fn each_call_function_ipi_costs_an_icr_exit_under_kvm_and_none_with_ipiv() {
    let rps = "rps_cpus = [2]";
    let kvm = run_text(&udp_vm("kvm", rps, ""), &[]);
    let ipiv = run_text(&udp_vm("kvm-2026", rps, ""), &[]);
    let no_ipiv = run_text(&udp_vm("kvm-2026", rps, "[hv]\nipiv = false"), &[]);
    for r in [&kvm, &ipiv, &no_ipiv] {
        assert_eq!(r.violations(), 0, "{:?}", r.invariants);
    }
    let ipis = per_s(&ipiv, "guest.ipis_sent_per_s");
    // All of them 0xfb: the receiver is woken on its own vCPU.
    assert!(per_s(&ipiv, "guest.rps_ipis_per_s") > 0.99 * ipis);
    assert!(ipis > 25_000.0, "{ipis}");
    let msr = |r: &RunReport| rate(r, "MSR_WRITE");
    assert!(
        msr(&no_ipiv) - msr(&ipiv) > 0.95 * ipis,
        "{} vs {}",
        msr(&no_ipiv),
        msr(&ipiv)
    );
    assert!(msr(&ipiv) < 0.2 * ipis, "{}", msr(&ipiv));
    // KVM: the sender's ICR exit and the target's trapped EOI per IPI.
    let kvm_ipis = per_s(&kvm, "guest.rps_ipis_per_s");
    assert!(msr(&kvm) > 2.0 * kvm_ipis, "{} for {kvm_ipis}", msr(&kvm));
}

/// A 4-vCPU VM steering over all its vCPUs (memcached over 64 TCP
/// connections, so flows spread; lowest-priority MSIs), spinning or
/// halting when idle, over the VF and virtio-net: every scheme delivers
/// every 0xfb IPI and the checker stays clean.
#[test]
fn the_checker_stays_clean_with_rps_under_every_scheme() {
    let text = |scheme: &str, idle: &str, dev: &str| {
        format!(
            "name = \"t\"\nscheme = \"{scheme}\"\nseed = 3\nduration_s = 0.05\nwarmup_s = 0.01\n\
             [machine]\ncores = 6\n[guest]\nidle = \"{idle}\"\n[net]\ndevice = \"{dev}\"\n\
             [[vm]]\nvcpus = 4\ncores = [1, 2, 3, 4]\nirq_affinity = [0, 1, 2, 3]\n\
             msi_mode = \"lowest-priority\"\nrps_cpus = [0, 1, 2, 3]\n\
             [vm.workload.memcached]\nrate_rps = 60000\nthreads = 4\nconnections = 64\n"
        )
    };
    for scheme in ["kvm", "apicv", "kvm-2026", "did", "eli", "elvis"] {
        for idle in ["poll", "halt"] {
            for dev in ["vf", "virtio"] {
                let r = run_text(&text(scheme, idle, dev), &[]);
                let at = format!("{scheme} {idle} {dev}");
                assert_eq!(
                    r.violations(),
                    0,
                    "{at}: {:?}",
                    r.invariants.violations.first()
                );
                let ipis = per_s(&r, "guest.rps_ipis_per_s");
                let taken = per_s(&r, "guest.call_function_irqs_per_s");
                assert!(ipis > 10_000.0, "{at}: {ipis}");
                assert!(
                    (ipis - taken).abs() <= 4.0 / 0.05,
                    "{at}: {ipis} vs {taken}"
                );
                assert!(metric(&r, "memcached.completed") > 2900.0, "{at}");
            }
        }
    }
}

/// KVM, except that it mishandles the CALL_FUNCTION_SINGLE vector: drops
/// it, or gives it to the VM's next vCPU.
struct KvmBadCallFunction {
    misroute: bool,
}

impl Scheme for KvmBadCallFunction {
    fn name(&self) -> &'static str {
        "kvm-bad-0xfb"
    }
    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        kvm::setup(cx, vm);
    }
    fn virtual_interrupt(&mut self, cx: &mut HvCx, vcpu: usize, vector: u8) {
        if vector != CALL_FUNCTION {
            return kvm::raise(cx, vcpu, vector);
        }
        if self.misroute {
            let vm = cx.hv.vcpus[vcpu].vm;
            let vcpus = &cx.hv.vms[vm].vcpus;
            let i = vcpus.iter().position(|&v| v == vcpu).unwrap_or(0);
            let other = vcpus[(i + 1) % vcpus.len()];
            kvm::raise(cx, other, vector);
        }
    }
}

/// The checker sees every 0xfb from the guest's ICR write (raised for its
/// target vCPU) to the handler: a scheme that loses them or delivers them
/// to another vCPU is caught.
#[test]
fn a_lost_or_misdelivered_call_function_ipi_is_flagged() {
    let s = Scenario::parse(&udp_vm("kvm", "rps_cpus = [2]", ""), &[]).unwrap();
    for misroute in [false, true] {
        let scheme = Box::new(KvmBadCallFunction { misroute });
        let mut w = World::build_with(&s, &Calibration::default_host(), scheme).unwrap();
        w.run(|_| {});
        let r = w.report();
        let on_0xfb = |k: ViolationKind| {
            r.invariants
                .violations
                .iter()
                .filter(|v| v.kind == k && v.vector == CALL_FUNCTION)
                .count()
        };
        assert!(on_0xfb(ViolationKind::Lost) > 0, "misroute={misroute}");
        if misroute {
            assert!(on_0xfb(ViolationKind::Misdelivered) > 0);
        }
    }
}

/// Keys the guest cannot have are refused by name; the vector RPS needs
/// cannot be given to a device.
#[test]
fn bad_rps_settings_are_refused_by_key() {
    let parse = |rps: &str| match Scenario::parse(&udp_vm("kvm", rps, ""), &[]) {
        Ok(_) => panic!("accepted: {rps}"),
        Err(e) => e.to_string(),
    };
    for rps in ["rps_cpus = [4]", "rps_cpus = [1, 1]", "rps_cpus = []"] {
        let e = parse(rps);
        assert!(e.contains("vm[0].rps_cpus"), "{rps}: {e}");
    }
    // irq_affinity is a set too (a duplicate was accepted once).
    let dup = udp_vm("kvm", "", "").replace(
        "irq_affinity = [0]",
        "msi_mode = \"lowest-priority\"\nirq_affinity = [0, 1, 0]",
    );
    let e = Scenario::parse(&dup, &[])
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("vm[0].irq_affinity") && e.contains("distinct"),
        "{e}"
    );
    let s = Scenario::parse(
        &udp_vm("kvm", "rps_cpus = [2]", "[guest]\nvf_vector = 0xfb"),
        &[],
    )
    .unwrap();
    let e = match World::build(&s, &Calibration::default_host()) {
        Ok(_) => panic!("built"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("guest.vf_vector") && e.contains("CALL_FUNCTION_SINGLE"),
        "{e}"
    );
}

/// GRO before RPS (`napi_gro_receive` → `netif_receive_skb` →
/// `get_rps_cpu`): a TCP stream into a 4-vCPU VM with its receiver and
/// `rps_cpus` on vCPU 2 has its frames merged on vCPU 0 and its merged
/// packets steered to vCPU 2, fewer than the frames; every scheme stays
/// correct and the stream keeps most of its rate.
#[test]
fn gro_packets_are_what_rps_steers() {
    let tcp_vm = |scheme: &str, rps: &str| {
        format!(
            "name = \"t\"\nscheme = \"{scheme}\"\nseed = 3\nduration_s = 0.05\nwarmup_s = 0.01\n\
             [machine]\ncores = 6\n[[vm]]\nvcpus = 4\ncores = [1, 2, 3, 4]\napp_vcpu = 2\n\
             irq_affinity = [0]\n{rps}\n[vm.workload.iperf]\ndirection = \"to-vm\"\n"
        )
    };
    for scheme in ["kvm", "apicv", "kvm-2026", "did"] {
        let r = run_text(&tcp_vm(scheme, "rps_cpus = [2]"), &[]);
        let plain = run_text(&tcp_vm(scheme, ""), &[]);
        assert_eq!(r.violations(), 0, "{scheme}: {:?}", r.invariants.violations);
        let frames = metric(&r, "guest.rx_packets");
        let steered = metric(&r, "guest.rps_steered_per_s") * 0.05;
        let merged = metric(&r, "guest.gro_merged");
        assert!(merged > 0.5 * frames, "{scheme}: {merged} of {frames}");
        assert!(
            steered > 0.0 && steered < 0.5 * frames,
            "{scheme}: {steered} of {frames}"
        );
        assert!(metric(&r, "guest.call_function_irqs_per_s") > 0.0);
        let (g, g0) = (
            metric(&r, "iperf.throughput_gbps"),
            metric(&plain, "iperf.throughput_gbps"),
        );
        assert!(g > 0.5 * g0, "{scheme}: {g} vs {g0} without RPS");
    }
}
