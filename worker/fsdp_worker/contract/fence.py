"""The one writer of a checkpoint root, and the acts a superseded writer cannot complete.

Rank 0 of each attempt (and of each generation of restarts in place) owns a *writer
directory*, ``<root>/.writer-a<attempt>g<generation>[-<job uid>]``, and takes it over from
the writer before it by renaming that directory to its own name, before it chooses what to
resume from. Everything a writer changes under the root is one rename through its own writer
directory:

- a save is written into ``<writer>/step-<N>.partial-...``, its marker written inside it, and
  published by renaming it to ``<root>/step-<N>``: the only publish act;
- a step is set aside (quarantined) or deleted (retention) by renaming it into ``<writer>``.

A writer whose directory was taken over therefore fails at the rename itself (its source or
target no longer exists), wherever it was paused: no check comes before the act that a newer
writer could slip between. ``os.rename`` of a directory never replaces a non-empty one, so no
publish overwrites a sealed step either. This module must not choose checkpoints
(selection.py, resume.py) and imports the standard library, the catalog and selection's
verdicts only (the stand-in uses it).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

from fsdp_worker.contract import catalog, selection

log = logging.getLogger(__name__)

WRITER_PREFIX = ".writer-"
_WRITER_RE = re.compile(
    r"^\.writer-a(0|[1-9][0-9]{0,8})g(0|[1-9][0-9]{0,8})(?:-([A-Za-z0-9-]{1,64}))?$"
)
TAKEN_INFIX = "taken-"  # a writer directory moved into its successor's (two that coexisted)
TRASH_INFIX = "deleted-"  # a step being deleted by its writer: gone from the root already
_TAKE_OVER_TRIES = 100


class Superseded(catalog.CatalogError):
    """A newer attempt (or generation, or another job) took the root over: this writer must
    publish, set aside and delete nothing, and does not."""


@dataclass(frozen=True)
class Writer:
    """Who writes a checkpoint root: an attempt of a job, and its generation of restarts in
    place (fsdp_worker.keeper.gang)."""

    attempt: int
    generation: int = 0
    job_uid: str | None = None

    @property
    def dir_name(self) -> str:
        uid = f"-{self.job_uid}" if self.job_uid else ""
        return f"{WRITER_PREFIX}a{self.attempt}g{self.generation}{uid}"

    def partial(self, step: int) -> str:
        """Where this writer saves `step`, relative to the root, until it publishes it."""
        name = catalog.partial_dir_name(step=step, attempt=self.attempt, generation=self.generation)
        return posixpath.join(self.dir_name, name)

    def superseded_by(self, other: Writer) -> bool:
        """Whether `other`'s writer directory means this writer must stand down: a newer
        attempt or generation of the same job, or any writer of another job (that job was
        deleted, or this one was: the operator refuses two jobs on one root)."""
        if other.job_uid != self.job_uid and None not in (other.job_uid, self.job_uid):
            return False  # another job's: this writer takes it over (below)
        return (other.attempt, other.generation) > (self.attempt, self.generation)

    def describe(self) -> str:
        return f"attempt {self.attempt} generation {self.generation}"


def parse(name: str) -> Writer | None:
    """The writer whose directory `name` is, or None for any other name."""
    m = _WRITER_RE.match(name)
    if m is None:
        return None
    return Writer(int(m.group(1)), int(m.group(2)), m.group(3))


def writers(storage: catalog.LocalStorage, root: str) -> list[Writer]:
    return [w for name in storage.list_dirs(root) if (w := parse(name)) is not None]


def take_over(storage: catalog.LocalStorage, root: str, me: Writer) -> str:
    """Make `me` the root's only writer; returns its writer directory's path (under root).

    Superseded when a newer writer of this job holds the root. Another job's directory, or an
    older writer's, is renamed to `me`'s (so its partial saves and its pending acts fail); a
    second one (two writers that raced to create theirs) is moved inside `me`'s. Every loser of
    a race retries against what it then sees, so the outcome is the same in any interleaving.
    """
    os.makedirs(storage.resolve(root), exist_ok=True)
    mine = posixpath.join(root, me.dir_name)
    for _ in range(_TAKE_OVER_TRIES):
        present = writers(storage, root)
        newer = [w for w in present if w != me and me.superseded_by(w)]
        if newer:
            raise Superseded(_superseded_message(root, me, max(newer, key=_order)))
        others = [w for w in present if w != me]
        if me not in present:
            _claim(storage, root, me, donor=max(others, key=_order) if others else None)
            continue
        if not others:
            _clear_leftovers(storage, mine, me)
            return mine
        for other in others:
            _move_into(
                storage, posixpath.join(root, other.dir_name), mine, TAKEN_INFIX + other.dir_name
            )
    raise catalog.CatalogError(f"could not take {root} over as {me.describe()}: it kept changing")


def _order(w: Writer) -> tuple[int, int]:
    return (w.attempt, w.generation)


def _claim(storage: catalog.LocalStorage, root: str, me: Writer, *, donor: Writer | None) -> None:
    """Rename `donor`'s directory to `me`'s, or create `me`'s; a lost race is retried."""
    mine = storage.resolve(posixpath.join(root, me.dir_name))
    try:
        if donor is None:
            os.mkdir(mine)
        else:
            os.rename(storage.resolve(posixpath.join(root, donor.dir_name)), mine)
            log.info("took %s over from %s", root, donor.describe())
        catalog.fsync_path(storage.resolve(root))
    except FileNotFoundError:
        pass  # the donor was taken by another writer: look again
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise


