"""The object-store commit protocol against a real S3 server (versitygw): a zombie writer
paused before each of its requests while a newer attempt takes over, resumes and commits;
nothing of the zombie's is chosen and nothing the newer attempt sealed is disturbed. Plus
the probe, URI parsing and the read view that selection's rules run on."""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fsdp_worker.contract import catalog, errors, fence, objstore, s3store, selection, store
from tests.s3server import ForgetfulProxy, S3Server

HASH = "cfg-1"
_prefixes = itertools.count()
CLIENT: list[Any] = []


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(scope="module")
def client(s3: S3Server) -> Any:
    return s3.client()  # one for the module: a boto3 client takes ~0.1 s to make


@pytest.fixture
def root(s3: S3Server, client: Any) -> str:
    CLIENT[:] = [client]
    return f"s3://{s3.bucket}/job-{next(_prefixes)}"


def marker(step: int, me: fence.Writer, files: dict[str, catalog.FileEntry]) -> catalog.Marker:
    return catalog.Marker(
        step=step,
        attempt=me.attempt,
        world_size=2,
        global_batch_size=8,
        samples_consumed=step * 8,
        resumed_from_step=None,
        time=time.time(),
        torch_version="test",
        config_hash=HASH,
        files=files,
    )


def save(st: s3store.S3Store, me: fence.Writer, step: int) -> None:
    """What a rank 0 does for one checkpoint: shards under its prefix, manifest, seal."""
    loc = objstore.parse_root(st.partial(me, step))
    for rank in range(2):
        body = f"{me.describe()} step {step} rank {rank}".encode() * 100
        st.s3.put_object(Bucket=loc.bucket, Key=loc.key(f"__{rank}_0.distcp"), Body=body)
    st.s3.put_object(Bucket=loc.bucket, Key=loc.key(".metadata"), Body=b"meta")
    st.publish(me, marker=marker(step, me, st.manifest(me, step, checksums=True)))


def lineage(me: fence.Writer, resumed: int | None) -> selection.Lineage:
    return selection.Lineage(me.attempt, resumed)


def retain(st: s3store.S3Store, me: fence.Writer, resumed: int | None, keep: int) -> None:
    found = selection.list_checkpoints(
        st.storage, st.root, config_hash=HASH, lineage=lineage(me, resumed)
    )
    for victim in selection.retention_victims(found, keep=keep):
        st.delete(me, path=victim.path)


class Paused:
    """A boto3 client that runs `newer()` once, just before its `pause_at`-th step: a write,
    or a read of FENCE.json (other reads change nothing; a pause before one is a pause after
    the write before it)."""

    def __init__(self, real: Any, pause_at: int, newer: Callable[[], None]) -> None:
        self.real, self.pause_at, self.newer, self.calls = real, pause_at, newer, 0
        self.steps: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.real, name)
        if not callable(attr) or name not in STEPS:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            key = str(kwargs.get("Key", ""))
            if name != "get_object" or key.endswith(objstore.FENCE_NAME):
                self.tick(f"{name} {key.rsplit('/', 2)[-2:]}")
            return attr(*args, **kwargs)

        return call

    def tick(self, what: str) -> None:
        self.calls += 1
        self.steps.append(what)
        if self.calls == self.pause_at:
            self.newer()


STEPS = ("put_object", "delete_object", "delete_objects", "get_object")
OLD, NEW = fence.Writer(1, 0, None), fence.Writer(2, 0, None)


def zombie_life(st: s3store.S3Store) -> None:
    """Attempt 1 after a pause-free start: saves steps 6 and 8, keeps 1, sets 8 aside."""
    for step in (6, 8):
        save(st, OLD, step)
    retain(st, OLD, None, keep=1)
    st.set_aside(OLD, step=8)


