"""The memory tier (memtier.py): two pods' in-place keepers in front of real torchrun gangs of
the built-in FSDP2 trainer, each pod with its own memory directory. A rank's crash restarts
the gang in place; the restart loads from memory when every rank holds the same sealed step
(its own, or its peer's copy of it: peercopy.py), and from the claim when one does not.
Either way training continues bitwise as the uninterrupted reference run did, and the data
cursor continues where it was."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from worker_harness import (
    flatten,
    gather,
    keeper_logs,
    launch_keepers,
    losses,
    marker,
    wait_all,
    worker_config,
)

from fsdp_worker import contract
from fsdp_worker.checkpointing import memtier
from fsdp_worker.contract import catalog

pytestmark = pytest.mark.torch


@pytest.mark.parametrize(
    ("lost", "garbled", "wiped"),
    [(False, False, False), (False, False, True), (True, False, False), (False, True, False)],
    ids=[
        "from-memory",
        "one-node-lost-its-memory-a-peer-holds-it",
        "one-rank-without-it-no-peer-copies",
        "one-rank-cannot-load-it",
    ],
)
def test_a_restart_in_place_resumes_exactly_from_memory_or_else_the_claim(
    reference: dict[str, Any], tmp_path: Path, lost: bool, garbled: bool, wiped: bool
) -> None:
    root = tmp_path / "ckpt"
    # The claim every 5 steps, memory every step; rank 1 crashes after step 7 (generation 0).
    # wiped: node 1's memory volume is empty in generation 1 (a new pod: a spare in a lost
    # node's place); node 0 holds its copy of step 7, or of step 6 when the crash came before
    # 7's copy landed (peerCopy, on by default, copies in the background), and sends it back.
    # lost: rank 1 offers nothing and no node keeps copies: the claim's step 5.
    # garbled: rank 1's memory of step 7 matches its seal but cannot be loaded (its DCP
    # metadata zeroed): every rank drops it and loads the claim's step 5 in the same
    # generation, the one restart in place allowed here not spent again on the same step.
    memory: dict[str, Any] = {"intervalSteps": 1} | ({"peerCopy": False} if lost else {})
    cfg = worker_config(root, intervalSteps=5, memory=memory)
    faults = "crash_after@0=7" + (",memory_lost=1" if lost else "")
    faults += ",memory_garbled@1=1" if garbled else ""
    faults += ",memory_wiped@1=1" if wiped else ""
    # Generation 1 starts from the warm launcher (forked from a process with torch imported,
    # ready 1 s after generation 0 started) on the memory path, from a new torchrun on the
    # claim's: the exactness below holds for both launchers.
    warm = "0" if lost else "1"
    procs = launch_keepers(
        tmp_path,
        restarts=1,
        config=cfg,
        env={
            "FSDP_TEST_FAULTS": faults,
            contract.ENV_CHECKPOINT_ROOT: str(root),
            contract.ENV_WARM_LAUNCH: warm,
        },
        node_env=lambda node: {contract.ENV_MEMORY_ROOT: str(tmp_path / f"memory-{node}")},
    )
    try:
        codes = wait_all(procs, 240)
    finally:
        for p in procs:
            p.kill()
    logs = keeper_logs(tmp_path)
    assert codes == [0, 0], logs[-6000:]
    assert len(re.findall(r"restarting in place: generation 1 ", logs)) == 2, logs[-6000:]
    launched_warm = re.findall(r"generation 1 starts from the warm launcher", logs)
    assert len(launched_warm) == (0 if lost else 2), logs[-6000:]
    node0 = (tmp_path / "node-0.log").read_text()
    generations = node0.split("restarting in place: generation 1")
    assert len(generations) == 2, node0[-4000:]
    if lost or garbled:  # rank 1 holds nothing (or nothing it can load): the claim's step 5
        assert "resumed from step-5:" in generations[1], generations[1][-4000:]
        start = 5
        if garbled:
            said = "could not load step 7 from memory"
            assert said in generations[1], generations[1][-4000:]
    elif wiped:  # step 7's copies travel after its save: the crash may come first, then 6's
        found = re.search(r"resumed from step-(\d+) \(memory\):", generations[1])
        assert found and int(found[1]) in (6, 7), generations[1][-4000:]
        start = int(found[1])
    else:
        assert "resumed from step-7 (memory):" in generations[1], generations[1][-4000:]
        start = 7
    if wiped:
        node1 = (tmp_path / "node-1.log").read_text()
        said = f"rank 1 got its step {start} back from rank 0's copy"
        assert said in node1.split("restarting in place: generation 1")[-1], node1[-4000:]
        assert "ranks [1] from peers' copies" in generations[1], generations[1][-4000:]
    resumed = losses(generations[1])
    assert sorted(resumed) == list(range(start + 1, 13))
    for step, loss in resumed.items():
        assert loss == reference["losses"][step], step  # bitwise, not approximately
    # The claim's final checkpoint is the reference's, bit for bit, its cursor 12 batches on.
    final = root / catalog.step_dir_name(12)
    assert marker(final)["samples_consumed"] == 12 * 12
    ours, theirs = gather(final, tmp_path), gather(reference["root"] / "step-12", tmp_path)
    for section in ("model", "optim"):
        fa, fb = flatten(ours[section]), flatten(theirs[section])
        keys = sorted(k for k, v in fa.items() if torch.is_tensor(v))
        assert keys and keys == sorted(k for k, v in fb.items() if torch.is_tensor(v))
        for key in keys:
            assert torch.equal(fa[key], fb[key]), key
    # Each pod's memory holds its newest sealed step with its own rank's files (and, with peer
    # copies, the one before and the other node's rank's two, byte for byte, sealed).
    for node in range(2):
        mem, other = tmp_path / f"memory-{node}", 1 - node
        held = sorted(p.name for p in mem.iterdir())
        assert held == (["step-11"] if lost else [f"copy-{other}", "step-10", "step-11"]), held
        seal = json.loads((mem / "step-11" / "COMPLETE.json").read_text())
        assert set(seal["ranks"]) == {str(node)} and seal["world_size"] == 2
        if lost:
            continue
        copies = sorted(p.name for p in (mem / f"copy-{other}").iterdir())
        assert copies == ["step-10", "step-10.json", "step-11", "step-11.json"], copies
        kept = json.loads((mem / f"copy-{other}" / "step-11.json").read_text())
        assert set(kept["ranks"]) == {str(other)} and kept["step"] == 11, kept
        theirs = tmp_path / f"memory-{other}" / "step-11" / f"rank-{other}"
        copy = mem / f"copy-{other}" / "step-11"
        assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in theirs.iterdir())
        for f in theirs.iterdir():
            assert (copy / f.name).read_bytes() == f.read_bytes(), f.name


def test_a_seal_is_refused_for_another_world_size_attempt_job_or_missing_files(
    tmp_path: Path,
) -> None:
    """What a rank checks before it offers its memory (no collectives involved)."""
    tier = _tier(tmp_path, rank=1, world_size=2, attempt=2)
    step_dir = tmp_path / "step-4"
    (step_dir / "rank-1").mkdir(parents=True)
    (step_dir / "rank-1" / "__0_0.distcp").write_bytes(b"x" * 10)

    def seal(**change: Any) -> str:
        doc = memtier.Seal(
            step=4,
            samples=48,
            world_size=2,
            global_batch_size=12,
            config_hash="h",
            job_uid="u",
            attempt=2,
            ranks={"1": {"__0_0.distcp": 10}},
            time=0.0,
        )
        doc = memtier.Seal(**{**doc.__dict__, **change})
        (step_dir / "COMPLETE.json").write_bytes(doc.to_json())
        return tier._refusal(str(step_dir), 4)

    assert seal() == "" and tier.newest() == (4, 48)
    assert "world size 4" in seal(world_size=4)
    assert "attempt 1" in seal(attempt=1)
    assert "job other" in seal(job_uid="other")
    assert "config hash" in seal(config_hash="g")
    assert "not in it" in seal(ranks={"0": {"__0_0.distcp": 10}})
    assert "differ" in seal(ranks={"1": {"__0_0.distcp": 11}})
    (step_dir / "COMPLETE.json").write_text("{")
    assert "no valid" in tier._refusal(str(step_dir), 4) and tier.newest() == (-1, -1)
    (tmp_path / "step-9.partial").mkdir()  # never sealed: never offered
    assert tier.newest() == (-1, -1)


# Written by memtier.Seal.to_json before the seal became a pydantic model: a seal a pod's memory
# holds across an upgrade of the worker image must still be read, and is written the same.
SEAL_GOLDEN = (
    b'{"attempt": 2, "config_hash": "9f9f", "format": 1, "global_batch_size": 12, '
    b'"job_uid": "0b1c-uid", "ranks": {"0": {".metadata": 3, "__0_0.distcp": 10}, '
    b'"1": {"__1_0.distcp": 11}}, "samples": 48, "step": 4, "time": 1767225600.5, '
    b'"world_size": 2}'
)


def test_a_seal_of_the_previous_release_reads_the_same_and_is_written_the_same() -> None:
    seal = memtier.Seal(
        step=4,
        samples=48,
        world_size=2,
        global_batch_size=12,
        config_hash="9f9f",
        job_uid="0b1c-uid",
        attempt=2,
        ranks={"0": {"__0_0.distcp": 10, ".metadata": 3}, "1": {"__1_0.distcp": 11}},
        time=1767225600.5,
    )
    assert memtier.Seal.parse(SEAL_GOLDEN) == seal
    assert seal.to_json() == SEAL_GOLDEN


def test_a_peer_copy_arrives_byte_for_byte_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    """peercopy's wire: what a rank sends its ring neighbour (no process group involved)."""
    from fsdp_worker.checkpointing import peercopy

    src = tmp_path / "rank-3"
    src.mkdir()
    files = {".metadata": b"meta" * 7, "__3_0.distcp": bytes(range(256)) * 5, "empty": b""}
    for name, data in files.items():
        (src / name).write_bytes(data)
    blob = peercopy.pack(str(src))
    dst = tmp_path / "step-4" / "copy-3"
    assert peercopy.unpack(blob, str(dst)) == {k: len(v) for k, v in files.items()}
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == files
    # the ring: the same local rank of the next node gets it, from the previous node's
    assert peercopy.ring(3, 8, 2) == (5, 1) and peercopy.ring(7, 8, 2) == (1, 5)
    assert peercopy.holder(7, 8, 2) == 1

    def refused(raw: bytes) -> str:
        with pytest.raises(ValueError) as err:
            peercopy.unpack(raw, str(tmp_path / "out"))
        return str(err.value)

    assert "add up to" in refused(bytes(blob.numpy()[:-1]))  # truncated
    assert "no header" in refused(b"\x00")
    assert "header says" in refused(b"\x00\x00\x00\x00\x00\x10\x00\x00" + b"{}")
    evil = json.dumps({"files": [["../../etc/x", 1]]}).encode()
    assert "plain file name" in refused(len(evil).to_bytes(8, "big") + evil + b"x")
    assert not (tmp_path / "out").exists() and not (tmp_path.parent / "etc").exists()


