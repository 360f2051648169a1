"""Why an attempt failed, in the FSDP article's terms: which rank is not where the others are
(a hang), and what the phase of an OOM points to. Pure: records in, words out.

The records are the ranks' own (fsdp_worker/telemetry/flight.py): the `FSDP_EVIDENCE {json}`
line a rank prints when it stops stepping (io/reports.py parses them), and the live record or
failure message it leaves in its pod's termination message. Nothing here trusts them beyond
their shape. The one JSON here is written, not read: the rank table a ConfigMap keeps.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

SUMMARY_MAX = 2000
LOG_TAIL_LINES = 400
LOG_TAIL_BYTES = 64 * 1024  # per pod, before the ConfigMap's share (evidence_share)
CONFIGMAP_BUDGET = 900 * 1024  # of Kubernetes' 1 MiB per object
EVIDENCE_ATTEMPTS = 5  # failed attempts whose ConfigMaps are kept per job


# What a kept log tail never shows (docs/operator.md, "Evidence"): the value of anything
# printed as an environment variable (`NAME=value` at a word boundary, as `env` and `printenv`
# print them, and `'NAME': 'value'` as os.environ prints), and whatever looks like a
# credential: a key, token, secret or password named before its value, an Authorization
# header, a PEM private key, a JWT, a cloud access key id.
REDACTED = "<redacted>"
_ENV_ASSIGN = re.compile(r"(?<![\w.-])([A-Z][A-Z0-9_]{1,127})=(\S+)")
_ENV_REPR = re.compile(r"(['\"])([A-Z][A-Z0-9_]{1,127})\1(\s*:\s*)(['\"])(.*?)(?<!\\)\4")
_NAMED_SECRET = re.compile(
    r"(?i)\b([\w.-]*(?:password|passwd|secret|token|api[_-]?key|access[_-]?key|credential)"
    r"(?:[_-][\w-]*)?)"
    r"(['\"]?\s*[:=]\s*)(['\"]?)([^\s'\",;]+)"
)
_AUTH_HEADER = re.compile(r"(?i)\b(authorization\s*[:=]\s*)(?:(bearer|basic)\s+)?(\S+)")
_PEM = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.DOTALL
)
_TOKENS = re.compile(
    r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"  # a JWT
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"  # an AWS access key id
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}\b"  # a GitHub token
    r"|\bhf_[A-Za-z0-9]{30,}\b"  # a Hugging Face token
)


def redact(text: str) -> str:
    """`text` with environment values and credential-looking strings replaced by REDACTED."""
    text = _PEM.sub(REDACTED, text)
    text = _AUTH_HEADER.sub(
        lambda m: m.group(1) + (m.group(2) + " " if m.group(2) else "") + REDACTED, text
    )
    text = _ENV_REPR.sub(
        lambda m: m.group(1)
        + m.group(2)
        + m.group(1)
        + m.group(3)
        + m.group(4)
        + REDACTED
        + m.group(4),
        text,
    )
    text = _ENV_ASSIGN.sub(lambda m: f"{m.group(1)}={REDACTED}", text)
    text = _NAMED_SECRET.sub(lambda m: m.group(1) + m.group(2) + m.group(3) + REDACTED, text)
    return _TOKENS.sub(REDACTED, text)


def bounded(text: str, limit: int) -> str:
    """The newest part of `text` that is at most `limit` bytes as UTF-8 (whole characters):
    a tail cut by bytes and decoded with replacement can grow threefold."""
    raw = text.encode("utf-8", errors="replace")
    if len(raw) <= limit:
        return text
    return raw[-limit:].decode("utf-8", errors="ignore")


def json_within(rows: list[dict[str, Any]], limit: int) -> str:
    """`rows` as compact JSON of at most `limit` bytes, always whole: the rows that do not fit
    are left out and counted in a last row `{"omitted": n}`."""
    whole = json.dumps(rows, separators=(",", ":"))
    if len(whole.encode()) <= limit:
        return whole
    kept: list[dict[str, Any]] = []
    size = 2 + len(json.dumps({"omitted": len(rows)}).encode()) + 1
    for row in rows:
        piece = len(json.dumps(row, separators=(",", ":")).encode()) + 1
        if size + piece > limit:
            break
        kept.append(row)
        size += piece
    return json.dumps([*kept, {"omitted": len(rows) - len(kept)}], separators=(",", ":"))


def log_share(pods: int) -> int:
    """Bytes of log kept per pod: the gang's logs share one ConfigMap (at least 2 KiB each)."""
    return max(2048, min(LOG_TAIL_BYTES, CONFIGMAP_BUDGET // max(1, pods)))


def pods_to_keep(pods: list[int], first: Iterable[int]) -> list[int]:
    """The pods whose log tails fit the ConfigMap: those named `first` (the failing pod, the
    odd ranks' pods), then the others in order."""
    room = CONFIGMAP_BUDGET // log_share(len(pods))
    ordered = [p for p in dict.fromkeys(first) if p in pods]
    ordered += [p for p in pods if p not in ordered]
    return sorted(ordered[:room])


def _ranks(ranks: Iterable[int]) -> str:
    """`rank 2`, `ranks 0,1,3`, `ranks 0-63`."""
    items = sorted(ranks)
    if len(items) == 1:
        return f"rank {items[0]}"
    if len(items) > 3 and items == list(range(items[0], items[-1] + 1)):
        return f"ranks {items[0]}-{items[-1]}"
    return "ranks " + ",".join(str(r) for r in items)


def _where(doc: dict[str, Any]) -> str:
    where = doc.get("where") or doc.get("phase")
    return str(where) if where else "an unrecorded phase"


def _next_step(doc: dict[str, Any]) -> str:
    step = doc.get("step")
    return f"step {step + 1}" if isinstance(step, int) else "its first step"


@dataclass(frozen=True)
class Situation:
    """Where one rank stands: waiting inside a collective, or busy in a phase."""

    waiting: str | None  # the collective it entered and has not left, e.g. "all_reduce #150"
    where: str
    step: str

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Situation:
        c = doc.get("collective")
        waiting = None
        if isinstance(c, dict) and c.get("state") == "entered":
            waiting = f"{c.get('op')} #{c.get('seq')}"
        return cls(waiting=waiting, where=_where(doc), step=_next_step(doc))

    def words(self) -> str:
        if self.waiting:
            return f"wait in {self.waiting} ({self.where}, {self.step})"
        return f"in {self.where} at {self.step}"


@dataclass(frozen=True)
class HangReport:
    summary: str
    """Every group of ranks, the largest first, and who gave no evidence."""
    odd_ranks: tuple[int, ...]
    """The ranks not where the others are (empty when all agree or nothing is known)."""


def _behind(doc: dict[str, Any], majority: dict[str, Any]) -> str:
    mine, theirs = doc.get("collectives"), majority.get("collectives")
    if not isinstance(mine, int) or not isinstance(theirs, int) or mine >= theirs:
        return ""
    last = doc.get("collective") or {}
    n = theirs - mine
    last_words = f"{last.get('op')} #{last.get('seq')} {last.get('state')}" if last else "none"
    return f", {n} collective{'s' if n > 1 else ''} behind (its last: {last_words})"


def compare_hang(records: dict[int, dict[str, Any]], world_size: int) -> HangReport:
    """Compare the ranks' records: "ranks 0,1,3 wait in all_reduce #150 (end-of-step sync,
    step 12); rank 2 in data loading at step 12, 1 collective behind"."""
    groups: dict[Situation, list[int]] = {}
    for rank, doc in records.items():
        groups.setdefault(Situation.of(doc), []).append(rank)
    silent = [r for r in range(world_size) if r not in records]
    if not groups:
        return HangReport(
            "no rank reported evidence (hung before its first step, stopped, or not a trainer "
            "on the trainer kit); see the log tails",
            (),
        )
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(kv[1])))
    major_situation, major = ordered[0]
    major_doc = records[min(major)]
    parts = [f"{_ranks(major)} {major_situation.words()}"]
    odd: list[int] = []
    for situation, ranks in ordered[1:]:
        behind = _behind(records[min(ranks)], major_doc)
        parts.append(f"{_ranks(ranks)} {situation.words()}{behind}")
        odd += ranks
    if silent:
        parts.append(f"{_ranks(silent)} gave no evidence (stopped, or its log was unreadable)")
        if len(ordered) == 1:
            odd += silent
    summary = "; ".join(parts)
    return HangReport(summary[:SUMMARY_MAX], tuple(sorted(odd)))


