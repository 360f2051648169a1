"""fsdpctl keeps kubectl's habits: flags anywhere, `get`, `-l`, `-o name|jsonpath|custom-columns`,
`--watch`, `wait --for ... --timeout`; requests go to a fake API server (tests/fakeapi.py)."""

from __future__ import annotations

import argparse
import json
import shlex
import types
from pathlib import Path
from typing import Any

import kmock
import pytest

from fsdp_operator import cli
from fsdp_operator.cli import jsonpath, parser, printers, wait
from fsdp_operator.types import api
from tests import fakeapi

JOBS = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/team/{api.PLURAL}"
ALL_JOBS = f"/apis/{api.GROUP}/{api.VERSION}/{api.PLURAL}"


def _job(name: str, phase: str = "Running", **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{api.GROUP}/{api.VERSION}",
        "kind": api.KIND,
        "metadata": {"name": name, "namespace": "team", "labels": {"team": "nlp"}},
        "status": {"phase": phase, "step": 120, **status},
    }


def _listed(*jobs: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "FSDPJobList", "metadata": {"resourceVersion": "41"}, "items": list(jobs)}


# --- the command line: what kubectl users type parses as they mean it -------------------------
HABITS = [
    # (argv, what the parsed arguments say)
    ("describe x -n team", {"command": "describe", "name": "x", "namespace": "team"}),
    ("-n team describe x", {"command": "describe", "name": "x", "namespace": "team"}),
    ("describe -n team x", {"command": "describe", "name": "x", "namespace": "team"}),
    ("describe fsdpjob/x --namespace=team", {"name": "x", "namespace": "team"}),
    ("why x --context prod --kubeconfig /k", {"context": "prod", "kubeconfig": "/k"}),
    ("--context prod logs x --rank 3 -n t", {"context": "prod", "rank": 3, "namespace": "t"}),
    ("-n a get -n b", {"command": "get", "namespace": "b"}),  # the later flag wins, as kubectl
    ("get", {"command": "get", "names": [], "namespace": None, "all_namespaces": False}),
    ("get -A", {"all_namespaces": True}),
    ("-A get", {"all_namespaces": True}),
    ("get x y -n team", {"names": ["x", "y"], "namespace": "team"}),
    ("get fsdpjobs/x", {"names": ["x"]}),
    ("get -l team=nlp,tier!=dev", {"selector": "team=nlp,tier!=dev"}),
    ("list --selector team=nlp", {"command": "list", "selector": "team=nlp"}),
    ("get -o name", {"output": printers.Output(printers.Format.NAME)}),
    ("get -owide", {"output": printers.Output(printers.Format.WIDE)}),
    (
        "get x -o jsonpath={.status.phase}",
        {"output": printers.Output(printers.Format.JSONPATH, "{.status.phase}")},
    ),
    (
        "get -o custom-columns=NAME:.metadata.name,STEP:.status.step",
        {
            "output": printers.Output(
                printers.Format.CUSTOM_COLUMNS, "NAME:.metadata.name,STEP:.status.step"
            )
        },
    ),
    ("get -w", {"watch": True}),
    ("get --watch -n team", {"watch": True, "namespace": "team"}),
    (
        "wait x --for=condition=Complete --timeout=5m",
        {
            "names": ["x"],
            "timeout": 300.0,
            "wait_for": wait.WaitFor(wait.Kind.CONDITION, "Complete", "True"),
        },
    ),
    (
        "wait fsdpjob/x --for=condition=Failed=False -n team",
        {"wait_for": wait.WaitFor(wait.Kind.CONDITION, "Failed", "False"), "namespace": "team"},
    ),
    (
        "wait -l team=nlp --for=jsonpath={.status.phase}=Succeeded --timeout 1h30m",
        {
            "names": [],
            "selector": "team=nlp",
            "timeout": 5400.0,
            "wait_for": wait.WaitFor(wait.Kind.JSONPATH, "{.status.phase}", "Succeeded"),
        },
    ),
    ("wait x --for=delete", {"wait_for": wait.WaitFor(wait.Kind.DELETE), "timeout": 30.0}),
    ("delete x y -n team", {"command": "delete", "names": ["x", "y"], "wait": True}),
    ("delete fsdpjob/x --wait=false", {"names": ["x"], "wait": False}),
    ("delete -l team=nlp --timeout=2m", {"selector": "team=nlp", "timeout": 120.0}),
    ("events x -n team", {"command": "events", "name": "x", "watch": False}),
    ("events fsdpjob/x -w -o yaml", {"name": "x", "watch": True, "output": "yaml"}),
    (
        "wait x --for jsonpath={.status.queue}",
        {"wait_for": wait.WaitFor(wait.Kind.JSONPATH, "{.status.queue}")},
    ),
]


