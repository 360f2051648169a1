"""Why an attempt failed, from the ranks' own records (explain.py): pure, so a truth table."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fsdp_operator.io import reports
from fsdp_operator.policy import explain
from fsdp_worker import contract


def record(
    rank: int,
    *,
    where: str = "forward",
    step: int = 11,
    op: str | None = "all_reduce",
    seq: int = 150,
) -> dict[str, Any]:
    state = "entered" if op else "completed"
    return {
        "rank": rank,
        "where": where,
        "step": step,
        "collectives": seq if op else seq - 1,
        "collective": {"op": op or "all_reduce", "seq": seq if op else seq - 1, "state": state},
    }


def test_evidence_lines_take_each_ranks_newest_and_skip_what_does_not_parse() -> None:
    old, new = record(1, step=3), record(1, step=9)
    text = "\n".join(
        [
            f"rank1 INFO {contract.EVIDENCE_PREFIX} {json.dumps(old)}",
            f"{contract.EVIDENCE_PREFIX} {{not json",
            f"{contract.EVIDENCE_PREFIX} {json.dumps({'rank': 'x'})}",
            "an ordinary line",
            f"[rank1] {contract.EVIDENCE_PREFIX} {json.dumps(new)}",
        ]
    )
    assert reports.evidence_lines(text) == {1: new}


def test_a_rank_that_stopped_without_a_word_is_the_odd_one_out() -> None:
    """SIGSTOP on rank 0: its watchdog cannot speak; the others wait in the same collective."""
    found = {r: record(r) for r in (1, 2, 3)}
    report = explain.compare_hang(found, world_size=4)
    assert report.summary == (
        "ranks 1,2,3 wait in all_reduce #150 (forward, step 12); "
        "rank 0 gave no evidence (stopped, or its log was unreadable)"
    )
    assert report.odd_ranks == (0,)
    assert explain.hang_diagnosis(report, found).startswith("rank 0 not where the others are")


def test_ranks_that_all_wait_at_the_same_point_blame_nobody_in_the_gang() -> None:
    found = {r: record(r) for r in range(8)}
    report = explain.compare_hang(found, world_size=8)
    assert report.summary == "ranks 0-7 wait in all_reduce #150 (forward, step 12)"
    assert report.odd_ranks == ()
    assert "outside the gang" in explain.hang_diagnosis(report, found)


def test_no_evidence_at_all_says_where_to_look() -> None:
    report = explain.compare_hang({}, world_size=4)
    assert "no rank reported evidence" in report.summary and report.odd_ranks == ()
    assert explain.hang_diagnosis(report, {}) == ""


def test_the_logs_of_any_gang_fit_one_configmap() -> None:
    assert explain.log_share(4) == explain.LOG_TAIL_BYTES
    assert explain.pods_to_keep([0, 1, 2, 3], [2]) == [0, 1, 2, 3]
    pods = list(range(1024))
    kept = explain.pods_to_keep(pods, [700, 3])
    assert len(kept) * explain.log_share(len(pods)) <= explain.CONFIGMAP_BUDGET
    assert {700, 3} <= set(kept) and 0 in kept and 1023 not in kept


def test_memory_words_prefer_the_accelerator() -> None:
    gib = 1 << 30
    both = {
        "peakRssBytes": 3 * gib,
        "limitBytes": 8 * gib,
        "cudaPeakBytes": 15 * gib + gib // 5,
        "cudaTotalBytes": 16 * gib,
    }
    assert explain.memory_words(both) == "peak 15.2 of 16.0 GiB"
    assert explain.memory_words({"peakRssBytes": gib}) == "peak 1.0 GiB"
    assert explain.memory_words(None) == ""


def test_a_cuda_oom_is_read_against_the_ledgers_plan() -> None:
    gib = 1 << 30
    memory = {"cudaAllocatedBytes": 15 * gib, "cudaTotalBytes": 16 * gib, "rssBytes": 3 * gib}
    ledger = {"persistentBytesPerRank": 6 * gib, "largestGatheredBytes": gib}
    assert explain.allocator_words(memory, ledger) == (
        "allocated 15.0 of 16.0 GiB: persistent shards 6.0, largest gathered block 1.0, the rest "
        "(activations, temporaries) 8.0 GiB"
    )
    assert explain.allocator_words(memory, None) == "allocated 15.0 of 16.0 GiB"
    assert explain.allocator_words({"rssBytes": 2 * gib}, None) == "resident 2.0 GiB"


# --- what the kept evidence may hold -----------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "hidden"),
    [
        ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY", "wJalrXUtn"),
        ("  HF_HOME=/data/hf WANDB_API_KEY=0123456789abcdef", "0123456789abcdef"),
        ("environ({'DB_PASSWORD': 'hunter2!', 'HOME': '/tmp'})", "hunter2!"),
        ('config: {"password": "s3cr3t", "lr": 0.1}', "s3cr3t"),
        ("--api-key=sk-abcdefghijklmnop and more", "sk-abcdefghijklmnop"),
        ("Authorization: Bearer abc.def.ghi", "abc.def.ghi"),
        ("token: eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig", "eyJhbGciOiJIUzI1NiJ9"),
        ("using key AKIAIOSFODNN7EXAMPLE for s3", "AKIAIOSFODNN7EXAMPLE"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "MIIEow"),
    ],
)
def test_kept_logs_hide_environment_values_and_credentials(line: str, hidden: str) -> None:
    out = explain.redact(line)
    assert hidden not in out and explain.REDACTED in out, out


def test_redaction_keeps_what_a_failure_is_read_by() -> None:
    text = (
        "[rank1] RuntimeError: CUDA out of memory at step 52 (phase forward)\n"
        "Read error [10.244.1.2]:26527: Connection reset by peer\n"
        'FSDP_EVIDENCE {"rank": 1, "step": 52, "where": "forward", "tokens": 12}\n'
        "loaded 4096 tokens from shard 3\n"
    )
    assert explain.redact(text) == text


def test_a_tail_is_bounded_after_decoding() -> None:
    """A tail cut at 2 KiB and decoded with replacement grows to three times that when it
    is not UTF-8; kept, it is cut again to whole characters within the bound."""
    raw = bytes(range(128, 256)) * 64  # 8 KiB of bytes that are not UTF-8
    text = raw[-2048:].decode(errors="replace")
    assert len(text.encode()) > 2048
    kept = explain.bounded(text, 2048)
    assert len(kept.encode()) <= 2048 and kept.endswith("\ufffd")
    assert explain.bounded("short é", 2048) == "short é"
    assert explain.bounded("ééé", 5) == "éé"  # never half a character


def test_the_rank_table_is_whole_json_within_its_budget() -> None:
    rows = [{"rank": r, "pod": r // 8, "evidence": False, "where": "x" * 40} for r in range(4096)]
    doc = explain.json_within(rows, 20_000)
    assert len(doc.encode()) <= 20_000
    parsed = json.loads(doc)
    assert parsed[-1]["omitted"] == 4096 - (len(parsed) - 1) > 0
    assert parsed[:-1] == rows[: len(parsed) - 1]
    assert json.loads(explain.json_within(rows[:3], 20_000)) == rows[:3]
