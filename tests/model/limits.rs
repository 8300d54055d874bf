//! The sizes a scenario may describe (issue 25 item 6): up to 1,024 VMs,
//! 512 cores and 256 vCPUs per VM are accepted and simulated; one more is
//! refused by key, with the limit in the message.

use crate::common::*;
use exitless::scenario::Scenario;

/// `n` copies of a one-vCPU VM with `vcpus` vCPUs each, spread over cores
/// 1.. of a `cores`-core machine.
fn layout(cores: usize, n: u32, vcpus: u32, workload: &str) -> String {
    let pool: Vec<String> = (1..cores).map(|c| c.to_string()).collect();
    format!(
        "scheme = \"apicv\"\nduration_s = 0.0005\nwarmup_s = 0.0\n[machine]\ncores = {cores}\n\
         [guest]\nidle = \"halt\"\n[[vm]]\ncopies = {n}\nvcpus = {vcpus}\ncore = 1\n\
         copies_cores = [{}]\n{workload}",
        pool.join(", ")
    )
}

fn refusal(text: &str) -> String {
    Scenario::parse(text, &[]).expect_err("refused").to_string()
}

#[test]
fn the_largest_layouts_are_accepted_and_one_more_is_refused() {
    let udp = "[vm.workload.udp]\nrate_pps = 10000\n";
    assert!(Scenario::parse(&layout(512, 1024, 1, udp), &[]).is_ok());
    let e = refusal(&layout(512, 1025, 1, udp));
    assert!(e.contains("1025 VMs: at most 1024"), "{e}");
    let e = refusal(&layout(513, 1, 1, ""));
    assert!(e.contains("machine.cores") && e.contains("2..=512"), "{e}");
    assert!(Scenario::parse(&layout(512, 1, 256, ""), &[]).is_ok());
    let e = refusal(&layout(512, 1, 257, ""));
    assert!(e.contains("vcpus") && e.contains("1..=256"), "{e}");
    // 256 vCPUs x 256 VMs: more than an event's 16-bit vCPU number holds.
    let e = refusal(&layout(512, 256, 256, ""));
    assert!(e.contains("65536 vCPUs in all: at most 65535"), "{e}");
}

#[test]
fn a_thousand_vm_host_on_384_cores_runs_clean() {
    let r = run_text(
        // 6,000 packets/s each: the 1,000 VMs' VFs share the NIC's one
        // 10 GbE port, which carries 6.44 Mpps of 128-byte datagrams.
        &layout(384, 1000, 1, "[vm.workload.udp]\nrate_pps = 6000\n"),
        &["duration_s=0.003"],
    );
    assert_eq!(r.vms.len(), 1000);
    assert_eq!(r.violations(), 0);
    // Every VM got its datagrams, the last ones (sharing host vectors and
    // cores with earlier ones) too.
    for vm in [0, 126, 127, 999] {
        let key = if vm == 0 {
            "udp.received".to_string()
        } else {
            format!("vm{vm}.udp.received")
        };
        let got = metric(&r, &key);
        assert!(got >= 9.0, "vm{vm}: {got}");
    }
}

#[test]
fn a_256_vcpu_guest_sends_and_takes_ipis_across_its_vcpus() {
    // Every vCPU on its own core, the workload's tasks on the last one and
    // the VF's interrupt on vCPU 200: wake-ups cross CPUs past 64 and 128.
    let cores: Vec<String> = (1..=256).map(|c| c.to_string()).collect();
    let text = format!(
        "scheme = \"apicv\"\nduration_s = 0.002\nwarmup_s = 0.0\n[machine]\ncores = 257\n\
         [guest]\nidle = \"halt\"\n[[vm]]\nvcpus = 256\ncores = [{}]\napp_vcpu = 255\n\
         irq_affinity = [200]\n[vm.workload.udp]\nrate_pps = 20000\n",
        cores.join(", ")
    );
    let r = run_text(&text, &[]);
    assert_eq!(r.violations(), 0);
    assert!(metric(&r, "udp.received") >= 20.0);
}
