"""Each rank's flight record (flight.py), on a real torchrun gang: a rank that stops stepping
is told apart from the ranks that wait for it, before anything is torn down."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from worker_harness import launch, training, worker_config

from fsdp_operator import explain
from fsdp_worker import contract, flight

pytestmark = pytest.mark.torch
HANG_SECONDS = 3
RANKS = 4


def _stalled_gang(tmp_path: Path, fault: str) -> tuple[dict[int, dict], Path, dict]:
    """A 4-rank gang with `fault`: each rank's evidence once all four have printed it, the
    checkpoint root, and the live record the kubelet would report if the pod died now."""
    root = tmp_path / "ckpt"
    cfg = worker_config(root, train=training(steps=40))
    run = launch(tmp_path, nproc=RANKS, config=cfg, faults=fault,
                 extra_env={contract.ENV_HANG_SECONDS: str(HANG_SECONDS)})  # fmt: skip
    try:
        run.wait_for(lambda log: len(explain.evidence_lines(log)) == RANKS, timeout=240)
        live = json.loads(run.term_path.read_text())
        found = explain.evidence_lines(run.log)
        assert run.proc.poll() is None, "a stalled rank reports and keeps running"
    finally:
        run.kill_all()
    assert f"[rank{RANKS - 1}] thread MainThread:" in run.log, "stacks, rank-tagged, in the log"
    return found, root, live


def test_a_rank_stalled_in_data_loading_is_named_and_the_others_wait_for_it(
    tmp_path: Path,
) -> None:
    found, root, live = _stalled_gang(tmp_path, "stall_at=2:5:data")
    report = explain.compare_hang(found, world_size=RANKS)
    assert report.odd_ranks == (2,), report.summary
    assert report.summary.startswith("ranks 0,1,3 wait in all_gather_into_tensor #"), report
    assert "(forward, step 5); rank 2 in data loading at step 5, 1 collective behind" in (
        report.summary
    )
    assert {doc["step"] for doc in found.values()} == {4}
    # the evidence file of each rank: its record and every thread's stack
    kept = (root / flight.EVIDENCE_DIR / "attempt-1" / "rank-2.txt").read_text()
    assert kept.startswith(contract.EVIDENCE_PREFIX) and "in stall_if" in kept
    # rank 0's live record: what `OOMKilled` would come with if the kernel killed it now
    assert live["class"] == contract.LIVE and live["step"] == 4
    assert live["phase"] == "forward" and live["memory"]["peakRssBytes"] > 0


def test_a_rank_stalled_before_the_end_of_step_all_reduce_is_named(tmp_path: Path) -> None:
    found, _, _ = _stalled_gang(tmp_path, "stall_at=1:5:sync")
    report = explain.compare_hang(found, world_size=RANKS)
    assert report.odd_ranks == (1,), report.summary
    assert report.summary.startswith("ranks 0,2,3 wait in all_reduce #"), report.summary
    assert "(end-of-step sync, step 5); rank 1 in end-of-step sync at step 5" in report.summary


def test_old_attempts_evidence_is_pruned(tmp_path: Path) -> None:
    base = tmp_path / flight.EVIDENCE_DIR
    for attempt in range(1, 9):
        (base / f"attempt-{attempt}").mkdir(parents=True)
    flight.prune(str(tmp_path), keep=flight.EVIDENCE_ATTEMPTS, current=9)
    assert sorted(p.name for p in base.iterdir()) == [f"attempt-{a}" for a in (5, 6, 7, 8)]
