//! Two runs compared metric by metric (`exitless diff A.json B.json`).
//!
//! Both inputs are JSON outputs of this tool: `run --json` reports or
//! `reproduce --json` outputs. Each is flattened to named numbers: a run's
//! every numeric field by its path (`metrics.udp.latency_mean_us`,
//! `vms.0.exits.MSR_WRITE.samples`: arrays of exit rows keyed by their
//! reason), a reproduce output's model value per row, named by experiment,
//! config, parameters and metric. The comparison lists the names whose
//! values differ, or that only one side has.

use serde_json::Value;
use std::collections::BTreeMap;

/// One compared name.
#[derive(Clone, Debug, PartialEq)]
pub struct DiffRow {
    /// The flattened name.
    pub name: String,
    /// Its value in A, if A has it.
    pub a: Option<f64>,
    /// Its value in B, if B has it.
    pub b: Option<f64>,
}

impl DiffRow {
    /// B relative to A, in percent (None without both or with A = 0).
    pub fn change_pct(&self) -> Option<f64> {
        match (self.a, self.b) {
            (Some(a), Some(b)) if a != 0.0 => Some(100.0 * (b - a) / a.abs()),
            _ => None,
        }
    }
}

/// The named numbers of one output. An error names what is not one of
/// this tool's outputs.
pub fn flatten(v: &Value) -> Result<BTreeMap<String, f64>, String> {
    let mut out = BTreeMap::new();
    if let Some(rows) = v.get("rows").and_then(Value::as_array) {
        // reproduce --json: the model value of each row.
        for (i, r) in rows.iter().enumerate() {
            let field = |k: &str| r.get(k).map(|x| x.to_string()).unwrap_or_default();
            let (Some(model), true) = (r.get("model"), r.get("metric").is_some()) else {
                return Err(format!(
                    "rows[{i}] is not a reproduce row (no metric or model)"
                ));
            };
            let name = format!(
                "{}|{}|{}|{}",
                field("experiment").trim_matches('"'),
                field("config").trim_matches('"'),
                field("params"),
                field("metric").trim_matches('"')
            );
            if let Some(x) = model.as_f64() {
                out.insert(name, x);
            }
        }
        return Ok(out);
    }
    if v.get("vms").is_some() && v.get("metrics").is_some() {
        walk(v, String::new(), &mut out);
        return Ok(out);
    }
    Err(
        "neither a `run --json` report (vms, metrics) nor a `reproduce --json` output (rows)"
            .into(),
    )
}

fn walk(v: &Value, path: String, out: &mut BTreeMap<String, f64>) {
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    match v {
        Value::Number(n) => {
            if let Some(x) = n.as_f64() {
                out.insert(path, x);
            }
        }
        Value::Bool(b) => {
            out.insert(path, f64::from(u8::from(*b)));
        }
        Value::Object(m) => {
            for (k, x) in m {
                walk(x, join(k), out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                // Exit rows are named by their reason, not their rank
                // (which moves when counts change).
                let key = x
                    .get("reason")
                    .and_then(Value::as_str)
                    .map_or_else(|| i.to_string(), str::to_string);
                walk(x, join(&key), out);
            }
        }
        Value::String(_) | Value::Null => {}
    }
}

/// The names whose values differ between `a` and `b` by more than `tol`
/// relative (0: any difference), or that one side lacks; in name order.
pub fn compare(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>, tol: f64) -> Vec<DiffRow> {
    let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|n| {
            let (x, y) = (a.get(n).copied(), b.get(n).copied());
            let same = match (x, y) {
                (Some(x), Some(y)) => {
                    x == y
                        || (x - y).abs() <= tol * x.abs().max(y.abs())
                        || (x.is_nan() && y.is_nan())
                }
                _ => false,
            };
            (!same).then(|| DiffRow {
                name: n.clone(),
                a: x,
                b: y,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(lat: f64, msr: u64) -> Value {
        json!({
            "schema_version": 1, "scenario": "s", "scheme": "kvm", "seed": 1,
            "metrics": {"udp.latency_mean_us": lat, "udp.received": 100},
            "vms": [{"vm": 0, "exits": [
                {"reason": "MSR_WRITE", "samples": msr},
                {"reason": "HLT", "samples": 5}
            ]}]
        })
    }

    #[test]
    fn runs_differ_by_metric_and_exit_reason_not_by_rank() {
        let a = flatten(&run(10.0, 50)).unwrap();
        assert_eq!(a["vms.0.exits.MSR_WRITE.samples"], 50.0);
        let same = compare(&a, &a, 0.0);
        assert!(same.is_empty());
        // MSR_WRITE now has fewer samples than HLT: its rank moves, its
        // name does not.
        let b = flatten(&run(12.0, 3)).unwrap();
        let d = compare(&a, &b, 0.0);
        let names: Vec<&str> = d.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "metrics.udp.latency_mean_us",
                "vms.0.exits.MSR_WRITE.samples"
            ]
        );
        assert_eq!(d[0].change_pct(), Some(20.0));
        // Within a 25% tolerance only the exit count differs.
        assert_eq!(compare(&a, &b, 0.25).len(), 1);
    }

    #[test]
    fn reproduce_rows_are_named_by_experiment_config_params_metric() {
        let out = |m: f64| {
            json!({"schema_version": 1, "rows": [
                {"experiment": "did.fig4", "config": "kvm", "params": {"rate_pps": 1000},
                 "metric": "exits_per_s", "model": m, "paper": 1.0}
            ]})
        };
        let a = flatten(&out(5.0)).unwrap();
        let b = flatten(&out(6.0)).unwrap();
        let d = compare(&a, &b, 0.0);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].name, "did.fig4|kvm|{\"rate_pps\":1000}|exits_per_s");
        // A name only one side has is a difference.
        let mut c = b.clone();
        c.insert("x".into(), 1.0);
        assert_eq!(compare(&b, &c, 0.0)[0].a, None);
        // Not an output of the tool: an error.
        assert!(flatten(&json!({"a": 1})).is_err());
        assert!(flatten(&json!({"rows": [{"a": 1}]})).is_err());
    }
}
