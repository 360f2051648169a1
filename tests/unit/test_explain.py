"""Why an attempt failed, from the ranks' own records (explain.py): pure, so a truth table."""

from __future__ import annotations

import json
from typing import Any

from fsdp_operator import explain
from fsdp_worker import contract


def record(rank: int, *, where: str = "forward", step: int = 11, op: str | None = "all_reduce",
           seq: int = 150) -> dict[str, Any]:  # fmt: skip
    state = "entered" if op else "completed"
    return {"rank": rank, "where": where, "step": step, "collectives": seq if op else seq - 1,
            "collective": {"op": op or "all_reduce", "seq": seq if op else seq - 1,
                           "state": state}}  # fmt: skip


def test_evidence_lines_take_each_ranks_newest_and_skip_what_does_not_parse() -> None:
    old, new = record(1, step=3), record(1, step=9)
    text = "\n".join([
        f"rank1 INFO {contract.EVIDENCE_PREFIX} {json.dumps(old)}",
        f"{contract.EVIDENCE_PREFIX} {{not json",
        f"{contract.EVIDENCE_PREFIX} {json.dumps({'rank': 'x'})}",
        "an ordinary line",
        f"[rank1] {contract.EVIDENCE_PREFIX} {json.dumps(new)}",
    ])  # fmt: skip
    assert explain.evidence_lines(text) == {1: new}


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
    both = {"peakRssBytes": 3 * gib, "limitBytes": 8 * gib,
            "cudaPeakBytes": 15 * gib + gib // 5, "cudaTotalBytes": 16 * gib}  # fmt: skip
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
