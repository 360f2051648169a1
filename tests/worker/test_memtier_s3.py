"""The memory tier in front of an object store: two pods' in-place keepers over real torchrun
gangs of the built-in FSDP2 trainer seal to an `s3://` root (versitygw, tests/s3server.py) every
6 steps and to each pod's memory every 2. Rank 1 crashes once; the restart in place loads the
memory tier's newer step, not the older one in the bucket, without reading checkpoint data from
the bucket (not even to hash the bucket's step while choosing), and the run ends bitwise as the
uninterrupted reference did. The bucket holds only the steps the store sealed: memory never
reaches it."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from worker_harness import (
    flatten,
    gather,
    keeper_logs,
    launch_keepers,
    losses,
    marker,
    wait_all,
    worker_config,
)

from fsdp_worker import contract
from fsdp_worker.contract import catalog
from tests.s3server import S3Server

pytestmark = pytest.mark.torch

PREFIX = "jobs/run-1"


def _fence(s3: S3Server) -> dict[str, Any]:
    got = s3.client().get_object(Bucket=s3.bucket, Key=f"{PREFIX}/FENCE.json")
    return dict(json.loads(got["Body"].read()))


def _download(s3: S3Server, prefix: str, into: Path) -> Path:
    """Every object under `prefix/` as a file under `into` (a save, to read with DCP)."""
    client = s3.client()
    for obj in client.list_objects_v2(Bucket=s3.bucket, Prefix=f"{prefix}/")["Contents"]:
        path = into / obj["Key"].removeprefix(f"{prefix}/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(client.get_object(Bucket=s3.bucket, Key=obj["Key"])["Body"].read())
    return into


def _ranged_gets(server_log: str) -> list[str]:
    """The server's request lines answering a ranged GET (206): how a load reads a save
    (checkpointing/ranged.py); choosing a step reads whole objects (200) at most."""
    return [line for line in server_log.splitlines() if re.search(r"\| 206 \|.*\| GET \|", line)]


def _gets(server_log: str) -> list[str]:
    """The server's request lines answering a GET."""
    return [line for line in server_log.splitlines() if re.search(r"\| GET \|", line)]


def test_a_restart_in_place_loads_memorys_newer_step_not_the_buckets(
    reference: dict[str, Any], tmp_path: Path
) -> None:
    cfg = worker_config(tmp_path / "unused", intervalSteps=6, memory={"intervalSteps": 2})
    with S3Server(tmp_path) as s3:
        # Memory holds steps 2, 4, 6, 8; the bucket seals 6. Rank 1 alone crashes after step 9
        # in generation 0; generation 1 starts from the warm launcher.
        procs = launch_keepers(
            tmp_path,
            restarts=1,
            config=cfg,
            env={
                **s3.env(),
                contract.ENV_CHECKPOINT_ROOT: f"s3://{s3.bucket}/{PREFIX}",
                contract.ENV_WARM_LAUNCH: "1",
            },
            node_env=lambda node: {
                contract.ENV_MEMORY_ROOT: str(tmp_path / f"memory-{node}"),
                "FSDP_TEST_FAULTS": "crash_after@0=9" if node == 1 else "",
            },
        )
        try:
            codes = wait_all(procs, 240)
        finally:
            for p in procs:
                p.kill()
        fence = _fence(s3)
        keys = [
            o["Key"].removeprefix(f"{PREFIX}/")
            for o in s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=f"{PREFIX}/")["Contents"]
        ]
        final = _download(s3, f"{PREFIX}/step-12/{fence['steps']['12']}", tmp_path / "step-12")
    logs = keeper_logs(tmp_path)
    assert codes == [0, 0], logs[-6000:]
    restarts = re.findall(r"restarting in place: generation 1 after (.*)", logs)
    assert len(restarts) == 2, logs[-6000:]
    record = ast.literal_eval(restarts[0])[0]  # the keeper's failure record (a Python repr)
    assert (record["rank"], record["step"], record["generation"]) == (1, 9, 0), record
    assert record["memoryStep"] == 8, record  # what the crashed rank held sealed in memory

    # Generation 1 resumed from memory's step 8, not the bucket's step 6, and said so.
    node0 = (tmp_path / "node-0.log").read_text()
    generations = node0.split("restarting in place: generation 1")
    assert len(generations) == 2, node0[-4000:]
    assert "resuming from step 8 in memory (the claim offers 6)" in generations[1], node0[-4000:]
    assert "resumed from step-8 (memory):" in generations[1], generations[1][-4000:]
    # No checkpoint data came from the bucket: the server answered no ranged GET all run
    # (loading step 6 from it instead shows as hundreds of them).
    server_log = (tmp_path / "versitygw.log").read_text()
    assert _ranged_gets(server_log) == []
    # Nor was step 6 hashed (read whole) to choose it: memory's offer came first, and of the
    # bucket's step only its marker was read, to say which step the bucket offers.
    step6 = [line for line in _gets(server_log) if f"{PREFIX}/step-6/" in line]
    assert step6 and all(catalog.MARKER_NAME in line for line in step6), server_log[-4000:]

    # Bitwise the reference's losses, step 9 trained again after the load.
    assert losses(generations[0]) == {s: reference["losses"][s] for s in range(1, 10)}
    assert losses(generations[1]) == {s: reference["losses"][s] for s in range(9, 13)}

    # The bucket holds the store's steps only, each one writer's complete save; step 12 is
    # generation 1's, and the reference's bit for bit, its cursor 12 batches on.
    assert fence["steps"] == {"6": "writer-a1g0-uid-1", "12": "writer-a1g1-uid-1"}, fence
    assert fence["writer"]["generation"] == 1
    saves = {tuple(k.split("/")[:2]) for k in keys if k.startswith("step-")}
    assert saves == {("step-6", fence["steps"]["6"]), ("step-12", fence["steps"]["12"])}, keys
    assert not [k for k in keys if "/" not in k and k != "FENCE.json"], keys
    for step, writer in fence["steps"].items():
        assert f"step-{step}/{writer}/{catalog.MARKER_NAME}" in keys
    assert marker(final)["samples_consumed"] == 12 * 12
    ours, theirs = gather(final, tmp_path), gather(reference["root"] / "step-12", tmp_path)
    for section in ("model", "optim"):
        fa, fb = flatten(ours[section]), flatten(theirs[section])
        names = sorted(k for k, v in fa.items() if torch.is_tensor(v))
        assert names and names == sorted(k for k, v in fb.items() if torch.is_tensor(v))
        for name in names:
            assert torch.equal(fa[name], fb[name]), name

    # Each pod's memory holds its two newest sealed steps (8, 10) with its own rank's files,
    # and (peer copies) the other node's rank's copies of them.
    for node in range(2):
        held = sorted(p.name for p in (tmp_path / f"memory-{node}").iterdir())
        assert held == [f"copy-{1 - node}", "step-10", "step-8"], held
        seal = json.loads((tmp_path / f"memory-{node}" / "step-10" / "COMPLETE.json").read_text())
        assert set(seal["ranks"]) == {str(node)} and seal["world_size"] == 2
