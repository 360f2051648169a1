"""Restarts in place (failurePolicy.inPlaceRestarts; fsdp_worker.keeper.gang): the attempt's
pods restarted their ranks without the operator, and rank 0 of a later generation serves the
keepers' records. Each is charged, counted and kept like a restart of the gang; one that
spends a budget ends the job as a gang restart would. The pods are never touched here.
"""

from __future__ import annotations

from fsdp_operator.policy import accounting, decision, detect, finish, restarts
from fsdp_operator.types import observed, status


def _newest_seal(claim: int | None, record: observed.InPlaceRecord) -> int | None:
    """The newest step sealed before a failure in place: the claim's, or the memory tier's
    that the failing rank reported (`memoryStep`); a restart from memory makes progress too."""
    memory = record.memory_step
    if memory is None:
        return claim
    return memory if claim is None else max(claim, memory)


def seen(d: decision.Draft, obs: observed.Observed, prog: observed.Progress) -> None:
    """Rank failures the attempt's pods restarted from in place (their keepers' records, as
    rank 0 of a later generation serves them): each new one is charged and kept; one that
    spends a budget stops the job (`d.stop`, see stopped)."""
    entry = decision.current_entry(d.status)
    if entry is None or entry.ended is not None or not prog.restarts_in_place:
        return
    known = {r.generation for r in entry.restarts_in_place}
    for record in prog.restarts_in_place:
        if record.generation in known or record.generation >= prog.generation:
            continue
        _charge(d, obs, entry, record)


def _charge(
    d: decision.Draft,
    obs: observed.Observed,
    entry: status.HistoryEntry,
    record: observed.InPlaceRecord,
) -> None:
    s = d.status
    failure = detect.in_place_failure(obs, record)
    d.failure, s.last_failure = failure, failure
    counters = restarts.charge(s.restarts, failure.cause)
    app = status.budget_of(failure.cause) is status.Budget.APPLICATION
    before = entry.restarts_in_place[-1] if entry.restarts_in_place else None
    since = before.resumed_from_step if before is not None else s.resumed_from_step
    sealed = _newest_seal(s.sealed_step, record)
    stalled = app and (sealed is None or (since is not None and sealed <= since))
    counters.without_progress = counters.without_progress + 1 if stalled else 0
    s.restarts = counters
    rel = s.reliability
    s.reliability = rel.model_copy(update={"failures": rel.failures + 1})
    steps, train, blocked = accounting.in_place_sums(entry)  # the failed generation's: the rest
    entry.restarts_in_place = [
        *entry.restarts_in_place,
        status.InPlaceRestart(
            generation=record.generation,
            failure=finish.brief(failure),
            detected=record.detected,
            steps_run=max(0, (entry.steps_run or 0) - steps),
            train_seconds=max(0.0, (entry.train_seconds or 0.0) - train),
            blocked_seconds=max(0.0, (entry.blocked_seconds or 0.0) - blocked),
        ),
    ][-status.IN_PLACE_LIMIT :]
    d.in_place.append(entry.restarts_in_place[-1])
    where = f"rank {failure.rank} pod {failure.pod}" if failure.pod else "a rank"
    d.emit(
        "RestartedInPlace",
        f"{failure.cause.value}: {where} {failure.message}; generation {record.generation + 1} "
        f"of attempt {s.attempt} resumed in the same pods",
        warning=True,
    )
    stop = restarts.stop_reason(spec=obs.spec, restarts=counters, cause=failure.cause)
    if stop is not None and d.stop is None:
        d.stop = stop


def stopped(d: decision.Draft, obs: observed.Observed) -> decision.Draft | None:
    """A restart in place that spent a budget ends the job as a gang restart would."""
    if d.stop is None:
        return None
    cause, why = d.stop
    failure = d.status.last_failure
    if failure is not None and cause is failure.cause and failure.message:
        why = f"{why}: {failure.message}"
    return finish.finish(d, obs, cause, why)
