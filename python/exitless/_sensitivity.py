"""Sensitivity analyses: which calibration entries a scenario's outputs rest
on, as ``exitless sensitivity`` computes them, on local threads or on Ray."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import _exitless
from ._sweep import Progress, _calibration_text, _progress_fn, _scenario_text, run_flat


def sensitivity(
    scenario: Any,
    *,
    entries: Sequence[str] | None = None,
    factors: Sequence[float] = (0.5, 2.0),
    overrides: Any = None,
    calibration: Any = None,
    backend: str = "local",
    jobs: int | None = None,
    progress: Progress = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Vary each calibration entry on its own and rank, per output, the
    entries that move it most.

    The same analysis as the command line's ``exitless sensitivity``: each
    selected entry (``entries``: keys or globs such as ``"exit.*"``; all by
    default) times each of ``factors``, everything else held, entries that
    bound each other varied together, the ARM file's entries skipped for an
    x86 scenario. Returns the ``sensitivity --json`` schema as a dict:
    ``outputs`` (one per metric, ``ranked`` entries with their ``sides``:
    the entry's value, the output and its change in % at each factor),
    ``unmoved`` and ``skipped`` entries.

    ``backend="local"`` runs on ``jobs`` threads (the GIL is released while
    a simulation runs); ``"ray"`` runs one Ray task per simulation. The
    result does not depend on either.
    """
    from . import _sets

    if backend not in ("local", "ray"):
        raise ValueError(f'backend {backend!r}: expected "local" or "ray"')
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"jobs {jobs!r}: must be a positive integer")
    text, origin = _scenario_text(scenario)
    cal_text = _calibration_text(calibration)
    sets = _sets(overrides, kwargs)
    common = {
        "text": text,
        "sets": sets,
        "calibration_text": cal_text,
        "entries": list(entries or []),
        "factors": [float(f) for f in factors],
    }
    plan = json.loads(_exitless.sensitivity_plan(**common))
    # The base run, then one per variation, each with its own calibration.
    cals: list[str | None] = [cal_text] + [v["calibration_text"] for v in plan["variations"]]
    report = _progress_fn(progress)
    if backend == "ray":
        from ._ray import run_ray_calibrations

        results = run_ray_calibrations(text, sets, cals, report)
    else:
        results = _run_local(text, sets, cals, jobs, report)
    analysis: dict[str, Any] = json.loads(
        _exitless.sensitivity_analyze(
            base=json.dumps(results[0]),
            results=json.dumps(results[1:]),
            origin=origin,
            **common,
        )
    )
    return analysis


def _run_local(
    text: str,
    sets: list[str],
    cals: list[str | None],
    jobs: int | None,
    report: Callable[[int, int], None] | None,
) -> list[dict[str, float | None]]:
    import os

    jobs = jobs or os.cpu_count() or 1
    out: list[dict[str, float | None]] = []
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="exitless") as ex:
        # map keeps the order of submission whatever order runs end in.
        for i, r in enumerate(ex.map(lambda c: run_flat(text, sets, c), cals), 1):
            out.append(r)
            if report:
                report(i, len(cals))
    return out
