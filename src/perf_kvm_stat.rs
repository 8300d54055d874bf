//! Reading `perf kvm stat report` text (the VM-exit table: VM-EXIT,
//! Samples, Samples%, Time%, Min Time, Max Time, Avg time) and turning its
//! per-reason mean service times into a calibration overlay
//! (`exitless calibrate --from FILE`).
//!
//! `exitless run` prints the same table, so a model's output can be read
//! back too. A report with several tables (one per VM) is merged: each
//! reason's mean is the sample-weighted mean of its rows.

use crate::calibration_overlay::OverlayEntry;

/// One reason's row (merged over the report's tables).
#[derive(Clone, Debug, PartialEq)]
pub struct ExitRow {
    /// The reason as perf names it (`EXTERNAL_INTERRUPT`).
    pub reason: String,
    /// Samples.
    pub samples: u64,
    /// Smallest service time, µs.
    pub min_us: f64,
    /// Largest, µs.
    pub max_us: f64,
    /// Mean, µs.
    pub avg_us: f64,
}

/// A time cell (`4.37us`, `4.37`, `12ms`, `900ns`) in µs.
fn time_us(cell: &str) -> Option<f64> {
    let (num, scale) = if let Some(n) = cell.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = cell.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = cell.strip_suffix("ns") {
        (n, 1e-3)
    } else if let Some(n) = cell.strip_suffix('s') {
        (n, 1e6)
    } else {
        (cell, 1.0)
    };
    let x: f64 = num.parse().ok()?;
    (x.is_finite() && x >= 0.0).then_some(x * scale)
}

/// One table row: `REASON samples samples% time% min max avg [( +- x% )]`.
fn row(line: &str) -> Option<ExitRow> {
    let t: Vec<&str> = line.split_whitespace().collect();
    if t.len() < 7 || !t[2].ends_with('%') || !t[3].ends_with('%') {
        return None;
    }
    Some(ExitRow {
        reason: t[0].to_string(),
        samples: t[1].parse().ok()?,
        min_us: time_us(t[4])?,
        max_us: time_us(t[5])?,
        avg_us: time_us(t[6])?,
    })
}

/// The exit rows of a report, merged over its tables, in the order the
/// reasons first appear. Rows are read after a `VM-EXIT` header line; an
/// input with none is an error.
pub fn parse(text: &str) -> Result<Vec<ExitRow>, String> {
    let mut rows: Vec<ExitRow> = Vec::new();
    let mut in_table = false;
    let mut headers = 0;
    for (n, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.starts_with("VM-EXIT") && l.contains("Samples") {
            in_table = true;
            headers += 1;
            continue;
        }
        if l.starts_with("Total Samples") || l.starts_with("Analyze events") {
            in_table = false;
            continue;
        }
        if !in_table || l.is_empty() {
            continue;
        }
        let Some(r) = row(l) else {
            return Err(format!(
                "line {}: not a perf kvm stat row (REASON Samples Samples% Time% Min Max Avg): `{l}`",
                n + 1
            ));
        };
        match rows.iter_mut().find(|x| x.reason == r.reason) {
            Some(x) => {
                let n = (x.samples + r.samples) as f64;
                if n > 0.0 {
                    x.avg_us = (x.avg_us * x.samples as f64 + r.avg_us * r.samples as f64) / n;
                }
                x.samples += r.samples;
                x.min_us = x.min_us.min(r.min_us);
                x.max_us = x.max_us.max(r.max_us);
            }
            None => rows.push(r),
        }
    }
    if headers == 0 {
        return Err(
            "no `VM-EXIT  Samples  Samples% ...` table header: not `perf kvm stat report` output"
                .into(),
        );
    }
    Ok(rows)
}

