"""Shared fixtures: the repository's scenarios, shortened so each run takes
milliseconds."""

import os
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


#: Set by .ci/run: a test whose optional piece is missing (Ray, the CLI
#: binary) fails instead of being skipped, so CI cannot pass without them.
STRICT = os.environ.get("EXITLESS_TEST_STRICT") == "1"


def need(reason: str) -> None:
    """Skip for a missing optional piece, or fail under EXITLESS_TEST_STRICT=1."""
    if STRICT:
        pytest.fail(f"{reason} (EXITLESS_TEST_STRICT=1)")
    pytest.skip(reason)