def hang_diagnosis(report: HangReport, records: dict[int, dict[str, Any]]) -> str:
    """The odd rank out, named; or what it means that every rank agrees."""
    if not records:
        return ""
    if report.odd_ranks:
        return f"{_ranks(report.odd_ranks)} not where the others are: look there first"
    return (
        "every rank waits at the same point: the peer they wait for is outside the gang "
        "(storage, the network) or the collective itself is stuck"
    )


# --- an OOM's phase, mapped to the article's table ---------------------------------------------
_INIT = (
    "the model or optimizer state is built or loaded whole before sharding: build on the meta "
    "device and shard before materialising, or run more replicas"
)
_GATHER = (
    "the first gathered module is too large: wrap smaller blocks with fully_shard (sharding "
    "granularity), or lower training.microBatchSize"
)
_ACTIVATIONS = (
    "activations: lower training.microBatchSize or model.seqLen, or set "
    "training.activationCheckpointing"
)
_OPTIMIZER = "optimizer state: more replicas shard it thinner, or a lighter optimizer"
_SAVE = (
    "full-state assembly or staging copies on save: keep sharded DCP saves (no full state "
    "dict), leave room for async staging, or raise the memory limit"
)


def phase_kind(phase: str | None) -> str | None:
    """`backward of block 7` -> `backward`: what a repeated OOM is compared by."""
    return phase.split(" of block", 1)[0] if phase else None


