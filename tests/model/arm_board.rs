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
