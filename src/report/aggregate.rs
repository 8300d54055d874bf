//! Results across VMs: each per-VM metric of a multi-VM run also gets an
//! aggregate, `all.<metric>`, beside VM 0's plain name and VM i's
//! `vm<i>.<metric>`.
//!
//! How a metric aggregates follows from what it measures, read off its
//! name: counts, bytes, throughputs and rates add up; percentages, means
//! and other ratios are averaged over the VMs that report them; maxima and
//! minima take the extreme. A percentile never becomes a mean of
//! percentiles: it has no aggregate here (a percentile over all VMs'
//! samples needs their merged histograms).

use super::VmReport;
use std::collections::BTreeMap;

/// How one metric combines over VMs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    /// Added (counts, bytes, throughput, rates per second).
    Sum,
    /// Averaged over the VMs that report it (percentages, means, ratios).
    Mean,
    /// The largest.
    Max,
    /// The smallest.
    Min,
    /// Not combined (a percentile).
    None,
}

/// How the metric `name` (without a VM prefix) combines over VMs.
pub fn combine_of(name: &str) -> Combine {
    let last = name.rsplit('.').next().unwrap_or(name);
    let words: Vec<&str> = last.split('_').collect();
    let is_percentile = words
        .iter()
        .any(|w| w.len() >= 2 && w.starts_with('p') && w[1..].bytes().all(|b| b.is_ascii_digit()));
    if is_percentile {
        return Combine::None;
    }
    if words.contains(&"max") || words.contains(&"peak") {
        return Combine::Max;
    }
    if words.contains(&"min") {
        return Combine::Min;
    }
    // A rate per second adds up over VMs; any other "per" is a ratio.
    let per_second = last.ends_with("_per_s") || last.ends_with("_pps") || last.ends_with("_rps");
    if per_second {
        return Combine::Sum;
    }
    let ratio_words = ["pct", "mean", "avg", "ratio", "per", "us", "ms", "ns"];
    if words.iter().any(|w| ratio_words.contains(w)) {
        return Combine::Mean;
    }
    Combine::Sum
}

/// The VM a metric name belongs to and its name without the prefix:
/// `vm3.udp.received` is VM 3's `udp.received`; a plain name is VM 0's.
fn split_vm(name: &str) -> (usize, &str) {
    if let Some((head, rest)) = name.split_once('.') {
        if let Some(n) = head.strip_prefix("vm") {
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                if let Ok(vm) = n.parse() {
                    return (vm, rest);
                }
            }
        }
    }
    (0, name)
}

