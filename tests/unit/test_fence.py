"""The checkpoint root's one writer (fence.py): take-over, and publish, set-aside and delete as
acts a superseded writer cannot complete, wherever it was paused."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fsdp_worker.contract import catalog, fence, selection

HASH = "cafe0000cafe0000"
UID = "uid-a"


def _marker(step: int, attempt: int, files: dict[str, catalog.FileEntry]) -> catalog.Marker:
    return catalog.Marker(
        step=step,
        attempt=attempt,
        world_size=2,
        global_batch_size=8,
        samples_consumed=step * 8,
        resumed_from_step=None,
        time=0.0,
        torch_version="test",
        config_hash=HASH,
        files=files,
        job_uid=UID,
    )


def _save(storage: catalog.LocalStorage, me: fence.Writer, step: int) -> catalog.Marker:
    """What a writer's ranks do before the publish: its shards into its partial directory."""
    partial = Path(storage.resolve(me.partial(step)))
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(f"{me.describe()} step {step}".encode())
    return _marker(
        step, me.attempt, catalog.build_manifest(storage, me.partial(step), checksums=True)
    )


def _seal(storage: catalog.LocalStorage, me: fence.Writer, step: int) -> None:
    fence.publish(storage, ".", me, marker=_save(storage, me, step))


def _retain(storage: catalog.LocalStorage, me: fence.Writer, *, keep: int) -> None:
    """The worker's retention (checkpoint.CheckpointManager._retain) under `me`'s lineage."""
    lineage = selection.Lineage(me.attempt, None, job_uid=UID)
    found = selection.list_checkpoints(storage, ".", config_hash=HASH, lineage=lineage)
    for victim in selection.retention_victims(found, keep=keep):
        fence.delete(storage, ".", me, path=victim.path)


def _sealed(storage: catalog.LocalStorage) -> dict[int, int]:
    """Every sealed step under the root and the attempt that wrote it."""
    return {
        c.step: c.marker.attempt
        for c in selection.list_checkpoints(storage, ".", deep=True)
        if c.ok and c.marker is not None
    }


@pytest.mark.parametrize(
    ("holder", "writer", "stands_down"),
    [
        ((3, 0, "uid-a"), (2, 0, "uid-a"), True),  # a newer attempt of the same job
        ((3, 0, "uid-a"), (3, 0, "uid-a"), False),  # itself
        ((2, 0, "uid-a"), (3, 0, "uid-a"), False),  # an older one: this writer is the newest
        ((2, 1, "uid-a"), (2, 0, "uid-a"), True),  # a later generation of restarts in place
        ((1, 0, "uid-b"), (5, 0, "uid-a"), False),  # another job's: that job was deleted
        ((3, 0, None), (2, 0, "uid-a"), True),  # no uid recorded: attempts decide
        ((1, 0, None), (2, 0, "uid-a"), False),
    ],
)
def test_who_stands_down(
    holder: tuple[int, int, str | None], writer: tuple[int, int, str | None], stands_down: bool
) -> None:
    assert fence.Writer(*writer).superseded_by(fence.Writer(*holder)) is stands_down


def test_take_over_orders_attempts_generations_and_jobs(tmp_path: Path) -> None:
    storage = catalog.LocalStorage(str(tmp_path))
    old = fence.Writer(1, 0, UID)
    fence.take_over(storage, ".", old)
    assert fence.writers(storage, ".") == [old]
    gen1 = fence.Writer(1, 1, UID)
    fence.take_over(storage, ".", gen1)  # a restart in place: the next generation
    assert fence.writers(storage, ".") == [gen1]
    with pytest.raises(fence.Superseded, match="generation 1 of attempt 1 now writes"):
        fence.take_over(storage, ".", old)  # a zombie's restart is refused
    new = fence.Writer(2, 0, UID)
    fence.take_over(storage, ".", new)
    with pytest.raises(fence.Superseded, match="attempt 2 now writes .* attempt 1 was superseded"):
        fence.take_over(storage, ".", fence.Writer(1, 9, UID))
    other_job = fence.Writer(1, 0, "uid-b")  # this job was deleted; a new one took its name
    fence.take_over(storage, ".", other_job)
    assert fence.writers(storage, ".") == [other_job]
    assert fence.parse(other_job.dir_name) == other_job
    assert fence.parse(fence.Writer(3).dir_name) == fence.Writer(3)
    for name in ("step-3", ".writer-a1", ".writer-a1g", ".writer-a-1g0", ".writer-a1g0-a/b"):
        assert fence.parse(name) is None


