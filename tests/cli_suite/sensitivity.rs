//! `exitless sensitivity` and the provenance it leaves for `run --json`
//! and `reproduce --json`; `exitless calibration` over both files.

use crate::common;
use common::{ok, s, scratch};
use std::path::Path;
use std::process::Output;

/// A small analysis of fig4 (20 ms, KVM) over a few entries.
fn analyse(scenario: &Path, out: &Path, jobs: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "-q",
        "sensitivity",
        s(scenario),
        "--set",
        "duration_s=0.02",
        "--set",
        "scheme=kvm",
        "--entries",
        "exit.external_interrupt_us,guest.rx_per_packet_ns,host.ipi_latency_us,vcanal.*,kvm.*",
        "--out",
        s(out),
        "--jobs",
        jobs,
        "--json",
    ];
    args.extend_from_slice(extra);
    ok(&args)
}

/// The results file and the analysis are the same bytes for any number
/// of jobs, and after a resumption from a file cut short.
#[test]
fn sensitivity_is_byte_identical_for_any_jobs_and_resumes() {
    let d = scratch("jobs");
    let sc = d.join("fig4.toml");
    std::fs::copy("validation/did/fig4.toml", &sc).unwrap();
    let one = analyse(&sc, &d.join("one.csv"), "1", &["--no-cache"]);
    let three = analyse(&sc, &d.join("three.csv"), "3", &["--no-cache"]);
    assert_eq!(one.stdout, three.stdout);
    let file = std::fs::read(d.join("one.csv")).unwrap();
    assert_eq!(file, std::fs::read(d.join("three.csv")).unwrap());
    // Cut the file inside its last run, resume: the same bytes again.
    std::fs::write(d.join("cut.csv"), &file[..file.len() * 2 / 3]).unwrap();
    let again = analyse(&sc, &d.join("cut.csv"), "2", &["--no-cache"]);
    assert_eq!(again.stdout, one.stdout);
    assert_eq!(std::fs::read(d.join("cut.csv")).unwrap(), file);
    let a: serde_json::Value = serde_json::from_slice(&one.stdout).unwrap();
    // The ARM entries are skipped without a run (an x86 world), the
    // vCanal ones run and move nothing, the IPI pair is one variation.
    let skipped: Vec<&str> = a["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["entry"].as_str().unwrap())
        .collect();
    assert!(skipped.contains(&"kvm.halt_poll_us"), "{skipped:?}");
    let unmoved = a["unmoved"].as_array().unwrap();
    assert!(
        unmoved.iter().any(|x| x == "vcanal.enqueue_ns"),
        "{unmoved:?}"
    );
    let lat = a["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["output"] == "udp.latency_mean_us")
        .unwrap();
    let first = &lat["ranked"][0];
    assert_eq!(first["entry"], "guest.rx_per_packet_ns", "{lat}");
    assert_eq!(first["kind"], "estimate");
}

/// With a cached analysis beside the scenario, `run --json` carries per
/// metric the entries it is most sensitive to; without one (or for other
/// overrides) the report is what it always was.
#[test]
fn run_json_carries_the_cached_sensitivity_only_when_it_applies() {
    let d = scratch("cache");
    let sc = d.join("fig4.toml");
    std::fs::copy("validation/did/fig4.toml", &sc).unwrap();
    let run = |sets: &[&str]| {
        let mut a = vec!["-q", "run", s(&sc), "--json"];
        for x in sets {
            a.extend(["--set", x]);
        }
        ok(&a).stdout
    };
    let sets = ["duration_s=0.02", "scheme=kvm"];
    let before = run(&sets);
    analyse(&sc, &d.join("r.jsonl"), "2", &[]);
    assert!(d.join("fig4.sensitivity.json").exists());
    let after: serde_json::Value = serde_json::from_slice(&run(&sets)).unwrap();
    let p = &after["sensitivity"]["udp.latency_mean_us"];
    assert_eq!(p["most_sensitive_to"][0]["entry"], "guest.rx_per_packet_ns");
    assert_eq!(p["estimates"][0]["kind"], "estimate");
    // Everything else is the report as it was.
    let mut stripped = after.clone();
    stripped.as_object_mut().unwrap().remove("sensitivity");
    let plain: serde_json::Value = serde_json::from_slice(&before).unwrap();
    assert_eq!(stripped, plain);
    // Other overrides: the cache does not apply, the bytes are unchanged.
    let other = ["duration_s=0.03", "scheme=kvm"];
    let o: serde_json::Value = serde_json::from_slice(&run(&other)).unwrap();
    assert!(o.get("sensitivity").is_none());
}

#[test]
fn calibration_lists_both_files_with_counts_by_kind() {
    let t = String::from_utf8(ok(&["calibration"]).stdout).unwrap();
    let heads: Vec<&str> = t
        .lines()
        .filter(|l| l.starts_with("calibration/"))
        .collect();
    assert_eq!(heads.len(), 5, "{heads:?}");
    assert!(heads[0].starts_with("calibration/x86-did-host.toml ("));
    assert!(heads[1].starts_with("calibration/arm-kvm-host.toml ("));
    assert!(heads[2].starts_with("calibration/riscv-kvm-host.toml ("));
    assert!(heads[3].starts_with("calibration/x86-spr-host.toml ("));
    assert!(heads[4].starts_with("calibration/x86-zen4-host.toml ("));
    assert!(t.contains("kvm.halt_poll_us"));
    let j: serde_json::Value =
        serde_json::from_slice(&ok(&["calibration", "--json"]).stdout).unwrap();
    let files = j["files"].as_array().unwrap();
    for f in files {
        let n: u64 = f["by_kind"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(n, f["entries"].as_u64().unwrap(), "{f}");
    }
    // An overlay's entry counts as its own kind.
    let o = ok(&["calibration", "--calibration-set", "exit.hlt_us=2"]);
    assert!(String::from_utf8(o.stdout).unwrap().contains("1 overlay"));
}

/// docs/calibration-sources.md §22 holds the tables `calibration
/// --markdown` prints, as they are now.
#[test]
fn the_docs_tables_of_every_entry_are_current() {
    let t = String::from_utf8(ok(&["calibration", "--markdown"]).stdout).unwrap();
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/calibration-sources.md"
    ))
    .unwrap();
    assert!(
        doc.contains(&t),
        "docs/calibration-sources.md §22 is stale: paste `exitless calibration --markdown` there"
    );
}
