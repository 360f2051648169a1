"""fsdpctl renders what the cluster says as text: a worker's message is never rich markup."""

from __future__ import annotations

import io
import json
import types
from typing import Any

from rich.console import Console

from fsdp_operator import cli

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
