"""The JSON termination message a failing rank leaves for the operator.

Kubernetes shows the file at `terminationMessagePath` in the pod status even though torchrun
itself exits 1. All ranks of a pod share that file, so the first cause wins (an flock-guarded
write into a file that holds nothing, or only the live record): later ranks usually fail only
because a peer died. Until a rank fails, the pod's first rank keeps its live record there
(flight.py), padded to one size so that each rewrite is one pwrite: a rank killed without a
word still leaves where it was. This module must not raise: reporting a failure must never
hide it.
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


LIVE_BYTES = 1024  # the live record's fixed size (spaces pad it: JSON allows them)


def _holds_final(fd: int) -> bool:
    """Whether the file already holds a message other than the live record."""
    head = os.pread(fd, 64, 0)
    return bool(head.strip()) and f'"class":"{contract.LIVE}"'.encode() not in head


def write_live(fd: int, text: str) -> None:
    """Replace the live record (never a failure's message) with `text`, in one pwrite."""
    data = text.encode()[:LIVE_BYTES].ljust(LIVE_BYTES)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if not _holds_final(fd):
                os.pwrite(fd, data, 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError as exc:
        log.debug("live record not written: %s", exc)


def clear_live(fd: int) -> None:
    """Empty the file if it holds only the live record."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if not _holds_final(fd):
                os.ftruncate(fd, 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError as exc:
        log.debug("live record not cleared: %s", exc)


def message(
    *,
    failure_class: str,
    rank: int | None,
    step: int | None,
    exit_code: int,
    text: str,
    extra: dict[str, object] | None = None,
) -> bytes:
    """One JSON object with contract.TERMINATION_KEYS (and `extra`, e.g. the rank's phase),
    under the Kubernetes limit."""
    values: tuple[object, ...] = (failure_class, rank, step, exit_code, "")
    doc: dict[str, object] = dict(zip(contract.TERMINATION_KEYS, values, strict=True))
    doc.update(extra or {})
    budget = contract.TERMINATION_MESSAGE_MAX_BYTES - len(json.dumps(doc).encode()) - 16
    doc["message"] = text.encode()[: max(budget, 0)].decode(errors="ignore")
    return json.dumps(doc).encode()


def write(
    *,
    failure_class: str,
    rank: int | None,
    step: int | None,
    exit_code: int,
    text: str,
    extra: dict[str, object] | None = None,
) -> None:
    target = path()
    if target is None:
        return
    data = message(
        failure_class=failure_class,
        rank=rank,
        step=step,
        exit_code=exit_code,
        text=text,
        extra=extra,
    )
    try:
        fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not _holds_final(fd):
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
                os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("could not write the termination message to %s: %s", target, exc)
