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
from typing import Any

import pytest

from fsdp_worker import contract
from fsdp_worker.contract import catalog, fence

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


def _start(
    rank: int, root: Path, *, port: int = 0, every: int = 1000, step_seconds: float = 0.05
) -> subprocess.Popen[str]:
    config = {
        "training": {"steps": 10_000, "globalBatchSize": 2, "microBatchSize": 1},
        "checkpoint": {"root": str(root), "intervalSteps": every},
    }
    env = dict(
        os.environ,
        RANK=str(rank),
        WORLD_SIZE="2",
        STANDIN_STEP_SECONDS=str(step_seconds),
        PYTHONPATH=str(REPO / "worker"),
        **{
            contract.ENV_CONFIG: json.dumps(config),
            contract.ENV_METRICS_PORT: str(port),
            contract.ENV_TERMINATION_LOG: str(root / f"term-{rank}"),
            contract.ENV_ATTEMPT: "1",
        },
    )
    return subprocess.Popen(
        [sys.executable, "-m", "fsdp_worker.train.standin"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )


def _sigterm_step(proc: subprocess.Popen[str]) -> int:
    """The step a rank says it was at when SIGTERM came (it logs it on stderr)."""
    err = proc.stderr.read() if proc.stderr else ""
    match = re.search(r"SIGTERM at step (\d+)", err)
    assert match, err
    return int(match.group(1))


def _stop_later_rank_first(rank0: subprocess.Popen[str], rank1: subprocess.Popen[str]) -> None:
    """SIGTERM to rank 1, then to rank 0 a moment later; both exit as preempted."""
    rank1.send_signal(signal.SIGTERM)
    time.sleep(0.13)
    rank0.send_signal(signal.SIGTERM)
    codes = (rank0.wait(timeout=20), rank1.wait(timeout=20))
    assert codes == (contract.ExitCode.PREEMPTED, contract.ExitCode.PREEMPTED)


def _kill(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


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
        _stop_later_rank_first(rank0, rank1)  # rank 1 must wait for rank 0
        at0, at1 = _sigterm_step(rank0), _sigterm_step(rank1)
    finally:
        _kill(rank0, rank1)
    storage = catalog.LocalStorage(str(tmp_path))
    steps = [name for name in storage.list_dirs(".") if name.startswith("step-")]
    assert len(steps) == 1 and catalog.PARTIAL_INFIX not in steps[0], steps
    marker = catalog.Marker.from_json(storage.read_bytes(f"{steps[0]}/{catalog.MARKER_NAME}"))
    # rank 1 was behind when its SIGTERM came; both saved rank 0's (later) step
    assert at1 < at0 == marker.step and set(marker.files) == {"rank-0.bin", "rank-1.bin"}
    assert not any(p.name.startswith(".standin-stop") for p in tmp_path.iterdir())


def test_sigterm_while_rank_0_waits_for_a_shard_saves_that_step(tmp_path: Path) -> None:
    """Rank 0 is in a periodic save, waiting for a slower rank 1's shard, when SIGTERM comes
    to rank 1 first: rank 1 must not wait for rank 0 to post its stop step while rank 0 waits
    for it (both sat out their 60 s and the preempted job lost its steps). Rank 0 posts the
    step it is saving; both save it and exit as preempted."""
    rank0 = _start(0, tmp_path, every=3)
    rank1 = _start(1, tmp_path, every=3, step_seconds=1.0)  # reaches step 3 after 3 s or more
    partial = tmp_path / fence.Writer(1).partial(3)
    shard0 = partial / "rank-0.bin"
    deadline = time.monotonic() + 30
    try:
        while not (shard0.exists() and _handles_sigterm(rank1.pid)):
            assert time.monotonic() < deadline and rank0.poll() is None and rank1.poll() is None
            time.sleep(0.02)
        assert not (partial / "rank-1.bin").exists(), "rank 1 was on time"
        _stop_later_rank_first(rank0, rank1)
    finally:
        _kill(rank0, rank1)
    storage = catalog.LocalStorage(str(tmp_path))
    marker = catalog.Marker.from_json(storage.read_bytes(f"step-3/{catalog.MARKER_NAME}"))
    assert set(marker.files) == {"rank-0.bin", "rank-1.bin"}
    assert [n for n in storage.list_dirs(".") if n.startswith("step-")] == ["step-3"]


def _spawn(
    root: Path,
    *,
    attempt: int,
    resume: str = "",
    rules: str = "",
    fail_at: int = 0,
    steps: int = 6,
    step_seconds: float = 0.01,
) -> subprocess.Popen[str]:
    """One rank (world 1) to `steps`, saving every 3 steps; optionally failing at `fail_at`."""
    config = {
        "training": {"steps": steps, "globalBatchSize": 1, "microBatchSize": 1},
        "checkpoint": {"root": str(root), "intervalSteps": 3},
    }
    env = dict(
        os.environ,
        RANK="0",
        WORLD_SIZE="1",
        STANDIN_STEP_SECONDS=str(step_seconds),
        PYTHONPATH=str(REPO / "worker"),
        **{
            contract.ENV_CONFIG: json.dumps(config),
            contract.ENV_METRICS_PORT: str(_free_port()),
            contract.ENV_TERMINATION_LOG: str(root.parent / f"term-a{attempt}"),
            contract.ENV_ATTEMPT: str(attempt),
            contract.ENV_RESUME: resume,
            contract.ENV_RESUME_RULES: rules,
            contract.ENV_JOB_UID: "uid-1",
        },
    )
    if fail_at:
        env.update(STANDIN_FAIL_AT_STEP=str(fail_at), STANDIN_FAIL_ATTEMPT=str(attempt))
    argv = [sys.executable, "-m", "fsdp_worker.train.standin"]
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _run_once(root: Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    proc = _spawn(root, **kwargs)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_auto_resumes_the_sealed_step_under_rules_and_refuses_to_start_over(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ckpt"
    first = _run_once(root, attempt=1, fail_at=5)
    assert first.returncode != 0 and (root / "step-3" / catalog.MARKER_NAME).exists()
    rules = contract.ResumeRules(attempt=1, resumed_from_step=None, expect_step=3).to_json()
    second = _run_once(root, attempt=2, resume="auto", rules=rules)
    assert second.returncode == 0, second.stderr
    assert "resume=auto: step 3" in second.stderr
    storage = catalog.LocalStorage(str(root))
    sealed = catalog.Marker.from_json(storage.read_bytes(f"step-6/{catalog.MARKER_NAME}"))
    assert (sealed.attempt, sealed.resumed_from_step) == (2, 3)

    elsewhere = tmp_path / "other" / "ckpt"  # an empty claim: not the one written to
    elsewhere.mkdir(parents=True)
    lost = _run_once(elsewhere, attempt=2, resume="auto", rules=rules)
    assert lost.returncode == contract.ExitCode.CONFIG_ERROR
    cause = json.loads((elsewhere.parent / "term-a2").read_text())
    assert cause["class"] == contract.FailureClass.CONFIG
    assert "step 3 was sealed" in cause["message"] and "from step 0" in cause["message"]
    assert not (elsewhere / "step-3").exists()  # it trained nothing


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ("{", "is not JSON"),
        ('{"attempt": -1}', "attempt=-1 must be a whole number >= 0"),
        ('{"attempt": 1, "expectStep": "ten"}', "expectStep='ten' must be a whole number"),
    ],
)
def test_malformed_resume_rules_are_a_config_error_naming_the_field(
    tmp_path: Path, raw: str, named: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        contract.ResumeRules.parse(raw)
    done = _run_once(tmp_path / "ckpt", attempt=2, resume="auto", rules=raw)
    assert done.returncode == contract.ExitCode.CONFIG_ERROR
    assert named in json.loads((tmp_path / "term-a2").read_text())["message"]


def test_a_zombie_that_saves_after_the_live_attempt_changes_nothing(tmp_path: Path) -> None:
    """Attempt 1 keeps running after the operator moved on (its node was lost, not its
    processes). Attempt 2 fences the directory at its start; the zombie's next save finds the
    fence and it exits without publishing, quarantining or deleting anything."""
    root = tmp_path / "ckpt"
    zombie = _spawn(root, attempt=1, steps=10_000, step_seconds=0.2)
    try:
        deadline = time.monotonic() + 60
        while not (root / "step-3" / catalog.MARKER_NAME).exists():
            assert time.monotonic() < deadline and zombie.poll() is None, "the zombie never saved"
            time.sleep(0.05)
        rules = contract.ResumeRules(attempt=1, resumed_from_step=None, expect_step=3).to_json()
        live = _run_once(root, attempt=2, resume="auto", rules=rules, steps=30)
        assert live.returncode == 0, live.stderr
        code = zombie.wait(timeout=60)  # its next save comes after the live attempt's fence
    finally:
        zombie.kill()
        zombie.wait()
    assert code != 0
    cause = json.loads((tmp_path / "term-a1").read_text())
    assert "attempt 1 was superseded" in cause["message"], cause
    storage = catalog.LocalStorage(str(root))
    newest = catalog.Marker.from_json(storage.read_bytes(f"step-30/{catalog.MARKER_NAME}"))
    assert newest.attempt == 2
    for moved in root.glob(f".writer-*/step-*{catalog.QUARANTINE_INFIX}*"):  # only the zombie's
        marker = catalog.Marker.from_json((moved / catalog.MARKER_NAME).read_bytes())
        assert marker.attempt == 1, moved
    resumed = int(re.search(r"resume=auto: step (\d+)", live.stderr).group(1))
    after = list(range(resumed + 3, 31, 3))
    markers = (storage.read_bytes(f"step-{n}/{catalog.MARKER_NAME}") for n in after)
    by_live = [catalog.Marker.from_json(m) for m in markers]
    assert [m.attempt for m in by_live] == [2] * len(after)  # all where the live attempt put them
