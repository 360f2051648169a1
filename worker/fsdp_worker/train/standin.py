"""A torch-free stand-in worker: the real contract, no training. For operator tests and dry runs.

Run under torchrun exactly like `fsdp_worker` (`-m fsdp_worker.train.standin`): it reads the same
environment and config, advances one "step" every STANDIN_STEP_SECONDS, serves rank 0's
progress metrics, writes checkpoints the real way through the real worker's storage seam
(contract/store.py: per-rank files in the writer's partial save, a barrier on them, then rank 0
seals: on the claim a rename, on an `s3://` root the create-only marker and the fence's CAS),
saves on SIGTERM, resumes from the checkpoint the operator names (or, with ``auto``, the one
the catalog chooses under FSDP_RESUME_RULES), and writes the JSON
termination message on failure. It must never be used to train anything.

Behaviour knobs (plain env a job may set in spec.template.spec.env):
  STANDIN_STEP_SECONDS   seconds per step (default 0.2)
  STANDIN_FAIL_AT_STEP   fail when reaching this step ...
  STANDIN_FAIL_ATTEMPT   ... in this attempt only (default 1; 0 = every attempt)
  STANDIN_FAIL_RANK      ... on this global rank (default 0)
  STANDIN_FAIL_CODE      ... with this exit code (78 writes a ConfigError cause)
  STANDIN_FAIL_GENERATION ... in this generation of the attempt (default 0: before any
                         restart in place; -1: every generation)
  STANDIN_HANG_AT_STEP   stop stepping at this step, on STANDIN_HANG_RANK (default 0), in
                         STANDIN_HANG_GENERATION (default 0), in STANDIN_FAIL_ATTEMPT's attempt;
                         with restarts in place, end as Hang at FSDP_HANG_SECONDS
  STANDIN_SAVE_SECONDS   extra seconds each checkpoint blocks (default 0)
  STANDIN_START_SECONDS  seconds before "rendezvous" and before "loaded" (default 0)
  STANDIN_MEET_SECONDS   seconds rank 0 serves nothing at first, as a gang that has not met ...
  STANDIN_MEET_ATTEMPT   ... in this attempt only (default 1; 0 = every attempt)

`intervalSteps: auto` follows the real rule (interval.py) with the knobs as its measured
costs, so that every rank, stepping on its own clock, picks the same checkpoint steps.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import signal
import sys
import time
from typing import Any

import prometheus_client as prom

from fsdp_worker import contract
from fsdp_worker.contract import (
    catalog,
    config,
    config_checkpoint,
    fence,
    interval,
    objstore,
    s3store,
    selection,
    store,
)
from fsdp_worker.telemetry import metrics
from fsdp_worker.train import standin_scratch

log = logging.getLogger("fsdp_worker.train.standin")
BARRIER_TIMEOUT = 60.0
# On the checkpoint volume: the step to save on SIGTERM, per attempt and generation.
STOP_FILE = ".standin-stop-a{attempt}g{generation}"
MET_FILE = ".standin-met-a{attempt}"  # rank 0 has "met" (STANDIN_MEET_SECONDS are over)


_stop_requested = False


class _Refused(Exception):
    """Permanent, like the real worker's ConfigError: exit 78 with the reason."""


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _terminate(
    *,
    rank: int,
    step: int,
    code: int,
    cls: str,
    message: str,
    sums: dict[str, object] | None = None,
) -> None:
    path = os.environ.get(contract.ENV_TERMINATION_LOG, contract.DEFAULT_TERMINATION_LOG)
    doc = {"class": cls, "rank": rank, "step": step, "exitCode": code, "message": message}
    if sums is not None:
        doc[contract.SUMS] = sums
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(doc)[: contract.TERMINATION_MESSAGE_MAX_BYTES])
    except OSError:
        log.warning("cannot write termination message to %s", path)


