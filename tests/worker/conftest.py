"""Fixtures for the worker tier. The `reference` fixture is one uninterrupted 12-step run at
world size 2 that the other tests compare against."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from worker_harness import launch, worker_config


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One uninterrupted 12-step run at world size 2 (checkpoints at 3, 6, 9, 12)."""
    tmp = tmp_path_factory.mktemp("reference")
    root = tmp / "ckpt"
    run = launch(tmp, nproc=2, config=worker_config(root)).wait()
    assert run.rc == 0, run.log[-3000:]
    found = run.losses()
    assert sorted(found) == list(range(1, 13))
    return {"root": root, "losses": found, "tmp": tmp}
