"""Fixtures for the worker tier. The `reference` fixture is one uninterrupted 12-step run at
world size 2 that the other tests compare against.

`tmp_path` is overridden with a private directory: pytest's shared numbered temp dirs are
pruned when other sessions start, which would delete a checkpoint mid-test on a busy machine.
"""

from __future__ import annotations

import re
import shutil
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
