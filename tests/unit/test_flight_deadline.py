"""The flight watchdog's fast hang deadline (flight.fast_deadline, Recorder.fast_stall): a
rank whose collectives and steps stop for `hangStepTimes` x its median step is a hang, but not
in a save, a load, the step after one, its first steps or a phase its loop names itself.

No torchrun here: tests/worker/test_gang.py runs the rule under real ranks and keepers.
"""

from __future__ import annotations

import pytest

from fsdp_worker import contract
from fsdp_worker.telemetry import flight

STEPS = [0.2] * 8
P = flight.Phase


@pytest.mark.parametrize(
    ("steps", "phase", "held", "step_times", "limit"),
    [
        pytest.param(STEPS, P.FORWARD, False, 3, 2.0, id="fast-steps-get-the-floor"),
        pytest.param([1.0] * 8, P.BACKWARD, False, 3, 3.0, id="three-median-steps"),
        pytest.param([1.0] * 7 + [60.0], P.SYNC, False, 3, 3.0, id="one-slow-step-moves-no-median"),
        pytest.param([2.0] * 8, P.DATA, False, 5, 10.0, id="data-loading-is-a-step-phase"),
        pytest.param(STEPS, P.SAVE, False, 3, None, id="never-in-a-save"),
        pytest.param(STEPS, P.LOAD, False, 3, None, id="never-in-a-load"),
        pytest.param(STEPS, P.INIT, False, 3, None, id="never-at-the-start"),
        pytest.param(STEPS, P.EVAL, False, 3, None, id="never-in-a-kit-loops-evaluation"),
        pytest.param(STEPS, "sampling", False, 3, None, id="never-in-a-phase-the-loop-names"),
        pytest.param(STEPS, P.FORWARD, True, 3, None, id="not-in-the-steps-after-a-save"),
        pytest.param([0.2] * 4, P.FORWARD, False, 3, None, id="not-before-five-steps"),
        pytest.param(STEPS, P.FORWARD, False, 0, None, id="off"),
    ],
)
def test_the_fast_deadline(
    steps: list[float], phase: str, held: bool, step_times: int, limit: float | None
) -> None:
    got = flight.fast_deadline(steps, phase=phase, held=held, step_times=step_times)
    assert got == (pytest.approx(limit) if limit is not None else None)


def _recorder(monkeypatch: pytest.MonkeyPatch, *, gang: bool = True) -> flight.Recorder:
    if gang:
        monkeypatch.setenv(contract.ENV_GANG, "{}")
    else:
        monkeypatch.delenv(contract.ENV_GANG, raising=False)
    rec = flight.Recorder(rank=1, local_rank=0, attempt=1)
    rec._step_times = 3.0 if gang else 0.0
    return rec


def _train(
    rec: flight.Recorder,
    clock: list[float],
    steps: int,
    *,
    save_every: int = 0,
    claim: bool = False,
) -> None:
    """`steps` steps of 0.3 s, each with a collective in its middle; every `save_every` steps a
    5 s save after the step (to the claim: `claim`, else the memory tier)."""
    first = (rec.step or 0) + 1
    for step in range(first, first + steps):
        rec.enter(P.FORWARD, 0)
        clock[0] += 0.15
        rec._collective("all_gather_into_tensor", "completed")
        clock[0] += 0.15
        rec.step_done(step)
        if save_every and step % save_every == 0:
            with rec.during(P.SAVE):
                clock[0] += 5.0
            if claim:
                rec.hold_fast()  # as checkpoint.py's saves to the claim do


def _stop_in_a_collective(rec: flight.Recorder, clock: list[float], seconds: float) -> str | None:
    rec.enter(P.FORWARD, 0)
    rec._collective("all_gather_into_tensor", "entered")
    clock[0] += seconds
    return rec.fast_stall(clock[0])


def test_a_rank_that_stops_meeting_its_peers_is_a_hang_after_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(flight.time, "monotonic", lambda: clock[0])
    rec = _recorder(monkeypatch)
    rec.step_done(0)  # the resumed step: the watchdog counts from here, it measures nothing
    _train(rec, clock, 4)
    assert _stop_in_a_collective(rec, clock, 30.0) is None, "four steps measure nothing yet"
    rec.step_done(5)
    _train(rec, clock, 4)
    assert list(rec.step_seconds)[-1] == pytest.approx(0.3)
    assert _stop_in_a_collective(rec, clock, 1.9) is None  # 3 x 0.3 s, but at least 2 s
    clock[0] += 0.2
    why = rec.fast_stall(clock[0])
    assert why is not None
    assert "no collective and no step for 2.1s in forward of block 0" in why
    assert "all_gather_into_tensor #" in why and "median step of 0.300s" in why


def test_the_two_steps_after_a_claim_save_are_no_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(flight.time, "monotonic", lambda: clock[0])
    rec = _recorder(monkeypatch)
    _train(rec, clock, 10, save_every=10, claim=True)
    # Peers wait in the next steps' collectives for a rank still staging or sealing its save.
    assert _stop_in_a_collective(rec, clock, 30.0) is None
    rec.step_done(11)
    assert _stop_in_a_collective(rec, clock, 30.0) is None
    rec.step_done(12)
    assert _stop_in_a_collective(rec, clock, 2.5) is not None


def test_a_memory_tier_saving_every_step_keeps_the_rule_armed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step's time leaves its save out: 5 s saves after 0.3 s steps measure 0.3 s steps."""
    clock = [1000.0]
    monkeypatch.setattr(flight.time, "monotonic", lambda: clock[0])
    rec = _recorder(monkeypatch)
    _train(rec, clock, 10, save_every=1)
    assert max(rec.step_seconds) == pytest.approx(0.3)
    assert rec.held_steps == 0
    assert _stop_in_a_collective(rec, clock, 1.5) is None
    clock[0] += 0.6
    assert rec.fast_stall(clock[0]) is not None


def test_without_a_keeper_only_the_deadline_judges(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(flight.time, "monotonic", lambda: clock[0])
    rec = _recorder(monkeypatch, gang=False)
    rec.watch(hang_seconds=None, evidence_root=None, step_times=3)  # no deadline: no watchdog
    _train(rec, clock, 10)
    clock[0] += 60.0
    assert rec.fast_stall(clock[0]) is None
