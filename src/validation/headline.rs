//! The headline table of a paper (issue 34): the claims of its abstract
//! and conclusion, each as an *effect* — what the system changes relative
//! to the configuration the paper compares it with — judged by one rule.
//!
//! The rule, everywhere: an effect is the change of the metric from the
//! baseline configuration to the system's, in percentage points when the
//! metric is itself a share of time (`%`: TIG, EHT, CPU), as a percent
//! change otherwise (`100 (system / baseline − 1)`). The model's effect
//! *reproduces* the paper's when the two are within 5 points of each
//! other (below that no effect's size is judged), or have the same sign
//! and a ratio model / paper within [0.67, 1.5]. Otherwise it is
//! *smaller* or *larger* (same sign), *opposite* (the other sign), or
//! *no effect* (under 1 point or percent where the paper has one). With several seeds the mean's effect
//! must reproduce and so must at least half of the seeds' own effects,
//! else the verdict is *unsteady*.

use super::{to_json, ReproduceError, Row};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Ratio band of the rule.
pub const RATIO_LO: f64 = 0.67;
/// Ratio band of the rule.
pub const RATIO_HI: f64 = 1.5;
/// Below this distance (points, or percent) two effects agree.
pub const RESOLUTION: f64 = 5.0;
/// Below this size (points, or percent) a model effect is no effect.
pub const NO_EFFECT: f64 = 1.0;

/// One claim, as `[[headline]]` in `validation/<paper>/experiments.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Headline {
    /// Short id, e.g. `did.cyclictest`.
    pub id: String,
    /// The claim in words.
    pub claim: String,
    /// Where in the paper.
    pub source: String,
    /// The experiment whose rows give the model's effect.
    pub experiment: String,
    /// The metric compared.
    pub metric: String,
    /// Parameter values of the compared rows (empty = the experiment has
    /// none).
    #[serde(default)]
    pub params: BTreeMap<String, toml::Value>,
    /// The configuration with the system.
    pub system: String,
    /// The configuration the paper compares it with.
    pub baseline: String,
    /// The paper's value of the metric under the baseline...
    #[serde(default)]
    pub paper_baseline: Option<f64>,
    /// ...and under the system; or, instead of the two values, the
    /// paper's effect as the rule defines it.
    #[serde(default)]
    pub paper_system: Option<f64>,
    /// The paper's effect, when it states only that (e.g. "+69%").
    #[serde(default)]
    pub paper_effect: Option<f64>,
    /// Why the paper's number is missing (withheld, not measured).
    #[serde(default)]
    pub withheld: Option<String>,
    /// Why the model cannot run the comparison yet (a configuration that
    /// does not exist); the row is listed as not run.
    #[serde(default)]
    pub not_run: Option<String>,
    /// Known cause of a gap, or how to read the row.
    #[serde(default)]
    pub note: Option<String>,
}

/// How a model effect compares with the paper's.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Same effect by the rule.
    Reproduced,
    /// The mean reproduces, but fewer than half of the seeds do.
    Unsteady,
    /// Same sign, under 0.67 of the paper's size.
    Smaller,
    /// Same sign, over 1.5 times the paper's size.
    Larger,
    /// The other sign.
    Opposite,
    /// Under 1 point or percent, where the paper has an effect.
    NoEffect,
    /// The paper gives no number: the model's effect is shown alone.
    NoNumber,
    /// The comparison cannot be run yet.
    NotRun,
}

impl Verdict {
    /// As the tables print it.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Reproduced => "reproduced",
            Verdict::Unsteady => "unsteady",
            Verdict::Smaller => "smaller",
            Verdict::Larger => "larger",
            Verdict::Opposite => "opposite",
            Verdict::NoEffect => "no effect",
            Verdict::NoNumber => "no number",
            Verdict::NotRun => "not run",
        }
    }

    /// All verdicts, in the order summaries count them.
    pub const ALL: [Verdict; 8] = [
        Verdict::Reproduced,
        Verdict::Unsteady,
        Verdict::Smaller,
        Verdict::Larger,
        Verdict::Opposite,
        Verdict::NoEffect,
        Verdict::NoNumber,
        Verdict::NotRun,
    ];
}

/// How an effect is expressed.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EffectUnit {
    /// `100 (system / baseline − 1)`.
    PercentChange,
    /// `system − baseline`, for a metric that is a share of time in %.
    Points,
}