def test_two_writers_that_raced_leave_one_and_leftovers_are_cleared(tmp_path: Path) -> None:
    storage = catalog.LocalStorage(str(tmp_path))
    zombie, live = fence.Writer(1, 0, UID), fence.Writer(2, 0, UID)
    (tmp_path / zombie.dir_name / "step-5.partial-a1").mkdir(parents=True)  # both made theirs
    (tmp_path / live.dir_name / "step-4.partial-a2").mkdir(parents=True)  # its own: kept
    (tmp_path / live.dir_name / "step-3.quarantined-1").mkdir()  # evidence: kept
    fence.take_over(storage, ".", live)
    assert fence.writers(storage, ".") == [live]
    kept = sorted(p.name for p in (tmp_path / live.dir_name).iterdir())
    assert kept == ["step-3.quarantined-1", "step-4.partial-a2"]
    with pytest.raises(FileNotFoundError):
        _save(storage, zombie, 6)  # its writer directory is gone: it cannot even save


def test_a_peer_rank_writing_before_the_take_over_ends_keeps_its_shard(tmp_path: Path) -> None:
    """Rank 0 renames the old writer's directory to its own, then clears what earlier writers
    left there. A rank of its own generation that saw the directory appear between the two and
    wrote its shard keeps it: rank 0 would otherwise wait for a shard that was written (seen
    in tests/worker/test_gang.py's spare takeover, where the stand-in's rank 1 ran ahead)."""
    storage = catalog.LocalStorage(str(tmp_path))
    before, me = fence.Writer(1, 0, UID), fence.Writer(1, 1, UID)
    (tmp_path / before.dir_name / "step-30.partial-a1").mkdir(parents=True)  # before's: cleared
    real_claim = fence._claim

    def claim_then_a_peer_writes(*args: Any, **kwargs: Any) -> None:
        real_claim(*args, **kwargs)
        shard = Path(storage.resolve(me.partial(30))) / "rank-1.bin"
        shard.parent.mkdir()
        shard.write_bytes(b"rank 1 step 30")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fence, "_claim", claim_then_a_peer_writes)
        fence.take_over(storage, ".", me)
    assert [p.name for p in (tmp_path / me.dir_name).iterdir()] == ["step-30.partial-a1g1"]
    assert (Path(storage.resolve(me.partial(30))) / "rank-1.bin").read_bytes() == b"rank 1 step 30"


def test_a_step_already_there_is_set_aside_and_a_sealed_step_never_overwritten(
    tmp_path: Path,
) -> None:
    storage = catalog.LocalStorage(str(tmp_path))
    first = fence.Writer(1, 0, UID)
    fence.take_over(storage, ".", first)
    _seal(storage, first, 4)
    second = fence.Writer(2, 0, UID)
    fence.take_over(storage, ".", second)
    _seal(storage, second, 4)  # resumed from an earlier step: step 4 again
    assert _sealed(storage) == {4: 2}
    aside = tmp_path / second.dir_name / "step-4.quarantined-1"
    assert catalog.Marker.from_json((aside / catalog.MARKER_NAME).read_bytes()).attempt == 1


