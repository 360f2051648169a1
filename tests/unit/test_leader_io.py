"""leader.Elector against a fake API server: the Lease requests a replica sends, and whether it
then leads (its on_started runs).

Time is the elector's injected clock, moved by the fake server's answers (a read "takes" a retry
period), so tries follow each other at once and nothing waits for real time; requests keep the
production timeouts (seconds), so a loaded machine cannot fail a try by slowness."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest

from fsdp_operator.io import leader
from tests import fakeapi

LEASES = "/apis/coordination.k8s.io/v1/namespaces/ns/leases"
LEASE = f"{LEASES}/fsdp-operator"
GET, PUT, POST = f"get {LEASE}", f"put {LEASE}", f"post {LEASES}"
EARLIER = "2020-01-01T00:00:00.250000Z"

TIMINGS = leader.Timings()  # client-go's: lease 15 s, renew deadline 10 s, retry 2 s
RETRY = TIMINGS.retry_seconds
ONE_TRY = leader.Timings(lease_seconds=120.0, renew_deadline_seconds=90.0, retry_seconds=60.0)
"""On the real clock: no second try within a test, so the requests after the first are the
release's."""

EARLIER_TIME = datetime.datetime.fromisoformat(EARLIER)
T = TypeVar("T")


def lease(holder: str, *, version: str = "7", transitions: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "fsdp-operator", "namespace": "ns", "resourceVersion": version},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 15,
            "acquireTime": EARLIER,
            "renewTime": EARLIER,
            "leaseTransitions": transitions,
        },
    }


