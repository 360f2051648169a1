"""The built-in trainer's config check, run by `python -m fsdp_worker` before it imports torch.

A rank whose config is wrong (a misspelt field, a batch that does not split at this world size,
a malformed FSDP_ATTEMPT) learns it in a second, not after torch and the trainer have loaded on
every rank: the same checks as the kit (contract/environment.py's `load_settings`, then
`check_plan`, the trainer's `before_rendezvous`), the same termination message and exit code 78.
Everything here must stay torch-free (an import contract in pyproject.toml says so); any failure
other than a ConfigError is left to the kit, which reports it as it always has.
"""

from __future__ import annotations

import logging
import os
import sys

from fsdp_worker import contract
from fsdp_worker.contract import batch, environment, errors
from fsdp_worker.telemetry import flight, termination

log = logging.getLogger("fsdp_worker")


def check_plan(settings: environment.Settings) -> None:
    """World size is known before rendezvous: refuse an impossible batch split early."""
    training = settings.cfg.training
    batch.make_plan(training, world_size=environment.env_world_size(), rank=environment.env_rank())


def refusal() -> int | None:
    """The exit code of a config the kit would refuse (its termination message written), or
    None: go on to the trainer, which loads and checks the settings again."""
    try:
        check_plan(environment.load_settings())
    except errors.ConfigError as exc:
        return refuse(exc)
    except Exception:  # not a config error: the kit reports it, after torch, as before
        return None
    return None


def refuse(exc: errors.ConfigError) -> int:
    """What kit.main does with a ConfigError raised before the gang forms: log it, leave the
    termination message (with the rank's phase and memory, as its flight record gives them)."""
    rank = environment.env_rank()
    logging.basicConfig(  # kit._setup_logging's format: the line reads the same either way
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
    )
    code, failure_class = int(exc.exit_code), str(exc.failure_class)
    log.error("exit %d (%s) at step %s: %s", code, failure_class, None, exc)
    recorder = flight.Recorder(
        rank=rank,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        attempt=environment.int_env_or(contract.ENV_ATTEMPT, 0),
    )
    termination.write(
        failure_class=failure_class,
        rank=rank,
        step=None,
        exit_code=code,
        text=str(exc),
        extra=recorder.failure_fields(),
    )
    return code