class _Pause:
    """Pauses one thread (the zombie's) just before its `at`-th call of a file-system act
    that fence.py relies on, until `resume` is set; every call counts."""

    ACTS = ("rename", "mkdir", "rmdir", "unlink")

    def __init__(self, at: int) -> None:
        self.at, self.calls, self.thread, self.last_rename = at, 0, 0, -1
        self.paused, self.resume = threading.Event(), threading.Event()

    def gate(self, name: str) -> None:
        if threading.get_ident() != self.thread:
            return
        if name == "rename":
            self.last_rename = self.calls
        if self.calls == self.at:
            self.paused.set()
            self.resume.wait(10)
        self.calls += 1

    @contextmanager
    def installed(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        for name in self.ACTS:
            real = getattr(os, name)
            monkeypatch.setattr(os, name, self._wrap(real, name))
        for name in ("write_atomic", "exists", "list_dirs", "list_files"):
            real = getattr(catalog.LocalStorage, name)
            monkeypatch.setattr(catalog.LocalStorage, name, self._wrap(real, name))
        yield
        monkeypatch.undo()

    def _wrap(self, real: Callable[..., Any], name: str) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.gate(name)
            return real(*args, **kwargs)

        return wrapped


def _zombie_acts(storage: catalog.LocalStorage, zombie: fence.Writer) -> None:
    """The zombie's publish of step 60, then its retention (keep 1): sealed, it would delete
    steps 20 and 40, the newer attempt's resume point among them."""
    marker = _save(storage, zombie, 60)
    fence.publish(storage, ".", zombie, marker=marker)
    _retain(storage, zombie, keep=1)


def _count_acts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """How many acts the zombie's publish and retention take, and which is its last rename
    (the last act that changes the root: what follows deletes inside its own directory)."""
    storage = _setup(tmp_path / "count")
    pause = _Pause(at=-1)
    with pause.installed(monkeypatch):
        pause.thread = threading.get_ident()
        _zombie_acts(storage, fence.Writer(1, 0, UID))
    return pause.calls, pause.last_rename


def _setup(root: Path) -> catalog.LocalStorage:
    root.mkdir()
    storage = catalog.LocalStorage(str(root))
    zombie = fence.Writer(1, 0, UID)
    fence.take_over(storage, ".", zombie)
    for step in (20, 40):
        _seal(storage, zombie, step)
    return storage


def test_a_zombie_paused_anywhere_in_its_publish_or_retention_disturbs_no_newer_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 1 (a lost node's rank 0) publishes step 60 and applies retention; it is paused
    before each of its file-system acts in turn while attempt 2 takes the root over, chooses
    the newest step its lineage allows, loads it and seals step 80. Resumed, attempt 1 must
    change nothing: attempt 2's resume point and seal stay, and nothing of attempt 1's
    appears after attempt 2 chose."""
    acts, last_change = _count_acts(tmp_path, monkeypatch)
    assert acts >= 8, acts  # the table covers the save, the marker, the publish, retention
    for at in range(acts):
        root = tmp_path / f"pause-{at}"
        storage = _setup(root)
        zombie, live = fence.Writer(1, 0, UID), fence.Writer(2, 0, UID)
        pause, errors = _Pause(at), list[Exception]()

        def run_zombie(
            pause: _Pause = pause,
            storage: catalog.LocalStorage = storage,
            zombie: fence.Writer = zombie,
            errors: list[Exception] = errors,
        ) -> None:
            pause.thread = threading.get_ident()
            try:
                _zombie_acts(storage, zombie)
            except (fence.Superseded, OSError) as exc:
                errors.append(exc)

        with pause.installed(monkeypatch):
            thread = threading.Thread(target=run_zombie)
            thread.start()
            assert pause.paused.wait(10), f"the zombie never reached act {at}"
            fence.take_over(storage, ".", live)
            lineage = selection.Lineage(1, None, job_uid=UID)  # the rules after attempt 1
            chosen, _ = selection.select(storage, ".", config_hash=HASH, lineage=lineage, deep=True)
            assert chosen is not None and chosen.marker is not None
            before = _sealed(storage)
            pause.resume.set()
            thread.join(10)
            assert not thread.is_alive()
        # Superseded at a fenced act; a rank's own save fails earlier (its directory is gone).
        # Paused after its last change to the root, it had nothing left to refuse.
        assert bool(errors) is (at <= last_change), (at, last_change, errors)
        assert all(isinstance(e, fence.Superseded | FileNotFoundError) for e in errors), errors
        assert _sealed(storage) == before, f"paused before act {at}: the zombie changed the root"
        assert chosen.step in before  # the resume point is still there to load
        _seal(storage, live, 80)
        assert _sealed(storage) == {**before, 80: 2}
