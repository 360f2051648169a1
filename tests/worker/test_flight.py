"""Each rank's flight record (flight.py), on a real torchrun gang: a rank that stops stepping
is told apart from the ranks that wait for it, before anything is torn down."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from worker_harness import launch, training, worker_config

from fsdp_operator.io import reports
from fsdp_operator.policy import explain
from fsdp_worker import contract
from fsdp_worker.telemetry import evidence

pytestmark = pytest.mark.torch
# Longer than one step of this tiny model takes on a loaded 2-core machine: a rank that pauses
# that long without a fault reports a stall of its own (a busy run saw it at 3 s).
HANG_SECONDS = 8
RANKS = 4
STALLED_AFTER = 4  # every fault below stops a rank in step 5


def _stalled_gang(tmp_path: Path, fault: str) -> tuple[dict[int, dict], Path, dict]:
    """A 4-rank gang with `fault`: each rank's evidence once all four have printed it, the
    checkpoint root, and the live record the kubelet would report if the pod died now."""
    root = tmp_path / "ckpt"
    cfg = worker_config(root, train=training(steps=40))
    run = launch(
        tmp_path,
        nproc=RANKS,
        config=cfg,
        faults=fault,
        extra_env={contract.ENV_HANG_SECONDS: str(HANG_SECONDS), "TORCH_FR_BUFFER_SIZE": "2000"},
    )
    try:
        # each rank's newest report at the fault: a first step slower than HANG_SECONDS reports
        # "initialization" first (the watchdog re-arms when a step completes)
        run.wait_for(
            lambda log: [d.get("step") for d in reports.evidence_lines(log).values()]
            == [STALLED_AFTER] * RANKS,
            timeout=240,
        )
        live = json.loads(run.term_path.read_text())
        found = reports.evidence_lines(run.log)
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
    # FSDP2's all-gather: all_gather_into_tensor up to torch 2.9, all_gather_single since
    assert re.match(r"ranks 0,1,3 wait in all_gather_(into_tensor|single) #", report.summary)
    assert "(forward, step 5); rank 2 in data loading at step 5, 1 collective behind" in (
        report.summary
    )
    assert {doc["step"] for doc in found.values()} == {STALLED_AFTER}
    # the evidence file of each rank: its record and every thread's stack
    kept = (root / evidence.EVIDENCE_DIR / "attempt-1" / "rank-2.txt").read_text()
    assert kept.startswith(contract.EVIDENCE_PREFIX) and "in stall_if" in kept
    # PyTorch's own flight recorder agrees: rank 2's newest is the previous step's all_reduce,
    # the others have one collective more, the all-gather rank 2 never joined
    fr = {rank: doc["flightRecorder"] for rank, doc in found.items()}
    assert fr[2]["op"] == "gloo:all_reduce" and fr[0]["op"] == "gloo:all_gather", fr
    assert fr[0]["seq"] == fr[1]["seq"] == fr[3]["seq"] == fr[2]["seq"] + 1, fr
    recorded = json.loads(
        (root / evidence.EVIDENCE_DIR / "attempt-1" / "rank-0.fr.json").read_text()
    )
    assert 0 < len(recorded["entries"]) <= evidence.FR_ENTRIES_KEPT
    # rank 0's live record: what `OOMKilled` would come with if the kernel killed it now
    assert live["class"] == contract.RecordClass.LIVE and live["step"] == STALLED_AFTER
    assert live["phase"] == "forward" and live["memory"]["peakRssBytes"] > 0
    assert contract.parse_sums(live) is not None, live  # its totals, should the kernel kill it
    assert live[contract.SUMS]["stepsRun"] == STALLED_AFTER, live
    assert contract.parse_milestones(live) == {}, "the live record's fixed size: totals only"


def test_a_rank_stalled_before_the_end_of_step_all_reduce_is_named(tmp_path: Path) -> None:
    found, _, _ = _stalled_gang(tmp_path, "stall_at=1:5:sync")
    report = explain.compare_hang(found, world_size=RANKS)
    assert report.odd_ranks == (1,), report.summary
    assert report.summary.startswith("ranks 0,2,3 wait in all_reduce #"), report.summary
    assert "(end-of-step sync, step 5); rank 1 in end-of-step sync at step 5" in report.summary


def test_old_attempts_evidence_is_pruned(tmp_path: Path) -> None:
    base = tmp_path / evidence.EVIDENCE_DIR
    for attempt in range(1, 9):
        (base / f"attempt-{attempt}").mkdir(parents=True)
    evidence.prune(str(tmp_path), keep=evidence.EVIDENCE_ATTEMPTS, current=9)
    assert sorted(p.name for p in base.iterdir()) == [f"attempt-{a}" for a in (5, 6, 7, 8)]


def test_an_out_of_memory_error_leaves_its_phase_and_the_ledgers_plan(tmp_path: Path) -> None:
    """What the CUDA allocator raises (injected here: a CPU has no such error) reaches the
    termination message with the phase and the plan it is read against."""
    cfg = worker_config(tmp_path / "ckpt", train=training(steps=8))
    run = launch(tmp_path, nproc=2, config=cfg, faults="raise_oom_at=0:4:backward").wait()
    assert run.rc != 0
    term = run.termination()
    assert term["class"] == contract.FailureClass.OOM and term["rank"] == 0
    assert term["phase"] == "backward of block 0" and term["step"] == 3
    assert term["ledger"]["persistentBytesPerRank"] > 0 and term["memory"]["rssBytes"] > 0
    assert "injected: CUDA out of memory in backward at step 4" in term["message"]
    assert (contract.parse_sums(term) or (None,))[0] == 3, term  # rank 0's steps, for goodput
    assert set(contract.parse_milestones(term)) == {m.value for m in contract.Milestone}, term
