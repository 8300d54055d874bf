"""The Ray back end (skipped where Ray is not installed; .ci/run installs it)
and the package's independence from Ray."""

import subprocess
import sys

import exitless
import pytest
from conftest import FIG4, SHORT, need

GRID = {"rate_pps": [1e5, 3e5]}


def test_import_needs_neither_ray_nor_polars():
    code = (
        "import sys, exitless; exitless.run; print('ray' in sys.modules, 'polars' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.split() == ["False", "False"]


def test_ray_backend_without_ray_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(ImportError, match="pip install"):
        exitless.sweep(FIG4, grid=GRID, overrides=SHORT, backend="ray")


@pytest.fixture(scope="module")
def ray():
    try:
        import ray
    except ImportError:
        need("ray is not installed (pip install 'ray>=2,<3')")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_backend_gives_the_local_frame(ray):
    kw = dict(grid=GRID, schemes=["kvm", "did"], seeds=2, overrides=SHORT)
    seen = []
    on_ray = exitless.sweep(FIG4, backend="ray", progress=lambda d, t: seen.append((d, t)), **kw)
    local = exitless.sweep(FIG4, backend="local", jobs=2, **kw)
    assert on_ray.equals(local)
    assert seen[-1] == (8, 8)


def test_ray_dict_scenario(ray):
    # The scenario travels to the workers as TOML text, so a dict (no file
    # anywhere) runs as its file does.
    import tomllib

    a = exitless.sweep(FIG4, grid=GRID, overrides=SHORT, backend="ray")
    b = exitless.sweep(tomllib.loads(FIG4.read_text()), grid=GRID, overrides=SHORT, backend="ray")
    assert a.equals(b)


def test_ray_bad_point_fails_before_submission(ray):
    with pytest.raises(exitless.ScenarioError, match="no_such"):
        exitless.sweep(FIG4, grid={"guest.no_such": [1]}, overrides=SHORT, backend="ray")
