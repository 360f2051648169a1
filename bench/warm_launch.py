"""A restart in place with the warm launcher against one with a new torchrun: the same gang,
the same crash, alternating, in one run. Numbers, not pass/fail.

    PYTHONPATH=. .venv/bin/python bench/warm_launch.py [--reps 3] [--nproc 1 2]

Two keepers (fsdp_worker.keeper.gang, as two pods run them) in front of the built-in trainer on this
machine's CPUs (gloo), with the memory tier every step and the claim every 50 steps; every rank
raises after step 100 of generation 0, and both nodes restart in place. Each repetition runs
once with ``FSDP_WARM_LAUNCH=3`` (the warm launcher, fsdp_worker/keeper/warm.py, prepared 3 s after
generation 0 started) and once with ``FSDP_WARM_LAUNCH=0`` (torchrun again), in alternating
order. From node 0's log: the failure's time (its record) -> generation 1's rank 0 resumed
(`resumed from ...`, its load done) -> its first step. Medians and min..max go to
bench/results/warm_launch.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.keeper_runs import REPO, restart_in_place, when

RESULTS = REPO / "bench" / "results" / "warm_launch.json"
CRASH_STEP = 100
GOAL_SECONDS = 5.0  # issue 23: crash -> first step, p50


def _one(warm: bool, nproc: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="warm-launch-"))
    try:
        env = {
            "FSDP_TEST_FAULTS": f"crash_after@0={CRASH_STEP},step_sleep=0.05",
            "FSDP_WARM_LAUNCH": "3" if warm else "0",
        }
        node0, at = restart_in_place(
            tmp, steps=CRASH_STEP + 30, memory_every=1, env=env, what=f"warm={warm}", nproc=nproc
        )
        failed = float(re.search(r"'time': ([\d.]+)", node0[at]).group(1))  # type: ignore[union-attr]
        after = node0[at:]
        resumed = next(when(x) for x in after if "resumed from step-" in x and when(x))
        first = next(when(x) for x in after if "fsdp_worker.train.trainer: step {" in x and when(x))
        launched = any("starts from the warm launcher" in x for x in after)
        if launched != warm:
            raise RuntimeError(f"warm={warm} but the log says launched warm={launched}")
        assert resumed is not None and first is not None
        return {
            "to_resumed": round(resumed - failed, 3),
            "to_first_step": round(first - failed, 3),
            "memory": any("(memory)" in x for x in after if "resumed from" in x),
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(samples), "samples": samples}
    for key in ("to_resumed", "to_first_step"):
        values = [s[key] for s in samples]
        out[key] = {
            "p50": round(statistics.median(values), 3),
            "min": min(values),
            "max": max(values),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    started = time.time()
    results: dict[str, Any] = {}
    for nproc in args.nproc:
        runs: dict[str, list[dict[str, Any]]] = {"warm": [], "torchrun": []}
        for rep in range(args.reps):
            order = [True, False] if rep % 2 == 0 else [False, True]
            for warm in order:
                sample = _one(warm, nproc)
                runs["warm" if warm else "torchrun"].append(sample)
                print(f"nproc {nproc} rep {rep} warm={warm}: {sample}", flush=True)
        results[f"2x{nproc}"] = {k: _summary(v) for k, v in runs.items()}
    doc = {
        "what": "restart in place, crash (every rank raises after step 100 of generation 0) "
        "-> generation 1's rank 0 resumed (load done) -> its first step; warm launcher "
        "(FSDP_WARM_LAUNCH=3) against a new torchrun (FSDP_WARM_LAUNCH=0), alternating, "
        "two keepers x nproc ranks of the built-in tiny trainer, memory tier every step",
        "machine": f"{os.cpu_count()} cores, no GPU; keepers and ranks as host processes",
        "goalSeconds": GOAL_SECONDS,
        "results": results,
        "benchSeconds": round(time.time() - started, 1),
    }
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    for key, r in results.items():
        print(
            f"{key}: crash -> first step p50 warm {r['warm']['to_first_step']['p50']} s, "
            f"torchrun {r['torchrun']['to_first_step']['p50']} s"
        )


if __name__ == "__main__":
    main()
