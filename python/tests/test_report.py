"""exitless.report: the charts show the data they are given, the HTML holds
them, and bad input gets a one-line error with exit status 2."""

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import exitless
import polars as pl
import pytest
from conftest import CYCLICTEST, FIG4, REPO

er = pytest.importorskip("exitless.report")  # needs matplotlib (exitless[plot])

SHORT = {"duration_s": 0.05, "warmup_s": 0.01}
SCHEMES = ["kvm", "apicv", "did"]
NETPIPE = REPO / "validation" / "did" / "netpipe.toml"


@pytest.fixture(scope="module")
def frame():
    return exitless.sweep(
        FIG4, grid={"rate_pps": [1e5, 6e5]}, schemes=SCHEMES, seeds=2, overrides=SHORT, jobs=2
    )


@pytest.fixture(scope="module")
def cyclic_reports():
    return [
        exitless.run(CYCLICTEST, scheme=s, seed=sd, duration_s=0.2, warmup_s=0.01)
        for s in ("kvm", "did")
        for sd in (1, 2)
    ]


#: Rows as `exitless reproduce did --json` writes them (the schema of
#: src/validation: tolerance {"rel": x} / {"abs": x} / "max", nulls for
#: values the paper does not publish).
REPRODUCE = [
    {
        "experiment": "did.fig4",
        "config": "kvm",
        "params": {"rate_pps": 100000},
        "metric": "exits_per_s",
        "unit": "1/s",
        "model": 105000.0,
        "paper": 100000.0,
        "tolerance": {"rel": 0.1},
        "within": True,
        "violations": 0,
    },
    {
        "experiment": "did.fig4",
        "config": "did",
        "params": {"rate_pps": 100000},
        "metric": "exits_per_s",
        "unit": "1/s",
        "model": 900.0,
        "paper": 500.0,
        "tolerance": {"abs": 200.0},
        "within": False,
        "violations": 0,
        "note": "the paper's own arithmetic",
    },
    {
        "experiment": "did.cyclictest",
        "config": "did",
        "params": {},
        "metric": "cyclictest.latency_mean_us",
        "unit": "us",
        "model": 2.5,
        "paper": 3.0,
        "tolerance": "max",
        "within": True,
        "violations": 0,
    },
    {
        "experiment": "did.whileloop",
        "config": "kvm",
        "params": {},
        "metric": "elapsed_s",
        "unit": "s",
        "model": 10.2,
        "paper": None,
        "tolerance": None,
        "within": None,
        "violations": 0,
    },
]


def _means(frame, metrics):
    s = exitless.summarize(frame.filter(pl.col("metric").is_in(metrics)))
    return {
        (sch, rate, m): v
        for sch, rate, m, v in s.select("scheme", "rate_pps", "metric", "mean").rows()
    }


# -- exits by reason ---------------------------------------------------------


def test_exit_breakdown_bar_heights_are_the_means(frame):
    reasons = [m for m in frame["metric"].unique().to_list() if m.startswith("exits_per_s.")]
    means = _means(frame, reasons)
    fig = er.exit_breakdown(frame, max_reasons=len(reasons))
    ax = fig.axes[0]
    segments = [p for p in ax.patches if p.get_gid() and not p.get_gid().startswith("share:")]
    # Every scheme × rate × drawn reason is one segment.
    drawn = {p.get_gid().split("|")[1] for p in segments}
    assert drawn == {
        m.removeprefix("exits_per_s.")
        for m in reasons
        if any(means[(s, r, m)] > 0 for s in SCHEMES for r in (1e5, 6e5))
    }
    assert len(segments) == 6 * len(drawn)
    for p in segments:
        label, reason = p.get_gid().split("|")
        scheme, rate = re.fullmatch(r"(\w+), rate_pps=(\d+)k", label).groups()
        assert p.get_height() == pytest.approx(
            means[(scheme, float(rate) * 1e3, "exits_per_s." + reason)]
        )
    # Stacks: each bar's top is its total exits/s.
    tops = {}
    for p in segments:
        label = p.get_gid().split("|")[0]
        tops[label] = max(tops.get(label, 0.0), p.get_y() + p.get_height())
    totals = _means(frame, ["exits_per_s"])
    for (scheme, rate, _), total in totals.items():
        assert tops[f"{scheme}, rate_pps={rate / 1e3:g}k"] == pytest.approx(total, rel=1e-9)
    # KVM exits for the VF's interrupts, DID does not.
    kvm = sum(p.get_height() for p in segments if p.get_gid().startswith("kvm,"))
    did = sum(p.get_height() for p in segments if p.get_gid().startswith("did,"))
    assert kvm > 10 * did


