"""A fake Kubernetes API server for fast tests of the layer that talks to the API.

kmock (by kopf's author) serves the responses a test scripts and records every request it gets.
Here it runs on its own thread and event loop, so a synchronous client (the kubernetes package,
as kube.Kube and leader.Elector use it) calls it from a plain test or from asyncio.run() without
deadlock; `kubeconfig()` points any client at it.

A request no test scripted is answered 501 and fails the test at teardown: a wrong path cannot
pass as an error the code under test tolerates (a 404 it ignores, a 500 it raises).
It imports nothing of the operator, and keeps no objects of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import yaml

from localcluster import poll


def status(code: int, message: str = "") -> kmock.Response:
    """The API server's answer to a refused request: HTTP `code` with a `Status` body."""
    body = {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "code": code,
    }
    return kmock.Response(status=code, payload=body)


def echo(request: kmock.Request) -> Any:
    """Answers with the request's own body: what the API server returns for a create or a
    patch that it took as sent (the client parses the answer: `{}` is no Event)."""
    return request.data


CREATED = kmock.Response(status=201, payload=echo)
"""A create the API server took: 201 and the object as sent."""


class FakeAPI:
    """One running fake API server.

    Script with kmock's DSL through indexing: `api["post /api/v1/namespaces/ns/pods"] << 201 <<
    {...}`; a status alone: `<< status(409, "exists")`; one answer per request in order:
    `api.answer("get /x", first, second)`. Read what the server got: `api.requests` (all, in
    order) or `list(api["patch"])`; each is a kmock.Request with `.method`, `.url.path`,
    `.params`, `.headers`, `.data` (the parsed JSON body).
    """

    def __init__(self, handler: kmock.RawHandler, url: str) -> None:
        self.handler = handler
        self.url = url
        self.unscripted: list[str] = []
        handler.fallback << self._unscripted

    def __getitem__(self, criteria: Any) -> Any:
        return self.handler[criteria]

    @property
    def requests(self) -> list[kmock.Request]:
        return list(self.handler)

    def answer(self, criteria: Any, *responses: Any) -> None:
        """The n-th request matching `criteria` gets the n-th response; one more is unscripted."""
        for index, response in enumerate(responses):
            self.handler[criteria][index : index + 1] << response

    def wait(self, criteria: Any, count: int, *, timeout: float = 5.0) -> None:
        """Blocks until the server has got `count` requests matching `criteria` (a request is
        recorded on arrival, before it is answered)."""
        poll.until(
            f"{count} x {criteria!r}",
            lambda: len(self.handler[criteria]) >= count,
            timeout=timeout,
            every=0.002,
            diagnosis=lambda: f"requests: {self.log()}",
        )

    def log(self) -> list[str]:
        """Every request so far as "METHOD /path?query", in order (for assertion messages)."""
        return [f"{r.method.value} {r.url.path_qs}" for r in self.handler]

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig at `path` for this server, without credentials."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def _unscripted(self, request: kmock.Request) -> kmock.Response:
        said = f"{request.method.value} {request.url.path_qs}"
        self.unscripted.append(said)
        return status(501, f"fake API: no response scripted for {said}")

    def check(self) -> None:
        """Fails when the server got a request no test scripted, or a scripted answer broke."""
        assert not self.unscripted, f"requests no test scripted: {self.unscripted}"
        assert not self.handler.errors, f"the fake API failed: {self.handler.errors!r}"


@contextlib.contextmanager
def serve() -> Iterator[FakeAPI]:
    """A fake API server on 127.0.0.1 (a free port), for the duration of the block."""
    ready: concurrent.futures.Future[tuple[FakeAPI, asyncio.Event]] = concurrent.futures.Future()

    async def run() -> None:
        try:  # the handler is made on this loop: its queues and events belong to it
            async with kmock.RawHandler() as handler, kmock.Server(handler) as server:
                stop = asyncio.Event()
                ready.set_result((FakeAPI(handler, str(server.url).rstrip("/")), stop))
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), name="fake-api")
    thread.start()
    try:
        api, stop = ready.result(timeout=10)
        yield api
        api.check()
    finally:
        if ready.done() and not ready.exception():
            loop.call_soon_threadsafe(ready.result()[1].set)
        thread.join(timeout=10)
        loop.close()