@pytest.mark.parametrize(("line", "says"), HABITS, ids=[h[0] for h in HABITS])
def test_a_kubectl_habit_parses_as_meant(line: str, says: dict[str, Any]) -> None:
    for prog in ("fsdpctl", "kubectl fsdp"):
        args = parser.build(prog).parse_args(line.split())
        assert {k: getattr(args, k) for k in says} == says


REFUSED = [
    ("get -o xml", "-o 'xml': allowed are table, wide, json, yaml, name, jsonpath=TEMPLATE"),
    ("get -o jsonpath=", "-o 'jsonpath=': allowed are"),
    ("get -o custom-columns=NAME", "'NAME' is not HEADER:PATH"),
    ("wait x --for=ready", "--for='ready': allowed are condition=TYPE[=STATUS]"),
    ("wait x", "the following arguments are required: --for"),
    ("wait x --for=delete --timeout=soon", "--timeout 'soon': a duration such as 30s"),
    ("describe x --user dev", "unrecognized arguments: --user dev"),
    ("delete x --wait=soon", "--wait: 'soon': allowed are true and false"),
]


@pytest.mark.parametrize(("line", "error"), REFUSED, ids=[r[0] for r in REFUSED])
def test_what_fsdpctl_cannot_do_is_refused_with_what_it_can(
    line: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parser.build("fsdpctl").parse_args(line.split())
    assert exited.value.code == 2
    assert error in capsys.readouterr().err


# --- against the API server ---------------------------------------------------------------------
def _run(fake_api: fakeapi.FakeAPI, tmp_path: Path, line: str) -> int:
    kubeconfig = fake_api.kubeconfig(tmp_path / "kubeconfig")
    return cli.main([*shlex.split(line), "--kubeconfig", str(kubeconfig)])


def test_get_with_flags_after_the_verb_lists_the_namespace_by_selector(
    fake_api: fakeapi.FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api[f"get {JOBS}"] << _listed(_job("a"), _job("b"))
    assert _run(fake_api, tmp_path, "get -n team -l team=nlp -o name") == 0
    assert capsys.readouterr().out == "fsdpjob.fsdpoperator.io/a\nfsdpjob.fsdpoperator.io/b\n"
    assert fake_api.requests[0].params.get("labelSelector") == "team=nlp"


def test_kubectl_fsdp_passes_flags_after_the_name(
    fake_api: fakeapi.FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api[f"get {JOBS}/a"] << _job("a")
    kubeconfig = fake_api.kubeconfig(tmp_path / "kubeconfig")
    argv = ["describe", "a", "-n", "team", "-o", "json", "--kubeconfig", str(kubeconfig)]
    assert cli.main(argv, prog="kubectl fsdp") == 0
    assert json.loads(capsys.readouterr().out)["metadata"]["name"] == "a"


def test_get_one_job_by_jsonpath_prints_its_value(
    fake_api: fakeapi.FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api[f"get {JOBS}"] << _listed(_job("a", "Queued"), _job("b"))
    assert _run(fake_api, tmp_path, "get a -n team -o jsonpath={.status.phase}") == 0
    assert capsys.readouterr().out == "Queued"


def test_get_all_namespaces_by_jsonpath_range_and_custom_columns(
    fake_api: fakeapi.FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api[f"get {ALL_JOBS}"] << _listed(_job("a"), _job("b", "Failed"))
    template = "'{range .items[*]}{.metadata.name}={.status.phase}{\"\\n\"}{end}'"
    assert _run(fake_api, tmp_path, f"get -A -o jsonpath={template}") == 0
    assert capsys.readouterr().out == "a=Running\nb=Failed\n"
    assert (
        _run(fake_api, tmp_path, "-A get -o custom-columns=NAME:.metadata.name,Q:.status.queue")
        == 0
    )
    assert capsys.readouterr().out == "NAME   Q\na      <none>\nb      <none>\n"


def test_get_a_job_that_does_not_exist_says_so_and_fails(
    fake_api: fakeapi.FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api[f"get {JOBS}"] << _listed(_job("a"))
    assert _run(fake_api, tmp_path, "get a nope -n team -o name") == 1
    said = capsys.readouterr()
    assert said.out == "fsdpjob.fsdpoperator.io/a\n"
    assert 'fsdpjobs "nope" not found' in said.err


def test_get_watch_prints_each_change_after_the_list(
    fake_api: fakeapi.FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    changes = [
        {"type": "MODIFIED", "object": _job("a", "Restarting")},
        {"type": "MODIFIED", "object": _job("other", "Running")},
        {"type": "DELETED", "object": _job("a", "Succeeded")},
    ]
    stream = "".join(json.dumps(c) + "\n" for c in changes).encode()
    fake_api[f"get {JOBS}"] << kmock.Response(payload=stream)
    kubeconfig = fake_api.kubeconfig(tmp_path / "kubeconfig")
    args = parser.build("fsdpctl").parse_args(["get", "a", "-o", "jsonpath={.status.phase} "])
    custom = cli.kubernetes.client.CustomObjectsApi(cli.kube.load_client(str(kubeconfig)))
    cli.watch_jobs(custom, "team", args, cli.Console(), since="41", timeout_seconds=5)
    assert capsys.readouterr().out == "Restarting Succeeded "
    watched = fake_api.requests[-1].params
    assert watched.get("watch") in ("true", "True") and watched.get("resourceVersion") == "41"


# --- delete and events ---------------------------------------------------------------------------
def test_delete_deletes_each_job_named_then_waits_until_it_is_gone(
    fake_api: fakeapi.FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api[f"delete {JOBS}/a"] << {"kind": "Status", "status": "Success"}
    fake_api[f"delete {JOBS}/nope"] << fakeapi.status(404, 'fsdpjobs "nope" not found')
    fake_api.answer(f"get {JOBS}", _listed(_job("a")), _listed())  # gone at the second poll
    assert _run(fake_api, tmp_path, "delete a nope -n team --timeout=10s") == 1  # nope: 1
    said = capsys.readouterr()
    assert said.out == f'fsdpjob.{api.GROUP} "a" deleted\n'
    assert 'Error from server (NotFound): fsdpjobs "nope" not found' in said.err
    deletes = [r for r in fake_api.requests if r.method.value.lower() == "delete"]
    assert [r.url.path for r in deletes] == [f"{JOBS}/a", f"{JOBS}/nope"]
    assert deletes[0].params.get("propagationPolicy") == "Background"
    assert len([r for r in fake_api.requests if r.method.value.lower() == "get"]) == 2


def test_delete_by_selector_without_waiting(
    fake_api: fakeapi.FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api[f"get {JOBS}"] << _listed(_job("b"), _job("a"))
    for name in ("a", "b"):
        fake_api[f"delete {JOBS}/{name}"] << {"kind": "Status", "status": "Success"}
    assert _run(fake_api, tmp_path, "delete -l team=nlp -n team --wait=false") == 0
    assert capsys.readouterr().out.splitlines() == [
        f'fsdpjob.{api.GROUP} "a" deleted',
        f'fsdpjob.{api.GROUP} "b" deleted',
    ]
    assert fake_api.requests[0].params.get("labelSelector") == "team=nlp"


def test_delete_with_neither_name_nor_selector_or_both_deletes_nothing(
    fake_api: fakeapi.FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(fake_api, tmp_path, "delete -n team") == 1
    assert "name a job, or select jobs with -l" in capsys.readouterr().err
    assert _run(fake_api, tmp_path, "delete a -l team=nlp -n team") == 1
    assert "not both" in capsys.readouterr().err
    assert not fake_api.requests


EVENTS = "/api/v1/namespaces/team/events"


def _event(reason: str, at: str, message: str, count: int = 1) -> dict[str, Any]:
    about = {"kind": api.KIND, "name": "a", "namespace": "team"}
    return {
        "metadata": {"name": f"a.{reason}", "namespace": "team"},
        "involvedObject": about,
        "reason": reason,
        "type": "Warning" if reason == "FailureDetected" else "Normal",
        "message": message,
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": count,
    }


def test_events_lists_every_event_about_the_job_oldest_first(
    fake_api: fakeapi.FakeAPI,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # a terminal wide enough that no message folds
    listed = {
        "kind": "EventList",
        "metadata": {"resourceVersion": "7"},
        "items": [
            _event("TrainingResumed", "2026-12-06T10:02:00Z", "attempt 2 trains from step 40"),
            _event("FailureDetected", "2026-12-06T10:01:00Z", "rank 2 exited 137", count=2),
        ],
    }
    fake_api[f"get {EVENTS}"] << listed
    assert _run(fake_api, tmp_path, "events a -n team") == 0
    out = capsys.readouterr().out
    assert out.index("FailureDetected") < out.index("TrainingResumed"), out
    assert "rank 2 exited 137" in out and "attempt 2 trains from step 40" in out
    selector = fake_api.requests[0].params.get("fieldSelector")
    assert selector == f"involvedObject.name=a,involvedObject.kind={api.KIND}"
    assert _run(fake_api, tmp_path, "events a -n team -o json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert [e["reason"] for e in doc["items"]] == ["FailureDetected", "TrainingResumed"]


def test_events_watch_prints_each_new_event_after_the_list(
    fake_api: fakeapi.FakeAPI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = _event("RestartedInPlace", "2026-12-06T10:03:00Z", "generation 1 restarts in place")
    listed = {"kind": "EventList", "metadata": {"resourceVersion": "7"}, "items": []}
    stream = (json.dumps({"type": "ADDED", "object": new}) + "\n").encode()
    fake_api.answer(f"get {EVENTS}", listed, kmock.Response(payload=stream))
    kubeconfig = fake_api.kubeconfig(tmp_path / "kubeconfig")
    args = parser.build("fsdpctl").parse_args(["events", "a", "-w", "-o", "json"])
    core = cli.kubernetes.client.CoreV1Api(cli.kube.load_client(str(kubeconfig)))
    assert cli.events(core, "team", args, cli.Console(), timeout_seconds=5) == 0
    # -o json: the list, then each new Event as a document of its own (no table rows)
    decoder, out, docs = json.JSONDecoder(), capsys.readouterr().out, []
    at = 0
    while at < len(out.rstrip()):
        doc, at = decoder.raw_decode(out, at)
        docs.append(doc)
        at += len(out[at:]) - len(out[at:].lstrip())
    assert [d.get("kind") for d in docs] == ["List", None]
    assert docs[1]["message"] == "generation 1 restarts in place"
    watched = fake_api.requests[-1].params
    assert watched.get("watch") in ("true", "True") and watched.get("resourceVersion") == "7"


# --- wait ---------------------------------------------------------------------------------------
class Jobs:
    """Stands in for the list call wait() polls: one answer a poll, the last one repeated."""

    def __init__(self, *polls: list[dict[str, Any]]) -> None:
        self.polls = list(polls)
        self.asked = 0

    def list_namespaced_custom_object(self, *_: Any, **__: Any) -> Any:
        answer = self.polls[min(self.asked, len(self.polls) - 1)]
        self.asked += 1
        return types.SimpleNamespace(data=json.dumps(_listed(*answer)))


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def clock(self) -> wait.Clock:
        return wait.Clock(now=lambda: self.now, sleep=self.sleep, interval=2.0)


def _complete(phase: str, done: str) -> dict[str, Any]:
    condition = {"type": "Complete", "status": done, "reason": phase, "lastTransitionTime": ""}
    return _job("a", phase, conditions=[condition])


def _wait(line: str, jobs: Jobs, clock: FakeClock) -> int:
    args: argparse.Namespace = parser.build("fsdpctl").parse_args(line.split())
    return wait.wait(jobs, "team", args, clock.clock())


MET = "fsdpjob.fsdpoperator.io/{} condition met\n"
RUNNING, DONE = _complete("Running", "False"), _complete("Succeeded", "True")
WAITS = [
    # (command line, the polls' answers, exit code, seconds waited, what it prints)
    ("wait a --for=condition=Complete", [[RUNNING], [DONE]], 0, 2.0, MET.format("a")),
    ("wait a --for=condition=complete=true", [[DONE]], 0, 0.0, MET.format("a")),
    ("wait a --for=condition=Complete --timeout=10s", [[RUNNING]], 1, 10.0, ""),
    (
        "wait a --for=jsonpath={.status.phase}=Failed",
        [[_job("a")], [_job("a")], [_job("a", "Failed")]],
        0,
        4.0,
        MET.format("a"),
    ),
    (
        "wait -l team=nlp --for=jsonpath={.status.phase}=Running",
        [[_job("a"), _job("b", "Queued")], [_job("a"), _job("b")]],
        0,
        2.0,
        MET.format("a") + MET.format("b"),
    ),
    ("wait a --for=delete", [[_job("a")], []], 0, 2.0, "fsdpjob.fsdpoperator.io/a deleted\n"),
    ("wait nope --for=condition=Complete", [[_job("a")]], 1, 0.0, ""),
    ("wait -l team=none --for=delete", [[]], 1, 0.0, ""),
]


@pytest.mark.parametrize(
    ("line", "polls", "code", "waited", "out"), WAITS, ids=[w[0] for w in WAITS]
)
def test_wait_for(
    line: str,
    polls: list[list[dict[str, Any]]],
    code: int,
    waited: float,
    out: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = FakeClock()
    assert _wait(line, Jobs(*polls), clock) == code
    assert clock.now == waited
    said = capsys.readouterr()
    assert said.out == out
    if code:
        assert said.err.startswith(("error: ", "Error from server (NotFound)")), said.err


def test_wait_timeout_names_the_job_as_kubectl_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        _wait("wait a --for=condition=Complete --timeout=3s", Jobs([_job("a")]), FakeClock()) == 1
    )
    assert capsys.readouterr().err == "error: timed out waiting for the condition on fsdpjobs/a\n"


# --- JSONPath as kubectl reads it ---------------------------------------------------------------
DOC = {
    "items": [
        {
            "metadata": {"name": "a", "labels": {"app.kubernetes.io/name": "llm"}},
            "status": {
                "conditions": [
                    {"type": "Complete", "status": "False"},
                    {"type": "Progressing", "status": "True"},
                ]
            },
        },
        {"metadata": {"name": "b"}, "status": {"phase": "Failed", "ok": False}},
    ]
}
TEMPLATES = [
    ("{.items[*].metadata.name}", "a b"),
    ("{.items[0].metadata.name}{'\\t'}{.items[-1].metadata.name}", "a\tb"),
    ("{.items[0:1].metadata.name}", "a"),
    ('{.items[0].status.conditions[?(@.type=="Progressing")].status}', "True"),
    ("{.items[0].metadata.labels.app\\.kubernetes\\.io/name}", "llm"),
    ("{.items[1].status.ok}", "false"),
    ("{.items[1].metadata}", '{"name":"b"}'),
    ("{.items[0].status.missing}", ""),
    ("{range .items[*]}[{.metadata.name}]{end}", "[a][b]"),
    ("{range .nothing[*]}x{end}done", "done"),
    (".items[1].status.phase", "Failed"),
]


@pytest.mark.parametrize(("template", "printed"), TEMPLATES)
def test_jsonpath_prints_as_kubectl(template: str, printed: str) -> None:
    assert jsonpath.render(template, DOC) == printed


def test_a_template_it_cannot_read_names_the_part() -> None:
    with pytest.raises(jsonpath.TemplateError, match="cannot read"):
        jsonpath.render("{.items[0}", DOC)
