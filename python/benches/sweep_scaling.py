"""Measures the Python front end: local sweep scaling (1 vs 2 threads) and
Ray's overhead per task. A measurement, not a test:

    python python/benches/sweep_scaling.py [--ray]

Prints wall time, process CPU time and CPU/wall (how many cores the
simulations kept busy) for the same sweep on 1 and 2 threads, then, with
--ray, the wall time of N tiny runs on local threads vs as Ray tasks.
"""

import argparse
import os
import time
from pathlib import Path

import exitless

FIG4 = Path(__file__).resolve().parents[2] / "validation" / "did" / "fig4.toml"


def _one(args):
    rate, scheme, seed = args
    exitless.run(FIG4, scheme=scheme, rate_pps=rate, seed=seed, duration_s=1.0)


def timed(fn, repeat):
    best = None
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        w, c = time.perf_counter() - w0, time.process_time() - c0
        if best is None or w < best[0]:
            best = (w, c)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ray", action="store_true", help="also measure the Ray back end")
    ap.add_argument("--tiny", type=int, default=200, help="tiny runs for the Ray overhead")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"cores: {os.cpu_count()}, load average at start: {os.getloadavg()}")

    # GIL: while a simulation runs in another thread, does this thread run?
    import threading

    th = threading.Thread(target=lambda: exitless.run(FIG4, rate_pps=6e5, duration_s=2.0))
    ticks, gap, last = 0, 0.0, time.perf_counter()
    w0 = last
    th.start()
    while th.is_alive():
        now = time.perf_counter()
        gap, last, ticks = max(gap, now - last), now, ticks + 1
    wall = time.perf_counter() - w0
    verdict = "the GIL is released" if gap < wall / 2 else "the GIL is HELD during the run"
    print(
        f"main thread during a {wall:.2f} s run in another thread: "
        f"{ticks} loop iterations, longest pause {gap * 1e3:.1f} ms ({verdict})"
    )

    grid = {"rate_pps": [1e5, 2e5, 4e5, 6e5]}
    kw = dict(grid=grid, schemes=["kvm", "did"], seeds=2, duration_s=1.0)
    runs = 4 * 2 * 2
    exitless.run(FIG4, duration_s=0.01)  # warm the page cache and allocator
    res = {}
    for jobs in (1, 2):
        w, c = timed(lambda j=jobs: exitless.sweep(FIG4, jobs=j, **kw), a.repeat)
        res[jobs] = w
        print(
            f"sweep of {runs} runs (fig4, 1 simulated s each), jobs={jobs}: "
            f"wall {w:.2f} s, CPU {c:.2f} s, CPU/wall {c / w:.2f}"
        )
    print(f"speed-up 1 -> 2 jobs: {res[1] / res[2]:.2f}x")
    # Baseline: the same runs in 2 processes (no GIL involved at all): what
    # this machine gives two workers right now.
    from concurrent.futures import ProcessPoolExecutor

    def procs() -> None:
        with ProcessPoolExecutor(2) as ex:
            list(
                ex.map(
                    _one,
                    [(r, s, sd) for r in grid["rate_pps"] for s in ("kvm", "did") for sd in (1, 2)],
                )
            )

    w, _ = timed(procs, a.repeat)
    print(f"same runs in 2 processes: wall {w:.2f} s (threads vs processes: {w / res[2]:.2f})")

    if a.ray:
        import ray

        n = a.tiny
        tiny = dict(grid={"rate_pps": [1e5] * 1}, seeds=n, duration_s=0.001, warmup_s=0.0005)
        w_local, _ = timed(lambda: exitless.sweep(FIG4, jobs=2, **tiny), a.repeat)
        t0 = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        t_init = time.perf_counter() - t0
        exitless.sweep(FIG4, backend="ray", **tiny)  # start the workers, register the task
        w_ray, _ = timed(lambda: exitless.sweep(FIG4, backend="ray", **tiny), a.repeat)
        ray.shutdown()
        print(
            f"{n} tiny runs (1 ms simulated): local 2 threads {w_local:.3f} s "
            f"({w_local / n * 1e3:.2f} ms/run), Ray {w_ray:.3f} s ({w_ray / n * 1e3:.2f} ms/run)"
        )
        print(
            f"Ray overhead per task: {(w_ray - w_local) / n * 1e3:.2f} ms of wall on 2 workers "
            f"({2 * (w_ray - w_local) / n * 1e3:.2f} ms of a core per task); ray.init {t_init:.1f} s"
        )


if __name__ == "__main__":
    main()
