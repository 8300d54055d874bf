"""Type stubs for the native module `exitless._exitless` (PyO3)."""

from os import PathLike

__version__: str

class ScenarioError(ValueError):
    """A scenario, override or calibration the library rejected; the message names the key or file."""

def run(
    *,
    path: str | PathLike[str] | None = None,
    text: str | None = None,
    sets: list[str] = ...,
    calibration_path: str | PathLike[str] | None = None,
    calibration_text: str | None = None,
) -> str:
    """Runs one scenario (a file or TOML text) with `KEY=VALUE` overrides,
    GIL released; returns the report as JSON (the CLI's `--json` schema)."""

def resolve(
    *,
    path: str | PathLike[str] | None = None,
    text: str | None = None,
    sets: list[str] = ...,
) -> str:
    """Parses and checks a scenario with overrides; returns it, resolved, as JSON."""

def check_calibration(*, path: str | PathLike[str] | None = None, text: str | None = None) -> None:
    """Raises ScenarioError (or OSError) if the calibration is rejected."""

def toml_from_json(json: str) -> str:
    """A JSON object as TOML text; ScenarioError for null values or a non-object."""

def set_string(key: str, value_json: str) -> str:
    """`KEY=VALUE` with the value (given as JSON) written as a TOML literal."""

def schemes() -> list[tuple[str, str]]:
    """(name, summary) of every delivery scheme, x86 then arm64."""

def default_calibration() -> str:
    """The shipped calibration's TOML text."""

def sensitivity_plan(
    *,
    text: str,
    sets: list[str] = ...,
    calibration_text: str | None = None,
    entries: list[str] = ...,
    factors: list[float] = ...,
) -> str:
    """JSON: the variations (entry, factor, calibration_text), skipped entries."""

def sensitivity_analyze(
    *,
    text: str,
    base: str,
    results: str,
    sets: list[str] = ...,
    calibration_text: str | None = None,
    entries: list[str] = ...,
    factors: list[float] = ...,
    origin: str = ...,
) -> str:
    """JSON: the analysis (`exitless sensitivity --json`'s schema)."""
