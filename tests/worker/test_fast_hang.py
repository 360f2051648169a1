"""The fast hang rule (failurePolicy.hangStepTimes, flight.fast_deadline) under real ranks: two
pods' in-place keepers in front of real torchrun gangs of the built-in FSDP2 trainer, with a
progress deadline (FSDP_HANG_SECONDS) far longer than the test. A rank that stops in a step is
a Hang by its gang's step times and the gang restarts in place and finishes bitwise as the
uninterrupted run did; a rank's GC-like pause, jittery steps and one rank's slow saves are no
hang."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from worker_harness import keeper_logs, launch_keepers, losses, training, wait_all, worker_config

from fsdp_worker import contract

pytestmark = pytest.mark.torch

DEADLINE = "600"  # the job's progress deadline: nothing in these tests may wait for it


def _run(tmp: Path, cfg: dict[str, Any], faults: str, node_faults: str = "") -> str:
    procs = launch_keepers(
        tmp,
        restarts=2,
        config=cfg,
        env={
            contract.ENV_CHECKPOINT_ROOT: cfg["checkpoint"]["root"],
            contract.ENV_HANG_SECONDS: DEADLINE,
            contract.ENV_HANG_STEP_TIMES: "3",
            contract.ENV_HANG_FLOOR_SECONDS: "2",  # these steps take 0.1-0.4 s
        },
        node_env=lambda node: {"FSDP_TEST_FAULTS": faults + (node_faults if node else "")},
    )
    try:
        codes = wait_all(procs, 240)
    finally:
        for p in procs:
            p.kill()
    logs = keeper_logs(tmp)
    assert codes == [0, 0], logs[-6000:]
    return logs


def test_a_rank_stopped_in_a_step_restarts_the_gang_in_place_by_its_step_times(
    reference: dict[str, Any], tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    # Rank 1 stops for good in step 9's end-of-step sync (generation 0); the claim has step 5.
    # Restarted in place from step 5, it stops again in step 7, its new process's second step:
    # judged by generation 0's pace (telemetry/prior.py), not after five steps of its own.
    _run(tmp_path, worker_config(root, intervalSteps=5), "stall_at@0=1:9:sync,stall_at@1=1:7:sync")
    logs = keeper_logs(tmp_path)
    restarts = re.findall(r"restarting in place: generation (\d+) after (.*)", logs)
    assert sorted(g for g, _ in restarts) == ["1", "1", "2", "2"], logs[-6000:]  # two keepers
    # the keeper logs the Python list
    record, again = (ast.literal_eval(dict(restarts)[g])[0] for g in ("1", "2"))
    assert record["class"] == contract.FailureClass.HANG.value, record
    assert record["step"] == 8 and record["generation"] == 0, record
    # Its message is the step-time rule's, not the 600 s deadline's.
    assert "no collective and no step for" in record["message"], record
    assert "3 x its median step of" in record["message"], record
    assert again["class"] == contract.FailureClass.HANG.value, again
    assert again["step"] == 6 and again["generation"] == 1, again
    assert "3 x its previous generation's median step of" in again["message"], again
    node0 = (tmp_path / "node-0.log").read_text()
    generations = re.split(r"restarting in place: generation \d+", node0)
    assert len(generations) == 3, node0[-4000:]
    assert "resumed from step-5:" in generations[2], generations[2][-4000:]
    resumed = losses(generations[2])
    assert sorted(resumed) == list(range(6, 13))
    for step, loss in resumed.items():
        assert loss == reference["losses"][step], step  # bitwise, not approximately


def test_a_pause_jittery_steps_and_one_ranks_slow_saves_are_no_hang(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    cfg = worker_config(root, train=training(steps=40), intervalSteps=4, **{"async": True})
    # Every rank's steps up to 0.3 s longer at random; rank 1 pauses 1.2 s at step 20 (a GC
    # pause, under the 2 s floor set here); node 1's writes take 2.5 s each (its every save is
    # slow, and its peer waits for it).
    logs = _run(tmp_path, cfg, "jitter=0.3,pause_at=1:20:1.2", node_faults=",slow_write=2.5")
    assert "restarting in place" not in logs, logs[-6000:]
    assert sorted(losses((tmp_path / "node-0.log").read_text())) == list(range(1, 41))
