"""The torch-free checkpoint catalog: markers, verification, lineage, selection, retention."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fsdp_worker import contract
from fsdp_worker.contract import catalog, fence, selection
from fsdp_worker.contract.selection import Lineage, RejectReason

HASH = "cafe0000cafe0000"


def write_step(
    root: Path,
    step: int,
    *,
    attempt: int = 1,
    resumed_from: int | None = None,
    config_hash: str = HASH,
    marker: bool = True,
    job_uid: str | None = None,
) -> Path:
    d = root / catalog.step_dir_name(step)
    d.mkdir(parents=True)
    files = {".metadata": b"meta" * 10, "__0_0.distcp": bytes(range(200)), "sub/x": b"x"}
    for name, data in files.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(data)
    if marker:
        m = catalog.Marker(
            step=step,
            attempt=attempt,
            world_size=2,
            global_batch_size=12,
            samples_consumed=12 * step,
            resumed_from_step=resumed_from,
            time=1.0,
            torch_version="2.9.1",
            config_hash=config_hash,
            files={
                n: catalog.FileEntry(len(b), hashlib.sha256(b).hexdigest())
                for n, b in files.items()
            },
            job_uid=job_uid,
        )
        storage = catalog.LocalStorage(str(root))
        storage.write_atomic(str(d / catalog.MARKER_NAME), m.to_json())
    return d


def test_the_catalog_imports_neither_torch_nor_numpy_nor_pickle() -> None:
    """The operator image has no torch, and a marker is JSON read by pydantic: nothing the
    catalog reads can be unpickled (DCP's `.metadata` is a pickle; it is never opened)."""
    code = (
        "import sys, fsdp_worker.contract.catalog, fsdp_worker.contract.selection; "
        "bad = {'torch', 'numpy', 'pickle', '_pickle'} & set(sys.modules); print(sorted(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_marker_round_trips_and_rejects_wrong_types() -> None:
    m = catalog.Marker(3, 1, 2, 12, 36, None, 1.5, "2.9.1", HASH, {"a": catalog.FileEntry(4)})
    assert catalog.Marker.from_json(m.to_json()) == m
    doc = json.loads(m.to_json())
    for key, bad in [("step", "3"), ("world_size", 0), ("files", {}), ("step", True)]:
        broken = dict(doc, **{key: bad})
        with pytest.raises(catalog.CatalogError, match=key):
            catalog.Marker.from_json(json.dumps(broken).encode())
    with pytest.raises(catalog.CatalogError, match="invalid file name"):
        catalog.Marker.from_json(json.dumps(dict(doc, files={"../x": {"size": 1}})).encode())
    with pytest.raises(catalog.CatalogError, match="not JSON"):
        catalog.Marker.from_json(b"\x80\x04pickle")


def test_incomplete_damaged_and_foreign_checkpoints_are_rejected_with_reasons(
    tmp_path: Path,
) -> None:
    write_step(tmp_path, 1)
    write_step(tmp_path, 2, marker=False)
    (write_step(tmp_path, 3) / "__0_0.distcp").write_bytes(b"short")
    (write_step(tmp_path, 4) / "sub" / "x").unlink()
    (write_step(tmp_path, 5) / "extra").write_bytes(b"?")
    write_step(tmp_path, 6, config_hash="other")
    (write_step(tmp_path, 7) / catalog.MARKER_NAME).write_bytes(b"{not json")
    (tmp_path / "step-8.partial-a1").mkdir()  # a save in flight: not even listed
    (tmp_path / "step-9.partial-a1g2").mkdir()  # one by a restart in place: the same
    storage = catalog.LocalStorage(str(tmp_path))
    chosen, rejected = selection.select(storage, str(tmp_path), config_hash=HASH, lineage=None)
    assert chosen is not None and chosen.step == 1 and chosen.marker is not None
    assert [(c.step, c.reason) for c in rejected] == [
        (7, RejectReason.BAD_MARKER),
        (6, RejectReason.CONFIG_HASH_MISMATCH),
        (5, RejectReason.MANIFEST_MISMATCH),
        (4, RejectReason.MANIFEST_MISMATCH),
        (3, RejectReason.MANIFEST_MISMATCH),
        (2, RejectReason.NO_MARKER),
    ]
    assert "sub/x listed in the marker is missing" in rejected[3].detail


def test_deep_verification_catches_same_size_corruption(tmp_path: Path) -> None:
    d = write_step(tmp_path, 1)
    (d / "__0_0.distcp").write_bytes(bytes(reversed(range(200))))
    storage = catalog.LocalStorage(str(tmp_path))
    assert selection.verify(storage, str(d)).ok
    assert selection.verify(storage, str(d), deep=True).reason == RejectReason.CHECKSUM_MISMATCH


@pytest.mark.parametrize(
    ("marker_attempt", "step", "lineage", "ok"),
    [
        (3, 50, Lineage(3, 20), True),  # the current attempt's own checkpoints
        (2, 20, Lineage(3, 20), True),  # an earlier attempt, at the restart point
        (2, 10, Lineage(3, 20), True),  # ... or before it
        (2, 30, Lineage(3, 20), False),  # a superseded attempt, after the restart point
        (4, 10, Lineage(3, 20), False),  # a later attempt than the lineage knows
        (1, 10, Lineage(2, None), False),  # attempt 2 started fresh: attempt 1 is superseded
        (1, 10, Lineage(1, None), True),
    ],
)
def test_lineage_fences_superseded_attempts(
    tmp_path: Path, marker_attempt: int, step: int, lineage: Lineage, ok: bool
) -> None:
    d = write_step(tmp_path, step, attempt=marker_attempt)
    candidate = selection.verify(catalog.LocalStorage(str(tmp_path)), str(d), lineage=lineage)
    assert candidate.ok is ok
    assert candidate.reason == ("" if ok else RejectReason.LINEAGE)


def test_select_skips_a_zombie_write_and_takes_the_restart_point(tmp_path: Path) -> None:
    write_step(tmp_path, 10, attempt=1)
    write_step(tmp_path, 20, attempt=1)
    write_step(tmp_path, 30, attempt=1)  # written by a zombie of attempt 1 after the restart
    storage = catalog.LocalStorage(str(tmp_path))
    chosen, rejected = selection.select(
        storage, str(tmp_path), config_hash=HASH, lineage=Lineage(2, 20)
    )
    assert chosen is not None and chosen.step == 20
    assert [(c.step, c.reason) for c in rejected] == [(30, RejectReason.LINEAGE)]


def test_quarantine_hides_a_step_and_never_overwrites(tmp_path: Path) -> None:
    storage = catalog.LocalStorage(str(tmp_path))
    write_step(tmp_path, 5)
    first = catalog.quarantine(storage, str(tmp_path), 5)
    write_step(tmp_path, 5)
    second = catalog.quarantine(storage, str(tmp_path), 5)
    assert first != second and Path(first).is_dir() and Path(second).is_dir()
    assert selection.list_checkpoints(storage, str(tmp_path)) == []
    with pytest.raises(catalog.CatalogError):
        catalog.quarantine(storage, str(tmp_path), 5)


def test_paths_outside_the_root_are_refused(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path)
    storage = catalog.LocalStorage(str(tmp_path / "root"))
    for path in ("../x", str(tmp_path / "elsewhere"), "link/elsewhere"):
        with pytest.raises(catalog.CatalogError, match="escapes"):
            storage.exists(path)


def test_retention_keeps_the_newest_and_never_touches_incomplete_ones(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        write_step(tmp_path, step)
    write_step(tmp_path, 5, marker=False)  # may still be in flight
    storage = catalog.LocalStorage(str(tmp_path))
    candidates = selection.list_checkpoints(storage, str(tmp_path))
    assert [c.step for c in selection.retention_victims(candidates, keep=2)] == [2, 1]
    assert [c.step for c in selection.retention_victims(candidates, keep=0)] == [3, 2, 1]


@pytest.mark.parametrize(
    ("lineage", "chosen"),
    [
        pytest.param(Lineage(0, None, job_uid="new"), None, id="new-job-refuses-old-jobs-steps"),
        pytest.param(Lineage(0, None, job_uid="new", other_jobs=True), 30, id="asked-to-resume"),
        pytest.param(Lineage(1, 20, job_uid="new", other_jobs=True), 20, id="fenced-after-resume"),
        pytest.param(Lineage(2, None, job_uid="old"), 30, id="the-old-job-itself"),
        pytest.param(Lineage(2, None), 30, id="no-identity-check"),
    ],
)
def test_checkpoints_of_another_job_are_resumed_only_when_asked(
    tmp_path: Path, lineage: Lineage, chosen: int | None
) -> None:
    for step in (10, 20, 30):
        write_step(tmp_path, step, attempt=2, job_uid="old")
    storage = catalog.LocalStorage(str(tmp_path))
    got, rejected = selection.select(storage, ".", config_hash=HASH, lineage=lineage)
    assert (got.step if got else None) == chosen
    if chosen is None:
        assert {c.reason for c in rejected} == {RejectReason.OTHER_JOB}
        assert "uid old" in rejected[0].detail


def test_markers_without_a_uid_are_this_jobs_once_it_has_run(tmp_path: Path) -> None:
    write_step(tmp_path, 10, attempt=1)  # written before markers carried a uid
    storage = catalog.LocalStorage(str(tmp_path))
    running = selection.select(
        storage, ".", config_hash=HASH, lineage=Lineage(1, None, job_uid="j")
    )
    never_started = selection.select(
        storage, ".", config_hash=HASH, lineage=Lineage(0, None, job_uid="j")
    )
    assert running[0] is not None and running[0].step == 10
    assert never_started[0] is None and never_started[1][0].reason == RejectReason.OTHER_JOB


def test_a_partial_save_names_its_attempt_and_generation() -> None:
    """Generation 0 keeps the old name; later ones name themselves, so a rank 0 of an earlier
    generation still saving never writes into its successor's save of the same step."""
    assert catalog.partial_dir_name(step=8, attempt=3) == "step-8.partial-a3"
    names = [catalog.partial_dir_name(step=8, attempt=3, generation=g) for g in (0, 1, 12)]
    assert len(set(names)) == 3
    assert [catalog.partial_writer(n) for n in names] == [(3, 0), (3, 1), (3, 12)]
    for other in (
        "step-8",
        "step-8.partial-a",
        "step-8.partial-ax",
        "step-8.partial-a3g",
        "step-8.quarantined-1",
        "FENCE.json",
    ):
        assert catalog.partial_writer(other) is None


def test_dcp_metadata_proof_takes_the_newest_step_whose_metadata_was_written(
    tmp_path: Path,
) -> None:
    """torchtitan's layout: no marker; DCP's coordinator writes `.metadata` after every rank's
    files, so a save that died midway has none (or, torn, an empty one)."""
    for step in (10, 20):
        write_step(tmp_path, step, marker=False)
    in_flight = tmp_path / "step-30"
    in_flight.mkdir()
    (in_flight / "__0_0.distcp").write_bytes(b"x" * 100)  # ranks wrote; .metadata never came
    torn = write_step(tmp_path, 25, marker=False)
    (torn / ".metadata").write_bytes(b"")
    storage = catalog.LocalStorage(str(tmp_path))
    proof = contract.Proof.DCP_METADATA
    chosen, rejected = selection.select(storage, ".", config_hash=HASH, lineage=None, proof=proof)
    assert chosen is not None and chosen.step == 20 and chosen.marker is None
    assert [(c.step, c.reason) for c in rejected] == [
        (30, RejectReason.NO_MARKER),
        (25, RejectReason.NO_MARKER),
    ]
    marker_mode, _ = selection.select(storage, ".", config_hash=HASH, lineage=None)
    assert marker_mode is None, "without a marker nothing counts in the default mode"


def test_a_chooser_sets_corrupt_checkpoints_aside_unless_fenced_out(tmp_path: Path) -> None:
    for step in (3, 6):
        write_step(tmp_path, step, attempt=2)
    (tmp_path / "step-6" / "__0_0.distcp").write_bytes(b"short")  # truncated after sealing
    storage = catalog.LocalStorage(str(tmp_path))
    _, rejected = selection.select(storage, ".", config_hash=HASH, lineage=None)
    old, new = fence.Writer(2), fence.Writer(3)
    fence.take_over(storage, ".", old)
    fence.take_over(storage, ".", new)
    with pytest.raises(fence.Superseded):
        fence.quarantine_corrupt(storage, ".", rejected, me=old)
    assert (tmp_path / "step-6").is_dir(), "a superseded attempt changes nothing"
    moved = fence.quarantine_corrupt(storage, ".", rejected, me=new)
    assert moved == (6,) and (tmp_path / new.dir_name / "step-6.quarantined-1").is_dir()
    assert (tmp_path / "step-3").is_dir()