def test_several_vms_are_one_chart_with_a_vm_selector(tmp_path):
    three = REPO / "scenarios" / "explore" / "three-vms.toml"
    df = exitless.sweep(three, schemes=["kvm"], seeds=1, overrides={"duration_s": 0.03})
    assert er.vms_of(df) == ["all", 0, 1, 2]
    rep = er.build(df)
    groups = {n: f for n, f in rep.figures if isinstance(f, er.FigureGroup)}
    exits = groups["exits by reason"]
    assert [label for label, _ in exits.options] == ["all VMs", "VM 0", "VM 1", "VM 2"]
    # Each option draws its own VM's metrics: bar tops are that VM's totals.
    for label, fig in exits.options:
        prefix = {"all VMs": "all.", "VM 0": ""}.get(label, f"vm{label[3:]}.")
        total = df.filter(pl.col("metric") == prefix + "exits_per_s")["value"].mean()
        ax = fig.axes[0]
        top = max(p.get_y() + p.get_height() for p in ax.patches if "|" in (p.get_gid() or ""))
        assert top == pytest.approx(total), label
    # The UDP VMs' latency: one chart, VMs 0 and 2 and the merged curve.
    udp = groups["latency percentiles udp.latency_p*_us"]
    assert [label for label, _ in udp.options] == ["all VMs", "VM 0", "VM 2"]
    er.write_html(tmp_path / "vms.html", rep, dpi=30)
    text = (tmp_path / "vms.html").read_text()
    assert "<script" not in text
    assert text.count('type="radio"') == 4 + 3
    assert text.count(" checked>") == 2  # the first option of each selector
    assert text.count("<img ") == len(er._figures(rep))


def test_exit_breakdown_lumps_small_reasons_into_other(frame):
    fig = er.exit_breakdown(frame, max_reasons=2)
    ax = fig.axes[0]
    names = {p.get_gid().split("|")[1] for p in ax.patches if p.get_gid() and "|" in p.get_gid()}
    assert len(names) == 3 and "other" in names
    share = [p for p in fig.axes[1].patches if (p.get_gid() or "").startswith("share:")]
    by_bar = {}
    for p in share:
        by_bar.setdefault(p.get_gid().split("|")[0], []).append(p.get_height())
    for heights in by_bar.values():
        assert sum(heights) == pytest.approx(100.0) or sum(heights) == 0.0
    assert [t.get_text() for t in fig.axes[-1].get_legend().get_texts()][-1] != "other"


def test_exit_breakdown_from_run_reports():
    reps = [
        exitless.run(FIG4, scheme=s, seed=1, rate_pps=2e5, overrides=SHORT) for s in ("kvm", "did")
    ]
    fig = er.exit_breakdown(reps)
    heights = {}
    for p in fig.axes[0].patches:
        if p.get_gid() and not p.get_gid().startswith("share:"):
            label, reason = p.get_gid().split("|")
            heights[(label, reason)] = p.get_height()
    for rep in reps:
        for reason, v in rep["vms"][0]["exits_per_s_by_reason"].items():
            if (rep["scheme"], reason) in heights:
                assert heights[(rep["scheme"], reason)] == pytest.approx(v)


