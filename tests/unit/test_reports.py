"""The workers' JSON documents, read once at the edge (io/reports.py): what a malformed or
foreign message becomes is what the policies judge, so each shape is pinned here."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fsdp_operator.io import observe, reports
from fsdp_operator.types import observed
from fsdp_worker import contract

NOW = 1_000_000.0


@pytest.mark.parametrize(
    "text",
    ["", "not json", "[1, 2]", '"a string"', "null", "{truncated"],
    ids=["none", "words", "a-list", "a-string", "null", "cut-short"],
)
def test_a_message_that_is_no_json_object_reads_as_no_report(text: str) -> None:
    assert reports.termination(text) == observed.Termination()


def test_a_failure_message_is_read_into_its_fields() -> None:
    gib = 1 << 30
    doc = {
        "class": "OutOfMemory",
        "rank": 3,
        "step": 40,
        "exitCode": 1,
        "message": "CUDA oom",
        "phase": "optimizer step",
        "memory": {"cudaAllocatedBytes": 15 * gib},
        "ledger": {"persistentBytesPerRank": 12 * gib},
    }
    said = reports.termination(json.dumps(doc))
    assert (said.kind, said.step, said.exit_code, said.words) == ("OutOfMemory", 40, 1, "CUDA oom")
    assert said.phase == "optimizer step" and said.memory == doc["memory"]
    assert said.ledger == doc["ledger"] and said.sums is None and said.sealed_step is None


@pytest.mark.parametrize(
    ("field", "value", "read"),
    [
        ("class", 7, ("kind", None)),
        ("step", "51", ("step", None)),
        ("exitCode", 1.5, ("exit_code", None)),
        ("message", None, ("words", "")),
        ("message", {"nested": 1}, ("words", "{'nested': 1}")),
        ("phase", ["forward"], ("phase", None)),
        ("memory", "lots", ("memory", None)),
    ],
)
def test_a_field_of_the_wrong_type_is_left_out(
    field: str, value: Any, read: tuple[str, Any]
) -> None:
    said = reports.termination(json.dumps({"class": "RuntimeError", field: value}))
    assert getattr(said, read[0]) == read[1]


def test_rank_0s_final_message_carries_its_sums_milestones_and_sealed_step() -> None:
    reached = {"rendezvous": NOW + 1.0, "first_step": NOW + 2.0}
    sums = contract.sums(steps_run=50, train_seconds=10.0, blocked_seconds=0.5, milestones=reached)
    doc = {
        "class": contract.RecordClass.COMPLETED,
        "rank": 0,
        "step": 60,
        "exitCode": 0,
        "message": contract.completion_message(sealed_step=60),
        contract.SUMS: sums,
    }
    said = reports.termination(json.dumps(doc))
    assert said.sums == (50, 10.0, 0.5) and said.milestones == reached
    assert said.sealed_step == 60 and said.step == 60
    assert (said.resumed_from, said.from_memory) == (None, False), "it did not say"
    loaded = contract.sums(
        steps_run=50, train_seconds=10.0, blocked_seconds=0.5, resumed_from=40, from_memory=True
    )
    said = reports.termination(json.dumps({**doc, contract.SUMS: loaded}))
    assert (said.resumed_from, said.from_memory) == (40, True)
    malformed = {**loaded, "resumedFrom": -7}
    said = reports.termination(json.dumps({**doc, contract.SUMS: malformed}))
    assert (said.resumed_from, said.sums) == (None, None), "a malformed report is advice"
    # only a completion report's message is its sealed step
    crashed = reports.termination(json.dumps({**doc, "class": "RuntimeError"}))
    assert crashed.sealed_step is None and crashed.sums == (50, 10.0, 0.5)


def test_the_pod_view_carries_its_message_read() -> None:
    message = json.dumps({"class": "RuntimeError", "step": 7, "message": "boom"})
    state = {"terminated": {"exitCode": 1, "reason": "Error", "message": message}}
    pod = {
        "metadata": {
            "name": "job-a1-0",
            "labels": {"fsdpoperator.io/attempt": "1", "fsdpoperator.io/node-rank": "0"},
        },
        "status": {"phase": "Failed", "containerStatuses": [{"name": "worker", "state": state}]},
    }
    view = observe.pod_view(pod)
    assert view is not None and view.message == message
    assert (view.termination.kind, view.termination.step) == ("RuntimeError", 7)


def _record(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "class": "RuntimeError",
        "rank": 2,
        "step": 48,
        "exitCode": 1,
        "message": "CUDA error",
        "node": 2,
        "torchrunExitCode": 1,
        "time": NOW - 8,
        "generation": 0,
    }
    return {**doc, **over}


def test_a_keepers_record_is_read_with_the_termination_message_it_carries() -> None:
    record = reports.in_place_record(_record(phase="forward", detected=NOW - 7, reason="OOMKilled"))
    assert record is not None
    assert (record.generation, record.node, record.exit_code) == (0, 2, 1)
    assert (record.time, record.detected, record.reason) == (NOW - 8, NOW - 7, "OOMKilled")
    assert record.termination.phase == "forward" and record.termination.words == "CUDA error"
    # the failing pod's message as it would have carried it: its termination keys only
    assert json.loads(record.message) == {
        "class": "RuntimeError",
        "rank": 2,
        "step": 48,
        "exitCode": 1,
        "message": "CUDA error",
        "phase": "forward",
    }
    assert not record.taken_over and record.memory_step is None


def test_a_takeovers_record_names_the_pod_it_replaced() -> None:
    said = _record(spare=0, pod="job-a1-2", nodeName="node-2", **{contract.MEMORY_STEP_KEY: 74})
    record = reports.in_place_record(said)
    assert record is not None and record.taken_over
    assert (record.pod, record.node_name, record.memory_step) == ("job-a1-2", "node-2", 74)


@pytest.mark.parametrize(
    "doc",
    [
        _record(generation=None),
        _record(generation=-1),
        _record(generation=True),
        _record(generation="0"),
        [1],
        "x",
    ],
    ids=["none", "negative", "a-bool", "a-string", "a-list", "a-string-record"],
)
def test_a_record_without_a_generation_is_left_out(doc: object) -> None:
    assert reports.in_place_record(doc) is None


@pytest.mark.parametrize(
    ("over", "field", "read"),
    [
        ({"node": True}, "node", 0),
        ({"torchrunExitCode": False}, "exit_code", None),
        ({"time": "late"}, "time", None),
        ({contract.MEMORY_STEP_KEY: -1}, "memory_step", None),
        ({"nodeName": 5}, "node_name", None),
    ],
)
def test_a_records_field_of_the_wrong_type_is_left_out(
    over: dict[str, Any], field: str, read: Any
) -> None:
    record = reports.in_place_record(_record(**over))
    assert record is not None and getattr(record, field) == read


def test_coordinator_records_that_name_no_generation_are_left_out_and_the_rest_kept_in_order() -> (
    None
):
    later, earlier = {**_record(), "generation": 3}, {**_record(), "generation": 1}
    got = reports.in_place_records([later, {"node": 1}, earlier, "x"])
    assert [r.generation for r in got] == [1, 3]
    assert reports.in_place_records("not a list") == ()


def test_the_status_resume_rules_are_read_and_a_broken_one_says_so() -> None:
    rules = contract.ResumeRules(attempt=2, resumed_from_step=40, expect_step=45)
    assert reports.resume_rules(rules.to_json()) == rules
    assert reports.resume_rules(None) is None and reports.resume_rules("") is None
    with pytest.raises(ValueError, match="expectStep"):
        reports.resume_rules('{"attempt": 1, "expectStep": -3}')
