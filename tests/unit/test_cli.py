"""fsdpctl renders what the cluster says as text: a worker's message is never rich markup."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import tomllib
import types
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from rich.console import Console

from fsdp_operator import cli
from fsdp_operator.types import api, status
from tests import fakeapi

GLOO = (
    "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Read error [10.0.0.2]:29500:"
    " Connection reset by peer"
)


class Answers:
    """Stands in for the two API objects describe() reads (their raw `.data` is all it uses)."""

    def __init__(self, job: dict[str, Any], events: list[dict[str, Any]]) -> None:
        self.job, self.events = job, events

    def get_namespaced_custom_object(self, *_: Any, **__: Any) -> Any:
        return types.SimpleNamespace(data=json.dumps(self.job))

    def list_namespaced_event(self, *_: Any, **__: Any) -> Any:
        return types.SimpleNamespace(data=json.dumps({"items": self.events}))


def test_describe_shows_a_workers_bracketed_message_as_it_is() -> None:
    job = {
        "metadata": {"name": "tiny", "namespace": "demo"},
        "status": {
            "phase": "Restarting",
            "attempt": 2,
            "lastFailure": {"cause": "Crash", "rank": 1, "message": GLOO},
            "history": [{"attempt": 1, "cause": "Crash", "worldSize": 4}],
        },
    }
    events = [
        {
            "firstTimestamp": "2026-12-02T07:00:00Z",
            "type": "Warning",
            "reason": "[bold]Crash",
            "message": GLOO,
        }
    ]
    answers = Answers(job, events)
    out = io.StringIO()
    console = Console(file=out, width=400, color_system=None)
    cli.describe(answers, answers, "demo", "tiny", console)
    text = out.getvalue()
    assert text.count("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547]") == 2
    assert "[bold]Crash" in text  # shown as written, not taken for a style


def test_describe_says_what_the_attempt_loads_even_when_its_pods_choose() -> None:
    job = {
        "metadata": {"name": "tiny", "namespace": "demo"},
        "status": {
            "phase": "Running",
            "attempt": 3,
            "resumePath": "auto",
            "sealedStep": 40,
            "lastCheckpoint": {"step": 40, "path": "/ckpt/tiny/step-40"},
        },
    }
    answers = Answers(job, [])
    out = io.StringIO()
    cli.describe(answers, answers, "demo", "tiny", Console(file=out, width=400, color_system=None))
    assert (
        "checkpoints: newest sealed step 40 (/ckpt/tiny/step-40); attempt 3 loads the checkpoint"
        " its pods choose (the operator cannot read them)"
    ) in out.getvalue()
    assert "done=-  eta=-" in out.getvalue()  # no step reported yet


def test_describe_says_how_far_the_job_is_and_when_it_should_finish() -> None:
    job = {
        "metadata": {"name": "tiny", "namespace": "demo"},
        "status": {
            "phase": "Running",
            "attempt": 2,
            "step": 650,
            "progress": {"percent": 65.0, "estimatedSecondsRemaining": 3725},
        },
    }
    answers = Answers(job, [])
    out = io.StringIO()
    cli.describe(answers, answers, "demo", "tiny", Console(file=out, width=400, color_system=None))
    assert "step=650  done=65.0%  eta=1h02m" in out.getvalue()


class Evidence:
    """Stands in for the API objects why() and logs() read: the job, and its kept ConfigMaps
    (a name it does not hold answers 404, like a ConfigMap the operator has pruned)."""

    def __init__(self, job: dict[str, Any] | None, configmaps: dict[str, dict[str, str]]) -> None:
        self.job, self.configmaps = job, configmaps
        self.read: list[str] = []

    def get_namespaced_custom_object(self, *_: Any, **__: Any) -> Any:
        if self.job is None:
            raise ApiException(status=404, reason="Not Found")
        return types.SimpleNamespace(data=json.dumps(self.job))

    def read_namespaced_config_map(self, name: str, namespace: str, **__: Any) -> Any:
        self.read.append(name)
        if name not in self.configmaps:
            raise ApiException(status=404, reason="Not Found")
        return types.SimpleNamespace(data=json.dumps({"data": self.configmaps[name]}))


def _failure(cause: str, rank: int, attempt: int, **extra: Any) -> dict[str, Any]:
    return {
        "cause": cause,
        "rank": rank,
        "pod": f"tiny-a{attempt}-{rank}",
        "node": "gpu-7",
        "exitCode": 137,
        "step": 120,
        "message": GLOO,
        "phase": None,
        "diagnosis": "",
        "evidence": "",
        "evidenceRef": f"tiny-a{attempt}-why",
        "time": 1.0,
        **extra,
    }


def _job(history: list[Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "tiny", "namespace": "demo"},
        "spec": {"nprocPerNode": 2},
        "status": {"phase": "Running", "history": history},
    }


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=400, color_system=None), out


def test_why_lists_failed_attempts_oldest_first_and_skips_a_resize() -> None:
    oom = _failure(
        "OOMKilled",
        1,
        1,
        phase="backward of block 7",
        diagnosis="OOM in backward [try activation checkpointing]",
        evidence="rank 3 at step 120 in backward; others in all_reduce",
    )
    history = [
        {"attempt": 1, "cause": "OOMKilled", "failure": oom},
        {"attempt": 2, "cause": "Resize", "failure": None},
        {"attempt": 3, "cause": "Crash", "failure": _failure("Crash", 0, 3)},
        {"attempt": 4, "cause": None},
    ]
    console, out = _console()
    assert cli.why(Evidence(_job(history), {}), "demo", "tiny", console) == 0
    text = out.getvalue()
    assert "attempt 2" not in text and "attempt 4" not in text
    assert text.index("attempt 1: OOMKilled at step 120") < text.index("attempt 3: Crash")
    assert "first failing pod: tiny-a1-1 (node rank 1, node gpu-7) exit code 137" in text
    assert "phase: backward of block 7" in text
    assert "diagnosis: OOM in backward [try activation checkpointing]" in text
    assert "evidence: rank 3 at step 120 in backward; others in all_reduce" in text
    assert text.count(GLOO) == 2  # a worker's message is shown as written
    assert "configmap/tiny-a1-why in demo" in text
    assert "fsdpctl -n demo logs tiny --attempt 1 --rank 2" in text  # pod 1 runs ranks 2-3
    assert "fsdpctl -n demo logs tiny --attempt 3 --rank 0" in text


def test_why_says_so_when_the_job_never_failed() -> None:
    history = [{"attempt": 1, "cause": "Suspended"}, {"attempt": 2, "cause": None}]
    console, out = _console()
    assert cli.why(Evidence(_job(history), {}), "demo", "tiny", console) == 0
    assert out.getvalue().strip() == "demo/tiny has not failed"


def test_why_for_a_job_that_does_not_exist_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    console, out = _console()
    assert cli.why(Evidence(None, {}), "demo", "tiny", console) == 1
    assert "no FSDPJob tiny in namespace demo" in capsys.readouterr().err
    assert out.getvalue() == ""


def _evidence_configmap() -> dict[str, str]:
    failure = {**_failure("Crash", 1, 3), "nprocPerNode": 2, "firstPod": 1}
    return {
        "failure.json": json.dumps(failure),
        "summary.txt": "rank 3 raised first",
        "ranks.json": json.dumps([{"rank": r, "pod": r // 2, "evidence": False} for r in range(4)]),
        "log-0.txt": "pod zero [rank 0] waiting in all_reduce\n",
        "log-1.txt": f"pod one {GLOO}\n",
    }


def test_logs_for_a_rank_prints_its_pods_log_and_marks_the_first_error() -> None:
    history = [
        {"attempt": 1, "cause": "Crash", "failure": _failure("Crash", 0, 1)},
        {"attempt": 3, "cause": "Crash", "failure": _failure("Crash", 1, 3)},
    ]
    answers = Evidence(_job(history), {"tiny-a3-why": _evidence_configmap()})
    console, out = _console()
    assert cli.logs(answers, answers, "demo", "tiny", None, 3, console) == 0
    assert answers.read == ["tiny-a3-why"]  # the newest attempt with evidence
    text = out.getvalue()
    assert "attempt 3, pod 1 (ranks 2-3), tiny-a3-1, first error of the gang" in text
    assert f"pod one {GLOO}" in text
    assert "pod zero" not in text


def test_logs_without_a_rank_prints_every_pod_in_order() -> None:
    answers = Evidence(_job([]), {"tiny-a3-why": _evidence_configmap()})
    console, out = _console()
    assert cli.logs(answers, answers, "demo", "tiny", 3, None, console) == 0
    text = out.getvalue()
    assert "attempt 3, pod 0 (ranks 0-1)\n" in text  # not the failing pod: no name, no mark
    assert "[rank 0]" in text
    assert text.index("pod zero") < text.index("attempt 3, pod 1 (ranks 2-3)") < text.index(GLOO)


def test_logs_for_a_pruned_attempt_says_no_evidence_is_kept(
    capsys: pytest.CaptureFixture[str],
) -> None:
    history = [{"attempt": 1, "cause": "Crash", "failure": _failure("Crash", 0, 1)}]
    answers = Evidence(_job(history), {})
    console, _ = _console()
    assert cli.logs(answers, answers, "demo", "tiny", 1, 0, console) == 1
    assert (
        "no evidence kept for attempt 1 of tiny (the operator keeps the newest 5 failed attempts)"
        in capsys.readouterr().err
    )


def test_logs_for_a_rank_out_of_range_says_which_ranks_exist(
    capsys: pytest.CaptureFixture[str],
) -> None:
    answers = Evidence(_job([]), {"tiny-a3-why": _evidence_configmap()})
    console, out = _console()
    assert cli.logs(answers, answers, "demo", "tiny", 3, 4, console) == 2
    assert "ranks kept: 0-1, 2-3" in capsys.readouterr().err
    assert out.getvalue() == ""


# --- 80 columns, and the command line a kubectl user expects ------------------------------------
def _at(seconds: float) -> str:
    """A status time (RFC 3339, as the operator writes them), `seconds` after a fixed start."""
    return status.rfc3339(1_796_283_000 + seconds)


def _busy_job() -> dict[str, Any]:
    tl = {
        "launched": _at(1),
        "scheduled": _at(2),
        "running": _at(3),
        "rendezvous": _at(5),
        "loaded": _at(6),
        "firstStep": _at(7),
    }
    later = {
        "cause": "NodeLost",
        "failed": _at(10),
        "detected": _at(12),
        "gangGone": _at(12.5),
        **tl,
    }
    return {
        "metadata": {
            "name": "a-very-long-training-job-name-for-llama",
            "namespace": "team-research-prod",
        },
        "status": {
            "phase": "Restarting",
            "attempt": 2,
            "step": 120,
            "reason": "CircuitBreaker",
            "restarts": {"total": 12, "application": 9, "infrastructure": 3},
            "history": [
                {
                    "attempt": 1,
                    "cause": "NodeLost",
                    "worldSize": 64,
                    "detectSeconds": 52.3,
                    "recoverSeconds": 14.2,
                    "stepsLost": 113,
                    "timeline": tl,
                },
                {"attempt": 2, "worldSize": 64, "resumedFromStep": 1000, "timeline": later},
            ],
        },
    }


def _headers_intact(text: str, headers: tuple[str, ...]) -> None:
    assert "…" not in text, text
    for header in headers:
        assert header in text, f"{header!r} missing:\n{text}"


def test_tables_stay_readable_in_80_columns() -> None:
    job = _busy_job()
    answers = Answers(
        job,
        [
            {
                "firstTimestamp": "2026-12-02T07:00:00Z",
                "type": "Warning",
                "reason": "FailureDetected",
                "message": GLOO,
            }
        ],
    )
    out = io.StringIO()
    cli.describe(answers, answers, "demo", "x", Console(file=out, width=80, color_system=None))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    _headers_intact(
        text,
        (
            "attempt",
            "resumed from",
            "ended by",
            "steps lost",
            "after",
            "detect",
            "down",
            "sched",
            "rdzv",
            "step1",
            "total",
            "NodeLost",
            "message",
        ),
    )

    class Listing:
        def list_cluster_custom_object(self, *_: Any, **__: Any) -> Any:
            return types.SimpleNamespace(data=json.dumps({"items": [job]}))

    out = io.StringIO()
    cli.list_jobs(Listing(), None, Console(file=out, width=80, color_system=None))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    _headers_intact(
        text,
        (
            "namespace",
            "name",
            "phase",
            "world",
            "step",
            "ckpt",
            "restarts",
            "reason",
            "12 (9/3)",
            "Restarting",
        ),
    )


def test_the_namespace_defaults_to_the_kubeconfig_contexts(tmp_path: Any) -> None:
    config = tmp_path / "config"
    cluster = {"server": "https://127.0.0.1:1"}
    config.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "a",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [
                    {"name": "a", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}},
                    {"name": "b", "context": {"cluster": "c", "user": "u"}},
                ],
            }
        )
    )
    assert cli._context_namespace(str(config), None) == "team-a"
    assert cli._context_namespace(str(config), "b") == "default"
    assert cli._context_namespace(str(tmp_path / "none"), None) == "default"


def test_a_refusal_is_one_line_that_names_the_missing_permission(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    message = (
        'fsdpjobs.fsdpoperator.io is forbidden: User "dev" cannot list resource "fsdpjobs" '
        'in API group "fsdpoperator.io" in the namespace "prod"'
    )
    refused = ApiException(status=403, reason="Forbidden")
    refused.body = json.dumps({"kind": "Status", "message": message})

    def run(_: Any) -> int:
        raise refused

    monkeypatch.setattr(cli, "_run", run)
    assert cli.main(["-n", "prod", "list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fsdpctl: forbidden: {message}")

    def unreachable(_: Any) -> int:
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(cli, "_run", unreachable)
    assert cli.main(["why", "tiny"], prog="kubectl fsdp") == 1
    err = capsys.readouterr().err
    assert err.startswith("kubectl fsdp: cannot reach the API server:") and "Traceback" not in err


def test_version_and_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["version"]) == 0
    assert "fsdpoperator.io/" in capsys.readouterr().out
    job = _busy_job()
    cli._dump({"items": [job]}, "json")
    assert json.loads(capsys.readouterr().out)["items"][0] == job


class _Listing:
    def __init__(self, *jobs: dict[str, Any]) -> None:
        self.items = list(jobs)

    def list_cluster_custom_object(self, *_: Any, **__: Any) -> Any:
        return types.SimpleNamespace(data=json.dumps({"items": self.items}))


def test_wide_listing_adds_attempt_goodput_progress_age_and_the_last_failure() -> None:
    job = _busy_job()
    job["status"].update(
        goodput={"since": _at(1), "fraction": 0.874},
        progress={"percent": 65.0, "estimatedSecondsRemaining": 700},
        lastFailure={"cause": "OOMKilled", "rank": 3, "node": "gpu-node-7", "time": _at(9)},
        started=status.rfc3339(time.time() - 3725),  # RFC 3339, as the status says it
        lastCheckpoint={"step": 1000, "worldSize": 64, "time": status.rfc3339(time.time() - 95)},
    )
    out = io.StringIO()
    cli.list_jobs(_Listing(job), None, Console(file=out, width=200, color_system=None), wide=True)
    text = out.getvalue()
    _headers_intact(text, ("attempt", "goodput", "done", "eta", "age", "last failure", "87%"))
    assert "65.0%" in text and "11m40s" in text
    assert "1h02m" in text and "1000 (1m35s)" in text  # ages from RFC 3339 times
    assert "OOMKilled pod 3 (gpu-node-7)" in text
    out = io.StringIO()
    cli.list_jobs(_Listing(job), None, Console(file=out, width=200, color_system=None))
    assert "goodput" not in out.getvalue() and "OOMKilled" not in out.getvalue()


OUTPUTS = {"table", "wide", "json", "yaml", "name", "jsonpath=", "custom-columns="}
"""What `-o` offers, as kubectl users know the formats."""


def _complete(line: str, tmp_path: Path, **env: str) -> list[str]:
    """What the shell would offer for `line` (argcomplete's protocol, as bash runs it)."""
    answer = tmp_path / "completions"
    done = subprocess.run(
        [sys.executable, "-m", "fsdp_operator.cli"],
        env={
            **os.environ,
            "_ARGCOMPLETE": "1",
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
            "_ARGCOMPLETE_IFS": "\n",
            "_ARGCOMPLETE_STDOUT_FILENAME": str(answer),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return answer.read_text().split()


def test_the_shell_completes_commands_flags_and_outputs(tmp_path: Path) -> None:
    assert _complete("fsdpctl de", tmp_path) == ["describe", "delete"]
    assert set(_complete("fsdpctl ", tmp_path)) >= {"list", "describe", "why", "logs", "completion"}
    assert set(_complete("fsdpctl list -o ", tmp_path)) == OUTPUTS
    assert "--attempt" in _complete("fsdpctl logs x --", tmp_path)
    # job names come from the cluster; with none to ask, none (and no traceback)
    nowhere = tmp_path / "kubeconfig"
    nowhere.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    offered = _complete("fsdpctl why ", tmp_path, KUBECONFIG=str(nowhere))
    assert [c for c in offered if not c.startswith("-")] == []


def test_the_shell_completes_job_names_from_the_namespace(
    fake_api: fakeapi.FakeAPI, tmp_path: Path
) -> None:
    jobs = [
        {"metadata": {"name": n, "namespace": "team"}} for n in ("train-7b", "train-1b", "eval")
    ]
    fake_api[f"get /apis/{api.GROUP}/{api.VERSION}/namespaces/team/{api.PLURAL}"] << {"items": jobs}
    kubeconfig = fake_api.kubeconfig(tmp_path / "kubeconfig")
    line = f"fsdpctl --kubeconfig {kubeconfig} -n team describe tr"
    assert sorted(_complete(line, tmp_path)) == ["train-1b", "train-7b"]


def _kubectl_complete(*words: str) -> list[str]:
    """What `kubectl fsdp WORDS<TAB>` offers: kubectl runs `kubectl_complete-fsdp WORDS` from
    PATH (its plugin completion protocol) and reads one candidate a line, then `:directive`."""
    program = Path(sys.executable).parent / "kubectl_complete-fsdp"  # installed with fsdpctl
    done = subprocess.run([program, *words], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    *offered, directive = done.stdout.splitlines()
    assert directive == ":4"  # cobra's ShellCompDirectiveNoFileComp: no file names
    return offered


def test_kubectl_completes_the_plugin_through_its_completion_executable(
    fake_api: fakeapi.FakeAPI, tmp_path: Path
) -> None:
    assert _kubectl_complete("des") == ["describe"]
    assert set(_kubectl_complete("list", "-o", "")) == OUTPUTS
    jobs = [{"metadata": {"name": n, "namespace": "team"}} for n in ("train-7b", "eval")]
    fake_api[f"get /apis/{api.GROUP}/{api.VERSION}/namespaces/team/{api.PLURAL}"] << {"items": jobs}
    kubeconfig = fake_api.kubeconfig(tmp_path / "kubeconfig")
    offered = _kubectl_complete("--kubeconfig", str(kubeconfig), "-n", "team", "why", "")
    assert [c for c in offered if not c.startswith("-")] == ["train-7b", "eval"]


def test_completion_prints_the_shells_registration(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["completion", "bash"]) == 0
    code = capsys.readouterr().out
    assert "complete " in code and "fsdpctl" in code


def test_fsdpctl_runs_without_the_operators_own_dependencies() -> None:
    """The `cli` extra (kubernetes, rich, argcomplete, prometheus-client) is enough: kopf and
    torch (and aiohttp, which only the operator's scraper imports) are never imported."""
    blocker = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('kopf', 'aiohttp', 'torch', 'numpy'):\n"
        "            raise ImportError(f'{name} is not in the cli extra')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from fsdp_operator import cli\n"
        "sys.exit(cli.main(['version']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("fsdpctl ")


def test_the_cli_extra_is_part_of_the_operators() -> None:
    """The operator image installs `operator`; fsdpctl in it needs all of `cli`."""
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert set(extras["cli"]) <= set(extras["operator"])
    assert not any(d.startswith(("kopf", "aiohttp", "torch")) for d in extras["cli"])
