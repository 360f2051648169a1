"""The torch-free stand-in worker (what the operator tiers run): a planned stop loses no steps
even when its ranks are a step apart and get SIGTERM at different moments."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from fsdp_worker import catalog, contract

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank0_step(port: int) -> int:
    """Rank 0's last step from its metrics endpoint (-1 while it does not answer yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as resp:
            text = resp.read().decode()
    except OSError:
        return -1
    match = re.search(rf"^{contract.METRIC_STEP} (\S+)$", text, flags=re.M)
    return int(float(match.group(1))) if match else -1


def _handles_sigterm(pid: int) -> bool:
    """Whether the process has installed a SIGTERM handler (the kernel's caught-signal mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, flags=re.M).group(1), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def _start(rank: int, root: Path, *, port: int = 0) -> subprocess.Popen[str]:
    config = {
        "training": {"steps": 10_000, "globalBatchSize": 2, "microBatchSize": 1},
        "checkpoint": {"root": str(root), "intervalSteps": 1000},
    }
    env = dict(
        os.environ,
        RANK=str(rank),
        WORLD_SIZE="2",
        STANDIN_STEP_SECONDS="0.05",
        PYTHONPATH=str(REPO / "worker"),
        **{
            contract.ENV_CONFIG: json.dumps(config),
            contract.ENV_METRICS_PORT: str(port),
            contract.ENV_TERMINATION_LOG: str(root / f"term-{rank}"),
            contract.ENV_ATTEMPT: "1",
        },
    )
    return subprocess.Popen(
        [sys.executable, "-m", "fsdp_worker.standin"], env=env, stderr=subprocess.PIPE, text=True
    )


def _sigterm_step(proc: subprocess.Popen[str]) -> int:
    """The step a rank says it was at when SIGTERM came (it logs it on stderr)."""
    err = proc.stderr.read() if proc.stderr else ""
    match = re.search(r"SIGTERM at step (\d+)", err)
    assert match, err
    return int(match.group(1))


def test_ranks_a_step_apart_save_rank_0s_step_on_sigterm(tmp_path: Path) -> None:
    port = _free_port()
    rank0 = _start(0, tmp_path, port=port)
    # Rank 1 starts once rank 0 is a few steps in, so it runs behind however slowly either
    # process starts on a loaded machine (a fixed 0.12 s head start was not enough there).
    deadline = time.monotonic() + 30
    while _rank0_step(port) < 4:
        assert time.monotonic() < deadline and rank0.poll() is None, "rank 0 never stepped"
        time.sleep(0.02)
    rank1 = _start(1, tmp_path)
    try:
        # SIGTERM only once rank 1 handles it: before that it would just die, and rank 0 wait
        # for it (a loaded machine can take a second or more to start a Python process).
        while not _handles_sigterm(rank1.pid):
            assert time.monotonic() < deadline and rank1.poll() is None, "rank 1 never started"
            time.sleep(0.02)
        time.sleep(0.5)
        rank1.send_signal(signal.SIGTERM)  # the later rank first: it must wait for rank 0
        time.sleep(0.13)
        rank0.send_signal(signal.SIGTERM)
        codes = (rank0.wait(timeout=20), rank1.wait(timeout=20))
        at0, at1 = _sigterm_step(rank0), _sigterm_step(rank1)
    finally:
        for proc in (rank0, rank1):
            proc.kill()
            proc.wait()
    assert codes == (contract.ExitCode.PREEMPTED, contract.ExitCode.PREEMPTED)
    storage = catalog.LocalStorage(str(tmp_path))
    steps = [name for name in storage.list_dirs(".") if name.startswith("step-")]
    assert len(steps) == 1 and catalog.PARTIAL_INFIX not in steps[0], steps
    marker = catalog.Marker.from_json(storage.read_bytes(f"{steps[0]}/{catalog.MARKER_NAME}"))
    # rank 1 was behind when its SIGTERM came; both saved rank 0's (later) step
    assert at1 < at0 == marker.step and set(marker.files) == {"rank-0.bin", "rank-1.bin"}
    assert not any(p.name.startswith(".standin-stop") for p in tmp_path.iterdir())
