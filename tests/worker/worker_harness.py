"""Harness for the worker tier: launch real torchrun gangs of `python -m fsdp_worker` on CPU.

Every rank gets OMP_NUM_THREADS=1; torchrun runs --standalone (its own free port).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsdp_worker.contract import gangwire
from fsdp_worker.keeper.processes import descendants
from localcluster import poll

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT = 180
GLOBAL_BATCH = 12  # divisible by micro(1) x world for worlds 1, 2, 3, 4, 6


def training(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "steps": 12,
        "globalBatchSize": GLOBAL_BATCH,
        "microBatchSize": 1,
        "model": {"preset": "tiny", "seqLen": 16, "vocabSize": 64},
        "optimizer": {"lr": 0.01},
        "scheduler": {"warmupSteps": 2},
    }
    doc.update(overrides)
    return doc


def worker_config(
    root: Path, *, train: dict[str, Any] | None = None, **ckpt: Any
) -> dict[str, Any]:
    # minBandBytes 0: the tiny model's tensors are cut into row bands too (layout.py), so every
    # resume test also loads banded files; production leaves small tensors whole.
    checkpoint = {"root": str(root), "intervalSteps": 3, "keep": 10, "minBandBytes": 0}
    checkpoint.update(ckpt)
    return {"training": train or training(), "checkpoint": checkpoint}


@dataclass
class Run:
    proc: subprocess.Popen[bytes]
    log_path: Path
    term_path: Path
    rc: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float = RUN_TIMEOUT) -> Run:
        self.rc = self.proc.wait(timeout=timeout)
        return self

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = RUN_TIMEOUT) -> None:
        """Until the worker's log says `predicate`; fails at once when the worker has exited."""

        def logged() -> bool:
            if predicate(self.log):
                return True
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited early:\n{self.log[-3000:]}")
            return False

        poll.until(
            "the worker's log",
            logged,
            timeout=timeout,
            every=0.05,
            diagnosis=lambda: self.log[-3000:],
        )

    def kill_all(self) -> None:
        """SIGKILL torchrun and every rank at once (torchrun puts ranks in their own sessions,
        so they are found through /proc, not the process group)."""
        victims = [self.proc.pid, *descendants(self.proc.pid)]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def ranks(self) -> list[int]:
        return descendants(self.proc.pid)

    def losses(self) -> dict[int, float]:
        return losses(self.log)

    def termination(self) -> dict[str, Any]:
        return dict(json.loads(self.term_path.read_text()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def losses(log: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for line in log.splitlines():
        if "fsdp_worker.train.trainer: step {" in line:
            doc = json.loads(line.split("step ", 1)[1])
            out[doc["step"]] = doc["loss"]
    return out


def launch(
    tmp: Path,
    *,
    nproc: int,
    config: dict[str, Any],
    attempt: int = 1,
    resume: str = "",
    faults: str = "",
    name: str = "run",
    metrics_port: int = 0,
    extra_env: dict[str, str] | None = None,
    entry: tuple[str, ...] = ("-m", "fsdp_worker"),
) -> Run:
    """A torchrun gang of `entry` (the built-in trainer, or a script and its arguments) with
    the operator's environment."""
    tmp.mkdir(parents=True, exist_ok=True)
    cfg_path, log_path, term_path = tmp / f"{name}.json", tmp / f"{name}.log", tmp / f"{name}.term"
    cfg_path.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FSDP_", "MASTER_", "RANK"))}
    env.update(
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(
            [str(REPO / "worker"), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep),
        FSDP_WORKER_CONFIG_FILE=str(cfg_path),
        FSDP_ATTEMPT=str(attempt),
        FSDP_RESUME_FROM=resume,
        FSDP_METRICS_PORT=str(metrics_port),
        FSDP_TERMINATION_LOG=str(term_path),
        FSDP_TEST_FAULTS=faults,
    )
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--max-restarts=0"]
    cmd += [f"--nproc-per-node={nproc}", *entry]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp
        )
    return Run(proc, log_path, term_path)


def launch_keepers(
    tmp: Path,
    *,
    restarts: int,
    config: dict[str, Any],
    nodes: int = 2,
    nproc: int = 1,
    env: dict[str, str] | None = None,
    node_env: Callable[[int], dict[str, str]] = lambda node: {},
    module: str = "fsdp_worker",
    spares: int = 0,
) -> list[subprocess.Popen[bytes]]:
    """`nodes` pods' in-place keepers (fsdp_worker.keeper.gang), each in front of a real torchrun of
    `module` (static rendezvous on loopback), then `spares` spares' keepers (waiting for a
    node); logs in tmp/node-<n>.log (spare s: node-<nodes + s>), termination messages in
    tmp/term-<n>."""
    from fsdp_worker import contract
    from fsdp_worker.keeper import gang

    store, coordinator = free_port(), free_port()
    key_file = tmp / GANG_KEY_FILE
    key_file.write_text(gangwire.attempt_key(b"test master key", GANG_JOB, 1).hex())
    procs = []
    for node in range(nodes + spares):
        spare = node - nodes if node >= nodes else None
        desc = gang.Gang(
            restarts=restarts,
            coordinator=f"127.0.0.1:{coordinator}",
            node=-1 if spare is not None else node,
            nodes=nodes,
            spare=spare,
            listen=None if node == 0 else free_port(),
            job=GANG_JOB,
            attempt=1,
            key_file=str(key_file),
        )
        full = {k: v for k, v in os.environ.items() if not k.startswith(("FSDP_", "MASTER_"))}
        full.update(
            OMP_NUM_THREADS="1",
            PYTHONPATH=str(REPO / "worker"),
            **{
                contract.ENV_GANG: desc.to_json(),
                contract.ENV_CONFIG: json.dumps(config),
                contract.ENV_METRICS_PORT: str(free_port()),
                contract.ENV_TERMINATION_LOG: str(tmp / f"term-{node}"),
                contract.ENV_ATTEMPT: "1",
                contract.ENV_JOB_UID: GANG_JOB,
                contract.ENV_RESUME: "",
            },
        )
        # each pod's own temporary directory (telemetry/prior.py's pace file lives there)
        own_tmp = tmp / f"tmp-{node}"
        own_tmp.mkdir(exist_ok=True)
        full["TMPDIR"] = str(own_tmp)
        full.update(env or {})
        full.update(node_env(node))
        (tmp / f"term-{node}").touch()
        torchrun = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nodes}",
            f"--nproc-per-node={nproc}",
            f"--node-rank={node if spare is None else 0}",
            "--rdzv-backend=static",
            f"--rdzv-endpoint=127.0.0.1:{store}",
            "--rdzv-id=job-a1",
            "--max-restarts=0",
            "-m",
            module,
        ]
        with open(tmp / f"node-{node}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "fsdp_worker.keeper.gang", *torchrun],
                    env=full,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=tmp,
                )
            )
    return procs


