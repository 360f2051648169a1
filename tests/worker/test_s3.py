"""Checkpoints in an object store (a real S3 server, versitygw): real torchrun gangs save to an
`s3://` root, a later attempt at another world size resumes from it, and a server that ignores
conditional writes is refused at start; in process, a load reads ranges straight into the
tensors (checkpointing/ranged.py)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint import state_dict_loader, state_dict_saver
from worker_harness import launch, worker_config

from fsdp_worker import contract
from fsdp_worker.checkpointing import layout, ranged, reader, s3
from tests.s3server import ForgetfulProxy, S3Server

pytestmark = pytest.mark.torch


def fence_doc(s3: S3Server, prefix: str) -> dict[str, Any]:
    got = s3.client().get_object(Bucket=s3.bucket, Key=f"{prefix}/FENCE.json")
    return dict(json.loads(got["Body"].read()))


def test_save_to_s3_then_resume_at_another_world_size(tmp_path: Path) -> None:
    """Attempt 1 (2 ranks, async saves) seals steps 3 and 6 on S3; attempt 2 (1 rank) resumes
    from step 6, resharding, trains on to 9 and seals it; keep=2 retires step 3."""
    with S3Server(tmp_path) as s3:
        root = f"s3://{s3.bucket}/jobs/run-1"
        env = {**s3.env(), contract.ENV_CHECKPOINT_ROOT: root}
        cfg = worker_config(tmp_path / "unused", keep=2, **{"async": True})
        cfg["training"]["steps"] = 6
        first = launch(tmp_path, nproc=2, config=cfg, extra_env=env, name="first")
        assert first.wait().rc == 0, first.log[-3000:]
        assert "checkpoint step 6 complete" in first.log
        assert fence_doc(s3, "jobs/run-1")["steps"] == {"3": "writer-a1g0", "6": "writer-a1g0"}

        cfg["training"]["steps"] = 9
        second = launch(
            tmp_path, nproc=1, config=cfg, attempt=2, resume="auto", extra_env=env, name="second"
        )
        assert second.wait().rc == 0, second.log[-3000:]
        assert "saved at world size 2, now 1" in second.log
        assert sorted(second.losses()) == [7, 8, 9]
        doc = fence_doc(s3, "jobs/run-1")
        assert doc["steps"] == {"6": "writer-a1g0", "9": "writer-a2g0"}
        assert doc["writer"]["attempt"] == 2
        keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=s3.bucket)["Contents"]]
        assert not [k for k in keys if k.startswith("jobs/run-1/step-3/")]  # retired


def test_a_server_that_ignores_conditional_writes_is_refused_at_start(tmp_path: Path) -> None:
    with S3Server(tmp_path) as s3, ForgetfulProxy(s3) as endpoint:
        env = {**s3.env(endpoint), contract.ENV_CHECKPOINT_ROOT: f"s3://{s3.bucket}/jobs/run-1"}
        cfg = worker_config(tmp_path / "unused")
        run = launch(tmp_path, nproc=1, config=cfg, extra_env=env, resume="auto", name="run")
        assert run.wait().rc != 0
        term = run.termination()
        assert term["class"] == contract.FailureClass.CONFIG
        assert term["exitCode"] == contract.ExitCode.CONFIG_ERROR
        assert "ignores conditional writes" in term["message"]
        assert "fence cannot hold" in term["message"]
        assert not run.losses()  # refused before a single step


def test_a_load_reads_ranges_straight_into_the_tensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tensor arrives by ranged GETs (several per tensor, a window smaller than the
    checkpoint), into the tensor itself or through a staging buffer when the dtype differs;
    byte items arrive too; nothing is left to DCP's whole-file reader."""
    monkeypatch.setattr(ranged, "CHUNK", 64 * 1024)
    monkeypatch.setattr(ranged, "WINDOW", 256 * 1024)
    saved = {"w": torch.randn(256, 1024), "v": torch.randn(64, 512), "b": torch.arange(7.0)}
    with S3Server(tmp_path) as srv, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP: no_dist means one process
        fs = s3.S3FileSystem(srv.client())
        uri = f"s3://{srv.bucket}/dcp"
        writer = layout.writer(uri, step=0, sync_files=True, single_file_per_rank=True)
        writer.fs, writer.path = fs, fs.init_path(uri)  # type: ignore[assignment]
        state_dict_saver.save({**saved, "note": {"step": 7}}, storage_writer=writer, no_dist=True)
        got: dict[str, Any] = {k: torch.empty_like(v) for k, v in saved.items()}
        got["v"] = torch.empty(64, 512, dtype=torch.float64)  # staged, then converted
        got["note"] = {"step": 0}
        rd = reader.RangeReader(uri, fs=fs)
        state_dict_loader.load(got, storage_reader=rd, no_dist=True)
        fs.close()
    assert torch.equal(got["w"], saved["w"]) and torch.equal(got["b"], saved["b"])
    assert torch.equal(got["v"], saved["v"].double())
    assert got["note"] == {"step": 7}
    assert rd.fallback_items == 0
    assert rd.ranged_bytes == sum(t.numel() * t.element_size() for t in saved.values())