class StandIn:
    def __init__(self, cfg: config.WorkerConfig) -> None:
        self.cfg = cfg
        self.rank = _env_int("RANK", 0)
        self.world = _env_int("WORLD_SIZE", 1)
        self.attempt = _env_int(contract.ENV_ATTEMPT, 1)
        self.root = os.environ.get(contract.ENV_CHECKPOINT_ROOT) or cfg.checkpoint.root
        # The same seam as the real worker (contract/store.py): the claim, or an s3:// root.
        self.store = store.open_store(self.root)
        self.where = self.store.root if objstore.is_uri(self.root) else "."  # selection's root
        self.scratch = self._scratch()
        self.hash = cfg.training.resume_hash()
        self.job_uid = os.environ.get(contract.ENV_JOB_UID) or None
        self.generation = _env_int(contract.ENV_GENERATION, 0)
        self.quarantined: list[int] = []  # steps rank 0 set aside under auto
        self.writer = fence.Writer(self.attempt, self.generation, self.job_uid)
        if self.rank == 0:  # before choosing: no earlier attempt changes the root after this
            self.store.probe(self.writer)  # an object store that ignores conditional writes
            self.store.take_over(self.writer)
        self.step, self.resumed_from = self._resume()
        self.saved: int | None = None  # the step of this rank's last save
        self.step_time = float(os.environ.get("STANDIN_STEP_SECONDS", "0.2"))
        self.save_time = float(os.environ.get("STANDIN_SAVE_SECONDS", "0"))
        self.ran = 0  # steps this process completed
        self.blocked_seconds = 0.0  # seconds its steps waited on saves
        self.milestones: dict[str, float] = {}  # contract.Milestone -> unix time, this process
        self.start_time = float(os.environ.get("STANDIN_START_SECONDS", "0"))

    def _resume(self) -> tuple[int, int | None]:
        where = os.environ.get(contract.ENV_RESUME, "")
        if not where:
            return 0, None
        if where == contract.RESUME_AUTO:
            return self._resume_auto()
        name = posixpath.basename(where.rstrip("/"))
        cand = selection.verify(self.store.storage, name, config_hash=self.hash)
        if not cand.ok or cand.marker is None:
            raise RuntimeError(f"resume checkpoint {where} rejected: {cand.reason} {cand.detail}")
        return cand.marker.step, cand.marker.step

    def _resume_auto(self) -> tuple[int, int | None]:
        raw = os.environ.get(contract.ENV_RESUME_RULES)
        try:
            rules = contract.ResumeRules.parse(raw) if raw else None
        except ValueError as exc:
            raise _Refused(str(exc)) from None
        other_jobs = self.cfg.checkpoint.resume_from_previous_jobs
        lineage = selection.auto_lineage(
            rules, attempt=self.attempt, job_uid=self.job_uid, other_jobs=other_jobs
        )
        chosen, rejected = selection.select(
            self.store.storage, self.where, config_hash=self.hash, lineage=lineage
        )
        if self.rank == 0:  # sets aside what failed verification, as the real worker does
            moved = store.quarantine_corrupt(self.store, rejected, me=self.writer)
            self.quarantined.extend(moved)
        if chosen is not None and chosen.marker is not None:
            log.info("resume=auto: step %d", chosen.marker.step)
            return chosen.marker.step, chosen.marker.step
        refusal = selection.other_job_refusal(self.root, rejected) or selection.fresh_start_refusal(
            self.root, rules, rejected
        )
        if refusal is not None:
            raise _Refused(refusal)
        return 0, None

    def _scratch(self) -> standin_scratch.Scratch:
        """Where the ranks leave each other notes: the claim's root, or the bucket's prefix."""
        if isinstance(self.store, s3store.S3Store):
            return standin_scratch.BucketScratch(self.store.s3, self.store.loc)
        assert isinstance(self.store, store.LocalStore)
        return standin_scratch.ClaimScratch(self.store.storage)

    def _shards(self, step: int) -> int:
        """How many ranks' shards of `step` are in this writer's partial save."""
        return len(self.store.manifest(self.writer, step, checksums=False))

    def save(self, step: int) -> None:
        data = json.dumps({"step": step, "rank": self.rank}).encode().ljust(64)
        if isinstance(self.store, store.LocalStore):
            self._make_partial(self.store.storage.resolve(self.store.partial(self.writer, step)))
        self.store.write_file(self.writer, step, f"rank-{self.rank}.bin", data)
        self.saved = step
        if self.rank != 0:
            return
        deadline = time.monotonic() + BARRIER_TIMEOUT
        while self._shards(step) < self.world:
            if time.monotonic() > deadline:
                raise RuntimeError(f"checkpoint step {step}: not every rank wrote its shard")
            if _stop_requested and not self.scratch.exists(self._stop_name()):
                # A rank behind that got SIGTERM first waits to be told which step to save, as
                # this one waits for its shard: this step (a collective save would be joined).
                self.scratch.write_atomic(self._stop_name(), str(step).encode())
            time.sleep(0.02)
        marker = catalog.Marker(
            step=step,
            attempt=self.attempt,
            world_size=self.world,
            global_batch_size=self.cfg.training.global_batch_size,
            samples_consumed=step * self.cfg.training.global_batch_size,
            resumed_from_step=self.resumed_from,
            time=time.time(),
            torch_version="standin",
            config_hash=self.hash,
            job_uid=self.job_uid,
            files=self.store.manifest(self.writer, step, checksums=True),
        )
        self.store.publish(self.writer, marker=marker)
        log.info("checkpoint step %d complete", step)
        self.scratch.remove(self._stop_name())  # every rank has read it: each wrote its shard after

    def _make_partial(self, path: str) -> None:
        """The save's own directory, never its parents: the writer directory holding it is the
        fence (fence.py), and a superseded rank must not bring it back. A rank that got here
        before rank 0 took the root over waits for it, as it would at a collective."""
        deadline = time.monotonic() + BARRIER_TIMEOUT
        while True:
            try:
                os.mkdir(path)
                return
            except FileExistsError:
                return
            except FileNotFoundError:
                gone = self.rank == 0 or self.store.newer_writer(self.writer)
                if gone or time.monotonic() > deadline:
                    raise self.store.refusal(self.writer, "saving") from None
                time.sleep(0.02)

    def _stop_name(self) -> str:
        return STOP_FILE.format(attempt=self.attempt, generation=self.generation)

    def _agreed_stop_step(self) -> int:
        """The step every rank saves on SIGTERM: rank 0's. The real worker's ranks agree on it
        through the collective save; stand-in ranks step on their own clocks and get SIGTERM
        at different moments, so without this they may save different steps and rank 0 then
        waits in vain for a shard (a flaky "steps lost" after a planned stop). Rank 0 posts
        its step on the shared volume; the others wait for it, as they would in a collective."""
        name = self._stop_name()
        if self.rank == 0:
            self.scratch.write_atomic(name, str(self.step).encode())
            return self.step
        deadline = time.monotonic() + BARRIER_TIMEOUT
        while not self.scratch.exists(name):
            if time.monotonic() > deadline:
                raise RuntimeError("SIGTERM: rank 0 never said which step to save")
            time.sleep(0.02)
        return int(self.scratch.read_bytes(name))

    def _meets_late(self) -> bool:
        """Whether this attempt's gang meets only after STANDIN_MEET_SECONDS."""
        meet = float(os.environ.get("STANDIN_MEET_SECONDS", "0"))
        return meet > 0 and _env_int("STANDIN_MEET_ATTEMPT", 1) in (0, self.attempt)

    def _meet(self) -> None:
        """Rank 0 serves; the other ranks wait for the gang to meet, as in torchrun."""
        if self.rank == 0:
            self._serve()
            return
        while self._meets_late() and not self.scratch.exists(MET_FILE.format(attempt=self.attempt)):
            _leave_if_stopped()
            time.sleep(0.1)

    def _serve(self) -> None:
        """Rank 0: serve the metrics (held back first, as a gang that has not met would: the
        kit serves once its process group is up). It took the root over before choosing."""
        if self._meets_late():
            until = time.monotonic() + float(os.environ.get("STANDIN_MEET_SECONDS", "0"))
            while time.monotonic() < until:
                _leave_if_stopped()
                time.sleep(0.1)
            self.scratch.write_atomic(MET_FILE.format(attempt=self.attempt), b"met")
        metrics.serve(_env_int(contract.ENV_METRICS_PORT, contract.DEFAULT_METRICS_PORT))

    def _sums(self) -> dict[str, object]:
        return contract.sums(
            steps_run=self.ran,
            train_seconds=self.ran * self.step_time,
            blocked_seconds=self.blocked_seconds,
            milestones=self.milestones,
            resumed_from=(
                (-1 if self.resumed_from is None else self.resumed_from)
                if contract.Milestone.LOADED.value in self.milestones
                else None
            ),
        )

    def _injected(self, fault: str) -> bool:
        """Whether this rank, step, attempt and generation are where STANDIN_<fault>_AT_STEP
        injects its fault (STANDIN_<fault>_RANK and _GENERATION; the attempt is shared)."""
        at, rank = f"STANDIN_{fault}_AT_STEP", f"STANDIN_{fault}_RANK"
        if self.step != _env_int(at, -1) or self.rank != _env_int(rank, 0):
            return False
        which = _env_int("STANDIN_FAIL_ATTEMPT", 1)
        if which and which != self.attempt:
            return False
        generation = _env_int(f"STANDIN_{fault}_GENERATION", 0)
        # restarted in place (gang.py): by default the fault was the attempt's first run's
        return generation < 0 or generation == _env_int(contract.ENV_GENERATION, 0)

    def _maybe_hang(self) -> None:
        """STANDIN_HANG_AT_STEP: stop stepping, as a rank stuck in a collective would. With
        restarts in place the rank ends itself at FSDP_HANG_SECONDS, as the worker's flight
        watchdog does (flight.Recorder.end_hung)."""
        if not self._injected("HANG"):
            return
        log.error("injected hang at step %d", self.step)
        deadline = time.monotonic() + _env_int(contract.ENV_HANG_SECONDS, 0)
        while not _stop_requested:
            if os.environ.get(contract.ENV_GANG) and time.monotonic() >= deadline:
                text = f"no step completed for {_env_int(contract.ENV_HANG_SECONDS, 0)}s"
                _terminate(
                    rank=self.rank,
                    step=self.step,
                    code=1,
                    cls=contract.FailureClass.HANG.value,
                    message=text,
                )
                sys.exit(1)
            time.sleep(0.1)

    def _maybe_fail(self) -> None:
        if not self._injected("FAIL"):
            return
        code = _env_int("STANDIN_FAIL_CODE", 1)
        cls = contract.FailureClass.CONFIG if code == 78 else contract.FailureClass.RUNTIME
        sums = self._sums() if self.rank == 0 else None
        _terminate(
            rank=self.rank, step=self.step, code=code, cls=cls, message="injected", sums=sums
        )
        log.error("injected failure at step %d, exit %d", self.step, code)
        sys.exit(code)

    def _interval(self, steps_run: int) -> interval.Choice:
        ck = self.cfg.checkpoint
        if ck.interval_steps != config_checkpoint.AUTO:
            return interval.Choice(steps=int(ck.interval_steps), auto=False)
        r = interval.Reliability.parse(os.environ.get(contract.ENV_RELIABILITY, ""))
        mtbf = interval.mtbf_estimate(
            failures=r.failures,
            uptime_seconds=r.uptime_seconds + steps_run * self.step_time,
            prior_seconds=ck.auto_interval.prior_mtbf_seconds,
        )
        return interval.choose(
            save_seconds=self.save_time,
            step_seconds=self.step_time,
            mtbf_seconds=mtbf,
            floor=ck.auto_interval.min_steps,
            ceiling=ck.auto_interval.max_steps,
            failures=r.failures,
        )

    def _reached(self, gauge: prom.Gauge, m: contract.Milestone) -> None:
        """A milestone: on the metrics page, and kept for the final message's sums."""
        self.milestones[m.value] = time.time()
        gauge.labels(milestone=m.value).set(self.milestones[m.value])

    def run(self) -> int:
        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> prom.Gauge:
            return prom.Gauge(name, doc, labelnames=labels)

        gauge_step = gauge(contract.METRIC_STEP, "last completed step")
        gauge_time = gauge(contract.METRIC_LAST_STEP_TIME, "time of the last step")
        milestone = gauge(contract.METRIC_MILESTONE, "milestones", ("milestone",))
        steps_run = metrics.Total(contract.METRIC_STEPS_RUN, "steps this process")
        step_sum = metrics.Total(contract.METRIC_STEP_SECONDS_SUM, "seconds of those steps")
        blocked = metrics.Total(contract.METRIC_CKPT_BLOCKED, "seconds blocked on saves")
        every = gauge(contract.METRIC_INTERVAL, "steps between checkpoints")
        inputs = gauge(contract.METRIC_INTERVAL_INPUT, "inputs of auto", ("input",))
        sealed = gauge(contract.METRIC_CKPT_STEP, "step of the newest complete checkpoint")
        resumed = gauge(contract.METRIC_RESUMED_FROM, "step this process resumed from")
        quarantined = gauge(contract.METRIC_QUARANTINED, "steps set aside at resume", ("step",))
        for step in sorted(self.quarantined)[-contract.QUARANTINED_SERIES :]:
            quarantined.labels(step=str(step)).set(1)
        metrics.restarts_in_place()

        def chose(choice: interval.Choice) -> None:
            every.set(choice.steps)
            pairs = (
                (contract.IntervalInput.SAVE_SECONDS, choice.save_seconds),
                (contract.IntervalInput.STEP_SECONDS, choice.step_seconds),
                (contract.IntervalInput.MTBF_SECONDS, choice.mtbf_seconds),
                (contract.IntervalInput.FAILURES, choice.failures),
            )
            for key, value in pairs:
                if value is not None:
                    inputs.labels(input=key.value).set(value)

        self._meet()
        gauge_step.set(self.step)
        resumed.set(-1 if self.resumed_from is None else self.resumed_from)
        time.sleep(self.start_time)
        self._reached(milestone, contract.Milestone.RENDEZVOUS)
        time.sleep(self.start_time)
        self._reached(milestone, contract.Milestone.LOADED)
        first = self._interval(0)
        next_save = self.step + first.steps
        chose(first)
        while self.step < self.cfg.training.steps:
            time.sleep(self.step_time)
            if _stop_requested:  # SIGTERM between steps: a complete checkpoint, then exit
                step = self._agreed_stop_step()
                log.warning("SIGTERM at step %d: saving step %d before exit", self.step, step)
                if step != self.saved:  # else the save just made is the one agreed
                    self.save(step)
                return int(contract.ExitCode.PREEMPTED)
            self.step += 1
            self.ran += 1
            gauge_step.set(self.step)
            gauge_time.set(time.time())
            steps_run.set(self.ran)
            step_sum.set(self.ran * self.step_time)
            if self.ran == 1:
                self._reached(milestone, contract.Milestone.FIRST_STEP)
            self._maybe_fail()
            self._maybe_hang()
            choice = self._interval(self.ran)
            fixed = not choice.auto and self.step % choice.steps == 0
            if (
                fixed
                or (choice.auto and self.step >= next_save)
                or (self.step == self.cfg.training.steps)
            ):
                began = time.monotonic()
                self.save(self.step)
                sealed.set(self.step)
                time.sleep(self.save_time)
                self.blocked_seconds += time.monotonic() - began
                blocked.set(self.blocked_seconds)
                next_save = self.step + choice.steps
                chose(choice)
        if self.rank == 0:  # the final step and the newest sealed one, as the real worker says
            done = contract.completion_message(sealed_step=self.step)
            _terminate(
                rank=0,
                step=self.step,
                code=0,
                cls=contract.RecordClass.COMPLETED,
                message=done,
                sums=self._sums(),
            )
        return int(contract.ExitCode.SUCCESS)


