"""The per-job loops (loops.py) as the manager drives them: a job deleted and created again
under the same name keeps a loop, a failing pass backs off 1 s, 2 s, 4 s ... however many watch
events arrive and starts over after a success, and a loop asleep holds no memory it does not
need. Everything runs on a real event loop with a fake reconciler: no module state is patched."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import kopf
import prometheus_client
import pytest

from fsdp_operator.io import cache, observe
from fsdp_operator.run import handlers, loops, manager, reconcile, settings
from fsdp_operator.types import api

PassFn = Callable[[str, str, cache.View], "reconcile.Outcome | None"]


class FakeReconciler:
    """Stands in for reconcile.Reconciler: runs `fn` as the pass and records every call."""

    def __init__(self, fn: PassFn) -> None:
        self.fn = fn
        self.passes: list[str] = []
        self.forgotten: list[tuple[str, str]] = []

    def run_pass(self, namespace: str, name: str, view: cache.View) -> reconcile.Outcome | None:
        self.passes.append(name)
        return self.fn(namespace, name, view)

    def is_echo(self, namespace: str, name: str, version: str | None) -> bool:
        return False

    def forget(self, namespace: str, name: str) -> None:
        self.forgotten.append((namespace, name))

    def close(self) -> None:
        pass


def make(fn: PassFn, **overrides: Any) -> tuple[manager.Manager, FakeReconciler]:
    fake = FakeReconciler(fn)
    conf = settings.Settings(
        metrics_port=0,
        min_pause_seconds=0.01,
        error_backoff_initial_seconds=0.1,
        error_backoff_max_seconds=0.4,
        **overrides,
    )
    return manager.Manager(fake, config=conf), fake


async def until_no_loops(made: manager.Manager) -> None:
    while len(made.loops):
        await asyncio.sleep(0.01)


def test_a_new_job_of_the_same_name_during_the_last_pass_keeps_the_loop() -> None:
    """The old job's pass finds it gone (None) while the new job's ADDED event arrives."""
    loop = asyncio.new_event_loop()

    def run_pass(namespace: str, name: str, view: cache.View) -> reconcile.Outcome | None:
        if len(fake.passes) == 1:  # the new job's event lands while the old job's pass runs
            loop.call_soon_threadsafe(made.job_event, namespace, name, type_="ADDED", version="")
        return None

    made, fake = make(run_pass)

    async def scenario() -> None:
        made.job_event("ns", "train", type_="ADDED", version="1")
        await until_no_loops(made)

    loop.run_until_complete(asyncio.wait_for(scenario(), 5))
    loop.close()
    assert fake.passes == ["train", "train"]  # a second pass, for the new job, not an orphan
    assert fake.forgotten == [("ns", "train")]  # once, when the last loop ended


def test_events_for_a_gone_job_are_paced_not_a_hot_loop() -> None:
    """Pod events of a deleted job (its pods being collected) each earn a look, at most one a
    min_pause, and the loop ends once they stop."""

    evented = threading.Event()

    def run_pass(namespace: str, name: str, view: cache.View) -> reconcile.Outcome | None:
        evented.clear()
        evented.wait(1.0)  # a pass takes a while: pod events land during it (while they come)
        return None  # the job is gone

    made, fake = make(run_pass)
    made.loops.min_pause = 0.05

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        made.job_event("ns", "gone", type_="DELETED", version="")
        until = loop.time() + 0.2
        owner = [{"kind": api.KIND, "name": "gone"}]
        while loop.time() < until:
            made.pod_event("ns", owner)
            evented.set()
            await asyncio.sleep(0.001)
        await until_no_loops(made)

    asyncio.run(asyncio.wait_for(scenario(), 5))
    # 0.2 s of events at min_pause = 0.05 s: about 4 passes (unpaced: about 40), then it ends.
    assert 2 <= len(fake.passes) <= 0.2 / 0.05 + 2


def test_a_failing_pass_backs_off_1_2_4_to_a_bound_and_starts_over_after_a_success() -> None:
    """Passes fail 4 times, succeed, then fail twice: the waits between them are 0.1, 0.2,
    0.4, 0.4 (the bound), then after the success 0.1 and 0.2 again; pod events all along do
    not cut a wait short."""
    script = ["fail", "fail", "fail", "fail", "ok", "fail", "fail", "gone"]
    started: list[float] = []

    def run_pass(namespace: str, name: str, view: cache.View) -> reconcile.Outcome | None:
        started.append(time.monotonic())
        # a pod event that lands during the "gone" pass earns one more look: gone again
        step = script[min(len(started), len(script)) - 1]
        if step == "fail":
            raise RuntimeError("namespace is being terminated")
        return reconcile.Outcome(delay=0.0) if step == "ok" else None

    class RecordingBackoff(loops.Backoff):
        def failed(self, key: tuple[str, str]) -> float:
            waits.append(super().failed(key))
            return waits[-1]

    waits: list[float] = []
    made, fake = make(run_pass)
    made.loops.backoff = RecordingBackoff(initial=0.1, maximum=0.4)

    async def scenario() -> None:
        made.job_event("ns", "busy", type_="ADDED", version="1")
        owner = [{"kind": api.KIND, "name": "busy"}]
        while len(made.loops):
            if len(started) < len(script):  # a stream of pod events while the passes fail
                made.pod_event("ns", owner)
            await asyncio.sleep(0.005)

    logging.getLogger("fsdp_operator.run.loops").disabled = True  # the expected tracebacks
    try:
        asyncio.run(asyncio.wait_for(scenario(), 10))
    finally:
        logging.getLogger("fsdp_operator.run.loops").disabled = False
    assert waits == [0.1, 0.2, 0.4, 0.4, 0.1, 0.2]  # to the bound; over again after a success
    gaps = [b - a for a, b in itertools.pairwise(started)]
    expected = [0.1, 0.2, 0.4, 0.4, 0.01, 0.1, 0.2]
    assert len(expected) <= len(gaps) <= len(expected) + 1, gaps
    for gap, want in zip(gaps, expected, strict=False):
        assert gap >= want * 0.9, (gaps, expected)  # events never cut a wait short


@pytest.mark.parametrize(
    ("initial", "maximum", "failures", "waits"),
    [
        pytest.param(1.0, 300.0, 10, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300], id="defaults"),
        pytest.param(1.0, 1.0, 3, [1, 1, 1], id="flat"),
        pytest.param(0.5, 3.0, 5, [0.5, 1, 2, 3, 3], id="bound-between-doublings"),
    ],
)
def test_backoff_doubles_to_its_bound(
    initial: float, maximum: float, failures: int, waits: list[float]
) -> None:
    backoff = loops.Backoff(initial=initial, maximum=maximum)
    assert [backoff.failed(("ns", "a")) for _ in range(failures)] == waits
    assert backoff.failed(("ns", "b")) == initial  # per job
    backoff.succeeded(("ns", "a"))
    assert backoff.failed(("ns", "a")) == initial


def test_a_backoff_that_cannot_work_is_refused_naming_both_values() -> None:
    with pytest.raises(ValueError, match=r"initial \(10.0\) <= maximum \(1.0\)"):
        loops.Backoff(initial=10.0, maximum=1.0)


def test_a_sleeping_loop_holds_neither_its_view_nor_the_event_that_started_it() -> None:
    """At 1,000 jobs each loop asleep kept its last view (every node's usage) and, through the
    context variables of the handler that started it, kopf's whole event: 40 KiB a job."""
    cause_var: contextvars.ContextVar[object] = contextvars.ContextVar("cause")
    held: list[weakref.ref[object]] = []

    class Event:  # stands for kopf's cause: the body, its patch, its logger
        pass

    def run_pass(namespace: str, name: str, view: cache.View) -> reconcile.Outcome | None:
        held.append(weakref.ref(view))
        return reconcile.Outcome(delay=60.0)

    made, fake = make(run_pass)
    made.store.usage.put("pod-uid", ("node-1", {"cpu": 1.0}))

    async def handler() -> None:  # as kopf runs an event handler: its cause in a context var
        event = Event()
        held.append(weakref.ref(event))
        cause_var.set(event)
        made.job_event("ns", "train", type_="ADDED", version="1")

    async def scenario() -> None:
        await asyncio.get_running_loop().create_task(handler(), context=contextvars.Context())
        while not fake.passes:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the loop is asleep until its next pass
        gc.collect()
        assert len(held) == 2 and [ref() for ref in held] == [None, None]
        await made.loops.stop()

    loop = asyncio.new_event_loop()
    loop.run_until_complete(asyncio.wait_for(scenario(), 5))
    loop.close()


def node(name: str, gpus: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {
            "allocatable": {"nvidia.com/gpu": gpus},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_views_share_one_node_list_until_a_node_changes_or_goes() -> None:
    made, _ = make(lambda *_: None)
    memo = kopf.Memo(manager=made)

    def seen(name: str, gpus: str) -> None:  # a node's watch event: kopf runs the index function
        asyncio.run(handlers.fsdp_nodes(body=node(name, gpus), memo=memo))

    seen("n1", "8")
    seen("n2", "8")
    first = made.store.view("ns", "train").nodes
    assert made.store.view("ns", "other").nodes is first and len(first) == 2
    seen("n1", "8")  # a heartbeat: nothing a pass reads changed
    assert made.store.view("ns", "train").nodes is first
    seen("n1", "4")
    changed = made.store.view("ns", "train").nodes
    assert changed is not first and {n.allocatable["nvidia.com/gpu"] for n in changed} == {4, 8}
    asyncio.run(handlers.node_gone(name="n2", memo=memo))
    assert [n.name for n in made.store.view("ns", "train").nodes] == ["n1"]


def test_a_node_change_wakes_the_jobs_on_it_and_those_waiting_for_room_only() -> None:
    woken: list[str] = []

    def run_pass(namespace: str, name: str, view: cache.View) -> reconcile.Outcome | None:
        woken.append(name)
        return reconcile.Outcome(delay=60.0, wants_nodes=name == "waiting")

    made, _ = make(run_pass)
    pod = {
        "spec": {"nodeName": "n1"},
        "metadata": {"ownerReferences": [{"kind": api.KIND, "name": "on-n1"}]},
    }
    made.store.pods = {cache.job_key("ns", "on-n1"): [pod]}

    async def scenario() -> None:
        for job in ("on-n1", "waiting", "elsewhere"):
            made.job_event("ns", job, type_="ADDED", version="1")
        while len(woken) < 3:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        woken.clear()
        made.node_seen(observe.node_record(node("n1", "8")))  # first sighting: nobody
        made.node_seen(observe.node_record(node("n1", "8")))  # a heartbeat: nobody
        await asyncio.sleep(0.1)
        assert woken == []
        made.node_seen(observe.node_record(node("n1", "4")))
        while len(woken) < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        await made.loops.stop()

    asyncio.run(asyncio.wait_for(scenario(), 5))
    assert sorted(woken) == ["on-n1", "waiting"]


def test_a_node_lost_by_its_lease_wakes_the_jobs_on_it_and_its_return_those_waiting() -> None:
    woken: list[str] = []
    seen: list[Mapping[str, float]] = []

    def run_pass(namespace: str, name: str, view: cache.View) -> reconcile.Outcome | None:
        woken.append(name)
        seen.append(view.lease_lost)
        return reconcile.Outcome(delay=60.0, wants_nodes=name == "waiting")

    made, _ = make(run_pass)
    pod = {
        "spec": {"nodeName": "n1"},
        "metadata": {"ownerReferences": [{"kind": api.KIND, "name": "on-n1"}]},
    }
    made.store.pods = {cache.job_key("ns", "on-n1"): [pod]}

    async def settled(count: int) -> None:
        while len(woken) < count:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)

    async def scenario() -> None:
        for job in ("on-n1", "waiting", "elsewhere"):
            made.job_event("ns", job, type_="ADDED", version="1")
        await settled(3)
        woken.clear()
        made.leases_read({}, healthy=True, quiet={"n1": 1.5})  # a renewal missed: scrape often
        await settled(1)
        assert woken == ["on-n1"] and seen[-1] == {}
        woken.clear()
        made.leases_read({"n1": 5.0}, healthy=True, quiet={"n1": 5.0})
        await settled(1)
        assert woken == ["on-n1"] and seen[-1] == {"n1": 5.0}
        made.leases_read({"n1": 5.5}, healthy=True)  # still lost: nobody
        await asyncio.sleep(0.1)
        assert woken == ["on-n1"]
        made.leases_read({}, healthy=True)  # it renews again: room for the job waiting
        await settled(2)
        await made.loops.stop()

    asyncio.run(asyncio.wait_for(scenario(), 5))
    assert woken == ["on-n1", "waiting"]  # (cleared once the node was quiet)
    assert prometheus_client.REGISTRY.get_sample_value("fsdpjob_operator_node_leases_healthy") == 1


def test_the_handlers_reach_the_manager_through_kopfs_memo_only() -> None:
    """A resource's memo is kopf's shallow copy of the operator's: the manager is shared."""
    import copy

    made, _ = make(lambda *_: None)
    memo = copy.copy(kopf.Memo(manager=made))
    pod = {
        "metadata": {"uid": "u1"},
        "spec": {"nodeName": "n1", "containers": [{"resources": {"requests": {"cpu": "2"}}}]},
        "status": {"phase": "Running"},
    }
    asyncio.run(handlers.fsdp_pod_usage(body=pod, memo=memo))
    assert made.store.usage.totals() == {"n1": {"cpu": 2.0}}
    asyncio.run(handlers.pod_gone(body=pod, memo=memo))
    assert made.store.usage.totals() == {}
    with pytest.raises(RuntimeError, match="no manager in kopf's memo"):
        asyncio.run(handlers.pod_gone(body=pod, memo=kopf.Memo()))


def test_a_failed_pass_is_reported_as_the_servers_message_not_its_headers() -> None:
    from kubernetes.client.exceptions import ApiException

    from fsdp_operator.io import kube

    exc = ApiException(status=403, reason="Forbidden")
    exc.body = '{"message": "pods \\"x\\" is forbidden: namespace t is being terminated"}'
    exc.headers = {"Audit-Id": "changes-every-time"}
    said = kube.describe_error(exc)
    assert said == 'API error 403: pods "x" is forbidden: namespace t is being terminated'
    assert kube.describe_error(RuntimeError("boom")) == "RuntimeError: boom"


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
    body = kopf.Body(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [{"name": "c"}]},
            "status": {},
        }
    )

    async def detect() -> Any:  # kopf's per-object memory wants a running loop
        return processing._detect_causes(
            indexers=processing.indexing.OperatorIndexers(),
            registry=kopf.get_default_registry(),
            settings=settings,
            resource=kopf.Resource("", "v1", "pods"),
            raw_event={"type": "MODIFIED", "object": dict(body)},
            body=body,
            patch=kopf.Patch(),
            memory=processing.inventory.ResourceMemory(),
            local_logger=logging.getLogger("t"),
            event_logger=logging.getLogger("t"),
        )

    causes = asyncio.run(detect())
    assert copies == []
    assert causes.changing_cause is None
