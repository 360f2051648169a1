"""The torchrun entrypoint: read config and environment, build, resume, train, exit with a
documented code (contract.ExitCode), leaving a JSON termination message on failure.

Everything is torn down in `finally`. This module wires the others together; it must not
contain training, checkpoint or data logic of its own.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from types import FrameType

import pydantic
import torch

from fsdp_worker import (
    checkpoint,
    config,
    contract,
    data,
    distributed,
    errors,
    interval,
    ledger,
    metrics,
    model,
    optim,
    parallelize,
    resume,
    schedule,
    state,
    termination,
    trainer,
)

log = logging.getLogger("fsdp_worker")


@dataclass(frozen=True)
class Settings:
    cfg: config.WorkerConfig  # checkpoint.root already overridden by the environment
    attempt: int
    resume: str
    metrics_port: int
    job_uid: str | None = None
    rules: contract.ResumeRules | None = None


def _validation_message(exc: pydantic.ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        field = ".".join(str(x) for x in err["loc"]) or "(document)"
        parts.append(f"{field}: {err['msg']} (got {err.get('input')!r})")
    return "invalid training config: " + "; ".join(parts)


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw else default
    except ValueError:
        raise errors.ConfigError(f"environment {name}={raw!r} must be an integer") from None


def load_settings() -> Settings:
    """Config document (file path, else inline JSON) plus the operator's environment."""
    path = os.environ.get(contract.ENV_CONFIG_FILE)
    try:
        if path:
            with open(path, "rb") as f:
                raw: bytes | str = f.read()
        else:
            raw = os.environ.get(contract.ENV_CONFIG) or "{}"
        cfg = config.WorkerConfig.parse(raw)
    except OSError as exc:
        raise errors.ConfigError(f"{contract.ENV_CONFIG_FILE}={path!r}: {exc}") from exc
    except pydantic.ValidationError as exc:
        raise errors.ConfigError(_validation_message(exc)) from exc
    root = os.environ.get(contract.ENV_CHECKPOINT_ROOT)
    if root:  # the operator names the job's own directory under checkpoint.root
        cfg = cfg.model_copy(
            update={"checkpoint": cfg.checkpoint.model_copy(update={"root": root})}
        )
    raw_rules = os.environ.get(contract.ENV_RESUME_RULES)
    try:
        rules = contract.ResumeRules.parse(raw_rules) if raw_rules else None
    except ValueError as exc:
        raise errors.ConfigError(str(exc)) from None
    return Settings(
        cfg=cfg,
        attempt=_int_env(contract.ENV_ATTEMPT, 1),
        resume=os.environ.get(contract.ENV_RESUME, ""),
        metrics_port=_int_env(contract.ENV_METRICS_PORT, contract.DEFAULT_METRICS_PORT),
        job_uid=os.environ.get(contract.ENV_JOB_UID) or None,
        rules=rules,
    )


def _setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
    )


class _StopFlag:
    """Set by SIGTERM; read once per step by the trainer."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.event.set()

    def __call__(self) -> bool:
        return self.event.is_set()


@dataclass
class _Run:
    """What `finally` must clean up, and the step a failure message should name."""

    dist_info: distributed.DistInfo | None = None
    manager: checkpoint.CheckpointManager | None = None
    st: state.TrainState | None = None


def _build_state(tcfg: config.TrainingConfig, di: distributed.DistInfo) -> state.TrainState:
    """Model (sharded, initialised), optimizer and schedule; rank 0 logs the state ledger."""
    net = model.build(tcfg)
    template = model.meta_template(net, factory=tcfg.model.factory)
    parallelize.shard(net, mesh=di.mesh, precision=tcfg.precision, ac=tcfg.activation_checkpointing)
    model.materialize(net, device=di.device, seed=tcfg.seed, template=template)
    opt = optim.build_optimizer(net, tcfg.optimizer)
    if di.rank == 0:
        dtype = parallelize.mp_policy(tcfg.precision).param_dtype or torch.float32
        planned = ledger.planned(net, param_dtype=dtype, world_size=di.world_size)
        log.info("ledger %s", json.dumps(planned))
    return state.TrainState(net, opt, optim.build_scheduler(opt, cfg=tcfg))


def _train(settings: Settings, run: _Run, stop: _StopFlag) -> None:
    tcfg, di = settings.cfg.training, run.dist_info
    assert di is not None
    torch.manual_seed(tcfg.seed)
    plan = data.make_plan(tcfg, world_size=di.world_size, rank=di.rank)
    source = data.make_source(tcfg)
    meters = metrics.Metrics()
    if di.rank == 0:
        meters.serve(settings.metrics_port)
    meters.reached(contract.Milestone.RENDEZVOUS)
    ckcfg = settings.cfg.checkpoint
    os.makedirs(ckcfg.root, exist_ok=True)
    run.st = st = _build_state(tcfg, di)
    point = resume.choose(
        settings.cfg,
        resume=settings.resume,
        attempt=settings.attempt,
        dist_info=di,
        job_uid=settings.job_uid,
        rules=settings.rules,
    )
    if point is not None:
        resume.load(point, st, dist_info=di, seed=tcfg.seed)
    meters.resumed_from.set(point.step if point is not None else -1)
    meters.reached(contract.Milestone.LOADED)
    identity = checkpoint.Identity(
        attempt=settings.attempt,
        resumed_from_step=point.step if point else None,
        config_hash=tcfg.resume_hash(),
        global_batch_size=tcfg.global_batch_size,
        job_uid=settings.job_uid,
    )
    run.manager = checkpoint.CheckpointManager(
        ckcfg, identity=identity, dist_info=di, meters=meters
    )
    run.manager.remove_abandoned()
    sched = schedule.Schedule.of(
        ckcfg,
        start_step=st.step,
        reliability=interval.Reliability.parse(os.environ.get(contract.ENV_RELIABILITY, "")),
        meters=meters,
        dist_info=di,
    )
    loop = trainer.Loop(
        cfg=tcfg,
        schedule=sched,
        st=st,
        source=source,
        plan=plan,
        ckpt=run.manager,
        meters=meters,
        dist=di,
        stop_requested=stop,
    )
    trainer.run(loop)


def _classify(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, errors.WorkerError):
        return int(exc.exit_code), str(exc.failure_class)
    if isinstance(exc, torch.OutOfMemoryError):
        return int(contract.ExitCode.RETRYABLE), str(contract.FailureClass.OOM)
    return int(contract.ExitCode.RETRYABLE), str(contract.FailureClass.RUNTIME)


def main() -> int:
    rank = distributed.env_rank()
    _setup_logging(rank)
    stop, run = _StopFlag(), _Run()
    stop.install()
    code = int(contract.ExitCode.SUCCESS)
    try:
        settings = load_settings()
        # World size is known before rendezvous: refuse an impossible batch split early.
        data.make_plan(settings.cfg.training, world_size=distributed.env_world_size(), rank=rank)
        run.dist_info = distributed.init()
        _train(settings, run, stop)
        log.info("training complete")
    except BaseException as exc:  # every failure becomes an exit code
        code, failure_class = _classify(exc)
        step = run.st.step if run.st is not None else None
        log.error("exit %d (%s) at step %s: %s", code, failure_class, step, exc)
        if not isinstance(exc, errors.WorkerError | KeyboardInterrupt):
            log.error("%s", traceback.format_exc())
        termination.write(
            failure_class=failure_class, rank=rank, step=step, exit_code=code, text=str(exc)
        )
    finally:
        if run.manager is not None:
            run.manager.close(wait=code == contract.ExitCode.SUCCESS)
        distributed.destroy()
    return code
