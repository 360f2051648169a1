"""When a keeper judges its coordinator lost: gone (nothing at its address) after LOST_AFTER,
slow (it accepts and does not answer: its process is there) only after SLOW_LOST_AFTER. The
rule as a truth table (silence.Silence, no sockets), then over real sockets: a port nobody
listens on, and one whose listener never answers (a frozen coordinator: the kernel accepts
for it), as `ask`, the watch and a keeper's ranks meet them. Limits are shrunk so that each
case takes a second or two."""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fsdp_worker.contract import gangwire, keeper
from fsdp_worker.keeper import gang, watch
from fsdp_worker.keeper.coordinator import Coordinator
from fsdp_worker.keeper.silence import NoAnswer, Silence

CREDS = gangwire.Credentials("6b1c8a52-0000-4000-8000-000000000001", 1, None)
ANSWER: dict[str, Any] = {"generation": 0}
GONE, LATE = NoAnswer.UNREACHABLE, NoAnswer.LATE


@pytest.mark.parametrize(
    ("heard", "now", "lost"),
    [
        ([], 100.0, False),  # never asked
        ([(GONE, 0.0)], 9.9, False),
        ([(GONE, 0.0)], 10.0, True),  # unreachable for LOST_AFTER: gone
        ([(LATE, 0.0)], 10.0, False),  # accepted, unanswered: slow, not gone
        ([(LATE, 0.0)], 29.9, False),
        ([(LATE, 0.0)], 30.0, True),  # slow for SLOW_LOST_AFTER: as good as gone
        ([(LATE, 0.0), (GONE, 12.0)], 21.9, False),  # slow, then gone: counted from then
        ([(LATE, 0.0), (GONE, 12.0)], 22.0, True),
        ([(LATE, 0.0), (GONE, 25.0)], 30.0, True),  # silent for SLOW_LOST_AFTER in all
        ([(GONE, 0.0), (LATE, 8.0), (GONE, 12.0)], 21.9, False),  # a late ask breaks the run
        ([(GONE, 0.0), (ANSWER, 8.0), (GONE, 9.0)], 18.9, False),  # an answer ends the silence
        ([(GONE, 0.0), (ANSWER, 8.0), (GONE, 9.0)], 19.0, True),
        ([(LATE, 0.0), (ANSWER, 25.0)], 40.0, False),
    ],
)
def test_a_coordinator_that_cannot_be_reached_is_lost_sooner_than_one_that_is_slow(
    heard: list[tuple[dict[str, Any] | NoAnswer, float]], now: float, lost: bool
) -> None:
    silence = Silence(lost_after=10.0, slow_lost_after=30.0)
    for outcome, asked in heard:
        silence.hear(outcome, asked=asked, now=asked + 1.0)
    assert silence.lost(now) is lost


def test_slow_and_answering_again_are_each_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    silence = Silence(lost_after=10.0, slow_lost_after=30.0, who="coordinator 10.0.0.5:29501")
    with caplog.at_level(logging.WARNING, logger="fsdp_worker.keeper.gang"):
        for t in (0.0, 4.0, 8.0):
            silence.hear(LATE, asked=t, now=t + 4.0)
        silence.hear(ANSWER, asked=12.0, now=12.5)
        silence.hear(GONE, asked=13.0, now=13.0)  # not slow: nothing to say
        silence.hear(ANSWER, asked=13.2, now=13.2)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "10.0.0.5:29501 is slow" in lines[0] and "30s" in lines[0]
    assert "answers again after 12.5s" in lines[1]


@contextlib.contextmanager
def frozen_coordinator() -> Iterator[tuple[str, int]]:
    """A listening socket nobody accepts from: the kernel completes every connection (its
    backlog) and nothing answers, as for a coordinator whose process is frozen or swamped."""
    with socket.create_server(("127.0.0.1", 0), backlog=128) as sock:
        yield sock.getsockname()[:2]


