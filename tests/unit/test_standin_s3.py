"""The stand-in on an object store (issue 45): with FSDP_CHECKPOINT_ROOT=s3://... and no claim,
its ranks save into a real S3 server (versitygw), rank 0 seals each step by the create-only
marker and the fence's CAS, and the next attempt resumes from the newest step the bucket's
FENCE.json lists, as the integration tier's pods do."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from fsdp_worker import contract
from fsdp_worker.contract import catalog, objstore
from tests.s3server import S3Server

REPO = Path(__file__).resolve().parents[2]
PREFIX = "runs/job-1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank(
    s3: S3Server,
    tmp: Path,
    rank: int,
    *,
    attempt: int,
    resume: str = "",
    rules: str = "",
    uid: str = "uid-1",
    steps: int = 6,
    previous: bool = False,
) -> subprocess.Popen[str]:
    """One rank of a world of 2 to step `steps`, saving every 2 steps; rank 0 of job uid-1's
    attempt 1 fails at step 5 (after step 4 was sealed). `previous`: resumeFromPreviousJobs."""
    config = {
        "training": {"steps": steps, "globalBatchSize": 2, "microBatchSize": 1},
        "checkpoint": {"root": "/unused", "intervalSteps": 2, "resumeFromPreviousJobs": previous},
    }
    env = dict(
        os.environ,
        **s3.env(),
        RANK=str(rank),
        WORLD_SIZE="2",
        STANDIN_STEP_SECONDS="0.02",
        STANDIN_FAIL_AT_STEP="5",
        STANDIN_FAIL_ATTEMPT="1" if uid == "uid-1" else "99",  # uid-2 fails in none
        PYTHONPATH=str(REPO / "worker"),
        **{
            contract.ENV_CONFIG: json.dumps(config),
            contract.ENV_CHECKPOINT_ROOT: f"s3://{s3.bucket}/{PREFIX}",
            contract.ENV_METRICS_PORT: str(_free_port()),
            contract.ENV_TERMINATION_LOG: str(tmp / f"term-a{attempt}r{rank}"),
            contract.ENV_ATTEMPT: str(attempt),
            contract.ENV_RESUME: resume,
            contract.ENV_RESUME_RULES: rules,
            contract.ENV_JOB_UID: uid,
        },
    )
    argv = [sys.executable, "-m", "fsdp_worker.train.standin"]
    return subprocess.Popen(argv, env=env, cwd=tmp, stderr=subprocess.PIPE, text=True)


def _attempt(s3: S3Server, tmp: Path, attempt: int, **kwargs: Any) -> list[tuple[int, str]]:
    """Both ranks of one attempt to their end: (exit code, stderr) by rank."""
    procs = [_rank(s3, tmp, r, attempt=attempt, **kwargs) for r in (0, 1)]
    try:
        errs = [p.communicate(timeout=60)[1] for p in procs]
        return [(p.returncode, err) for p, err in zip(procs, errs, strict=True)]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _fence(s3: S3Server) -> dict[str, object]:
    got = s3.client().get_object(Bucket=s3.bucket, Key=f"{PREFIX}/FENCE.json")
    return dict(json.loads(got["Body"].read()))


def test_a_crashed_standin_resumes_from_the_step_sealed_in_the_bucket(tmp_path: Path) -> None:
    with S3Server(tmp_path) as s3:
        (code0, err0), _ = _attempt(s3, tmp_path, 1)
        assert code0 != 0 and "injected failure at step 5" in err0, err0
        assert _fence(s3)["steps"] == {"2": "writer-a1g0-uid-1", "4": "writer-a1g0-uid-1"}

        rules = contract.ResumeRules(attempt=1, resumed_from_step=None, expect_step=4).to_json()
        second = _attempt(s3, tmp_path, 2, resume=contract.RESUME_AUTO, rules=rules)
        assert [code for code, _ in second] == [0, 0], second[0][1][-3000:]
        assert "resume=auto: step 4" in second[0][1]
        doc = _fence(s3)
        assert doc["steps"] == {
            "2": "writer-a1g0-uid-1",
            "4": "writer-a1g0-uid-1",
            "6": "writer-a2g0-uid-1",
        }
        raw = s3.client().get_object(Bucket=s3.bucket, Key=f"{PREFIX}/FENCE.json")["Body"]
        loc = objstore.Location(s3.bucket, PREFIX)
        view = objstore.FenceView(s3.client(), loc, objstore.FenceDoc.from_json(raw.read()))
        sealed = catalog.Marker.from_json(view.read_bytes(f"step-6/{catalog.MARKER_NAME}"))
        assert (sealed.attempt, sealed.resumed_from_step) == (2, 4)
        assert set(sealed.files) == {"rank-0.bin", "rank-1.bin"}
    assert not (tmp_path / "unused").exists() and not list(tmp_path.glob(".writer-*"))


def test_a_job_created_again_refuses_the_old_jobs_bucket_unless_asked(tmp_path: Path) -> None:
    """A job deleted and created again under its name finds the old job's steps under its
    prefix. The operator never reads the bucket (on a claim it refuses first, with
    CheckpointsOfAnotherJob), so the ranks refuse: no fresh start over another job's steps
    without checkpoint.resumeFromPreviousJobs; with it they resume from the newest."""
    with S3Server(tmp_path) as s3:
        _attempt(s3, tmp_path, 1)  # uid-1 seals steps 2 and 4, then fails
        again = dict(uid="uid-2", resume=contract.RESUME_AUTO, steps=8)
        refused = _attempt(s3, tmp_path, 1, **again)
        assert [code for code, _ in refused] == [int(contract.ExitCode.CONFIG_ERROR)] * 2, refused
        message = json.loads((tmp_path / "term-a1r0").read_text())["message"]
        assert "holds checkpoints of another FSDPJob" in message, message
        assert "set checkpoint.resumeFromPreviousJobs" in message
        assert set(_fence(s3)["steps"]) == {"2", "4"}  # nothing sealed
        resumed = _attempt(s3, tmp_path, 1, previous=True, **again)
        assert [code for code, _ in resumed] == [0, 0], resumed[0][1][-3000:]
        assert "resume=auto: step 4" in resumed[0][1]
        doc = _fence(s3)
        assert doc["steps"]["8"] == "writer-a1g0-uid-2", doc