def _leave_if_stopped() -> None:
    """SIGTERM before the gang met: nothing trained, nothing to save (torchrun's agent
    would simply stop)."""
    if _stop_requested:
        log.warning("SIGTERM before the gang met: exit")
        sys.exit(int(contract.ExitCode.PREEMPTED))


def _on_term(signum: int, frame: Any) -> None:
    global _stop_requested
    _stop_requested = True


def _config_error(exc: Exception) -> int:
    """Exit 78 with a ConfigError cause: restarting cannot help."""
    code = contract.ExitCode.CONFIG_ERROR
    rank = _env_int("RANK", 0)
    _terminate(
        rank=rank, step=0, code=code, cls=contract.FailureClass.CONFIG, message=str(exc)[:1000]
    )
    return int(code)


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, format=f"[rank{os.environ.get('RANK', '?')}] %(message)s"
    )
    raw = os.environ.get(contract.ENV_CONFIG, "{}")
    try:
        cfg = config.WorkerConfig.parse(raw)
    except ValueError as exc:
        return _config_error(exc)
    signal.signal(signal.SIGTERM, _on_term)
    try:
        return StandIn(cfg).run()
    except _Refused as exc:
        return _config_error(exc)
    except Exception as exc:
        _terminate(
            rank=_env_int("RANK", 0),
            step=-1,
            code=1,
            cls=contract.FailureClass.RUNTIME,
            message=str(exc)[:1000],
        )
        raise


if __name__ == "__main__":
    sys.exit(main())
