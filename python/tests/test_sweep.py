"""exitless.sweep: shape, seeds, agreement with run(), back ends, output files."""

import exitless
import polars as pl
import pytest
from conftest import FIG4, SHORT

GRID = {"rate_pps": [1e5, 3e5]}
SCHEMES = ["kvm", "did"]


@pytest.fixture(scope="module")
def frame():
    return exitless.sweep(FIG4, grid=GRID, schemes=SCHEMES, seeds=3, overrides=SHORT, jobs=2)


def test_columns_and_long_form_shape(frame):
    assert frame.columns == ["point", "rate_pps", "scheme", "seed", "metric", "value"]
    assert frame.schema["value"] == pl.Float64 and frame.schema["rate_pps"] == pl.Float64
    points = frame.select("point", "rate_pps", "scheme").unique(maintain_order=True).rows()
    assert points == [(0, 1e5, "kvm"), (1, 1e5, "did"), (2, 3e5, "kvm"), (3, 3e5, "did")]
    # Every (point, seed) carries the same metrics, once each.
    per_run = (
        frame.group_by("point", "seed").agg(pl.col("metric").sort()).get_column("metric").to_list()
    )
    assert all(m == per_run[0] for m in per_run)
    assert len(set(per_run[0])) == len(per_run[0])
    assert frame.height == 4 * 3 * len(per_run[0])
    for m in (
        "exits_per_s",
        "tig_pct",
        "eht_pct",
        "violations",
        "udp.received",
        "exits_per_s.MSR_WRITE",
    ):
        assert m in per_run[0]


def test_seeds_count_up_from_the_scenario_seed(frame):
    assert sorted(frame["seed"].unique().to_list()) == [1, 2, 3]  # fig4.toml: seed = 1
    df = exitless.sweep(FIG4, grid={"rate_pps": [1e5]}, seeds=2, seed=40, overrides=SHORT)
    assert sorted(df["seed"].unique().to_list()) == [40, 41]


def test_values_are_those_of_run(frame):
    rep = exitless.run(FIG4, seed=2, scheme="kvm", rate_pps=3e5, overrides=SHORT)
    flat = exitless.flatten(rep)
    got = dict(
        frame.filter((pl.col("point") == 2) & (pl.col("seed") == 2))
        .select("metric", "value")
        .rows()
    )
    for k, v in flat.items():
        assert got[k] == v


def test_absent_exit_reasons_are_zero(frame):
    # DID delivers the VF's interrupts without exits; the reason KVM takes
    # for them appears in DID's rows as 0, not as a missing row.
    ext = frame.filter(pl.col("metric") == "exits_per_s.EXTERNAL_INTERRUPT")
    assert ext.height == 12
    assert ext.filter(pl.col("scheme") == "did")["value"].to_list() == [0.0] * 6
    assert all(v > 0 for v in ext.filter(pl.col("scheme") == "kvm")["value"])


def test_one_thread_and_two_threads_give_the_same_frame(frame):
    one = exitless.sweep(FIG4, grid=GRID, schemes=SCHEMES, seeds=3, overrides=SHORT, jobs=1)
    assert one.equals(frame)


def test_dict_scenario_and_string_grid_values():
    import tomllib

    with open(FIG4, "rb") as f:
        d = tomllib.load(f)
    df = exitless.sweep(
        d, grid={"net.device": ["vf", "virtio"], "nic.itr": ["dynamic", "off"]}, overrides=SHORT
    )
    assert df.columns[:3] == ["point", "net.device", "nic.itr"]
    assert df.select("net.device", "nic.itr").unique(maintain_order=True).rows() == [
        ("vf", "dynamic"),
        ("vf", "off"),
        ("virtio", "dynamic"),
        ("virtio", "off"),
    ]


def test_summarize_a_sweep(frame):
    s = exitless.summarize(frame)
    # n counts the seeds with a value: 3, or fewer for a mean only some
    # runs had samples for (the service time of exits a guest timer landed
    # in: in a short run, a timer lands in an exit in some seeds only).
    assert set(s["n"].to_list()) <= {0, 1, 2, 3}
    partial = s.filter(pl.col("n").is_in([1, 2]))["metric"].to_list()
    assert all(m.startswith("timer_exit_us.") for m in partial), partial
    assert s.filter(pl.col("metric") == "exits_per_s")["n"].to_list() == [3] * 4
    assert s.filter(pl.col("n") == 0)["mean"].null_count() == s.filter(pl.col("n") == 0).height
    assert s.height == frame.height // 3
    row = s.filter((pl.col("point") == 0) & (pl.col("metric") == "exits_per_s")).row(0, named=True)
    vals = frame.filter((pl.col("point") == 0) & (pl.col("metric") == "exits_per_s"))["value"]
    assert row["mean"] == pytest.approx(vals.mean())
    assert row["ci_low"] <= row["mean"] <= row["ci_high"]


def test_bad_point_fails_before_anything_runs():
    calls = []
    with pytest.raises(exitless.ScenarioError, match=r"nic\.itr.*sometimes|sometimes") as e:
        exitless.sweep(
            FIG4,
            grid={"nic.itr": ["off", "sometimes"]},
            overrides=SHORT,
            progress=lambda d, t: calls.append(d),
        )
    assert "point" in str(e.value)
    assert calls == []


@pytest.mark.parametrize("key", ["scheme", "seed", "metric", "value", "point"])
def test_reserved_grid_keys(key):
    with pytest.raises(exitless.ScenarioError, match=key):
        exitless.sweep(FIG4, grid={key: [1]}, overrides=SHORT)


def test_argument_checks():
    with pytest.raises(exitless.ScenarioError, match="seeds"):
        exitless.sweep(FIG4, seeds=0)
    with pytest.raises(exitless.ScenarioError, match="rate_pps"):
        exitless.sweep(FIG4, grid={"rate_pps": []})
    with pytest.raises(ValueError, match="backend"):
        exitless.sweep(FIG4, backend="slurm")
    with pytest.raises(ValueError, match=r"\.xlsx"):
        exitless.sweep(FIG4, out="results.xlsx")
    with pytest.raises(TypeError):
        exitless.sweep(FIG4, schemes="kvm")


def test_progress_callback_counts_every_run():
    seen = []
    exitless.sweep(
        FIG4, grid=GRID, seeds=2, overrides=SHORT, progress=lambda d, t: seen.append((d, t))
    )
    assert seen[-1] == (4, 4) and [d for d, _ in seen] == [1, 2, 3, 4]


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_out_file_round_trips(frame, tmp_path, suffix):
    p = tmp_path / f"results{suffix}"
    exitless.write_results(frame, p)
    back = pl.read_parquet(p) if suffix == ".parquet" else pl.read_csv(p, schema=frame.schema)
    assert back.equals(frame)
    q = tmp_path / f"direct{suffix}"
    df = exitless.sweep(FIG4, grid={"rate_pps": [1e5]}, overrides=SHORT, out=q)
    assert q.exists() and q.stat().st_size > 0 and df.height > 0