def closed_port() -> tuple[str, int]:
    """An address nothing listens on: connections are refused, as after node 0's keeper died."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[:2]  # type: ignore[no-any-return]


def test_ask_tells_a_coordinator_that_accepted_and_did_not_answer_from_one_not_there() -> None:
    with frozen_coordinator() as address, pytest.raises(keeper.AnswerLate, match="accepted"):
        keeper.ask(address, {"op": "state"}, creds=CREDS, timeout=0.2)
    with pytest.raises(OSError) as refused:
        keeper.ask(closed_port(), {"op": "state"}, creds=CREDS, timeout=0.2)
    assert not isinstance(refused.value, keeper.AnswerLate)


def test_ask_reads_a_connection_closed_unanswered_as_late() -> None:
    """A coordinator at its connection cap closes what it cannot serve: it is there, busy."""
    with socket.create_server(("127.0.0.1", 0)) as server:

        def close_each() -> None:
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                conn.close()

        threading.Thread(target=close_each, daemon=True).start()
        with pytest.raises(keeper.AnswerLate):
            keeper.ask(server.getsockname()[:2], {"op": "state"}, creds=CREDS, timeout=2.0)


def _keeper(address: tuple[str, int], argv: list[str]) -> gang.Keeper:
    coordinator = f"{address[0]}:{address[1]}"
    g = gang.Gang(restarts=3, coordinator=coordinator, node=1, nodes=2, listen=0)
    return gang.Keeper(g, argv, creds=CREDS)


def _watch(k: gang.Keeper, *, lost_after: float, slow_lost_after: float) -> watch.GenerationWatch:
    return watch.GenerationWatch(
        generation=0,
        ask=k._hear,
        fenced=lambda answer: False,
        met=lambda: None,
        met_before=True,
        poll=0.02,
        lost_after=lost_after,
        slow_lost_after=slow_lost_after,
    )


def test_the_watch_judges_a_silent_coordinator_lost_only_after_the_slow_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watch, "ASK_SECONDS", 0.2)
    with frozen_coordinator() as address:
        began = time.monotonic()
        seen = _watch(_keeper(address, ["true"]), lost_after=0.3, slow_lost_after=2.0)
        try:
            assert not seen.news.wait(
                1.2
            ), f"judged {seen.verdict} after {time.monotonic() - began:.1f}s"
            assert seen.news.wait(10.0) and seen.verdict == "lost"
            assert time.monotonic() - began >= 2.0
        finally:
            seen.stop()


def test_the_watch_judges_a_coordinator_that_is_not_there_lost_after_lost_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watch, "ASK_SECONDS", 0.2)
    began = time.monotonic()
    seen = _watch(_keeper(closed_port(), ["true"]), lost_after=0.3, slow_lost_after=2.0)
    try:
        assert seen.news.wait(10.0) and seen.verdict == "lost"
        assert 0.3 <= time.monotonic() - began < 2.0
    finally:
        seen.stop()


@pytest.fixture
def fast_keeper(monkeypatch: pytest.MonkeyPatch) -> None:
    """The keeper's limits shrunk: gone after 0.3 s; the slow limit left as it is (30 s)."""
    monkeypatch.setattr(watch, "ASK_SECONDS", 0.2)
    monkeypatch.setattr(gang, "POLL_SECONDS", 0.02)
    monkeypatch.setattr(gang, "LOST_AFTER_SECONDS", 0.3)


@pytest.mark.usefixtures("fast_keeper")
def test_a_keepers_ranks_run_on_while_its_coordinator_is_slow() -> None:
    """Node 0's keeper is swamped (a thousand keepers' asks on a loaded machine) for longer
    than LOST_AFTER: the other keepers' ranks train on. Judging it gone killed them, and with
    them the gang's restart in place (issue 44)."""
    with frozen_coordinator() as address:
        k = _keeper(address, ["sleep", "1.5"])
        k.met = True
        k.proc = subprocess.Popen(k.argv)
        try:
            assert k._watch(0) == "exited"
        finally:
            k.proc.kill()
            k.proc.wait()
    assert k.proc.returncode == 0, "the ranks were killed"