@pytest.mark.parametrize(
    ("rows", "offer"),
    [
        pytest.param(
            [[11, 132, 10, 120, 11, 10]] * 4, memtier.Offer(11, 132), id="every-rank-its-own"
        ),
        pytest.param(
            [[11, 132, 10, 120, 11, 10]] * 2 + [[-1, -1, -1, -1, -1, -1]] * 2,
            memtier.Offer(11, 132, (2, 3)),
            id="node-1-new-node-0-holds-its-copies",
        ),
        pytest.param(
            [[11, 132, 10, 120, 10, -1]] * 2 + [[-1, -1, -1, -1, -1, -1]] * 2,
            memtier.Offer(10, 120, (2, 3)),
            id="step-11s-copies-still-travelling-step-10",
        ),
        pytest.param(
            [[11, 132, 10, 120, -1, -1]] * 2 + [[-1, -1, -1, -1, -1, -1]] * 2,
            None,
            id="no-copies-the-claim",
        ),
        pytest.param(
            [[11, 132, 10, 120, 11, 10], [9, 108, -1, -1, 11, 10]]
            + [[11, 132, 10, 120, 11, 10]] * 2,
            memtier.Offer(11, 132, (1,)),
            id="a-rank-behind-gets-its-copy",
        ),
    ],
)
def test_the_gang_loads_the_newest_step_each_rank_or_its_peer_holds(
    rows: list[list[int]], offer: memtier.Offer | None, tmp_path: Path
) -> None:
    """memtier.MemoryTier._offer_of: 2 nodes x 2 ranks; a row per rank: two (step, samples)
    of its own, two steps of the copies it keeps (rank r's copy is on rank r + 2 mod 4)."""
    tier = _tier(tmp_path, rank=0, world_size=4, attempt=1, local_world=2)
    assert tier._offer_of(rows) == offer


def _tier(
    root: Path, *, rank: int, world_size: int, attempt: int, local_world: int | None = None
) -> memtier.MemoryTier:
    """A rank's memory tier without a process group (nothing here is collective)."""
    from fsdp_worker.checkpointing import checkpoint
    from fsdp_worker.runtime.distributed import DistInfo
    from fsdp_worker.telemetry import metrics

    ident = checkpoint.Identity(
        attempt=attempt, resumed_from_step=None, config_hash="h", global_batch_size=12, job_uid="u"
    )
    info = DistInfo(
        rank=rank,
        world_size=world_size,
        local_rank=0,
        device=torch.device("cpu"),
        mesh=None,  # type: ignore[arg-type]
        ckpt_group=None,  # type: ignore[arg-type]
    )
    return memtier.MemoryTier(
        str(root), identity=ident, dist_info=info, meters=metrics.Metrics(), local_world=local_world
    )
