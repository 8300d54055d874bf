"""Sweeps: a scenario over a grid of overrides × schemes × seeds, as a
long-form polars DataFrame, on local threads or on Ray."""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TYPE_CHECKING, Any, Union

from . import _exitless
from ._exitless import ScenarioError
from ._stats import t_ppf

if TYPE_CHECKING:
    import polars as pl

#: Columns every sweep frame has besides one column per grid key.
RESERVED = ("point", "scheme", "seed", "metric", "value")

#: Metrics that count or rate events: a run with none of them reports no
#: entry, which means 0 (not "unknown"), so a sweep fills them in.
_ZERO_WHEN_ABSENT = ("exits_per_s.", "timer_exits.")

Progress = Union[None, bool, Callable[[int, int], None]]


def flatten(report: Mapping[str, Any]) -> dict[str, float | None]:
    """A run report's numbers as ``{metric: value}``, the names a sweep uses.

    - VM 0: ``exits_per_s``, ``tig_pct``, ``eht_pct`` and
      ``exits_per_s.<REASON>`` (KVM's reason names; the names
      ``validation/*/experiments.toml`` uses); further VMs the same under
      ``vm<N>.``;
    - every entry of the report's ``metrics`` map (workload metrics such as
      ``udp.received``, ``timer_exits.<REASON>``, ``iommu.msi_faults``);
    - ``violations``: the invariant checker's total.

    A value the report could not compute (NaN, written as JSON null) is None.
    """
    out: dict[str, float | None] = {}

    def put(k: str, v: Any) -> None:
        if k in out:
            raise RuntimeError(f"exitless.flatten: metric `{k}` appears twice in the report")
        out[k] = None if v is None else float(v)

    for vm in report["vms"]:
        p = "" if vm["vm"] == 0 else f"vm{vm['vm']}."
        put(p + "exits_per_s", vm["exits_per_s"])
        put(p + "tig_pct", vm["tig_pct"])
        put(p + "eht_pct", vm["eht_pct"])
        for reason, v in vm["exits_per_s_by_reason"].items():
            put(f"{p}exits_per_s.{reason}", v)
    for k, v in report["metrics"].items():
        put(k, v)
    put("violations", sum(report["invariants"]["counts"].values()))
    return out


def _zero_when_absent(name: str) -> bool:
    vm, _, rest = name.partition(".")
    base = rest if vm[:2] == "vm" and vm[2:].isdigit() else name  # vm<N>.<metric>
    return base.startswith(_ZERO_WHEN_ABSENT)


def _scenario_text(scenario: Any) -> tuple[str, str]:
    """(TOML text, origin for messages). The text, not the path, travels to
    the workers, so a cluster needs no shared file system."""
    from . import _dict_to_toml

    if isinstance(scenario, Mapping):
        return _dict_to_toml(scenario, "scenario"), "scenario dict"
    if isinstance(scenario, (str, os.PathLike)):
        p = os.fspath(scenario)
        with open(p, encoding="utf-8") as f:
            return f.read(), p
    raise TypeError(
        f"scenario must be a TOML file path (str or pathlib.Path) or a dict, not {type(scenario).__name__}"
    )


def _calibration_text(calibration: Any) -> str | None:
    from . import _dict_to_toml

    if calibration is None:
        return None
    if isinstance(calibration, Mapping):
        text = _dict_to_toml(calibration, "calibration")
        _exitless.check_calibration(text=text)
        return text
    if isinstance(calibration, (str, os.PathLike)):
        p = os.fspath(calibration)
        _exitless.check_calibration(path=p)  # the CLI's messages, naming the file
        with open(p, encoding="utf-8") as f:
            return f.read()
    raise TypeError(
        f"calibration must be None, a TOML file path or a dict, not {type(calibration).__name__}"
    )


def run_flat(text: str, sets: list[str], calibration_text: str | None) -> dict[str, float | None]:
    """One simulation of a sweep: scenario text + overrides → flat metrics.
    (The unit of work of both back ends; module level so Ray can ship it.)"""
    kw = {} if calibration_text is None else {"calibration_text": calibration_text}
    return flatten(json.loads(_exitless.run(text=text, sets=sets, **kw)))