impl EffectUnit {
    fn of(unit: &str) -> Self {
        if unit == "%" {
            EffectUnit::Points
        } else {
            EffectUnit::PercentChange
        }
    }

    fn effect(self, system: f64, baseline: f64) -> Option<f64> {
        match self {
            EffectUnit::Points => Some(system - baseline),
            EffectUnit::PercentChange if baseline != 0.0 => Some(100.0 * (system / baseline - 1.0)),
            EffectUnit::PercentChange => None,
        }
    }

    /// As the tables print an effect in this unit.
    pub fn suffix(self) -> &'static str {
        match self {
            EffectUnit::PercentChange => "%",
            EffectUnit::Points => " pt",
        }
    }
}

/// One row of the headline table.
#[derive(Clone, Debug, Serialize)]
pub struct HeadlineRow {
    /// Id.
    pub id: String,
    /// The claim.
    pub claim: String,
    /// Where in the paper.
    pub source: String,
    /// Experiment, metric and the two configurations.
    pub experiment: String,
    /// Metric.
    pub metric: String,
    /// Parameters.
    pub params: BTreeMap<String, serde_json::Value>,
    /// System configuration.
    pub system: String,
    /// Baseline configuration.
    pub baseline: String,
    /// Unit of the metric.
    pub unit: String,
    /// How the effect is expressed.
    pub effect_unit: EffectUnit,
    /// The paper's values, when it gives them.
    pub paper_baseline: Option<f64>,
    /// The paper's value under the system.
    pub paper_system: Option<f64>,
    /// The paper's effect.
    pub paper_effect: Option<f64>,
    /// The model's values (means, with several seeds).
    pub model_baseline: Option<f64>,
    /// The model's value under the system.
    pub model_system: Option<f64>,
    /// The model's effect.
    pub model_effect: Option<f64>,
    /// Model effect / paper effect.
    pub ratio: Option<f64>,
    /// Whether the two effects have the same sign.
    pub same_direction: Option<bool>,
    /// The verdict by the rule.
    pub verdict: Verdict,
    /// With several seeds: (seeds whose own effect reproduces, seeds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seeds_reproduced: Option<(usize, usize)>,
    /// Why the paper's number or the model's run is missing, or a known
    /// cause of a gap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The verdict of one model effect against the paper's, by the rule.
pub fn judge(model: f64, paper: f64) -> Verdict {
    if (model - paper).abs() <= RESOLUTION {
        return Verdict::Reproduced;
    }
    if model.abs() < NO_EFFECT {
        // The paper's effect is over the resolution, the model's is none.
        return Verdict::NoEffect;
    }
    if paper == 0.0 {
        // Parity claimed, an effect found.
        return Verdict::Larger;
    }
    if model.signum() != paper.signum() {
        return Verdict::Opposite;
    }
    let q = model / paper;
    if q < RATIO_LO {
        Verdict::Smaller
    } else if q > RATIO_HI {
        Verdict::Larger
    } else {
        Verdict::Reproduced
    }
}

/// The headline table of the rows of one `reproduce` (only the headlines
/// whose experiment ran, when `--only` narrowed it).
pub fn table(headlines: &[Headline], rows: &[Row]) -> Result<Vec<HeadlineRow>, ReproduceError> {
    let mut out = Vec::new();
    for h in headlines {
        let params: BTreeMap<String, serde_json::Value> = h
            .params
            .iter()
            .map(|(k, v)| (k.clone(), to_json(v)))
            .collect();
        let find = |config: &str| {
            rows.iter().find(|r| {
                r.experiment == h.experiment
                    && r.config == config
                    && r.metric == h.metric
                    && r.params == params
            })
        };
        let ran = rows.iter().any(|r| r.experiment == h.experiment);
        let (sys, base) = (find(&h.system), find(&h.baseline));
        if h.not_run.is_none() && !ran {
            continue;
        }
        let (paper_effect_unit, unit) = match (sys, base) {
            (Some(s), _) => (EffectUnit::of(&s.unit), s.unit.clone()),
            (None, Some(b)) => (EffectUnit::of(&b.unit), b.unit.clone()),
            (None, None) => (EffectUnit::PercentChange, String::new()),
        };
        let paper_effect = match (h.paper_effect, h.paper_system, h.paper_baseline) {
            (Some(e), _, _) => Some(e),
            (None, Some(s), Some(b)) => paper_effect_unit.effect(s, b),
            _ => None,
        };
        let mut row = HeadlineRow {
            id: h.id.clone(),
            claim: h.claim.clone(),
            source: h.source.clone(),
            experiment: h.experiment.clone(),
            metric: h.metric.clone(),
            params,
            system: h.system.clone(),
            baseline: h.baseline.clone(),
            unit,
            effect_unit: paper_effect_unit,
            paper_baseline: h.paper_baseline,
            paper_system: h.paper_system,
            paper_effect,
            model_baseline: base.map(|r| r.model),
            model_system: sys.map(|r| r.model),
            model_effect: None,
            ratio: None,
            same_direction: None,
            verdict: Verdict::NotRun,
            seeds_reproduced: None,
            note: h
                .not_run
                .clone()
                .or_else(|| h.withheld.clone())
                .or_else(|| h.note.clone()),
        };
        let (Some(s), Some(b)) = (sys, base) else {
            if h.not_run.is_none() {
                return Err(ReproduceError::Bad(format!(
                    "headline {}: experiment {} has no rows of metric {} for {} (and {}) at {:?}",
                    h.id, h.experiment, h.metric, h.system, h.baseline, h.params
                )));
            }
            out.push(row);
            continue;
        };
        let unit = EffectUnit::of(&s.unit);
        row.model_effect = unit.effect(s.model, b.model);
        row.verdict = match (row.model_effect, paper_effect) {
            (Some(m), Some(p)) => {
                row.ratio = (p != 0.0).then_some(m / p);
                row.same_direction = Some(m.signum() == p.signum() && m != 0.0 && p != 0.0);
                judge(m, p)
            }
            (Some(_), None) => Verdict::NoNumber,
            (None, _) => Verdict::Opposite,
        };
        // Spread decides: each seed's own effect, judged by the same rule.
        if let (Some(ss), Some(bs), Some(p)) = (&s.spread, &b.spread, paper_effect) {
            let n = ss.values.len().min(bs.values.len());
            let k = ss
                .values
                .iter()
                .zip(&bs.values)
                .filter_map(|(&x, &y)| unit.effect(x, y))
                .filter(|&e| judge(e, p) == Verdict::Reproduced)
                .count();
            row.seeds_reproduced = Some((k, n));
            if row.verdict == Verdict::Reproduced && 2 * k < n {
                row.verdict = Verdict::Unsteady;
            }
        }
        out.push(row);
    }
    Ok(out)
}

/// Counts of each verdict, as one line ("3 reproduced, 2 smaller, ...").
pub fn summary(rows: &[HeadlineRow]) -> String {
    let parts: Vec<String> = Verdict::ALL
        .iter()
        .filter_map(|v| {
            let n = rows.iter().filter(|r| r.verdict == *v).count();
            (n > 0).then(|| format!("{n} {}", v.name()))
        })
        .collect();
    format!("{} headline claims: {}", rows.len(), parts.join(", "))
}

/// An effect as the tables print it (`−70.1%`, `+24.2 pt`, `-`).
pub fn effect_text(e: Option<f64>, unit: EffectUnit) -> String {
    match e {
        Some(x) => format!("{x:+.1}{}", unit.suffix()),
        None => "-".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_judges_size_and_direction() {
        // 14 -> 2.9 us is -79%; a model at -70% is within the ratio band.
        assert_eq!(judge(-70.1, -79.3), Verdict::Reproduced);
        // +33% against +231%: same direction, a seventh of the size.
        assert_eq!(judge(33.0, 231.0), Verdict::Smaller);
        // +206% against +63%.
        assert_eq!(judge(206.0, 63.0), Verdict::Larger);
        // -3% against +42%.
        assert_eq!(judge(-3.0, 42.0), Verdict::Opposite);
        // No effect where the paper has one.
        assert_eq!(judge(0.0, 69.0), Verdict::NoEffect);
        assert_eq!(judge(0.002, 69.0), Verdict::NoEffect);
        assert_eq!(judge(-0.3, -29.6), Verdict::NoEffect);
        // Within the resolution, whatever the ratio: 96% of native
        // against 100%.
        assert_eq!(judge(0.0, -4.0), Verdict::Reproduced);
        // Parity claimed, an effect found.
        assert_eq!(judge(12.0, 0.0), Verdict::Larger);
    }

    fn row(config: &str, model: f64, unit: &str, seeds: Option<Vec<f64>>) -> Row {
        Row {
            experiment: "x.e".into(),
            config: config.into(),
            params: BTreeMap::new(),
            metric: "m".into(),
            unit: unit.into(),
            model,
            paper: None,
            tolerance: None,
            within: None,
            kind: None,
            against: None,
            calibrated_to: None,
            violations: 0,
            note: None,
            table: false,
            spread: seeds.map(|values| super::super::Spread {
                seeds: values.len(),
                std: 0.0,
                ci_half: 0.0,
                min: 0.0,
                max: 0.0,
                within_seeds: None,
                values,
            }),
        }
    }

    fn headline(text: &str) -> Headline {
        toml::from_str(&format!(
            "id = \"h\"\nclaim = \"c\"\nsource = \"s\"\nexperiment = \"x.e\"\nmetric = \"m\"\n\
             system = \"sys\"\nbaseline = \"base\"\n{text}"
        ))
        .expect("headline")
    }

    #[test]
    fn effects_are_percent_changes_or_points_by_the_metric_unit() {
        let rows = vec![row("base", 6.39, "us", None), row("sys", 1.91, "us", None)];
        let t = table(
            &[headline("paper_baseline = 14\npaper_system = 2.9")],
            &rows,
        )
        .expect("ok");
        let h = &t[0];
        assert!((h.paper_effect.unwrap() - 100.0 * (2.9 / 14.0 - 1.0)).abs() < 1e-9);
        assert!((h.model_effect.unwrap() - 100.0 * (1.91 / 6.39 - 1.0)).abs() < 1e-9);
        assert_eq!(h.verdict, Verdict::Reproduced);
        assert_eq!(h.same_direction, Some(true));
        // A share of time: points, not percent.
        let rows = vec![row("base", 75.8, "%", None), row("sys", 99.97, "%", None)];
        let t = table(
            &[headline("paper_baseline = 81.55\npaper_system = 99.8")],
            &rows,
        )
        .unwrap();
        assert_eq!(t[0].effect_unit, EffectUnit::Points);
        assert!((t[0].paper_effect.unwrap() - 18.25).abs() < 1e-9);
        assert!((t[0].model_effect.unwrap() - 24.17).abs() < 1e-9);
        assert_eq!(t[0].verdict, Verdict::Reproduced);
    }

    #[test]
    fn seeds_that_mostly_miss_make_a_reproduced_mean_unsteady() {
        // Paper +80%. Means 100 -> 182 (+82%) but the seeds' own effects
        // are +20, +60, +166: one of three reproduces.
        let rows = vec![
            row("base", 100.0, "1/s", Some(vec![100.0, 100.0, 100.0])),
            row("sys", 182.0, "1/s", Some(vec![120.0, 160.0, 266.0])),
        ];
        let t = table(&[headline("paper_effect = 80")], &rows).unwrap();
        assert_eq!(t[0].seeds_reproduced, Some((1, 3)));
        assert_eq!(t[0].verdict, Verdict::Unsteady);
    }

    #[test]
    fn a_missing_number_or_run_is_said_and_a_wrong_reference_refused() {
        let rows = vec![row("base", 10.0, "us", None), row("sys", 5.0, "us", None)];
        let t = table(&[headline("withheld = \"values withheld\"")], &rows).unwrap();
        assert_eq!(t[0].verdict, Verdict::NoNumber);
        assert_eq!(t[0].model_effect, Some(-50.0));
        let mut h = headline("not_run = \"no such configuration yet\"");
        h.experiment = "x.none".into();
        let t = table(&[h], &rows).unwrap();
        assert_eq!(t[0].verdict, Verdict::NotRun);
        assert_eq!(t[0].note.as_deref(), Some("no such configuration yet"));
        // A headline naming a config its experiment does not run is an
        // error in the experiment file, not a quiet "not run".
        let mut h = headline("paper_effect = 10");
        h.system = "nope".into();
        assert!(table(&[h], &rows).is_err());
        // With `--only` narrowing the run, headlines of other experiments
        // are left out.
        let mut h = headline("paper_effect = 10");
        h.experiment = "x.other".into();
        assert!(table(&[h], &rows).unwrap().is_empty());
    }
}
