"""The one wait of the tests and the harness: it returns what the condition answered, and past
its timeout it fails saying what it waited for, what it last saw and the caller's diagnosis."""

from __future__ import annotations

import pytest

from localcluster import poll


class Clock:
    """A clock that moves only when the wait sleeps; it records each sleep."""

    def __init__(self) -> None:
        self.now, self.slept = 100.0, list[float]()

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Answers:
    """A probe that answers `said` in turn, then its last answer forever; it counts the asks."""

    def __init__(self, *said: object) -> None:
        self.said, self.asked = list(said), 0

    def __call__(self) -> object:
        self.asked += 1
        return self.said.pop(0) if len(self.said) > 1 else self.said[0]


def test_it_returns_the_first_truthy_answer() -> None:
    clock = Clock()
    probe = Answers(None, {}, {"phase": "Running"})
    got = poll.until("Running", probe, timeout=10, every=0.5, clock=clock, sleep=clock.sleep)
    assert got == {"phase": "Running"}
    assert probe.asked == 3 and clock.slept == [0.5, 0.5]


def test_past_the_timeout_it_says_what_it_waited_for_what_it_saw_and_why() -> None:
    clock = Clock()
    probe = Answers("")
    with pytest.raises(AssertionError) as failed:
        poll.until(
            "the job Succeeded",
            probe,
            timeout=1,
            every=0.4,
            diagnosis=lambda: "status: Restarting (OOMKilled)",
            clock=clock,
            sleep=clock.sleep,
        )
    assert isinstance(failed.value, poll.TimedOut)
    assert str(failed.value) == (
        "timed out after 1s waiting for the job Succeeded; last=''\nstatus: Restarting (OOMKilled)"
    )
    # asked at the start, after each sleep, and once at the deadline: never past it
    assert clock.slept == [0.4, 0.4, pytest.approx(0.2)] and probe.asked == 4
    assert clock.now == pytest.approx(101.0)


def test_a_zero_timeout_still_looks_once() -> None:
    clock = Clock()
    assert poll.until("x", lambda: 7, timeout=0, clock=clock, sleep=clock.sleep) == 7
    with pytest.raises(poll.TimedOut, match="last=0$"):
        poll.until("x", lambda: 0, timeout=0, clock=clock, sleep=clock.sleep)
    assert clock.slept == []


def test_a_diagnosis_that_fails_does_not_hide_the_timeout() -> None:
    clock = Clock()

    def broken() -> str:
        raise ConnectionRefusedError("the API server is gone")

    with pytest.raises(poll.TimedOut) as failed:
        poll.until("x", lambda: None, timeout=1, clock=clock, sleep=clock.sleep, diagnosis=broken)
    assert "waiting for x" in str(failed.value)
    assert "(no diagnosis: ConnectionRefusedError: the API server is gone)" in str(failed.value)


def test_a_probe_that_raises_ends_the_wait_at_once() -> None:
    clock = Clock()

    def exited() -> bool:
        raise AssertionError("worker exited early")

    with pytest.raises(AssertionError, match="worker exited early"):
        poll.until("step 4", exited, timeout=60, clock=clock, sleep=clock.sleep)
    assert clock.slept == []