def _grid_column(values: list[Any]) -> list[Any]:
    """Grid values as one column type: numbers stay numbers (ints widened to
    float when mixed with floats), anything else mixed becomes text."""
    kinds = {type(v) for v in values}
    if kinds <= {int} or kinds <= {float} or kinds <= {str} or kinds <= {bool}:
        return list(values)
    if kinds <= {int, float}:
        return [float(v) for v in values]
    return [v if isinstance(v, str) else json.dumps(v) for v in values]


def _progress_fn(progress: Progress) -> Callable[[int, int], None] | None:
    if progress is None or progress is False:
        return None
    if progress is True:

        def show(done: int, total: int) -> None:
            end = "\n" if done == total else ""
            print(f"\r  exitless sweep: {done}/{total} runs", end=end, file=sys.stderr, flush=True)

        return show
    if callable(progress):
        return progress
    raise TypeError("progress must be None, a bool or a callable(done, total)")


def sweep(
    scenario: Any,
    grid: Mapping[str, Sequence[Any]] | None = None,
    schemes: Sequence[str] | None = None,
    seeds: int = 1,
    *,
    seed: int | None = None,
    overrides: Any = None,
    calibration: Any = None,
    backend: str = "local",
    jobs: int | None = None,
    progress: Progress = None,
    out: None | str | os.PathLike[str] = None,
    **kwargs: Any,
) -> pl.DataFrame:
    """Run a scenario over a grid, several schemes and several seeds.

    Points are the cartesian product of the ``grid`` values (in the dict's
    key order) and ``schemes``; each point runs ``seeds`` times with seeds
    ``base, base+1, ..., base+seeds-1``, where ``base`` is ``seed`` or else
    the scenario's own seed. Every point uses the same seeds (common random
    numbers, so differences between points are not seed noise).

    Parameters
    ----------
    scenario:
        TOML file path or dict, as for :func:`exitless.run`. Its text is
        sent to the workers, so Ray workers need no shared file system.
    grid:
        ``{"dotted.key": [v1, v2, ...]}``; any key ``overrides`` takes
        (``rate_pps``, ``net.device``, ``config``, ...). ``scheme`` and
        ``seed`` are not grid keys: use ``schemes`` and ``seeds``.
    schemes:
        Schemes to run every grid point with (default: the scenario's).
    seeds:
        Runs per point, at least 1.
    seed:
        Base seed (default: the scenario's ``seed`` after overrides).
    overrides, **kwargs:
        Overrides applied to every point before the grid's, as for
        :func:`exitless.run`.
    calibration:
        As for :func:`exitless.run`.
    backend:
        ``"local"``: a thread pool in this process (the simulations release
        the GIL). ``"ray"``: one Ray task per simulation; calls
        ``ray.init()`` (a local cluster) unless Ray is already initialised,
        so call ``ray.init(address=...)`` first to use a cluster whose nodes
        have this package installed.
    jobs:
        Local threads (default: ``os.cpu_count()``); ignored by Ray, which
        schedules one CPU per task.
    progress:
        ``True`` for a counter on stderr, or a callable ``(done, total)``.
    out:
        Also write the frame to this ``.parquet`` or ``.csv`` file.

    Returns
    -------
    polars.DataFrame
        Long form, one row per point × seed × metric, sorted by point, seed
        and metric: ``point`` (0-based point id), one column per grid key,
        ``scheme``, ``seed``, ``metric``, ``value`` (Float64). Metrics are
        those of :func:`exitless.flatten`, and every run has a row for every
        metric any run of the sweep reported: exit and timer-exit counts a
        run does not report (no such exit) are 0, other values it has not
        got (a mean over no samples, e.g. ``timer_exit_us.<REASON>``) are
        null. :func:`summarize` gives mean and 95% CI across seeds.

    Every point is checked before anything runs: a bad key or value raises
    :class:`ScenarioError` naming the point and the key. The frame is the
    same whatever the back end and the number of jobs.
    """
    import polars as pl

    from . import _check_seed, _sets

    grid = dict(grid or {})
    for k, vals in grid.items():
        if not isinstance(k, str) or not k:
            raise ScenarioError(f"grid key {k!r}: expected a dotted scenario key")
        if k in RESERVED or k in ("scheme", "seed"):
            hint = {"scheme": "use schemes=[...]", "seed": "use seeds=N and seed=BASE"}.get(
                k, "the column name is taken"
            )
            raise ScenarioError(f"grid key `{k}`: not a grid key ({hint})")
        if isinstance(vals, (str, bytes)) or not isinstance(vals, Sequence) or len(vals) == 0:
            raise ScenarioError(
                f"grid key `{k}`: expected a non-empty list of values, got {vals!r}"
            )
    if isinstance(schemes, str):
        raise TypeError('schemes must be a list of scheme names, e.g. ["kvm", "did"]')
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ScenarioError(f"seeds {seeds!r}: must be an integer ≥ 1")
    if backend not in ("local", "ray"):
        raise ValueError(f'backend {backend!r}: expected "local" or "ray"')
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"jobs {jobs!r}: must be a positive integer")
    if out is not None:
        _writer(out)  # an unknown suffix fails before the sweep runs

    text, origin = _scenario_text(scenario)
    cal_text = _calibration_text(calibration)
    base_sets = _sets(overrides, kwargs)
    keys = list(grid)
    combos = list(itertools.product(*(grid[k] for k in keys)))
    scheme_list: list[str | None] = list(schemes) if schemes is not None else [None]
    if not scheme_list:
        raise ScenarioError("schemes: empty list (leave it out to run the scenario's scheme)")

    from . import _set_string

    # Points, each resolved (checked) once before anything runs.
    points: list[tuple[tuple[Any, ...], str, list[str], int]] = []
    for combo in combos:
        for sch in scheme_list:
            sets = base_sets + [_set_string(k, v) for k, v in zip(keys, combo)]
            if sch is not None:
                sets.append(_set_string("scheme", sch))
            try:
                s = json.loads(_exitless.resolve(text=text, sets=sets))
            except ScenarioError as e:
                what = ", ".join(f"{k}={v!r}" for k, v in zip(keys, combo))
                if sch is not None:
                    what = f"{what}, scheme={sch!r}" if what else f"scheme={sch!r}"
                raise ScenarioError(f"{origin}: point ({what or 'the scenario'}): {e}") from None
            base = _check_seed(seed) if seed is not None else int(s["seed"])
            if base + seeds - 1 >= 2**63:
                raise ScenarioError(f"seed {base} + {seeds} runs: past the largest seed")
            points.append((combo, s["scheme"], sets, base))

    tasks = [
        (pi, base + i, sets + [f"seed={base + i}"])
        for pi, (_, _, sets, base) in enumerate(points)
        for i in range(seeds)
    ]
    report = _progress_fn(progress)
    if backend == "ray":
        from ._ray import run_ray

        results = run_ray(text, cal_text, [t[2] for t in tasks], report)
    else:
        results = _run_local(text, cal_text, [t[2] for t in tasks], jobs, report)

    # Every (point, seed) gets every metric any run reported: counts and
    # rates a run does not report are 0, anything else (a mean over no
    # samples, such as timer_exit_us.<REASON>) is null.
    all_names = {m for r in results for m in r}
    cols: dict[str, list[Any]] = {
        c: [] for c in ["point", *keys, "scheme", "seed", "metric", "value"]
    }
    for (pi, sd, _), flat in zip(tasks, results):
        for m in all_names:
            if m not in flat:
                flat[m] = 0.0 if _zero_when_absent(m) else None
        combo, sch, _, _ = points[pi]
        names = sorted(flat)
        n = len(names)
        cols["point"].extend([pi] * n)
        for k, v in zip(keys, combo):
            cols[k].extend([v] * n)
        cols["scheme"].extend([sch] * n)
        cols["seed"].extend([sd] * n)
        cols["metric"].extend(names)
        cols["value"].extend(flat[m] for m in names)
    schema: dict[str, Any] = {
        "point": pl.Int64,
        "scheme": pl.String,
        "seed": pl.UInt64,
        "metric": pl.String,
        "value": pl.Float64,
    }
    series = [pl.Series("point", cols["point"], dtype=pl.Int64)]
    series += [pl.Series(k, _grid_column(cols[k])) for k in keys]
    series += [
        pl.Series(c, cols[c], dtype=schema[c]) for c in ("scheme", "seed", "metric", "value")
    ]
    df = pl.DataFrame(series)
    if out is not None:
        write_results(df, out)
    return df


