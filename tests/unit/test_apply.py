"""apply(): the status goes out only when the pass changed it (no write, no self-woken pass)."""

from __future__ import annotations

import dataclasses
from typing import Any

from fsdp_operator.policy import decide as dc
from fsdp_operator.run import reconcile, settings
from tests import builders


class RecordingKube:
    """Stands in for kube.Kube: records the writes a pass makes."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.writes.append("status")

    def event(self, job: Any, **_: Any) -> None:
        self.writes.append("event")

    def create(self, body: dict[str, Any]) -> None:
        self.writes.append(f"create {body['kind']}")

    def delete_pod(self, namespace: str, name: str, **_: Any) -> None:
        self.writes.append("delete")


BODY = {"metadata": {"name": "job", "namespace": "ns", "uid": "u1"}}


def test_a_pass_that_changes_nothing_writes_nothing() -> None:
    kube = RecordingKube()
    reconciler = reconcile.Reconciler(kube, settings.Settings(metrics_port=0))  # type: ignore[arg-type]
    first = builders.observe()
    d = dc.decide(first)
    reconciler.apply(BODY, first, d)
    assert kube.writes == ["status", "event"]  # checkpoint 40 recorded, and said in an Event
    kube.writes.clear()
    steady = dataclasses.replace(first, status=d.status)
    again = dc.decide(steady)
    reconciler.apply(BODY, steady, again)
    assert kube.writes == []
