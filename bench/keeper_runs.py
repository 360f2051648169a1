"""What the keeper benches share (warm_launch.py, fast_hang.py): the worker tests' harness for
running two pods' keepers on this machine, and the time of a log line."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "worker"))
import worker_harness as harness  # noqa: E402 (the worker tests' harness, by path)

STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")

__all__ = ["REPO", "harness", "restart_in_place", "when"]


def when(line: str) -> float | None:
    """The local time a keeper's or a rank's log line was written (None: it has no stamp)."""
    m = STAMP.match(line)
    if not m:
        return None
    return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000


def restart_in_place(
    tmp: Path, *, steps: int, memory_every: int, env: dict[str, str], what: str, nproc: int = 1
) -> tuple[list[str], int]:
    """Two keepers x `nproc` ranks of the built-in trainer to their end, the claim every 50 steps
    and the memory tier every `memory_every` (a directory per pod), `env` added: node 0's log
    lines and the index of its restart into generation 1. Raises, naming `what`, when a keeper
    did not end well."""
    root = tmp / "ckpt"
    cfg = harness.worker_config(
        root,
        train=harness.training(steps=steps),
        intervalSteps=50,
        memory={"intervalSteps": memory_every},
    )
    env = {"FSDP_CHECKPOINT_ROOT": str(root), **env}
    memory = {n: {"FSDP_MEMORY_ROOT": str(tmp / f"mem-{n}")} for n in range(2)}
    procs = harness.launch_keepers(
        tmp, restarts=1, config=cfg, env=env, nproc=nproc, node_env=memory.__getitem__
    )
    try:
        codes = harness.wait_all(procs, 300)
    finally:
        for p in procs:
            p.kill()
    if codes != [0, 0]:
        logs = harness.keeper_logs(tmp)
        raise RuntimeError(f"{what}: keepers exited {codes}\n{logs[-4000:]}")
    node0 = (tmp / "node-0.log").read_text(errors="replace").splitlines()
    at = next(i for i, line in enumerate(node0) if "restarting in place: generation 1" in line)
    return node0, at
