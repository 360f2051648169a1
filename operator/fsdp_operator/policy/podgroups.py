"""When to create, keep, replace and delete a job's PodGroups (spec.gangScheduling), as a new
attempt's gang is created.

The attempt's PodGroup is made before its pods (a pod of a group the scheduler cannot find is
not placed), and the PodGroups of the job's earlier attempts go: their pods were deleted before
this gang, and a PodGroup left behind would keep a shrunk gang's old minMember in the
scheduler's books. One of the job's own of the same name whose spec differs (a pass cut short
between a delete and a create, another scheduler kind after an edit) is replaced, never
patched: minMember is what the scheduler counted when it last looked. The job's own groups of
another scheduler kind (an edit of the job, or of its profile, changed the kind) go too: no
pod of the new attempt joins them (`leftovers`). A name held by an object
the job does not control is a conflict: no gang is created beside someone else's group.

Pure: no I/O, no clock, no kopf. run/objects.py reads what exists and carries the plan out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Existing:
    """A PodGroup of the job's namespace that carries the job's label, or holds the name."""

    name: str
    ours: bool  # controlled by this job (its uid)
    spec: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to write for the attempt's PodGroup, in this order: delete, then create."""

    create: bool
    delete: tuple[Existing, ...] = ()
    conflict: Existing | None = None  # someone else holds the name: create no gang


def _same(found: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether an existing spec says what the wanted one says (fields the API server or the
    scheduler's webhook add, such as Volcano's default queue, are not ours to compare)."""
    return all(found.get(key) == value for key, value in wanted.items())


def plan(*, name: str, spec: Mapping[str, Any], existing: Sequence[Existing]) -> Plan:
    """The writes that leave exactly the wanted PodGroup (`name` with `spec`) among the
    job's own (`existing`: those of the job's scheduler kind): keep it when it is already so,
    replace it when not, delete the others."""
    held = [e for e in existing if e.name == name]
    strangers = [e for e in held if not e.ours]
    if strangers:
        return Plan(create=False, conflict=strangers[0])
    keep = any(_same(e.spec, spec) for e in held)
    stale = tuple(e for e in existing if e.ours and not (keep and e.name == name))
    return Plan(create=not keep, delete=stale)


def leftovers(existing: Sequence[Existing]) -> tuple[Existing, ...]:
    """Of the PodGroups of a scheduler kind the job no longer uses (`existing`), the ones to
    delete: the job's own. Another's group is left alone."""
    return tuple(e for e in existing if e.ours)
