"""The warm launcher (fsdp_worker.keeper.warm): its ranks see what torchrun's would, meet through a
real gloo gang, name themselves, and fail, stop and pass a pod's SIGTERM on as torchrun's do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from worker_harness import REPO, free_port

from fsdp_worker.keeper import warm
from localcluster import poll

pytestmark = pytest.mark.torch

SCRIPT = """\
import json, os, signal, sys, time
import torch, torch.distributed as dist
out, mode = sys.argv[1], sys.argv[2]
keys = sorted(k for k in os.environ if k in {KEYS} or k.startswith("TORCHELASTIC"))
comm = open("/proc/self/comm").read().strip()
rank = int(os.environ["RANK"])
if mode == "meet":
    dist.init_process_group("gloo")
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    doc = {{"env": {{k: os.environ[k] for k in keys}}, "comm": comm, "sum": t.item()}}
    open(f"{{out}}/rank-{{rank}}.json", "w").write(json.dumps(doc))
    dist.destroy_process_group()
elif mode == "fail" and rank == 1:
    time.sleep(1)
    sys.exit(3)
else:  # rank 0 of "fail", every rank of "term": wait to be stopped, say how
    signal.signal(signal.SIGTERM, lambda *_: (open(f"{{out}}/term-{{rank}}", "w").close(),
                                              sys.exit(0)))
    open(f"{{out}}/up-{{rank}}", "w").close()
    time.sleep(60)
"""
KEYS = {
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
}


def _argv(script: Path, port: int, *args: str) -> list[str]:
    return [
        "--nnodes=1",
        "--nproc-per-node=2",
        "--node-rank=0",
        "--rdzv-backend=static",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=job-a1",
        "--max-restarts=0",
        str(script),
        *args,
    ]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FSDP_", "MASTER_", "OMP_"))}
    return {**env, "PYTHONPATH": str(REPO / "worker")}


def _warm(tmp: Path, *args: str) -> subprocess.Popen[str]:
    script = tmp / "rank.py"
    script.write_text(SCRIPT.format(KEYS=sorted(KEYS)))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fsdp_worker.keeper.warm",
            *_argv(script, free_port(), str(tmp), *args),
        ],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
        text=True,
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"env": {"FSDP_GENERATION": "1"}, "node": 0}) + "\n")
    proc.stdin.close()
    proc.stdin = None  # communicate() below flushes an open stdin
    return proc


def test_warm_ranks_get_torchruns_environment_and_meet_through_rank_0s_store(
    tmp_path: Path,
) -> None:
    (tmp_path / "torchrun").mkdir()
    (tmp_path / "warm").mkdir()
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT.format(KEYS=sorted(KEYS)))
    port = free_port()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            *_argv(script, port, str(tmp_path / "torchrun"), "meet"),
        ],
        env=_env(),
        check=True,
        timeout=120,
        capture_output=True,
    )
    proc = _warm(tmp_path / "warm", "meet")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    for rank in (0, 1):
        theirs = json.loads((tmp_path / "torchrun" / f"rank-{rank}.json").read_text())
        ours = json.loads((tmp_path / "warm" / f"rank-{rank}.json").read_text())
        assert ours["sum"] == theirs["sum"] == 3.0  # a real all_reduce of 1 + 2
        assert ours["comm"] == f"rank-{rank}"  # what ps and the fault injector see
        # Every variable torchrun gives a rank, with its value, but two: the store's port
        # (each run its own) and who hosts the store (torchrun's agent, here rank 0).
        differ = {
            k
            for k in theirs["env"].keys() | ours["env"].keys()
            if theirs["env"].get(k) != ours["env"].get(k)
        }
        assert differ <= {
            "MASTER_PORT",
            "TORCHELASTIC_USE_AGENT_STORE",
            "TORCHELASTIC_ERROR_FILE",
        }, (differ, theirs, ours)
        assert ours["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "False"


def test_a_failed_rank_stops_the_others_and_a_sigterm_reaches_every_rank(tmp_path: Path) -> None:
    proc = _warm(tmp_path, "fail")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err  # torchrun's code when a rank failed
    assert "local rank 1" in err and "exited 3" in err, err
    assert (tmp_path / "term-0").exists(), "rank 0 was stopped with SIGTERM, as torchrun does"

    term = tmp_path / "term"
    term.mkdir()
    proc = _warm(term, "term")
    for rank in (0, 1):
        up = term / f"up-{rank}"
        poll.until(f"{up} to appear", up.exists, timeout=60, every=0.1)
    proc.send_signal(signal.SIGTERM)  # the pod's, passed on by the keeper
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err  # both ranks saved and exited 0
    assert sorted(p.name for p in term.glob("term-*")) == ["term-0", "term-1"]


def test_an_argv_it_cannot_run_the_same_way_is_refused() -> None:
    with pytest.raises(warm.LaunchError, match="rdzv-backend=c10d"):
        warm.plan(["--nnodes=2", "--rdzv-backend=c10d", "x.py"])
    with pytest.raises(warm.LaunchError, match="--nnodes=1:2"):
        warm.plan(["--nnodes=1:2", "--rdzv-backend=static", "--rdzv-endpoint=h:1", "x.py"])
