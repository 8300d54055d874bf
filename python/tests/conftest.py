"""Shared fixtures: the repository's scenarios, shortened so each run takes
milliseconds."""

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIG4 = REPO / "validation" / "did" / "fig4.toml"
CYCLICTEST = REPO / "validation" / "did" / "cyclictest.toml"

#: Short runs: a few ms of simulated time is enough to exercise every path.
SHORT = {"duration_s": 0.02, "warmup_s": 0.005}


@pytest.fixture
def fig4() -> Path:
    return FIG4


@pytest.fixture
def repo() -> Path:
    return REPO
