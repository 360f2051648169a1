"""The per-job loop in handlers.py: a job deleted and created again under the same name keeps a
loop, a failing pass backs off however many watch events arrive, and a loop asleep holds no
memory it does not need."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
import time
import weakref
from typing import Any

import pytest

from fsdp_operator import cache, handlers, reconcile
from fsdp_operator import spec as api


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(handlers, "_ctx", object())
    monkeypatch.setattr(handlers, "MIN_PAUSE", 0.01)
    monkeypatch.setattr(handlers, "ERROR_PAUSE", 0.3)
    monkeypatch.setattr(handlers.metrics, "forget", lambda *_: None)
    monkeypatch.setattr(handlers, "_prober", None)
    monkeypatch.setattr(handlers, "_elector", None)
    return seen


def test_a_new_job_of_the_same_name_during_the_last_pass_keeps_the_loop(
    passes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old job's pass finds it gone (None) while the new job's ADDED event arrives."""
    loop = asyncio.new_event_loop()
    results = iter([None, None])

    def run_pass(ctx: Any, namespace: str, name: str, view: Any) -> reconcile.Outcome | None:
        passes.append(name)
        if len(passes) == 1:  # the new job's event lands while the old job's pass runs
            loop.call_soon_threadsafe(handlers._poke, namespace, name)
        return next(results)

    monkeypatch.setattr(reconcile, "run_pass", run_pass)

    async def scenario() -> None:
        handlers._poke("ns", "train")
        while handlers._loops:
            await asyncio.sleep(0.01)

    loop.run_until_complete(asyncio.wait_for(scenario(), 5))
    loop.close()
    assert passes == ["train", "train"]  # a second pass, for the new job, not an orphan