def test_reports_of_one_scheme_and_seed_need_labels():
    # Configs sriov and pv both run scheme kvm; a report does not name its
    # config, so taking them as two seeds of one point would be wrong.
    net = {"duration_s": 0.01, "seed": 1}
    reps = {c: exitless.run(NETPIPE, config=c, **net) for c in ("sriov", "pv")}
    with pytest.raises(er.ReportError, match="scheme `kvm`, seed 1"):
        er.as_frame(list(reps.values()))
    df = er.as_frame(reps)
    assert df.select("point", "scheme").unique().sort("point").rows() == [(0, "sriov"), (1, "pv")]
    one = er.as_frame({"pv": [reps["pv"]]}).filter(pl.col("metric") == "exits_per_s")
    assert one["value"].to_list() == [reps["pv"]["vms"][0]["exits_per_s"]]


# -- latency percentiles ------------------------------------------------------


def test_runs_report_a_percentile_curve(cyclic_reports):
    fams = er.latency_families(cyclic_reports)
    assert fams["cyclictest.latency_p*_us"] == {
        50.0: "cyclictest.latency_p50_us",
        90.0: "cyclictest.latency_p90_us",
        99.0: "cyclictest.latency_p99_us",
        99.9: "cyclictest.latency_p999_us",
    }
    for rep in cyclic_reports:
        m = rep["metrics"]
        p = {n: m[f"cyclictest.latency_p{n}_us"] for n in ("50", "90", "99", "999")}
        assert 0 < p["50"] <= p["90"] <= p["99"]
        assert p["99"] <= p["999"] <= m["cyclictest.latency_max_us"] * 1.001


def test_latency_cdf_is_monotone_and_shows_the_means(cyclic_reports):
    fig = er.latency_cdf(cyclic_reports)
    ax = fig.axes[0]
    df = er.as_frame(cyclic_reports)
    s = exitless.summarize(df)
    # One errorbar container per scheme; its first line is the curve.
    assert sorted(c.get_label() for c in ax.containers) == ["did", "kvm"]
    for c in ax.containers:
        ln = c.lines[0]
        x, y = list(ln.get_xdata()), list(ln.get_ydata())
        assert y == [50.0, 90.0, 99.0, 99.9]
        assert all(a <= b for a, b in zip(x, x[1:])), x  # a CDF never goes back
        want = dict(s.filter(pl.col("scheme") == c.get_label()).select("metric", "mean").rows())
        assert x == pytest.approx([want[f"cyclictest.latency_{p}_us"] for p in ("p50", "p90", "p99", "p999")])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["p50", "p90", "p99", "p99.9"]


def test_latency_cdf_panels_per_grid_point(frame):
    fig = er.latency_cdf(frame, "udp.latency")
    visible = [ax for ax in fig.axes if ax.get_visible() and ax.containers]
    assert [ax.get_title() for ax in visible] == ["rate_pps=100k", "rate_pps=600k"]
    for ax in visible:
        assert sorted(c.get_label() for c in ax.containers) == sorted(SCHEMES)
        for c in ax.containers:
            x = list(c.lines[0].get_xdata())
            assert len(x) == 4 and all(a <= b for a, b in zip(x, x[1:])), x


# -- metric vs parameter ------------------------------------------------------


def test_metric_vs_param_points_and_confidence_intervals(frame):
    fig = er.metric_vs_param(frame, "exits_per_s")
    ax = fig.axes[0]
    s = exitless.summarize(frame.filter(pl.col("metric") == "exits_per_s"))
    assert len(ax.containers) == 3
    for cont in ax.containers:
        data_line, _caps, (bars,) = cont.lines
        scheme = cont.get_label()
        want = s.filter(pl.col("scheme") == scheme).sort("rate_pps")
        assert list(data_line.get_xdata()) == [1e5, 6e5]
        assert list(data_line.get_ydata()) == pytest.approx(want["mean"].to_list())
        # The error bar spans mean ± the 95% CI half-width.
        for seg, lo, hi in zip(bars.get_segments(), want["ci_low"], want["ci_high"]):
            assert sorted(seg[:, 1]) == pytest.approx([lo, hi])
    assert "2 seeds ± 95% CI" in ax.get_title()


