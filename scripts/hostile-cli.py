#!/usr/bin/env python3
"""A hostile campaign over every option of the `exitless` command line
(issue 38): each option of each subcommand gets each hostile value, the
rest of the command kept small and valid, and every outcome is counted by
class: accepted (0), refused cleanly (2, one `exitless: error:` line or
clap's usage error), results not written (1), violations (3), a panic
(101), a signal, or a hang (no exit within the deadline). A panic, a signal
or a hang is a failure; the script exits 1 if it saw one.

    python3 scripts/hostile-cli.py [path/to/exitless]
"""

import collections
import os
import subprocess
import sys
import tempfile

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/ci/exitless"
DEADLINE = 30
tmp = tempfile.mkdtemp(prefix="exitless-hostile-")
fifo = os.path.join(tmp, "fifo")
os.mkfifo(fifo)
scen = os.path.join(tmp, "s.toml")
with open(scen, "w") as f:
    f.write('scheme = "kvm"\nduration_s = 0.002\nwarmup_s = 0.001\n[workload.udp]\nrate_pps = 10000\n')
perf = os.path.join(tmp, "perf.txt")
with open(perf, "w") as f:
    f.write(
        "             VM-EXIT    Samples  Samples%     Time%    Min Time    Max Time         Avg time\n\n"
        "           MSR_WRITE      1000    100.00%   100.00%      0.50us      5.00us      1.20us ( +-   1.00% )\n"
    )
runj = os.path.join(tmp, "run.json")
subprocess.run([BIN, "-q", "run", scen, "--json"], stdout=open(runj, "w"), check=True)

HOSTILE = [
    "",
    "0",
    "-1",
    "1e308",
    "nan",
    "inf",
    "18446744073709551616",
    "4294967296",
    "x" * 70000,
    "../../etc/passwd",
    "/dev/zero",
    "/dev/null",
    fifo,
    tmp,  # a directory
    scen,  # an input as an output
    "a=b=c",
    "ü=é",
    "vm.99999.copies=2",
]

# (subcommand and its fixed valid arguments, option, takes a value)
OPTIONS = [
    (["run", scen], "--set", True),
    (["run", scen], "--vcpu", True),
    (["run", scen], "--trace", True),
    (["run", scen, "--trace", os.path.join(tmp, "t.json")], "--trace-window", True),
    (["run", scen, "--trace", os.path.join(tmp, "t.json")], "--trace-limit", True),
    (["run"], "", True),  # the scenario path itself
    (["run", scen], "--calibration", True),
    (["run", scen], "--calibration-set", True),
    (["reproduce"], "", True),  # the paper
    (["reproduce", "eli", "--only", "nomatch"], "--set", True),
    (["reproduce", "eli", "--only", "nomatch"], "--threads", True),
    (["reproduce", "eli", "--only", "nomatch"], "--seeds", True),
    (["reproduce", "eli", "--only", "nomatch"], "--seed", True),
    (["reproduce", "eli"], "--only", True),
    (["explore", scen, "--runs", "2"], "--set", True),
    (["explore", scen, "--runs", "2"], "--schemes", True),
    (["explore", scen], "--runs", True),
    (["explore", scen, "--runs", "2"], "--jitter-ns", True),
    (["explore", scen], "--replay", True),
    (["explore", scen, "--runs", "2"], "--threads", True),
    (["explore"], "", True),
    (["sweep", scen, "--out", os.path.join(tmp, "r.csv")], "--grid", True),
    (["sweep", scen, "--out", os.path.join(tmp, "r2.csv")], "--schemes", True),
    (["sweep", scen, "--out", os.path.join(tmp, "r3.csv")], "--seeds", True),
    (["sweep", scen, "--out", os.path.join(tmp, "r4.csv")], "--seed", True),
    (["sweep", scen, "--out", os.path.join(tmp, "r5.csv")], "--set", True),
    (["sweep", scen, "--out", os.path.join(tmp, "r6.csv")], "--jobs", True),
    (["sweep", scen], "--out", True),
    (["sweep", "--out", os.path.join(tmp, "r7.csv")], "", True),
    (["calibrate", "--from", perf], "--out", True),
    (["calibrate"], "--from", True),
    (["diff", runj], "", True),
    (["diff", runj, runj], "--tolerance", True),
    (["keys"], "--json", False),
    (["schemes"], "", False),
    (["calibration"], "", False),
]

classes = collections.Counter()
per_option = collections.defaultdict(collections.Counter)
failures = []
for fixed, opt, takes in OPTIONS:
    values = HOSTILE if takes else [None]
    for v in values:
        args = [BIN, "-q", *fixed]
        if opt:
            args.append(opt)
        if v is not None:
            args.append(v)
        try:
            p = subprocess.run(args, capture_output=True, timeout=DEADLINE, cwd=tmp)
            code = p.returncode
            cls = {0: "accepted", 2: "refused (2)", 1: "not written (1)", 3: "violations (3)", 101: "PANIC"}.get(
                code, f"SIGNAL {-code}" if code < 0 else f"exit {code}"
            )
            if code == 2 and b"\n" in p.stderr.strip() and b"error:" not in p.stderr:
                cls = "refused (2), unclear message"
        except subprocess.TimeoutExpired:
            cls = "HANG"
        classes[cls] += 1
        name = f"{fixed[0]} {opt or '<positional>'}"
        per_option[name][cls] += 1
        if cls in ("PANIC", "HANG") or cls.startswith("SIGNAL"):
            failures.append(f"{' '.join(a[:60] for a in args[1:])}: {cls}")
        # A fifo read by a refused command keeps no writer waiting.
total = sum(classes.values())
print(f"{total} commands over {len(OPTIONS)} options")
for c, n in classes.most_common():
    print(f"  {c}: {n}")
print("per option (accepted / refused):")
for name, c in per_option.items():
    print(f"  {name}: " + ", ".join(f"{k} {n}" for k, n in c.most_common()))
for f in failures:
    print("FAIL", f)
sys.exit(1 if failures else 0)
