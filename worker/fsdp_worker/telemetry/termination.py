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

import contextlib
import fcntl
import json
import logging
import os

import pydantic

from fsdp_worker import contract
from fsdp_worker.contract import wire

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
    return bool(head.strip()) and f'"class":"{contract.RecordClass.LIVE}"'.encode() not in head


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
    fields = {"class": failure_class, "rank": rank, "step": step, "exitCode": exit_code}
    given = {**fields, "message": "", **(extra or {})}
    try:
        doc = wire.to_doc(contract.TerminationMessage.model_validate(given))
    except pydantic.ValidationError as exc:  # an extra of the wrong type: said as it came
        log.warning("termination message fields of the wrong type: %s", exc)
        doc = given
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


# --- a sibling that ended without a word ------------------------------------------------------
# A rank killed by a signal (or the kernel's OOM killer) writes nothing, and its pod's other
# ranks then fail only because it is gone ("Connection reset by peer"): their words would make
# the pod look like a survivor. Each rank registers its pid beside its siblings' (a directory
# per launcher: the ranks of one torchrun agent, or one warm launcher, share a parent), and a
# rank that fails with a symptom names the sibling that is already gone instead.


def _registry() -> str:
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", f"fsdp-ranks-{os.getppid()}")


def _parent_started() -> str:
    """The launcher's start time (clock ticks since boot): a registry left by an earlier
    process that had the same pid is not this launcher's."""
    try:
        with open(f"/proc/{os.getppid()}/stat", encoding="utf-8") as fh:
            return fh.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""


class _Registration(pydantic.BaseModel):
    """A rank's entry in its launcher's registry."""

    model_config = pydantic.ConfigDict(**wire.CAMEL, frozen=True)

    pid: int
    rank: int
    local_rank: int
    parent: str  # _parent_started() of the launcher it registered under


def register(*, rank: int, local_rank: int) -> None:
    """Record this rank's pid for its siblings; never raises."""
    entry = _Registration(
        pid=os.getpid(), rank=rank, local_rank=local_rank, parent=_parent_started()
    )
    try:
        os.makedirs(_registry(), exist_ok=True)
        with open(os.path.join(_registry(), f"{local_rank}.json"), "w", encoding="utf-8") as fh:
            json.dump(wire.to_doc(entry), fh)
    except OSError as exc:
        log.debug("rank not registered: %s", exc)


def unregister(*, local_rank: int) -> None:
    """A rank that ends in order (success or a failure it reported) takes its entry out: what
    stays is a rank that ended without a word. The launcher's directory goes with its last."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(_registry(), f"{local_rank}.json"))
    with contextlib.suppress(OSError):
        os.rmdir(_registry())


PF_EXITING = 0x4  # the kernel's task flag: set as a process starts to exit (exit_signals)


def running_by_stat(stat: str) -> bool:
    """Whether /proc/<pid>/stat's text is a process that runs on: not a zombie, not dead, and
    not exiting. A killed rank closes its sockets while it exits, before it is a zombie: on a
    loaded machine its sibling, woken by the closed connection, read it in that moment as
    running, and its pod's failure looked like a survivor's."""
    fields = stat.rpartition(")")[2].split()
    try:
        state, flags = fields[0], int(fields[6])
    except (IndexError, ValueError):
        return False
    return state not in ("Z", "X") and not flags & PF_EXITING


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return running_by_stat(fh.read())
    except OSError:
        return False


def vanished_siblings() -> list[dict[str, int]]:
    """Registered ranks of this launcher that no longer run (this one excepted)."""
    try:
        names = sorted(os.listdir(_registry()))
    except OSError:
        return []
    gone, parent = [], _parent_started()
    for name in names:
        try:
            with open(os.path.join(_registry(), name), "rb") as fh:
                entry = wire.parse_or_none(_Registration, fh.read())
        except OSError:
            continue
        if entry is None or entry.parent != parent:  # an earlier launcher's, with this pid
            continue
        if entry.pid != os.getpid() and not _running(entry.pid):
            gone.append({"pid": entry.pid, "rank": entry.rank, "localRank": entry.local_rank})
    return gone


def killed_sibling(*, rank: int, symptom: str) -> tuple[int, int, str] | None:
    """When this rank fails with a symptom (a peer gone) and a sibling of its pod already
    ended without a word: that sibling's rank, local rank and the words for it."""
    gone = vanished_siblings()
    if not gone:
        return None
    first = gone[0]
    return (
        first["rank"],
        first["localRank"],
        (
            f"rank {first['rank']} (local rank {first['localRank']}, pid {first['pid']}) ended "
            "without a word (a signal, or the kernel's OOM killer) before its pod's other ranks "
            f"failed; rank {rank} then saw: {symptom}"
        ),
    )


def live_fields() -> dict[str, object]:
    """Where the pod's first rank was by its live record (phase, step, memory), when the file
    still holds one: a killed first rank's last word, kept in the message written for it."""
    target = path()
    if target is None:
        return {}
    try:
        with open(target, "rb") as fh:
            record = wire.parse_or_none(contract.TerminationMessage, fh.read() or b"{}")
    except OSError:
        return {}
    if record is None or record.failure_class != contract.RecordClass.LIVE:
        return {}
    doc = wire.to_doc(record)
    return {k: doc[k] for k in ("phase", "step", "memory") if k in doc}
