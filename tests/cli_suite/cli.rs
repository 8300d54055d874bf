//! The command line: run, JSON schema, errors that name the key.

use crate::common;
use common::exitless;
use std::process::Command;

#[test]
fn run_json_has_the_documented_fields() {
    let o = exitless(&[
        "-q",
        "run",
        "validation/did/fig4.toml",
        "--set",
        "duration_s=0.05",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["invariants"]["violations"].as_array().unwrap().is_empty());
    assert_eq!(v["schema_version"], exitless::report::SCHEMA_VERSION);
    assert!(v["vms"][0]["exits_per_s"].as_f64().is_some());
    assert!(v["vms"][0]["tig_pct"].as_f64().unwrap() > 90.0);
}

#[test]
fn run_text_is_a_perf_kvm_stat_table() {
    let o = exitless(&[
        "-q",
        "run",
        "validation/did/fig4.toml",
        "--set",
        "duration_s=0.05",
        "--set",
        "scheme=kvm",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("VM-EXIT    Samples  Samples%    Time%"),
        "{out}"
    );
    assert!(
        out.contains("EXTERNAL_INTERRUPT") && out.contains("MSR_WRITE"),
        "{out}"
    );
    assert!(out.contains("Total Samples:"), "{out}");
}

#[test]
fn bad_input_names_the_key_and_fails() {
    for (set, needle) in [
        ("rate_pps=-1", "workload.udp.rate_pps"),
        ("scheme=vmware", "scheme"),
        ("guest.tick=sometimes", "tick"),
        ("duration_s=0", "duration_s"),
    ] {
        let o = exitless(&["-q", "run", "validation/did/fig4.toml", "--set", set]);
        assert_eq!(o.status.code(), Some(2), "{set}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{set}: {err}");
    }
    let o = exitless(&["-q", "run", "no/such/file.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no/such/file.toml"));
}

/// `reproduce es2`: the published Table 1 values sit beside the model's,
/// and posted interrupts leave no interrupt-delivery or EOI exits.
#[test]
fn reproduce_es2_table1_compares_with_the_paper() {
    let o = exitless(&[
        "-q",
        "reproduce",
        "es2",
        "--only",
        "es2.table1",
        "--set",
        "duration_s=0.05",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let rows = out["rows"].as_array().expect("json rows").clone();
    let row = |config: &str, metric: &str| {
        rows.iter()
            .find(|r| r["config"] == config && r["metric"] == metric)
            .unwrap_or_else(|| panic!("{config} {metric}"))
            .clone()
    };
    assert_eq!(row("pi", "exits_per_s.io_instruction")["paper"], 84403.0);
    assert_eq!(row("pi", "exits_per_s.interrupt_delivery")["model"], 0.0);
    assert_eq!(row("pi", "exits_per_s.eoi_write")["model"], 0.0);
    assert!(
        row("w/o-pi", "exits_per_s.eoi_write")["model"]
            .as_f64()
            .unwrap()
            > 1000.0
    );
    assert!(rows.iter().all(|r| r["violations"] == 0));
}

/// `reproduce vcanal`: the paper's UDP_RR comparison runs every §3
/// configuration; vCanal's round trip is below Baseline's, and its
/// completions come as interrupts only in the interrupt-taking modes.
#[test]
fn reproduce_vcanal_udp_rr_compares_with_the_paper() {
    let o = exitless(&[
        "-q",
        "reproduce",
        "vcanal",
        "--only",
        "vcanal.udp-rr-client",
        "--set",
        "duration_s=0.03",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let rows = json["rows"].as_array().expect("json rows").clone();
    let model = |config: &str, metric: &str| {
        rows.iter()
            .find(|r| r["config"] == config && r["metric"] == metric)
            .unwrap_or_else(|| panic!("{config} {metric}"))["model"]
            .as_f64()
            .unwrap()
    };
    for c in [
        "native",
        "baseline",
        "baseline-affinity",
        "elvis",
        "vcanal",
        "sriov",
    ] {
        assert!(model(c, "udp_rr.latency_us") > 1.0, "{c}");
    }
    assert!(model("vcanal", "udp_rr.latency_us") < model("baseline", "udp_rr.latency_us"));
    let pct = rows
        .iter()
        .find(|r| r["config"] == "vcanal" && r["metric"] == "pct_of_baseline")
        .expect("the normalised row");
    assert_eq!(pct["paper"], 62.0);
    assert!(rows.iter().all(|r| r["violations"] == 0));
}

#[test]
fn reproduce_json_rows_have_the_documented_fields() {
    let o = exitless(&[
        "-q",
        "reproduce",
        "did",
        "--only",
        "cyclictest",
        "--set",
        "duration_s=0.2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Versioned, with what made it.
    assert_eq!(out["schema_version"], exitless::report::SCHEMA_VERSION);
    assert_eq!(out["paper"], "did");
    assert!(out["tool"].as_str().unwrap().starts_with("exitless "));
    let rows = out["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    for r in rows {
        for f in [
            "experiment",
            "config",
            "params",
            "metric",
            "unit",
            "model",
            "paper",
            "tolerance",
            "within",
        ] {
            assert!(r.get(f).is_some(), "row lacks {f}: {r}");
        }
        // `--only cyclictest` runs did.cyclictest and its readings
        // (did.cyclictest-posix-timer, -exit-window), nothing else.
        assert!(
            r["experiment"]
                .as_str()
                .is_some_and(|e| e.starts_with("did.cyclictest")),
            "{r}"
        );
    }
    let did_mean = rows
        .iter()
        .find(|r| {
            r["experiment"] == "did.cyclictest"
                && r["config"] == "did"
                && r["metric"] == "cyclictest.latency_mean_us"
        })
        .unwrap();
    assert_eq!(did_mean["paper"].as_f64(), Some(2.9));
    assert!(did_mean["within"].is_boolean());
    let o = exitless(&["-q", "reproduce", "nosuchpaper"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn did_apicv_runs_each_workload_with_its_own_metrics() {
    let o = exitless(&[
        "-q",
        "reproduce",
        "did",
        "--only",
        "did.apicv",
        "--set",
        "duration_s=0.05",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = out["rows"].as_array().unwrap();
    let of = |w: &str, m: &str| -> Vec<&serde_json::Value> {
        rows.iter()
            .filter(|r| r["params"]["workload"] == w && r["metric"] == m)
            .collect()
    };
    for w in ["cyclictest", "iperf-pv", "iperf-sriov"] {
        // kvm, apicv, did.
        assert_eq!(of(w, "exits_per_s").len(), 3, "{w}");
        assert!(of(w, "exits_per_s").iter().all(|r| r["paper"].is_null()));
    }
    // Workload-specific metrics appear only for their workloads.
    assert_eq!(of("cyclictest", "cyclictest.latency_mean_us").len(), 3);
    assert!(of("iperf-pv", "cyclictest.latency_mean_us").is_empty());
    assert_eq!(of("iperf-sriov", "throughput_gbps").len(), 3);
    // The PV variant really runs virtio (kicks exit), the SR-IOV one not.
    let io = |w: &str| {
        of(w, "exits_per_s.IO_INSTRUCTION")
            .iter()
            .map(|r| r["model"].as_f64().unwrap())
            .fold(0.0, f64::max)
    };
    assert!(io("iperf-pv") > 1000.0);
    assert!(of("iperf-sriov", "exits_per_s.IO_INSTRUCTION").is_empty());
}

#[test]
fn trace_writes_a_perfetto_timeline_of_the_window() {
    let path = std::env::temp_dir().join(format!("exitless-trace-{}.json", std::process::id()));
    let p = path.to_str().unwrap();
    let o = exitless(&[
        "-q",
        "run",
        "validation/did/fig4.toml",
        "--set",
        "scheme=kvm",
        "--set",
        "duration_s=0.02",
        "--trace",
        p,
        "--trace-window",
        "1:2",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    std::fs::remove_file(&path).ok();
    let ev = v["traceEvents"].as_array().unwrap();
    let named = |n: &str| ev.iter().filter(|e| e["name"] == n).count();
    // KVM on SR-IOV: VF interrupts exit and are injected, their EOIs exit;
    // slices are named by VM and vCPU, with the exit's qualification.
    assert!(named("vm0 vcpu0: EXTERNAL_INTERRUPT") > 10);
    assert!(named("vm0 vcpu0: MSR_WRITE") > 10);
    assert!(named("vm0 vcpu0: guest") > 10);
    let eoi_exit = ev
        .iter()
        .find(|e| e["name"] == "vm0 vcpu0: MSR_WRITE")
        .unwrap();
    assert_eq!(eoi_exit["args"]["reason"], "MSR_WRITE");
    assert!(eoi_exit["args"]["qualification"]
        .as_str()
        .unwrap()
        .starts_with("WRMSR 0x80b (x2APIC EOI)"));
    // Each VF interrupt: an arrow from its raise (device track) to its
    // delivery in the guest and on to the guest's EOI of it.
    let mut flows: std::collections::BTreeMap<u64, Vec<&serde_json::Value>> = Default::default();
    for e in ev.iter().filter(|e| e.get("bind_id").is_some()) {
        flows
            .entry(e["bind_id"].as_u64().unwrap())
            .or_default()
            .push(e);
    }
    assert!(flows.len() > 10);
    let complete = flows.values().filter(|f| f.len() == 3).count();
    assert!(complete + 2 >= flows.len(), "{complete} of {}", flows.len());
    for f in flows.values().filter(|f| f.len() == 3) {
        assert_eq!(
            (f[0]["pid"].as_u64(), f[0]["flow_out"].as_bool()),
            (Some(2), Some(true))
        );
        assert_eq!(f[1]["cat"], "interrupt");
        assert_eq!(f[2]["cat"], "eoi");
        assert_eq!(f[1]["args"]["vector"], f[2]["args"]["vector"]);
        let ts: Vec<f64> = f.iter().map(|e| e["ts"].as_f64().unwrap()).collect();
        assert!(ts[0] <= ts[1] && ts[1] <= ts[2], "{ts:?}");
    }
    // Every slice overlaps the 2-ms window that starts 1 ms after warm-up
    // (fig4.toml: 50 ms); those on cores are on the VM's core.
    for e in ev.iter().filter(|e| e["ph"] == "X") {
        let ts = e["ts"].as_f64().unwrap();
        let end = ts + e["dur"].as_f64().unwrap();
        assert!(end >= 51_000.0 && ts < 53_000.0, "{e}");
        if e["pid"] == 0 {
            assert_eq!(e["tid"], 1);
        }
    }
    let o = exitless(&[
        "run",
        "validation/did/fig4.toml",
        "--trace",
        p,
        "--trace-window",
        "10",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("START_MS:LENGTH_MS"));
}

#[test]
fn schemes_lists_every_buildable_scheme_with_a_summary() {
    let o = exitless(&["schemes"]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let (x86, rest) = text
        .split_once("\nwith arch = \"arm64\":\n")
        .expect("an ARM part");
    let (arm, riscv) = rest
        .split_once("\nwith arch = \"riscv64\":\n")
        .expect("a RISC-V part");
    assert_eq!(
        riscv.lines().count(),
        exitless::hv::riscv::RISCV_SCHEMES.len()
    );
    for (line, name) in riscv.lines().zip(exitless::hv::riscv::RISCV_SCHEMES) {
        let (first, rest) = line.split_once(' ').unwrap();
        assert_eq!(first, name);
        assert!(rest.trim().len() > 20, "{line}");
        let cfg = exitless::hv::riscv::RiscvConfig::default();
        assert_eq!(
            exitless::hv::riscv::by_name(name, cfg).unwrap().name(),
            name
        );
    }
    assert_eq!(x86.lines().count(), exitless::hv::scheme::SCHEMES.len());
    for (line, name) in x86.lines().zip(exitless::hv::scheme::SCHEMES) {
        let (first, rest) = line.split_once(' ').unwrap();
        assert_eq!(first, name);
        assert!(rest.trim().len() > 20, "{line}");
        assert_eq!(exitless::hv::scheme::by_name(name).unwrap().name(), name);
    }
    assert_eq!(arm.lines().count(), exitless::hv::arm::ARM_SCHEMES.len());
    for (line, name) in arm.lines().zip(exitless::hv::arm::ARM_SCHEMES) {
        let (first, rest) = line.split_once(' ').unwrap();
        assert_eq!(first, name);
        assert!(rest.trim().len() > 20, "{line}");
        let hyp = exitless::hw::arm::el2::HypMode::Vhe;
        assert_eq!(exitless::hv::arm::by_name(name, hyp).unwrap().name(), name);
    }
}

/// A pipe whose reading end is already closed: every write to it fails
/// with EPIPE, as `exitless ... | head -1` sees once head has exited.
fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    writer
}

fn exitless_with(
    args: &[&str],
    stdout: impl Into<std::process::Stdio>,
    stderr: impl Into<std::process::Stdio>,
) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_exitless"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .stdout(stdout)
        .stderr(stderr)
        .output()
        .expect("binary runs")
}

#[test]
fn a_closed_stderr_does_not_stop_a_run_or_lose_its_results() {
    use std::process::Stdio;
    // Not -q: the run writes its engine line to stderr, reproduce its
    // progress; both go to the closed pipe.
    let o = exitless_with(
        &[
            "run",
            "validation/did/fig4.toml",
            "--set",
            "duration_s=0.02",
            "--json",
        ],
        Stdio::piped(),
        closed_pipe(),
    );
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["vms"][0]["exits_per_s"].as_f64().is_some());
    let o = exitless_with(
        &[
            "reproduce",
            "did",
            "--only",
            "cyclictest",
            "--set",
            "duration_s=0.05",
            "--json",
        ],
        Stdio::piped(),
        closed_pipe(),
    );
    assert_eq!(o.status.code(), Some(0));
    let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = out["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
}

#[test]
fn results_that_cannot_be_written_fail_the_command() {
    use std::process::Stdio;
    let run = [
        "run",
        "validation/did/fig4.toml",
        "--set",
        "duration_s=0.02",
    ];
    // stdout closed, stderr readable: a non-zero status and the reason.
    let o = exitless_with(&run, closed_pipe(), Stdio::piped());
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("writing the results to stdout"), "{err}");
    // `2>&1 | true`: both closed; still no panic (status 101).
    let w = closed_pipe();
    let o = exitless_with(&run, w.try_clone().unwrap(), w);
    assert_eq!(o.status.code(), Some(1));
    // A full disk.
    if let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") {
        let o = exitless_with(&["schemes"], full, Stdio::piped());
        assert_eq!(o.status.code(), Some(1));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("writing the results to stdout"), "{err}");
    }
}

#[test]
fn the_trace_is_written_whole_through_a_temporary_file() {
    let dir = std::env::temp_dir().join(format!("exitless-trace-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.json");
    std::fs::write(&path, "an older trace").unwrap();
    let traced = |to: &std::path::Path| {
        exitless(&[
            "-q",
            "run",
            "validation/did/fig4.toml",
            "--set",
            "duration_s=0.01",
            "--trace",
            to.to_str().unwrap(),
        ])
    };
    let o = traced(&path);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert!(v["traceEvents"].as_array().unwrap().len() > 3);
    // Only the trace itself is left in the directory.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    // A trace path that is a directory fails cleanly and leaves nothing.
    let o = traced(&dir);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot write trace"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_trace_through_a_symlink_or_to_a_device_keeps_what_is_there() {
    let dir = std::env::temp_dir().join(format!("exitless-trace-link-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("real")).unwrap();
    let real = dir.join("real").join("t.json");
    let link = dir.join("t.json");
    std::os::unix::fs::symlink("real/t.json", &link).unwrap();
    let traced = |to: &std::path::Path| {
        exitless(&[
            "-q",
            "run",
            "validation/did/fig4.toml",
            "--set",
            "duration_s=0.01",
            "--trace",
            to.to_str().unwrap(),
        ])
    };
    let o = traced(&link);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The link is still a link, and the trace is where it points.
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&real).unwrap()).unwrap();
    assert!(v["traceEvents"].as_array().unwrap().len() > 3);
    // /dev/null stays the device it is.
    let o = traced(std::path::Path::new("/dev/null"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn sigint_ends_a_run_as_an_interrupted_command() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_exitless"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "-q",
            "run",
            "validation/did/fig4.toml",
            "--set",
            "duration_s=1000",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Long enough for main() to have installed its handler.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = child.wait().unwrap();
    // Our handler's exit code (it removes temporary outputs first), not
    // death by the signal.
    assert_eq!(status.code(), Some(130), "{status:?}");
}

#[test]
fn hostile_overrides_and_paths_are_short_clean_errors() {
    let big = "x".repeat(100_000);
    let deep = vec!["a"; 30_000].join(".");
    for set in [
        format!("scheme={big}"),
        format!("workload.udp.rate_pps={big}"),
        format!("nic.{big}=3"),
        format!("{deep}=1"),
    ] {
        let o = exitless(&["-q", "run", "validation/did/fig4.toml", "--set", &set]);
        // An error (not SIGABRT from a stack overflow), naming the problem
        // without echoing the 100 KB back.
        assert_eq!(o.status.code(), Some(2), "{}", &set[..40]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.len() < 2_000, "{} bytes of error", err.len());
        assert!(err.contains("bytes in all"), "{err}");
    }
    // A FIFO nobody writes to: an error at once, not a wait forever.
    let dir = std::env::temp_dir().join(format!("exitless-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("scenario.toml");
    if Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success())
    {
        let o = exitless(&["-q", "run", fifo.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("FIFO with no writer"), "{err}");
        // With a writer, the scenario is read through the FIFO.
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || {
                let text = std::fs::read_to_string(
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("validation/did/fig4.toml"),
                )
                .unwrap();
                std::fs::write(fifo, text).unwrap();
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        let o = exitless(&[
            "-q",
            "run",
            fifo.to_str().unwrap(),
            "--set",
            "duration_s=0.01",
        ]);
        writer.join().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn options_without_effect_warn_on_stderr_and_in_the_json_report() {
    let o = exitless(&[
        "-q",
        "run",
        "validation/did/fig4.toml",
        "--set",
        "scheme=kvm",
        "--set",
        "hv.vtd_posted_interrupts=true",
        "--set",
        "duration_s=0.01",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("warning") && err.contains("hv.vtd_posted_interrupts"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let w = v["warnings"].as_array().unwrap();
    assert_eq!(w.len(), 1);
    assert!(w[0].as_str().unwrap().contains("kvm"));
}

#[test]
fn oversized_inputs_and_limits_are_refused() {
    if std::path::Path::new("/dev/zero").exists() {
        for args in [
            vec!["-q", "run", "/dev/zero"],
            vec![
                "-q",
                "--calibration",
                "/dev/zero",
                "run",
                "validation/did/fig4.toml",
            ],
        ] {
            let o = exitless(&args);
            assert_eq!(o.status.code(), Some(2), "{args:?}");
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains("/dev/zero") && err.contains("larger than"),
                "{err}"
            );
        }
    }
    for args in [
        vec![
            "run",
            "validation/did/fig4.toml",
            "--trace",
            "t.json",
            "--trace-limit",
            "100000000000",
        ],
        vec!["reproduce", "did", "--threads", "0"],
        vec!["reproduce", "did", "--threads", "1000000"],
        vec!["explore", "validation/did/fig4.toml", "--threads", "0"],
        vec!["reproduce", "did", "--only", "no-such-experiment"],
        vec!["explore", "validation/did/fig4.toml", "--threads", "100000"],
    ] {
        let o = exitless(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
    }
}