def _move_into(storage: catalog.LocalStorage, src: str, writer_dir: str, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # moved by another first: take_over looks again
        os.rename(storage.resolve(src), storage.resolve(posixpath.join(writer_dir, name)))


def _clear_leftovers(storage: catalog.LocalStorage, writer_dir: str, me: Writer) -> None:
    """Earlier writers' partial saves, deleted steps and moved directories: none of them can
    ever be published now. Set-aside (quarantined) steps stay: they are evidence. So do `me`'s
    own partial saves: a rank of this generation may already be writing its shard there (the
    directory exists from the rename on), and deleting it would leave rank 0 waiting for a shard
    that was written."""
    own = posixpath.basename(me.partial(0)).removeprefix(catalog.step_dir_name(0))
    for name in storage.list_dirs(writer_dir):
        if catalog.QUARANTINE_INFIX not in name and not name.endswith(own):
            log.info("removing %s, left by an earlier writer", name)
            shutil.rmtree(storage.resolve(posixpath.join(writer_dir, name)), ignore_errors=True)


def _superseded_message(root: str, me: Writer, by: Writer) -> str:
    if by.attempt == me.attempt:
        return (
            f"generation {by.generation} of attempt {me.attempt} now writes {root}: generation "
            f"{me.generation} was superseded and publishes, quarantines and deletes nothing"
        )
    return (
        f"attempt {by.attempt} now writes {root}: attempt {me.attempt} was superseded and "
        "publishes, quarantines and deletes nothing"
    )


def refusal(storage: catalog.LocalStorage, root: str, me: Writer, act: str) -> Superseded:
    """The error for `me`, whose writer directory is gone, naming who took the root over."""
    present = [w for w in writers(storage, root) if w != me]
    if present:
        return Superseded(_superseded_message(root, me, max(present, key=_order)))
    return Superseded(f"{me.describe()} no longer writes {root} ({act} refused)")


def newer_writer(storage: catalog.LocalStorage, root: str, me: Writer) -> bool:
    """Whether a writer that supersedes `me` holds the root now."""
    return any(me.superseded_by(w) for w in writers(storage, root) if w != me)


def _rename(storage: catalog.LocalStorage, root: str, me: Writer, src: str, dst: str) -> None:
    """One fenced act: Superseded when `me`'s writer directory is gone, whichever side of the
    rename it was on."""
    try:
        os.rename(storage.resolve(src), storage.resolve(dst))
    except FileNotFoundError:
        if not storage.exists(posixpath.join(root, me.dir_name)):
            raise refusal(storage, root, me, f"renaming {src} to {dst}") from None
        raise


def publish(storage: catalog.LocalStorage, root: str, me: Writer, *, marker: catalog.Marker) -> str:
    """Seal `me.partial(marker.step)`: the marker inside it (durably), then one rename to
    ``step-<N>``. A step-<N> already there (an earlier attempt's, past this one's resume
    point) is set aside first. Returns the published path."""
    step = marker.step
    partial = posixpath.join(root, me.partial(step))
    storage.write_atomic(posixpath.join(partial, catalog.MARKER_NAME), marker.to_json())
    final = posixpath.join(root, catalog.step_dir_name(step))
    if storage.exists(final):
        moved = set_aside(storage, root, me, step=step)
        log.warning("step-%d already existed; set it aside as %s", step, moved)
    _rename(storage, root, me, partial, final)
    catalog.fsync_path(storage.resolve(root))
    return final


def set_aside(storage: catalog.LocalStorage, root: str, me: Writer, *, step: int) -> str:
    """Quarantine ``step-<N>`` into the writer directory (evidence kept, never listed)."""
    src = posixpath.join(root, catalog.step_dir_name(step))
    for k in range(1, 10_000):
        dst = posixpath.join(
            root, me.dir_name, f"{catalog.step_dir_name(step)}{catalog.QUARANTINE_INFIX}{k}"
        )
        if not storage.exists(dst):
            _rename(storage, root, me, src, dst)
            return dst
    raise catalog.CatalogError(f"too many quarantined copies of {src}")


def delete(storage: catalog.LocalStorage, root: str, me: Writer, *, path: str) -> None:
    """Retention: take `path` (a step directory) out of the root in one fenced rename, then
    delete it. A writer superseded before the rename deletes nothing."""
    trash = posixpath.join(root, me.dir_name, TRASH_INFIX + posixpath.basename(path.rstrip("/")))
    _rename(storage, root, me, path, trash)
    shutil.rmtree(storage.resolve(trash), ignore_errors=True)


def quarantine_corrupt(
    storage: catalog.LocalStorage,
    root: str,
    rejected: Sequence[selection.Candidate],
    *,
    me: Writer,
) -> tuple[int, ...]:
    """A writer that chose its own checkpoint sets aside those that failed verification, as the
    operator does when it reads them; returns their steps. Superseded (changing nothing more)
    when a newer writer took the root over. One that cannot be moved otherwise is skipped."""
    moved = []
    for c in rejected:
        if c.reason not in selection.CORRUPT:
            continue
        try:
            set_aside(storage, root, me, step=c.step)
        except Superseded:
            raise
        except (catalog.CatalogError, OSError):
            continue
        moved.append(c.step)
    return tuple(moved)
