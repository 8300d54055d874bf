//! The docs agree with the code. docs/metrics.md lists every metric a run reports: each validation
//! scenario is run as shipped (shortened) and every name it emits (the
//! names `run --csv` and sweeps use) must appear in the glossary, literally
//! or as a `<...>` family.

use exitless::calibration::Calibration;
use exitless::scenario::Scenario;
use exitless::world::World;
use std::path::Path;

/// Backquoted names in the doc (`a.b`, `exits_per_s.<REASON>`, `_p99_us`).
fn documented(doc: &str) -> Vec<String> {
    doc.split('`')
        .skip(1)
        .step_by(2)
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && !s.contains(' '))
        .collect()
}

/// Whether `name` matches `pattern`, where each `<...>` in the pattern
/// stands for one or more of [A-Za-z0-9_].
fn matches(pattern: &str, name: &str) -> bool {
    let Some(open) = pattern.find('<') else {
        return pattern == name;
    };
    let Some(close) = pattern[open..].find('>').map(|c| open + c) else {
        return pattern == name;
    };
    let (lit, rest) = (&pattern[..open], &pattern[close + 1..]);
    let Some(tail) = name.strip_prefix(lit) else {
        return false;
    };
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let max = tail.find(|c: char| !word(c)).unwrap_or(tail.len());
    (1..=max).any(|n| matches(rest, &tail[n..]))
}

#[test]
fn the_pattern_matcher_matches_families_only() {
    assert!(matches("exits_per_s.<REASON>", "exits_per_s.MSR_WRITE"));
    assert!(!matches("exits_per_s.<REASON>", "exits_per_s."));
    assert!(!matches("exits_per_s.<REASON>", "exits_per_s.A.B"));
    assert!(matches(
        "host.vcpu<i>_runqueue_wait_pct",
        "host.vcpu2_runqueue_wait_pct"
    ));
    assert!(matches("udp.received", "udp.received"));
    assert!(!matches("udp.received", "udp.receivedx"));
}

#[test]
fn every_metric_of_the_validation_scenarios_is_in_docs_metrics_md() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/metrics.md")).unwrap();
    let names = documented(&doc);
    let cal = Calibration::default_host();
    let mut scenarios = Vec::new();
    for dir in [
        "validation/did",
        "validation/eli",
        "validation/consolidation",
        "validation/directvisor",
        "validation/did-arm",
        "validation/vcanal",
        "scenarios/explore",
        "scenarios/smp",
        "scenarios/es2",
    ] {
        let mut v: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.extension().is_some_and(|e| e == "toml")
                    && p.file_name().is_some_and(|n| {
                        // Experiment lists and calibration overlays are
                        // not scenarios.
                        n != "experiments.toml" && n != "testbed.toml"
                    })
            })
            .collect();
        v.sort();
        scenarios.extend(v);
    }
    assert!(scenarios.len() >= 10, "{scenarios:?}");
    let mut missing = std::collections::BTreeSet::new();
    for path in &scenarios {
        let text = std::fs::read_to_string(path).unwrap();
        // Shortened: the names do not depend on the length of the run.
        let t: toml::Table = toml::from_str(&text).unwrap();
        let dur = t
            .get("duration_s")
            .and_then(|d| d.as_float())
            .unwrap_or(1.0);
        let mut sets = vec![format!("duration_s={}", dur.min(0.05))];
        if text.contains("[workload.sip]") {
            sets.push("workload.sip.calls=20".into());
        }
        if text.contains("[workload.whileloop]") && !text.contains("[[vm]]") {
            sets.push("iterations=1e8".into());
        }
        let s = Scenario::load(path, &sets).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut w = World::build(&s, &cal).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        w.run(|_| {});
        let flat = exitless::sweep::flatten(&w.report()).unwrap();
        for name in flat.keys() {
            // VM i's metrics are VM 0's, prefixed `vm<i>.`.
            let base = match name.split_once('.') {
                Some((vm, rest))
                    if vm.len() > 2
                        && vm.starts_with("vm")
                        && vm[2..].bytes().all(|b| b.is_ascii_digit()) =>
                {
                    rest
                }
                _ => name.as_str(),
            };
            // Aggregates over VMs are `all.` and a per-VM name.
            let base = base.strip_prefix("all.").unwrap_or(base);
            if !names.iter().any(|p| matches(p, base)) {
                missing.insert(format!("{name} ({})", path.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "metrics not in docs/metrics.md: {missing:#?}"
    );
}

#[test]
fn the_scenario_guide_examples_are_valid_scenarios() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/scenario-guide.md")).unwrap();
    let blocks: Vec<&str> = doc
        .split("```toml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert!(blocks.len() >= 4);
    let cal = Calibration::default_host();
    for b in blocks {
        let s =
            Scenario::parse(b, &["duration_s=0.002".into()]).unwrap_or_else(|e| panic!("{e}\n{b}"));
        World::build(&s, &cal).unwrap_or_else(|e| panic!("{e}\n{b}"));
    }
}
