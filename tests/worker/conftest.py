"""Fixtures for the worker tier. The `reference` fixture is one uninterrupted 12-step run at
world size 2 that the other tests compare against.

`tmp_path` is overridden with a private directory: pytest's shared numbered temp dirs are
pruned when other sessions start, which would delete a checkpoint mid-test on a busy machine.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from worker_harness import launch, worker_config


@pytest.fixture(scope="session")
def worker_tmp() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="fsdp-worker-tests-"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def tmp_path(worker_tmp: Path, request: pytest.FixtureRequest) -> Path:
    path = worker_tmp / re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:80]
    path.mkdir()
    return path


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test(tmp_path: Path) -> Iterator[None]:
    """Every process a test started in its directory ends with the test. A test that kills a
    keeper leaves the keeper's warm launcher and its rank running (in a pod the container's end
    takes them): seen in CI, one ran on for minutes beside the tests that followed."""
    yield
    for pid in _running_in(tmp_path.resolve()):  # /proc shows the resolved path
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _running_in(directory: Path) -> list[int]:
    """This user's processes whose working directory is `directory` or below it."""
    inside = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if cwd == str(directory) or cwd.startswith(f"{directory}/"):
            inside.append(int(entry))
    return inside


@pytest.fixture(scope="session")
def reference(worker_tmp: Path) -> dict[str, Any]:
    """One uninterrupted 12-step run at world size 2 (checkpoints at 3, 6, 9, 12)."""
    tmp = worker_tmp / "reference"
    root = tmp / "ckpt"
    run = launch(tmp, nproc=2, config=worker_config(root)).wait()
    assert run.rc == 0, run.log[-3000:]
    found = run.losses()
    assert sorted(found) == list(range(1, 13))
    return {"root": root, "losses": found, "tmp": tmp}
