"""fsdpctl reads the status through the operator's models, as written: what another version of
the operator wrote (more fields, fewer, a cause this one does not know) still shows."""

from __future__ import annotations

import io
import json
import types
from typing import Any

from rich.console import Console

from fsdp_operator.cli import documents, views
from fsdp_operator.types import status


def _written() -> status.FSDPJobStatus:
    failure = status.Failure(cause=status.Cause.OOM, rank=1, pod="j-a1-1", time=12.5)
    return status.FSDPJobStatus(
        phase=status.Phase.RESTARTING,
        attempt=2,
        last_failure=failure,
        history=[status.HistoryEntry(attempt=1, world_size=4, failure=failure, ended=13.0)],
        goodput=status.Goodput(since=1.0, fraction=0.5, lost_seconds={"OOMKilled": 3.0}),
    )


def test_what_this_operator_writes_reads_back_as_it_was() -> None:
    written = _written()
    doc = json.loads(json.dumps(written.model_dump(mode="json", by_alias=True)))
    read = documents.job_status({"status": doc})
    assert read.model_dump() == written.model_dump()
    assert read.history[0].failure is not None and read.history[0].failure.time == 12.5


def test_another_versions_status_reads_what_it_says_and_nothing_more() -> None:
    doc = {
        "phase": "Hibernating",  # a phase a newer operator has
        "lastFailure": {"cause": "SolarFlare", "rank": 3, "time": "2026-12-02T07:00:00Z"},
        "history": [{"attempt": 1, "cause": "OOMKilled", "newerField": True}],
        "newerField": {"any": "thing"},
    }
    read = documents.job_status({"status": doc})
    assert read.phase == "Hibernating"
    assert read.last_failure is not None and read.last_failure.cause == "SolarFlare"
    assert read.last_failure.time == status.parse_rfc3339("2026-12-02T07:00:00Z")
    assert read.history[0].cause is status.Cause.OOM  # a known cause is the enum member
    # What the status does not say is None, not the model's default or a required value.
    assert read.history[0].world_size is None and read.last_failure.pod is None
    assert read.attempt is None and read.restarts is None
    assert documents.job_status({}).phase is None  # no status yet


def test_a_job_the_operator_has_not_written_lists_as_unknown_not_pending() -> None:
    class Listing:
        def list_cluster_custom_object(self, *_: Any, **__: Any) -> Any:
            job = {"metadata": {"name": "new", "namespace": "team"}}
            return types.SimpleNamespace(data=json.dumps({"items": [job]}))

    out = io.StringIO()
    views.list_jobs(Listing(), None, Console(file=out, width=200, color_system=None), wide=True)
    row = next(line for line in out.getvalue().splitlines() if " new " in line)
    unknown = ["-", "-", "-", "-", "(-)", "0", "(0/0)"]
    assert row.split()[2:] == [*unknown, "-", "-", "-", "-", "-", "-"]  # attempt .. last failure


def test_the_spec_and_the_kept_failure_read_their_defaults() -> None:
    assert documents.nproc_per_node({"spec": {"nprocPerNode": 8, "image": "w:1"}}) == 8
    assert documents.nproc_per_node({"spec": {}}) == 1  # FSDPJobSpec's default
    kept = documents.kept_failure('{"cause": "Crash", "rank": 1, "nprocPerNode": 2, "firstPod": 1}')
    assert (kept.rank, kept.nproc_per_node, kept.first_pod) == (1, 2, 1)
    assert documents.kept_failure(None).first_pod is None