/// Adds `all.<metric>` for every metric that at least two VMs report
/// (those only VM 0's plain name carries, such as host-wide metrics, have
/// none), and the exit totals of `vms`: `all.exits_per_s`,
/// `all.exits_per_s.<REASON>` (sums) and `all.tig_pct`, `all.eht_pct`
/// (over every vCPU of every VM). Nothing for a single-VM run.
pub fn add_aggregates(metrics: &mut BTreeMap<String, f64>, vms: &[VmReport]) {
    if vms.len() < 2 {
        return;
    }
    let mut by_base: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut per_vm_seen: BTreeMap<&str, bool> = BTreeMap::new();
    for (name, &v) in metrics.iter() {
        let (vm, base) = split_vm(name);
        by_base.entry(base).or_default().push(v);
        if vm > 0 {
            per_vm_seen.insert(base, true);
        }
    }
    let mut out: Vec<(String, f64)> = Vec::new();
    for (base, values) in &by_base {
        if values.len() < 2 || !per_vm_seen.contains_key(base) {
            continue;
        }
        let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
        let v = match combine_of(base) {
            Combine::None => continue,
            _ if finite.is_empty() => f64::NAN,
            Combine::Sum => finite.iter().sum(),
            Combine::Mean => finite.iter().sum::<f64>() / finite.len() as f64,
            Combine::Max => finite.iter().copied().fold(f64::MIN, f64::max),
            Combine::Min => finite.iter().copied().fold(f64::MAX, f64::min),
        };
        out.push((format!("all.{base}"), v));
    }
    out.push((
        "all.exits_per_s".into(),
        vms.iter().map(|v| v.exits_per_s).sum(),
    ));
    let mut reasons: BTreeMap<&str, f64> = BTreeMap::new();
    for vm in vms {
        for (r, v) in &vm.exits_per_s_by_reason {
            *reasons.entry(r).or_default() += v;
        }
    }
    for (r, v) in reasons {
        out.push((format!("all.exits_per_s.{r}"), v));
    }
    // TIG and EHT are shares of each VM's vCPU time: weight by vCPUs.
    let vcpus: usize = vms.iter().map(|v| v.vcpus).sum::<usize>().max(1);
    let weighted = |f: fn(&VmReport) -> f64| {
        vms.iter().map(|v| f(v) * v.vcpus as f64).sum::<f64>() / vcpus as f64
    };
    out.push(("all.tig_pct".into(), weighted(|v| v.tig_pct)));
    out.push(("all.eht_pct".into(), weighted(|v| v.eht_pct)));
    // A latency family's mean over every VM's samples (merged by the
    // world) stands; the mean of the VMs' means does not replace it.
    for (k, v) in out {
        metrics.entry(k).or_insert(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_combines_by_what_it_measures() {
        assert_eq!(combine_of("udp.received"), Combine::Sum);
        assert_eq!(combine_of("netperf.throughput_gbps"), Combine::Sum);
        assert_eq!(combine_of("memcached.rps"), Combine::Sum);
        assert_eq!(combine_of("nic.rx_packets"), Combine::Sum);
        assert_eq!(combine_of("exits_per_s"), Combine::Sum);
        assert_eq!(combine_of("vhost.io_cpu_pct"), Combine::Mean);
        assert_eq!(combine_of("udp.latency_mean_us"), Combine::Mean);
        assert_eq!(combine_of("memcached.mean_ms"), Combine::Mean);
        assert_eq!(combine_of("udp_rr.latency_us"), Combine::Mean);
        assert_eq!(combine_of("tcp.bytes_per_ack"), Combine::Mean);
        assert_eq!(combine_of("hrtimer.latency_max_us"), Combine::Max);
        assert_eq!(combine_of("memcached.backlog_peak"), Combine::Max);
        assert_eq!(combine_of("udp.latency_p99_us"), Combine::None);
        assert_eq!(combine_of("memcached.p999_ms"), Combine::None);
        assert_eq!(combine_of("memcached.p95_ms"), Combine::None);
    }

    fn vm(i: usize, vcpus: usize, exits: f64, tig: f64) -> VmReport {
        VmReport {
            vm: i,
            exits_per_s: exits,
            exits_per_s_by_reason: [("HLT", exits)].into_iter().collect(),
            vcpus,
            tig_pct: tig,
            eht_pct: 0.0,
            exits_per_s_by_cause: BTreeMap::new(),
            eht_counted_pct: 0.0,
            exits: Vec::new(),
            total_samples: 0,
            total_time_us: 0.0,
            per_vcpu: Vec::new(),
        }
    }

    #[test]
    fn per_vm_metrics_aggregate_and_host_wide_ones_do_not() {
        let mut m: BTreeMap<String, f64> = [
            ("udp.received", 10.0),
            ("vm1.udp.received", 30.0),
            ("vm2.udp.received", 5.0),
            ("vhost.io_cpu_pct", 20.0),
            ("vm1.vhost.io_cpu_pct", 40.0),
            ("udp.latency_p99_us", 7.0),
            ("vm1.udp.latency_p99_us", 9.0),
            ("host.idle_pct", 50.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        add_aggregates(&mut m, &[vm(0, 1, 100.0, 10.0), vm(1, 3, 50.0, 50.0)]);
        assert_eq!(m["all.udp.received"], 45.0);
        assert_eq!(m["all.vhost.io_cpu_pct"], 30.0);
        assert!(!m.contains_key("all.udp.latency_p99_us"));
        assert!(!m.contains_key("all.host.idle_pct"));
        assert_eq!(m["all.exits_per_s"], 150.0);
        assert_eq!(m["all.exits_per_s.HLT"], 150.0);
        // (10 × 1 + 50 × 3) / 4 vCPUs.
        assert_eq!(m["all.tig_pct"], 40.0);
    }

    #[test]
    fn a_single_vm_run_has_no_aggregates() {
        let mut m: BTreeMap<String, f64> = [("udp.received".to_string(), 1.0)].into();
        add_aggregates(&mut m, &[vm(0, 1, 1.0, 1.0)]);
        assert_eq!(m.len(), 1);
    }
}
