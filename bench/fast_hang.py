"""A hang restarted in place: the step-time rule (failurePolicy.hangStepTimes 3) against the
progress deadline alone (hangStepTimes 0), the same gang and the same hang, alternating, in one
run. Numbers, not pass/fail.

    PYTHONPATH=. .venv/bin/python bench/fast_hang.py [--reps 3] [--deadline 10]

Two keepers (fsdp_worker.keeper.gang, as two pods run them) in front of the built-in trainer on
this machine's CPUs (gloo), with the memory tier every 5 steps and the claim every 50 (as the
goodput soak's in-place runs); rank 1 stops for good in step 60's end-of-step sync (generation
0), the progress deadline (FSDP_HANG_SECONDS) is `--deadline` (the soak's 10 s) and
hangFloorSeconds 2 (its steps take 0.1 s; the default, 10 s, is for production). From node 0's
log: rank 0's step 59 (the last step every rank finished; the hang begins within the next step)
-> the failure's record (the gang's verdict) -> generation 1's first step. Issue 48's goal:
hang -> first step <= 3 step times + 5 s. Medians and min..max go to
bench/results/fast_hang.json.
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

RESULTS = REPO / "bench" / "results" / "fast_hang.json"
HANG_STEP = 60
STEP = re.compile(r'trainer: step \{"step": (\d+), "loss": [^,]+, "seconds": ([\d.]+)\}')


def _one(step_times: int, deadline: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="fast-hang-"))
    try:
        env = {
            "FSDP_TEST_FAULTS": f"stall_at@0=1:{HANG_STEP}:sync",
            "FSDP_HANG_SECONDS": str(deadline),
            "FSDP_HANG_STEP_TIMES": str(step_times),
            "FSDP_HANG_FLOOR_SECONDS": "2",  # the local detection settings: 0.1 s steps
        }
        node0, at = restart_in_place(
            tmp,
            steps=HANG_STEP + 20,
            memory_every=5,
            env=env,
            what=f"hangStepTimes {step_times}",
        )
        record = node0[at]
        failed = float(re.search(r"'time': ([\d.]+)", record).group(1))  # type: ignore[union-attr]
        before = [
            (int(m.group(1)), float(m.group(2)), x) for x in node0[:at] if (m := STEP.search(x))
        ]
        last = next(when(x) for s, _, x in before if s == HANG_STEP - 1)
        steps = [sec for s, sec, _ in before if HANG_STEP - 30 <= s < HANG_STEP]
        first = next(when(x) for x in node0[at:] if STEP.search(x) and when(x))
        assert last is not None and first is not None
        message = re.search(r"'message': '([^']*)'", record)
        return {
            "to_verdict": round(failed - last, 3),
            "to_first_step": round(first - last, 3),
            "stepSeconds": round(statistics.median(steps), 3),
            "message": message.group(1) if message else "",
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(samples), "samples": samples}
    for key in ("to_verdict", "to_first_step", "stepSeconds"):
        values = [s[key] for s in samples]
        out[key] = {
            "p50": round(statistics.median(values), 3),
            "min": min(values),
            "max": max(values),
        }
    out["goalSeconds"] = round(3 * out["stepSeconds"]["p50"] + 5.0, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--deadline", type=int, default=10)
    args = ap.parse_args()
    started = time.time()
    runs: dict[str, list[dict[str, Any]]] = {"hangStepTimes3": [], "deadlineOnly": []}
    for rep in range(args.reps):
        order = [3, 0] if rep % 2 == 0 else [0, 3]
        for step_times in order:
            sample = _one(step_times, args.deadline)
            runs["hangStepTimes3" if step_times else "deadlineOnly"].append(sample)
            print(f"rep {rep} hangStepTimes {step_times}: {sample}", flush=True)
    results = {k: _summary(v) for k, v in runs.items()}
    doc = {
        "what": "restart in place after a hang (rank 1 stops for good in step 60's end-of-step "
        "sync): rank 0's step 59 -> the gang's failure record -> generation 1's first step; "
        f"failurePolicy.hangStepTimes 3 (hangFloorSeconds 2) against 0 (the progress deadline "
        f"alone, {args.deadline} s), alternating; two keepers x 1 rank of the built-in tiny "
        "trainer, memory tier every 5 steps, claim every 50",
        "machine": f"{os.cpu_count()} cores, no GPU; keepers and ranks as host processes",
        "load": os.getloadavg()[0],
        "results": results,
        "benchSeconds": round(time.time() - started, 1),
    }
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")
    for key, r in results.items():
        print(
            f"{key}: hang -> verdict p50 {r['to_verdict']['p50']} s, -> first step p50 "
            f"{r['to_first_step']['p50']} s (goal {r['goalSeconds']} s)"
        )


if __name__ == "__main__":
    main()
