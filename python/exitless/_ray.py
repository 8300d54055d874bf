"""The Ray back end of :func:`exitless.sweep`: one Ray task per simulation.

Ray is optional: it is imported only when ``backend="ray"`` is asked for.
"""

from __future__ import annotations

from typing import Any, Callable

_remote: Any = None


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            "exitless.sweep(backend='ray') needs Ray: pip install 'ray>=2,<3' "
            "(or pip install 'exitless[ray]')"
        ) from e
    return ray


def _task() -> Any:
    """The remote function, made once (Ray registers it on first use)."""
    global _remote
    if _remote is None:
        ray = _ray()
        from ._sweep import run_flat

        # One CPU per task: a simulation is single-threaded.
        _remote = ray.remote(num_cpus=1)(run_flat)
    return _remote


def run_ray(
    text: str,
    calibration_text: str | None,
    sets_list: list[list[str]],
    report: Callable[[int, int], None] | None,
) -> list[dict[str, float | None]]:
    """Runs every simulation as a Ray task; results in submission order."""
    ray = _ray()
    if not ray.is_initialized():
        # A local cluster on this machine; to use a real cluster, call
        # ray.init(address=...) before the sweep.
        ray.init(include_dashboard=False, log_to_driver=False)
    task = _task()
    # The scenario and calibration go to the object store once, not per task.
    text_ref = ray.put(text)
    cal_ref = ray.put(calibration_text)
    refs = [task.remote(text_ref, s, cal_ref) for s in sets_list]
    if report:
        pending = list(refs)
        done = 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=min(len(pending), 64), timeout=1.0)
            done += len(ready)
            if ready:
                report(done, len(refs))
    return list(ray.get(refs))


def run_ray_calibrations(
    text: str,
    sets: list[str],
    calibration_texts: list[str | None],
    report: Callable[[int, int], None] | None,
) -> list[dict[str, float | None]]:
    """One Ray task per calibration (a sensitivity analysis's variations),
    the same scenario and overrides each; results in submission order."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    task = _task()
    text_ref = ray.put(text)
    refs = [task.remote(text_ref, sets, c) for c in calibration_texts]
    if report:
        pending = list(refs)
        done = 0
        while pending:
            ready, pending = ray.wait(pending, num_returns=min(len(pending), 64), timeout=1.0)
            done += len(ready)
            if ready:
                report(done, len(refs))
    return list(ray.get(refs))
