"""What the operator gave a rank: the training-config document and the environment
(docs/contract.md, "What a rank is given"), read once into `Settings`.

Apart from the kit's run (kit/__init__.py: `Run` and `main`) because this is parsing at the
edge: every malformed value becomes a ConfigError naming the variable or the field, before the
gang forms. In `contract` so that `python -m fsdp_worker` can refuse a bad config before it
imports torch (train/preflight.py); the kit re-exports it as `fsdp_worker.kit.environment`. No
torch here, and nothing is read after `load_settings` returns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pydantic

from fsdp_worker import contract
from fsdp_worker.contract import config, errors, interval, keeper, store


@dataclass(frozen=True)
class Settings:
    """What the operator gave this rank (docs/contract.md, "What a rank is given")."""

    cfg: config.WorkerConfig  # checkpoint.root already overridden by the environment
    attempt: int
    resume: str
    metrics_port: int
    job_uid: str | None = None
    rules: contract.ResumeRules | None = None
    reliability: interval.Reliability = field(default_factory=interval.Reliability)
    generation: int = 0  # restarts in place before this process (gang.py)


def _validation_message(exc: pydantic.ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(x) for x in err["loc"]) or "(document)"
        parts.append(f"{where}: {err['msg']} (got {err.get('input')!r})")
    return "invalid training config: " + "; ".join(parts)


def int_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw else default
    except ValueError:
        raise errors.ConfigError(f"environment {name}={raw!r} must be an integer") from None


def int_env_or(name: str, default: int) -> int:
    """An integer from the environment, the default when unset or malformed (for reports)."""
    try:
        return int_env(name, default)
    except errors.ConfigError:
        return default


def hang_step_times() -> int:
    """The fast hang rule's multiple of a step (FSDP_HANG_STEP_TIMES; flight.fast_deadline), or
    0 where it is off: without restarts in place, and in the generation that spends the last
    of them. There a fast verdict restarts nothing in place; it only ends the rank before the
    operator's own verdict (a lost node's Lease, the progress deadline), and on a lost node it
    told a survivor's Hang for the node's loss and recreated the gang on the wrong cause."""
    times = int_env(contract.ENV_HANG_STEP_TIMES, 0)
    if times <= 0:
        return 0
    try:
        gang = keeper.Gang.from_env()
    except ValueError:  # no gang (its keeper refuses a bad one before any rank starts)
        return 0
    return times if int_env_or(contract.ENV_GENERATION, 0) < gang.restarts else 0


def env_world_size() -> int:
    """WORLD_SIZE as torchrun sets it (1 when run without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))


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
    try:
        store.check_root(cfg.checkpoint.root)
    except ValueError as exc:
        raise errors.ConfigError(f"{exc} (from {contract.ENV_CHECKPOINT_ROOT})") from None
    raw_rules = os.environ.get(contract.ENV_RESUME_RULES)
    try:
        rules = contract.ResumeRules.parse(raw_rules) if raw_rules else None
    except ValueError as exc:
        raise errors.ConfigError(str(exc)) from None
    return Settings(
        cfg=cfg,
        attempt=int_env(contract.ENV_ATTEMPT, 1),
        resume=os.environ.get(contract.ENV_RESUME, ""),
        metrics_port=int_env(contract.ENV_METRICS_PORT, contract.DEFAULT_METRICS_PORT),
        job_uid=os.environ.get(contract.ENV_JOB_UID) or None,
        rules=rules,
        reliability=interval.Reliability.parse(os.environ.get(contract.ENV_RELIABILITY, "")),
        generation=int_env(contract.ENV_GENERATION, 0),
    )
