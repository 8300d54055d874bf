"""Pictures and an HTML report of sweeps, runs and ``reproduce`` rows.

>>> import exitless, exitless.report as er
>>> df = exitless.sweep("validation/did/fig4.toml", grid={"rate_pps": [1e5, 6e5]},
...                     schemes=["kvm", "apicv", "did"], seeds=2)      # doctest: +SKIP
>>> er.exit_breakdown(df).savefig("exits.png")                        # doctest: +SKIP
>>> er.write_html("fig4.html", er.build(df))                          # doctest: +SKIP

Inputs, everywhere ``data`` is taken:

- a sweep frame (:func:`exitless.sweep`, or one read back from the file
  :func:`exitless.write_results` wrote): long form with ``scheme``, ``seed``,
  ``metric``, ``value``, usually ``point`` and one column per grid key;
- run reports (:func:`exitless.run`'s dicts, or ``exitless run --json``
  output), one or a list: reports with the same scenario and scheme are the
  seeds of one point. A report does not name its config (``sriov`` and
  ``pv`` are both scheme ``kvm``), so to tell such runs apart pass
  ``{label: report or [reports]}``: the label takes the scheme's place;
- for :func:`model_vs_paper` and :func:`model_vs_paper_table`: the rows of
  ``exitless reproduce <paper> --json`` (a list of dicts, or a frame).

Figures are :class:`matplotlib.figure.Figure` objects drawn on the Agg canvas
(no pyplot, no global backend switch: safe in scripts, servers and
notebooks). Means and 95% confidence intervals across seeds come from
:func:`exitless.summarize`. The command line::

    python -m exitless.report results.parquet|results.csv|reproduce.json \\
        --html out.html [--png DIR]

Needs matplotlib: ``pip install matplotlib``, or from a clone
``pip install './python[plot]'`` (the package is not on PyPI).
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import polars as pl

try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import (
        FixedLocator,
        FuncFormatter,
        LogLocator,
        NullFormatter,
        NullLocator,
    )
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"exitless.report needs matplotlib ({e}): pip install matplotlib (or, from a clone, pip install './python[plot]')"
    ) from None

from ._sweep import RESERVED, _zero_when_absent, flatten, summarize

__all__ = [
    "ReportError",
    "Report",
    "as_frame",
    "exit_breakdown",
    "vms_of",
    "FigureGroup",
    "latency_cdf",
    "latency_families",
    "metric_vs_param",
    "model_vs_paper",
    "model_vs_paper_table",
    "build",
    "write_html",
    "write_png",
    "load",
    "main",
]

#: Columns of ``exitless reproduce --json`` rows.
REPRODUCE_COLUMNS = (
    "experiment",
    "config",
    "params",
    "metric",
    "unit",
    "model",
    "paper",
    "tolerance",
    "within",
)
#: Columns a sweep frame must have (besides grid columns and ``point``).
SWEEP_COLUMNS = ("scheme", "seed", "metric", "value")

Data = Union[pl.DataFrame, Mapping[str, Any], Sequence[Mapping[str, Any]]]
"""A sweep frame, a run report, a list of them, or {label: report(s)}."""

# Colours: tab10 then tab20's light halves, stable per name within a figure.
_PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
]
_OTHER_COLOUR = "#d9d9d9"
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "h"]


class ReportError(ValueError):
    """Input the report cannot use (wrong columns, unknown metric, bad file)."""


# --------------------------------------------------------------------------
# Inputs


def _is_report(r: Any) -> bool:
    return isinstance(r, Mapping) and "vms" in r


def _reports_frame(
    reports: Sequence[Mapping[str, Any]], labels: Sequence[str] | None = None
) -> pl.DataFrame:
    """Run reports as a sweep frame: one point per (scenario, label), the
    label being the report's scheme unless given."""
    scenarios = {str(r.get("scenario", "")) for r in reports}
    keys: dict[tuple[str, str], int] = {}
    seen: set[tuple[str, str, int]] = set()
    cols: dict[str, list[Any]] = {c: [] for c in ("point", "scenario", *SWEEP_COLUMNS)}
    for r in reports:
        if not _is_report(r):
            raise ReportError("expected run reports (dicts with `vms`, as exitless.run returns)")
    flats = [flatten(r) for r in reports]
    all_names = {m for f in flats for m in f}
    for i, (r, flat) in enumerate(zip(reports, flats)):
        label = str(r.get("scheme", "")) if labels is None else labels[i]
        key = (str(r.get("scenario", "")), label)
        seed = int(r.get("seed", 0))
        if (*key, seed) in seen:
            # Not seeds of one point: e.g. configs sriov and pv are both
            # scheme kvm, and a report does not name its config.
            raise ReportError(
                f"two run reports of scenario `{key[0]}`, "
                f"{'scheme' if labels is None else 'label'} `{label}`, seed {seed}: "
                "reports of one scheme are taken as seeds of one point; pass "
                "{label: report or [reports]} to tell runs apart (e.g. by config)"
            )
        seen.add((*key, seed))
        point = keys.setdefault(key, len(keys))
        # As in a sweep: exits a run did not take are 0, other values null.
        for m in all_names - flat.keys():
            flat[m] = 0.0 if _zero_when_absent(m) else None
        names = sorted(flat)
        cols["point"].extend([point] * len(names))
        cols["scenario"].extend([key[0]] * len(names))
        cols["scheme"].extend([key[1]] * len(names))
        cols["seed"].extend([int(r.get("seed", 0))] * len(names))
        cols["metric"].extend(names)
        cols["value"].extend(flat[m] for m in names)
    df = pl.DataFrame(
        cols,
        schema={
            "point": pl.Int64,
            "scenario": pl.String,
            "scheme": pl.String,
            "seed": pl.UInt64,
            "metric": pl.String,
            "value": pl.Float64,
        },
    )
    return df if len(scenarios) > 1 else df.drop("scenario")


def as_frame(data: Data) -> pl.DataFrame:
    """A sweep frame from a sweep frame or from run reports (see the module
    docstring). Raises :class:`ReportError` for anything else."""
    if isinstance(data, pl.DataFrame):
        missing = [c for c in SWEEP_COLUMNS if c not in data.columns]
        if missing:
            if all(c in data.columns for c in ("experiment", "model", "paper")):
                raise ReportError(
                    "these are `reproduce` rows, not a sweep: use model_vs_paper / "
                    "model_vs_paper_table"
                )
            raise ReportError(
                f"not a sweep frame: no column {', '.join(f'`{c}`' for c in missing)} "
                f"(has {', '.join(data.columns) or 'no columns'})"
            )
        if "point" not in data.columns:
            keys = [*(c for c in data.columns if c not in RESERVED), "scheme"]
            points = (
                data.select(keys)
                .unique(maintain_order=True)
                .with_row_index("point")
                .with_columns(pl.col("point").cast(pl.Int64))
            )
            data = data.join(points, on=keys, how="left")
        return data
    if isinstance(data, Mapping):
        if _is_report(data):
            return _reports_frame([data])
        # {label: report or [reports]}: the label stands for the scheme.
        reps: list[Mapping[str, Any]] = []
        labels: list[str] = []
        for label, v in data.items():
            group = [v] if _is_report(v) else v
            if not isinstance(group, Sequence) or not all(_is_report(r) for r in group):
                raise ReportError(
                    f"label `{label}`: expected a run report or a list of them "
                    "(dicts with `vms`, as exitless.run returns)"
                )
            reps.extend(group)
            labels.extend([str(label)] * len(group))
        if not reps:
            raise ReportError("no run reports (empty dict)")
        return _reports_frame(reps, labels)
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        if not data:
            raise ReportError("no run reports (empty list)")
        return _reports_frame(data)
    raise ReportError(
        f"expected a sweep DataFrame or run reports (dicts), not {type(data).__name__}"
    )


