"""probe.Prober against real loopback endpoints: a change wakes the job once, a dead endpoint
backs off to the job's interval, and an endpoint that never answers holds up nobody else."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from fsdp_operator.io import probe
from fsdp_operator.types import names
from fsdp_operator.types.observed import ScrapeHealth
from fsdp_worker import contract

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def endpoint(host: str, page: dict[str, Any], *, hang: bool = False) -> AsyncIterator[None]:
    """rank 0's /metrics on host:METRICS_PORT (loopback addresses 127.0.0.x)."""

    async def metrics(_: web.Request) -> web.Response:
        if hang:
            await asyncio.sleep(30)
        return web.Response(text=f"{contract.METRIC_STEP} {page['step']}\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, host, names.METRICS_PORT)
    await site.start()
    try:
        yield
    finally:
        await runner.cleanup()


def test_a_new_step_wakes_the_job_once_and_is_handed_to_one_pass() -> None:
    async def scenario() -> tuple[list[object], Any, Any, Any]:
        woken: list[object] = []
        page = {"step": 5}
        prober = probe.Prober(on_change=woken.append, timeout=0.5)
        async with endpoint("127.0.0.21", page):
            runner = asyncio.create_task(prober.run())
            prober.want("job", probe.Target(pod="p0", ip="127.0.0.21", every=0.1))
            await asyncio.sleep(0.5)  # about 5 scrapes of the same step
            first, again = prober.take("job"), prober.take("job")
            page["step"] = 6
            await asyncio.sleep(0.3)
            newer = prober.take("job")
            runner.cancel()
        return woken, first, again, newer

    woken, first, again, newer = asyncio.run(scenario())
    assert woken == ["job", "job"]  # step 5 seen, then step 6: no wake for repeats
    assert first is not None and first[0] == "p0" and first[1].step == 5
    assert again is None  # a pass never reads the same sample as news twice
    assert newer is not None and newer[1].step == 6


def test_a_sample_taken_by_a_pass_that_failed_is_news_again_until_a_newer_one_comes() -> None:
    """A pass that took step 5 and then failed (the API server stalled) has not recorded it:
    the next pass gets it. Once step 6 has been scraped, step 5 is not handed back."""

    async def scenario() -> tuple[Any, Any, Any]:
        page = {"step": 5}
        prober = probe.Prober(on_change=lambda _: None, timeout=0.5)
        async with endpoint("127.0.0.23", page):
            runner = asyncio.create_task(prober.run())
            prober.want("job", probe.Target(pod="p0", ip="127.0.0.23", every=0.1))
            await asyncio.sleep(0.3)
            taken = prober.take("job")
            assert taken is not None
            prober.give_back("job", taken)
            again = prober.take("job")
            page["step"] = 6
            await asyncio.sleep(0.3)
            assert again is not None
            prober.give_back("job", again)  # a newer sample came meanwhile: it is the news
            newest = prober.take("job")
            runner.cancel()
        return taken, again, newest

    taken, again, newest = asyncio.run(scenario())
    assert again is not None and again[1].step == taken[1].step == 5
    assert newest is not None and newest[1].step == 6


def test_a_dead_endpoint_backs_off_and_a_hung_one_delays_no_other_job() -> None:
    tries: dict[str, int] = {}

    async def scenario() -> tuple[dict[str, ScrapeHealth | None], list[object], float]:
        woken: list[object] = []
        prober = probe.Prober(on_change=woken.append, timeout=0.3, concurrency=2)
        async with endpoint("127.0.0.22", {}, hang=True), endpoint("127.0.0.23", {"step": 1}):
            runner = asyncio.create_task(prober.run())
            prober.want("dead", probe.Target(pod="d", ip="127.0.0.24", every=4.0))  # no server
            prober.want("hung", probe.Target(pod="h", ip="127.0.0.22", every=0.1))
            loop = asyncio.get_running_loop()
            start = loop.time()
            prober.want("good", probe.Target(pod="g", ip="127.0.0.23", every=0.1))
            while not woken:
                await asyncio.sleep(0.01)
            first_good = loop.time() - start
            await asyncio.sleep(5.0)
            health = {key: prober.health(key) for key in ("dead", "hung", "good")}
            tries["dead"] = prober._slots["dead"].failures  # the backoff, seen from inside
            runner.cancel()
            seen = list(woken)  # not the wakes of the endpoints' shutdown below
        return health, seen, first_good

    health, woken, first_good = asyncio.run(scenario())
    assert woken[0] == "good"
    # A job whose endpoint cannot be reached (no answer: what a NetworkPolicy's drop looks
    # like) is woken once, when the operator stops reading its silence as the job's
    # (observed.BLIND_AFTER in a row: a condition says so), not per miss. A refused connection
    # reached the pod (nothing serves there): that is the pod's state, no blindness.
    assert woken.count("hung") == 1 and "dead" not in woken
    assert first_good < 1.0  # not queued behind the hung endpoint's timeouts
    hung, dead, good = health["hung"], health["dead"], health["good"]
    assert hung is not None and hung.blind and "no answer within 0.3s" in hung.error
    assert hung.address == f"127.0.0.22:{names.METRICS_PORT}"
    # refused every time: reached, never served (what a gang that has not met looks like)
    assert dead is not None and not dead.answered and not dead.blind and dead.failures == 0
    assert hung.answered is False and good is not None and good.answered
    assert 2 <= tries["dead"] <= 4  # tries at 0, 1 (+1), 3 (+2), 7 (+4, its interval) s: not 50
    assert good is not None and good.failures == 0 and not good.blind


def test_a_job_wanted_more_often_is_scraped_at_once() -> None:
    """Its interval drops to 1 s (a node of its gang missed a Lease renewal): the next scrape
    does not wait out the old interval."""

    async def scenario() -> tuple[Any, Any]:
        page = {"step": 5}
        prober = probe.Prober(on_change=lambda _key: None, timeout=0.5)
        async with endpoint("127.0.0.25", page):
            runner = asyncio.create_task(prober.run())
            prober.want("job", probe.Target(pod="p0", ip="127.0.0.25", every=60.0))
            await asyncio.sleep(0.3)
            first = prober.take("job")
            page["step"] = 6
            prober.want("job", probe.Target(pod="p0", ip="127.0.0.25", every=60.0))
            await asyncio.sleep(0.3)
            same = prober.take("job")  # 60 s between scrapes: not read again yet
            prober.want(
                "job", probe.Target(pod="p0", ip="127.0.0.25", every=probe.SUSPECT_INTERVAL)
            )
            await asyncio.sleep(0.3)
            sooner = prober.take("job")
            runner.cancel()
        return first, (same, sooner)

    first, (same, sooner) = asyncio.run(scenario())
    assert first is not None and first[1].step == 5
    assert same is None and sooner is not None and sooner[1].step == 6


def test_in_place_failure_records_come_from_the_coordinator_and_stay_while_it_is_silent() -> None:
    """The one way a restart in place's record reaches the operator: the prober asks the gang's
    coordinator (the real one, signed with the attempt's key) beside each scrape. A coordinator
    that stops answering (between generations, a node lost) leaves the records seen last."""
    import threading

    from fsdp_operator.io import gang
    from fsdp_worker.contract import gangwire
    from fsdp_worker.keeper.coordinator import Coordinator

    master, uid, attempt = b"m" * 32, "uid-1", 2
    creds = gangwire.Credentials(uid, attempt, gangwire.attempt_key(master, uid, attempt))
    coordinator = Coordinator(0, 2, creds=creds)
    port = coordinator.server_address[1]
    threading.Thread(target=coordinator.serve_forever, args=(0.01,), daemon=True).start()
    record = {"class": "RuntimeError", "message": "CUDA error", "node": 1, "step": 48}
    coordinator.handle_request_doc(
        {"op": gangwire.Op.FAIL, "generation": 0, "failure": record, "from": 1, "final": False}
    )

    async def scenario() -> tuple[Any, Any]:
        woken: list[object] = []
        ask = probe.gang_asker(gang.GangClient(master), port=port)
        prober = probe.Prober(on_change=woken.append, timeout=0.5, ask_gang=ask)
        async with endpoint("127.0.0.26", {"step": 50}):
            runner = asyncio.create_task(prober.run())
            target = probe.Target(
                pod="p0", ip="127.0.0.26", every=0.1, gang=probe.Gang(uid, attempt)
            )
            prober.want("job", target)
            await asyncio.sleep(0.4)
            first = prober.take("job")
            coordinator.shutdown()
            coordinator.server_close()
            await asyncio.sleep(0.4)
            later = prober.take("job")
            runner.cancel()
        return first, later

    first, later = asyncio.run(scenario())
    assert first is not None
    (got,) = first[1].restarts_in_place
    assert (got.generation, got.node, got.termination.words) == (0, 1, "CUDA error")
    assert later is not None and later[1].restarts_in_place == first[1].restarts_in_place