def newer_life(s3: S3Server, root: str, chosen: list[int | None]) -> None:
    """Attempt 2: takes over, resumes from the newest step its lineage allows, saves 10 and
    12, keeps 2 (so it keeps what it resumed from only while it is among the newest 2)."""
    st = s3store.S3Store(root, s3=CLIENT[0])
    st.take_over(NEW)
    st.remove_abandoned(NEW)
    best, _ = selection.select(
        st.storage, root, config_hash=HASH, lineage=lineage(NEW, 10**9), deep=True
    )
    chosen.append(best.step if best else None)
    save(st, NEW, 10)
    retain(st, NEW, chosen[0], keep=3)


def run_paused(s3: S3Server, root: str, pause_at: int) -> tuple[list[int | None], str]:
    baseline = s3store.S3Store(root, s3=CLIENT[0])
    baseline.take_over(OLD)
    for step in (2, 4):
        save(baseline, OLD, step)
    chosen: list[int | None] = []
    paused = Paused(CLIENT[0], pause_at, lambda: newer_life(s3, root, chosen))
    zombie = s3store.S3Store(root, s3=paused)
    outcome = "finished"
    try:
        zombie.take_over(OLD)  # its takeover (idempotent: it holds the root) is paused too
        zombie_life(zombie)
    except fence.Superseded:
        outcome = "superseded"
    except Exception as exc:  # its own save deleted under it (the newer attempt's cleanup)
        assert objstore.status_of(exc) == 404, exc
        outcome = "failed"
    if not chosen:  # the pause point lay past the zombie's last request
        newer_life(s3, root, chosen)
    return chosen, outcome


def zombie_requests(s3: S3Server, root: str) -> int:
    counter = Paused(CLIENT[0], 0, lambda: None)
    st = s3store.S3Store(root, s3=counter)
    st.take_over(OLD)
    for step in (2, 4):
        save(st, OLD, step)
    counter.calls = 0
    st.take_over(OLD)
    zombie_life(st)
    return counter.calls


def test_the_zombie_run_makes_enough_requests_to_pause_at(s3: S3Server, root: str) -> None:
    assert zombie_requests(s3, root) == 20  # the table below pauses before each of them


@pytest.mark.parametrize("pause_at", range(1, 22))  # before each of the 20 steps, then after all
def test_a_zombie_paused_anywhere_gets_nothing_chosen_or_disturbed(
    s3: S3Server, root: str, pause_at: int
) -> None:
    chosen, outcome = run_paused(s3, root, pause_at)
    st = s3store.S3Store(root, s3=CLIENT[0])
    final, rejected = selection.select(
        st.storage, root, config_hash=HASH, lineage=lineage(NEW, chosen[0]), deep=True
    )
    # The newer attempt's own step is the one chosen, whole (deep: every sha256 matches).
    assert final is not None and final.step == 10 and final.marker is not None
    assert final.marker.attempt == NEW.attempt
    assert rejected == []  # no partial or zombie step is even listed past the resume point
    listed = selection.list_checkpoints(st.storage, root, config_hash=HASH, deep=True)
    assert all(c.ok for c in listed), listed
    # What the newer attempt resumed from is still there, whole, unless it retired it itself.
    steps = {c.step for c in listed}
    assert chosen[0] in steps or chosen[0] is None or len(steps) == 3
    for c in listed:  # nothing of the zombie's after the newer attempt's resume point
        assert c.marker is not None
        assert c.marker.attempt == NEW.attempt or c.step <= (chosen[0] or -1)
    assert outcome in ("superseded", "failed", "finished")


def test_the_commit_fails_at_the_store_not_before_it(s3: S3Server, root: str) -> None:
    """A zombie that holds a stale ETag gets 412 on the commit itself: no check precedes it."""
    zombie = s3store.S3Store(root, s3=CLIENT[0])
    zombie.take_over(OLD)
    newer = s3store.S3Store(root, s3=CLIENT[0])
    newer.take_over(NEW)
    zombie.write_marker(OLD, marker=marker(6, OLD, {"a": catalog.FileEntry(size=1)}))
    with pytest.raises(fence.Superseded, match="attempt 2"):
        zombie.commit(OLD, step=6)
    assert newer.read_fence()[0].steps == {}