def _grid_keys(df: pl.DataFrame) -> list[str]:
    return [c for c in df.columns if c not in RESERVED]


def _summary(df: pl.DataFrame, metrics: Iterable[str]) -> pl.DataFrame:
    wanted = list(metrics)
    return summarize(df.filter(pl.col("metric").is_in(wanted))).sort("point", maintain_order=True)


# --------------------------------------------------------------------------
# Labels


def _num(v: Any) -> str:
    """Compact number: 100000 -> 100k, 2.5e6 -> 2.5M, 0.05 -> 0.05."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return str(v)
    a = abs(v)
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= scale:
            return f"{v / scale:.3g}{suffix}"
    return f"{v:.3g}"


def _point_label(row: Mapping[str, Any], keys: Sequence[str]) -> str:
    return ", ".join(f"{k}={_num(row[k])}" for k in keys)


_UNITS = (
    ("_us", "µs"),
    ("_ms", "ms"),
    ("_ns", "ns"),
    ("_s", "s"),
    ("_pct", "%"),
)


def _axis_label(metric: str) -> str:
    if metric == "exits_per_s" or metric.startswith("exits_per_s."):
        return f"{metric} (exits/s)"
    for suffix, unit in _UNITS:
        if metric.endswith(suffix):
            return f"{metric} ({unit})"
    return metric


def _new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _spans_decades(values: Iterable[float], ratio: float) -> bool:
    vs = [v for v in values if v is not None and math.isfinite(v)]
    if not vs or min(vs) <= 0:
        return False
    return max(vs) / min(vs) >= ratio


def _si_formatter() -> FuncFormatter:
    return FuncFormatter(lambda v, _pos: _num(v))


def _log_axis(axis: Any) -> None:
    """A log axis labelled at 1, 2 and 5 × 10^k in SI form, minor ticks
    unlabelled: matplotlib's default labels minor ticks over a short range,
    and they ran together ("3×10¹4×10¹")."""
    axis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(_si_formatter())
    axis.set_minor_formatter(NullFormatter())


# --------------------------------------------------------------------------
# Exits by reason


def exit_breakdown(
    data: Data,
    *,
    max_reasons: int = 8,
    share: bool = True,
    title: str | None = None,
    vm: int | str = 0,
) -> Figure:
    """Stacked bars of exits/s by exit reason: one bar per scheme and grid
    point, the mean across seeds of each ``exits_per_s.<REASON>`` metric
    of VM ``vm`` (0, the default: the plain names; N: ``vmN.``; ``"all"``:
    the sums over every VM, ``all.``).

    The ``max_reasons`` reasons with the most exits overall are drawn as
    they are, the rest summed as ``other``. Each bar's total is written above
    it, so a scheme with few exits next to one with many is still read off.
    With ``share`` a second panel shows each bar as 100%: the mix of reasons
    whatever the total. Every segment (a ``Rectangle`` in ``ax.patches``)
    has the gid ``"<bar label>|<reason>"``; its height is that mean.
    """
    df = as_frame(data)
    prefix = _vm_prefix(vm) + "exits_per_s."
    reason_metrics = sorted(m for m in df["metric"].unique().to_list() if m.startswith(prefix))
    if not reason_metrics:
        raise ReportError(f"no `{prefix}<REASON>` metrics in the data")
    s = _summary(df, reason_metrics)
    keys = _grid_keys(df)
    # Bars in point order: grid point groups, schemes within.
    bars = df.select("point", *keys, "scheme").unique(maintain_order=True).sort("point")
    bar_rows = bars.rows(named=True)
    means: dict[tuple[int, str], float] = {
        (p, m): (v if v is not None else 0.0)
        for p, m, v in s.select("point", "metric", "mean").rows()
    }
    totals_by_reason = {
        m: sum(means.get((b["point"], m), 0.0) for b in bar_rows) for m in reason_metrics
    }
    ranked = [m for m in sorted(reason_metrics, key=lambda m: -totals_by_reason[m])]
    ranked = [m for m in ranked if totals_by_reason[m] > 0] or ranked[:1]
    shown = ranked[:max_reasons]
    rest = [m for m in reason_metrics if m not in shown]
    layers: list[tuple[str, list[float]]] = [
        (m.removeprefix(prefix), [means.get((b["point"], m), 0.0) for b in bar_rows])
        for m in shown
    ]
    if rest:
        layers.append(
            ("other", [sum(means.get((b["point"], m), 0.0) for m in rest) for b in bar_rows])
        )
    # x positions: a gap between grid point groups.
    group_of: list[tuple[Any, ...]] = [tuple(b[k] for k in keys) for b in bar_rows]
    xs: list[float] = []
    x = 0.0
    for i, g in enumerate(group_of):
        if i > 0 and g != group_of[i - 1]:
            x += 0.6
        xs.append(x)
        x += 1.0
    labels = [b["scheme"] for b in bar_rows]
    gids = [
        (f"{b['scheme']}, {_point_label(b, keys)}" if keys else str(b["scheme"])) for b in bar_rows
    ]
    totals = [sum(layer[1][i] for layer in layers) for i in range(len(bar_rows))]

    # Side by side; one above the other when there are many bars.
    npanels = 2 if share else 1
    stacked = npanels == 2 and len(bar_rows) > 8
    width = max(6.0, 1.6 + 0.55 * len(bar_rows)) * (1.7 if npanels == 2 and not stacked else 1.0)
    fig = _new_figure(min(width + 2.0, 22.0), 9.0 if stacked else 4.8)
    grid = (
        fig.subplots(npanels, 1, squeeze=False)
        if stacked
        else fig.subplots(1, npanels, squeeze=False)
    )
    axes = [a for row in grid for a in row]
    colours = {
        name: (_OTHER_COLOUR if name == "other" else _PALETTE[i % len(_PALETTE)])
        for i, (name, _) in enumerate(layers)
    }
    for panel, ax in enumerate(axes):
        bottom = [0.0] * len(bar_rows)
        for name, heights in layers:
            if panel == 1:
                heights = [100.0 * h / t if t > 0 else 0.0 for h, t in zip(heights, totals)]
            cont = ax.bar(xs, heights, bottom=bottom, width=0.8, color=colours[name], label=name)
            for patch, gid in zip(cont.patches, gids):
                patch.set_gid(f"{gid}|{name}" if panel == 0 else f"share:{gid}|{name}")
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_xticks(xs, labels, rotation=45 if len(bar_rows) > 8 else 0)
        ax.set_xlim(min(xs) - 0.7, max(xs) + 0.7)
        if keys:
            centers, glabels = [], []
            for g in dict.fromkeys(group_of):
                idx = [i for i, gg in enumerate(group_of) if gg == g]
                centers.append(sum(xs[i] for i in idx) / len(idx))
                glabels.append(_point_label(dict(zip(keys, g)), keys))
            sec = ax.secondary_xaxis(location=-0.09 if len(bar_rows) <= 8 else -0.2)
            sec.set_ticks(centers, glabels)
            sec.tick_params(length=0)
            sec.spines["bottom"].set_visible(False)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        if panel == 0:
            ax.set_ylabel("exits/s (mean over seeds)")
            ax.yaxis.set_major_formatter(_si_formatter())
            top = max(totals) if totals and max(totals) > 0 else 1.0
            ax.set_ylim(0, top * 1.12)
            for xx, t in zip(xs, totals):
                ax.annotate(
                    _num(t),
                    (xx, t),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
            ax.set_title("exits/s by reason")
        else:
            ax.set_ylabel("share of exits (%)")
            ax.set_ylim(0, 100)
            for xx, t in zip(xs, totals):
                if t <= 0:
                    ax.text(xx, 2, "no exits", ha="center", va="bottom", fontsize=8, rotation=90)
            ax.set_title("mix of reasons")
    handles = [Patch(color=colours[name], label=name) for name, _ in reversed(layers)]
    axes[0 if stacked else -1].legend(
        handles=handles,
        title="exit reason",
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        title_fontsize=9,
        frameon=False,
    )
    fig.suptitle(title or f"VM exits by reason ({_vm_label(vm)})")
    return fig


def _vm_prefix(vm: int | str) -> str:
    """The metric prefix of VM ``vm``: VM 0's names are plain, VM N's
    ``vmN.``, the aggregate over VMs ``all.``."""
    if vm == "all":
        return "all."
    if isinstance(vm, int) and not isinstance(vm, bool) and vm >= 0:
        return "" if vm == 0 else f"vm{vm}."
    raise ReportError(f"vm: expected a VM index (0, 1, ...) or \"all\", not {vm!r}")


def _vm_label(vm: int | str) -> str:
    return "all VMs" if vm == "all" else f"VM {vm}"


_VM_METRIC = re.compile(r"^vm(\d+)\.")

#: Most VMs a selector offers (with "all VMs" first); a report of a
#: 256-VM run shows the aggregate and the first VMs.
MAX_VM_OPTIONS = 16


def vms_of(data: Data) -> list[int | str]:
    """The VMs whose metrics ``data`` holds, ``"all"`` first when the runs
    report aggregates over VMs, then VM indices in order."""
    names = as_frame(data)["metric"].unique().to_list()
    # VM 0's names are the plain ones (neither `all.` nor `vmN.`).
    plain = any(not n.startswith("all.") and not _VM_METRIC.match(n) for n in names)
    ids = {0} if plain else set()
    ids |= {int(m.group(1)) for n in names if (m := _VM_METRIC.match(n))}
    out: list[int | str] = ["all"] if any(n.startswith("all.") for n in names) else []
    return out + sorted(ids)


@dataclass
class FigureGroup:
    """One chart for several VMs: the HTML shows one option at a time with
    a selector (radio buttons; no script), PNG output writes each."""

    options: list[tuple[str, Figure]] = field(default_factory=list)


# --------------------------------------------------------------------------
# Latency percentile curves

_PCTL = re.compile(r"^(?P<stem>.*?)(?P<sep>[._]?)p(?P<digits>\d+)_(?P<unit>[a-z]+)$")


def _percentile_of(digits: str) -> float:
    """``50`` -> 50, ``999`` -> 99.9, ``9999`` -> 99.99."""
    return float(digits) if len(digits) <= 2 else float(f"{digits[:2]}.{digits[2:]}")


def latency_families(data: Data) -> dict[str, dict[float, str]]:
    """Latency metrics reported at several percentiles, by family:
    ``{"udp.latency_p*_us": {50.0: "udp.latency_p50_us", 90.0: ..., 99.9:
    "udp.latency_p999_us"}}``. A family needs at least two percentiles
    (``irq.descheduled_delay_p99_us`` alone is not a curve)."""
    df = as_frame(data)
    fams: dict[str, dict[float, str]] = {}
    for m in sorted(df["metric"].unique().to_list()):
        hit = _PCTL.match(m)
        if not hit:
            continue
        name = f"{hit['stem']}{hit['sep']}p*_{hit['unit']}"
        fams.setdefault(name, {})[_percentile_of(hit["digits"])] = m
    return {k: dict(sorted(v.items())) for k, v in fams.items() if len(v) >= 2}


def _nines(p: Any) -> Any:
    import numpy as np

    q = np.clip(np.asarray(p, dtype=float), 0.0, 99.999)
    return -np.log10(1.0 - q / 100.0)


def _nines_inv(y: Any) -> Any:
    import numpy as np

    return 100.0 * (1.0 - np.power(10.0, -np.asarray(y, dtype=float)))


def latency_cdf(
    data: Data,
    family: str | None = None,
    *,
    log_x: bool | None = None,
    title: str | None = None,
) -> Figure:
    """Latency percentile curves, one line per scheme (a panel per grid
    point): the mean across seeds of each percentile the runs report, with
    horizontal 95% CI bars across seeds.

    The runs report summary percentiles, not whole histograms (p50, p90,
    p99 and p99.9 of cyclictest's ``latency_*_us``, of ``udp.latency``,
    ``netpipe.half_rtt``, ``fio.completion``; memcached adds p95), so this
    is the CDF sampled at those quantiles: latency on x (log when it spans a
    decade or more), percentile on y, on a "nines" scale (p50, p90, p99,
    p99.9 evenly spaced) so the tail is visible. Points are joined by
    straight lines; nothing is drawn between them that was not measured.

    ``family``: a key of :func:`latency_families` (``"cyclictest.latency_p*_us"``) or
    its stem (``"cyclictest.latency"``, ``"udp.latency"``); needed when the data has
    several.
    """
    df = as_frame(data)
    fams = latency_families(df)
    if not fams:
        raise ReportError(
            "no latency percentile metrics (`<name>_p50_us`, `<name>_p99_us`, ...) in the data"
        )
    if family is None:
        if len(fams) > 1:
            raise ReportError(
                f"several latency metrics: pass family= one of {', '.join(sorted(fams))}"
            )
        family = next(iter(fams))
    chosen = fams.get(family)
    if chosen is None:
        stem = {k.split("p*_")[0].rstrip("._"): k for k in fams}
        if family.rstrip("._") in stem:
            family = stem[family.rstrip("._")]
            chosen = fams[family]
        else:
            raise ReportError(
                f"no latency family `{family}`: the data has {', '.join(sorted(fams)) or 'none'}"
            )
    pct_of = {m: p for p, m in chosen.items()}
    s = _summary(df, chosen.values())
    keys = _grid_keys(df)
    groups = list(dict.fromkeys(tuple(r) for r in s.select(keys).rows())) if keys else [()]
    n = len(groups)
    ncols = n if n <= 3 else min(3, math.ceil(math.sqrt(n)))
    nrows = math.ceil(n / ncols)
    fig = _new_figure(min(4.6 * ncols + 1.8, 20.0), 3.8 * nrows + 0.6)
    # x not shared: latencies at different grid points can differ tenfold.
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    schemes = list(dict.fromkeys(s["scheme"].to_list()))
    colours = {sch: _PALETTE[i % len(_PALETTE)] for i, sch in enumerate(schemes)}
    unit = _axis_label(family).rsplit(" ", 1)[-1] if "(" in _axis_label(family) else ""
    all_x: list[float] = []
    for gi, g in enumerate(groups):
        ax = axes[gi // ncols][gi % ncols]
        sub = s
        for k, v in zip(keys, g):
            sub = sub.filter(pl.col(k) == v)
        for sch in schemes:
            rows = sub.filter(pl.col("scheme") == sch)
            if rows.is_empty():
                continue
            pts = sorted(
                (pct_of[m], mean, ci)
                for m, mean, ci in rows.select("metric", "mean", "ci_half").rows()
                if mean is not None
            )
            if not pts:
                continue
            ps = [p for p, _, _ in pts]
            xv = [x for _, x, _ in pts]
            err = [c if c is not None else 0.0 for _, _, c in pts]
            all_x.extend(xv)
            si = schemes.index(sch)
            ax.errorbar(
                xv,
                ps,
                xerr=err if any(err) else None,
                marker=_MARKERS[si % len(_MARKERS)],
                markersize=5,
                markerfacecolor="none" if si % 2 else colours[sch],
                capsize=2,
                alpha=0.9,
                color=colours[sch],
                label=sch,
            )
        ax.set_yscale("function", functions=(_nines, _nines_inv))
        ticks = sorted(chosen)
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"p{v:g}"))
        # Room below the lowest percentile and above the highest (nines scale).
        ax.set_ylim(ticks[0] * 0.6, min(99.99, 100.0 - (100.0 - ticks[-1]) / 2.5))
        ax.grid(alpha=0.3, which="both")
        if keys:
            ax.set_title(_point_label(dict(zip(keys, g)), keys), fontsize=10)
        if gi % ncols == 0:
            ax.set_ylabel("percentile")
        ax.set_xlabel(f"latency {unit}".strip())
    for gi in range(n, nrows * ncols):
        axes[gi // ncols][gi % ncols].set_visible(False)
    use_log = log_x if log_x is not None else _spans_decades(all_x, 10.0)
    if use_log:
        for row in axes:
            for ax in row:
                ax.set_xscale("log")
                _log_axis(ax.xaxis)
    axes[0][ncols - 1].legend(
        title="scheme", loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=9
    )
    fig.suptitle(title or f"{family}: latency percentiles (mean over seeds ± 95% CI)", fontsize=11)
    return fig


# --------------------------------------------------------------------------
# A metric against a grid parameter


def metric_vs_param(
    data: Data,
    metric: str,
    param: str | None = None,
    *,
    confidence: float = 0.95,
    log_x: bool | None = None,
    log_y: bool | None = None,
    title: str | None = None,
) -> Figure:
    """``metric`` against the grid parameter ``param``, one line per scheme
    (and per value of any other grid key): the mean across seeds with
    ``confidence`` Student-t error bars (:func:`exitless.summarize`; none
    with one seed). ``param`` defaults to the only grid key. Axes go
    logarithmic when the values span a decade (x) or two (y) and are
    positive, unless ``log_x`` / ``log_y`` say otherwise."""
    df = as_frame(data)
    keys = _grid_keys(df)
    if param is None:
        numeric = [k for k in keys if df.schema[k].is_numeric()]
        if len(numeric) != 1:
            raise ReportError(
                "metric_vs_param: pass param= one of "
                f"{', '.join(keys) if keys else '(none: the data has no grid columns)'}"
            )
        param = numeric[0]
    if param not in keys:
        raise ReportError(
            f"no grid column `{param}`: the data has {', '.join(keys) or 'no grid columns'}"
        )
    if not df.schema[param].is_numeric():
        raise ReportError(f"grid column `{param}` is not numeric")
    if metric not in set(df["metric"].unique().to_list()):
        near = sorted(m for m in df["metric"].unique().to_list() if metric.split(".")[0] in m)[:8]
        raise ReportError(
            f"no metric `{metric}` in the data" + (f" (similar: {', '.join(near)})" if near else "")
        )
    s = summarize(df.filter(pl.col("metric") == metric), confidence=confidence).sort(param)
    others = [k for k in keys if k != param]
    line_keys = ["scheme", *others]
    lines = list(dict.fromkeys(tuple(r) for r in s.select(line_keys).rows()))
    fig = _new_figure(7.6, 4.6)
    ax = fig.subplots()
    all_x: list[float] = []
    all_y: list[float] = []
    for i, lk in enumerate(lines):
        sub = s
        for k, v in zip(line_keys, lk):
            sub = sub.filter(pl.col(k) == v)
        sub = sub.filter(pl.col("mean").is_not_null())
        xv = [float(v) for v in sub[param].to_list()]
        yv = sub["mean"].to_list()
        err = [c if c is not None else 0.0 for c in sub["ci_half"].to_list()]
        all_x.extend(xv)
        all_y.extend(yv)
        label = (
            lk[0] if not others else f"{lk[0]}, {_point_label(dict(zip(others, lk[1:])), others)}"
        )
        ax.errorbar(
            xv,
            yv,
            yerr=err if any(err) else None,
            marker=_MARKERS[i % len(_MARKERS)],
            markersize=5,
            markerfacecolor="none" if i % 2 else _PALETTE[i % len(_PALETTE)],
            capsize=3,
            alpha=0.9,
            color=_PALETTE[i % len(_PALETTE)],
            label=label,
        )
    ax.xaxis.set_major_formatter(_si_formatter())
    ax.yaxis.set_major_formatter(_si_formatter())
    if log_x if log_x is not None else _spans_decades(all_x, 10.0):
        ax.set_xscale("log")
        _log_axis(ax.xaxis)
    if log_y if log_y is not None else _spans_decades(all_y, 100.0):
        ax.set_yscale("log")
        _log_axis(ax.yaxis)
    xticks = sorted(set(all_x))
    if 0 < len(xticks) <= 8:
        ax.xaxis.set_major_locator(FixedLocator(xticks))
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(param)
    ax.set_ylabel(_axis_label(metric))
    ax.grid(alpha=0.3, which="both")
    nseeds = df["seed"].n_unique()
    ax.legend(title="scheme", loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    ci = f" ± {confidence:.0%} CI" if nseeds > 1 else ""
    ax.set_title(
        title or f"{metric} vs {param} (mean over {nseeds} seed{'s' * (nseeds > 1)}{ci})",
        fontsize=11,
    )
    return fig


# --------------------------------------------------------------------------
# reproduce rows


def _reproduce_rows(rows: Any) -> list[dict[str, Any]]:
    if isinstance(rows, pl.DataFrame):
        rows = rows.to_dicts()
    if isinstance(rows, Mapping) and isinstance(rows.get("rows"), list):
        rows = rows["rows"]
    elif isinstance(rows, Mapping):
        rows = [rows]
    if not isinstance(rows, Sequence) or isinstance(rows, (str, bytes)):
        raise ReportError(f"expected reproduce rows (a list of dicts), not {type(rows).__name__}")
    out: list[dict[str, Any]] = []
    for i, r in enumerate(rows):
        if not isinstance(r, Mapping):
            raise ReportError(f"reproduce row {i}: expected an object, got {type(r).__name__}")
        missing = [c for c in REPRODUCE_COLUMNS if c not in r]
        if missing:
            raise ReportError(
                f"reproduce row {i}: no {', '.join(f'`{c}`' for c in missing)} "
                "(expected the rows of `exitless reproduce <paper> --json`)"
            )
        out.append(dict(r))
    return out


def _params_text(p: Any) -> str:
    if p is None:
        return ""
    if isinstance(p, Mapping):
        return ", ".join(f"{k}={_num(v)}" for k, v in p.items() if v is not None)
    if isinstance(p, str):
        return p
    return json.dumps(p)


def _tolerance_text(t: Any) -> str:
    if t is None:
        return ""
    if t == "max" or (isinstance(t, Mapping) and "max" in t):
        return "≤ paper"
    if t == "min" or (isinstance(t, Mapping) and "min" in t):
        return "≥ paper"
    if isinstance(t, Mapping) and t.get("rel") is not None:
        return f"±{100 * float(t['rel']):g}%"
    if isinstance(t, Mapping) and t.get("abs") is not None:
        return f"±{float(t['abs']):g}"
    if isinstance(t, str):
        return t
    return json.dumps(t)


def _tolerance_band(t: Any, paper: float) -> tuple[float, float] | None:
    """The tolerance as a range of model/paper ratios."""
    if t is None or paper == 0:
        return None
    if t == "max" or (isinstance(t, Mapping) and "max" in t):
        return (0.0, 1.0)
    if t == "min" or (isinstance(t, Mapping) and "min" in t):
        return (1.0, float("inf"))
    if isinstance(t, Mapping) and t.get("rel") is not None:
        r = float(t["rel"])
        return (1.0 - r, 1.0 + r)
    if isinstance(t, Mapping) and t.get("abs") is not None:
        a = float(t["abs"])
        lo, hi = (paper - a) / paper, (paper + a) / paper
        return (min(lo, hi), max(lo, hi))
    return None


def headline_table(headlines: Sequence[Mapping[str, Any]]) -> pl.DataFrame:
    """The headline claims of ``reproduce --json`` (its ``headlines``) as a
    table: the claim, the two configurations, the paper's and the model's
    values and effects, their ratio and the verdict."""

    def eff(h: Mapping[str, Any], key: str) -> str:
        v = h.get(key)
        if v is None:
            return "-"
        return f"{float(v):+.1f}{' pt' if h.get('effect_unit') == 'points' else '%'}"

    def pair(a: Any, b: Any) -> str:
        return "-" if a is None or b is None else f"{_num(a)} → {_num(b)}"

    return pl.DataFrame(
        {
            "id": [str(h.get("id", "")) for h in headlines],
            "claim": [str(h.get("claim", "")) for h in headlines],
            "system vs baseline": [f"{h.get('system')} vs {h.get('baseline')}" for h in headlines],
            "paper": [pair(h.get("paper_baseline"), h.get("paper_system")) for h in headlines],
            "model": [pair(h.get("model_baseline"), h.get("model_system")) for h in headlines],
            "paper effect": [eff(h, "paper_effect") for h in headlines],
            "model effect": [eff(h, "model_effect") for h in headlines],
            "verdict": [str(h.get("verdict", "")).replace("_", " ") for h in headlines],
        },
        schema={
            c: pl.String
            for c in (
                "id",
                "claim",
                "system vs baseline",
                "paper",
                "model",
                "paper effect",
                "model effect",
                "verdict",
            )
        },
    )


def model_vs_paper_table(rows: Any) -> pl.DataFrame:
    """``exitless reproduce <paper> --json`` rows as a table, in their
    order: experiment, config, params (``k=v``), metric, unit, model, paper,
    ``model/paper`` (the ratio, null without a paper value or with paper 0),
    tolerance (``±10%``, ``±0.5``, ``≤ paper``), within (``yes`` /
    ``NO`` / empty when the paper publishes no value) and note (the known
    cause of a gap, empty when none is stated)."""
    rs = _reproduce_rows(rows)
    ratio: list[float | None] = []
    for r in rs:
        m, p = r["model"], r["paper"]
        ratio.append(float(m) / float(p) if m is not None and p not in (None, 0) else None)
    return pl.DataFrame(
        {
            "experiment": [str(r["experiment"]) for r in rs],
            "config": [str(r["config"]) for r in rs],
            "params": [_params_text(r["params"]) for r in rs],
            "metric": [str(r["metric"]) for r in rs],
            "unit": [str(r["unit"] or "") for r in rs],
            "model": [None if r["model"] is None else float(r["model"]) for r in rs],
            "paper": [None if r["paper"] is None else float(r["paper"]) for r in rs],
            "model/paper": ratio,
            "tolerance": [_tolerance_text(r["tolerance"]) for r in rs],
            "within": [
                {True: "yes", False: "NO"}.get(r["within"], "") if r["within"] is not None else ""
                for r in rs
            ],
            "note": [str(r.get("note") or "") for r in rs],
        },
        schema={
            "experiment": pl.String,
            "config": pl.String,
            "params": pl.String,
            "metric": pl.String,
            "unit": pl.String,
            "model": pl.Float64,
            "paper": pl.Float64,
            "model/paper": pl.Float64,
            "tolerance": pl.String,
            "within": pl.String,
            "note": pl.String,
        },
    )


def model_vs_paper(rows: Any, *, title: str | None = None) -> Figure:
    """Each published value as model/paper on a log axis (1× = the paper),
    one row per (experiment, config, params, metric), rows of one experiment
    on a shared background, the tolerance as a grey band and the ratio
    written next to its dot; green dots are within tolerance, red ones not.
    A ratio below the axis (zero, negative, or under 1/1000) is drawn as a
    ``<`` at the left edge, its value written beside it. Rows the paper
    gives no value for, or the value 0 (no ratio), are left out of the
    chart; the title counts them, :func:`model_vs_paper_table` lists them.
    Each dot is a ``Line2D`` with gid ``row<i>`` (i: its index among the
    charted rows), its x the ratio (or the axis edge when clipped)."""
    every = _reproduce_rows(rows)
    scored = [r for r in every if r["paper"] is not None and r["model"] is not None]
    rs = [r for r in scored if r["paper"] != 0]
    if not rs:
        raise ReportError("no reproduce row has a published (non-zero) paper value to compare")
    labels = []
    for r in rs:
        p = _params_text(r["params"])
        labels.append(
            f"{r['experiment']} · {r['config']} · {r['metric']}" + (f" [{p}]" if p else "")
        )
    ratios = [float(r["model"]) / float(r["paper"]) for r in rs]
    positive = [x for x in ratios if x > 0]
    left = max(min([*positive, 0.5]), 1e-3) / 1.6
    right = max([*positive, 2.0]) * 1.6
    n = len(rs)
    fig = _new_figure(11.0, 1.5 + 0.24 * n)
    ax = fig.subplots()
    ys = list(range(n))[::-1]
    # Alternate backgrounds: one band per experiment.
    exps = [str(r["experiment"]) for r in rs]
    k = 0
    for e in dict.fromkeys(exps):
        idx = [ys[i] for i, x in enumerate(exps) if x == e]
        if k % 2 == 0:
            ax.axhspan(min(idx) - 0.5, max(idx) + 0.5, color="#f3f3f3", zorder=0)
        k += 1
    for i, (y, r, x) in enumerate(zip(ys, rs, ratios)):
        band = _tolerance_band(r["tolerance"], float(r["paper"]))
        if band is not None and band[1] > left:
            lo, hi = max(band[0], left), min(band[1], right)
            ax.plot([lo, hi], [y, y], color="#bbbbbb", linewidth=5, solid_capstyle="butt", zorder=1)
        ok = r["within"]
        colour = "#2ca02c" if ok else ("#d62728" if ok is False else "#7f7f7f")
        clipped = x < left
        xd = left * 1.08 if clipped else x
        ax.plot(
            [xd],
            [y],
            "<" if clipped else "o",
            color=colour,
            markersize=6,
            zorder=3,
            gid=f"row{i}",
        )
        ax.annotate(
            f"{x:.2g}×",
            (xd, y),
            xytext=(6, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
            color="#444444",
        )
    ax.axvline(1.0, color="black", linewidth=0.8, zorder=2)
    ax.set_xscale("log")
    ax.set_xlim(left, right)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}×"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _p: ""))
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_ylim(-0.6, n - 0.4)
    ax.grid(axis="x", alpha=0.4, which="major")
    ax.set_xlabel("model / paper (log scale; grey band: tolerance; 1× = the paper's value)")
    handles = [
        Patch(color="#2ca02c", label="within tolerance"),
        Patch(color="#d62728", label="outside tolerance"),
        Patch(color="#bbbbbb", label="tolerance"),
    ]
    ax.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False
    )
    ok = sum(1 for r in scored if r["within"])
    zero = len(scored) - len(rs)
    note = f"; {zero} with paper = 0 not charted" if zero else ""
    ax.set_title(
        title or f"Model vs paper: {ok} of {len(scored)} published values within tolerance{note}",
        fontsize=11,
    )
    return fig


# --------------------------------------------------------------------------
# Reports


@dataclass
class Report:
    """Named figures and tables, in order, for :func:`write_html` and
    :func:`write_png`. A figure may be a :class:`FigureGroup` (one chart
    per VM behind a VM selector)."""

    title: str = "exitless report"
    figures: list[tuple[str, Figure | FigureGroup]] = field(default_factory=list)
    tables: list[tuple[str, pl.DataFrame]] = field(default_factory=list)
    #: Tables written folded (a ``<details>`` element the reader opens):
    #: the rows of a paper's experiments without a published value.
    folded_tables: list[tuple[str, pl.DataFrame]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: What produced the data (:func:`provenance`), written into the HTML.
    provenance: dict[str, Any] = field(default_factory=dict)


def _writer() -> str:
    from . import __version__

    return f"exitless {__version__} (Python package)"


def provenance(data: Any) -> dict[str, Any]:
    """What produced ``data``, as far as it says: ``writer`` (this
    package's version, which writes the report), ``tools`` (the
    ``exitless`` versions that produced the inputs), ``paper`` (reproduce
    output), ``runs`` (one entry per distinct run: scenario name, scheme,
    seed, the resolved scenario and the calibration entries changed from
    the shipped file). A sweep frame carries no provenance of its own: only
    ``writer`` is known."""
    out: dict[str, Any] = {"writer": _writer(), "tools": [], "runs": []}
    items: list[Any] = []
    if isinstance(data, Mapping) and isinstance(data.get("rows"), list):
        if data.get("tool"):
            out["tools"].append(str(data["tool"]))
        if data.get("paper"):
            out["paper"] = str(data["paper"])
    elif isinstance(data, Mapping):
        items = [data]
    elif isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        items = list(data)
    seen: set[str] = set()
    for r in items:
        p = r.get("provenance") if isinstance(r, Mapping) else None
        if not isinstance(p, Mapping):
            continue
        if p.get("tool") and p["tool"] not in out["tools"]:
            out["tools"].append(str(p["tool"]))
        run = {
            "scenario": r.get("scenario"),
            "scheme": r.get("scheme"),
            "seed": r.get("seed"),
            "resolved": p.get("scenario"),
            "calibration_changes": p.get("calibration_changes") or {},
        }
        key = json.dumps(run, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out["runs"].append(run)
    return out


def _provenance_html(p: Mapping[str, Any]) -> str:
    parts = ["<h2>provenance</h2><ul>"]
    parts.append(f"<li>report written by {html.escape(str(p.get('writer', _writer())))}</li>")
    tools = p.get("tools") or []
    parts.append(
        "<li>data produced by "
        + (html.escape(", ".join(map(str, tools))) if tools else "(not recorded in the input)")
        + "</li>"
    )
    if p.get("paper"):
        parts.append(f"<li>paper: {html.escape(str(p['paper']))}</li>")
    parts.append("</ul>")
    sw = p.get("sweep")
    if isinstance(sw, Mapping):
        sets = " ".join(f"--set {x}" for x in sw.get("sets") or []) or "(none)"
        parts.append(
            f"<details><summary>sweep inputs, from {html.escape(str(sw.get('record')))}</summary>"
            f"<p>overrides: {html.escape(sets)}</p><p>scenario file:</p>"
            f"<pre>{html.escape(str(sw.get('scenario') or ''))}</pre></details>"
        )
    for i, run in enumerate(p.get("runs") or []):
        title = f"run {i + 1}: scenario {run.get('scenario') or '-'}, scheme {run.get('scheme')}, seed {run.get('seed')}"
        changes = run.get("calibration_changes") or {}
        if changes:
            rows = "".join(
                f"<tr><td>{html.escape(str(k))}</td><td class=\"num\">{html.escape(_cell(v.get('value')))}</td>"
                f"<td>{html.escape(str(v.get('source', '')))}</td></tr>"
                for k, v in sorted(changes.items())
            )
            cal = (
                "<p>calibration: the shipped file of the tool version above, with these entries changed:</p>"
                f"<table><thead><tr><th>entry</th><th>value</th><th>source</th></tr></thead><tbody>{rows}</tbody></table>"
            )
        else:
            cal = "<p>calibration: the shipped file of the tool version above, unchanged.</p>"
        resolved = json.dumps(run.get("resolved"), indent=1, sort_keys=True)
        parts.append(
            f"<details><summary>{html.escape(title)}</summary>{cal}"
            f"<p>scenario, resolved (every default filled in):</p><pre>{html.escape(resolved)}</pre></details>"
        )
    return "".join(parts)


def _is_reproduce(data: Any) -> bool:
    if isinstance(data, Mapping) and isinstance(data.get("rows"), list):
        return True
    if isinstance(data, pl.DataFrame):
        return all(c in data.columns for c in ("experiment", "model", "paper"))
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)) and data:
        first = data[0]
        return isinstance(first, Mapping) and "experiment" in first and "paper" in first
    return False


def _summary_table(df: pl.DataFrame) -> pl.DataFrame:
    keys = _grid_keys(df)
    present = set(df["metric"].unique().to_list())
    metrics = [m for m in ("exits_per_s", "tig_pct", "eht_pct") if m in present]
    for fam in latency_families(df).values():
        metrics += [fam[p] for p in (50.0, 99.0) if p in fam]
    metrics += [m for m in ("violations",) if m in present]
    s = _summary(df, metrics)
    cell = (
        pl.when(pl.col("ci_half").is_not_null())
        .then(
            pl.format(
                "{} ± {}",
                pl.col("mean").map_elements(_num, return_dtype=pl.String),
                pl.col("ci_half").map_elements(_num, return_dtype=pl.String),
            )
        )
        .otherwise(pl.col("mean").map_elements(_num, return_dtype=pl.String))
    )
    wide = (
        s.with_columns(cell.alias("cell"))
        .pivot(on="metric", index=["point", *keys, "scheme"], values="cell")
        .sort("point")
    )
    out = wide.select(*keys, "scheme", *[m for m in metrics if m in wide.columns])
    if len(vms_of(df)) > 1:
        # Beside `all.*` columns a bare name is VM 0's alone: say so.
        out = out.rename(
            {
                m: f"vm0.{m}"
                for m in out.columns
                if m in metrics and m != "violations" and not m.startswith("all.")
                and not _VM_METRIC.match(m)
            }
        )
    return out


def build(data: Any, title: str | None = None) -> Report:
    """The default report of ``data``.

    A sweep frame or run reports: exits by reason, one latency percentile
    chart per latency metric with several percentiles, and (with a numeric
    grid key of two or more values) exits/s, TIG and each latency's p99
    against it; a table of means ± 95% CI per point. ``reproduce`` rows: the
    model-vs-paper chart and table.
    """
    prov = provenance(data)
    if _is_reproduce(data):
        rs = _reproduce_rows(data)
        rep = Report(title=title or "exitless reproduce: model vs paper", provenance=prov)
        # Only values and effects count as within tolerance; bounds and
        # structural rows hold or not (rows without a `kind` predate it).
        scored = [
            r
            for r in rs
            if r["within"] is not None
            and r.get("kind", "value") in ("value", "effect")
            and not r.get("calibrated_to")
        ]
        ok = sum(1 for r in scored if r["within"])
        experiments = list(dict.fromkeys(str(r["experiment"]) for r in rs))
        rep.notes.append(
            f"{len(rs)} rows from {len(experiments)} experiment(s); "
            f"{ok} of {len(scored)} values and effects within tolerance."
        )
        heads = data.get("headlines") if isinstance(data, Mapping) else None
        if heads:
            rep.tables.append(("headline claims: paper's effect and the model's", headline_table(heads)))
            verdicts = [str(h.get("verdict")) for h in heads]
            counts = ", ".join(f"{verdicts.count(v)} {v.replace('_', ' ')}" for v in dict.fromkeys(verdicts))
            rep.notes.append(f"{len(heads)} headline claims: {counts}.")
        if any(r["paper"] not in (None, 0) for r in rs):
            rep.figures.append(("model vs paper", model_vs_paper(rs)))
        published = [r for r in rs if r["paper"] is not None]
        others = [r for r in rs if r["paper"] is None]
        if published:
            rep.tables.append(
                ("published values: model, paper, tolerance", model_vs_paper_table(published))
            )
        if others:
            # Hundreds of rows of the model alone (a paper's sweeps) would
            # bury the comparisons: folded, opened on demand.
            rep.folded_tables.append(
                (
                    f"{len(others)} rows without a published value (the model alone)",
                    model_vs_paper_table(others),
                )
            )
        return rep
    df = as_frame(data)
    rep = Report(title=title or "exitless sweep", provenance=prov)
    keys = _grid_keys(df)
    nseeds = df["seed"].n_unique()
    npoints = df["point"].n_unique()
    schemes = list(dict.fromkeys(df["scheme"].to_list()))
    rep.notes.append(
        f"{npoints} point(s) ({', '.join(keys) or 'no grid keys'} × schemes "
        f"{', '.join(map(str, schemes))}), {nseeds} seed(s) each; "
        "bars and lines are means across seeds, error bars 95% Student-t CIs."
    )
    vms = vms_of(df)
    if any(m.startswith("exits_per_s.") for m in df["metric"].unique().to_list()):
        if len(vms) > 1:
            shown = vms[: MAX_VM_OPTIONS + 1]
            rep.figures.append(
                (
                    "exits by reason",
                    FigureGroup([(_vm_label(v), exit_breakdown(df, vm=v)) for v in shown]),
                )
            )
            if len(vms) > len(shown):
                rep.notes.append(
                    f"The VM selectors offer all VMs and the first {MAX_VM_OPTIONS} of "
                    f"{len(vms) - 1} VMs."
                )
        else:
            rep.figures.append(("exits by reason", exit_breakdown(df)))
    fams = latency_families(df)
    # A family of several VMs (`udp.latency`, `vm1.udp.latency`,
    # `all.udp.latency`) is one chart with a VM selector.
    by_base: dict[str, list[tuple[int | str, str]]] = {}
    for fam in fams:
        m = _VM_METRIC.match(fam)
        if fam.startswith("all."):
            v, base = "all", fam[len("all.") :]
        elif m:
            v, base = int(m.group(1)), fam[m.end() :]
        else:
            v, base = 0, fam
        by_base.setdefault(base, []).append((v, fam))
    for base, members in by_base.items():
        if len(members) == 1:
            rep.figures.append((f"latency percentiles {members[0][1]}", latency_cdf(df, members[0][1])))
            continue
        order = {v: i for i, v in enumerate(vms)}
        members.sort(key=lambda vf: order.get(vf[0], len(order)))
        rep.figures.append(
            (
                f"latency percentiles {base}",
                FigureGroup(
                    [
                        (_vm_label(v), latency_cdf(df, fam, title=f"{base} ({_vm_label(v)})"))
                        for v, fam in members[: MAX_VM_OPTIONS + 1]
                    ]
                ),
            )
        )
    params = [k for k in keys if df.schema[k].is_numeric() and df[k].n_unique() >= 2]
    if params:
        param = params[0]
        present = set(df["metric"].unique().to_list())
        metrics = [m for m in ("exits_per_s", "tig_pct") if m in present]
        metrics += [f[99.0] for f in fams.values() if 99.0 in f]
        for m in metrics:
            rep.figures.append((f"{m} vs {param}", metric_vs_param(df, m, param)))
    rep.tables.append(("summary (mean ± 95% CI across seeds)", _summary_table(df)))
    return rep


def _png_bytes(fig: Figure, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _figures(report: Report | Sequence[Any]) -> list[tuple[str, Figure]]:
    """Every figure, a group's options each as `name (option)`."""
    if isinstance(report, Report):
        out: list[tuple[str, Figure]] = []
        for name, f in report.figures:
            if isinstance(f, FigureGroup):
                out += [(f"{name} ({label})", fig) for label, fig in f.options]
            else:
                out.append((name, f))
        return out
    out: list[tuple[str, Figure]] = []
    for i, f in enumerate(report):
        if isinstance(f, Figure):
            out.append((f"figure {i + 1}", f))
        else:
            name, fig = f
            out.append((str(name), fig))
    return out


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.4g}"
    return str(v)


