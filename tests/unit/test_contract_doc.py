"""docs/contract.md, the trainer contract, names everything a trainer is given or is read by."""

from __future__ import annotations

import re
from pathlib import Path

from fsdp_operator.io import observe
from fsdp_worker import contract

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "contract.md").read_text()


def test_every_variable_exit_code_class_and_key_is_documented() -> None:
    names = {v for k, v in vars(contract).items() if k.startswith("ENV_")}
    names |= {c.value for c in contract.FailureClass} | set(contract.TERMINATION_KEYS)
    missing = sorted(n for n in names if f"`{n}" not in DOC)
    assert not missing, f"docs/contract.md does not name {missing}"
    codes = [str(int(c)) for c in contract.ExitCode]
    assert all(re.search(rf"\b{code}\b", DOC) for code in codes), codes
    assert f"version {contract.CONTRACT_VERSION}" in DOC.splitlines()[0]


def test_every_metric_the_operator_reads_is_documented() -> None:
    source = Path(observe.__file__).read_text()
    read = {getattr(contract, c) for c in re.findall(r"contract\.(METRIC_\w+)", source)}
    assert read, "the operator reads no metric?"
    missing = sorted(m for m in read if m not in DOC)
    assert not missing, f"docs/contract.md does not name {missing}"