/// The calibration keys a reason's mean service time sets. `EXCEPTION_NMI`
/// and `MSR_WRITE` are each one perf reason for several modelled costs
/// (exceptions and NMIs; EOI, TMICT and other x2APIC writes): perf cannot
/// tell them apart, so the one mean sets them all. Empty: no key.
pub fn calibration_keys(reason: &str) -> &'static [&'static str] {
    match reason {
        "EXTERNAL_INTERRUPT" => &["exit.external_interrupt_us"],
        "MSR_WRITE" => &[
            "exit.msr_write_eoi_us",
            "exit.msr_write_tmict_us",
            "exit.msr_write_other_us",
        ],
        "IO_INSTRUCTION" => &["exit.io_instruction_us"],
        "EPT_VIOLATION" => &["exit.ept_violation_us"],
        "PENDING_INTERRUPT" => &["exit.pending_interrupt_us"],
        "EXCEPTION_NMI" => &["exit.exception_np_us", "exit.nmi_us"],
        _ => &[],
    }
}

/// Whether perf's time for `reason` includes the time the vCPU was
/// blocked, not only the handler's: `perf kvm stat` times an exit from
/// the exit to the next entry, and a HLT exit's next entry comes after
/// `kvm_vcpu_block` has slept until an interrupt (halt polling included).
/// Its "Avg time" is mostly the guest's idle time (~143 us in a realistic
/// report against a 0.75 us handler), so it is never a service cost.
pub fn includes_blocking(reason: &str) -> bool {
    matches!(reason, "HLT" | "MWAIT_INSTRUCTION")
}

/// What `calibrate` made of a report.
#[derive(Debug)]
pub struct Calibrated {
    /// Overlay entries, in the order of the report's reasons.
    pub entries: Vec<OverlayEntry>,
    /// Rows whose reason has no calibration key (reported, not dropped).
    pub unmapped: Vec<ExitRow>,
    /// Rows with no samples (no mean to take).
    pub empty: Vec<String>,
    /// Rows whose perf time includes blocking ([`includes_blocking`]):
    /// left out, whatever their mean.
    pub blocking: Vec<ExitRow>,
}

/// Maps a report's rows to overlay entries whose source names `input`.
pub fn calibrate(rows: &[ExitRow], input: &str) -> Calibrated {
    let mut c = Calibrated {
        entries: Vec::new(),
        unmapped: Vec::new(),
        empty: Vec::new(),
        blocking: Vec::new(),
    };
    for r in rows {
        if includes_blocking(&r.reason) {
            c.blocking.push(r.clone());
            continue;
        }
        let keys = calibration_keys(&r.reason);
        if keys.is_empty() {
            c.unmapped.push(r.clone());
            continue;
        }
        if r.samples == 0 {
            c.empty.push(r.reason.clone());
            continue;
        }
        for k in keys {
            let shared = if keys.len() > 1 {
                " (perf does not split this reason: one mean for all its keys)"
            } else {
                ""
            };
            c.entries.push(OverlayEntry {
                key: k.to_string(),
                value: r.avg_us,
                source: format!(
                    "[measured] perf kvm stat report {input}: {} Avg time over {} samples{shared}",
                    r.reason, r.samples
                ),
                clock: None,
            });
        }
    }
    c
}