def oom_diagnosis(phase: str | None, *, step: int | None = None) -> str:
    """The likely cause and the knob to try, from where the rank ran out of memory (`step`:
    the last step it completed; None or 0 means it was in its first)."""
    kind = phase_kind(phase)
    if kind in ("initialization", "checkpoint load"):
        advice = _INIT
    elif kind == "forward" and not step:
        advice = _GATHER
    elif kind in ("forward", "backward"):
        advice = _ACTIVATIONS
    elif kind == "optimizer step":
        advice = _OPTIMIZER
    elif kind == "checkpoint save":
        advice = _SAVE
    else:
        return f"out of memory in {phase}" if phase else ""
    return f"out of memory in {phase}: likely {advice}"


def memory_words(memory: object) -> str:
    """'peak 15.2 of 16.0 GiB' from a record's memory figures ('' when none)."""
    if not isinstance(memory, dict):
        return ""
    gib = 1 << 30
    total = memory.get("cudaTotalBytes") or memory.get("limitBytes")
    peak = memory.get("cudaPeakBytes") or memory.get("peakRssBytes")
    if not isinstance(peak, int):
        return ""
    if isinstance(total, int) and total > 0:
        return f"peak {peak / gib:.1f} of {total / gib:.1f} GiB"
    return f"peak {peak / gib:.1f} GiB"


def allocator_words(memory: object, ledger: object) -> str:
    """An OOM's memory against the ledger's plan: 'allocated 15.2 of 16.0 GiB: persistent
    shards 6.1, largest gathered block 1.2, the rest (activations, temporaries) 7.9 GiB'."""
    if not isinstance(memory, dict):
        return ""
    gib = 1 << 30
    cuda = isinstance(memory.get("cudaAllocatedBytes"), int)
    used = memory.get("cudaAllocatedBytes") if cuda else memory.get("rssBytes")
    total = memory.get("cudaTotalBytes") if cuda else memory.get("limitBytes")
    if not isinstance(used, int):
        return ""
    words = f"{'allocated' if cuda else 'resident'} {used / gib:.1f}"
    words += f" of {total / gib:.1f} GiB" if isinstance(total, int) and total > 0 else " GiB"
    plan = ledger if isinstance(ledger, dict) else {}
    persistent, gathered = plan.get("persistentBytesPerRank"), plan.get("largestGatheredBytes")
    if isinstance(persistent, int) and isinstance(gathered, int):
        rest = max(0, used - persistent - gathered)
        words += (
            f": persistent shards {persistent / gib:.1f}, largest gathered block "
            f"{gathered / gib:.1f}, the rest (activations, temporaries"
            f"{'' if cuda else ', the runtime'}) {rest / gib:.1f} GiB"
        )
    return words
