"""The final export (`checkpoint.export`): a real torchrun gang of 2 ranks trains a few steps
and, on success, leaves the model as one safetensors file under <root>/export/ with a
create-only marker, on a claim and on an S3 server (versitygw). The file is read back with
torch's own safetensors header parser (torch.distributed.checkpoint._hf_utils) and, when the
`safetensors` package is installed, with it too."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint import _hf_utils
from worker_harness import launch, worker_config

from fsdp_worker import contract
from fsdp_worker.checkpointing import export
from fsdp_worker.contract import config
from fsdp_worker.train import model
from tests.s3server import S3Server

pytestmark = pytest.mark.torch


def expected_shapes(cfg: dict[str, Any]) -> dict[str, list[int]]:
    """The model's parameter and buffer names and shapes, from the same config (meta device)."""
    net = model.build(config.TrainingConfig.model_validate(cfg["training"]))
    named = [*net.named_parameters(), *net.named_buffers()]
    return {name: list(t.shape) for name, t in named}


def read_back(blob: bytes, marker: bytes) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, after checking it against its marker."""
    doc = json.loads(marker)
    assert doc["format"] == "safetensors" and doc["file"] == export.MODEL_FILE
    assert doc["bytes"] == len(blob) and doc["sha256"] == hashlib.sha256(blob).hexdigest()
    header, size = _hf_utils._get_safetensors_file_metadata(io.BytesIO(blob))
    header.pop("__metadata__", None)
    assert doc["tensors"] == len(header)
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        data = bytearray(blob[size + begin : size + end])  # size: the header and its length
        dtype = _hf_utils._get_dtype(entry["dtype"])
        out[name] = torch.frombuffer(data, dtype=dtype).reshape(entry["shape"])
    try:
        from safetensors.torch import load  # type: ignore[import-not-found]
    except ImportError:
        return out
    theirs = load(blob)
    assert set(theirs) == set(out) and all(torch.equal(theirs[k], out[k]) for k in out)
    return out


def check(blob: bytes, marker: bytes, cfg: dict[str, Any], log: str) -> None:
    tensors = read_back(blob, marker)
    assert {k: list(v.shape) for k, v in tensors.items()} == expected_shapes(cfg)
    assert all(torch.isfinite(t.float()).all() for t in tensors.values())
    assert json.loads(marker)["step"] == 4
    assert log.count("exported step 4") == 1  # rank 0 only


def test_a_finished_job_exports_safetensors_on_a_claim(tmp_path: Path) -> None:
    cfg = worker_config(tmp_path / "ckpt", export={"format": "safetensors"})
    cfg["training"]["steps"] = 4
    run = launch(tmp_path, nproc=2, config=cfg, name="run")
    assert run.wait().rc == 0, run.log[-3000:]
    where = tmp_path / "ckpt" / export.EXPORT_DIR
    check(
        (where / export.MODEL_FILE).read_bytes(),
        (where / export.MARKER_FILE).read_bytes(),
        cfg,
        run.log,
    )


def test_a_finished_job_exports_safetensors_to_s3(tmp_path: Path) -> None:
    with S3Server(tmp_path) as s3:
        root = f"s3://{s3.bucket}/jobs/run-1"
        env = {**s3.env(), contract.ENV_CHECKPOINT_ROOT: root}
        cfg = worker_config(tmp_path / "unused", export={"format": "safetensors"})
        cfg["training"]["steps"] = 4
        run = launch(tmp_path, nproc=2, config=cfg, extra_env=env, name="run")
        assert run.wait().rc == 0, run.log[-3000:]
        client = s3.client()

        def get(name: str) -> bytes:
            key = f"jobs/run-1/{export.EXPORT_DIR}/{name}"
            return bytes(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())

        check(get(export.MODEL_FILE), get(export.MARKER_FILE), cfg, run.log)
