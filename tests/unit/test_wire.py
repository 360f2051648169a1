"""Documents on the wire, as the previous release wrote them: every env and JSON document a pod,
a keeper or a checkpoint of the previous release left must read the same, and what this
release writes must be byte for byte what it wrote (a pod's env that changed would be a new
pod, a marker another reader could not parse a lost checkpoint).

The files under golden/wire/ were written by the code before its documents became pydantic
models (commit "test_wire: golden bytes ..."); never regenerate them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import pytest

from fsdp_worker import contract
from fsdp_worker.contract import catalog, interval, keeper
from fsdp_worker.keeper import gang
from fsdp_worker.telemetry import termination

GOLDEN = Path(__file__).parent / "golden" / "wire"
SHA = "a233" + "0" * 60
SUMS = contract.sums(
    steps_run=120,
    train_seconds=61.23456,
    blocked_seconds=2.5,
    milestones={"rendezvous": 1767225600.5, "loaded": 1767225603.25, "first_step": 1767225604.0},
)


def _golden(name: str) -> bytes:
    return (GOLDEN / name).read_bytes()


class Document(Protocol):
    def to_json(self) -> str | bytes: ...


READERS: dict[type, Callable[[bytes], object]] = {
    contract.ResumeRules: lambda raw: contract.ResumeRules.parse(raw.decode()),
    interval.Reliability: lambda raw: interval.Reliability.parse(raw.decode()),
    catalog.Marker: catalog.Marker.from_json,
    gang.Gang: lambda raw: gang.Gang.from_env(raw.decode()),
}


def _written(doc: Document) -> bytes:
    out = doc.to_json()
    return out if isinstance(out, bytes) else out.encode()


DOCUMENTS: list[tuple[str, Document]] = [
    (
        "resume-rules.json",
        contract.ResumeRules(attempt=2, resumed_from_step=40, expect_step=60),
    ),
    (
        "resume-rules-fresh.json",
        contract.ResumeRules(attempt=0, resumed_from_step=None),
    ),
    (
        "reliability.json",
        interval.Reliability(
            failures=3,
            uptime_seconds=3798.123,
            save_seconds=3.5,
            step_seconds=0.25,
            gang_failures=1,
        ),
    ),
    (
        "reliability-before-memory.json",
        interval.Reliability(failures=1, uptime_seconds=10.0),
    ),
    (
        "marker.json",
        catalog.Marker(
            step=60,
            attempt=2,
            world_size=4,
            global_batch_size=32,
            samples_consumed=1920,
            resumed_from_step=40,
            time=1767225600.125,
            torch_version="2.9.1+cpu",
            config_hash="9f" * 8,
            files={
                ".metadata": catalog.FileEntry(31069, SHA),
                "__0_0.distcp": catalog.FileEntry(325488),
            },
            job_uid="0b1c-uid",
        ),
    ),
    (
        "marker-before-uids.json",
        catalog.Marker(3, 0, 1, 12, 36, None, 1.5, "2.9.1", "h", {"a": catalog.FileEntry(4)}),
    ),
    (
        "gang.json",
        gang.Gang(
            restarts=3,
            coordinator="job-a1-0.job.ns.svc:29501",
            node=1,
            nodes=4,
            non_retryable=(3, 78),
        ),
    ),
    (
        "gang-spare.json",
        gang.Gang(
            restarts=3, coordinator="10.0.0.5:29501", node=-1, nodes=2, spare=0, listen=29600
        ),
    ),
]


@pytest.mark.parametrize(("name", "doc"), DOCUMENTS, ids=[name for name, _ in DOCUMENTS])
def test_a_document_of_the_previous_release_reads_the_same_and_is_written_the_same(
    name: str, doc: Document
) -> None:
    assert READERS[type(doc)](_golden(name)) == doc
    assert _written(doc) == _golden(name)


def test_the_operator_reads_a_previous_release_rank_s_failure_the_same() -> None:
    raw = _golden("termination-failure.json")
    doc = json.loads(raw)
    assert contract.parse_sums(doc) == (120, 61.235, 2.5)
    assert contract.parse_milestones(doc) == {
        "rendezvous": 1767225600.5,
        "loaded": 1767225603.25,
        "first_step": 1767225604.0,
    }
    assert (doc["class"], doc["rank"], doc["step"], doc["exitCode"]) == ("RuntimeError", 3, 57, 1)
    assert (doc["phase"], doc[contract.MEMORY_STEP_KEY]) == ("step", 50)
    written = termination.message(
        failure_class=contract.FailureClass.RUNTIME,
        rank=3,
        step=57,
        exit_code=1,
        text="RuntimeError: boom",
        extra={
            "phase": "step",
            "memory": {"peakBytes": 1024},
            contract.MEMORY_STEP_KEY: 50,
            contract.SUMS: SUMS,
        },
    )
    assert written == raw


@pytest.mark.parametrize(
    ("name", "sealed", "sums"),
    [
        ("termination-completed.json", 120, SUMS),
        (
            "termination-completed-unsealed.json",
            None,
            contract.sums(steps_run=5, train_seconds=1.0, blocked_seconds=0.0),
        ),
    ],
)
def test_the_operator_reads_a_previous_release_run_s_end_the_same(
    name: str, sealed: int | None, sums: dict[str, object]
) -> None:
    raw = _golden(name)
    doc = json.loads(raw)
    assert doc["class"] == contract.RecordClass.COMPLETED
    assert contract.completion_sealed_step(doc["message"]) == sealed
    assert contract.parse_sums(doc) is not None
    written = termination.message(
        failure_class=contract.RecordClass.COMPLETED,
        rank=0,
        step=doc["step"],
        exit_code=0,
        text=contract.completion_message(sealed_step=sealed),
        extra={contract.SUMS: sums},
    )
    assert written == raw


MARKER = json.loads(_golden("marker.json"))
GANG = json.loads(_golden("gang.json"))


def _marker(**change: object) -> bytes:
    return json.dumps({**MARKER, **change}).encode()


def _gang(**change: object) -> str:
    return json.dumps({**GANG, **change})


@pytest.mark.parametrize(
    ("read", "named"),
    [
        (lambda: gang.Gang.from_env(""), "FSDP_GANG='' is not JSON"),
        (lambda: gang.Gang.from_env("[3]"), "FSDP_GANG='[3]' must be a JSON object"),
        (lambda: gang.Gang.from_env(_gang(restarts=-1)), "restarts=-1 must be a whole number >= 0"),
        (lambda: gang.Gang.from_env(_gang(node="1")), "FSDP_GANG: node='1' must be a whole number"),
        (lambda: gang.Gang.from_env(_gang(node=4)), "node=4 must be 0 <= node < nodes (4)"),
        (lambda: gang.Gang.from_env(_gang(nonRetryable=[3, "x"])), "nonRetryable.1='x'"),
        (
            lambda: gang.Gang.from_env(json.dumps({"restarts": 1, "node": 0, "nodes": 1})),
            "FSDP_GANG: coordinator is missing: it must be a string",
        ),
        (
            lambda: contract.ResumeRules.parse('{"attempt": true}'),
            "FSDP_RESUME_RULES: attempt=True must be a whole number >= 0",
        ),
        (
            lambda: contract.ResumeRules.parse('{"attempt": 1, "resumedFromStep": 2.5}'),
            "resumedFromStep=2.5 must be a whole number >= 0 or null",
        ),
        (lambda: catalog.Marker.from_json(_marker(format=2)), "marker: format 2, expected 1"),
        (lambda: catalog.Marker.from_json(_marker(time="noon")), "time='noon' must be a number"),
        (
            lambda: catalog.Marker.from_json(_marker(files={"a": {"size": 1, "sha256": "zz"}})),
            "files.a.sha256='zz' must be a string matching ^[0-9a-f]{64}$ or null",
        ),
        (
            lambda: catalog.Marker.from_json(_marker(files={"a": {"size": -1}})),
            "files.a.size=-1 must be a whole number >= 0",
        ),
        (lambda: catalog.Marker.from_json(_marker(files={})), "files: it must list at least one"),
        (lambda: catalog.Marker.from_json(b"\x80\x04\x95pickle."), "is not JSON"),
    ],
)
def test_a_malformed_document_is_refused_naming_the_field_the_value_and_what_is_allowed(
    read: Callable[[], object], named: str
) -> None:
    with pytest.raises((ValueError, catalog.CatalogError)) as refused:  # the marker's own
        read()
    assert named in str(refused.value)


def test_a_refused_marker_is_a_catalog_error_and_a_huge_value_is_cut() -> None:
    files = {f"shard-{i}": {"size": 1} for i in range(1000)}
    with pytest.raises(catalog.CatalogError) as refused:
        catalog.Marker.from_json(_marker(files=files, step="60"))
    assert "step='60' must be a whole number >= 0" in str(refused.value)
    too_big = _marker(world_size=0, files={"a": {"size": "1" * 5000}})
    with pytest.raises(catalog.CatalogError) as refused:
        catalog.Marker.from_json(too_big)
    assert len(str(refused.value)) < 600


def test_run_sums_of_a_later_release_keep_the_milestones_this_one_knows() -> None:
    doc = {
        contract.SUMS: {
            "stepsRun": 7,
            "trainSeconds": 3,
            "blockedSeconds": 0.5,
            "compiledSeconds": 4.0,
            "milestones": {"loaded": 12.5, "compiled": 13.0, "first_step": -1, "rendezvous": 10},
        }
    }
    assert contract.parse_sums(doc) == (7, 3.0, 0.5)
    assert contract.parse_milestones(doc) == {"loaded": 12.5, "rendezvous": 10.0}
    doc[contract.SUMS]["stepsRun"] = True
    assert contract.parse_sums(doc) is None
    assert contract.parse_milestones(doc) == {"loaded": 12.5, "rendezvous": 10.0}


def test_the_keeper_wire_speaks_the_previous_release_s_op_names() -> None:
    """Keepers and operators of two releases meet on one gang during an upgrade."""
    names = ["state", "fail", "down", "done", "replace", "promote", "follow", "rejoin"]
    assert [op.value for op in keeper.Op] == names
    assert json.dumps({"op": keeper.Op.PROMOTE}) == '{"op": "promote"}'
    coordinator = gang.Coordinator(0, nodes=2)
    try:
        coordinator.handle_request_doc({"op": "fail", "generation": 0, "failure": {"node": 1}})
        assert coordinator.handle_request_doc({"op": "state"})["generation"] == 1
    finally:
        coordinator.server_close()