def test_metric_vs_param_errors(frame):
    with pytest.raises(er.ReportError, match="no metric `nope`"):
        er.metric_vs_param(frame, "nope")
    with pytest.raises(er.ReportError, match="no grid column `rate`"):
        er.metric_vs_param(frame, "exits_per_s", "rate")


# -- reproduce ------------------------------------------------------------------


def test_model_vs_paper_table_and_chart():
    t = er.model_vs_paper_table(REPRODUCE)
    assert t.height == 4
    assert t["within"].to_list() == ["yes", "NO", "yes", ""]
    # A row's known cause travels with it; rows without one read empty.
    assert t["note"].to_list() == ["", "the paper's own arithmetic", "", ""]
    assert t["tolerance"].to_list() == ["±10%", "±200", "≤ paper", ""]
    assert t["params"].to_list() == ["rate_pps=100k", "rate_pps=100k", "", ""]
    assert t["model/paper"].to_list()[:3] == pytest.approx([1.05, 1.8, 2.5 / 3.0])
    fig = er.model_vs_paper(REPRODUCE)
    ax = fig.axes[0]
    dots = sorted(
        (ln for ln in ax.get_lines() if (ln.get_gid() or "").startswith("row")),
        key=lambda ln: ln.get_gid(),
    )
    assert [ln.get_xdata()[0] for ln in dots] == pytest.approx([1.05, 1.8, 2.5 / 3.0])
    assert "2 of 3 published values" in ax.get_title()
    # A negative model value has no place on a log axis: a "<" at the edge.
    neg = [dict(REPRODUCE[0], model=-5.0, within=False), *REPRODUCE[1:]]
    ax = er.model_vs_paper(neg).axes[0]
    first = next(ln for ln in ax.get_lines() if ln.get_gid() == "row0")
    assert first.get_marker() == "<" and first.get_xdata()[0] < ax.get_xlim()[0] * 1.1
    assert "-5e-05×" in [t.get_text() for t in ax.texts]
    with pytest.raises(er.ReportError, match="`paper`"):
        er.model_vs_paper_table([{"experiment": "x", "model": 1.0}])


def test_html_has_one_image_per_chart_and_the_table_rows(tmp_path):
    rep = er.build(REPRODUCE)
    out = tmp_path / "r.html"
    er.write_html(out, rep)
    text = out.read_text()
    imgs = re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', text)
    assert len(imgs) == len(rep.figures) == 1
    assert base64.b64decode(imgs[0])[:8] == b"\x89PNG\r\n\x1a\n"
    rows = re.findall(r"<tr( class=\"miss\")?><td>([^<]*)</td><td>([^<]*)</td>", text)
    assert [(r[1], r[2]) for r in rows] == [(r["experiment"], r["config"]) for r in REPRODUCE]
    assert [bool(r[0]) for r in rows] == [False, True, False, False]  # the miss is marked


