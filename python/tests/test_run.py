"""exitless.run / resolve: scenarios from files and dicts, overrides, errors,
determinism, and agreement with the CLI."""

import json
import os
import subprocess
from pathlib import Path

import exitless
import pytest
import tomllib
from conftest import CYCLICTEST, FIG4, REPO, SHORT, need


def test_run_file_returns_report_in_cli_schema():
    rep = exitless.run(str(FIG4), scheme="kvm", overrides=SHORT)
    assert rep["scheme"] == "kvm"
    assert rep["scenario"] == "did.fig4"
    assert rep["duration_s"] == pytest.approx(0.02)
    vm = rep["vms"][0]
    # KVM takes an external-interrupt exit and an EOI MSR write per VF interrupt.
    assert vm["exits_per_s_by_reason"]["EXTERNAL_INTERRUPT"] > 0
    assert vm["exits_per_s_by_reason"]["MSR_WRITE"] > 0
    assert 0 < vm["tig_pct"] < 100
    assert rep["metrics"]["udp.received"] > 0
    assert rep["invariants"]["violations"] == []


def test_pathlib_path_and_str_give_the_same_report():
    assert exitless.run(FIG4, overrides=SHORT) == exitless.run(str(FIG4), overrides=SHORT)


def test_dict_scenario_equals_its_toml_file():
    with open(FIG4, "rb") as f:
        d = tomllib.load(f)
    assert exitless.run(d, overrides=SHORT) == exitless.run(FIG4, overrides=SHORT)


def test_hand_written_dict_scenario():
    d = {
        "name": "tiny",
        "scheme": "did",
        "duration_s": 0.02,
        "warmup_s": 0.005,
        "guest": {"tick": "nohz-idle"},
        "workload": {"cyclictest": {"interval_us": 200}},
        "preemptions": [{"at_ms": 5.0, "for_ms": 0.1}],
    }
    rep = exitless.run(d)
    assert rep["scenario"] == "tiny" and rep["scheme"] == "did"
    assert rep["metrics"]["cyclictest.samples"] > 0


def test_dict_with_none_value_names_the_key():
    with pytest.raises(exitless.ScenarioError, match=r"net\.device"):
        exitless.run({"scheme": "kvm", "duration_s": 0.01, "net": {"device": None}})


def test_kwargs_and_dotted_overrides_reach_the_scenario():
    s = exitless.resolve(
        FIG4,
        scheme="apicv",
        rate_pps=2.5e5,
        overrides={"guest.tick": "nohz-idle", "nic.itr": "off"},
    )
    assert s["scheme"] == "apicv"
    assert s["workload"]["udp"]["rate_pps"] == 2.5e5
    assert s["guest"]["tick"] == "nohz-idle"
    assert s["nic"]["itr"] == "off"


def test_cli_style_override_strings():
    a = exitless.resolve(FIG4, overrides=["scheme=kvm", "workload.udp.rate_pps=300000"])
    assert a["scheme"] == "kvm" and a["workload"]["udp"]["rate_pps"] == 300000


def test_override_changes_the_run():
    lo = exitless.run(FIG4, scheme="did", rate_pps=1e5, overrides=SHORT)
    hi = exitless.run(FIG4, scheme="did", rate_pps=4e5, overrides=SHORT)
    assert hi["metrics"]["udp.received"] > 3 * lo["metrics"]["udp.received"]


def test_config_key_sets_scheme_and_device():
    s = exitless.resolve(FIG4, config="pv-did")
    assert s["scheme"] == "did" and s["net"]["device"] == "virtio"


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"overrides": {"guest.no_such_key": 1}}, "no_such_key"),
        ({"overrides": {"nic.itr": "sometimes"}}, "sometimes"),
        ({"scheme": "vmware"}, "scheme"),
        ({"duration_s": -1.0}, "duration_s"),
        ({"interval_us": 10.0}, "interval_us"),  # fig4 has no cyclictest workload
    ],
)
def test_bad_override_raises_value_error_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key) as e:
        exitless.run(FIG4, **kwargs)
    assert isinstance(e.value, exitless.ScenarioError)


def test_missing_file_raises_file_not_found():
    with pytest.raises(FileNotFoundError, match="no-such.toml"):
        exitless.run(REPO / "no-such.toml")


def test_bad_argument_types():
    with pytest.raises(TypeError):
        exitless.run(42)
    with pytest.raises(TypeError):
        exitless.run(FIG4, overrides="scheme=kvm")
    with pytest.raises(exitless.ScenarioError, match="seed"):
        exitless.run(FIG4, seed=-1)


def test_same_seed_same_report_other_seed_differs():
    a = exitless.run(FIG4, seed=7, scheme="kvm", overrides=SHORT)
    b = exitless.run(FIG4, seed=7, scheme="kvm", overrides=SHORT)
    c = exitless.run(FIG4, seed=8, scheme="kvm", overrides=SHORT)
    assert a == b
    assert a["seed"] == 7 and c["seed"] == 8
    # The background exits are a seeded Poisson source.
    assert a["vms"][0] != c["vms"][0]