def table_html(df: pl.DataFrame) -> str:
    """A frame as an HTML ``<table>`` (values escaped; a ``within`` of
    ``NO`` marks its row ``class="miss"``)."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    body = []
    for row in df.iter_rows(named=True):
        cls = ' class="miss"' if row.get("within") == "NO" else ""
        tds = "".join(
            f'<td class="num">{html.escape(_cell(v))}</td>'
            if isinstance(v, (int, float)) and not isinstance(v, bool)
            else f"<td>{html.escape(_cell(v))}</td>"
            for v in row.values()
        )
        body.append(f"<tr{cls}>{tds}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; }
figcaption { color: #555; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.85em; }
div.wide { overflow-x: auto; max-width: 100%; }
th, td { border: 1px solid #ccc; padding: 2px 6px; } th { background: #f2f2f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.miss td { background: #fde0e0; }
.selector figure.option { display: none; }
.selector label { margin-right: 0.8em; cursor: pointer; }
"""


def write_html(
    path: str | os.PathLike[str],
    report: Report | Sequence[Any],
    tables: Sequence[tuple[str, pl.DataFrame]] = (),
    *,
    title: str | None = None,
    dpi: int = 110,
) -> None:
    """Write one self-contained HTML file: each figure as a PNG embedded in
    base64 (``<img src="data:image/png;base64,...">``, one per figure), each
    table as an HTML table. ``report`` is a :class:`Report` (from
    :func:`build`) or a list of figures or ``(name, figure)`` pairs; extra
    ``tables`` are ``(name, frame)`` pairs."""
    entries: list[tuple[str, Figure | FigureGroup]] = (
        list(report.figures) if isinstance(report, Report) else list(_figures(report))
    )
    all_tables = list(report.tables if isinstance(report, Report) else []) + list(tables)
    notes = report.notes if isinstance(report, Report) else []
    head = title or (report.title if isinstance(report, Report) else "exitless report")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(head)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(head)}</h1>",
    ]
    parts += [f"<p>{html.escape(n)}</p>" for n in notes]
    for k, (name, fig) in enumerate(entries):
        if isinstance(fig, FigureGroup):
            parts.append(f"<h2>{html.escape(name)}</h2>{_selector_html(f'sel{k}', name, fig, dpi)}")
            continue
        data = base64.b64encode(_png_bytes(fig, dpi)).decode("ascii")
        parts.append(
            f'<h2>{html.escape(name)}</h2><figure class="chart">'
            f'<img alt="{html.escape(name)}" src="data:image/png;base64,{data}">'
            "</figure>"
        )
    for name, df in all_tables:
        parts.append(f'<h2>{html.escape(name)}</h2><div class="wide">{table_html(df)}</div>')
    for name, df in report.folded_tables if isinstance(report, Report) else []:
        parts.append(
            f"<details><summary>{html.escape(name)}</summary>"
            f'<div class="wide">{table_html(df)}</div></details>'
        )
    prov = report.provenance if isinstance(report, Report) else {}
    parts.append(_provenance_html(prov or {"writer": _writer()}))
    parts.append("</body></html>")
    with open(os.fspath(path), "w", encoding="utf-8") as f:
        f.write("\n".join(parts) + "\n")


