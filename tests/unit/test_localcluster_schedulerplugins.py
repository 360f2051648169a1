"""The second scheduler's configuration on the local cluster: only pods that name it are its,
and Coscheduling runs at every extension point and sorts its queue (as scheduler-plugins' own
coscheduling config has it), so a gang is placed whole or not at all."""

from __future__ import annotations

from pathlib import Path

import yaml

from fsdp_operator.types import spec_gang
from localcluster import schedulerplugins


def test_one_profile_under_its_own_name_with_coscheduling_everywhere() -> None:
    doc = yaml.safe_load(schedulerplugins.config(kubeconfig=Path("/k/admin.conf")))
    assert doc["kind"] == "KubeSchedulerConfiguration"
    assert doc["leaderElection"] == {"leaderElect": False}
    assert doc["clientConnection"] == {"kubeconfig": "/k/admin.conf"}
    (profile,) = doc["profiles"]
    assert profile["schedulerName"] == schedulerplugins.SCHEDULER_NAME != "default-scheduler"
    plugins = profile["plugins"]
    assert plugins["multiPoint"]["enabled"] == [{"name": "Coscheduling"}]
    assert plugins["queueSort"] == {
        "enabled": [{"name": "Coscheduling"}],
        "disabled": [{"name": "*"}],
    }
    (args,) = profile["pluginConfig"]
    assert args == {
        "name": "Coscheduling",
        "args": {"permitWaitingTimeSeconds": schedulerplugins.PERMIT_WAIT_SECONDS},
    }


def test_the_scheduler_name_is_the_operators_default_for_coscheduling() -> None:
    """A job asking for Coscheduling with no scheduler of its own lands on this scheduler."""
    coscheduling = spec_gang.GangKind.COSCHEDULING
    assert spec_gang.DEFAULT_SCHEDULER[coscheduling] == schedulerplugins.SCHEDULER_NAME
