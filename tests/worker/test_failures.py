"""What a user sees when things go wrong: torn saves, damaged checkpoints, a changed config,
preemption, and async saves that overlap training or fail in the background."""

from __future__ import annotations

import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from worker_harness import (
    check_async_save_overlaps_training,
    free_port,
    launch,
    marker,
    training,
    worker_config,
)

from fsdp_worker import contract
from fsdp_worker.contract import catalog, fence, selection

pytestmark = pytest.mark.torch


def test_rank_killed_before_the_marker_leaves_a_step_that_is_never_chosen(
    reference: dict[str, Any], tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    cfg = worker_config(root)
    first = launch(tmp_path, nproc=2, config=cfg, faults="kill_before_marker=6", name="first")
    assert first.wait().rc != 0
    [writer] = fence.writers(catalog.LocalStorage(str(root)), ".")
    partial = root / writer.partial(6)
    assert (partial / ".metadata").exists()  # every shard written ...
    assert not (root / "step-6").exists()  # ... and never published: the rename is the seal
    # What a torn publish of an older version (or a trainer without the kit) leaves behind.
    shutil.copytree(partial, root / "step-6")

    (root / "step-9.partial-a1").mkdir()  # abandoned by attempt 1
    (root / "step-10.partial-a1g3").mkdir()  # by a restart in place of attempt 1
    (root / "step-12.partial-a3").mkdir()  # a later attempt's save: not ours to delete
    (root / "step-11.partial-a2g1").mkdir()  # a later generation of ours: not ours either
    second = launch(tmp_path, nproc=2, config=cfg, attempt=2, resume="auto", name="second")
    assert second.wait().rc == 0, second.log[-3000:]
    assert not (root / "step-9.partial-a1").exists()
    assert not (root / "step-10.partial-a1g3").exists()
    assert (root / "step-12.partial-a3").exists()
    assert (root / "step-11.partial-a2g1").exists()
    assert "step-6: NoMarker" in second.log
    assert "resumed from step-3" in second.log
    assert second.losses() == {s: reference["losses"][s] for s in range(4, 13)}
    # The torn directory was set aside, not reused, when step 6 was saved again; attempt 1's
    # partial save went with the writer directory attempt 2 took over.
    assert marker(root / "step-6")["attempt"] == 2
    [writer] = fence.writers(catalog.LocalStorage(str(root)), ".")
    assert writer.attempt == 2
    assert sorted(p.name for p in (root / writer.dir_name).iterdir()) == ["step-6.quarantined-1"]


def test_truncated_or_missing_files_fall_back_to_an_older_checkpoint(
    reference: dict[str, Any], tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(reference["root"], root)
    shard = root / "step-12" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-100])  # truncated
    (root / "step-9" / "__0_0.distcp").unlink()  # missing
    run = launch(tmp_path, nproc=2, config=worker_config(root), attempt=2, resume="auto")
    assert run.wait().rc == 0, run.log[-3000:]
    assert "step-12: ManifestMismatch: file __1_0.distcp is" in run.log
    assert "step-9: ManifestMismatch: file __0_0.distcp listed in the marker is missing" in run.log
    assert "resumed from step-6" in run.log
    assert run.losses() == {s: reference["losses"][s] for s in range(7, 13)}


