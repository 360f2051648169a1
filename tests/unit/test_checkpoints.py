"""What the operator reads of a job's checkpoints, in each completion mode (checkpoints.py)."""

from __future__ import annotations

from pathlib import Path

from fsdp_operator.io import checkpoints
from fsdp_operator.policy import restarts
from fsdp_operator.types import api, names, status

JOB = names.JobRef(name="titan", namespace="team-a", uid="0f2a1b4c-0d1e-4f00-9abc-def012345678")


def _spec(completion: str) -> api.FSDPJobSpec:
    return api.FSDPJobSpec.model_validate(
        {
            "replicas": 2,
            "image": "team/titan:1",
            "trainer": {"script": "/opt/titan/train.py"},
            "checkpoint": {"root": "/ckpt", "claimName": "ckpt", "completion": completion},
        }
    )


def _torchtitan_layout(base: Path) -> None:
    """step-10 and step-20 complete; step-30 cut off before DCP wrote its `.metadata`."""
    for step in (10, 20, 30):
        d = base / f"step-{step}"
        d.mkdir(parents=True)
        (d / "__0_0.distcp").write_bytes(b"a" * 64)
        (d / "__1_0.distcp").write_bytes(b"b" * 64)
        if step != 30:
            (d / ".metadata").write_bytes(b"pickled, never read")


def test_dcp_metadata_mode_names_the_newest_complete_step(tmp_path: Path) -> None:
    _torchtitan_layout(tmp_path)
    found = checkpoints.newest(
        JOB, _spec("DCPMetadata"), status.FSDPJobStatus(attempt=1), str(tmp_path), deep=True
    )
    assert found.newest is not None
    assert (found.newest.step, found.newest.path) == (20, "/ckpt/titan/step-20")
    assert found.newest.attempt is None and found.newest.world_size == 0, "not known"
    assert found.newest.time is not None and found.corrupt == ()


def test_marker_mode_counts_nothing_without_a_marker(tmp_path: Path) -> None:
    _torchtitan_layout(tmp_path)
    found = checkpoints.newest(
        JOB, _spec("Marker"), status.FSDPJobStatus(attempt=1), str(tmp_path), deep=True
    )
    assert found.newest is None and found.visible
    assert found.corrupt == (), "an unsealed step is never quarantined: it may be in flight"


def test_a_newer_dcp_metadata_step_counts_as_the_attempts_progress() -> None:
    """The circuit breaker (maxRestartsWithoutProgress) must not count an attempt that sealed
    steps as stalled just because `.metadata` does not name the attempt."""
    s = status.FSDPJobStatus(attempt=2, resumed_from_step=20)
    newer = status.CheckpointRef(step=40, path="/ckpt/titan/step-40", world_size=0)
    same = newer.model_copy(update={"step": 20})
    assert restarts.made_progress(s, newer) and not restarts.made_progress(s, same)
    other = newer.model_copy(update={"attempt": 1})
    assert not restarts.made_progress(s, other), "a marker naming another attempt still counts"
