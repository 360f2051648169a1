"""A stalled rank's evidence: every thread's stack, its flight record and PyTorch's own
flight recorder, written to its log in one piece and kept under the job's checkpoint root
(`.evidence/attempt-<N>/rank-<R>.txt`, beside it `rank-<R>.fr.json`), the newest
EVIDENCE_ATTEMPTS attempts kept.

The operator reads the log line (`FSDP_EVIDENCE {json}`) before it deletes the pods; the files
outlive them. Apart from the flight record (flight.py, what a rank is doing, cheap and written
all the time) because this runs once, when the watchdog finds a stall: it reads every thread's
frames and the recorder's dump, and writes files. Nothing here may raise into training beyond
what flight.Recorder's watchdog catches; torch is imported only to dump its recorder.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import threading
import traceback
from typing import Any

from fsdp_worker import contract

log = logging.getLogger(__name__)

EVIDENCE_DIR = ".evidence"
EVIDENCE_ATTEMPTS = 5  # attempts whose evidence files are kept under the checkpoint root
EVIDENCE_FILE_MAX = 64 * 1024  # bytes per rank and attempt
STACK_LINES_MAX = 120  # per thread, in the log


def report(doc: dict[str, Any], *, rank: int, path: str | None) -> dict[str, Any]:
    """Stacks and the record `doc` of `rank`, to the log (one write) and the evidence file at
    `path` (None: the log only); returns `doc` with what was added."""
    stacks = thread_stacks()
    recorded = flight_recorder()
    if recorded:
        doc["flightRecorder"] = last_entry(recorded)
    if path is not None:
        doc["file"] = path
    line = f"{contract.EVIDENCE_PREFIX} {json.dumps(doc, separators=(',', ':'))}"
    tagged = "".join(f"[rank{rank}] {s}\n" for s in stacks.splitlines())
    header = f"[rank{rank}] no step completed for {doc['stalledSeconds']:.0f}s; stacks:\n"
    os.write(2, (header + tagged + line + "\n").encode(errors="replace"))
    if path is not None:
        _keep(path, line=line, stacks=stacks, recorded=recorded)
    return doc


def _keep(path: str, *, line: str, stacks: str, recorded: dict[str, Any] | None) -> None:
    """The evidence file (its size capped) and the flight recorder's dump beside it."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        body = (line + "\n" + stacks).encode(errors="replace")[:EVIDENCE_FILE_MAX]
        with open(path, "wb") as f:
            f.write(body)
        if recorded:
            with open(path.removesuffix(".txt") + ".fr.json", "w") as f:
                json.dump(recorded, f)
    except OSError as exc:
        log.warning("could not keep the evidence in %s: %s", path, exc)


def file_path(root: str | None, *, attempt: int, rank: int) -> str | None:
    """Where `rank`'s evidence of `attempt` is kept under the checkpoint `root` (None: none)."""
    if root is None:
        return None
    return os.path.join(root, EVIDENCE_DIR, f"attempt-{attempt}", f"rank-{rank}.txt")


FR_ENTRIES_KEPT = 200


def flight_recorder() -> dict[str, Any] | None:
    """PyTorch's own flight recorder of this process (TORCH_FR_BUFFER_SIZE; gloo and NCCL), its
    newest FR_ENTRIES_KEPT entries; None when it is off or this torch has none. JSON only:
    nothing is unpickled."""
    try:
        from torch._C import _distributed_c10d as c10d

        raw = c10d._dump_fr_trace_json(True, False)  # private, typed since torch 2.1x
        doc = json.loads(raw)
    except Exception:  # an older torch, or no process group: the record above still stands
        return None
    if not isinstance(doc, dict) or not doc.get("entries"):
        return None
    doc["entries"] = doc["entries"][-FR_ENTRIES_KEPT:]
    return doc


def last_entry(recorded: dict[str, Any]) -> dict[str, Any]:
    """The flight recorder's newest entry, in a few words: op, sequence number, state."""
    last = recorded["entries"][-1]
    return {
        "op": last.get("profiling_name"),
        "seq": last.get("collective_seq_id"),
        "state": last.get("state"),
        "processGroup": (last.get("process_group") or [None, None])[1],
    }


def thread_stacks() -> str:
    """Every other thread's Python stack (not the watchdog's own), the innermost frames kept
    when one is very deep."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        lines = "".join(traceback.format_stack(frame)).splitlines()[-STACK_LINES_MAX:]
        parts.append(f"thread {names.get(ident, ident)}:\n" + "\n".join(lines))
    return "\n".join(parts)


def prune(root: str, *, keep: int, current: int) -> None:
    """Delete the evidence of all but the newest `keep` attempts (this one counts)."""
    base = os.path.join(root, EVIDENCE_DIR)
    try:
        names = os.listdir(base)
    except OSError:
        return
    attempts = sorted(
        int(n.split("-", 1)[1])
        for n in names
        if n.startswith("attempt-") and n.split("-", 1)[1].isdigit()
    )
    older = [a for a in attempts if a < current]
    for attempt in older[: max(0, len(older) - (keep - 1))]:
        shutil.rmtree(os.path.join(base, f"attempt-{attempt}"), ignore_errors=True)
