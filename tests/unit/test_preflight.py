"""`python -m fsdp_worker` refuses a bad config before it imports torch: exit 78 and the kit's
termination message (class, field, phase) in about a second, not after torch has loaded on
every rank. The refusals themselves, case by case, are tests/worker/test_entrypoint.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fsdp_worker import contract
from fsdp_worker.contract import environment
from fsdp_worker.train import preflight

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "numpy")


def _imported(importtime: str) -> set[str]:
    """The modules `-X importtime` says were imported (its last column, one per line)."""
    names = set()
    for line in importtime.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def _run_entry(tmp_path: Path, config: dict[str, Any], **env: str) -> tuple[int, str, str]:
    """Exit code, termination message and `-X importtime` output of `python -m fsdp_worker`."""
    term = tmp_path / "term"
    clean = ("FSDP_", "WORLD_SIZE", "RANK", "LOCAL_RANK")
    base = {k: v for k, v in os.environ.items() if not k.startswith(clean)}
    base.update(
        PYTHONPATH=str(REPO / "worker"),
        FSDP_WORKER_CONFIG=json.dumps(config),
        FSDP_TERMINATION_LOG=str(term),
        **env,
    )
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fsdp_worker"],
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, term.read_text(), proc.stderr


@pytest.mark.parametrize(
    ("config", "env", "field"),
    [
        ({"training": {"modle": {}}}, {}, "training.modle"),
        ({"training": {"globalBatchSize": 12}}, {"WORLD_SIZE": "5"}, "globalBatchSize"),
        ({}, {"FSDP_ATTEMPT": "two"}, "FSDP_ATTEMPT='two'"),
    ],
)
def test_a_bad_config_exits_78_naming_the_field_without_importing_torch(
    tmp_path: Path, config: dict[str, Any], env: dict[str, str], field: str
) -> None:
    code, term, stderr = _run_entry(tmp_path, config, RANK="3", **env)
    assert code == contract.ExitCode.CONFIG_ERROR == 78
    doc = json.loads(term)
    assert (doc["class"], doc["exitCode"], doc["rank"], doc["step"]) == ("ConfigError", 78, 3, None)
    assert doc["phase"] == "initialization"
    assert field in doc["message"]
    assert "rank3 ERROR fsdp_worker: exit 78 (ConfigError) at step None: " in stderr
    heavy = {m for m in _imported(stderr) if m.split(".")[0] in HEAVY}
    assert not heavy, f"imported before the refusal: {sorted(heavy)[:5]}"


def test_a_good_config_goes_on_to_the_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    """No refusal and no termination message: the trainer (kit.main) loads and checks again."""
    monkeypatch.setenv(contract.ENV_CONFIG, json.dumps({"training": {"globalBatchSize": 12}}))
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.delenv(contract.ENV_CONFIG_FILE, raising=False)
    monkeypatch.delenv(contract.ENV_ATTEMPT, raising=False)
    assert preflight.refusal() is None
    preflight.check_plan(environment.load_settings())


def test_a_failure_that_is_not_a_config_error_is_left_to_the_kit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A malformed WORLD_SIZE has always been the kit's to report (a RuntimeError after torch):
    the preflight neither refuses it nor writes a message."""
    term = tmp_path / "term"
    monkeypatch.setenv(contract.ENV_TERMINATION_LOG, str(term))
    monkeypatch.setenv(contract.ENV_CONFIG, "{}")
    monkeypatch.setenv("WORLD_SIZE", "five")
    assert preflight.refusal() is None
    assert not term.exists()
