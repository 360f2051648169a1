"""The JSON termination message a failing rank leaves for the operator.

Kubernetes shows the file at `terminationMessagePath` in the pod status even though torchrun
itself exits 1. All ranks of a pod share that file, so the first cause wins (an flock-guarded
write into an empty file): later ranks usually fail only because a peer died. This module must
not raise: reporting a failure must never hide it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os

from fsdp_worker import contract

log = logging.getLogger(__name__)


def path() -> str | None:
    explicit = os.environ.get(contract.ENV_TERMINATION_LOG)
    if explicit:
        return explicit
    default = contract.DEFAULT_TERMINATION_LOG
    return default if os.access(default, os.W_OK) else None


def message(
    *, failure_class: str, rank: int | None, step: int | None, exit_code: int, text: str
) -> bytes:
    """One JSON object with exactly contract.TERMINATION_KEYS, under the Kubernetes limit."""
    doc = dict(
        zip(contract.TERMINATION_KEYS, (failure_class, rank, step, exit_code, ""), strict=True)
    )
    budget = contract.TERMINATION_MESSAGE_MAX_BYTES - len(json.dumps(doc).encode()) - 16
    doc["message"] = text.encode()[: max(budget, 0)].decode(errors="ignore")
    return json.dumps(doc).encode()


def write(
    *, failure_class: str, rank: int | None, step: int | None, exit_code: int, text: str
) -> None:
    target = path()
    if target is None:
        return
    data = message(
        failure_class=failure_class, rank=rank, step=step, exit_code=exit_code, text=text
    )
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_size == 0:
                os.write(fd, data)
                os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("could not write the termination message to %s: %s", target, exc)
