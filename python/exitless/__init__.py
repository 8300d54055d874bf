"""exitless from Python: run the virtual platform and sweep it.

The simulator is the Rust library itself, loaded as the native module
``exitless._exitless`` (PyO3): no subprocess, no second implementation. A run
releases the GIL, so threads run simulations on several cores at once.

>>> import exitless
>>> rep = exitless.run("validation/did/fig4.toml", scheme="kvm", rate_pps=2e5,
...                    overrides={"duration_s": 0.05})
>>> rep["vms"][0]["exits_per_s"]           # doctest: +SKIP
>>> df = exitless.sweep("validation/did/fig4.toml", grid={"rate_pps": [1e5, 4e5]},
...                     schemes=["kvm", "did"], seeds=3)   # doctest: +SKIP
>>> exitless.summarize(df)                  # doctest: +SKIP

Scenarios are TOML files (a ``str`` or ``pathlib.Path``) or dicts with the
same structure (``tomllib.load`` of a file gives one). Overrides are the CLI's
``--set KEY=VALUE``: dotted keys in ``overrides={"guest.tick": "nohz-idle"}``,
the short keys (``scheme``, ``rate_pps``, ``duration_s``, ...) also as keyword
arguments. Everything the library rejects raises :class:`ScenarioError`, a
``ValueError`` whose message names the key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any, Union

from . import _exitless
from ._exitless import ScenarioError

__version__: str = _exitless.__version__

__all__ = [
    "ScenarioError",
    "run",
    "resolve",
    "sweep",
    "summarize",
    "sensitivity",
    "flatten",
    "write_results",
    "schemes",
    "default_calibration",
    "__version__",
]

#: A scenario: a TOML file's path, or the same table as a dict.
Scenario = Union[str, "os.PathLike[str]", Mapping[str, Any]]
#: A calibration: None for the shipped one, a TOML file's path, or a dict;
#: either is layered over the shipped calibration (it may give only the
#: entries it changes).
Calibration = Union[None, str, "os.PathLike[str]", Mapping[str, Any]]
#: Overrides: {dotted key: value}, or CLI-style "KEY=VALUE" strings.
Overrides = Union[None, Mapping[str, Any], Iterable[str]]


def _dict_to_toml(d: Mapping[str, Any], what: str) -> str:
    try:
        text = json.dumps(d, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ScenarioError(
            f"{what} dict: {e} (values must be str, int, float, bool, lists or dicts; "
            "non-finite floats are not allowed)"
        ) from None
    return _exitless.toml_from_json(text)


def _scenario_kwargs(scenario: Scenario) -> dict[str, str]:
    """`path=` or `text=` for the native functions."""
    if isinstance(scenario, Mapping):
        return {"text": _dict_to_toml(scenario, "scenario")}
    if isinstance(scenario, (str, os.PathLike)):
        return {"path": os.fspath(scenario)}
    raise TypeError(
        f"scenario must be a TOML file path (str or pathlib.Path) or a dict, not {type(scenario).__name__}"
    )


def _calibration_kwargs(calibration: Calibration) -> dict[str, str]:
    if calibration is None:
        return {}
    if isinstance(calibration, Mapping):
        return {"calibration_text": _dict_to_toml(calibration, "calibration")}
    if isinstance(calibration, (str, os.PathLike)):
        return {"calibration_path": os.fspath(calibration)}
    raise TypeError(
        f"calibration must be None, a TOML file path or a dict, not {type(calibration).__name__}"
    )


def _set_string(key: str, value: Any) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    try:
        value_json = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ScenarioError(f"override `{key}`: {e}") from None
    return _exitless.set_string(str(key), value_json)


def _sets(overrides: Overrides, kwargs: Mapping[str, Any], seed: int | None = None) -> list[str]:
    """Overrides as the CLI's ``--set`` strings, in the order given."""
    out: list[str] = []
    if overrides is None:
        pass
    elif isinstance(overrides, Mapping):
        out.extend(_set_string(k, v) for k, v in overrides.items())
    elif isinstance(overrides, str):
        raise TypeError('overrides must be a dict or a list of "KEY=VALUE" strings, not one str')
    else:
        for s in overrides:
            if not isinstance(s, str):
                raise TypeError(f'overrides: expected "KEY=VALUE" strings, got {s!r}')
            out.append(s)
    out.extend(_set_string(k, v) for k, v in kwargs.items())
    if seed is not None:
        out.append(_set_string("seed", _check_seed(seed)))
    return out


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not (0 <= seed < 2**63):
        raise ScenarioError(f"seed {seed!r}: must be an integer in [0, 2^63)")
    return seed