/// Overlay entries as a calibration overlay file (TOML), by section.
pub fn to_toml(entries: &[OverlayEntry], input: &str) -> String {
    let mut o = format!(
        "# Calibration overlay made by `exitless calibrate --from {input}`:\n\
         # exit service times (perf's Avg time per VM-EXIT reason), in µs.\n\
         # Use it with `--calibration THIS_FILE`; entries not here keep the\n\
         # shipped values.\n"
    );
    let mut section = "";
    for e in entries {
        let (sec, name) = e.key.split_once('.').unwrap_or(("", &e.key));
        if sec != section {
            o.push_str(&format!("\n[{sec}]\n"));
            section = sec;
        }
        o.push_str(&format!(
            "{name} = {{ value = {}, source = {} }}\n",
            toml::Value::Float(e.value),
            toml::Value::String(e.source.clone())
        ));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "
Analyze events for all VMs, all VCPUs:

             VM-EXIT    Samples  Samples%     Time%    Min Time    Max Time         Avg time

  EXTERNAL_INTERRUPT      59632    38.98%    10.06%      0.49us   2138.39us      4.37us ( +-   2.32% )
           MSR_WRITE      40000    26.15%     1.00%      0.30us     10.00us      1.10us ( +-   1.00% )
      IO_INSTRUCTION        100     0.07%     1.00%      5.00us     50.00us     10.00us ( +-   1.00% )
            MSR_READ         50     0.03%     0.01%      0.20us      1.00us      0.50us ( +-   1.00% )

Total Samples:99782, Total events handled time:2589776.95us.
";

    #[test]
    fn reads_rows_and_maps_reasons_to_keys() {
        let rows = parse(REPORT).unwrap();
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[0].reason, "EXTERNAL_INTERRUPT");
        assert_eq!(rows[0].samples, 59632);
        assert_eq!(rows[0].avg_us, 4.37);
        assert_eq!(rows[0].max_us, 2138.39);
        let c = calibrate(&rows, "host.txt");
        let keys: Vec<&str> = c.entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "exit.external_interrupt_us",
                "exit.msr_write_eoi_us",
                "exit.msr_write_tmict_us",
                "exit.msr_write_other_us",
                "exit.io_instruction_us"
            ]
        );
        assert!(c.entries.iter().all(|e| e.source.contains("host.txt")));
        assert_eq!(c.unmapped.len(), 1);
        assert_eq!(c.unmapped[0].reason, "MSR_READ");
        // The overlay it writes layers over the shipped calibration.
        let text = to_toml(&c.entries, "host.txt");
        let cal = crate::calibration_overlay::layered(Some(("o.toml", &text)), &[]).unwrap();
        assert_eq!(cal.exit.external_interrupt_us.value, 4.37);
        assert_eq!(cal.exit.msr_write_tmict_us.value, 1.1);
        assert!(cal.exit.io_instruction_us.source.contains("host.txt"));
    }

    #[test]
    fn a_halt_s_perf_time_never_becomes_its_service_cost() {
        // perf times HLT up to the next entry: the 143 us here is mostly the
        // halted period of an idle guest, not kvm_emulate_halt.
        let with_hlt = REPORT.replace(
            "            MSR_READ",
            "                 HLT      12000     7.84%    60.00%      0.60us   9000.00us    143.00us ( +-   5.00% )\n            MSR_READ",
        );
        let rows = parse(&with_hlt).unwrap();
        assert!(rows.iter().any(|r| r.reason == "HLT"));
        let c = calibrate(&rows, "host.txt");
        assert!(c.entries.iter().all(|e| e.key != "exit.hlt_us"));
        assert_eq!(c.blocking.len(), 1);
        assert_eq!(c.blocking[0].avg_us, 143.0);
        // The overlay leaves the shipped handler cost in place.
        let text = to_toml(&c.entries, "host.txt");
        let cal = crate::calibration_overlay::layered(Some(("o.toml", &text)), &[]).unwrap();
        assert!(cal.exit.hlt_us.value < 5.0, "{}", cal.exit.hlt_us.value);
    }

    #[test]
    fn tables_per_vm_merge_by_samples() {
        let two = format!("{REPORT}\n{}", REPORT.replace("4.37us", "1.00us"));
        let rows = parse(&two).unwrap();
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[0].samples, 2 * 59632);
        assert!((rows[0].avg_us - (4.37 + 1.0) / 2.0).abs() < 1e-12);
    }

    #[test]
    fn not_a_report_is_an_error() {
        assert!(parse("hello\nworld\n").unwrap_err().contains("VM-EXIT"));
        let bad = REPORT.replace("10.00us ( +-", "ten ( +-");
        assert!(parse(&bad).unwrap_err().contains("line"));
    }
}
