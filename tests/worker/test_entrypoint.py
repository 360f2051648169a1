"""`python -m fsdp_worker` refuses bad configs before any rendezvous: exit code 78 and a
termination message that names the field; plus the termination-message format itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fsdp_worker import contract
from fsdp_worker.telemetry import termination


def run_entry(
    tmp_path: Path, config: dict[str, Any] | str, **env: str
) -> tuple[int, dict[str, Any]]:
    term = tmp_path / "term"
    base = {k: v for k, v in os.environ.items() if not k.startswith("FSDP_")}
    doc = config if isinstance(config, str) else json.dumps(config)
    base.update(FSDP_WORKER_CONFIG=doc, FSDP_TERMINATION_LOG=str(term), **env)
    proc = subprocess.run(
        [sys.executable, "-m", "fsdp_worker"], env=base, capture_output=True, timeout=120
    )
    return proc.returncode, json.loads(term.read_text())


@pytest.mark.parametrize(
    ("config", "env", "expected"),
    [
        ({"training": {"globalBatchSize": 0}}, {}, "training.globalBatchSize"),
        ({"training": {"microBatchSize": 5, "globalBatchSize": 12}}, {}, "globalBatchSize=12"),
        ({"training": {"modle": {}}}, {}, "training.modle"),
        ({"checkpoint": {"root": "/a/../etc"}}, {}, "checkpoint.root"),
        ("{not json", {}, "invalid training config"),
        ({"training": {"globalBatchSize": 12}}, {"WORLD_SIZE": "5"}, "worldSize=5"),
        ({}, {"FSDP_ATTEMPT": "two"}, "FSDP_ATTEMPT='two'"),
    ],
)
def test_config_errors_exit_78_naming_the_field(
    tmp_path: Path, config: dict[str, Any] | str, env: dict[str, str], expected: str
) -> None:
    code, term = run_entry(tmp_path, config, **env)
    assert code == contract.ExitCode.CONFIG_ERROR == 78
    assert tuple(term)[:5] == contract.TERMINATION_KEYS
    assert set(term) <= {*contract.TERMINATION_KEYS, *contract.TERMINATION_OPTIONAL_KEYS}
    assert term["class"] == "ConfigError" and term["exitCode"] == 78
    assert term["phase"] == "initialization", "a config is refused before the first step"
    assert expected in term["message"]


def test_termination_message_is_bounded_and_the_first_cause_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "termination-log"
    monkeypatch.setenv(contract.ENV_TERMINATION_LOG, str(path))
    termination.write(failure_class="OutOfMemory", rank=3, step=7, exit_code=1, text="x" * 10_000)
    termination.write(failure_class="RuntimeError", rank=0, step=7, exit_code=1, text="peer died")
    raw = path.read_bytes()
    assert len(raw) <= contract.TERMINATION_MESSAGE_MAX_BYTES
    doc = json.loads(raw)
    assert (doc["class"], doc["rank"], doc["step"]) == ("OutOfMemory", 3, 7)
