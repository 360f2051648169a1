"""The workers' own JSON documents, parsed once into the typed views the policies read.

A pod's termination message, a keeper's record of a restart in place (served by rank 0), the
resume rules the operator wrote into the status, and the `FSDP_EVIDENCE` lines ranks print in
their logs. Lenient: a report is advice, so what does not parse is left out, never raised (the
resume rules are the operator's own: a broken one fails the pass, as it always did). Nothing
below this module calls `json.loads`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fsdp_operator.types import observed
from fsdp_worker import contract

IN_PLACE_KEYS = (*contract.TERMINATION_KEYS, "phase", "memory")
"""What of a keeper's record is the failing rank's termination message (its ledger is not
kept there)."""


def _document(text: str) -> dict[str, Any]:
    """`text` as a JSON object; {} when it is none."""
    if not text:
        return {}
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _mapping(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, dict) else None


def termination(text: str) -> observed.Termination:
    """A pod's termination message (observed.PodView.message) as the policies read it."""
    return termination_of(_document(text))


def termination_of(doc: Mapping[str, Any]) -> observed.Termination:
    """The fields of a termination message already read as JSON."""
    kind, step, code = doc.get("class"), doc.get("step"), doc.get("exitCode")
    words, phase = doc.get("message"), doc.get("phase")
    completed = kind == contract.RecordClass.COMPLETED
    resumed_from, from_memory = contract.parse_resumed(dict(doc)) or (None, False)
    return observed.Termination(
        kind=kind if isinstance(kind, str) else None,
        # (a bool passes as an int here, as the worker's own checks let it)
        step=step if isinstance(step, int) else None,
        exit_code=code if isinstance(code, int) else None,
        words=str(words) if words else "",
        phase=phase if isinstance(phase, str) else None,
        memory=_mapping(doc.get("memory")),
        ledger=_mapping(doc.get("ledger")),
        sums=contract.parse_sums(dict(doc)),
        milestones=contract.parse_milestones(dict(doc)),
        sealed_step=contract.completion_sealed_step(words) if completed else None,
        resumed_from=resumed_from,
        from_memory=from_memory,
    )


def in_place_record(doc: object) -> observed.InPlaceRecord | None:
    """One keeper record (fsdp_worker.keeper.gang); None when it names no generation."""
    if not isinstance(doc, dict):
        return None
    generation, memory = _whole(doc.get("generation")), _whole(doc.get(contract.MEMORY_STEP_KEY))
    if generation is None or generation < 0:
        return None
    said = {k: doc[k] for k in IN_PLACE_KEYS if k in doc}
    node_name = doc.get("nodeName")
    return observed.InPlaceRecord(
        generation=generation,
        node=_whole(doc.get("node")) or 0,
        termination=termination_of(said),
        message=json.dumps(said),
        exit_code=_whole(doc.get("torchrunExitCode")),
        reason=str(doc.get("reason") or ""),
        time=_number(doc.get("time")),
        detected=_number(doc.get("detected")),
        memory_step=memory if memory is not None and memory >= 0 else None,
        taken_over=doc.get("spare") is not None,
        pod=str(doc.get("pod") or ""),
        node_name=node_name if isinstance(node_name, str) else None,
    )


def in_place_records(docs: object) -> tuple[observed.InPlaceRecord, ...]:
    """The coordinator's failure records (its `state` answer's `failures`), one per
    generation, in order; a record that names no generation is left out."""
    found: dict[int, observed.InPlaceRecord] = {}
    for doc in docs if isinstance(docs, list) else []:
        record = in_place_record(doc)
        if record is not None:
            found[record.generation] = record
    return tuple(found[g] for g in sorted(found))


def resume_rules(text: str | None) -> contract.ResumeRules | None:
    """The rules the status keeps for pods that choose their checkpoint (None: none)."""
    return contract.ResumeRules.parse(text) if text else None


def evidence_lines(log_text: str) -> dict[int, dict[str, Any]]:
    """Each rank's newest evidence record in a pod's log, by global rank (explain.py compares
    them); a line that does not parse is skipped."""
    found: dict[int, dict[str, Any]] = {}
    for line in log_text.splitlines():
        _, sep, rest = line.partition(contract.EVIDENCE_PREFIX + " ")
        if not sep:
            continue
        try:
            doc = json.loads(rest)
        except ValueError:
            continue
        rank = doc.get("rank") if isinstance(doc, dict) else None
        if isinstance(rank, int) and not isinstance(rank, bool):
            found[rank] = doc
    return found