def test_calibration_dict_and_path():
    text = exitless.default_calibration()
    cal = tomllib.loads(text)
    base = exitless.run(FIG4, scheme="kvm", overrides=SHORT)
    assert exitless.run(FIG4, scheme="kvm", overrides=SHORT, calibration=cal) == base
    # A dearer exit raises the exit-handling share.
    key = next(k for k in cal["exit"] if "external" in k)
    cal["exit"][key]["value"] = cal["exit"][key]["value"] * 10
    dear = exitless.run(FIG4, scheme="kvm", overrides=SHORT, calibration=cal)
    assert dear["vms"][0]["eht_pct"] > base["vms"][0]["eht_pct"]


def test_bad_calibration_names_the_key(tmp_path):
    cal = tomllib.loads(exitless.default_calibration())
    sec = next(iter(cal))
    key = next(iter(cal[sec]))
    cal[sec][key]["value"] = -1.0
    with pytest.raises(exitless.ScenarioError, match=f"{sec}.{key}"):
        exitless.run(FIG4, overrides=SHORT, calibration=cal)
    p = tmp_path / "cal.toml"
    p.write_text("[nonsense]\n")
    with pytest.raises(exitless.ScenarioError, match="cal.toml"):
        exitless.run(FIG4, overrides=SHORT, calibration=p)


def test_schemes_lists_every_scheme():
    names = [n for n, _ in exitless.schemes()]
    assert {"kvm", "apicv", "eli", "elvis", "did", "naive", "bare-metal"} <= set(names)
    # The arm64 ones too, as `exitless schemes` lists them (issue 38).
    assert {"kvm-arm", "kvm-arm-v4", "did-arm"} <= set(names)
    # And the riscv64 ones (issue 40).
    assert {"kvm-riscv", "kvm-riscv-sw", "did-riscv"} <= set(names)


def test_dir_shows_the_public_names_only():
    names = dir(exitless)
    for private in ("Any", "json", "os", "Union", "Mapping", "annotations"):
        assert private not in names, private
    for public in ("run", "sweep", "schemes", "ScenarioError", "report"):
        assert public in names, public


def test_naive_scheme_violations_reach_python():
    rep = exitless.run(REPO / "validation" / "did" / "figure3.toml", overrides=SHORT)
    assert sum(rep["invariants"]["counts"].values()) > 0
    assert exitless.flatten(rep)["violations"] > 0


def _cli() -> Path:
    """The CLI binary: the tests' build (`cargo test --profile ci`, which
    .ci/run makes) or a release build."""
    name = "exitless.exe" if os.name == "nt" else "exitless"
    for profile in ("ci", "release"):
        exe = REPO / "target" / profile / name
        if exe.exists():
            return exe
    need("target/ci/exitless or target/release/exitless not built (cargo build --release)")


def test_same_report_as_the_cli_json():
    sets = ["scheme=kvm", "duration_s=0.02", "warmup_s=0.005", "seed=3"]
    out = subprocess.run(
        [
            str(_cli()),
            "-q",
            "run",
            str(CYCLICTEST),
            "--json",
            *sum((["--set", s] for s in sets), []),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert exitless.run(CYCLICTEST, overrides=sets) == json.loads(out)


def test_a_partial_calibration_is_layered_over_the_shipped_one():
    base = exitless.run(FIG4, scheme="kvm", overrides=SHORT)
    cal = tomllib.loads(exitless.default_calibration())
    key = next(k for k in cal["exit"] if "external" in k)
    whole = exitless.run(FIG4, scheme="kvm", overrides=SHORT, calibration=cal)
    assert whole == base
    # Only the entry that changes.
    part = {"exit": {key: {"value": cal["exit"][key]["value"] * 10, "source": "test"}}}
    dear = exitless.run(FIG4, scheme="kvm", overrides=SHORT, calibration=part)
    cal["exit"][key]["value"] *= 10
    same = exitless.run(FIG4, scheme="kvm", overrides=SHORT, calibration=cal)
    # The same numbers; the provenance names each entry's own source.
    assert {k: v for k, v in dear.items() if k != "provenance"} == {
        k: v for k, v in same.items() if k != "provenance"
    }
    changed = dear["provenance"]["calibration_changes"]
    assert list(changed) == [f"exit.{key}"] and changed[f"exit.{key}"]["source"] == "test"
    assert base["provenance"]["calibration_changes"] == {}
    assert dear["vms"][0]["eht_pct"] > base["vms"][0]["eht_pct"]
    with pytest.raises(exitless.ScenarioError, match="exit.no_such_us"):
        exitless.run(FIG4, overrides=SHORT, calibration={"exit": {"no_such_us": 1.0}})


def test_a_sweep_frame_converts_to_pandas():
    """pyarrow and pandas are dependencies: `df.to_pandas()` works as
    installed."""
    df = exitless.sweep(FIG4, schemes=["kvm"], overrides=SHORT)
    pdf = df.to_pandas()
    assert list(pdf.columns) == df.columns
    assert len(pdf) == df.height and pdf["value"].sum() == pytest.approx(df["value"].sum())