def test_a_changed_global_batch_is_refused_with_a_config_error(
    reference: dict[str, Any], tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(reference["root"] / "step-6", root / "step-6")
    cfg = worker_config(root, train=training(globalBatchSize=8))
    run = launch(tmp_path, nproc=2, config=cfg, attempt=2, resume="auto")
    assert run.wait().rc != 0
    term = run.termination()
    assert term["class"] == contract.FailureClass.CONFIG
    assert term["exitCode"] == contract.ExitCode.CONFIG_ERROR
    assert "training.globalBatchSize was 12, the config now says 8" in term["message"]
    assert not run.losses()  # not a single step trained on the wrong config


def test_sigterm_saves_the_current_step_then_exits_preempted(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    cfg = worker_config(root, train=training(steps=1000), intervalSteps=500)
    port = free_port()
    run = launch(tmp_path, nproc=2, config=cfg, faults="step_sleep=0.2", metrics_port=port)
    run.wait_for(lambda log: '"step": 4,' in log)
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    values = {
        line.split()[0]: float(line.split()[1])
        for line in scraped.decode().splitlines()
        if line.startswith("fsdp_") and " " in line
    }
    assert values[contract.METRIC_STEP] >= 4
    assert abs(values[contract.METRIC_LAST_STEP_TIME] - time.time()) < 30
    assert values[contract.METRIC_LOSS] > 0
    run.proc.send_signal(15)  # what the kubelet does to the container's torchrun
    run.wait()
    last = max(run.losses())
    assert 4 <= last < 500
    assert marker(root / f"step-{last}")["step"] == last
    assert selection.verify(
        catalog.LocalStorage(str(root)), str(root / f"step-{last}"), deep=True
    ).ok
    term = run.termination()
    assert (term["class"], term["exitCode"], term["step"]) == ("Preempted", 143, last)


def test_async_save_overlaps_training_and_marks_only_durable_checkpoints(tmp_path: Path) -> None:
    check_async_save_overlaps_training(tmp_path, nproc=2, train=training(steps=9))


def test_a_failed_background_write_fails_the_run_loudly(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    cfg = worker_config(root, train=training(steps=9), **{"async": True})
    run = launch(tmp_path, nproc=2, config=cfg, faults="fail_write=3")
    assert run.wait().rc != 0
    term = run.termination()
    assert term["class"] == contract.FailureClass.CHECKPOINT
    assert "injected write failure at step 3" in term["message"]
    assert not (root / "step-3").exists()
    assert max(run.losses()) < 9


def test_auto_resume_takes_another_jobs_checkpoints_only_when_asked(tmp_path: Path) -> None:
    """A job deleted and created again (a new uid) over the same checkpoint directory."""
    root = tmp_path / "ckpt"
    old = {"FSDP_JOB_UID": "uid-old"}
    first = launch(tmp_path, nproc=2, config=worker_config(root), name="old", extra_env=old)
    assert first.wait().rc == 0, first.log[-3000:]
    assert marker(root / "step-12")["job_uid"] == "uid-old"
    # What the operator sends a first attempt whose checkpoints it cannot read (decide.py).
    rules = contract.ResumeRules(attempt=0, resumed_from_step=None).to_json()
    new = {"FSDP_JOB_UID": "uid-new", contract.ENV_RESUME_RULES: rules}
    refused = launch(
        tmp_path, nproc=2, config=worker_config(root), resume="auto", name="new", extra_env=new
    )
    assert refused.wait().rc != 0  # torchrun exits 1 whatever its ranks did
    cause = refused.termination()  # what the operator reads: a permanent config error
    assert cause["class"] == "ConfigError" and cause["exitCode"] == contract.ExitCode.CONFIG_ERROR
    assert "another FSDPJob" in cause["message"] and "resumeFromPreviousJobs" in cause["message"]
    asked = worker_config(root, resumeFromPreviousJobs=True)
    taken = launch(tmp_path, nproc=2, config=asked, resume="auto", name="asked", extra_env=new)
    assert taken.wait().rc == 0, taken.log[-3000:]
    assert "resumed from step-12" in taken.log


def test_auto_resume_applies_the_operators_lineage_and_never_starts_over_silently(
    reference: dict[str, Any], tmp_path: Path
) -> None:
    """The operator cannot read the job's checkpoints, so the pods choose under its rules: the
    lineage it would apply, and the step a rank 0 reported sealed."""
    root = tmp_path / "ckpt"
    shutil.copytree(reference["root"], root)  # steps 3, 6, 9, 12, all by attempt 1
    # Attempt 2 resumed from step 6 and ended; attempt 1's steps 9 and 12 are then a
    # superseded attempt's (a zombie's, as far as lineage knows) and must not be chosen.
    rules = contract.ResumeRules(attempt=2, resumed_from_step=6, expect_step=6)
    env = {contract.ENV_RESUME_RULES: rules.to_json()}
    cfg = worker_config(root)
    run = launch(tmp_path, nproc=2, config=cfg, attempt=3, resume="auto", extra_env=env)
    assert run.wait().rc == 0, run.log[-3000:]
    assert "resumed from step-6" in run.log
    assert run.losses() == {s: reference["losses"][s] for s in range(7, 13)}

    empty = worker_config(tmp_path / "elsewhere")  # e.g. not the claim they were written to
    lost = launch(
        tmp_path, nproc=2, config=empty, attempt=3, resume="auto", name="lost", extra_env=env
    )
    assert lost.wait().rc != 0
    cause = lost.termination()
    assert cause["class"] == "ConfigError" and cause["exitCode"] == contract.ExitCode.CONFIG_ERROR
    assert "step 6 was sealed" in cause["message"]
    assert "refusing to train again from step 0" in cause["message"]
    assert not lost.losses()  # not one step trained from scratch


def test_a_superseded_attempt_changes_nothing_in_the_checkpoint_directory(
    reference: dict[str, Any], tmp_path: Path
) -> None:
    """Attempt 3 of this job already took the directory over: attempt 2 (a zombie started
    late) stops before it deletes, publishes or quarantines anything."""
    root = tmp_path / "ckpt"
    shutil.copytree(reference["root"], root)
    (root / "step-15.partial-a1").mkdir()  # what a live attempt would delete as abandoned
    [writer] = fence.writers(catalog.LocalStorage(str(root)), ".")  # the reference run's
    fence.take_over(catalog.LocalStorage(str(root)), ".", fence.Writer(3, 0, writer.job_uid))
    before = sorted(p.name for p in root.iterdir())
    run = launch(tmp_path, nproc=2, config=worker_config(root), attempt=2, resume="auto")
    assert run.wait().rc != 0
    cause = run.termination()
    assert cause["class"] == "CheckpointError" and "attempt 2 was superseded" in cause["message"]
    assert sorted(p.name for p in root.iterdir()) == before