def test_a_second_marker_for_the_same_save_is_refused(s3: S3Server, root: str) -> None:
    st = s3store.S3Store(root, s3=CLIENT[0])
    st.take_over(OLD)
    m = marker(6, OLD, {"a": catalog.FileEntry(size=1)})
    st.write_marker(OLD, marker=m)
    with pytest.raises(catalog.CatalogError, match="marked once"):
        st.write_marker(OLD, marker=m)


def test_quarantine_marks_and_never_moves(s3: S3Server, root: str) -> None:
    st = s3store.S3Store(root, s3=CLIENT[0])
    st.take_over(OLD)
    save(st, OLD, 2)
    where = st.set_aside(OLD, step=2)
    assert st.storage.list_dirs(root) == []
    loc = objstore.parse_root(where)
    names = objstore.list_objects(st.s3, loc.bucket, loc.prefix)
    assert {"__0_0.distcp", catalog.MARKER_NAME, objstore.QUARANTINE_MARK} <= set(names)


def test_a_newer_step_replaces_a_sealed_one_and_keeps_it_as_evidence(
    s3: S3Server, root: str
) -> None:
    old = s3store.S3Store(root, s3=CLIENT[0])
    old.take_over(OLD)
    save(old, OLD, 4)
    new = s3store.S3Store(root, s3=CLIENT[0])
    new.take_over(NEW)
    save(new, NEW, 4)
    doc = new.read_fence()[0]
    assert doc.steps == {4: "writer-a2g0"} and doc.quarantined == {4: ["writer-a1g0"]}


def test_an_older_generation_cannot_take_a_newer_ones_root(s3: S3Server, root: str) -> None:
    st = s3store.S3Store(root, s3=CLIENT[0])
    st.take_over(fence.Writer(1, 2, None))
    with pytest.raises(fence.Superseded, match="generation 2"):
        s3store.S3Store(root, s3=CLIENT[0]).take_over(fence.Writer(1, 1, None))


def test_the_probe_passes_a_server_that_honours_conditional_writes(s3: S3Server, root: str) -> None:
    s3store.S3Store(root, s3=CLIENT[0]).probe(OLD)


def test_the_probe_refuses_a_server_that_ignores_them(s3: S3Server, root: str) -> None:
    with ForgetfulProxy(s3) as endpoint:
        st = s3store.S3Store(root, s3=s3.client(endpoint))
        with pytest.raises(errors.ConfigError, match="ignores conditional writes") as err:
            st.probe(OLD)
    assert "If-None-Match" in str(err.value) and "If-Match" in str(err.value)
    assert err.value.exit_code == errors.ConfigError.exit_code


@pytest.mark.parametrize(
    ("root", "problem"),
    [
        ("gs://bucket/prefix", "unsupported scheme"),
        ("s3://B/prefix", "bad bucket name"),
        ("s3://bucket", "bad key prefix"),
        ("s3://bucket/a/../b", "bad key prefix"),
    ],
)
def test_a_bad_root_names_the_field_the_value_and_what_is_allowed(root: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as err:
        store.check_root(root)
    assert f"checkpoint.root={root!r}" in str(err.value)
    assert "s3://<bucket>/<prefix>" in str(err.value)


def test_the_view_reads_what_the_fence_lists(s3: S3Server, root: str) -> None:
    st = s3store.S3Store(root, s3=CLIENT[0])
    st.take_over(OLD)
    save(st, OLD, 2)
    view = st.storage
    body = view.read_bytes(f"{root}/step-2/__1_0.distcp")
    assert view.sha256(f"{root}/step-2/__1_0.distcp") == hashlib.sha256(body).hexdigest()
    assert st.locate(f"{root}/step-2") == f"{root}/step-2/writer-a1g0"