def test_html_records_the_runs_scenario_calibration_and_tool(tmp_path):
    testbed = REPO / "validation" / "es2" / "testbed.toml"
    reps = [
        exitless.run(FIG4, scheme="kvm", duration_s=0.02, warmup_s=0.005),
        exitless.run(FIG4, scheme="did", duration_s=0.02, warmup_s=0.005, calibration=testbed),
    ]
    rep = er.build(reps)
    assert rep.provenance["tools"] == [f"exitless {exitless.__version__}"]
    runs = rep.provenance["runs"]
    assert [r["scheme"] for r in runs] == ["kvm", "did"]
    assert runs[0]["calibration_changes"] == {}
    # The ES2 testbed overlay changes the clock and the link, and says so.
    assert runs[1]["calibration_changes"]["cpu.ghz"]["value"] == 2.3
    assert runs[1]["resolved"]["duration_s"] == 0.02
    er.write_html(tmp_path / "p.html", rep, dpi=30)
    text = (tmp_path / "p.html").read_text()
    assert f"report written by exitless {exitless.__version__} (Python package)" in text
    assert "cpu.ghz" in text and "unchanged" in text
    assert text.count("<details>") == 2
    # reproduce --json from the command line: the tool and the paper it names.
    (tmp_path / "rep.json").write_text(
        json.dumps({"schema_version": 1, "tool": "exitless 9.9.9", "paper": "did", "rows": REPRODUCE})
    )
    assert er.main([str(tmp_path / "rep.json"), "--html", str(tmp_path / "r.html")]) == 0
    text = (tmp_path / "r.html").read_text()
    assert "data produced by exitless 9.9.9" in text and "paper: did" in text
    # Its headline claims, when it has them, are the first table.
    head = {
        "id": "did.cyclictest",
        "claim": "DID cuts timer latency",
        "system": "did",
        "baseline": "kvm",
        "paper_baseline": 14.0,
        "paper_system": 2.9,
        "model_baseline": 6.4,
        "model_system": 1.9,
        "paper_effect": -79.3,
        "model_effect": -70.3,
        "effect_unit": "percent_change",
        "verdict": "reproduced",
    }
    (tmp_path / "rep.json").write_text(
        json.dumps({"schema_version": 1, "tool": "x", "paper": "did", "headlines": [head], "rows": REPRODUCE})
    )
    assert er.main([str(tmp_path / "rep.json"), "--html", str(tmp_path / "h.html")]) == 0
    text = (tmp_path / "h.html").read_text()
    assert text.index("headline claims") < text.index("published values: model, paper")
    assert "-79.3%" in text and "-70.3%" in text and "1 headline claims: 1 reproduced." in text
    t = er.headline_table([head, dict(head, paper_effect=None, verdict="no_number", effect_unit="points")])
    assert t["paper effect"].to_list() == ["-79.3%", "-"]
    assert t["verdict"].to_list() == ["reproduced", "no number"]