def _selector_html(gid: str, name: str, group: FigureGroup, dpi: int) -> str:
    """A VM selector without script: one radio button per option, and CSS
    that shows the figure of the checked one."""
    radios, figs, rules = [], [], []
    for i, (label, fig) in enumerate(group.options):
        rid = f"{gid}-{i}"
        checked = " checked" if i == 0 else ""
        radios.append(
            f'<input type="radio" name="{gid}" id="{rid}"{checked}>'
            f'<label for="{rid}">{html.escape(label)}</label>'
        )
        data = base64.b64encode(_png_bytes(fig, dpi)).decode("ascii")
        alt = html.escape(f"{name} ({label})")
        figs.append(
            f'<figure class="chart option {rid}"><img alt="{alt}" src="data:image/png;base64,{data}"></figure>'
        )
        rules.append(f"#{rid}:checked ~ figure.{rid} {{ display: block; }}")
    return (
        f"<style>{' '.join(rules)}</style>"
        f'<div class="selector">{"".join(radios)}{"".join(figs)}</div>'
    )


def _slug(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()
    return s or "figure"


def write_png(
    directory: str | os.PathLike[str], report: Report | Sequence[Any], *, dpi: int = 110
) -> list[str]:
    """Write each figure to ``directory/NN-<name>.png`` (created if needed);
    returns the paths."""
    os.makedirs(os.fspath(directory), exist_ok=True)
    paths = []
    for i, (name, fig) in enumerate(_figures(report), 1):
        p = os.path.join(os.fspath(directory), f"{i:02d}-{_slug(name)}.png")
        fig.savefig(p, format="png", dpi=dpi)
        paths.append(p)
    return paths


# --------------------------------------------------------------------------
# Files and the command line


def load(path: str | os.PathLike[str]) -> pl.DataFrame | list[dict[str, Any]]:
    """Read a report input: a sweep frame (``.parquet``, ``.csv``, as
    :func:`exitless.write_results` writes), or ``.json`` holding ``reproduce
    --json`` rows or ``run --json`` reports (one or a list). Raises
    :class:`ReportError` for an unknown suffix, unreadable content or missing
    columns, :class:`FileNotFoundError` for a missing file."""
    p = os.fspath(path)
    if not os.path.exists(p):
        raise FileNotFoundError(f"{p}: no such file")
    if os.path.isdir(p):
        raise ReportError(f"{p}: is a directory, not a results file")
    ext = os.path.splitext(p)[1].lower()
    if ext == ".parquet":
        try:
            df = pl.read_parquet(p)
        except Exception as e:  # polars raises several kinds for a bad file
            raise ReportError(f"{p}: not a readable parquet file ({_first_line(e)})") from None
        as_frame(df)
        return df
    if ext == ".csv":
        try:
            df = pl.read_csv(p)
        except Exception as e:
            raise ReportError(f"{p}: not a readable CSV file ({_first_line(e)})") from None
        try:
            as_frame(df)
        except ReportError as e:
            raise ReportError(f"{p}: {e}") from None
        return df
    if ext == ".json":
        try:
            with open(p, encoding="utf-8") as f:
                obj = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ReportError(f"{p}: not valid JSON ({e})") from None
        # `reproduce --json` is {"schema_version", "tool", "paper", "rows"}
        # (a bare list before schema version 1).
        if isinstance(obj, Mapping) and isinstance(obj.get("rows"), list):
            obj = obj["rows"]
        rows = obj if isinstance(obj, list) else [obj]
        if not rows:
            raise ReportError(f"{p}: no rows (an empty JSON list)")
        if all(isinstance(r, Mapping) and "vms" in r for r in rows):
            return rows
        try:
            return _reproduce_rows(rows)
        except ReportError as e:
            raise ReportError(
                f"{p}: {e}; or `exitless run --json` reports (objects with `vms`)"
            ) from None
    raise ReportError(
        f"{p}: unknown format `{ext or '(no suffix)'}`: expected .parquet or .csv "
        "(a sweep frame) or .json (reproduce rows or run reports)"
    )


def _sweep_record(path: str) -> dict[str, Any]:
    """What ``exitless sweep`` recorded beside its results file
    ``STEM.csv`` in ``STEM.sweep.json``: the tool, the scenario text, the
    ``--set`` overrides (the calibration's full text is left out)."""
    stem, _ = os.path.splitext(path)
    try:
        with open(stem + ".sweep.json", encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(rec, Mapping):
        return {}
    out: dict[str, Any] = {
        "sweep": {
            "record": os.path.basename(stem + ".sweep.json"),
            "scenario": rec.get("scenario"),
            "sets": rec.get("sets") or [],
        }
    }
    if rec.get("tool"):
        out["tools"] = [str(rec["tool"])]
    return out


def _file_provenance(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The tool and paper a ``reproduce --json`` file names (``load``
    returns its rows alone), or for a sweep's ``.csv`` / ``.parquet`` what
    the sweep recorded beside it."""
    if os.path.splitext(os.fspath(path))[1].lower() in (".csv", ".parquet"):
        return _sweep_record(os.fspath(path))
    if os.path.splitext(os.fspath(path))[1].lower() != ".json":
        return {}
    try:
        with open(os.fspath(path), encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return {}
    if not (isinstance(obj, Mapping) and isinstance(obj.get("rows"), list)):
        return {}
    p = provenance(obj)
    return {k: p[k] for k in ("tools", "paper") if p.get(k)}


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _file_headlines(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The ``headlines`` of a ``reproduce --json`` file (none for any
    other input)."""
    if os.path.splitext(os.fspath(path))[1].lower() != ".json":
        return []
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return []
    heads = obj.get("headlines") if isinstance(obj, Mapping) else None
    return [h for h in heads if isinstance(h, Mapping)] if isinstance(heads, list) else []


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m exitless.report INPUT --html OUT [--png DIR]``; returns
    the exit status (2 for a usage or input error, with a one-line message
    on stderr and no traceback)."""
    ap = argparse.ArgumentParser(
        prog="python -m exitless.report",
        description="Plots and an HTML report of an exitless sweep (.parquet/.csv from "
        "exitless.write_results) or of `exitless reproduce <paper> --json` rows (.json).",
    )
    ap.add_argument("input", help="results.parquet, results.csv or reproduce.json")
    ap.add_argument("--html", metavar="OUT", help="write one self-contained HTML file")
    ap.add_argument("--png", metavar="DIR", help="write each chart as DIR/NN-<name>.png")
    ap.add_argument("--title", help="the report's title")
    args = ap.parse_args(argv)
    if not args.html and not args.png:
        ap.error("nothing to write: give --html OUT and/or --png DIR")
    try:
        data = load(args.input)
        heads = _file_headlines(args.input)
        if heads and isinstance(data, list):
            # `reproduce --json`'s headline claims go first in its report.
            data = {"rows": data, "headlines": heads}
        rep = build(data, title=args.title)
        rep.provenance.update(_file_provenance(args.input))
        if args.html:
            write_html(args.html, rep)
            print(f"wrote {args.html} ({len(rep.figures)} charts, {len(rep.tables)} tables)")
        if args.png:
            for p in write_png(args.png, rep):
                print(f"wrote {p}")
    except (ReportError, OSError) as e:
        msg = str(e)
        if isinstance(e, OSError) and e.filename is not None and str(e.filename) not in msg:
            msg = f"{e.filename}: {e.strerror or msg}"
        print(f"{ap.prog}: error: {msg}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
