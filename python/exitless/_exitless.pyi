"""Type stubs for the native module `exitless._exitless` (PyO3)."""

from os import PathLike
from typing import List, Optional, Tuple, Union

__version__: str

class ScenarioError(ValueError):
    """A scenario, override or calibration the library rejected; the message names the key or file."""

def run(
    *,
    path: Optional[Union[str, PathLike[str]]] = None,
    text: Optional[str] = None,
    sets: List[str] = ...,
    calibration_path: Optional[Union[str, PathLike[str]]] = None,
    calibration_text: Optional[str] = None,
) -> str:
    """Runs one scenario (a file or TOML text) with `KEY=VALUE` overrides,
    GIL released; returns the report as JSON (the CLI's `--json` schema)."""

def resolve(
    *,
    path: Optional[Union[str, PathLike[str]]] = None,
    text: Optional[str] = None,
    sets: List[str] = ...,
) -> str:
    """Parses and checks a scenario with overrides; returns it, resolved, as JSON."""

def check_calibration(
    *, path: Optional[Union[str, PathLike[str]]] = None, text: Optional[str] = None
) -> None:
    """Raises ScenarioError (or OSError) if the calibration is rejected."""

def toml_from_json(json: str) -> str:
    """A JSON object as TOML text; ScenarioError for null values or a non-object."""

def set_string(key: str, value_json: str) -> str:
    """`KEY=VALUE` with the value (given as JSON) written as a TOML literal."""

def schemes() -> List[Tuple[str, str]]:
    """(name, summary) of every delivery scheme."""

def default_calibration() -> str:
    """The shipped calibration's TOML text."""
