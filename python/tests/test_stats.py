"""Student-t quantiles and summarize()."""

import math

import exitless
import polars as pl
import pytest
from exitless._stats import t_ppf


# Two-sided 95% critical values from standard t tables.
@pytest.mark.parametrize(
    "df, t",
    [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (9, 2.262), (29, 2.045), (120, 1.980)],
)
def test_t_quantile_matches_tables(df, t):
    assert t_ppf(0.975, df) == pytest.approx(t, abs=5e-4)


def test_t_quantile_symmetry_and_limits():
    assert t_ppf(0.5, 5) == 0.0
    assert t_ppf(0.025, 7) == pytest.approx(-t_ppf(0.975, 7))
    assert t_ppf(0.975, 1e7) == pytest.approx(1.95996, abs=1e-4)  # the normal limit
    assert t_ppf(0.995, 1) == pytest.approx(63.657, abs=1e-3)
    with pytest.raises(ValueError):
        t_ppf(1.0, 3)
    with pytest.raises(ValueError):
        t_ppf(0.9, 0)


def _frame(values_by_point):
    rows = {"point": [], "rate": [], "scheme": [], "seed": [], "metric": [], "value": []}
    for (point, rate), values in values_by_point.items():
        for seed, v in enumerate(values, 1):
            rows["point"].append(point)
            rows["rate"].append(rate)
            rows["scheme"].append("kvm")
            rows["seed"].append(seed)
            rows["metric"].append("m")
            rows["value"].append(v)
    return pl.DataFrame(rows)


def test_summarize_mean_std_and_ci():
    s = exitless.summarize(_frame({(0, 1.0): [1.0, 2.0, 3.0], (1, 2.0): [10.0, 14.0]}))
    assert s.columns == [
        "point",
        "rate",
        "scheme",
        "metric",
        "n",
        "mean",
        "std",
        "ci_half",
        "ci_low",
        "ci_high",
    ]
    a = s.row(0, named=True)
    assert (a["point"], a["rate"], a["n"], a["mean"], a["std"]) == (0, 1.0, 3, 2.0, 1.0)
    assert a["ci_half"] == pytest.approx(4.3027 / math.sqrt(3), rel=1e-4)
    assert a["ci_low"] == pytest.approx(2.0 - a["ci_half"])
    assert a["ci_high"] == pytest.approx(2.0 + a["ci_half"])
    b = s.row(1, named=True)
    assert (b["n"], b["mean"]) == (2, 12.0)
    assert b["ci_half"] == pytest.approx(12.706 * math.sqrt(8) / math.sqrt(2), rel=1e-4)


def test_summarize_other_confidence():
    s = exitless.summarize(_frame({(0, 1.0): [1.0, 2.0, 3.0]}), confidence=0.99)
    assert s["ci_half"][0] == pytest.approx(9.925 / math.sqrt(3), rel=1e-4)


def test_summarize_one_seed_has_no_interval_and_nulls_are_not_counted():
    s = exitless.summarize(_frame({(0, 1.0): [5.0], (1, 1.0): [1.0, None, 3.0]}))
    one, gap = s.row(0, named=True), s.row(1, named=True)
    assert one["n"] == 1 and one["mean"] == 5.0
    assert one["std"] is None and one["ci_half"] is None and one["ci_low"] is None
    assert gap["n"] == 2 and gap["mean"] == 2.0


def test_summarize_rejects_a_frame_that_is_not_a_sweep():
    with pytest.raises(ValueError, match="seed"):
        exitless.summarize(pl.DataFrame({"metric": ["m"], "value": [1.0]}))
