"""Worker exception classes: each maps to one exit code and termination-message class.

They are the failure API between modules and `main`; this module must not import torch.
"""

from __future__ import annotations

from fsdp_worker import contract


class WorkerError(Exception):
    """Base: a failure with a documented exit code and a termination-message class."""

    exit_code = contract.ExitCode.RETRYABLE
    failure_class = contract.FailureClass.RUNTIME


class ConfigError(WorkerError):
    """Permanent: the training config (or its pairing with a checkpoint) is invalid."""

    exit_code = contract.ExitCode.CONFIG_ERROR
    failure_class = contract.FailureClass.CONFIG


class CheckpointError(WorkerError):
    """Retryable: a checkpoint could not be written or read."""

    failure_class = contract.FailureClass.CHECKPOINT


class Preempted(WorkerError):
    """SIGTERM received; a complete checkpoint of the current step was saved first."""

    exit_code = contract.ExitCode.PREEMPTED
    failure_class = contract.FailureClass.PREEMPTED
