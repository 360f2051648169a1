"""The flight watchdog's fast hang deadline (flight.fast_deadline, Recorder.fast_stall): a
rank whose collectives and steps stop for `hangStepTimes` x its median step is a hang, but not
in a save, a load, the step after one, its first steps or a phase its loop names itself.

No torchrun here: tests/worker/test_gang.py runs the rule under real ranks and keepers.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from fsdp_worker import contract
from fsdp_worker.contract import environment
from fsdp_worker.telemetry import flight, prior

STEPS = [0.2] * 8
P = flight.Phase


@pytest.fixture(autouse=True)
def _own_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A watchdog round keeps the rank's pace in the pod's temporary directory (prior.py)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))


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
    got = flight.fast_deadline(steps, phase=phase, held=held, step_times=step_times, floor=2.0)
    assert got == (pytest.approx(limit) if limit is not None else None)


def test_the_floor_defaults_above_a_healthy_ranks_pauses() -> None:
    """10 s unless the job says (failurePolicy.hangFloorSeconds): an epoch's data loader
    start, a recompile, a log flush between collectives of sub-second steps."""
    assert flight.fast_deadline(STEPS, phase=P.DATA, held=False, step_times=3) == 10.0


def _recorder(monkeypatch: pytest.MonkeyPatch, *, gang: bool = True) -> flight.Recorder:
    if gang:
        monkeypatch.setenv(contract.ENV_GANG, "{}")
    else:
        monkeypatch.delenv(contract.ENV_GANG, raising=False)
    rec = flight.Recorder(rank=1, local_rank=0, attempt=1)
    rec._step_times, rec._floor = (3.0 if gang else 0.0), 2.0
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
    assert "its last collective all_gather_into_tensor #" in why and "entered" in why
    assert "median step of 0.300s, at least 2s" in why


def test_a_loops_own_phase_is_no_hang_though_its_forward_passes_name_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`with kit.phase(kit.Phase.EVAL):` around evaluation: the forward hooks then say
    "forward of block 3" (evidence), but the rule stays off until the block ends."""
    clock = [1000.0]
    monkeypatch.setattr(flight.time, "monotonic", lambda: clock[0])
    rec = _recorder(monkeypatch)
    _train(rec, clock, 10)
    with rec.during(P.EVAL):
        rec.enter(P.FORWARD, 3)  # what flight.watch_blocks' forward pre-hook does
        rec._collective("all_gather_into_tensor", "completed")
        clock[0] += 30.0
        assert rec.where() == "forward of block 3"
        assert rec.fast_stall(clock[0]) is None
    rec.enter(P.FORWARD, 0)
    clock[0] += 2.5
    assert rec.fast_stall(clock[0]) is not None  # back in training, judged again


def test_a_saves_background_collectives_keep_no_steps_rhythm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(flight.time, "monotonic", lambda: clock[0])
    rec = _recorder(monkeypatch)
    _train(rec, clock, 10)
    rec.enter(P.FORWARD, 0)
    clock[0] += 2.5
    upload = threading.Thread(target=rec._collective, args=("gather_object", "completed"))
    upload.start()
    upload.join()
    assert rec.fast_stall(clock[0]) is not None


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


@pytest.mark.parametrize(
    ("restarts", "generation", "want"),
    [
        pytest.param(2, "0", 3, id="first-generation"),
        pytest.param(2, "1", 3, id="a-restart-in-place-left"),
        pytest.param(2, "2", 0, id="off-in-the-last-generation"),
        pytest.param(0, "0", 0, id="no-restarts-in-place"),
    ],
)
def test_the_rule_is_off_where_it_could_restart_nothing_in_place(
    monkeypatch: pytest.MonkeyPatch, restarts: int, generation: str, want: int
) -> None:
    """In the generation that spends the gang's last restart in place, a fast verdict would
    only end a rank before the operator's own: a survivor of a lost node then failed as a
    Hang, the gang recreated on the wrong cause (the node-loss e2e, under load)."""
    gang = {"restarts": restarts, "coordinator": "10.0.0.1:29501", "node": 0, "nodes": 2}
    monkeypatch.setenv(contract.ENV_GANG, json.dumps(gang))
    monkeypatch.setenv(contract.ENV_GENERATION, generation)
    monkeypatch.setenv(contract.ENV_HANG_STEP_TIMES, "3")
    assert environment.hang_step_times() == want


def test_the_rule_is_off_without_a_gang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(contract.ENV_GANG, raising=False)
    monkeypatch.setenv(contract.ENV_HANG_STEP_TIMES, "3")
    assert environment.hang_step_times() == 0


def test_a_pause_of_the_rank_itself_is_no_peers_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A garbage collection, a frozen or CPU-starved process: its watchdog wakes late too, and
    the fast deadline counts from its waking. A peer's stop leaves the watchdog on time."""
    clock = [1000.0]
    monkeypatch.setattr(flight.time, "monotonic", lambda: clock[0])
    rec = _recorder(monkeypatch)
    _train(rec, clock, 10)
    rec._hang_seconds = 600.0
    ended: list[str | None] = []
    monkeypatch.setattr(rec, "_report", lambda: None)
    monkeypatch.setattr(rec, "end_hung", lambda stalled, why=None: ended.append(why))
    rec.enter(P.FORWARD, 0)
    rec._collective("all_gather_into_tensor", "entered")
    last = rec.tick(clock[0], last=clock[0], period=0.25)
    clock[0] += 5.0  # the whole process paused: its watchdog too
    last = rec.tick(clock[0], last=last, period=0.25)
    assert ended == [], "its own pause"
    for _ in range(7):  # then on time, its peer's collective still open: 1.75 s < 2 s
        clock[0] += 0.25
        last = rec.tick(clock[0], last=last, period=0.25)
    assert ended == []
    clock[0] += 0.25
    rec.tick(clock[0], last=last, period=0.25)
    assert ended and ended[0] is not None and "no collective and no step for 2.0s" in ended[0]