def _run_local(
    text: str,
    cal_text: str | None,
    sets_list: list[list[str]],
    jobs: int | None,
    report: Callable[[int, int], None] | None,
) -> list[dict[str, float | None]]:
    jobs = jobs or os.cpu_count() or 1
    total = len(sets_list)
    results: list[dict[str, float | None] | None] = [None] * total
    if jobs == 1:
        for i, sets in enumerate(sets_list):
            results[i] = run_flat(text, sets, cal_text)
            if report:
                report(i + 1, total)
    else:
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="exitless") as ex:
            futs = {
                ex.submit(run_flat, text, sets, cal_text): i for i, sets in enumerate(sets_list)
            }
            try:
                for done, f in enumerate(as_completed(futs), 1):
                    results[futs[f]] = f.result()
                    if report:
                        report(done, total)
            except BaseException:
                for f in futs:
                    f.cancel()
                raise
    return results  # type: ignore[return-value]


def summarize(df: pl.DataFrame, confidence: float = 0.95) -> pl.DataFrame:
    """Mean and Student-t confidence interval across seeds.

    Groups ``df`` (a :func:`sweep` frame) by every column but ``seed`` and
    ``value`` (so by point, grid values, scheme and metric) and returns,
    per group: ``n`` (seeds with a value), ``mean``, ``std`` (sample,
    ddof=1), ``ci_half`` = t(1-(1-confidence)/2, n-1) · std / √n,
    ``ci_low`` and ``ci_high``. With n = 1 there is no spread: std and the
    CI are null.
    """
    import polars as pl

    if not (0.0 < confidence < 1.0):
        raise ValueError(f"confidence {confidence}: must be in (0, 1)")
    missing = [c for c in ("seed", "metric", "value") if c not in df.columns]
    if missing:
        raise ValueError(f"summarize: not a sweep frame (no column {', '.join(missing)})")
    keys = [c for c in df.columns if c not in ("seed", "value")]
    g = df.group_by(keys, maintain_order=True).agg(
        pl.col("value").count().cast(pl.Int64).alias("n"),
        pl.col("value").mean().alias("mean"),
        pl.col("value").std(ddof=1).alias("std"),
    )
    p = 1.0 - (1.0 - confidence) / 2.0
    quantile = {n: t_ppf(p, n - 1) for n in set(g["n"].to_list()) if n is not None and n >= 2}
    g = g.with_columns(
        pl.Series("_t", [quantile.get(n) for n in g["n"].to_list()], dtype=pl.Float64)
    )
    half = pl.col("_t") * pl.col("std") / pl.col("n").cast(pl.Float64).sqrt()
    return g.with_columns(
        half.alias("ci_half"),
        (pl.col("mean") - half).alias("ci_low"),
        (pl.col("mean") + half).alias("ci_high"),
    ).drop("_t")


def _writer(path: Any) -> str:
    p = str(os.fspath(path))
    ext = os.path.splitext(p)[1].lower()
    if ext not in (".parquet", ".csv"):
        raise ValueError(f"{p}: write .parquet or .csv (by the file's suffix)")
    return ext


def write_results(df: pl.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write a sweep (or :func:`summarize`) frame to ``.parquet`` or ``.csv``,
    chosen by the suffix: ``df.write_parquet`` / ``df.write_csv``."""
    if _writer(path) == ".parquet":
        df.write_parquet(os.fspath(path))
    else:
        df.write_csv(os.fspath(path))
