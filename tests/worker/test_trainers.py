"""The example trainers (examples/trainers/) under real torchrun: a team's own script on the
trainer kit, and one that knows nothing of this project (torchtitan's layout).

Both are checked the way a user would: a crash mid-run, then the restart the operator would
launch, resumes from the newest complete checkpoint and the run finishes; the kit's run does
so exactly (the same losses as an uninterrupted run, also at another world size).
"""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from worker_harness import REPO, free_port, launch, training, worker_config

from fsdp_worker import contract
from fsdp_worker.contract import catalog, selection

pytestmark = pytest.mark.torch
EXAMPLES = REPO / "examples" / "trainers"
PLAIN = str(EXAMPLES / "plain_fsdp.py")
TITAN = str(EXAMPLES / "titan_layout.py")


def _plain_losses(log: str) -> dict[int, float]:
    out = {}
    for line in log.splitlines():
        if "plain_fsdp: step {" in line:
            doc = json.loads(line.split("step ", 1)[1])
            out[doc["step"]] = doc["loss"]
    return out


def _plain(tmp: Path, root: Path, *, nproc: int, name: str, **kwargs: Any) -> Any:
    cfg = worker_config(root, intervalSteps=3)
    return launch(tmp, nproc=nproc, config=cfg, name=name, entry=(PLAIN,), **kwargs).wait()


@pytest.fixture(scope="module")
def plain_reference(worker_tmp: Path) -> Any:
    """One uninterrupted 12-step run of the kit's example at world size 2 (saves every 3)."""
    tmp = worker_tmp / "plain-reference"
    run = _plain(tmp, tmp / "ckpt", nproc=2, name="reference")
    assert run.rc == 0, run.log[-3000:]
    return run


def test_a_kit_trainer_reports_its_end(plain_reference: Any) -> None:
    assert sorted(_plain_losses(plain_reference.log)) == list(range(1, 13))
    done = plain_reference.termination()  # rank 0's last word, for an operator reading no claim
    assert (done["class"], done["step"], done["exitCode"]) == (
        contract.RecordClass.COMPLETED,
        12,
        0,
    )
    assert json.loads(done["message"]) == {"sealedStep": 12}
    steps, train, blocked = contract.parse_sums(done) or (None, 0.0, 0.0)
    assert steps == 12 and train > 0 and blocked > 0, done  # its totals: goodput's last seconds
    # its resume milestones, in order: a run too short for any scrape still has its timeline
    reached = contract.parse_milestones(done)
    assert list(reached) == [m.value for m in contract.Milestone], done
    assert reached["rendezvous"] <= reached["loaded"] <= reached["first_step"], reached
    assert contract.parse_resumed(done) == (-1, False), done  # it loaded nothing: fresh


def test_a_kit_trainer_resumes_exactly_after_a_crash_at_any_world_size(
    plain_reference: Any, tmp_path: Path
) -> None:
    expected = _plain_losses(plain_reference.log)

    root = tmp_path / "ckpt"
    # Rank 0 dies after step 9's files are written and before its marker: step 9 must never
    # be chosen, step 6 must.
    crashed = _plain(tmp_path, root, nproc=2, name="crashed", faults="kill_before_marker=9")
    assert crashed.rc != 0
    assert not (root / "step-9").exists(), "never published without its marker"
    rules = contract.ResumeRules(attempt=1, resumed_from_step=None, expect_step=6).to_json()
    resumed = _plain(
        tmp_path,
        root,
        nproc=3,
        name="resumed",
        attempt=2,
        resume="auto",
        extra_env={contract.ENV_RESUME_RULES: rules},
    )
    assert resumed.rc == 0, resumed.log[-3000:]
    got = _plain_losses(resumed.log)
    assert sorted(got) == list(range(7, 13)), "resumed after step 6, at world size 3"
    for step, loss in got.items():
        assert loss == pytest.approx(expected[step], rel=1e-5, abs=1e-6), step
    last = catalog.Marker.from_json((root / "step-12" / catalog.MARKER_NAME).read_bytes())
    assert (last.attempt, last.resumed_from_step, last.world_size) == (2, 6, 3)
    # the step it loaded, in rank 0's last word too (for an attempt no scrape saw load)
    assert contract.parse_resumed(resumed.termination()) == (6, False)
    assert last.samples_consumed == 12 * 12, "the data cursor of the kit's save"