def run(
    scenario: Scenario,
    seed: int | None = None,
    calibration: Calibration = None,
    overrides: Overrides = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run one scenario and return its report.

    Parameters
    ----------
    scenario:
        A scenario TOML file (``str`` or ``pathlib.Path``) or a dict with the
        same tables and keys.
    seed:
        The RNG seed (default: the scenario's ``seed``).
    calibration:
        ``None`` for the shipped calibration, another calibration TOML file,
        or a dict holding a whole calibration table.
    overrides:
        ``{"dotted.key": value}`` (e.g. ``{"guest.tick": "nohz-idle"}``), or
        a list of CLI-style ``"KEY=VALUE"`` strings (the value read as a TOML
        literal, else as a bare string), applied in order before checking.
    **kwargs:
        More overrides whose keys are Python identifiers: the short keys
        ``scheme``, ``config``, ``duration_s``, ``warmup_s``, ``rate_pps``,
        ``iterations``, ``interval_us``, ``msg_bytes``, ``rate_rps``, ``itr``
        or any top-level key. Applied after ``overrides``.

    Returns
    -------
    dict
        The report in the CLI's ``run --json`` schema: ``scenario``,
        ``scheme``, ``seed``, ``duration_s``, ``vms`` (per VM:
        ``exits_per_s``, ``exits_per_s_by_reason``, ``tig_pct``,
        ``eht_pct``, the exit table ``exits``, ...), ``metrics`` (workload
        metrics), ``invariants`` (``violations``, ``counts``, ...) and
        ``assumptions``. Same scenario, overrides and seed give an equal
        report.

    Raises
    ------
    ScenarioError
        (a ``ValueError``) for an unknown key, a wrong type or a value out
        of range, with the library's message naming the key.
    OSError
        if the scenario or calibration file cannot be read.

    The simulation runs with the GIL released.
    """
    sets = _sets(overrides, kwargs, seed)
    text = _exitless.run(
        sets=sets, **_scenario_kwargs(scenario), **_calibration_kwargs(calibration)
    )
    report: dict[str, Any] = json.loads(text)
    return report


def resolve(
    scenario: Scenario,
    seed: int | None = None,
    overrides: Overrides = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Parse and check a scenario with its overrides, without running it.

    Returns the scenario as the library sees it (``config`` expanded into
    ``scheme`` and ``net.device``, every default filled in) as a dict, or
    raises :class:`ScenarioError` naming the offending key. Arguments as
    for :func:`run`.
    """
    sets = _sets(overrides, kwargs, seed)
    resolved: dict[str, Any] = json.loads(
        _exitless.resolve(sets=sets, **_scenario_kwargs(scenario))
    )
    return resolved


def schemes() -> list[tuple[str, str]]:
    """The delivery schemes as (name, summary) pairs: the x86 ones, then the
    arm64 ones (their summaries start with ``(arch = "arm64")``), then the
    riscv64 ones (``(arch = "riscv64")``)."""
    return list(_exitless.schemes())


def default_calibration() -> str:
    """The shipped calibration file's TOML text (every primitive cost with its source)."""
    return _exitless.default_calibration()


# The sweep half needs polars; imported here so `exitless.sweep` is a plain
# attribute, but polars itself is only imported when a sweep runs.
from ._sweep import flatten, summarize, sweep, write_results  # noqa: E402
from ._sensitivity import sensitivity  # noqa: E402


def __dir__() -> list[str]:
    """The public names only (PEP 562): what ``import json`` or ``Any`` the
    module uses for itself is not its interface."""
    return sorted(__all__ + ["Scenario", "Calibration", "Overrides", "report"])