def test_sweep_report_html_and_png(frame, tmp_path):
    rep = er.build(frame)
    names = [n for n, _ in rep.figures]
    assert names[0] == "exits by reason"
    assert "latency percentiles udp.latency_p*_us" in names
    assert "exits_per_s vs rate_pps" in names and "tig_pct vs rate_pps" in names
    er.write_html(tmp_path / "s.html", rep, dpi=40)
    text = (tmp_path / "s.html").read_text()
    assert text.count("<img ") == len(rep.figures)
    assert "<script" not in text and "http" not in text  # self-contained
    table = rep.tables[0][1]
    assert table.height == 6 and table.columns[:2] == ["rate_pps", "scheme"]
    pngs = er.write_png(tmp_path / "png", rep, dpi=40)
    assert len(pngs) == len(rep.figures)
    assert all(Path(p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


# -- command line ---------------------------------------------------------------


def test_cli_parquet_csv_and_json(frame, tmp_path):
    one_rate = frame.filter(pl.col("rate_pps") == 1e5)  # 2 charts: quicker to draw
    exitless.write_results(one_rate, tmp_path / "r.parquet")
    exitless.write_results(frame, tmp_path / "r.csv")
    (tmp_path / "rep.json").write_text(json.dumps(REPRODUCE))
    html = tmp_path / "r.html"
    assert er.main([str(tmp_path / "r.parquet"), "--html", str(html)]) == 0
    assert html.read_text().count("<img ") == len(er.build(one_rate).figures) == 2
    # CSV: the same frame back (grid values as read), the same report.
    back = er.load(tmp_path / "r.csv")
    assert back["value"].to_list() == frame["value"].to_list()
    assert [n for n, _ in er.build(back).figures] == [n for n, _ in er.build(frame).figures]
    assert (
        er.main(
            [
                str(tmp_path / "rep.json"),
                "--html",
                str(tmp_path / "rep.html"),
                "--png",
                str(tmp_path / "png"),
            ]
        )
        == 0
    )
    assert (tmp_path / "rep.html").read_text().count("<img ") == 1
    assert [p.name for p in (tmp_path / "png").iterdir()] == ["01-model-vs-paper.png"]
    # The versioned form `reproduce --json` writes: the same rows.
    versioned = {"schema_version": 1, "tool": "exitless 0.1.0", "paper": "did", "rows": REPRODUCE}
    (tmp_path / "v.json").write_text(json.dumps(versioned))
    assert er.load(tmp_path / "v.json") == er.load(tmp_path / "rep.json")


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("missing.parquet", None, "no such file"),
        ("r.txt", "x", "unknown format `.txt`"),
        ("r.csv", "scheme,seed,metric\nkvm,1,x\n", "no column `value`"),
        ("r.parquet", "not parquet", "not a readable parquet file"),
        ("r.json", "{", "not valid JSON"),
        ("r.json", '[{"experiment": "x"}]', "no `config`"),
    ],
)
def test_cli_bad_input_is_one_line_and_status_2(tmp_path, capsys, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    assert er.main([str(path), "--html", str(tmp_path / "o.html")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1
    assert not (tmp_path / "o.html").exists()


def test_cli_as_module_without_traceback(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "exitless.report", str(tmp_path / "nope.csv"), "--html", "o.html"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert r.returncode == 2 and "no such file" in r.stderr and "Traceback" not in r.stderr


def test_cli_needs_an_output(capsys):
    with pytest.raises(SystemExit) as e:
        er.main(["x.csv"])
    assert e.value.code == 2 and "--html" in capsys.readouterr().err


# -- issue 38: what a newcomer reads -------------------------------------------


def test_log_axes_label_no_minor_ticks(frame):
    fig = er.metric_vs_param(frame, "exits_per_s", "rate_pps", log_x=True, log_y=True)
    fig.canvas.draw()
    ax = fig.axes[0]
    for axis in (ax.xaxis, ax.yaxis):
        minor = [t.get_text() for t in axis.get_minorticklabels()]
        assert all(m == "" for m in minor), minor


def test_a_several_vm_summary_names_vm0_columns(tmp_path):
    three = REPO / "scenarios" / "explore" / "three-vms.toml"
    df = exitless.sweep(three, schemes=["kvm"], seeds=1, overrides={"duration_s": 0.03})
    t = er._summary_table(df)
    assert "exits_per_s" not in t.columns
    assert "vm0.exits_per_s" in t.columns, t.columns


def test_reproduce_rows_without_a_paper_value_are_folded(tmp_path):
    many = [dict(REPRODUCE[3], config=f"c{i}") for i in range(50)]
    rep = er.build([*REPRODUCE, *many])
    assert [t.height for _, t in rep.tables] == [3]
    assert [t.height for _, t in rep.folded_tables] == [51]
    out = tmp_path / "r.html"
    er.write_html(out, rep)
    text = out.read_text()
    assert "<details><summary>51 rows without a published value" in text
    assert text.count('<div class="wide">') == 2


def test_a_cli_sweep_csv_carries_its_recorded_provenance(frame, tmp_path):
    csv = tmp_path / "s.csv"
    frame.write_csv(csv)
    (tmp_path / "s.sweep.json").write_text(
        json.dumps(
            {"scenario": "scheme = 'kvm'", "sets": ["duration_s=0.05"], "calibration": "", "tool": "exitless 9.9.9"}
        )
    )
    out = tmp_path / "s.html"
    assert er.main([str(csv), "--html", str(out)]) == 0
    text = out.read_text()
    assert "exitless 9.9.9" in text
    assert "not recorded in the input" not in text
    assert "--set duration_s=0.05" in text