def test_a_kit_trainer_refuses_to_start_over_when_its_checkpoint_is_gone(tmp_path: Path) -> None:
    rules = contract.ResumeRules(attempt=1, resumed_from_step=None, expect_step=6).to_json()
    run = _plain(
        tmp_path,
        tmp_path / "empty",
        nproc=1,
        name="lost",
        attempt=2,
        resume="auto",
        extra_env={contract.ENV_RESUME_RULES: rules},
    )
    assert run.rc != 0, run.log[-3000:]
    term = run.termination()  # torchrun exits 1 whatever; the rank's verdict is here
    assert (term["class"], term["exitCode"]) == ("ConfigError", contract.ExitCode.CONFIG_ERROR)
    assert "refusing to train again from step 0" in term["message"]
    assert not _plain_losses(run.log), "not one step trained"


def test_a_trainer_that_knows_nothing_of_us_is_resumed_from_its_newest_dcp_metadata(
    tmp_path: Path,
) -> None:
    dump = tmp_path / "ckpt"
    args = (TITAN, "--dump-folder", str(dump), "--folder", ".", "--steps", "30")
    cfg = worker_config(dump)
    first = launch(tmp_path, nproc=2, config=cfg, name="first", entry=(*args, "--steps", "20"))
    assert first.wait().rc == 0, first.log[-3000:]
    # A crash in the middle of the next save: the ranks' files, no .metadata (DCP writes it
    # last, on the coordinator, after every rank's files).
    (dump / "step-30").mkdir()
    (dump / "step-30" / "__0_0.distcp").write_bytes(b"\0" * 64)
    storage = catalog.LocalStorage(str(dump))
    chosen, _ = selection.select(
        storage, ".", config_hash=None, lineage=None, proof=contract.Proof.DCP_METADATA
    )
    assert chosen is not None and chosen.step == 20, "what the operator names, DCPMetadata mode"
    second = launch(tmp_path, nproc=2, config=cfg, name="second", entry=args).wait()
    assert second.rc == 0, second.log[-3000:]
    assert re.search(r"loaded the checkpoint from .*step-20\b", second.log)
    steps = [int(m) for m in re.findall(r"^step (\d+) loss", second.log, re.M)]
    assert steps == list(range(21, 31))
    chosen, _ = selection.select(
        storage, ".", config_hash=None, lineage=None, proof=contract.Proof.DCP_METADATA
    )
    assert chosen is not None and chosen.step == 30


def test_a_kit_trainer_saves_on_sigterm_and_serves_its_progress(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    cfg = worker_config(root, train=training(steps=1000), intervalSteps=500)
    port = free_port()
    run = launch(
        tmp_path, nproc=2, config=cfg, metrics_port=port, entry=(PLAIN, "--step-seconds", "0.2")
    )
    run.wait_for(lambda log: '"step": 4,' in log)
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    pairs = (line.split() for line in page.splitlines() if line.startswith("fsdp_"))
    values = {name: float(value) for name, value, *_ in pairs}
    assert values[contract.METRIC_STEP] >= 4, "hang detection reads this"
    assert values[contract.METRIC_RESUMED_FROM] == -1 and values[contract.METRIC_STEPS_RUN] >= 4
    run.proc.send_signal(15)  # what the kubelet does to the container's torchrun
    run.wait()
    last = max(_plain_losses(run.log))
    assert 4 <= last < 500
    assert selection.verify(
        catalog.LocalStorage(str(root)), str(root / f"step-{last}"), deep=True
    ).ok
    term = run.termination()
    assert (term["class"], term["exitCode"], term["step"]) == ("Preempted", 143, last)


def test_choosing_under_auto_sets_a_corrupt_checkpoint_aside_and_says_so(
    plain_reference: Any, tmp_path: Path
) -> None:
    """What the operator does when it reads the claim, done by rank 0 when it cannot."""
    root = tmp_path / "ckpt"
    shutil.copytree(plain_reference.log_path.parent / "ckpt", root)
    shard = next(p for p in sorted((root / "step-12").iterdir()) if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:-1])  # truncated after it was sealed
    port = free_port()
    rules = contract.ResumeRules(attempt=1, resumed_from_step=None).to_json()
    cfg = worker_config(root, train=training(steps=30), intervalSteps=3)
    run = launch(
        tmp_path,
        nproc=2,
        config=cfg,
        name="second",
        attempt=2,
        resume="auto",
        metrics_port=port,
        extra_env={contract.ENV_RESUME_RULES: rules},
        entry=(PLAIN, "--step-seconds", "0.3"),
    )
    run.wait_for(lambda log: '"step": 11,' in log)
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'fsdp_checkpoint_quarantined{step="12"} 1.0' in page
    assert "fsdp_worker_resumed_from_step 9.0" in page
    run.proc.send_signal(15)
    run.wait()
    [aside] = root.glob(f".writer-*/step-12{catalog.QUARANTINE_INFIX}1")  # the chooser's
    assert (aside / shard.name).exists(), "set aside, never deleted"
