//! Issue 38: what a newcomer meets first, and hostile inputs that used to
//! slip past (each test failed before its fix).

use crate::common;
use common::{exitless, s, scratch};

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const UDP: &str =
    "scheme = \"kvm\"\nduration_s = 0.01\nwarmup_s = 0.001\n[workload.udp]\nrate_pps = 10000\n";

#[test]
fn reproduce_lists_every_paper_and_accepts_only_their_names() {
    let help = String::from_utf8_lossy(&exitless(&["reproduce", "--help"]).stdout).into_owned();
    for p in exitless::validation::paper_names() {
        assert!(help.contains(p), "--help lacks {p}: {help}");
    }
    for bad in ["foo", "../../etc", "did/.."] {
        let o = exitless(&["reproduce", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}");
        let e = stderr(&o);
        assert!(e.contains("did-arm") && e.contains("vcanal"), "{bad}: {e}");
    }
}

#[test]
fn an_unknown_key_lists_every_valid_key_and_a_near_miss() {
    let o = exitless(&[
        "run",
        "validation/did/fig4.toml",
        "--set",
        "nic.itr_intervall_us=5",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(!e.contains("bytes in all"), "{e}");
    assert!(e.contains("`tx_wthresh`"), "the list is cut: {e}");
    assert!(e.contains("did you mean `itr_interval_us`?"), "{e}");
}

#[test]
fn diff_of_a_very_long_metric_name_does_not_panic() {
    let d = scratch("diff");
    let name = "m".repeat(65_536);
    let a = d.join("a.json");
    let b = d.join("b.json");
    std::fs::write(
        &a,
        format!("{{\"vms\": [], \"metrics\": {{\"{name}\": 1}}}}"),
    )
    .unwrap();
    std::fs::write(
        &b,
        format!("{{\"vms\": [], \"metrics\": {{\"{name}\": 2}}}}"),
    )
    .unwrap();
    let o = exitless(&["diff", s(&a), s(&b)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("1 of 1 values differ"));
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn explore_runs_are_bounded() {
    let o = exitless(&[
        "explore",
        "scenarios/explore/vf-udp.toml",
        "--runs",
        "4294967296",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--runs"), "{}", stderr(&o));
}

#[test]
fn a_sweep_into_a_fifo_is_refused_not_a_hang() {
    let d = scratch("fifo");
    let fifo = d.join("r.csv");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        return;
    }
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_exitless"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "-q",
            "sweep",
            "validation/did/fig4.toml",
            "--grid",
            "rate_pps=1e5",
            "--set",
            "duration_s=0.001",
            "--out",
            s(&fifo),
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if t0.elapsed() > std::time::Duration::from_secs(20) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(2),
        "hung or wrong status"
    );
    assert!(
        stderr(&out).contains("not a regular file"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn an_output_that_is_an_input_is_refused_and_the_input_kept() {
    let d = scratch("same");
    let sc = d.join("s.toml");
    std::fs::write(&sc, UDP).unwrap();
    let o = exitless(&["-q", "run", s(&sc), "--trace", s(&sc)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("the scenario file"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&sc).unwrap(), UDP);
    // calibrate --out = --from.
    let perf = d.join("perf.txt");
    let text = "Analyze events for all VMs, all VCPUs:\n\n             VM-EXIT    Samples  Samples%     Time%    Min Time    Max Time         Avg time\n\n           MSR_WRITE      1000    100.00%   100.00%      0.50us      5.00us      1.20us ( +-   1.00% )\n\nTotal Samples:1000, Total events handled time:1200.00us.\n";
    std::fs::write(&perf, text).unwrap();
    let o = exitless(&["-q", "calibrate", "--from", s(&perf), "--out", s(&perf)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&perf).unwrap(), text);
    // sweep --out = the scenario (a .csv scenario name to pass the suffix
    // check).
    let csv_sc = d.join("s.csv");
    std::fs::write(&csv_sc, UDP).unwrap();
    let o = exitless(&[
        "-q",
        "sweep",
        s(&csv_sc),
        "--grid",
        "rate_pps=1e4",
        "--out",
        s(&csv_sc),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&csv_sc).unwrap(), UDP);
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn a_250_byte_trace_name_is_written_and_stale_temporaries_are_removed() {
    let d = scratch("tmpname");
    let sc = d.join("s.toml");
    std::fs::write(&sc, UDP).unwrap();
    let name = format!("{}.json", "t".repeat(245));
    let trace = d.join(&name);
    let o = exitless(&["-q", "run", s(&sc), "--trace", s(&trace)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(trace.is_file());
    // What a run killed by SIGKILL left (the earlier name form, a process
    // id above pid_max: no such process runs) goes with the next write.
    let stale = d.join(".t.json.4194305-0.tmp");
    std::fs::write(&stale, "partial").unwrap();
    let o = exitless(&["-q", "run", s(&sc), "--trace", s(&d.join("t.json"))]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stale.exists(), "the stale temporary is still there");
    let left: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    std::fs::remove_dir_all(&d).ok();
}

/// Scenario text run through the binary: (exit status, stdout, stderr).
fn run_text(tag: &str, text: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let d = scratch(tag);
    let sc = d.join("s.toml");
    std::fs::write(&sc, text).unwrap();
    let mut a = vec!["-q", "run", s(&sc)];
    a.extend_from_slice(args);
    let o = exitless(&a);
    std::fs::remove_dir_all(&d).ok();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr(&o),
    )
}

#[test]
fn udp_load_beyond_the_link_at_its_frame_size_is_refused() {
    // 1 Mpps of 1472-byte payloads: 12.3 Gb/s on 10 GbE.
    let big = UDP.replace(
        "rate_pps = 10000",
        "rate_pps = 1000000\npayload_bytes = 1472",
    );
    let (code, _, e) = run_text("link", &big, &[]);
    assert_eq!(code, Some(2), "{e}");
    assert!(
        e.contains("workload.udp.rate_pps") && e.contains("812744"),
        "{e}"
    );
    // Two VMs of 500 kpps each: per VM within, together beyond.
    let two = "scheme = \"kvm\"\nduration_s = 0.01\n[machine]\ncores = 4\n[[vm]]\ncore = 1\ncopies = 2\ncopies_cores = [1, 2]\n[vm.workload.udp]\nrate_pps = 500000\npayload_bytes = 1472\n";
    let (code, _, e) = run_text("link2", two, &[]);
    assert_eq!(code, Some(2), "{e}");
    // At the minimum frame 600 kpps fits easily.
    let (code, _, e) = run_text("link3", &UDP.replace("10000", "600000"), &[]);
    assert_eq!(code, Some(0), "{e}");
}

#[test]
fn totals_across_vms_are_bounded() {
    let mc = "scheme = \"kvm\"\nduration_s = 0.01\n[machine]\ncores = 4\n[[vm]]\ncore = 1\ncopies = 1024\ncopies_cores = [1, 2, 3]\n[vm.workload.memcached]\nrate_rps = 1000000.0\nconnections = 4000\n";
    let (code, _, e) = run_text("totals", mc, &[]);
    assert_eq!(code, Some(2), "{e}");
    assert!(e.contains("TCP connections") && e.contains("65536"), "{e}");
    let rps = mc
        .replace("copies = 1024", "copies = 16")
        .replace("connections = 4000", "connections = 10");
    let (code, _, e) = run_text("totals-rps", &rps, &[]);
    assert_eq!(code, Some(2), "{e}");
    assert!(e.contains("rate_rps"), "{e}");
}

#[test]
fn a_latency_over_no_samples_is_null_with_a_warning() {
    // One packet a second: none in a 10-ms measured interval.
    let (code, out, e) = run_text("nosample", &UDP.replace("10000", "1"), &["--json"]);
    assert_eq!(code, Some(0), "{e}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["metrics"]["udp.latency_mean_us"].is_null(),
        "{}",
        v["metrics"]
    );
    assert!(v["metrics"]["udp.latency_p99_us"].is_null());
    let w = v["warnings"].to_string();
    assert!(
        w.contains("udp.latency_mean_us") && w.contains("no samples"),
        "{w}"
    );
    assert!(e.contains("no samples"), "not on stderr: {e}");
}

#[test]
fn an_unfinished_whileloop_warns() {
    let wl = "scheme = \"kvm\"\nduration_s = 0.01\n[workload.whileloop]\niterations = 1e14\n";
    let (code, out, _) = run_text("whileloop", wl, &["--json"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let w = v["warnings"].to_string();
    assert!(
        w.contains("elapsed_s") && w.contains("did not finish"),
        "{w}"
    );
}

#[test]
fn directvisor_plain_vms_must_name_a_vm() {
    let (code, _, e) = run_text(
        "plain",
        &format!("{UDP}[hv]\ndirectvisor_plain_vms = [9999]\n")
            .replace("\"kvm\"", "\"directvisor\""),
        &[],
    );
    assert_eq!(code, Some(2), "{e}");
    assert!(e.contains("hv.directvisor_plain_vms"), "{e}");
}

#[test]
fn directvisor_off_its_dedicated_cores_and_did_halting_warn() {
    let shared = "scheme = \"directvisor\"\nduration_s = 0.01\n[machine]\ncores = 3\n[[vm]]\ncore = 1\ncopies = 2\ncopies_cores = [1]\n[vm.workload.udp]\nrate_pps = 1000\n";
    let (code, _, e) = run_text("dv-shared", shared, &[]);
    assert_eq!(code, Some(0), "{e}");
    assert!(
        e.contains("directvisor") && e.contains("share a core"),
        "{e}"
    );
    let (code, _, e) = run_text(
        "did-halt",
        &UDP.replace("\"kvm\"", "\"did\""),
        &["--set", "guest.idle=halt"],
    );
    assert_eq!(code, Some(0), "{e}");
    assert!(e.contains("halt polling"), "{e}");
}

#[test]
fn an_arm_trace_has_exit_slices_and_interrupts_by_intid() {
    let d = scratch("armtrace");
    let t = d.join("t.json");
    let o = exitless(&[
        "-q",
        "run",
        "validation/did-arm/idle.toml",
        "--set",
        "scheme=kvm-arm",
        "--set",
        "duration_s=0.02",
        "--trace",
        s(&t),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&t).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    let exits = ev.iter().filter(|e| e["cat"] == "exit").count();
    assert!(exits > 0, "no exit slices");
    let irqs: Vec<&str> = ev
        .iter()
        .filter(|e| e["cat"] == "interrupt")
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(!irqs.is_empty());
    assert!(irqs.iter().all(|n| n.contains("INTID")), "{irqs:?}");
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn a_virtio_trace_has_raise_delivery_eoi_flows() {
    let d = scratch("pvtrace");
    let t = d.join("t.json");
    let o = exitless(&[
        "-q",
        "run",
        "validation/did/netpipe.toml",
        "--set",
        "config=pv",
        "--set",
        "duration_s=0.02",
        "--trace",
        s(&t),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&t).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    let flow_in_eoi = ev
        .iter()
        .filter(|e| e["cat"] == "eoi" && e.get("bind_id").is_some())
        .count();
    assert!(flow_in_eoi > 0, "no raise -> delivery -> EOI flow");
    std::fs::remove_dir_all(&d).ok();
}
