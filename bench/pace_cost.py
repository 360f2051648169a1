"""What the straggler measure (fsdp_worker.telemetry.pace) costs a step, on this machine's CPUs.

Two figures:
- micro: the code pace adds, timed alone: a step's begin and end (no window), the clock reads
  flight adds to every collective, and one window's exchange (an all-gather of 3 floats per
  rank, under torchrun with gloo) divided by the window;
- end to end: the built-in trainer (tiny model, gloo, 2 ranks), median step seconds with pace
  on and off (`--off` patches pace.Pace away), runs alternated on/off/on/off.

    PYTHONPATH=worker python bench/pace_cost.py --steps 150 --pairs 3 \
        --out bench/results/pace_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _micro_step(n: int = 200_000) -> float:
    """Seconds of Pace.begin + Pace.end per step, outside a window boundary."""
    import torch

    from fsdp_worker.telemetry import pace

    tracker = pace.Pace(world_size=2, device=torch.device("cpu"), window=10**9)

    def step() -> None:
        tracker.begin()
        tracker.end(1)

    return timeit.timeit(step, number=n) / n


def _micro_collective(n: int = 1_000_000) -> float:
    """Seconds flight's wrapper now adds per blocking collective: two clock reads, a thread
    check and an add."""
    import threading

    owner = threading.get_ident()
    total = [0.0]

    def added() -> None:
        began = time.monotonic()
        if threading.get_ident() == owner:
            total[0] += time.monotonic() - began

    return timeit.timeit(added, number=n) / n


def _exchange_in_torchrun() -> None:
    """Inside torchrun: time the window exchange (Pace.end at a boundary), rank 0 prints it."""
    import torch
    import torch.distributed as dist

    from fsdp_worker.telemetry import pace

    dist.init_process_group("gloo")
    tracker = pace.Pace(world_size=dist.get_world_size(), device=torch.device("cpu"), window=1)
    tracker.computes = [0.1] * pace.MIN_SAMPLES
    tracker.waits = [0.0] * pace.MIN_SAMPLES
    times = []
    for step in range(1, 201):
        dist.barrier()
        began = time.perf_counter()
        tracker.computes, tracker.waits = [0.1] * 5, [0.0] * 5
        tracker.end(step)
        times.append(time.perf_counter() - began)
    if dist.get_rank() == 0:
        print("EXCHANGE", json.dumps(statistics.median(times)))
    dist.destroy_process_group()


def _torchrun(nproc: int, entry: list[str], env: dict[str, str]) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={nproc}", *entry]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
    return done.stdout + done.stderr


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FSDP_", "MASTER_"))}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "worker"), str(REPO)])
    return env


def _train(tmp: Path, *, steps: int, off: bool, name: str) -> tuple[float, float]:
    """Median step seconds of the built-in trainer, pace on or off; collectives per step."""
    training = {
        "steps": steps,
        "globalBatchSize": 12,
        "microBatchSize": 1,
        "model": {"preset": "tiny", "seqLen": 16, "vocabSize": 64},
        "optimizer": {"lr": 0.01},
    }
    cfg = {"training": training, "checkpoint": {"root": str(tmp / name), "intervalSteps": 10**6}}
    (tmp / f"{name}.json").write_text(json.dumps(cfg))
    env = _env() | {"FSDP_WORKER_CONFIG_FILE": str(tmp / f"{name}.json"), "FSDP_ATTEMPT": "1"}
    env["FSDP_TERMINATION_LOG"] = str(tmp / f"{name}.term")
    entry = [str(Path(__file__).resolve()), "--trainer", *(["--off"] if off else [])]
    log = _torchrun(2, entry, env)
    seconds: list[float] = [
        float(json.loads(line.split("step ", 1)[1])["seconds"])
        for line in log.splitlines()
        if "fsdp_worker.train.trainer: step {" in line
    ]
    count = float(json.loads(log.split("COLLECTIVES ", 1)[1].splitlines()[0]))
    return statistics.median(seconds[5:]), count  # the first steps warm up


def _trainer(off: bool) -> int:
    from fsdp_worker import kit
    from fsdp_worker.telemetry import flight, pace
    from fsdp_worker.train import main, trainer

    if off:
        pace.Pace = lambda **_: None  # type: ignore[assignment,misc]
    run = trainer.run

    def counted(loop: trainer.Loop) -> None:
        """Blocking collectives per step: what the per-collective cost is multiplied by."""
        run(loop)
        recorder = flight.current()
        if loop.dist.rank == 0 and recorder is not None and loop.steps_run:
            print("COLLECTIVES", json.dumps(recorder.collectives / loop.steps_run), flush=True)

    trainer.run = counted
    return kit.main(main._train)


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    micro = {"stepSeconds": _micro_step(), "perCollectiveSeconds": _micro_collective()}
    out = _torchrun(2, [str(Path(__file__).resolve()), "--exchange"], _env())
    exchange = json.loads(out.split("EXCHANGE ", 1)[1].splitlines()[0])
    micro |= {"exchangeSeconds": exchange, "window": 20, "exchangePerStep": exchange / 20}
    runs: dict[str, list[float]] = {"on": [], "off": []}
    collectives = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            for mode in ("on", "off"):
                median, collectives = _train(
                    Path(tmp), steps=args.steps, off=mode == "off", name=f"{mode}{pair}"
                )
                runs[mode].append(median)
    micro["collectivesPerStep"] = collectives
    micro["addedPerStep"] = (
        micro["stepSeconds"]
        + collectives * micro["perCollectiveSeconds"]
        + micro["exchangePerStep"]
    )
    return {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.1f}",
        "micro": micro,
        "endToEnd": {
            "ranks": 2,
            "steps": args.steps,
            "medianStepSeconds": runs,
            "onMinusOff": statistics.median(runs["on"]) - statistics.median(runs["off"]),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--out", default="")
    parser.add_argument("--exchange", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--off", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.exchange:
        _exchange_in_torchrun()
        return 0
    if args.trainer:
        return _trainer(args.off)
    result = _measure(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
