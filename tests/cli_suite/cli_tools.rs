//! The command line's sweep, calibration overlays, `calibrate`, `keys`
//! and CSV output.

use crate::common;
use common::{exitless, ok, s, scratch};
use std::path::Path;
use std::process::Output;

/// A small sweep: 2 rates × 2 schemes, `seeds` seeds, 20 ms each.
fn sweep(out: &Path, rates: &str, seeds: &str, jobs: &str) -> Output {
    ok(&[
        "-q",
        "sweep",
        "validation/did/fig4.toml",
        "--grid",
        &format!("rate_pps={rates}"),
        "--schemes",
        "kvm,did",
        "--seeds",
        seeds,
        "--set",
        "duration_s=0.02",
        "--set",
        "warmup_s=0.01",
        "--jobs",
        jobs,
        "--out",
        s(out),
    ])
}

fn csv_rows(p: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| l.split(',').map(String::from).collect())
        .collect()
}

#[test]
fn sweep_writes_the_python_long_form_and_a_summary_across_seeds() {
    let d = scratch("sweep-form");
    let out = d.join("r.csv");
    sweep(&out, "1e5,4e5", "3", "2");
    let rows = csv_rows(&out);
    assert_eq!(
        rows[0],
        ["point", "rate_pps", "scheme", "seed", "metric", "value"]
    );
    // 4 points × 3 seeds, each with the same metric set.
    let mut runs: std::collections::BTreeMap<(String, String, String), Vec<String>> =
        Default::default();
    for r in &rows[1..] {
        runs.entry((r[1].clone(), r[2].clone(), r[3].clone()))
            .or_default()
            .push(r[4].clone());
    }
    assert_eq!(runs.len(), 12);
    let names: Vec<&Vec<String>> = runs.values().collect();
    assert!(names.iter().all(|n| *n == names[0]), "metric sets differ");
    for m in [
        "exits_per_s",
        "tig_pct",
        "eht_pct",
        "udp.received",
        "violations",
    ] {
        assert!(names[0].iter().any(|n| n == m), "no {m}: {:?}", names[0]);
    }
    // KVM takes EOI exits, DID none: the absent count is a 0, not a gap.
    let eoi = |scheme: &str| -> f64 {
        rows[1..]
            .iter()
            .find(|r| r[2] == scheme && r[4] == "exits_per_s.MSR_WRITE")
            .map(|r| r[5].parse().unwrap())
            .unwrap()
    };
    assert!(eoi("kvm") > 1000.0);
    assert_eq!(eoi("did"), 0.0);
    // Seeds base..base+3, the scenario's seed 1 as base.
    let seeds: std::collections::BTreeSet<&str> = rows[1..].iter().map(|r| r[3].as_str()).collect();
    assert_eq!(seeds.into_iter().collect::<Vec<_>>(), ["1", "2", "3"]);

    // The summary: mean of the three seeds and a t interval around it.
    let sum = csv_rows(&d.join("r.summary.csv"));
    assert_eq!(
        sum[0],
        [
            "point", "rate_pps", "scheme", "metric", "n", "mean", "std", "ci_half", "ci_low",
            "ci_high"
        ]
    );
    let row = sum
        .iter()
        .find(|r| r[2] == "kvm" && r[1] == "1e5" && r[3] == "exits_per_s")
        .unwrap();
    let xs: Vec<f64> = rows[1..]
        .iter()
        .filter(|r| r[2] == "kvm" && r[1] == "1e5" && r[4] == "exits_per_s")
        .map(|r| r[5].parse().unwrap())
        .collect();
    assert_eq!(xs.len(), 3);
    let mean: f64 = row[5].parse().unwrap();
    assert!((mean - xs.iter().sum::<f64>() / 3.0).abs() < 1e-9 * mean.abs().max(1.0));
    assert_eq!(row[4], "3");
    let (lo, hi): (f64, f64) = (row[8].parse().unwrap(), row[9].parse().unwrap());
    assert!(lo <= mean && mean <= hi);
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn sweep_output_is_the_same_bytes_whatever_the_jobs() {
    let d = scratch("sweep-jobs");
    let (a, b) = (d.join("a.csv"), d.join("b.csv"));
    sweep(&a, "1e5,2.5e5,4e5", "2", "1");
    sweep(&b, "1e5,2.5e5,4e5", "2", "3");
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert_eq!(
        std::fs::read(d.join("a.summary.csv")).unwrap(),
        std::fs::read(d.join("b.summary.csv")).unwrap()
    );
    // JSON lines: the same runs, one object per row.
    let j = d.join("c.jsonl");
    sweep(&j, "1e5,2.5e5,4e5", "2", "2");
    let text = std::fs::read_to_string(&j).unwrap();
    let csv_lines = std::fs::read_to_string(&a).unwrap().lines().count();
    assert_eq!(text.lines().count(), csv_lines - 1);
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["point"], 0);
    assert_eq!(first["rate_pps"], "1e5");
    assert!(first["value"].is_number() || first["value"].is_null());
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn a_sweep_resumes_from_its_results_file() {
    let d = scratch("sweep-resume");
    let fresh = d.join("fresh.csv");
    sweep(&fresh, "1e5,4e5", "2", "2");
    let whole = std::fs::read_to_string(&fresh).unwrap();

    // Extending: the runs already in the file are not run again. A value
    // changed by hand in the file survives the second sweep, which it
    // would not if those runs were simulated again.
    let part = d.join("part.csv");
    sweep(&part, "1e5", "2", "2");
    let text = std::fs::read_to_string(&part).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains(",kvm,1,exits_per_s,"))
        .unwrap()
        .to_string();
    let marked = line.rsplit_once(',').unwrap().0.to_string() + ",12345";
    std::fs::write(&part, text.replace(&line, &marked)).unwrap();
    sweep(&part, "1e5,4e5", "2", "2");
    let after = std::fs::read_to_string(&part).unwrap();
    assert!(after.contains(&marked), "a run in the file was run again");
    assert_eq!(after.replace(&marked, &line), whole);

    // Interrupted: a file cut in the middle of a line (or after a whole
    // line of a run) is completed to the same bytes as an uninterrupted
    // sweep.
    for cut in [
        whole.len() / 2,
        whole[..whole.len() / 3].rfind('\n').unwrap() + 1,
    ] {
        let p = d.join("cut.csv");
        std::fs::write(&p, &whole[..cut]).unwrap();
        sweep(&p, "1e5,4e5", "2", "2");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), whole, "cut at {cut}");
    }

    // A file from another sweep is refused, and left alone.
    let o = exitless(&[
        "-q",
        "sweep",
        "validation/did/fig4.toml",
        "--grid",
        "guest.hz=100,1000",
        "--set",
        "duration_s=0.02",
        "--out",
        s(&fresh),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("another sweep"));
    assert_eq!(std::fs::read_to_string(&fresh).unwrap(), whole);
    // So is the same sweep with other inputs (they are recorded beside).
    assert!(d.join("fresh.sweep.json").exists());
    let o = exitless(&[
        "-q",
        "sweep",
        "validation/did/fig4.toml",
        "--grid",
        "rate_pps=1e5,4e5",
        "--schemes",
        "kvm,did",
        "--seeds",
        "2",
        "--set",
        "duration_s=0.03",
        "--set",
        "warmup_s=0.01",
        "--out",
        s(&fresh),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("other inputs") && e.contains("--set"), "{e}");
    let o = exitless(&[
        "-q",
        "--calibration-set",
        "exit.hlt_us=1",
        "sweep",
        "validation/did/fig4.toml",
        "--grid",
        "rate_pps=1e5,4e5",
        "--schemes",
        "kvm,did",
        "--seeds",
        "2",
        "--set",
        "duration_s=0.02",
        "--set",
        "warmup_s=0.01",
        "--out",
        s(&fresh),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("the calibration"));
    assert_eq!(std::fs::read_to_string(&fresh).unwrap(), whole);
    // So is a grid that leaves out runs the file holds.
    let o = exitless(&[
        "-q",
        "sweep",
        "validation/did/fig4.toml",
        "--grid",
        "rate_pps=1e5",
        "--schemes",
        "kvm,did",
        "--seeds",
        "2",
        "--set",
        "duration_s=0.02",
        "--set",
        "warmup_s=0.01",
        "--out",
        s(&fresh),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("rate_pps=4e5"));
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn sweep_input_errors_name_the_point_and_key() {
    let d = scratch("sweep-errors");
    let out = d.join("r.csv");
    for (args, needle) in [
        (vec!["--grid", "rate_pps=1e5,-3"], "workload.udp.rate_pps"),
        (vec!["--grid", "rate_pps=1e5,-3"], "rate_pps=-3"),
        (vec!["--grid", "guest.hzz=1"], "hzz"),
        (vec!["--grid", "scheme=kvm"], "--schemes"),
        (vec!["--schemes", "kvm,vmware"], "vmware"),
        (vec!["--grid", "rate_pps"], "key=v1"),
    ] {
        let mut a = vec!["-q", "sweep", "validation/did/fig4.toml", "--out", s(&out)];
        a.extend(args.iter());
        let o = exitless(&a);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(needle), "{args:?}: {e}");
        assert!(
            !out.exists(),
            "{args:?}: a file was written before the check"
        );
    }
    let o = exitless(&[
        "-q",
        "sweep",
        "validation/did/fig4.toml",
        "--out",
        s(&d.join("r.parquet")),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("polars"));
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn run_and_reproduce_print_csv_rows() {
    let args = [
        "-q",
        "run",
        "validation/did/fig4.toml",
        "--set",
        "duration_s=0.05",
        "--set",
        "scheme=kvm",
    ];
    let csv = String::from_utf8(ok(&[&args[..], &["--csv"]].concat()).stdout).unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&ok(&[&args[..], &["--json"]].concat()).stdout).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("scheme,seed,metric,value"));
    let get = |m: &str| -> f64 {
        csv.lines()
            .find_map(|l| l.strip_prefix(&format!("kvm,1,{m},")))
            .unwrap_or_else(|| panic!("no {m} in {csv}"))
            .parse()
            .unwrap()
    };
    assert_eq!(
        get("exits_per_s"),
        json["vms"][0]["exits_per_s"].as_f64().unwrap()
    );
    assert_eq!(
        get("udp.received"),
        json["metrics"]["udp.received"].as_f64().unwrap()
    );
    assert_eq!(
        get("exits_per_s.MSR_WRITE"),
        json["vms"][0]["exits_per_s_by_reason"]["MSR_WRITE"]
            .as_f64()
            .unwrap()
    );
    // One seed (did.cyclictest asks for 5, which adds the spread columns).
    let cyclictest = [
        "-q",
        "reproduce",
        "did",
        "--only",
        "cyclictest",
        "--set",
        "duration_s=0.05",
        "--seeds",
        "1",
    ];
    let o = ok(&[&cyclictest[..], &["--csv"]].concat());
    let text = String::from_utf8(o.stdout).unwrap();
    let mut r = text.lines();
    assert_eq!(
        r.next(),
        Some("experiment,config,params,metric,unit,model,paper,tolerance_kind,tolerance_value,within,violations,note,kind,calibrated_to")
    );
    // The headline claims first, as records of their own.
    assert!(
        r.clone().take(2).all(|l| l.starts_with("headline,")),
        "{text}"
    );
    assert!(r.count() >= 3, "{text}");
    assert!(text.contains("cyclictest"), "{text}");
    // A published value with a known cause of its gap carries it in the
    // last column; a row without one leaves the cell empty.
    let timer_hits = text
        .lines()
        .find(|l| l.contains(",timer_exits.EPT_VIOLATION,") && l.contains(",did,"))
        .unwrap_or_else(|| panic!("no timer_exits row: {text}"));
    assert!(
        timer_hits.contains("DID arithmetic checks 3"),
        "{timer_hits}"
    );
    let bare = text
        .lines()
        .find(|l| l.contains(",bare-metal,") && l.contains(",cyclictest.latency_mean_us,"))
        .unwrap();
    assert!(bare.ends_with(",0,,value,"), "{bare}");
    // The text table marks the row and lists the note once below it.
    let o = ok(&cyclictest);
    let text = String::from_utf8(o.stdout).unwrap();
    let marks: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("did.cyclictest")
                && l.split_whitespace().nth(1) == Some("did")
                && l.contains(" timer_exits.")
        })
        .map(|l| l.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(marks.len(), 2, "{text}");
    assert!(marks[0].starts_with('[') && marks[0] == marks[1], "{text}");
    let listed = text
        .lines()
        .find(|l| l.starts_with(marks[0]))
        .unwrap_or_else(|| panic!("note {} not listed: {text}", marks[0]));
    assert!(listed.contains("uncorrelated timer hits"), "{listed}");
    // Two distinct notes name the check, each listed once.
    assert_eq!(text.matches("DID arithmetic checks 3").count(), 2, "{text}");
}

#[test]
fn calibration_overlays_layer_over_the_shipped_values() {
    let d = scratch("overlay");
    let ov = d.join("ov.toml");
    std::fs::write(&ov, "[exit]\nmsr_write_eoi_us = 2.5\n").unwrap();
    let text = String::from_utf8(ok(&["--calibration", s(&ov), "calibration"]).stdout).unwrap();
    let line = |k: &str| text.lines().find(|l| l.starts_with(k)).unwrap().to_string();
    assert!(line("exit.msr_write_eoi_us").contains("2.5"));
    assert!(line("exit.msr_write_eoi_us").contains("ov.toml"));
    // Entries the overlay leaves out keep the shipped value and source.
    assert!(line("exit.external_interrupt_us").contains("1.97"));
    assert!(line("exit.external_interrupt_us").contains("[paper]"));
    // --calibration-set comes after the file.
    let text = String::from_utf8(
        ok(&[
            "--calibration",
            s(&ov),
            "--calibration-set",
            "exit.msr_write_eoi_us=3.25",
            "calibration",
        ])
        .stdout,
    )
    .unwrap();
    assert!(text
        .lines()
        .any(|l| l.starts_with("exit.msr_write_eoi_us") && l.contains("3.25")));
    // And it changes what a run measures: the EOI exits of KVM cost more.
    let eoi_us = |extra: &[&str]| -> f64 {
        let mut a = extra.to_vec();
        a.extend([
            "-q",
            "run",
            "validation/did/fig4.toml",
            "--set",
            "duration_s=0.05",
            "--set",
            "scheme=kvm",
            "--json",
        ]);
        let j: serde_json::Value = serde_json::from_slice(&ok(&a).stdout).unwrap();
        // The report records what produced it: the tool, the resolved
        // scenario, and the calibration entries this run changed.
        let p = &j["provenance"];
        assert_eq!(p["tool"], format!("exitless {}", env!("CARGO_PKG_VERSION")));
        assert_eq!(p["scenario"]["scheme"], "kvm");
        let changed = p["calibration_changes"].as_object().unwrap();
        let names: Vec<&String> = changed.keys().collect();
        if extra.is_empty() {
            assert!(names.is_empty(), "{names:?}");
        } else {
            assert_eq!(names, ["exit.msr_write_eoi_us"]);
            assert_eq!(changed["exit.msr_write_eoi_us"]["value"], 5.0);
        }
        j["vms"][0]["exits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["reason"] == "MSR_WRITE")
            .unwrap()["avg_us"]
            .as_f64()
            .unwrap()
    };
    let base = eoi_us(&[]);
    let slow = eoi_us(&["--calibration-set", "exit.msr_write_eoi_us=5"]);
    assert!(slow > base + 3.0, "{base} -> {slow}");
    // Unknown keys and values out of range are errors that name them.
    for (file, needle) in [
        ("[exit]\nmsr_write_eio_us = 1\n", "exit.msr_write_eio_us"),
        ("[exit]\nmsr_write_eoi_us = -1\n", "exit.msr_write_eoi_us"),
    ] {
        std::fs::write(&ov, file).unwrap();
        let o = exitless(&["--calibration", s(&ov), "calibration"]);
        assert_eq!(o.status.code(), Some(2));
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(needle) && e.contains("ov.toml"), "{e}");
    }
    let o = exitless(&["--calibration-set", "exit.bogus_us=1", "calibration"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("exit.bogus_us"));
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn calibration_overlays_reach_the_arm_calibration() {
    let d = scratch("armcal");
    let ov = d.join("arm-ov.toml");
    // The hrtimer test under kvm-arm: every expiry is a physical timer
    // IRQ exit and a WFI wake-up, so the ARM host's costs are on its path.
    let p50 = |extra: &[&str]| {
        let mut args = vec![
            "-q",
            "run",
            "validation/did-arm/idle.toml",
            "--set",
            "duration_s=0.05",
            "--json",
        ];
        args.extend_from_slice(extra);
        let j: serde_json::Value = serde_json::from_slice(&ok(&args).stdout).unwrap();
        let changed: Vec<String> = j["provenance"]["calibration_changes"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        (
            j["metrics"]["hrtimer.latency_p50_us"].as_f64().unwrap(),
            changed,
        )
    };
    let (base, changed) = p50(&[]);
    assert!(changed.is_empty(), "{changed:?}");
    // --calibration-set with an ARM key: 2 world switches per exit.
    let (slow, changed) = p50(&["--calibration-set", "el2.world_switch_ns=1153"]);
    assert_eq!(changed, ["el2.world_switch_ns"]);
    assert!(slow > base + 0.8, "{base} -> {slow}");
    // --calibration FILE with an ARM section, then a set over it.
    std::fs::write(&ov, "[kvm]\nvcpu_wakeup_us = 5\n").unwrap();
    let (file, changed) = p50(&["--calibration", s(&ov)]);
    assert_eq!(changed, ["kvm.vcpu_wakeup_us"]);
    assert!(file > base + 1.5, "{base} -> {file}");
    let (both, _) = p50(&[
        "--calibration",
        s(&ov),
        "--calibration-set",
        "kvm.vcpu_wakeup_us=3",
    ]);
    assert_eq!(both, base);
    // Unknown ARM keys and ranges are errors naming the key and sections.
    for (set, needles) in [
        ("kvm.bogus_ns=1", &["kvm.bogus_ns", "halt_poll_us"][..]),
        ("armz.x_ns=1", &["armz.x_ns", "ARM sections: el2"][..]),
        (
            "kvm.halt_poll_us=-5",
            &["kvm.halt_poll_us", "out of range"][..],
        ),
    ] {
        let o = exitless(&[
            "--calibration-set",
            set,
            "run",
            "validation/did-arm/idle.toml",
        ]);
        assert_eq!(o.status.code(), Some(2), "{set}");
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(needles.iter().all(|n| e.contains(n)), "{set}: {e}");
    }
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn calibrate_reads_a_perf_kvm_stat_report_into_an_overlay() {
    let d = scratch("calibrate");
    // `run` prints perf kvm stat's table: use it as the input, plus a
    // reason the calibration has no key for.
    let run = ok(&[
        "-q",
        "run",
        "validation/did/fig4.toml",
        "--set",
        "duration_s=0.05",
        "--set",
        "scheme=kvm",
    ]);
    let mut report = String::from_utf8(run.stdout).unwrap();
    report = report.replacen(
        "\nTotal Samples:",
        "\n            MSR_READ         12     0.01%     0.00%      0.20us      0.40us      0.30us ( +-   1.00% )\n\nTotal Samples:",
        1,
    );
    let input = d.join("perf.txt");
    std::fs::write(&input, &report).unwrap();
    let out = d.join("overlay.toml");
    let o = ok(&["calibrate", "--from", s(&input), "--out", s(&out)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("MSR_READ") && err.contains("no calibration key"),
        "{err}"
    );
    let overlay = std::fs::read_to_string(&out).unwrap();
    // Each mapped reason's Avg time, with the input named as the source.
    let avg = |reason: &str| -> f64 {
        let l = report
            .lines()
            .find(|l| l.split_whitespace().next() == Some(reason))
            .unwrap();
        l.split_whitespace()
            .nth(6)
            .unwrap()
            .trim_end_matches("us")
            .parse()
            .unwrap()
    };
    let t: toml::Table = toml::from_str(&overlay).unwrap();
    let v = |k: &str| t["exit"][k]["value"].as_float().unwrap();
    assert_eq!(v("external_interrupt_us"), avg("EXTERNAL_INTERRUPT"));
    assert_eq!(v("msr_write_eoi_us"), avg("MSR_WRITE"));
    assert!(t["exit"]["external_interrupt_us"]["source"]
        .as_str()
        .unwrap()
        .contains("perf.txt"));
    // The overlay is a calibration file the other commands take.
    let shown = String::from_utf8(ok(&["--calibration", s(&out), "calibration"]).stdout).unwrap();
    assert!(shown.contains("perf.txt"));
    // Not a report: an error.
    std::fs::write(&input, "nothing here\n").unwrap();
    let o = exitless(&["calibrate", "--from", s(&input)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("VM-EXIT"));
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn keys_lists_every_scenario_key_with_type_and_default() {
    let o = ok(&["keys", "--json"]);
    let ks: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let get = |k: &str| ks.iter().find(|x| x["key"] == k).unwrap().clone();
    assert_eq!(get("guest.hz")["default"], "1000");
    assert_eq!(get("duration_s")["required"], true);
    assert!(get("nic.itr")["ty"].as_str().unwrap().contains("\"fixed\""));
    // Every key listed is one --set accepts (a table key set to its
    // default where it has one).
    for k in &ks {
        let (key, default) = (k["key"].as_str().unwrap(), &k["default"]);
        if key.contains("[]") || key.starts_with("workload.") || key.starts_with("vm") {
            continue;
        }
        let Some(d) = default.as_str() else { continue };
        if key == "config" || key == "scheme" {
            continue;
        }
        let o = exitless(&[
            "-q",
            "run",
            "validation/did/fig4.toml",
            "--set",
            "duration_s=0.001",
            "--set",
            &format!("{key}={d}"),
            "--csv",
        ]);
        assert!(
            o.status.success(),
            "{key}={d}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn no_progress_bar_when_stderr_is_not_a_terminal() {
    let d = scratch("sweep-bar");
    let out = d.join("r.csv");
    let o = ok(&[
        "sweep",
        "validation/did/fig4.toml",
        "--grid",
        "rate_pps=1e5,2e5",
        "--set",
        "duration_s=0.01",
        "--out",
        s(&out),
    ]);
    let e = String::from_utf8_lossy(&o.stderr);
    // The closing line only: no bar, no carriage returns.
    assert!(e.contains("sweep: 2 points × 1 seeds: 2 runs"), "{e}");
    assert!(!e.contains('\r') && !e.contains("=>"), "{e:?}");
    assert!(!d.join("r.summary.csv").exists(), "a summary for one seed");
    std::fs::remove_dir_all(&d).ok();
}

/// `exitless diff`: identical runs exit 0, different ones 1 with the
/// differing metrics named, and a file that is no output of the tool 2.
#[test]
fn diff_compares_two_runs_metric_by_metric() {
    let dir = std::env::temp_dir().join(format!("exitless-diff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |scheme: &str, name: &str| {
        let o = ok(&[
            "-q",
            "run",
            "validation/did/fig4.toml",
            "--set",
            "duration_s=0.02",
            "--set",
            &format!("scheme={scheme}"),
            "--json",
        ]);
        let p = dir.join(name);
        std::fs::write(&p, o.stdout).unwrap();
        p.to_str().unwrap().to_string()
    };
    let (a, b) = (run("did", "a.json"), run("kvm", "b.json"));
    let same = exitless(&["diff", &a, &a]);
    assert_eq!(same.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&same.stdout).contains("0 of "));
    let d = exitless(&["diff", &a, &b]);
    assert_eq!(d.status.code(), Some(1));
    let text = String::from_utf8_lossy(&d.stdout);
    assert!(
        text.contains("vms.0.exits_per_s_by_reason.EXTERNAL_INTERRUPT"),
        "{text}"
    );
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"a\": 1}").unwrap();
    let e = exitless(&["diff", &a, bad.to_str().unwrap()]);
    assert_eq!(e.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn reproduce_markdown_lists_the_published_rows_json_has() {
    let args = [
        "-q",
        "reproduce",
        "did",
        "--only",
        "cyclictest",
        "--set",
        "duration_s=0.05",
    ];
    let md = String::from_utf8(ok(&[&args[..], &["--markdown"]].concat()).stdout).unwrap();
    let json: serde_json::Value =
        serde_json::from_slice(&ok(&[&args[..], &["--json"]].concat()).stdout).unwrap();
    let rows = json["rows"].as_array().unwrap();
    let published: Vec<&serde_json::Value> =
        rows.iter().filter(|r| !r["paper"].is_null()).collect();
    // Only values and effects count as "within"; bounds and structural
    // rows hold or not beside them (issue 34).
    let counted: Vec<&&serde_json::Value> = published
        .iter()
        .filter(|r| r["kind"] == "value" || r["kind"] == "effect")
        .collect();
    let within = counted
        .iter()
        .filter(|r| r["within"].as_bool() == Some(true))
        .count();
    assert!(!counted.is_empty());
    assert!(
        md.contains(&format!(
            "{within} of {} values and effects within tolerance",
            counted.len()
        )),
        "{md}"
    );
    // The headline table comes first, before the rows.
    let headline = md
        .find("| did.cyclictest | DID cuts")
        .expect("headline row");
    let first_row = md.find("| did.cyclictest | bare-metal").expect("a row");
    assert!(headline < first_row, "{md}");
    assert_eq!(
        json["headlines"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h["experiment"] == "did.cyclictest")
            .count(),
        2,
        "{json}"
    );
    let table_rows = md
        .lines()
        .filter(|l| l.starts_with("| did.cyclictest | ") && !l.contains(" vs "))
        .count();
    assert_eq!(table_rows, published.len(), "{md}");
    // One output format at a time.
    let both = exitless(&[&args[..], &["--markdown", "--json"]].concat());
    assert_eq!(both.status.code(), Some(2));
}

#[test]
fn reproduce_with_several_seeds_reports_the_mean_and_its_spread() {
    let args = [
        "-q",
        "reproduce",
        "eli",
        "--only",
        "netperf",
        "--set",
        "duration_s=0.02",
        "--json",
    ];
    let rows = |extra: &[&str]| -> Vec<serde_json::Value> {
        let out = ok(&[&args[..], extra].concat());
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["rows"].as_array().unwrap().clone()
    };
    let plain = ok(&args).stdout;
    // One seed is the output as it always was, with no spread field.
    assert_eq!(ok(&[&args[..], &["--seeds", "1"]].concat()).stdout, plain);
    let one = rows(&[]);
    assert!(one.iter().all(|r| r.get("spread").is_none()));
    // Seeds 1 and 2 (the scenario's seed is 1): the second seed is the
    // run `--seed 2` gives, so each metric row is the two runs' mean, and
    // the percentage of bare metal is taken between the means.
    let second = rows(&["--seed", "2"]);
    let both = rows(&["--seeds", "2"]);
    assert_eq!(both.len(), one.len());
    let value = |exp: &serde_json::Value, config: &str, metric: &str| {
        both.iter()
            .find(|r| &r["experiment"] == exp && r["config"] == config && r["metric"] == metric)
            .and_then(|r| r["model"].as_f64())
            .unwrap()
    };
    let mut moved = 0;
    for ((r, a), b) in both.iter().zip(&one).zip(&second) {
        let sp = &r["spread"];
        assert_eq!(sp["seeds"], 2);
        let (x, y) = (a["model"].as_f64().unwrap(), b["model"].as_f64().unwrap());
        let mean = r["model"].as_f64().unwrap();
        let expected = if r["metric"] == "pct_of_bare_metal" {
            let t = "iperf.throughput_gbps";
            let e = &r["experiment"];
            100.0 * value(e, r["config"].as_str().unwrap(), t) / value(e, "bare-metal", t)
        } else {
            (x + y) / 2.0
        };
        assert!((mean - expected).abs() <= 1e-9 * mean.abs().max(1.0), "{r}");
        assert_eq!(sp["min"].as_f64().unwrap(), x.min(y));
        assert_eq!(sp["max"].as_f64().unwrap(), x.max(y));
        if x != y {
            moved += 1;
        }
        if !r["paper"].is_null() {
            let k = [&a["within"], &b["within"]]
                .iter()
                .filter(|w| w.as_bool() == Some(true))
                .count();
            assert_eq!(sp["within_seeds"].as_u64(), Some(k as u64), "{r}");
        }
    }
    assert!(moved > 0, "a second seed changed nothing");
    let zero = exitless(&[&args[..], &["--seeds", "0"]].concat());
    assert_eq!(zero.status.code(), Some(2));
}

#[test]
fn an_experiment_may_ask_for_several_seeds_and_the_command_line_overrides_it() {
    // A scratch validation root: one experiment asking for 3 seeds, one
    // for none, on the same short scenario.
    let dir = scratch("exp-seeds");
    let paper = dir.join("p");
    std::fs::create_dir_all(&paper).unwrap();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("validation/did/fig4.toml");
    let exp = |id: &str, seeds: &str| {
        format!(
            "[[experiment]]\nid = \"{id}\"\nscenario = \"{}\"\n{seeds}\
             config_order = [\"kvm\"]\nconfigs = {{ kvm = [\"scheme=kvm\", \"duration_s=0.01\", \"warmup_s=0\"] }}\n\
             metrics = [{{ name = \"exits_per_s\", unit = \"1/s\" }}]\n\
             expected = [{{ config = \"kvm\", metric = \"exits_per_s\", paper = 1, tolerance = \"min\", kind = \"structural\", source = \"test\" }}]\n",
            scenario.display()
        )
    };
    std::fs::write(
        paper.join("experiments.toml"),
        exp("p.three", "seeds = 3\n") + &exp("p.one", ""),
    )
    .unwrap();
    // `exitless -q reproduce p ARGS` over the scratch validation root.
    let reproduce = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_exitless"))
            .env("EXITLESS_VALIDATION", &dir)
            .args([&["-q", "reproduce", "p"][..], args].concat())
            .output()
            .unwrap()
    };
    let rows = |extra: &[&str]| -> Vec<serde_json::Value> {
        let out = reproduce(&[&["--json"][..], extra].concat());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["rows"].as_array().unwrap().clone()
    };
    let own = rows(&[]);
    assert_eq!(own.len(), 2);
    assert_eq!(own[0]["spread"]["seeds"], 3, "{}", own[0]);
    assert_eq!(own[0]["spread"]["within_seeds"], 3);
    assert!(own[1].get("spread").is_none(), "{}", own[1]);
    // The command line's count applies to every experiment.
    let one = rows(&["--seeds", "1"]);
    assert!(one.iter().all(|r| r.get("spread").is_none()));
    // p.one runs its one seed either way.
    assert_eq!(one[1]["model"], own[1]["model"]);
    let two = rows(&["--seeds", "2"]);
    assert!(two.iter().all(|r| r["spread"]["seeds"] == 2));
    // `seeds = 0` in a file is refused, naming the experiment.
    std::fs::write(paper.join("experiments.toml"), exp("p.zero", "seeds = 0\n")).unwrap();
    let out = reproduce(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("p.zero: `seeds` must be at least 1"));
    std::fs::remove_dir_all(&dir).ok();
}
