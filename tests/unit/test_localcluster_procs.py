"""The local cluster's process registry: stops what it started, and nothing else."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from localcluster import procs

IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
)


def test_another_process_can_stop_what_was_spawned(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    starter = procs.Registry(state)
    starter.meta = {"ports": {"x": 1}}
    pid = starter.spawn("sleeper", ["sleep", "60"], log=tmp_path / "s.log", cwd=tmp_path)

    other = procs.Registry(state)  # as the CLI's `down` would, from a fresh process
    assert other.meta == {"ports": {"x": 1}}
    assert other.status() == {"sleeper": True}
    other.stop_all(grace=5)

    assert starter.status() == {"sleeper": False}
    assert procs.Registry(state).status() == {}
    starter.stop_all(grace=1)  # reaps the child
    assert not Path(f"/proc/{pid}").exists()


def test_a_process_ignoring_sigterm_is_killed_after_its_grace(tmp_path: Path) -> None:
    registry = procs.Registry(tmp_path / "state.json")
    registry.spawn(
        "stubborn", [sys.executable, "-c", IGNORES_SIGTERM], log=tmp_path / "l", cwd=tmp_path
    )
    time.sleep(0.5)  # let it install the handler
    started = time.monotonic()
    registry.stop_all(grace=0.5)
    assert registry.status() == {}
    assert time.monotonic() - started < 5


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    record = {"name": "gone", "pid": os.getpid(), "argv": ["etcd", "--name", "local"]}
    state.write_text(json.dumps({"meta": {}, "processes": [record]}))
    registry = procs.Registry(state)
    assert registry.status() == {"gone": False}
    registry.stop_all(grace=0.1)  # would kill this very test process if it matched on PID alone