@pytest.mark.usefixtures("fast_keeper")
def test_a_keepers_ranks_stop_soon_once_its_coordinator_is_gone() -> None:
    k = _keeper(closed_port(), ["sleep", "30"])
    k.met = True
    k.proc = subprocess.Popen(k.argv)
    began = time.monotonic()
    try:
        assert k._watch(0) == "lost"
        assert time.monotonic() - began < 10.0
    finally:
        k.proc.kill()
        k.proc.wait()


@pytest.mark.usefixtures("fast_keeper")
def test_a_failure_report_waits_out_a_slow_coordinator() -> None:
    """A `fail` is said again for as long as a frozen coordinator may still thaw: here it
    thaws after 2.5 s, past LOST_AFTER and the first ask's 2 s, and the report is answered."""
    coordinator = Coordinator(0, nodes=2, creds=CREDS)
    k = _keeper(("127.0.0.1", coordinator.server_address[1]), ["true"])
    thaw = threading.Timer(2.5, coordinator.serve_forever)
    thaw.daemon = True
    thaw.start()
    try:
        failure = {"class": "RuntimeError", "rank": 1}
        answer = k._report({"op": "fail", "generation": 0, "failure": failure, "final": False})
        assert answer is not None and answer.get("generation") == 1
    finally:
        thaw.cancel()
        coordinator.shutdown()  # waits for serve_forever, where the timer started it
        coordinator.server_close()


def test_a_failure_report_to_a_frozen_coordinator_ends_at_the_operators_follow() -> None:
    """Node rank 0 frozen (it accepts and never answers): the keeper says its `fail` again,
    until the operator's `follow` names the spare that took node 0's place; then it stops at
    once and goes to its successor (the goodput soak saw a keeper held 5 s and more here, and
    the promoted spare's coordinator judged it frozen)."""
    coordinator = Coordinator(0, nodes=2, creds=CREDS)  # listening, never served: frozen
    k = _keeper(("127.0.0.1", coordinator.server_address[1]), ["true"])
    told = threading.Timer(0.5, lambda: setattr(k, "follow", ("10.0.0.9:29501", "10.0.0.9:1")))
    told.daemon = True
    told.start()
    try:
        began = time.monotonic()
        failure = {"class": "RuntimeError", "rank": 1}
        answer = k._report({"op": "fail", "generation": 0, "failure": failure, "final": False})
        assert answer is None
        assert time.monotonic() - began < watch.LOST_AFTER_SECONDS, time.monotonic() - began
    finally:
        told.cancel()
        coordinator.server_close()


def test_the_operator_counts_how_long_a_coordinator_has_accepted_and_not_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """run/keepers.gang_health over real sockets: a frozen coordinator's asks are late, counted
    from the first in a row (policy/frozen.py's early verdict on node rank 0's pod); a refused
    one is not late and ends the run, as an answer would."""
    from fsdp_operator.io import gang as operator_gang
    from fsdp_operator.run import keepers
    from fsdp_operator.types import names

    monkeypatch.setattr(keepers, "GANG_ASK_TIMEOUT", 0.2)
    asker = keepers.Asker(operator_gang.GangClient(None), CREDS.job, CREDS.attempt)
    lateness = keepers.Lateness()
    with frozen_coordinator() as (host, port):
        monkeypatch.setattr(names, "GANG_PORT", port)
        first = keepers.gang_health(asker, host, lateness=lateness, now=100.0)
        later = keepers.gang_health(asker, host, lateness=lateness, now=102.5)
    assert not first.answered and "accepted" in first.error, first
    assert (first.late_seconds, later.late_seconds) == (0.0, 2.5)
    monkeypatch.setattr(names, "GANG_PORT", closed_port()[1])
    refused = keepers.gang_health(asker, host, lateness=lateness, now=103.0)
    assert not refused.answered and refused.late_seconds is None, refused
    with frozen_coordinator() as (host, port):
        monkeypatch.setattr(names, "GANG_PORT", port)
        again = keepers.gang_health(asker, host, lateness=lateness, now=104.0)
    assert again.late_seconds == 0.0, "a refusal between ends the run"