def test_events_for_a_gone_job_are_paced_not_a_hot_loop(
    passes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pod events of a deleted job (its pods being collected) each earn a look, at most one a
    MIN_PAUSE, and the loop ends once they stop."""

    def run_pass(ctx: Any, namespace: str, name: str, view: Any) -> reconcile.Outcome | None:
        passes.append(name)
        time.sleep(0.005)  # a pass takes a while: pod events land during it
        return None  # the job is gone

    monkeypatch.setattr(reconcile, "run_pass", run_pass)
    monkeypatch.setattr(handlers, "MIN_PAUSE", 0.05)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        handlers._poke("ns", "gone")
        until = loop.time() + 0.2
        pod = {"metadata": {"ownerReferences": [{"kind": api.KIND, "name": "gone"}]}}
        while loop.time() < until:
            await handlers.pod_event(body=pod, namespace="ns")
            await asyncio.sleep(0.001)
        while handlers._loops:
            await asyncio.sleep(0.01)

    asyncio.run(asyncio.wait_for(scenario(), 5))
    # 0.2 s of events at MIN_PAUSE = 0.05 s: about 4 passes (unpaced: about 40), then it ends.
    assert 2 <= len(passes) <= 0.2 / handlers.MIN_PAUSE + 2


def test_a_failing_pass_backs_off_even_when_events_keep_coming(
    passes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def run_pass(ctx: Any, namespace: str, name: str, view: Any) -> reconcile.Outcome | None:
        passes.append(name)
        if len(passes) < 3:
            raise RuntimeError("namespace is being terminated")
        return None

    monkeypatch.setattr(reconcile, "run_pass", run_pass)

    async def scenario() -> float:
        started = asyncio.get_running_loop().time()
        handlers._poke("ns", "busy")
        while handlers._loops:
            if len(passes) < 3:
                handlers._poke("ns", "busy")  # a stream of pod events while the passes fail
            await asyncio.sleep(0.005)
        return asyncio.get_running_loop().time() - started

    elapsed = asyncio.run(asyncio.wait_for(scenario(), 5))
    # A poke that lands while the third (job-gone) pass runs earns one more look, no more.
    assert len(passes) in (3, 4)
    assert elapsed >= 2 * handlers.ERROR_PAUSE  # events did not cut the back-off short


def test_a_failed_pass_is_reported_as_the_servers_message_not_its_headers() -> None:
    from kubernetes.client.exceptions import ApiException

    from fsdp_operator import kube

    exc = ApiException(status=403, reason="Forbidden")
    exc.body = '{"message": "pods \\"x\\" is forbidden: namespace t is being terminated"}'
    exc.headers = {"Audit-Id": "changes-every-time"}
    said = kube.describe_error(exc)
    assert said == 'API error 403: pods "x" is forbidden: namespace t is being terminated'
    assert kube.describe_error(RuntimeError("boom")) == "RuntimeError: boom"


def test_a_sleeping_loop_holds_neither_its_view_nor_the_event_that_started_it(
    passes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 1,000 jobs each loop asleep kept its last view (every node's usage) and, through the
    context variables of the handler that started it, kopf's whole event: 40 KiB a job."""
    cause_var: contextvars.ContextVar[object] = contextvars.ContextVar("cause")
    held: list[weakref.ref[object]] = []

    class Event:  # stands for kopf's cause: the body, its patch, its logger
        pass

    def view(namespace: str, name: str) -> cache.View:
        made = cache.View(pods=[], nodes=[], used={"node-1": {"cpu": 1.0}})
        held.append(weakref.ref(made))
        return made

    def run_pass(ctx: Any, namespace: str, name: str, v: Any) -> reconcile.Outcome | None:
        passes.append(name)
        return reconcile.Outcome(delay=60.0)

    monkeypatch.setattr(handlers, "_view", view)
    monkeypatch.setattr(reconcile, "run_pass", run_pass)

    async def handler() -> None:  # as kopf runs an event handler: its cause in a context var
        event = Event()
        held.append(weakref.ref(event))
        cause_var.set(event)
        handlers._poke("ns", "train")

    async def scenario() -> None:
        await asyncio.get_running_loop().create_task(handler(), context=contextvars.Context())
        while not passes:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the loop is asleep until its next pass
        gc.collect()
        assert [ref() for ref in held] == [None, None]
        handlers._loops[("ns", "train")].cancel()

    loop = asyncio.new_event_loop()
    loop.run_until_complete(asyncio.wait_for(scenario(), 5))
    loop.close()


def test_views_share_one_node_list_until_a_node_changes_or_goes(
    passes: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def node(name: str, gpus: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "status": {"allocatable": {"nvidia.com/gpu": gpus},
                "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip

    monkeypatch.setattr(handlers, "_indices", {"fsdp_job_pods": {}})
    monkeypatch.setattr(handlers, "_nodes_seen", {})
    monkeypatch.setattr(handlers, "_node_list", None)

    def seen(name: str, gpus: str) -> None:  # a node's watch event: kopf runs the index function
        asyncio.run(handlers.fsdp_nodes(body=node(name, gpus), name=name))

    seen("n1", "8")
    seen("n2", "8")
    first = handlers._view("ns", "train").nodes
    assert handlers._view("ns", "other").nodes is first and len(first) == 2
    seen("n1", "8")  # a heartbeat: nothing a pass reads changed
    assert handlers._view("ns", "train").nodes is first
    seen("n1", "4")
    changed = handlers._view("ns", "train").nodes
    assert changed is not first and {n.allocatable["nvidia.com/gpu"] for n in changed} == {4, 8}
    asyncio.run(handlers.node_gone(name="n2"))
    assert [n.name for n in handlers._view("ns", "train").nodes] == ["n1"]


def test_no_handler_needs_the_diff_base_the_operator_does_not_build() -> None:
    """NoDiffBase makes kopf skip its per-event deep copies. It is only right while nothing
    reacts to changes: an on.create/on.update/on.resume/on.delete handler or a daemon
    would never see one (and the job would get kopf's finalizer)."""
    import kopf

    registry = kopf.get_default_registry()
    assert not list(registry._changing.get_all_handlers())
    assert not list(registry._spawning.get_all_handlers())
    assert list(registry._watching.get_all_handlers())  # the check does see handlers.py's own


def test_kopf_finds_no_change_and_copies_no_body_with_no_diff_base(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf's own cause detection, with the operator's settings, on a pod's update."""
    import copy

    import kopf
    from kopf._core.reactor import processing

    settings = kopf.OperatorSettings()
    settings.persistence.diffbase_storage = handlers.NoDiffBase()
    copies: list[int] = []
    real = copy.deepcopy
    monkeypatch.setattr(copy, "deepcopy", lambda x, *a: copies.append(1) or real(x, *a))
    body = kopf.Body({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "uid": "u"},
                      "spec": {"containers": [{"name": "c"}]}, "status": {}})  # fmt: skip

    async def detect() -> Any:  # kopf's per-object memory wants a running loop
        return processing._detect_causes(
            indexers=processing.indexing.OperatorIndexers(), registry=kopf.get_default_registry(),
            settings=settings, resource=kopf.Resource("", "v1", "pods"),
            raw_event={"type": "MODIFIED", "object": dict(body)}, body=body, patch=kopf.Patch(),
            memory=processing.inventory.ResourceMemory(), local_logger=logging.getLogger("t"),
            event_logger=logging.getLogger("t"),
        )  # fmt: skip

    causes = asyncio.run(detect())
    assert copies == []
    assert causes.changing_cause is None