GANG_JOB = "uid-1"
GANG_KEY_FILE = "gang.key"


def gang_creds(tmp: Path) -> gangwire.Credentials:
    """What launch_keepers' gang signs with: a test speaks to its keepers as the operator."""
    key = bytes.fromhex((tmp / GANG_KEY_FILE).read_text())
    return gangwire.Credentials(job=GANG_JOB, attempt=1, key=key)


def wait_all(procs: list[subprocess.Popen[bytes]], timeout: float) -> list[int | None]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.2)
    return [p.poll() for p in procs]


def keeper_logs(tmp: Path, nodes: int = 2) -> str:
    return "\n".join((tmp / f"node-{n}.log").read_text(errors="replace") for n in range(nodes))


def gather(step_dir: Path, tmp: Path) -> dict[str, Any]:
    """Every tensor of a checkpoint, unsharded (DCP -> one torch.save file)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"gathered-{step_dir.parent.name}-{step_dir.name}.pt"
    dcp_to_torch_save(str(step_dir), str(out))
    return dict(torch.load(out, weights_only=False))


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """A nested state dict as {"a.b.c": leaf}."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def marker(step_dir: Path) -> dict[str, Any]:
    return dict(json.loads((step_dir / "COMPLETE.json").read_text()))


def check_async_save_overlaps_training(tmp: Path, *, nproc: int, train: dict[str, Any]) -> None:
    """A 9-step run with async saves every 3 steps and slowed writes: training goes on while
    step 3 is written, the run succeeds, and all three checkpoints are complete."""
    from fsdp_worker.contract import catalog, selection

    root = tmp / "ckpt"
    cfg = worker_config(root, train=train, **{"async": True})
    run = launch(tmp, nproc=nproc, config=cfg, faults="slow_write=1.0,step_sleep=0.1")
    assert run.wait().rc == 0, run.log[-3000:]
    lines = run.log.splitlines()
    complete3 = next(i for i, x in enumerate(lines) if "checkpoint step 3 complete" in x)
    step4 = next(i for i, x in enumerate(lines) if '"step": 4,' in x)
    assert step4 < complete3  # training went on while step 3 was being written
    storage = catalog.LocalStorage(str(root))
    found = selection.list_checkpoints(storage, str(root), deep=True)
    assert [(c.step, c.ok) for c in found] == [(9, True), (6, True), (3, True)]