# --- after a restart in place: the previous generation's pace (telemetry/prior.py) ----------


@pytest.mark.parametrize(
    ("steps", "earlier", "limit"),
    [
        pytest.param([], 1.0, 3.0, id="no-own-step-yet-judged-by-the-earlier-pace"),
        pytest.param([0.2] * 4, 1.0, 3.0, id="four-own-steps-still-the-earlier-pace"),
        pytest.param([0.2] * 5, 1.0, 2.0, id="five-own-steps-their-own-median"),
        pytest.param([0.2] * 4, None, None, id="no-earlier-pace-waits-for-five"),
    ],
)
def test_the_previous_generations_pace_judges_until_a_ranks_own_steps_suffice(
    steps: list[float], earlier: float | None, limit: float | None
) -> None:
    got = flight.fast_deadline(
        steps, phase=P.FORWARD, held=False, step_times=3, floor=2.0, earlier=earlier
    )
    assert got == (pytest.approx(limit) if limit is not None else None)


@pytest.fixture
def pod_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Any:
    """The pod's own /tmp, the gang's and the attempt's environment as a keeper sets it."""
    monkeypatch.setenv(contract.ENV_ATTEMPT, "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    return tmp_path


def _generation(monkeypatch: pytest.MonkeyPatch) -> flight.Recorder:
    monkeypatch.setenv(contract.ENV_GANG, '{"node": 1}')
    rec = flight.Recorder(rank=1, local_rank=0, attempt=2)
    rec.watch(hang_seconds=None, evidence_root=None, step_times=3.0, floor=2.0)
    return rec


def test_a_restarted_rank_judges_from_its_second_step_by_its_last_generations_pace(
    monkeypatch: pytest.MonkeyPatch, pod_tmp: Any
) -> None:
    """Generation 0 trains 1 s steps and keeps its median in the pod; generation 1's rank,
    restarted in place, stops in a collective in its second step: a hang after 3 x 1 s, not
    after five more steps and the job's progress deadline."""
    clock = [1000.0]
    monkeypatch.setattr(flight.time, "monotonic", lambda: clock[0])
    first = _generation(monkeypatch)
    assert first._earlier is None, "the pod's first generation has nothing to go by"
    first.step_done(0)
    for step in range(1, 9):
        clock[0] += 1.0
        first.step_done(step)
    first._keep_pace(clock[0])
    assert [p.name for p in pod_tmp.iterdir()] and not list(pod_tmp.glob("*.partial"))

    second = _generation(monkeypatch)
    assert second._earlier == pytest.approx(1.0)
    # its first step (compiling, its peers connecting) is never judged by the rule
    assert _stop_in_a_collective(second, clock, 60.0) is None
    second.step_done(9)
    assert _stop_in_a_collective(second, clock, 2.9) is None
    clock[0] += 0.2
    why = second.fast_stall(clock[0])
    assert why is not None and "3 x its previous generation's median step of 1.000s" in why


def test_a_resized_gang_or_a_new_attempt_reads_no_earlier_pace(
    monkeypatch: pytest.MonkeyPatch, pod_tmp: Any
) -> None:
    """Four ranks' pace says nothing of three's (each takes a larger share of the batch)."""
    clock = [1000.0]
    monkeypatch.setattr(flight.time, "monotonic", lambda: clock[0])
    first = _generation(monkeypatch)
    first.step_done(0)
    for step in range(1, 9):
        clock[0] += 1.0
        first.step_done(step)
    first._keep_pace(clock[0])
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert _generation(monkeypatch)._earlier is None
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv(contract.ENV_ATTEMPT, "3")
    assert _generation(monkeypatch)._earlier is None
    monkeypatch.setenv(contract.ENV_ATTEMPT, "2")
    assert _generation(monkeypatch)._earlier == pytest.approx(1.0)


@pytest.mark.parametrize("text", ["", "{", '{"medianStepSeconds": -1}', '{"x": 1}', "[1]"])
def test_a_broken_pace_file_is_no_pace(
    monkeypatch: pytest.MonkeyPatch, pod_tmp: Any, text: str
) -> None:
    monkeypatch.setenv(contract.ENV_GANG, '{"node": 1}')
    where = prior.path(0)
    assert where is not None and where.startswith(str(pod_tmp))
    with open(where, "w") as f:
        f.write(text)
    assert prior.read(0) is None


def test_without_a_gang_no_pace_is_kept(monkeypatch: pytest.MonkeyPatch, pod_tmp: Any) -> None:
    monkeypatch.delenv(contract.ENV_GANG, raising=False)
    prior.write(0, 1.0)
    assert prior.path(0) is None and list(pod_tmp.iterdir()) == []
