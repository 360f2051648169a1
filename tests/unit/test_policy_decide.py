"""The orchestrator (policy/decide.py): one pass's Decision is deterministic, frozen and complete;
the generation it was made for is kept.

No cluster and no clock: each row is an observation and the decision a user would see.
"""

from __future__ import annotations

import dataclasses

import pytest

from fsdp_operator.policy import conditions, decide
from fsdp_operator.types import status as st
from tests.builders import (
    NOW,
    nodes,
    observe,
    running_status,
)


def test_decision_is_deterministic() -> None:
    obs = observe(nodes=nodes(down={2: NOW - 31}))
    a, b = decide.decide(obs), decide.decide(obs)
    assert dataclasses.asdict(a) == dataclasses.asdict(b)


def test_dry_run_result_is_remembered_per_generation() -> None:
    d = decide.decide(observe(generation=3, validated_generation=3))
    assert d.status.validated_generation == 3
    later = decide.decide(observe(status=d.status, generation=4))
    assert later.status.validated_generation == 3  # generation 4 is dry-run on the next pass


def test_a_working_pass_clears_the_reconcile_error_condition() -> None:
    failing = st.Condition(
        type=conditions.RECONCILE_ERROR,
        status="True",
        reason="ApiException",
        message="boom",
        last_transition_time="2026-12-01T00:00:00Z",
    )
    d = decide.decide(observe(status=running_status(conditions=[failing])))
    assert all(c.type != conditions.RECONCILE_ERROR for c in d.status.conditions)


def test_the_decision_is_frozen_and_the_observation_untouched() -> None:
    """apply() carries out what decide() said, nothing after changes it; and decide() works on
    its own copy of the status it read."""
    obs = observe(nodes=nodes(down={2: NOW - 31}))
    read = obs.status.model_copy(deep=True)
    d = decide.decide(obs)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.launch = None  # type: ignore[misc]
    assert isinstance(d.delete, tuple) and isinstance(d.events, tuple) and d.delete
    assert obs.status == read and d.status != read