class Clock:
    """The elector's monotonic clock; it moves only when an answer says time passed."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def passes(self, seconds: float, then: Any) -> Callable[[], Any]:
        """An answer that arrives `seconds` later (on this clock) than it was asked for."""

        def answer() -> Any:
            self.now += seconds
            return then

        return answer


class Replica:
    """One operator replica's elector, and what its callbacks were told."""

    def __init__(
        self, client: Any, *, timings: leader.Timings = TIMINGS, clock: Clock | None = None
    ) -> None:
        self.started = asyncio.Event()
        self.stopped: list[str] = []
        self.elector = leader.Elector(
            client,
            namespace="ns",
            name="fsdp-operator",
            identity="me",
            timings=timings,
            on_started=self.started.set,
            on_stopped=self.stopped.append,
            clock=clock or time.monotonic,
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self.elector.run())
        try:
            yield
        finally:
            await self.elector.release()  # no more tries after this
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def play(scenario: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(scenario(), 5)

    return asyncio.run(bounded())


def writes(api: fakeapi.FakeAPI) -> list[Any]:
    return [r for r in api.requests if r.method.value in ("POST", "PUT")]


def troubles(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the elector logged as going wrong (not its transitions)."""
    said = [record.getMessage() for record in caplog.records]
    return [line for line in said if line.startswith("leader election")]


# --- one try ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("on_read", "write", "leads", "warns"),
    [
        pytest.param(
            fakeapi.status(404, "not found"),
            (POST, fakeapi.CREATED),
            True,
            False,
            id="absent-lease-created",
        ),
        pytest.param(lease("me"), (PUT, fakeapi.echo), True, False, id="own-lease-renewed"),
        pytest.param(lease(""), (PUT, fakeapi.echo), True, False, id="released-lease-taken"),
        pytest.param(
            fakeapi.status(404, "not found"),
            (POST, fakeapi.status(409, "already exists")),
            False,
            False,
            id="409-another-replica-created-it-first",
        ),
        pytest.param(
            lease(""),
            (PUT, fakeapi.status(409, "the object has been modified")),
            False,
            False,
            id="409-another-replica-took-it-first",
        ),
        pytest.param(lease("other"), None, False, False, id="held-by-another"),
        pytest.param(
            fakeapi.status(500, "etcdserver: leader changed"), None, False, True, id="read-500"
        ),
        pytest.param(
            lease(""), (PUT, fakeapi.status(403, "forbidden")), False, True, id="write-403"
        ),
    ],
)
def test_one_try(
    fake_api: fakeapi.FakeAPI,
    api_client: Any,
    caplog: pytest.LogCaptureFixture,
    on_read: Any,
    write: tuple[str, Any] | None,
    leads: bool,
    warns: bool,
) -> None:
    """Whether a replica leads after one try, and that losing a race is no error."""
    clock = Clock()
    fake_api.answer(GET, clock.passes(RETRY, on_read))
    fake_api[GET][1:] << lease("other")  # from the second try on: another replica holds it
    if write is not None:
        fake_api.answer(*write)
    replica = Replica(api_client, clock=clock)

    async def first_try() -> bool:
        async with replica.running():
            await asyncio.to_thread(fake_api.wait, GET, 2)  # the first try is over
            return replica.started.is_set()

    with caplog.at_level(logging.WARNING, logger=leader.__name__):
        assert play(first_try) is leads
    second_read = [r.method.value for r in fake_api.requests].index("GET", 1)
    sent = [f"{r.method.value} {r.url.path}" for r in fake_api.requests[:second_read]]
    assert sent == [f"GET {LEASE}", *([as_sent(write[0])] if write else [])]
    assert bool(troubles(caplog)) is warns, caplog.text


def as_sent(criteria: str) -> str:
    method, path = criteria.split(" ", 1)
    return f"{method.upper()} {path}"


@pytest.mark.parametrize(
    ("on_read", "write", "expected"),
    [
        pytest.param(
            fakeapi.status(404, "not found"),
            POST,
            {"holderIdentity": "me", "leaseDurationSeconds": 15, "leaseTransitions": 0},
            id="create-absent",
        ),
        pytest.param(
            lease("me", version="7", transitions=2),
            PUT,
            {"holderIdentity": "me", "acquireTime": EARLIER_TIME, "leaseTransitions": 2},
            id="renew-keeps-acquire-time-and-transitions",
        ),
        pytest.param(
            lease("", version="7", transitions=2),
            PUT,
            {"holderIdentity": "me", "leaseTransitions": 3},
            id="take-counts-a-transition",
        ),
    ],
)
def test_what_a_winning_try_writes(
    fake_api: fakeapi.FakeAPI,
    api_client: Any,
    on_read: Any,
    write: str,
    expected: dict[str, Any],
) -> None:
    clock = Clock()
    fake_api.answer(GET, clock.passes(RETRY, on_read))
    fake_api[write] << (fakeapi.CREATED if write == POST else fakeapi.echo)
    replica = Replica(api_client, clock=clock)

    async def until_leading() -> None:
        async with replica.running():
            await replica.started.wait()

    fake_api[GET][1:] << lease("other")  # the release finds the lease taken: it sends nothing
    play(until_leading)
    [sent] = writes(fake_api)
    spec = {**sent.data["spec"]}
    for key in ("acquireTime", "renewTime"):  # the client writes its own RFC 3339 form
        spec[key] = datetime.datetime.fromisoformat(spec[key])
    assert {key: spec[key] for key in expected} == expected
    assert spec["renewTime"] > EARLIER_TIME
    if write == PUT:  # an update of what was read: a concurrent writer makes it a 409
        assert sent.data["metadata"]["resourceVersion"] == "7"


# --- expiry, on this replica's clock ------------------------------------------------------------
@pytest.mark.parametrize(
    ("elapsed", "takes"),
    [
        pytest.param(14.9, False, id="not-yet-expired"),
        pytest.param(15.0, True, id="expired-after-lease-seconds"),
    ],
)
def test_a_lease_that_is_not_renewed_is_taken_when_it_expires(
    fake_api: fakeapi.FakeAPI, api_client: Any, elapsed: float, takes: bool
) -> None:
    """Another holder's record unchanged for lease_seconds, as this replica measured it since it
    first read it (never the holder's wall clock: its renewTime is long past here)."""
    clock = Clock()
    held = lease("other", version="3", transitions=3)
    fake_api.answer(GET, clock.passes(RETRY, held), clock.passes(elapsed, held))
    fake_api[GET][2:] << clock.passes(RETRY, held)
    fake_api[PUT] << fakeapi.echo
    replica = Replica(api_client, clock=clock)

    async def two_tries() -> None:
        async with replica.running():
            await asyncio.to_thread(fake_api.wait, GET, 3)

    play(two_tries)
    methods = [r.method.value for r in fake_api.requests]
    third_read = [i for i, m in enumerate(methods) if m == "GET"][2]
    assert methods[:third_read] == ["GET", "GET", *(["PUT"] if takes else [])]
    if takes:
        taken = fake_api.requests[2].data
        assert taken["spec"]["holderIdentity"] == "me"
        assert taken["spec"]["leaseTransitions"] == 4
        assert taken["metadata"]["resourceVersion"] == "3"


# --- release ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reads", "replaces", "versions", "warns"),
    [
        pytest.param([lease("me", version="5")], [fakeapi.echo], ["5"], False, id="clears-holder"),
        pytest.param(
            [lease("me", version="5"), lease("me", version="6")],
            [fakeapi.status(409, "modified"), fakeapi.echo],
            ["5", "6"],
            False,
            id="409-read-again-and-retried",
        ),
        pytest.param(
            [lease("me", version=str(v)) for v in range(5, 5 + leader.RELEASE_TRIES)],
            [fakeapi.status(409, "modified")] * leader.RELEASE_TRIES,
            [str(v) for v in range(5, 5 + leader.RELEASE_TRIES)],
            True,
            id="gives-up-after-release-tries",
        ),
        pytest.param([lease("other")], [], [], False, id="taken-meanwhile-left-alone"),
        pytest.param([fakeapi.status(500, "internal")], [], [], True, id="read-500"),
    ],
)
def test_release(
    fake_api: fakeapi.FakeAPI,
    api_client: Any,
    caplog: pytest.LogCaptureFixture,
    reads: list[Any],
    replaces: list[Any],
    versions: list[str],
    warns: bool,
) -> None:
    """A clean shutdown hands the lease back (holder cleared, 1 s), so a standby takes it now;
    nothing it meets escapes as an exception."""
    fake_api.answer(GET, fakeapi.status(404, "not found"), *reads)
    fake_api[POST] << fakeapi.CREATED
    fake_api.answer(PUT, *replaces)
    replica = Replica(api_client, timings=ONE_TRY)

    async def lead_then_release() -> None:
        async with replica.running():
            await replica.started.wait()
            with caplog.at_level(logging.WARNING, logger=leader.__name__):
                await replica.elector.release()

    play(lead_then_release)
    released = [r.data for r in fake_api.requests if r.method.value == "PUT"]
    assert [
        (
            r["metadata"]["resourceVersion"],
            r["spec"]["holderIdentity"],
            r["spec"]["leaseDurationSeconds"],
        )
        for r in released
    ] == [(version, "", 1) for version in versions]
    assert replica.stopped == ["shutting down"]
    assert not replica.elector.leading
    assert bool(troubles(caplog)) is warns, caplog.text
